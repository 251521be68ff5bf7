"""Compiled FlexAttention on the CPU side: compilations stay bounded over lengths, batch sizes,
decoding offsets and grad modes; torch's recompile limit is an error in strict mode and a
counted, logged event otherwise; a kernel too large for shared memory is retried with smaller
tiles; the per-offset table that learned relation terms use on a GPU equals their in-kernel
``score_mod``, gradients included.

Dynamo's guards (what triggers a recompilation) do not depend on the route, so the counts
use ``backend="eager"``: the GPU tier (tests/gpu/test_gpu.py) repeats them with inductor.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import flex_compile
from mmpe.attention import compose_score_mods
from mmpe.attention.flex import block_mask_of, flex_mods
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall

HEADS, HEAD_DIM = 4, 8
pytestmark = pytest.mark.skipif(not flex_compile.available(),
                                reason="mmpe's FlexAttention path needs torch >= 2.6")


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(flex_compile, "_copies", {})
    monkeypatch.setattr(flex_compile, "_tiles", {})
    monkeypatch.setattr(flex_compile, "_probed", set())
    monkeypatch.setattr(flex_compile, "_static_shapes", {})
    monkeypatch.setattr(flex_compile, "_static_full", set())
    monkeypatch.delenv("MMPE_FLEX_DYNAMIC", raising=False)
    flex_compile.stats.reset()
    monkeypatch.delenv("MMPE_FLEX_STRICT", raising=False)
    torch._dynamo.reset()


def _call(enc, coords, batch: int, grad: bool) -> torch.Tensor:
    n_q, n_k = coords.num_queries, coords.num_keys
    q = torch.randn(batch, HEADS, n_q, HEAD_DIM)
    k, v = torch.randn(batch, HEADS, n_k, HEAD_DIM), torch.randn(batch, HEADS, n_k, HEAD_DIM)
    ctx = AttentionCall(coords, HEADS, HEAD_DIM, batch, None, q, k, v)
    mods = flex_mods([enc], ctx)
    with torch.set_grad_enabled(grad):
        return flex_compile.flex(q, k, v, mods, compose_score_mods(mods),
                                 block_mask_of(coords, q.device), 0.3, backend="eager",
                                 kinds=(type(enc),))


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "kerple_log"])
def test_lengths_batch_sizes_and_grad_modes_compile_twice_per_family(name: str,
                                                                      monkeypatch) -> None:
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "1")  # dynamic shapes only
    enc = mmpe.build(name, context={"num_heads": HEADS, "head_dim": HEAD_DIM})
    shapes = [(2, 200), (2, 300), (3, 129), (16, 256), (5, 1000)]
    for grad in (True, False):  # training, then evaluation
        for batch, n in shapes:
            _call(enc, mmpe.Sequence(n, causal=True), batch, grad)
    assert flex_compile.compile_counts() == [2]
    # A batch of one and a sequence within one 128-token block specialise (size 1): at most
    # three more per grad mode, under the family's limit (flex_compile.RECOMPILE_LIMIT).
    for grad in (True, False):
        for batch, n in [(1, 200), (2, 64), (1, 1), (7, 100)]:
            _call(enc, mmpe.Sequence(n, causal=True), batch, grad)
    assert flex_compile.compile_counts()[0] <= 8 < flex_compile.RECOMPILE_LIMIT
    assert flex_compile.stats.unfused == 0 and flex_compile.stats.families == 1


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_a_recipe_run_compiles_two_static_and_two_dynamic_variants(name: str) -> None:
    """The default (`auto`): the first two shapes (here the training batch and the epoch's
    last, smaller one) get static kernels, the fast ones on a GPU; every evaluation length
    then shares one dynamic compile. Nothing else recompiles: not the BlockMask kept across
    forwards, not the lengths."""
    enc = mmpe.build(name, context={"num_heads": HEADS, "head_dim": HEAD_DIM})
    for _ in range(3):
        _call(enc, mmpe.Sequence(256, causal=True), 8, True)
    _call(enc, mmpe.Sequence(256, causal=True), 3, True)  # the epoch's last batch
    for n in (256, 512, 1024, 333, 2048):
        _call(enc, mmpe.Sequence(n, causal=True), 4, False)
    assert sorted(flex_compile.compile_counts()) == [1, 2]  # dynamic: 1 (no grad); static: 2
    assert flex_compile.stats.unfused == 0


def test_the_cached_block_mask_does_not_alias_the_callers_coordinates(monkeypatch) -> None:
    """A causal sequence's BlockMask is built once per size and kept. Were its mask_mod to hold
    the first caller's position ids, which that caller's score_mod also holds, torch would
    compile the first forward with the two aliased and recompile the next without."""
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "1")
    from mmpe.attention import flex as flex_module

    monkeypatch.setattr(flex_module, "_STATIC_MASKS", flex_module.OrderedDict())
    enc = mmpe.build("t5", context={"num_heads": HEADS, "head_dim": HEAD_DIM})
    for n in (200, 200, 300, 300):  # each size: a first forward, then one with the kept mask
        _call(enc, mmpe.Sequence(n, causal=True), 2, False)
    assert flex_compile.compile_counts() == [1]


def test_the_kept_block_mask_is_built_inside_a_forward_whose_memo_holds_graph_tensors(
        monkeypatch) -> None:
    """Inside a forward the coordinates' memo holds tensors of the autograd graph (the GPU
    path's per-offset tables); the copy of the coordinates the kept mask is built from must not
    copy them (a deepcopy raised on every learned term on a GPU, H200 run 5), and must give the
    coordinates' own mask."""
    from mmpe.attention import flex as flex_module
    from mmpe.prepare import forward_scope, memoized

    monkeypatch.setattr(flex_module, "_STATIC_MASKS", flex_module.OrderedDict())
    coords = mmpe.Sequence(200, causal=True)
    weight = torch.randn(3, requires_grad=True)
    with forward_scope(coords):
        memoized(coords, "table", lambda: weight * 2)  # not a leaf: cannot be deep-copied
        kept = block_mask_of(coords, torch.device("cpu"))
    direct = flex_module.flex_compile.block_mask(coords.mask_mod(), None, 200, 200,
                                                 torch.device("cpu"))
    assert torch.equal(kept.to_dense(), direct.to_dense())


def test_static_only_compiles_once_per_shape(monkeypatch) -> None:
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "0")
    enc = mmpe.build("alibi", context={"num_heads": HEADS})
    for n in (16, 24, 16, 40):
        _call(enc, mmpe.Sequence(n, causal=True), 2, False)
    assert flex_compile.compile_counts() == [3]


def test_a_full_static_copy_hands_later_shapes_to_the_dynamic_one(monkeypatch) -> None:
    """Shapes the static key does not see (a captured table's) can fill the static copy's
    recompile limit: the family then runs dynamic, fused, with nothing counted as unfused."""
    monkeypatch.setattr(flex_compile, "RECOMPILE_LIMIT", 1)
    monkeypatch.setenv("MMPE_FLEX_STRICT", "1")
    enc = mmpe.build("alibi", context={"num_heads": HEADS})
    _call(enc, mmpe.Sequence(16, causal=True), 2, False)
    _call(enc, mmpe.Sequence(24, causal=True), 2, False)  # static copy over its limit of 1
    _call(enc, mmpe.Sequence(32, causal=True), 2, False)
    assert sorted(flex_compile.compile_counts()) == [1, 1]
    assert flex_compile.stats.unfused == 0


def test_decoding_offsets_and_grid_shapes_do_not_recompile(monkeypatch) -> None:
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "1")
    enc = mmpe.build("alibi", context={"num_heads": HEADS})
    for offset in range(40, 60):
        _call(enc, mmpe.Sequence(1, offset=offset, causal=True), 2, False)
    for shape in [(2, 3), (4, 4), (3, 7), (6, 2)]:
        _call(enc, mmpe.Grid(shape), 2, False)
    # One family for the causal sequence (its mask_mod), one for the unmasked grid.
    assert flex_compile.compile_counts() == [1, 1]


def test_families_do_not_share_a_recompile_limit() -> None:
    """Ten encodings in one process: each family has its own copy, none falls back."""
    names = ["alibi", "t5", "fire", "kerple_log", "kerple_power", "shaw", "transformer_xl",
             "tener", "cope", "huang_3"]
    ctx = {"num_heads": HEADS, "head_dim": HEAD_DIM, "d_model": HEADS * HEAD_DIM, "max_len": 64}
    for name in names:
        enc = mmpe.build(name, context=ctx)
        for grad in (True, False):
            _call(enc, mmpe.Sequence(24, causal=True), 2, grad)
    assert flex_compile.stats.families == len(names)
    assert flex_compile.stats.unfused == 0


def _storm(enc, monkeypatch) -> None:
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "1")  # no static copy to hand over to
    monkeypatch.setattr(flex_compile, "RECOMPILE_LIMIT", 1)
    _call(enc, mmpe.Sequence(16, causal=True), 2, True)
    _call(enc, mmpe.Sequence(16, causal=True), 2, False)  # a second variant: over the limit


def test_recompile_limit_is_an_error_in_strict_mode(monkeypatch) -> None:
    monkeypatch.setenv("MMPE_FLEX_STRICT", "1")
    enc = mmpe.build("alibi", context={"num_heads": HEADS})
    with pytest.raises(RuntimeError, match="recompile limit.*unfused.*MMPE_FLEX_STRICT"):
        _storm(enc, monkeypatch)


def test_recompile_limit_is_counted_and_logged_once_otherwise(caplog, monkeypatch) -> None:
    enc = mmpe.build("alibi", context={"num_heads": HEADS})
    with caplog.at_level(logging.WARNING, logger="mmpe.flex"):
        _storm(enc, monkeypatch)
        with torch.no_grad():
            out = _call(enc, mmpe.Sequence(16, causal=True), 2, False)
    assert flex_compile.stats.unfused == 2
    assert len([r for r in caplog.records if "unfused" in r.getMessage()]) == 1
    assert torch.isfinite(out).all()


class _Raises:
    """A compiled function whose first ``fail`` calls raise Triton's shared-memory error."""

    def __init__(self, fail: int) -> None:
        self.fail, self.options = fail, []

    def __call__(self, q, k, v, *, score_mod, block_mask, scale, kernel_options):
        self.options.append(kernel_options)
        if len(self.options) <= self.fail:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: "
                               "triton_tem_fused_flex_attention Required: 245760 "
                               "Hardware limit: 232448")
        return q


def test_a_kernel_too_large_for_shared_memory_is_retried_with_smaller_tiles(monkeypatch) -> None:
    fake = _Raises(fail=1)
    monkeypatch.setattr(flex_compile, "compiled", lambda *a, **k: fake)
    q = torch.randn(1, 2, 8, 16)
    assert flex_compile.flex(q, q, q, [], None, None, 1.0) is q
    assert fake.options == list(flex_compile.KERNEL_OPTIONS[:2])
    assert flex_compile.stats.smaller_tiles == 1
    flex_compile.flex(q, q, q, [], None, None, 1.0)  # the family keeps the tiles that fit
    assert fake.options[-1] == flex_compile.KERNEL_OPTIONS[1]


def test_no_tile_size_that_fits_raises_naming_the_options(monkeypatch) -> None:
    monkeypatch.setattr(flex_compile, "compiled", lambda *a, **k: _Raises(fail=99))
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="KERNEL_OPTIONS"):
        flex_compile.flex(q, q, q, [], None, None, 1.0)


def test_other_compile_errors_are_not_swallowed(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("LoweringException: something else")

    monkeypatch.setattr(flex_compile, "compiled", lambda *a, **k: broken)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="something else"):
        flex_compile.flex(q, q, q, [], None, None, 1.0)


def _dense_scores(mods, q, k, coords) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1)
    b, h, qi, ki = index_grid(q.shape[0], HEADS, coords.num_queries, coords.num_keys, q.device)
    return compose_score_mods(mods)(scores, b, h, qi, ki)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["t5", "t5_bidirectional", "kerple_log", "kerple_power", "alibi"]),
       n_q=st.integers(1, 40), extra=st.integers(0, 30), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_per_offset_table_equals_the_in_kernel_terms(name, n_q, extra, causal, seed) -> None:
    """The table path (on a GPU: T5, KERPLE, learnable ALiBi) gives every pair the same score
    and every parameter the same gradient as the encoding's own ``score_mod``."""
    torch.manual_seed(seed)
    kwargs = {"learnable_slopes": True} if name == "alibi" else {}
    if name == "t5_bidirectional":
        name, causal = "t5", False
    enc = mmpe.build(name, context={"num_heads": HEADS, "head_dim": HEAD_DIM}, **kwargs)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    n_k = n_q + extra
    coords = mmpe.Sequence(n_q, offset=extra, causal=causal)
    q = torch.randn(2, HEADS, n_q, HEAD_DIM, requires_grad=True)
    k = torch.randn(2, HEADS, n_k, HEAD_DIM, requires_grad=True)
    ctx = AttentionCall(coords, HEADS, HEAD_DIM, 2, None, q, k, k)
    weight = torch.randn(2, HEADS, n_q, n_k)
    results = []
    for tables in (True, False):
        mods = flex_mods([enc], ctx, tables=tables)
        assert (mods[0].__name__ == "relation_table") == tables
        scores = _dense_scores(mods, q, k, coords)
        grads = torch.autograd.grad((scores * weight).sum(), [q, k, *enc.parameters()])
        results.append((scores, grads))
    (s1, g1), (s2, g2) = results
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()) + 1e-6)


def test_a_control_term_fails_the_table_comparison() -> None:
    """The comparison above can fail: the table read at the mirrored offset differs."""
    enc = mmpe.build("t5", context={"num_heads": HEADS})
    with torch.no_grad():
        enc.table.add_(torch.randn_like(enc.table))
    coords = mmpe.Sequence(12, causal=True)
    q, k = torch.randn(1, HEADS, 12, HEAD_DIM), torch.randn(1, HEADS, 12, HEAD_DIM)
    ctx = AttentionCall(coords, HEADS, HEAD_DIM, 1, None, q, k, k)
    table_mod = flex_mods([enc], ctx, tables=True)[0]
    wrong = [lambda s, b, h, qi, ki: table_mod(s, b, h, ki, qi)]
    assert not torch.allclose(_dense_scores(wrong, q, k, coords),
                              _dense_scores([enc.score_mod(ctx)], q, k, coords))


GRID_LEARNED = ["t5", "kerple_log", "swin", "swinv2_cpb", "fire", "alibi", "gaussian_distance",
                "radial_gaussian", "radial_bessel"]


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(GRID_LEARNED), shape=st.sampled_from([(3, 4), (2, 3, 2), (4, 1)]),
       prefix=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_grid_offset_table_equals_the_in_kernel_terms(name, shape, prefix, seed) -> None:
    """On a Grid (the GPU's table path), the block-Toeplitz offset table gives every pair the
    score and every parameter the gradient of the encoding's own ``score_mod``."""
    torch.manual_seed(seed)
    grid = mmpe.Grid(shape, prefix_tokens=prefix)
    kwargs = {"learnable_slopes": True} if name == "alibi" else {}
    enc = mmpe.build(name, coords=grid, context={"num_heads": HEADS, "head_dim": HEAD_DIM}, **kwargs)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    # float64: a parameter's gradient sums hundreds of pairs' terms that cancel to 1e-2 of
    # their size, which float32 rounding alone moves by 1e-3 relative (hypothesis found one).
    enc = enc.double()
    n = grid.num_queries
    q = torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    ctx = AttentionCall(grid, HEADS, HEAD_DIM, 2, None, q, k, k)
    weight = torch.randn(2, HEADS, n, n, dtype=torch.float64)
    results = []
    for tables in (True, False):
        mods = flex_mods([enc], ctx, tables=tables)
        assert (mods[0].__name__ == "grid_offset_table") == tables
        scores = _dense_scores(mods, q, k, grid)
        learned = [p for p in enc.parameters() if p.requires_grad]
        grads = torch.autograd.grad((scores * weight).sum(), [q, k, *learned])
        results.append((scores, grads))
    (s1, g1), (s2, g2) = results
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()) + 1e-6)


def test_a_transposed_grid_read_fails_the_table_comparison() -> None:
    """Control: the table read with query and key swapped (the mirrored offset) differs."""
    grid = mmpe.Grid((3, 4), prefix_tokens=1)
    enc = mmpe.build("swin", coords=grid, context={"num_heads": HEADS})
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p))
    q, k = torch.randn(1, HEADS, 13, HEAD_DIM), torch.randn(1, HEADS, 13, HEAD_DIM)
    ctx = AttentionCall(grid, HEADS, HEAD_DIM, 1, None, q, k, k)
    table_mod = flex_mods([enc], ctx, tables=True)[0]
    wrong = [lambda s, b, h, qi, ki: table_mod(s, b, h, ki, qi)]
    assert not torch.allclose(_dense_scores(wrong, q, k, grid),
                              _dense_scores([enc.score_mod(ctx)], q, k, grid))


def test_grid_offset_table_compiles_once_for_two_grid_shapes() -> None:
    """The grid's sizes are captured tensors: a second shape of the same kind is no new graph."""
    counts = []
    for shape in ((3, 4), (5, 2)):
        grid = mmpe.Grid(shape)
        enc = mmpe.build("t5", coords=grid, context={"num_heads": HEADS})
        q = torch.randn(1, HEADS, grid.num_queries, HEAD_DIM)
        ctx = AttentionCall(grid, HEADS, HEAD_DIM, 1, None, q, q, q)
        mod = flex_mods([enc], ctx, tables=True)[0]
        assert mod.__name__ == "grid_offset_table"
        counts.append(mod)
    assert counts[0].__code__ is counts[1].__code__


@pytest.mark.slow
def test_grid_offset_table_compiles_and_equals_flex_on_the_cpu() -> None:
    """The compiled kernel (CPU forward; the GPU runs the same graph) with the grid table
    equals eager FlexAttention with the encoding's own score_mod."""
    from torch.nn.attention.flex_attention import flex_attention

    if not flex_compile.available():
        pytest.skip("FlexAttention needs torch >= 2.6")
    grid = mmpe.Grid((6, 8), prefix_tokens=1)
    enc = mmpe.build("swin", coords=grid, context={"num_heads": HEADS})
    q, k, v = (torch.randn(1, HEADS, grid.num_queries, HEAD_DIM) for _ in range(3))
    ctx = AttentionCall(grid, HEADS, HEAD_DIM, 1, None, q, k, v)
    with torch.no_grad():
        table = compose_score_mods(flex_mods([enc], ctx, tables=True))
        compiled = torch.compile(flex_attention, dynamic=True, fullgraph=True)
        torch.testing.assert_close(compiled(q, k, v, score_mod=table),
                                   flex_attention(q, k, v, score_mod=enc.score_mod(ctx)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("value", "mode"), [(None, "auto"), ("auto", "auto"), ("1", "dynamic"),
                                             ("0", "static"), ("false", "static")])
def test_compile_mode_follows_the_environment(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("MMPE_FLEX_DYNAMIC", raising=False)
    else:
        monkeypatch.setenv("MMPE_FLEX_DYNAMIC", value)
    assert flex_compile._mode_from_env() == mode


def test_an_unknown_compile_mode_is_an_error(monkeypatch):
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "sometimes")
    with pytest.raises(ValueError, match="MMPE_FLEX_DYNAMIC='sometimes'"):
        flex_compile._mode_from_env()


def test_compile_config_sets_its_values_inside_and_restores_them_after_an_error() -> None:
    dynamo, limit, duck = flex_compile._config_modules()
    before = (dynamo.specialize_float, getattr(dynamo, limit), duck.use_duck_shape)
    with pytest.raises(KeyError), flex_compile.compile_config():
        assert dynamo.specialize_float is True and duck.use_duck_shape is False
        assert getattr(dynamo, limit) == flex_compile.RECOMPILE_LIMIT
        raise KeyError("inside")
    assert (dynamo.specialize_float, getattr(dynamo, limit), duck.use_duck_shape) == before
    assert before != (True, flex_compile.RECOMPILE_LIMIT, False)  # the control: it changed them
