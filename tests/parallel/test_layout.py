"""`mmpe.parallel`'s layouts and refusals without processes: which tokens each rank holds,
the gather order, and the errors of bad input (the spawned tests are in
`test_recipe_context_parallel.py`)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import mmpe
from mmpe.parallel import LAYOUTS, gather_order, shard, shard_index


@given(world=st.integers(1, 6), chunk=st.integers(1, 5), layout=st.sampled_from(LAYOUTS))
def test_ranks_partition_the_sequence_and_the_gather_order_restores_it(world, chunk,
                                                                       layout) -> None:
    n = world * chunk * (2 if layout == "balanced" else 1)
    held = [shard_index(n, world, r, layout) for r in range(world)]
    assert all(h.numel() == n // world for h in held)
    assert torch.equal(torch.cat(held).sort().values, torch.arange(n))
    order = gather_order(n, world, layout)
    gathered = torch.cat(held)
    assert torch.equal(gathered if order is None else gathered[order], torch.arange(n))


@given(world=st.integers(1, 6), chunk=st.integers(1, 5))
def test_balanced_ranks_have_equal_causal_work(world, chunk) -> None:
    """Rank r holds chunks r and 2W−1−r: its causal pairs Σ(i+1) are the same on every rank
    (Llama 3's load balancing), where the contiguous layout's grow with the rank."""
    n = 2 * world * chunk
    work = {int((shard_index(n, world, r, "balanced") + 1).sum()) for r in range(world)}
    assert len(work) == 1
    if world > 1:
        contiguous = [int((shard_index(n, world, r) + 1).sum()) for r in range(world)]
        assert contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1]


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_index(8, 2, 0, "zigzag")
    with pytest.raises(ValueError, match="n must be a multiple of 4"):
        shard_index(6, 2, 0, "balanced")
    with pytest.raises(ValueError, match="rank must be in 0 … 1"):
        shard_index(8, 2, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        shard(mmpe.Sequence(8, causal=True))
    with pytest.raises(TypeError, match="coords must be mmpe Coordinates"):
        shard(torch.arange(8))

