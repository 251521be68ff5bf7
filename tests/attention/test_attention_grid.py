"""The grid plan of the CPU attention (``mmpe.attention.plans.grid``) against the math route.

A bias that depends only on the cell offset (ALiBi, T5, KERPLE, FIRE on grid distance; Swin/BEiT
tables; SwinV2's CPB) runs on a ``Grid`` as block-wise SDPA over a block-Toeplitz table, with a
hand-written backward pass that reduces the gradient of the scores onto the offset table and the
prefix tokens' values. Every case compares the outputs and the gradients w.r.t. q, k, v and every
encoding parameter with the explicit math route (float32, 1e-5), over 2D and 3D grids, prefix
tokens, heads, batch, and block, chunk and tile sizes; a control with a mirrored table must fail.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpe
import mmpe.attention.plans.grid as grid_path
import mmpe.attention.plans.grid_backward as grid_backward
from mmpe import Grid, MultiHeadAttention
from mmpe.attention import forms
from mmpe.encodings.base import AttentionCall

NAMES = ["alibi", "t5", "kerple_log", "kerple_power", "fire", "swin", "swinv2_cpb"]
#: The distance-kernel biases: checked one at a time on fixed seeds (agreeing to ~1e-6). In
#: random mixtures with a near-zero kernel width their parameter gradients differed between
#: the paths by up to 2e-3 relative (the kernels run in float32 on both paths, where per-pair
#: terms ~1/σ³ cancel: attributed to reduction order, not proven), beyond the mixtures' 1e-5.
GEOMETRY = ["gaussian_distance", "radial_gaussian", "radial_bessel"]


@pytest.fixture(autouse=True)
def _small_grids_take_the_grid_path(monkeypatch):
    # The path is taken from a dense-bias size up (small grids run faster dense); these tests
    # use small grids, so the threshold is lifted for them.
    monkeypatch.setattr(grid_path, "GRID_MIN_BIAS_BYTES", 0)
    monkeypatch.setattr(grid_path, "GRID_MIN_LEARNED_BIAS_BYTES", 0)


def _encodings(names: list[str], heads: int, shape: tuple[int, ...], seed: int) -> list:
    """Built encodings with every learnable parameter moved off its initial value (T5's table
    starts at zero, Swin's near it). FIRE's threshold L is small so its normaliser is active."""
    torch.manual_seed(seed)
    context = {"num_heads": heads, "head_dim": 8, "d_model": 8 * heads, "grid_shape": shape}
    options = {"fire": {"init_L": 2.0, "init_c": 0.5}, "swinv2_cpb": {"hidden": 16}}
    encs = [mmpe.build(n, context=context, **options.get(n, {})) for n in names]
    with torch.no_grad():
        for enc in encs:
            for p in enc.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
    return encs


def _run(encs: list, grid: Grid, heads: int, batch: int, route: str, seed: int,
         dtype: torch.dtype = torch.float32):
    """Output and gradients (q, k, v, then every learnable parameter) of one route."""
    g = torch.Generator().manual_seed(seed)
    n = grid.num_tokens
    q, k, v, weight = (torch.randn(batch, heads, n, 8, generator=g, dtype=torch.float64).to(dtype)
                       for _ in range(4))
    attn = MultiHeadAttention(8 * heads, heads, encs, route=route)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    params = [p for e in encs for p in e.parameters() if p.requires_grad]
    ctx = AttentionCall(grid, heads, 8, batch, None, *leaves)
    if route == "sdpa":
        assert grid_path.takes_grid_path(attn.scores, ctx)
    out = attn.attend(ctx)
    grads = torch.autograd.grad((out * weight).sum() / math.sqrt(out.numel()), leaves + params,
                                allow_unused=True)
    return out, grads


def _compare(names: list[str], grid: Grid, heads: int, batch: int, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> None:
    encs = _encodings(names, heads, grid.shape, seed)
    out_fast, g_fast = _run(encs, grid, heads, batch, "sdpa", seed + 1, dtype)
    out_slow, g_slow = _run(encs, grid, heads, batch, "math", seed + 1, dtype)
    torch.testing.assert_close(out_fast.float(), out_slow.float(), atol=1e-5, rtol=1e-5)
    labels = ["q", "k", "v"] + [f"{type(e).__name__}.{n}" for e in encs
                                for n, p in e.named_parameters() if p.requires_grad]
    for label, a, b in zip(labels, g_fast, g_slow, strict=True):
        if b is None:
            assert a is None or not a.any(), label
            continue
        tol = (1e-5, 1e-5)
        if label == "FIRE.c":
            # ∂/∂c is the difference of c's terms in ψ(d) and in the normaliser, each up to
            # ~2,000× larger than it where c is small, from float32 rows on both sides (the
            # tolerance of tests/attention/test_tiles_plan.py; hypothesis found c = 0.5 + 0.3·N
            # near 0 here too, torch 2.5.1, a 1 × 2 grid)
            tol = (1e-4, 1e-3)
        torch.testing.assert_close(a.float(), b.float(), atol=tol[0], rtol=tol[1], msg=label)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
    shape=st.one_of(st.tuples(st.integers(1, 6), st.integers(1, 6)),
                    st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4))),
    prefix=st.integers(0, 2),
    heads=st.integers(1, 3),
    batch=st.integers(1, 2),
    chunk=st.sampled_from([1, 2, 3, 64]),
    rows=st.sampled_from([1, 5, 256]),
    tile=st.sampled_from([1, 4, 512]),
    seed=st.integers(0, 2**16),
)
def test_grid_path_equals_math_path_with_gradients(names, shape, prefix, heads, batch, chunk,
                                                   rows, tile, seed) -> None:
    grid = Grid(shape, prefix_tokens=prefix)
    with mock.patch.object(grid_path, "GRID_CHUNK", chunk), \
            mock.patch.multiple(grid_backward, GRID_BACKWARD_ROWS=rows, GRID_KEY_TILE=tile,
                                GRID_FIXED_BIAS_BYTES=rows * 4 * grid.num_tokens):
        _compare(names, grid, heads, batch, seed)


@pytest.mark.parametrize("name", NAMES + GEOMETRY)
@pytest.mark.parametrize("shape,prefix", [((12, 10), 1), ((3, 5, 6), 0), ((2, 4, 3), 2)])
def test_each_encoding_on_larger_grids(name, shape, prefix) -> None:
    _compare([name], Grid(shape, prefix_tokens=prefix), heads=2, batch=1, seed=3)


def test_scaled_manhattan_grid() -> None:
    # Distances in scaled units and another metric: still a function of the offset.
    grid = Grid((4, 5), scale=(2.0, 0.5), metric="manhattan", prefix_tokens=1,
                prefix_distance=1.5)
    _compare(["alibi", "t5", "fire"], grid, heads=2, batch=2, seed=7)


def test_control_mirrored_table_fails() -> None:
    # The check can fail: reading the table at q − k instead of k − q (Swin's table is not
    # symmetric) gives other numbers than the math route.
    real = forms.offset_pairs

    def mirrored(grid):
        q_idx, kv_idx = real(grid)
        return kv_idx, q_idx

    with mock.patch.object(forms, "offset_pairs", mirrored), pytest.raises(AssertionError):
        _compare(["swin"], Grid((4, 5)), heads=2, batch=1, seed=1)


def test_float64_and_without_the_fused_kernel(monkeypatch) -> None:
    _compare(["t5", "swin"], Grid((5, 4), prefix_tokens=1), heads=2, batch=1,
             dtype=torch.float64)
    # A torch without the CPU kernel's op: each block is computed explicitly, same numbers.
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU", None)
    _compare(["alibi", "swinv2_cpb"], Grid((3, 4, 5), prefix_tokens=1), heads=2, batch=2)


def test_layer_forward_backward_equals_math_path() -> None:
    shape = (6, 7)
    encs = _encodings(["swin", "alibi"], 4, shape, 2)
    fast = MultiHeadAttention(32, 4, encs, num_kv_heads=2)
    slow = MultiHeadAttention(32, 4, encs, num_kv_heads=2, route="math")
    slow.load_state_dict(fast.state_dict())
    grid = Grid(shape, prefix_tokens=1)
    x = torch.randn(2, grid.num_tokens, 32)
    outs = []
    for attn in (fast, slow):
        xx = x.clone().requires_grad_()
        out = attn(xx, grid)
        params = [p for p in attn.parameters() if p.requires_grad]
        outs.append((out, torch.autograd.grad(out.square().mean(), [xx, *params])))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["swin", "t5"])
def test_training_saves_no_pairwise_tensor(name: str) -> None:
    # The grid plan saves q, k, v, the output, the log-sum-exp and the offset table.
    shape = (16, 16)
    grid = Grid(shape, prefix_tokens=1)
    n = grid.num_tokens
    attn = MultiHeadAttention(32, 4, _encodings([name], 4, shape, 0))
    sizes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    x = torch.randn(1, n, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attn(x, grid)
    out.sum().backward()
    assert max(sizes) < n * n, f"a saved tensor has {max(sizes)} elements (n² = {n * n})"
    assert all(p.grad is not None for p in attn.parameters() if p.requires_grad)


def test_which_calls_take_the_grid_path() -> None:
    def takes(names, grid, **build):
        encs = [mmpe.build(n, context={"num_heads": 2, "head_dim": 8, "d_model": 16,
                                       "grid_shape": grid.shape}, **build) for n in names]
        q = torch.zeros(1, 2, grid.num_tokens, 8)
        ctx = AttentionCall(grid, 2, 8, 1, None, q, q, q)
        return grid_path.takes_grid_path([e for e in encs if e.hook == "score"], ctx)

    assert takes(["swin", "alibi"], Grid((4, 4), prefix_tokens=1))
    assert takes(["t5", "fire"], Grid((2, 3, 4)))
    assert not takes(["alibi"], Grid((7,)))  # one axis: a sequence's business
    assert not takes(["alibi", "da_transformer"], Grid((4, 4)))  # reads the content
    assert not takes([], Grid((4, 4)))


def test_small_grids_run_dense(monkeypatch) -> None:
    # Below GRID_MIN_BIAS_BYTES of dense bias (a few MiB where a term is learned), one fused
    # SDPA call is faster.
    monkeypatch.setattr(grid_path, "GRID_MIN_BIAS_BYTES", 64 << 20)
    monkeypatch.setattr(grid_path, "GRID_MIN_LEARNED_BIAS_BYTES", 6 << 20)
    swin = mmpe.build("swin", num_heads=6, grid_shape=(32, 32))
    alibi = mmpe.build("alibi", num_heads=6)
    for enc, shape, expected in ((swin, (18, 18), False), (swin, (24, 24), True),
                                 (alibi, (32, 32), False), (alibi, (64, 64), True)):
        grid = Grid(shape, prefix_tokens=1)
        q = torch.zeros(1, 6, grid.num_tokens, 8)
        ctx = AttentionCall(grid, 6, 8, 1, None, q, q, q)
        assert grid_path.takes_grid_path([enc], ctx) is expected, (enc, shape)
    swin.requires_grad_(False)  # a frozen table is a constant: the dense threshold
    grid = Grid((24, 24), prefix_tokens=1)
    q = torch.zeros(1, 6, grid.num_tokens, 8)
    assert not grid_path.takes_grid_path([swin], AttentionCall(grid, 6, 8, 1, None, q, q, q))


@pytest.mark.parametrize("names", [["t5", "swin"], ["alibi"], ["fire", "kerple_log"]])
def test_a_bias_without_gradient_takes_the_fused_backward(names) -> None:
    # A frozen table (or ALiBi, which has none) runs SDPA's fused backward on copied bias rows;
    # with a learned one the hand-written tiles run. Both equal the math route.
    grid = Grid((5, 6), prefix_tokens=1)
    encs = _encodings(names, 3, grid.shape, 4)
    for enc in encs:
        enc.requires_grad_(False)
    calls = []
    real = grid_backward.fixed_backward

    def counting(*args):
        calls.append(1)
        return real(*args)

    with mock.patch.object(grid_backward, "fixed_backward", counting), \
            mock.patch.object(grid_backward, "GRID_FIXED_BIAS_BYTES", 40 * grid.num_tokens):
        out_fast, g_fast = _run(encs, grid, 3, 2, "sdpa", 5)
    assert calls, "the fused backward did not run"
    # past GRID_FUSED_KEYS_BYTES of keys per head, the tiles by hand, without the table's grad
    with mock.patch.object(grid_backward, "fixed_backward", counting), \
            mock.patch.object(grid_backward, "GRID_FUSED_KEYS_BYTES", 0):
        out_tiles, g_tiles = _run(encs, grid, 3, 2, "sdpa", 5)
    assert len(calls) == 1
    out_slow, g_slow = _run(encs, grid, 3, 2, "math", 5)
    for out, grads in ((out_fast, g_fast), (out_tiles, g_tiles)):
        torch.testing.assert_close(out, out_slow, atol=1e-5, rtol=1e-5)
        for label, a, b in zip("qkv", grads, g_slow, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=label)
        assert len(grads) == 3  # no parameter took a gradient


def test_groups_span_rows_of_a_short_last_axis() -> None:
    # A chunk is consecutive cells of a slab: on 4 × 3 × 5 with chunks of 8 cells, groups of
    # 8 and 7 cells, each row c_0 of a group's tokens one run of consecutive tokens.
    grid = Grid((4, 3, 5), prefix_tokens=2)
    with mock.patch.object(grid_path, "GRID_CHUNK", 8):
        plan = grid_path.GridPlan(grid, 1.0, 4)
    widths = [tokens.shape[1] for _, tokens in plan.groups()]
    assert widths == [8, 7]
    tokens = torch.cat([t for _, t in plan.groups()], dim=1)
    assert torch.equal(tokens, 2 + torch.arange(60).view(4, 15))
