"""Bounded memory on the CPU path: a bias is evaluated block by block over queries, and a
request that cannot fit fails before allocating, naming the size and the alternatives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import mmpe
from mmpe import Sequence

PEAK = textwrap.dedent("""
    import resource, sys, torch, mmpe
    torch.set_num_threads(1)
    name, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    enc = mmpe.build(name, context={"num_heads": 8, "head_dim": 8, "d_model": 64})
    attn = mmpe.MultiHeadAttention(64, 8, [enc])
    coords = mmpe.Sequence(n, causal=True)
    if kind == "padded":  # positions count real tokens: not toeplitz, the block-wise path
        pad = torch.ones(n, dtype=torch.bool)
        pad[:7] = False
        coords = mmpe.Sequence(n, causal=True, padding_mask=pad)
    x = torch.randn(1, n, 64, requires_grad=kind == "train")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.set_grad_enabled(kind == "train"):
        out = attn(x, coords)
        if kind == "train":
            out.square().mean().backward()
            assert all(p.grad is not None for p in attn.parameters() if p.requires_grad)
    assert torch.isfinite(out).all()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**10)  # MiB
""")


def _peak(name: str, n: int, kind: str) -> float:
    """Growth of the peak resident memory (MiB) of one attention call in a fresh process."""
    run = subprocess.run([sys.executable, "-c", PEAK, name, str(n), kind], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "MMPE_ATTN_BLOCK_BYTES":
                                                      str(64 * 2**20)})
    assert run.returncode == 0, run.stderr[-2000:]
    return float(run.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess  # a fresh interpreter per case, to read its peak memory alone
@pytest.mark.parametrize(("name", "kind", "limit"), [
    # Toeplitz sequences, the relation plan: the bias is a view of an O(n) table, never n×n.
    ("alibi", "forward", 200), ("t5", "forward", 200), ("fire", "forward", 200),
    ("kerple_log", "forward", 200),
    # Padded (not toeplitz): the general path, bias rows block by block (64 MiB blocks).
    ("alibi", "padded", 900), ("fire", "padded", 900),
])
def test_biased_attention_at_n_8192_stays_far_below_the_dense_bias(name: str, kind: str,
                                                                    limit: float) -> None:
    # The dense bias alone would be 8 heads x 8192^2 x 4 B = 2 GiB (FIRE's MLP hidden: 64 GiB).
    grown = _peak(name, 8192, kind)
    assert grown < limit, f"{name} ({kind}): peak memory grew by {grown:.0f} MiB"


@pytest.mark.parametrize("name", ["t5", "fire"])
def test_training_with_a_learned_bias_keeps_no_pairwise_graph(name: str) -> None:
    # A dense bias at n = 4096 is 512 MiB, and its autograd graph (T5's gather, FIRE's MLP)
    # several times that; the relation plan's backward recomputes blocks from O(n) tables.
    grown = _peak(name, 4096, "train")
    assert grown < 200, f"{name}: training grew peak memory by {grown:.0f} MiB"


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "kerple_log", "shaw", "fox"])
def test_block_wise_path_equals_the_dense_one_with_gradients(name: str, monkeypatch) -> None:
    enc = mmpe.build(name, context={"num_heads": 4, "head_dim": 8, "d_model": 32})
    attn = mmpe.MultiHeadAttention(32, 4, [enc])
    x = torch.randn(2, 70, 32, requires_grad=True)
    coords = Sequence(70, causal=True)
    dense = attn(x, coords)
    (g_dense,) = torch.autograd.grad(dense.square().sum(), x)
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", str(2 * 4 * 70 * 4 * 9))  # 9 query rows a block
    blocks = attn(x, coords)
    (g_blocks,) = torch.autograd.grad(blocks.square().sum(), x)
    torch.testing.assert_close(blocks, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_blocks, g_dense, atol=1e-5, rtol=1e-5)


def test_impossible_request_fails_before_allocating() -> None:
    attn = mmpe.MultiHeadAttention(8, 1, [mmpe.build("stick_breaking")])  # math route only
    with torch.no_grad(), pytest.raises(MemoryError, match=r"GiB.*route='flex'"):
        attn(torch.randn(1, 200_000, 8), Sequence(200_000, causal=True))


def test_a_padding_mask_too_large_for_one_block_runs_block_by_block(monkeypatch) -> None:
    """A padded point cloud with only a rotary encoding has no bias, but its mask is dense
    (``[b, 1, n, n]``: 7.2 GB at 60,000 points): SDPA then runs block by block with each
    block's rows of the mask, and gives the numbers (and gradients) of the one-block path."""
    torch.manual_seed(0)
    pos = torch.randn(2, 300, 3)
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, 200:] = False
    coords = mmpe.Points(pos, mask=mask)
    enc = mmpe.build("rope_axial", context={"num_axes": 3, "head_dim": 12})
    mha = mmpe.MultiHeadAttention(48, 4, [enc])
    x = torch.randn(2, 300, 48, requires_grad=True)
    full = mha(x, coords)
    (g_full,) = torch.autograd.grad(full.square().sum(), x)
    rows_seen = []
    dense = type(coords).dense_mask

    def spy(self, start=0, stop=None):
        out = dense(self, start, stop)
        rows_seen.append(out.shape[-2])
        return out

    monkeypatch.setattr(type(coords), "dense_mask", spy)
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", str(2 * 300 * 40))  # ~40 rows of the mask
    blocked = mha(x, mmpe.Points(pos, mask=mask))
    (g_blocked,) = torch.autograd.grad(blocked.square().sum(), x)
    assert rows_seen and max(rows_seen) < 300
    torch.testing.assert_close(blocked, full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_blocked, g_full, rtol=1e-5, atol=1e-6)
