"""The tiles plan of the CPU attention (``mmpe.attention.plans.tiles``) and the eager bias rows.

Content-free additive terms on coordinates that neither the relation plan (Toeplitz sequences)
nor the grid plan serves — points, graphs, sequences with explicit positions — run block by
block of queries with a hand-written backward pass once their dense bias exceeds the block
budget. The budget is lowered here (``MMPE_ATTN_BLOCK_BYTES``) so that small inputs take the
path in several blocks. Checked: output and gradients w.r.t. x, every encoding parameter and
``Points`` positions against ``route="math"`` (float32, 1e-5) and against the checkpointed
block path it replaces (float64: 1e-10 where the bias is float64, see ``_F32_BIAS``); padding
and fully masked rows; the fused kernels' plain fallbacks; that nothing of ``n × n`` elements
is saved for the backward pass; and that every eager ``bias_rows``/``distance_rows`` override
equals what ``score_mod``/``distance`` give on the same rows.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import lattice, random_points
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpe
import mmpe.attention.plans.tiles as tiles
from mmpe import MultiHeadAttention
from mmpe.attention import fast_forms, forms, generic
from mmpe.attention.fast_forms import fire_tiles as _fire_tiles
from mmpe.attention.plans.flash import (
    _FLASH_CPU,
    _FLASH_CPU_BACKWARD,
    _attend_block,
    _attend_block_backward,
)
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall, ScoreEncoding

POINT_NAMES = ["alibi", "kerple_log", "kerple_power", "fire", "gaussian_distance",
               "radial_gaussian", "radial_bessel"]
#: encodings whose bias is float32 by design (their parameters are read as float32): in a
#: float64 model their parameter gradients agree to float32 precision only.
_F32_BIAS = {"alibi", "fire", "gaussian_distance", "radial_gaussian", "radial_bessel"}
OPTIONS = {"fire": {"init_L": 2.0, "init_c": 0.5}, "gaussian_distance": {"num_kernels": 8,
                                                                          "mlp_width": 8}}
#: the block budget of the tests (bytes): a few rows per block
BUDGET = 100
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture
def small_blocks(monkeypatch):
    """A block budget of a few rows: the tiles plan is taken, in several blocks."""
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", str(BUDGET))


def _encodings(names: list[str], heads: int, seed: int) -> list:
    torch.manual_seed(seed)
    context = {"num_heads": heads, "head_dim": 4, "d_model": 4 * heads}
    encs = [mmpe.build(n, context=context, **OPTIONS.get(n, {})) for n in names]
    with torch.no_grad():  # every learnable parameter off its initial value
        for enc in encs:
            for p in enc.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
    return encs


def _points(batch, n, seed, padded, dtype=torch.float32, grad=True):
    """`helpers.random_points`, positions taking a gradient unless told otherwise."""
    return random_points(batch, n, seed, padded, dtype=dtype, grad=grad)


def _run(encs: list, coords, heads: int, route: str, seed: int, dtype=torch.float32,
         extra: tuple = (), expect_tiles: bool | None = None):
    """Output and gradients (x, every learnable parameter, then `extra`) of one route."""
    torch.manual_seed(seed)
    attn = MultiHeadAttention(4 * heads, heads, encs, route=route).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    batch = coords.batch_size or 2
    x = torch.randn(batch, coords.num_queries, 4 * heads, generator=g, dtype=torch.float64)
    x = x.to(dtype).requires_grad_()
    weight = torch.randn(batch, coords.num_queries, 4 * heads, generator=g,
                         dtype=torch.float64).to(dtype)
    taken = []
    real = tiles.TilesPlan.run

    def spy(self, *args):
        taken.append(True)
        return real(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiles.TilesPlan, "run", spy)
        out = attn(x, coords)
    if expect_tiles is not None:
        # taken where the dense bias exceeds the budget (a tiny input runs dense)
        dense = batch * heads * coords.num_queries * coords.num_keys * 4
        assert bool(taken) == (expect_tiles and dense > BUDGET)
    params = [p for e in encs for p in e.parameters() if p.requires_grad]
    loss = (out * weight).sum() / math.sqrt(out.numel())
    grads = torch.autograd.grad(loss, [x, *params, *extra], retain_graph=True,
                                allow_unused=True)
    return out, grads


def _labels(encs: list, extra: int) -> list[str]:
    return (["x"] + [f"{type(e).__name__}.{n}" for e in encs for n, p in e.named_parameters()
                     if p.requires_grad] + [f"extra{i}" for i in range(extra)])


def _assert_same(a_run, b_run, labels, atol=1e-5, rtol=1e-5, param_tol=None) -> None:
    (out_a, g_a), (out_b, g_b) = a_run, b_run
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=rtol)
    for label, a, b in zip(labels, g_a, g_b, strict=True):
        if b is None or a is None:
            assert (a is None or not a.any()) and (b is None or not b.any()), label
            continue
        bias_side = "." in label or label.startswith("extra")  # parameters and positions
        tol = param_tol if param_tol is not None and bias_side else (atol, rtol)
        if bias_side and param_tol is None:
            # a parameter's gradient sums float32 terms over every pair and head: its rounding
            # follows its largest entry, not each entry (GaussianDistanceBias.means, whose
            # largest is 1.46, differed by 2.6e-5: hypothesis found it)
            tol = (max(tol[0], 3e-5 * float(b.abs().max())), tol[1])
        if label == "FIRE.c":
            # ∂/∂c is the difference of c's terms in ψ(d) and in the normaliser ψ(max(L, i)),
            # each up to ~2,000x larger than it where c is small (c = 7e-4: 135 against 0.06),
            # taken from float32 rows by autograd on one side and by hand on the other
            tol = (1e-4, 1e-3)
        torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1], msg=label)


# -- the path against the math route ---------------------------------------------------------
@SETTINGS
@given(names=st.lists(st.sampled_from(POINT_NAMES), min_size=1, max_size=2, unique=True),
       n=st.integers(1, 19), heads=st.integers(1, 3), batch=st.sampled_from([None, 1, 2]),
       padded=st.booleans(), grad_positions=st.booleans(), seed=st.integers(0, 2**16))
def test_points_equal_math_path(small_blocks, names, n, heads, batch, padded, grad_positions,
                                seed) -> None:
    coords, pos = _points(batch, n, seed, padded, grad=grad_positions)
    encs = _encodings(names, heads, seed)
    extra = (pos,) if grad_positions else ()
    fast = _run(encs, coords, heads, "sdpa", seed, extra=extra, expect_tiles=True)
    slow = _run(encs, coords, heads, "math", seed, extra=extra)
    _assert_same(fast, slow, _labels(encs, len(extra)))


@SETTINGS
@given(names=st.lists(st.sampled_from(["alibi", "kerple_log", "fire", "gaussian_distance"]),
                      min_size=1, max_size=2, unique=True),
       n=st.integers(2, 17), heads=st.integers(1, 3), padded=st.booleans(),
       seed=st.integers(0, 2**16))
def test_float64_equals_checkpointed_block_path(small_blocks, names, n, heads, padded,
                                                seed) -> None:
    # The path it replaces, in float64: output and x gradients to 1e-10; parameter and
    # position gradients to 1e-10 where the bias itself is float64 (KERPLE in a float64 model),
    # else to the float32 precision of the bias (the gradient of an MLP's last bias is a sum
    # of dS over each row, ~0 in exact arithmetic, so the absolute tolerance carries it).
    coords, pos = _points(2, n, seed, padded, dtype=torch.float64)
    encs = _encodings(names, heads, seed)
    fast = _run(encs, coords, heads, "sdpa", seed, torch.float64, (pos,), expect_tiles=True)
    with pytest.MonkeyPatch.context() as mp:  # (hypothesis runs every example in one test)
        mp.setattr("mmpe.attention.plans.tiles.applies", lambda *a: False)
        slow = _run(encs, coords, heads, "sdpa", seed, torch.float64, (pos,),
                    expect_tiles=False)
    param_tol = (1e-6, 1e-5) if set(names) & _F32_BIAS else (1e-10, 1e-10)
    _assert_same(fast, slow, _labels(encs, 1), atol=1e-10, rtol=1e-10, param_tol=param_tol)


@SETTINGS
@given(n=st.integers(2, 18), heads=st.integers(1, 3),
       names=st.lists(st.sampled_from(["alibi", "graphormer_spatial", "fire"]), min_size=1,
                      max_size=2, unique=True),
       seed=st.integers(0, 2**16))
def test_graph_equals_math_path(small_blocks, n, heads, names, seed) -> None:
    graph = lattice(n)
    encs = _encodings(names, heads, seed)
    fast = _run(encs, graph, heads, "sdpa", seed, expect_tiles=True)
    slow = _run(encs, graph, heads, "math", seed)
    _assert_same(fast, slow, _labels(encs, 0))


def test_batched_graphs_with_padding_equal_math_path(small_blocks) -> None:
    edges = torch.tensor([[0, 1, 2, 4, 5], [1, 2, 3, 5, 6]])
    graph = mmpe.Graph(edges, num_nodes=7, batch=torch.tensor([0, 0, 0, 0, 1, 1, 1]),
                       max_distance=3)
    encs = _encodings(["graphormer_spatial", "alibi"], 2, 3)
    fast = _run(encs, graph, 2, "sdpa", 3, expect_tiles=True)
    slow = _run(encs, graph, 2, "math", 3)
    _assert_same(fast, slow, _labels(encs, 0))


@SETTINGS
@given(n=st.integers(2, 16), heads=st.integers(1, 2), causal=st.booleans(),
       batched=st.booleans(), padded=st.booleans(),
       names=st.lists(st.sampled_from(["alibi", "kerple_log", "fire"]), min_size=1,
                      max_size=2, unique=True),
       seed=st.integers(0, 2**16))
def test_explicit_positions_sequence_equals_math_path(small_blocks, n, heads, causal, batched,
                                                      padded, names, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    shape = (2, n) if batched else (n,)
    ids = torch.randint(0, 3 * n, shape, generator=g).sort(-1).values
    pad = None
    if padded:
        pad = torch.rand(shape, generator=g) > 0.3
        pad[..., -1] = True
    seq = mmpe.Sequence(n, position_ids=ids, causal=causal, padding_mask=pad)
    assert not seq.toeplitz
    encs = _encodings(names, heads, seed)
    fast = _run(encs, seq, heads, "sdpa", seed, expect_tiles=True)
    slow = _run(encs, seq, heads, "math", seed)
    _assert_same(fast, slow, _labels(encs, 0))


def test_gradient_reaches_non_leaf_positions(small_blocks) -> None:
    # Positions computed from a leaf: the gradient w.r.t. the intermediate tensor flows through
    # the coordinates' own graph (the path's inputs are the tensors Points holds, not the leaf).
    base = (torch.rand(2, 9, 3) * 3).requires_grad_()
    pos = base * 1.5
    coords = mmpe.Points(pos)
    encs = _encodings(["kerple_log"], 2, 0)
    fast = _run(encs, coords, 2, "sdpa", 0, extra=(pos, base), expect_tiles=True)
    slow = _run(encs, coords, 2, "math", 0, extra=(pos, base))
    _assert_same(fast, slow, _labels(encs, 2))


def test_no_grad_and_fixed_bias_use_the_path(small_blocks) -> None:
    coords, _ = _points(2, 13, 1, padded=True, grad=False)
    encs = _encodings(["alibi"], 2, 1)
    attn = MultiHeadAttention(8, 2, encs)
    ref = MultiHeadAttention(8, 2, encs, route="math")
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, 13, 8)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, coords), ref(x, coords), atol=1e-5, rtol=1e-5)
    # fixed slopes, positions without gradient: the fused kernel's backward pass
    fast = _run(encs, coords, 2, "sdpa", 4, expect_tiles=True)
    slow = _run(encs, coords, 2, "math", 4)
    _assert_same(fast, slow, _labels(encs, 0))


class _Holes(mmpe.Points):
    """Points whose queries `q ≡ 0 (mod 3)` see no key at all: fully masked rows."""

    def mask_mod(self):
        return lambda b, h, q, k: (q % 3 != 0) & (k >= 0)


@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_rows_match_the_block_path(small_blocks, monkeypatch, fused) -> None:
    # Rows with every key masked: output 0 and gradient 0, as the checkpointed SDPA blocks
    # give (the math route's softmax gives NaN there), with or without the fused kernels.
    if not fused:
        monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU", None)
        monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU_BACKWARD", None)
    pos = (torch.rand(10, 3, dtype=torch.float64) * 3).requires_grad_()
    coords = _Holes(pos)
    for names in (["alibi"], ["kerple_log"]):
        encs = _encodings(names, 2, 5)
        fast = _run(encs, coords, 2, "sdpa", 5, torch.float64, (pos,), expect_tiles=True)
        # a masked row's attention output is 0: the layer gives its output projection's bias
        assert torch.equal(fast[0][:, ::3], fast[0][:, :1].expand(-1, 4, -1))
        with monkeypatch.context() as mp:
            mp.setattr("mmpe.attention.plans.tiles.applies", lambda *a: False)
            slow = _run(encs, coords, 2, "sdpa", 5, torch.float64, (pos,),
                        expect_tiles=False)
        assert all(bool(torch.isfinite(g).all()) for g in fast[1] if g is not None)
        _assert_same(fast, slow, _labels(encs, 1), atol=1e-10, rtol=1e-10,
                     param_tol=(1e-6, 1e-5))


def test_without_the_fused_kernels(small_blocks, monkeypatch) -> None:
    # A torch without the CPU kernel's ops: each block is computed explicitly, same numbers.
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU", None)
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU_BACKWARD", None)
    coords, pos = _points(2, 11, 2, padded=True)
    for names in (["alibi"], ["kerple_log", "fire"]):
        encs = _encodings(names, 2, 2)
        fast = _run(encs, coords, 2, "sdpa", 2, extra=(pos,), expect_tiles=True)
        slow = _run(encs, coords, 2, "math", 2, extra=(pos,))
        _assert_same(fast, slow, _labels(encs, 1))


@pytest.mark.skipif(_FLASH_CPU is None or _FLASH_CPU_BACKWARD is None,
                    reason="this torch lacks the fused CPU kernels")
def test_fallback_backward_equals_fused_kernel(monkeypatch) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    bias = torch.randn(1, 3, 5, 7, generator=g, dtype=torch.float64)
    bias[0, 1, 2] = float("-inf")  # one fully masked row
    bias[0, 0, :, 3] = float("-inf")
    out, lse = _attend_block(q, k, v, bias, 0.4)
    d_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    fused = _attend_block_backward(d_out, q, k, v, out, lse, bias, 0.4)
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU", None)
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU_BACKWARD", None)
    out_p, lse_p = _attend_block(q, k, v, bias, 0.4)
    torch.testing.assert_close(out_p, out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse_p, lse, atol=1e-12, rtol=1e-12)
    plain = _attend_block_backward(d_out, q, k, v, out_p, lse_p, bias, 0.4)
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("layout", ["transposed", "broadcast heads", "sliced rows",
                                    "broadcast keys"])
def test_fused_kernels_read_any_mask_layout(layout) -> None:
    # torch 2.5's fused CPU kernel read a mask strided along keys (a transposed view, as a
    # symmetric graph distance gives) as if it were contiguous: wrong numbers, no error.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 3, n, 4, generator=g, dtype=torch.float64) for n in (5, 5, 5))
    dense = torch.randn(1, 3, 5, 5, generator=g, dtype=torch.float64)
    bias = {"transposed": dense.transpose(-1, -2),
            "broadcast heads": dense[:, :1].expand(1, 3, 5, 5),
            "sliced rows": torch.randn(1, 3, 9, 5, generator=g, dtype=torch.float64)[:, :, 2:7],
            "broadcast keys": dense[..., :1].expand(1, 3, 5, 5)}[layout]
    scores = (q @ k.transpose(-1, -2)) * 0.4 + bias
    probs = scores.softmax(-1)
    out, lse = _attend_block(q, k, v, bias, 0.4)
    torch.testing.assert_close(out, probs @ v, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, scores.logsumexp(-1), atol=1e-12, rtol=1e-12)
    d_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(((leaves[0] @ leaves[1].transpose(-1, -2)) * 0.4 + bias)
                              .softmax(-1) @ leaves[2], leaves, d_out)
    got = _attend_block_backward(d_out, q, k, v, out, lse, bias, 0.4)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_nothing_of_n_squared_is_saved(small_blocks) -> None:
    n = 48
    coords, pos = _points(1, n, 0, padded=True)
    encs = _encodings(["kerple_log", "fire", "alibi"], 2, 0)
    attn = MultiHeadAttention(8, 2, encs)
    x = torch.randn(1, n, 8, requires_grad=True)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attn(x, coords)
    assert saved and max(saved) < n * n, max(saved)
    out.square().mean().backward()
    assert pos.grad is not None and all(p.grad is not None for e in encs
                                        for p in e.parameters() if p.requires_grad)


def test_content_dependent_terms_keep_the_checkpointed_blocks(small_blocks) -> None:
    scores = [s for s in _encodings(["alibi"], 2, 0)]

    class _Content(ScoreEncoding):
        content_free = False

    ctx = AttentionCall(_points(1, 5, 0, False)[0], 2, 4, 1, None,
                           *(torch.randn(1, 2, 5, 4) for _ in range(3)))
    assert tiles.applies(scores, ctx)
    assert not tiles.applies([*scores, _Content()], ctx)
    ctx.q = ctx.q.bfloat16()
    assert not tiles.applies(scores, ctx)


# -- the eager rows against score_mod and distance --------------------------------------------
def _grid_distance(coords, start: int, stop: int):
    b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys)
    return coords.distance(q[:, :, start:stop], k, b)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), batch=st.sampled_from([None, 1, 3]), padded=st.booleans(),
       grad=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]),
       data=st.data())
def test_points_distance_rows_equal_distance(n, batch, padded, grad, dtype, data) -> None:
    coords, pos = _points(batch, n, data.draw(st.integers(0, 99)), padded, dtype, grad)
    if n > 2:  # a repeated point: distance 0 off the diagonal, gradient 0 (not NaN)
        with torch.no_grad():
            coords._axis_pos[0][..., 1] = coords._axis_pos[0][..., 2]
            coords._axis_pos[1][..., 1] = coords._axis_pos[1][..., 2]
            coords._axis_pos[2][..., 1] = coords._axis_pos[2][..., 2]
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    rows = coords.distance_rows(start, stop)
    ref = _grid_distance(coords, start, stop)
    assert rows.dtype == torch.float32 and rows.shape == ref.shape
    assert torch.equal(rows, ref)
    if grad:
        w = torch.randn(ref.shape, dtype=ref.dtype)
        g_rows = torch.autograd.grad((rows * w).sum(), pos, retain_graph=True)[0]
        g_ref = torch.autograd.grad((ref * w).sum(), pos, retain_graph=True)[0]
        assert torch.isfinite(g_rows).all()
        assert torch.equal(g_rows, g_ref)
    with torch.no_grad():  # the in-place form
        assert torch.equal(coords.distance_rows(start, stop), ref)


def test_graph_distance_rows_equal_distance() -> None:
    graph = mmpe.Graph(torch.tensor([[0, 1, 3], [1, 2, 4]]), num_nodes=6,
                       batch=torch.tensor([0, 0, 0, 1, 1, 1]), max_distance=2)
    for start, stop in ((0, 3), (1, 2), (0, graph.num_queries)):
        assert torch.equal(graph.distance_rows(start, stop), _grid_distance(graph, start, stop))


def _coords_cases(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 20, (2, 9), generator=g).sort(-1).values
    return [_points(None, 8, seed, False)[0], _points(2, 9, seed, True)[0],
            mmpe.Sequence(9, position_ids=ids, causal=True), lattice(9)]


@settings(max_examples=30, deadline=None)
@given(names=st.sampled_from(["alibi", "kerple_log", "kerple_power", "fire"]),
       heads=st.integers(1, 4), case=st.integers(0, 3), unit=st.sampled_from([1.0, 0.7]),
       seed=st.integers(0, 999), data=st.data())
def test_bias_rows_equal_score_mod(names, heads, case, unit, seed, data) -> None:
    coords = _coords_cases(seed)[case]
    options = {"distance_unit": unit} if names == "alibi" else {}
    enc = mmpe.build(names, context={"num_heads": heads, "head_dim": 4, "d_model": 4 * heads},
                     **{**OPTIONS.get(names, {}), **options})
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ctx = AttentionCall(coords, heads, 4, coords.batch_size or 1)
    n = coords.num_queries
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    rows = forms.rows(enc, ctx, start, stop)
    ref = generic.pair_rows(enc, ctx, start, stop)  # score_mod on the rows' index grid
    assert rows.shape == ref.shape
    # FIRE's rows evaluate its MLP piece by piece (the same function, other rounding)
    tol = 1e-5 if names == "fire" else 0.0
    torch.testing.assert_close(rows, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["gaussian_distance", "radial_gaussian", "radial_bessel"])
def test_geometry_bias_rows_equal_the_pair_term(name) -> None:
    enc = mmpe.build(name, context={"num_heads": 3}, **OPTIONS.get(name, {}))
    for coords in _coords_cases(4):
        ctx = AttentionCall(coords, 3, 4, coords.batch_size or 1)
        b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys)
        ref = forms.pair_term(enc, ctx, q[:, :, 2:7], k, b)  # [n_h, b, 1, rows, n_k]
        torch.testing.assert_close(forms.rows(enc, ctx, 2, 7),
                                   ref.squeeze(2).transpose(0, 1), atol=0, rtol=0)


def test_graphormer_spatial_bias_rows_equal_score_mod() -> None:
    enc = mmpe.build("graphormer_spatial", context={"num_heads": 3})
    graph = mmpe.Graph(torch.tensor([[0, 1, 4], [1, 2, 5]]), num_nodes=6,
                       batch=torch.tensor([0, 0, 0, 0, 1, 1]), max_distance=2)
    ctx = AttentionCall(graph, 3, 4, 2)
    for start, stop in ((0, 2), (1, 4), (0, graph.num_queries)):
        torch.testing.assert_close(forms.rows(enc, ctx, start, stop),
                                   generic.pair_rows(enc, ctx, start, stop), atol=0, rtol=0)


# -- the cases of the encodings' hand-written tiles ---------------------------------------------
def _vjp_case(name: str, heads: int, seed: int, batch, grad_positions: bool):
    if name == "graphormer_spatial":
        coords, pos = lattice(11), None
    else:
        coords, pos = _points(batch, 10, seed, padded=seed % 2 == 0, grad=grad_positions)
    enc = _encodings([name], heads, seed)[0]
    return enc, AttentionCall(coords, heads, 4, coords.batch_size or 2), pos


def _autograd_grads(enc, ctx, start, stop, d_bias, wrt):
    rows = forms.rows(enc, ctx, start, stop)
    got = torch.autograd.grad((rows * d_bias).sum(), wrt, retain_graph=True, allow_unused=True)
    return rows, [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, got, strict=True)]


def _fire_c_term_scale(enc, ctx, start, stop, d_bias) -> float:
    """`|∂/∂c|` of `Σ dS ⊙ rows` through `ψ(d)` alone (the normaliser held fixed): FIRE's
    ∂/∂c is the difference of its terms through ψ(d) and through the normaliser, each known to
    float32 precision, so the tolerance follows the terms' size."""
    from mmpe.attention.fast_forms import fire as fire_forms

    real = fire_forms._norm_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fire_forms, "_norm_rows", lambda *args: real(*args).detach())
        (grad,) = torch.autograd.grad((forms.rows(enc, ctx, start, stop) * d_bias).sum(), enc.c)
    return float(grad.detach().abs())


# -- the encodings' tiles (BiasTiles) against bias_rows and autograd -------------------------
def _tile_grads(enc, ctx, start, stop, width, d_bias, wrt, batch):
    """Rows written tile by tile and the gradients w.r.t. `wrt` of `Σ dS ⊙ rows` by the
    encoding's `bias_tiles` (every batch entry, tile and head, in the tiles plan's backward's
    order)."""
    with torch.enable_grad():
        tiles = forms.tiles(enc, ctx, start, stop, width)
    rows = torch.empty(batch, enc.num_heads if hasattr(enc, "num_heads") else d_bias.shape[1],
                       stop - start, ctx.coords.num_keys)
    for i in range(batch):
        for j, c in enumerate(range(0, ctx.coords.num_keys, width)):
            for head in range(rows.shape[1]):
                out = torch.empty(stop - start, min(width, ctx.coords.num_keys - c))
                tiles.write(out, i, head, j, add=False)
                rows[i, head, :, c:c + width] = out
                tiles.take(d_bias[i, head, :, c:c + width].contiguous(), i, head, j)
    tensors, cotangents = tiles.pullback()
    pairs = [(t, g) for t, g in zip(tensors, cotangents, strict=True) if t.requires_grad]
    tensors, cotangents = zip(*pairs, strict=True)
    got = torch.autograd.grad(tensors, wrt, cotangents, retain_graph=True, allow_unused=True)
    return rows, [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, got, strict=True)]


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["kerple_log", "fire", "graphormer_spatial"]),
       heads=st.integers(1, 3), batch=st.sampled_from([None, 1, 2]), grad_positions=st.booleans(),
       width=st.integers(1, 12), seed=st.integers(0, 999), data=st.data())
def test_bias_tiles_equal_rows_and_autograd(name, heads, batch, grad_positions, width, seed,
                                            data) -> None:
    # The tiles the tiles plan's backward pass reads: each tile's bias bit for bit the rows of
    # bias_rows, and the gradients from the tiles' dS those of autograd through bias_rows.
    # FIRE in both of its forms: ramps (any number of cuts) and gathered pieces.
    limit = data.draw(st.sampled_from([-1, 64]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fire_tiles, "RAMP_MAX_CUTS", limit)
        _check_tiles(name, heads, batch, grad_positions, width, seed, data)


def _check_tiles(name, heads, batch, grad_positions, width, seed, data) -> None:
    enc, ctx, pos = _vjp_case(name, heads, seed, batch, grad_positions)
    n = ctx.coords.num_queries
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    b = ctx.coords.batch_size or 2
    d_bias = torch.randn(b, heads, stop - start, ctx.coords.num_keys,
                         generator=torch.Generator().manual_seed(seed))
    wrt = [p for p in enc.parameters() if p.requires_grad] + ([pos] if grad_positions
                                                              and pos is not None else [])
    rows, fast = _tile_grads(enc, ctx, start, stop, width, d_bias, wrt, b)
    ref_rows, ref = _autograd_grads(enc, ctx, start, stop, d_bias, wrt)
    assert torch.equal(rows, ref_rows.detach().expand_as(rows))
    for w, a, b_ in zip(wrt, fast, ref, strict=True):
        atol = 1e-5
        if name == "fire" and w is enc.c:  # the terms' size, see _fire_c_term_scale
            # (hypothesis: c = −0.0075, terms summing to 0.61, the two sides 1.2e-4 apart)
            atol += 1e-5 * _fire_c_term_scale(enc, ctx, start, stop, d_bias)
        torch.testing.assert_close(a, b_, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("name", ["kerple_log", "fire", "graphormer_spatial"])
def test_bias_tiles_comparison_catches_a_wrong_gradient(name, monkeypatch) -> None:
    # The control of the test above: a tile pullback whose first cotangent is 10 % off fails.
    enc, ctx, _ = _vjp_case(name, 2, 3, 2, False)
    d_bias = torch.randn(2, 2, 4, ctx.coords.num_keys, generator=torch.Generator().manual_seed(0))
    wrt = [p for p in enc.parameters() if p.requires_grad]
    real = fast_forms.FAST_FORMS[type(enc)]["tiles"]

    def skewed(*args):
        tiles = real(*args)
        pull = tiles.pullback
        tiles.pullback = lambda: (lambda t, c: (t, [c[0] * 1.1, *c[1:]]))(*pull())
        return tiles

    monkeypatch.setitem(fast_forms.FAST_FORMS[type(enc)], "tiles", skewed)
    _, fast = _tile_grads(enc, ctx, 2, 6, 3, d_bias, wrt, 2)
    _, ref = _autograd_grads(enc, ctx, 2, 6, d_bias, wrt)
    with pytest.raises(AssertionError):
        for a, b in zip(fast, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("names", [["kerple_log", "fire"], ["graphormer_spatial", "fire"]])
def test_two_tiled_terms_and_float64(small_blocks, monkeypatch, names) -> None:
    # Two tiled terms summed in one tile against the math route (float32), and in a float64
    # model (float32 FIRE rows, float64 KERPLE rows, summed before the cast) against the
    # checkpointed block path.
    for dtype in (torch.float32, torch.float64):
        if "graphormer_spatial" in names:
            coords, extra = lattice(13), ()
        else:
            coords, pos = _points(2, 13, 4, padded=True, dtype=dtype)
            extra = (pos,)
        encs = _encodings(names, 2, 4)
        fast = _run(encs, coords, 2, "sdpa", 4, dtype, extra, expect_tiles=True)
        if dtype == torch.float32:
            slow = _run(encs, coords, 2, "math", 4, dtype, extra)
            _assert_same(fast, slow, _labels(encs, len(extra)))
            continue
        with monkeypatch.context() as mp:
            mp.setattr("mmpe.attention.plans.tiles.applies", lambda *a: False)
            slow = _run(encs, coords, 2, "sdpa", 4, dtype, extra, expect_tiles=False)
        _assert_same(fast, slow, _labels(encs, len(extra)), atol=1e-10, rtol=1e-10,
                     param_tol=(1e-6, 1e-5))


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.floats(-3, 3, width=32), min_size=1, max_size=40),
       xs=st.lists(st.floats(-4, 4, width=32), min_size=1, max_size=60))
def test_piece_of_equals_searchsorted(cuts, xs) -> None:
    from mmpe.attention.fast_forms.fire_tiles import piece_of

    cuts_t = torch.tensor(sorted(cuts), dtype=torch.float32)
    x = torch.tensor(xs + cuts[:3], dtype=torch.float32)  # some x exactly on a cut
    assert torch.equal(piece_of(cuts_t, x), torch.searchsorted(cuts_t, x))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 999), batch=st.sampled_from([None, 2]),
       limit=st.integers(-1, 33),
       data=st.data())
def test_fire_rows_do_not_depend_on_the_blocking(seed, batch, limit, data) -> None:
    # FIRE reads its MLP on each block's range of inputs; a pair's number must not depend on
    # which block it falls in (the forward and backward passes and the checkpointed path
    # block the queries differently): rows of two blocks bit for bit those of one, with and
    # without a graph, in either form.
    enc, ctx, _ = _vjp_case("fire", 2, seed, batch, False)
    if data.draw(st.booleans()):  # a sequence: its early queries' blocks have smaller inputs
        coords = _coords_cases(seed)[2]
        ctx = AttentionCall(coords, 2, 4, coords.batch_size or 1)
    if data.draw(st.booleans()):  # cuts all over [0, 1]: blocks of other ranges hold others
        with torch.no_grad():
            enc.mlp[0].bias.copy_(-enc.mlp[0].weight[:, 0] * torch.linspace(0.02, 0.98, 32))
    n = ctx.coords.num_queries
    cut = data.draw(st.integers(1, n - 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fire_tiles, "RAMP_MAX_CUTS", limit)
        with torch.no_grad():
            whole = forms.rows(enc, ctx, 0, n)
            parts = torch.cat((forms.rows(enc, ctx, 0, cut), forms.rows(enc, ctx, cut, n)), dim=2)
        graphed = forms.rows(enc, ctx, cut, n)
    assert torch.equal(whole, parts)
    assert graphed.requires_grad and torch.equal(graphed.detach(), whole[:, :, cut:])


def test_fire_forms_agree() -> None:
    # The two forms are the same function: ramps and gathered pieces to float32 rounding, on
    # an MLP with several cuts in the inputs' range (and the control: another MLP differs).
    enc, ctx, _ = _vjp_case("fire", 3, 7, 2, False)
    with torch.no_grad():
        enc.mlp[0].bias.copy_(-enc.mlp[0].weight[:, 0] * torch.linspace(0.05, 0.9, 32))
    n = ctx.coords.num_queries
    rows = {}
    for limit in (-1, 64):
        with pytest.MonkeyPatch.context() as mp, torch.no_grad():
            mp.setattr(_fire_tiles, "RAMP_MAX_CUTS", limit)
            rows[limit] = forms.rows(enc, ctx, 0, n)
    torch.testing.assert_close(rows[64], rows[-1], atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        enc.mlp[2].weight.mul_(1.01)
        other = forms.rows(enc, ctx, 0, n)
    assert not torch.allclose(other, rows[64], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", POINT_NAMES + ["graphormer_spatial"])
def test_bias_rows_leave_the_coordinates_alone(name) -> None:
    # An encoding that works in place on the distance rows the coordinates hand it (a graph's
    # are views of its own cached table) would change every later call's numbers.
    for coords in _coords_cases(3):
        if name == "graphormer_spatial" and not isinstance(coords, mmpe.Graph):
            continue
        enc = mmpe.build(name, context={"num_heads": 2}, **OPTIONS.get(name, {}))
        ctx = AttentionCall(coords, 2, 4, coords.batch_size or 1)
        n = coords.num_queries
        before = coords.distance_rows(0, n).clone() if hasattr(coords, "distance_rows") \
            else None
        with torch.no_grad():
            first = forms.rows(enc, ctx, 0, n)
            again = forms.rows(enc, ctx, 0, n)
        assert torch.equal(first, again)
        if before is not None:
            assert torch.equal(coords.distance_rows(0, n), before)


@SETTINGS
@given(case=st.sampled_from([("points", "alibi"), ("points", "kerple_log"), ("points", "fire"),
                             ("graph", "alibi"), ("graph", "graphormer_spatial"),
                             ("graph", "fire")]),
       n=st.integers(2, 17), heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_two_terms_of_one_kind_equal_math_path(small_blocks, case, n, heads, seed) -> None:
    # Two instances of one encoding take scratch blocks at the same call sites
    # (`mmpe._scratch`): each keeps its own, and neither overwrites the other's.
    kind, name = case
    coords = _points(2, n, seed, padded=False)[0] if kind == "points" else lattice(n)
    encs = _encodings([name], heads, seed) + _encodings([name], heads, seed + 1)
    fast = _run(encs, coords, heads, "sdpa", seed, expect_tiles=True)
    slow = _run(encs, coords, heads, "math", seed)
    _assert_same(fast, slow, _labels(encs, 0))


@pytest.mark.parametrize("kind", ["points", "graph"])
def test_blocks_reuse_one_storage(small_blocks, kind) -> None:
    # Each block's rows refill the previous block's storage (a fresh multi-MB block costs its
    # page faults), which needs the path to let go of a block before asking for the next.
    coords = _points(None, 16, 0, padded=False, grad=False)[0] if kind == "points" \
        else lattice(16)
    attn = MultiHeadAttention(8, 2, _encodings(["alibi"], 2, 0))
    seen, biases = [], []
    cls = type(attn.scores[0])
    own = fast_forms.FAST_FORMS[cls]
    real_rows, real_attend = own["rows"], tiles._attend_block

    def spy_rows(self, ctx, start, stop):
        rows = real_rows(self, ctx, start, stop)
        seen.append(rows.data_ptr())
        return rows

    def spy_attend(q, k, v, bias, scale):
        biases.append(bias.data_ptr())
        return real_attend(q, k, v, bias, scale)

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(own, "rows", spy_rows)
        mp.setattr(tiles, "_attend_block", spy_attend)
        with torch.no_grad():
            attn(torch.randn(1, 16, 8), coords)
    assert len(seen) > 2 and len(set(seen)) == 1
    assert len(biases) > 2 and len(set(biases)) == 1


def test_rows_kept_across_blocks_are_not_overwritten() -> None:
    # A caller that keeps a block's rows while asking for the next gets new storage.
    from mmpe._scratch import reuse_blocks

    coords = _points(None, 12, 0, padded=False, grad=False)[0]
    for name in ["alibi", "kerple_log", "fire"]:
        enc = _encodings([name], 2, 0)[0]
        ctx = AttentionCall(coords, 2, 4, 1)
        with torch.no_grad():
            expected = [forms.rows(enc, ctx, s, s + 4).clone() for s in (0, 4, 8)]
            with reuse_blocks():
                kept = [forms.rows(enc, ctx, s, s + 4) for s in (0, 4, 8)]
        for a, b in zip(kept, expected, strict=True):
            assert torch.equal(a, b), name
