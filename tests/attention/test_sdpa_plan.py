"""One decision per SDPA call (`mmpe.attention.dispatch.sdpa_plan`): the plan at the shapes of
benchmarks/bench_layers.py and bench_attention.py (each threshold on one side and the other),
`force_plan` running a chosen plan and refusing one that cannot run the call."""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe.attention.dispatch import SDPA_PLANS, force_plan, sdpa_plan
from mmpe.encodings.base import AttentionCall


def _ctx(coords, heads: int, batch: int, dtype=torch.float32) -> AttentionCall:
    # q, k, v of the right shapes with no storage: the decision reads shapes only
    q = torch.empty(batch, heads, coords.num_queries, 8, dtype=dtype)
    k = torch.empty(batch, heads, coords.num_keys, 8, dtype=dtype)
    return AttentionCall(coords, heads, 8, batch, None, q, k, k)


def _enc(name: str, heads: int, grid=None):
    context = {"num_heads": heads}
    if grid is not None:
        context["grid_shape"] = grid
    return mmpe.build(name, context=context)


@pytest.mark.parametrize(("name", "shape", "heads", "batch", "plan"), [
    ("swin", (14, 14), 12, 8, "dense"),  # ViT-B/16 at 224 px: 1.9 MB an entry
    ("swin", (24, 24), 12, 8, "dense"),  # 384 px: 16 MB
    ("t5", (14, 14), 12, 8, "dense"),
    ("swin", (32, 32), 6, 1, "grid"),  # 25 MB an entry: the grid plan's memory
    ("swin", (64, 64), 6, 1, "grid"),
    ("alibi", (32, 32), 6, 1, "dense"),  # a fixed bias: the dense plan up to 64 MB
    ("alibi", (64, 64), 6, 1, "grid"),
])
def test_grids(name, shape, heads, batch, plan) -> None:
    grid = mmpe.Grid(shape, prefix_tokens=1)
    assert sdpa_plan([_enc(name, heads, shape)], _ctx(grid, heads, batch)) == plan


@pytest.mark.parametrize(("name", "n", "heads", "batch", "plan"), [
    ("alibi", 128, 8, 32, "dense"),  # 0.5 MB an entry
    ("t5", 128, 8, 32, "dense"),
    ("alibi", 512, 8, 8, "relation"),  # 8 MB
    ("t5", 1024, 8, 4, "relation"),
    ("fire", 2048, 8, 1, "relation"),  # FIRE's compact form
])
def test_sequences(name, n, heads, batch, plan) -> None:
    seq = mmpe.Sequence(n, causal=True)
    assert sdpa_plan([_enc(name, heads)], _ctx(seq, heads, batch)) == plan


def test_points_and_content() -> None:
    pts = mmpe.Points(torch.rand(1, 4096, 3))
    assert sdpa_plan([_enc("alibi", 6)], _ctx(pts, 6, 1)) == "tiles"  # 400 MB > budget
    assert sdpa_plan([_enc("alibi", 6)], _ctx(mmpe.Points(torch.rand(1, 64, 3)), 6, 1)) == "dense"
    fox = mmpe.build("fox", context={"num_heads": 2, "head_dim": 8, "d_model": 16})
    seq = mmpe.Sequence(4096, causal=True)
    assert sdpa_plan([fox], _ctx(seq, 2, 4)) == "checkpointed"  # content: checkpointed blocks
    assert sdpa_plan([], _ctx(seq, 2, 1)) == "dense"  # no term: SDPA's own causal kernel


def test_force_plan_runs_a_plan_and_refuses_one_that_cannot_run() -> None:
    seq = mmpe.Sequence(16, causal=True)
    ctx = _ctx(seq, 2, 1)
    alibi = [_enc("alibi", 2)]
    assert sdpa_plan(alibi, ctx) == "dense"
    for plan in ("relation", "tiles", "checkpointed", "dense"):
        with force_plan(plan):
            assert sdpa_plan(alibi, ctx) == plan
    with force_plan("grid"), pytest.raises(ValueError, match="'grid' plan cannot run"):
        sdpa_plan(alibi, ctx)
    with pytest.raises(ValueError, match="plan must be one of"):
        with force_plan("fast"):
            pass
    assert sdpa_plan(alibi, ctx) == "dense"  # the context is left
    assert set(SDPA_PLANS) == {"relation", "grid", "tiles", "checkpointed", "dense"}


def test_float16_keeps_the_dense_or_blocks_plans() -> None:
    # the relation, grid and tiles plans are float32/64 only (SDPA's fused CPU kernel)
    seq = mmpe.Sequence(2048, causal=True)
    assert sdpa_plan([_enc("alibi", 8)], _ctx(seq, 8, 1, torch.bfloat16)) in ("dense", "checkpointed")
