"""The speed-ups of the rotary and grid encodings never change their numbers.

* Cached tables are never stale: after every change of what a table depends on (grid shape,
  scale, prefix tokens, dtype, length, settings mutated on the module, parameters updated in
  place, a returned table edited in place) the output equals a freshly built module's.
* The rotation's paths (complex multiply, written in place without autograd, out-of-place
  under autograd) agree, and gradients are right.
* Caches are bypassed under ``torch.compile(fullgraph=True)`` even when warm.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import mmpe
from mmpe import Grid, Sequence
from mmpe.attention import dense_bias
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.rope import (
    RoPE,
    _rotate_complex,
    _rotate_functional,
    _rotate_into,
    apply_rotary,
    rope_cos_sin,
    rope_inv_freq,
)


def _qk(n: int, d: int = 16, h: int = 2, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, h, n, d, generator=g).to(dtype),
            torch.randn(2, h, n, d, generator=g).to(dtype))


def _same_rotation(enc, fresh, coords, n: int, dtype=torch.float32, d: int = 16) -> None:
    q, k = _qk(n, d, dtype=dtype)
    with torch.no_grad():
        got, want = enc(q, k, coords), fresh(q, k, coords)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------- 1D RoPE
def test_rope_table_follows_length_dtype_and_positions() -> None:
    rope = RoPE(16)
    calls = [(Sequence(8), torch.float32), (Sequence(300), torch.float32),  # table grows
             (Sequence(8), torch.bfloat16), (Sequence(8), torch.float16),
             (Sequence(3, offset=400), torch.float32),  # cached step: q and k differ
             (Sequence(position_ids=torch.tensor([[5, 1, 0], [2, 2, 9]])), torch.float32),
             (Sequence(8), torch.float64)]
    for coords, dtype in calls:
        _same_rotation(rope, RoPE(16), coords, coords.num_queries, dtype)
        q, k = _qk(coords.num_queries, dtype=dtype)
        assert rope(q, k[:, :, -coords.num_queries:], coords)[0].dtype == dtype


@pytest.mark.parametrize(("name", "setting", "value"), [
    ("rope", "base", 500.0),
    ("rope_pi", "factor", 2.0),
    ("rope_yarn", "beta_slow", 0.5),        # not in the old table key: was served stale
    ("rope_yarn", "attention_scaling", 1.7),
    ("rope_llama3", "low_freq_factor", 2.0),
    ("rope_llama3", "original_max_position_embeddings", 64),
    ("rope_dynamic_ntk", "factor", 8.0),
    ("rope_ntk", "factor", 16.0),
])
def test_rope_table_follows_settings_mutated_after_a_call(name, setting, value) -> None:
    ctx = {"head_dim": 16, "original_max_position_embeddings": 32}
    enc = mmpe.build(name, context=ctx)
    coords = Sequence(80)
    q, k = _qk(80)
    before = enc(q, k, coords)[0]
    setattr(enc, setting, value)
    fresh = mmpe.build(name, context=ctx)
    setattr(fresh, setting, value)
    after = enc(q, k, coords)[0]
    assert torch.equal(after, fresh(q, k, coords)[0])
    assert not torch.equal(after, before)


def test_rope_longrope_factors_edited_in_place() -> None:
    ctx = {"head_dim": 16, "original_max_position_embeddings": 32}
    enc = mmpe.build("rope_longrope", context=ctx)
    q, k = _qk(80)
    before = enc(q, k, Sequence(80))[0]
    with torch.no_grad():
        enc.long_factor.mul_(3.0)
    fresh = mmpe.build("rope_longrope", context=ctx)
    with torch.no_grad():
        fresh.long_factor.mul_(3.0)
    after = enc(q, k, Sequence(80))[0]
    assert torch.equal(after, fresh(q, k, Sequence(80))[0]) and not torch.equal(after, before)


def test_rope_dynamic_ntk_table_follows_the_length() -> None:
    ctx = {"head_dim": 16, "original_max_position_embeddings": 16}
    enc = mmpe.build("rope_dynamic_ntk", context=ctx)
    for n in (8, 40, 20, 100, 8):
        _same_rotation(enc, mmpe.build("rope_dynamic_ntk", context=ctx), Sequence(n), n)


def test_rope_loaded_state_and_copies_match_fresh_modules() -> None:
    rope = RoPE(16, base=100.0)
    rope(*_qk(64), Sequence(64))  # warm the cache
    clone = copy.deepcopy(rope)
    fresh = RoPE(16, base=100.0)
    fresh.load_state_dict(rope.state_dict())
    for enc in (clone, fresh):
        _same_rotation(enc, RoPE(16, base=100.0), Sequence(64), 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_rope_table_follows_the_device() -> None:
    rope = RoPE(16)
    q, k = _qk(32)
    cpu = rope(q, k, Sequence(32))[0]
    gpu = rope(q.cuda(), k.cuda(), Sequence(32, device="cuda"))[0]
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu)
    assert torch.equal(rope(q, k, Sequence(32))[0], cpu)


# ----------------------------------------------------------------------------- grid rotary
GRIDS = [Grid((4, 5), prefix_tokens=1), Grid((5, 4), prefix_tokens=1), Grid((4, 5)),
         Grid((4, 5), prefix_tokens=2, scale=(0.5, 2.0)), Grid((2, 3, 4)), Grid((4, 5))]


@pytest.mark.parametrize("interleaved", [False, True])
def test_axial_rope_table_follows_grid_dtype_and_settings(interleaved: bool) -> None:
    enc = mmpe.build("rope_axial", head_dim=24, interleaved=interleaved)
    for grid in GRIDS:
        for dtype in (torch.float32, torch.bfloat16):
            fresh = mmpe.build("rope_axial", head_dim=24, interleaved=interleaved)
            _same_rotation(enc, fresh, grid, grid.num_tokens, dtype, d=24)
    enc.base = 100.0
    fresh = mmpe.build("rope_axial", head_dim=24, base=100.0, interleaved=interleaved)
    _same_rotation(enc, fresh, GRIDS[0], GRIDS[0].num_tokens, d=24)


def test_axial_rope_table_edited_in_place_is_rebuilt() -> None:
    enc = mmpe.build("rope_axial", head_dim=24)
    grid = GRIDS[0]
    cos, sin = enc.cos_sin(grid)
    assert enc.cos_sin(grid)[0] is cos  # served from the cache
    cos.zero_()
    _same_rotation(enc, mmpe.build("rope_axial", head_dim=24), grid, grid.num_tokens, d=24)


def test_mixed_rope_follows_its_learned_frequencies() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("rope_mixed", head_dim=16, num_heads=2)
    grid = GRIDS[0]
    q, k = _qk(grid.num_tokens)
    before = enc(q, k, grid)[0]
    with torch.no_grad():
        enc.freqs.mul_(2.0)
    fresh = copy.deepcopy(enc)
    after = enc(q, k, grid)[0]
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh(q, k, grid)[0])


# ----------------------------------------------------------------------------------- sincos
def test_sincos_table_follows_grid_and_settings() -> None:
    enc = mmpe.build("sincos", d_model=24)
    for grid in GRIDS:
        assert torch.equal(enc(grid), mmpe.build("sincos", d_model=24)(grid))
    for setting, value in (("temperature", 100.0), ("layout", "timm"), ("layout", "detr"),
                           ("normalize", True)):
        setattr(enc, setting, value)
        fresh = mmpe.build("sincos", d_model=24)
        for name in ("temperature", "layout", "normalize"):
            setattr(fresh, name, getattr(enc, name))
        assert torch.equal(enc(GRIDS[3]), fresh.table(GRIDS[3]))


def test_sincos_table_edited_in_place_is_rebuilt() -> None:
    enc = mmpe.build("sincos", d_model=24)
    grid = GRIDS[0]
    first = enc(grid)
    assert enc(grid) is first  # served from the cache
    first.mul_(0)
    assert torch.equal(enc(grid), mmpe.build("sincos", d_model=24)(grid))


def test_sincos_separable_build_equals_the_token_build() -> None:
    from mmpe.encodings._grid import zero_prefix
    from mmpe.encodings.sincos import sincos_grid_embed

    for layout in ("mae", "timm", "detr"):
        for normalize in (False, True):
            enc = mmpe.build("sincos", d_model=36, layout=layout, normalize=normalize)
            grid = Grid((3, 4, 2), prefix_tokens=1, scale=(0.5, 1.5, 3.0))
            ref = zero_prefix(sincos_grid_embed(enc.positions(grid), 36, enc.temperature, layout),
                              grid.prefix_tokens)
            assert torch.equal(enc(grid), ref)


# ------------------------------------------------------------------------------ swin biases
def _dense_mod(enc, grid, h: int) -> torch.Tensor:
    """The score_mod evaluated on index grids: the reference for the eager bias."""
    from mmpe.coords.base import index_grid

    ctx = AttentionCall(grid, h, 8, 1)
    b, hh, q, k = index_grid(1, h, grid.num_tokens, grid.num_tokens)
    with torch.no_grad():
        return enc.score_mod(ctx)(torch.zeros(()), b, hh, q, k)


@pytest.mark.parametrize("name", ["swin", "swinv2_cpb"])
def test_relative_bias_follows_grid_and_parameters(name: str) -> None:
    torch.manual_seed(0)
    enc = mmpe.build(name, num_heads=3, grid_shape=(4, 5))
    for grid in [*GRIDS[:4], Grid((6, 3), prefix_tokens=1), GRIDS[0]]:
        with torch.no_grad():
            bias = dense_bias([enc], AttentionCall(grid, 3, 8, 1))
        assert bias.shape == (1, 3, grid.num_tokens, grid.num_tokens) and bias.is_contiguous()
        torch.testing.assert_close(bias, _dense_mod(enc, grid, 3), rtol=0, atol=1e-6)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.5)
    grid = GRIDS[0]
    with torch.no_grad():
        torch.testing.assert_close(dense_bias([enc], AttentionCall(grid, 3, 8, 1)),
                                   _dense_mod(enc, grid, 3), rtol=0, atol=1e-6)


def test_swin_bias_gradient_reaches_the_table() -> None:
    enc = mmpe.build("swin", num_heads=2, grid_shape=(3, 3))
    grid = Grid((3, 3), prefix_tokens=1)
    bias = dense_bias([enc], AttentionCall(grid, 2, 8, 1))
    weight = torch.randn_like(bias)
    (bias * weight).sum().backward()
    from mmpe.encodings.swin import relative_position_index

    index = relative_position_index((3, 3), 1)
    expected = torch.zeros_like(enc.table).index_put_(
        (index.reshape(-1),), weight[0].permute(1, 2, 0).reshape(-1, 2), accumulate=True)
    torch.testing.assert_close(enc.table.grad, expected)


# ------------------------------------------------------------------------ rotation paths
@pytest.mark.parametrize("rotary", [16, 10])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotation_paths_agree(dtype, interleaved: bool, rotary: int) -> None:
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64).to(dtype)
    cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(rotary), dtype=dtype)
    half = rotary // 2
    ref = _rotate_functional(x, cos, sin, half, interleaved, dtype)
    outs = [_rotate_into(x, cos, sin, half, interleaved), apply_rotary(x, cos, sin, interleaved)]
    if interleaved and dtype != torch.bfloat16:
        outs.append(_rotate_complex(x, cos, sin, half))
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
    for out in outs:
        assert out.dtype == dtype and out.shape == x.shape
        torch.testing.assert_close(out, ref, rtol=0, atol=tol)
        assert torch.equal(out[..., rotary:], x[..., rotary:])


def test_rotation_of_strided_and_bshd_inputs() -> None:
    """Odd strides (no complex view) and the bshd layout give the bhsd result."""
    base = torch.randn(2, 7, 3, 17)[..., 1:]  # odd storage offset and strides
    x = base.transpose(1, 2)  # [b, h, s, d] view of a bshd tensor
    cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(16))
    for interleaved in (False, True):
        ref = _rotate_functional(x.contiguous(), cos, sin, 8, interleaved, torch.float32)
        torch.testing.assert_close(apply_rotary(x, cos, sin, interleaved), ref)
        out = apply_rotary(base, cos, sin, interleaved, layout="bshd").transpose(1, 2)
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_gradients(interleaved: bool) -> None:
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    phase = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)

    def f(x, phase):
        return apply_rotary(x, phase.cos(), phase.sin(), interleaved)

    assert torch.autograd.gradcheck(f, (x, phase))


def test_rope_training_step_equals_inference() -> None:
    """The autograd path and the no-grad path give the same rotation."""
    rope = RoPE(16)
    q, k = _qk(32)
    with torch.no_grad():
        ref = rope(q, k, Sequence(32))
    out = rope(q.requires_grad_(), k.requires_grad_(), Sequence(32))
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-6)
    sum(o.sum() for o in out).backward()
    assert q.grad is not None and k.grad is not None


# ------------------------------------------------------------------------------- compile
@pytest.mark.skipif(not mmpe.flex_compile.available(),
                    reason="torch.compile of mmpe models needs torch >= 2.6")
@pytest.mark.parametrize(("name", "coords"), [
    ("rope", Sequence(8, causal=True)), ("rope_axial", Grid((2, 3), prefix_tokens=1)),
    ("rope_mixed", Grid((2, 3), prefix_tokens=1)), ("sincos", Grid((2, 3), prefix_tokens=1)),
    ("swin", Grid((2, 3), prefix_tokens=1)), ("swinv2_cpb", Grid((2, 3), prefix_tokens=1)),
])
def test_warm_caches_compile_fullgraph(name: str, coords) -> None:
    ctx = {"num_axes": coords.num_axes, "max_len": 64}
    if isinstance(coords, Grid):
        ctx.update(grid_shape=coords.shape, prefix_tokens=coords.prefix_tokens)
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 4, 2, [name], context=ctx, route="sdpa")
    x = torch.randn(2, coords.num_queries, 32)
    with torch.no_grad():
        ref = model(x, coords)  # warms every cache eagerly
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        for _ in range(2):
            torch.testing.assert_close(compiled(x, coords), ref, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
