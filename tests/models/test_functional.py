"""mmpe.functional: the pure functions, and FlexAttention mods equal to the attention module's.

FlexAttention runs uncompiled on the CPU here (forward only), which is enough to check that
``flex_attention(q, k, v, score_mod=F.score_mod(...), block_mask=F.block_mask(coords))`` gives
the numbers of :class:`mmpe.MultiHeadAttention`'s explicit math route.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from mmpe.flex_compile import available

#: torch 2.5's FlexAttention calls a score_mod on the padding of lengths that are not multiples
#: of 128 and differentiates no learned captured tensor (mmpe.flex_compile.MIN_TORCH).
needs_flex = pytest.mark.skipif(not available(), reason="FlexAttention with mmpe needs torch >= 2.6")

import mmpe
from mmpe import functional as F
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.encodings.base import AttentionCall

H, D = 4, 8  # n_h, h_d
PROPERTY = settings(max_examples=25, deadline=None)


def _coords(kind: str):
    if kind == "causal_sequence":
        return mmpe.Sequence(10, causal=True)
    if kind == "grid_prefix":
        return mmpe.Grid((3, 4), prefix_tokens=1)
    if kind == "packed_documents":  # batched positions: a BlockMask with B = 2
        docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 1, 1, 1]])
        return mmpe.Sequence(document_ids=docs, causal=True)
    raise AssertionError(kind)


def _qkv(coords, batch: int = 2, x_dim: int | None = None):
    n = coords.num_queries
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, batch, H, n, D, generator=g).unbind(0)
    x = torch.randn(batch, n, x_dim, generator=g) if x_dim else None
    return q, k, v, x


def _randomize(enc: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial parameters (T5's table starts at zero)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in enc.parameters():
            if p.requires_grad:
                p.copy_(p.abs() + 0.5 * torch.rand(p.shape, generator=g))
    return enc


def _math(encs, coords, q, k, v, x=None) -> torch.Tensor:
    """MultiHeadAttention's explicit math route on the same q, k, v."""
    attn = MultiHeadAttention(H * D, H, list(encs), route="math")
    return attn.attend(AttentionCall(coords, H, D, q.shape[0], x, q, k, v))


# -- exports -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", F.__all__)
def test_every_export_is_importable_callable_and_documented(name):
    obj = getattr(F, name)
    assert callable(obj)
    assert obj.__doc__, f"{name} has no docstring"
    # listed as a mkdocstrings cross-reference: [`name`][module.name]
    assert f"[`{name}`][" in F.__doc__, f"{name} is not listed in the module docstring"


def test_all_has_no_duplicates():
    assert len(F.__all__) == len(set(F.__all__))


# -- FlexAttention: score_mod / block_mask equal the math route ----------------------------
@pytest.mark.parametrize("kind", ["causal_sequence", "grid_prefix", "packed_documents"])
@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "kerple_log"])
@needs_flex
def test_flex_with_functional_mods_equals_math_path(name, kind):
    coords = _coords(kind)
    options = {"mlp_width": 8} if name == "fire" else {}  # FIRE's MLP is unrolled per unit
    enc = _randomize(mmpe.build(name, context={"num_heads": H}, **options))
    q, k, v, _ = _qkv(coords)
    with torch.no_grad():
        mod = F.score_mod(enc, coords, num_heads=H)
        out = flex_attention(q, k, v, score_mod=mod, block_mask=F.block_mask(coords))
        ref = _math([enc], coords, q, k, v)
        # and the formula itself: softmax(q kᵀ/√h_d + bias, masked) v
        ctx = AttentionCall(coords, H, D, q.shape[0], None, q, k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D) + dense_bias([enc], ctx)
        mask = coords.dense_mask()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        direct = scores.softmax(-1) @ v
    assert mod.encodings == (enc,) and mod.softmax_scale is None
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, direct, atol=1e-5, rtol=1e-5)


@needs_flex
def test_a_list_composes_like_the_attention_module():
    coords = _coords("causal_sequence")
    encs = [_randomize(mmpe.build(n, context={"num_heads": H})) for n in ("alibi", "t5", "fire")]
    q, k, v, _ = _qkv(coords)
    with torch.no_grad():
        mod = F.score_mod(encs, coords, num_heads=H)
        out = flex_attention(q, k, v, score_mod=mod, block_mask=F.block_mask(coords))
        ref = _math(encs, coords, q, k, v)
    assert mod.encodings == tuple(encs)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@needs_flex
def test_names_and_configs_are_built_with_the_heads():
    coords = _coords("causal_sequence")
    q, k, v, _ = _qkv(coords)
    mod = F.score_mod(["alibi", {"name": "t5", "num_buckets": 16, "max_distance": 64}],
                      coords, num_heads=H, head_dim=D)
    alibi, t5 = mod.encodings
    assert isinstance(alibi, mmpe.get("alibi").cls) and alibi.num_heads == H
    assert isinstance(t5, mmpe.get("t5").cls) and t5.num_buckets == 16 and t5.num_heads == H
    with torch.no_grad():
        out = flex_attention(q, k, v, score_mod=mod, block_mask=F.block_mask(coords))
        torch.testing.assert_close(out, _math([alibi, t5], coords, q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["shaw", "deberta", "fox", "huang_1", "da_transformer"])
@needs_flex
def test_content_dependent_and_rescaling_mods_equal_math_path(name):
    coords = _coords("causal_sequence")
    q, k, v, x = _qkv(coords, x_dim=16)
    with torch.no_grad():
        mod = F.score_mod(name, coords, num_heads=H, q=q, k=k, v=v, x=x)
        (enc,) = mod.encodings
        _randomize(enc)
        mod = F.score_mod(enc, coords, num_heads=H, q=q, k=k, v=v, x=x)
        out = flex_attention(q, k, v, score_mod=mod, block_mask=F.block_mask(coords),
                             scale=mod.softmax_scale)
        ref = _math([enc], coords, q, k, v, x)
    if name == "deberta":
        assert mod.softmax_scale == pytest.approx(1 / math.sqrt(3 * D))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# -- FlexAttention: masks ------------------------------------------------------------------
@needs_flex
def test_mask_mod_and_block_mask():
    grid = _coords("grid_prefix")
    assert F.mask_mod(grid) is None and F.block_mask(grid) is None
    seq = _coords("causal_sequence")
    b, h, qi, ki = (torch.arange(n).view(s) for n, s in
                    ((1, (1, 1, 1, 1)), (1, (1, 1, 1, 1)), (10, (1, 1, 10, 1)), (10, (1, 1, 1, 10))))
    dense = F.mask_mod(seq)(b, h, qi, ki).expand(1, 1, 10, 10)
    assert torch.equal(dense[0, 0], torch.ones(10, 10, dtype=torch.bool).tril())
    bm = F.block_mask(seq)
    assert isinstance(bm, BlockMask) and bm.shape == (1, 1, 10, 10)
    packed = F.block_mask(_coords("packed_documents"), device="cpu")
    assert packed.shape[0] == 2


# -- argument checks -------------------------------------------------------------------------
def test_errors_name_what_is_wrong():
    seq = _coords("causal_sequence")
    q, k, v, x = _qkv(seq, x_dim=16)
    alibi = mmpe.build("alibi", num_heads=H)
    cases = [
        (lambda: F.score_mod("shaw", seq, num_heads=H), ValueError, "needs q and k"),
        (lambda: F.score_mod(mmpe.build("shaw", head_dim=D), seq, num_heads=H, q=q),
         ValueError, "needs k"),
        (lambda: F.score_mod("fox", seq, num_heads=H, q=q, k=k), ValueError, "x=.b, n_k, d_model"),
        (lambda: F.score_mod(mmpe.build("fox", d_model=16, num_heads=H), seq, num_heads=H,
                             q=q, k=k), ValueError, "needs x"),
        (lambda: F.score_mod({"name": "shaw", "values": True}, seq, num_heads=H, q=q, k=k),
         ValueError, "value-side"),
        (lambda: F.score_mod("rope", seq, num_heads=H), TypeError, "rotary encoding"),
        (lambda: F.score_mod(mmpe.build("stick_breaking"), seq, num_heads=H), TypeError,
         "kernel encoding"),
        (lambda: F.score_mod(3, seq, num_heads=H), TypeError, "encoding must be"),
        (lambda: F.score_mod([], seq, num_heads=H), ValueError, "empty list"),
        (lambda: F.score_mod(alibi, "seq", num_heads=H), TypeError, "coords"),
        (lambda: F.score_mod(alibi, seq, num_heads=0), ValueError, "num_heads"),
        (lambda: F.score_mod(alibi, seq, num_heads=4.0), TypeError, "num_heads"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, head_dim=0), ValueError, "head_dim"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, head_dim=D + 1, q=q), ValueError, "head_dim"),
        (lambda: F.score_mod(alibi, seq, num_heads=2), ValueError, "num_heads"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, q=q[:, :, :5]), ValueError, "5 tokens"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, k=k[:, :2]), ValueError, "heads"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, q=q[0]), ValueError, "rank 4"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, q=q, k=k[:1]), ValueError, "batch"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, q=q.numpy()), TypeError, "q must be"),
        (lambda: F.score_mod(alibi, seq, num_heads=H, x=x[:, :3]), ValueError, "x"),
        (lambda: F.mask_mod(None), TypeError, "coords"),
        (lambda: F.block_mask([1, 2]), TypeError, "coords"),
        (lambda: F.score_mod("graphormer_spatial", seq, num_heads=H), TypeError, "GraphLayout"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


# -- closed forms ---------------------------------------------------------------------------
def test_alibi_slopes_for_eight_heads():
    assert torch.equal(F.alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))


@PROPERTY
@given(log2_heads=st.integers(0, 7), extra=st.integers(0, 127))
def test_alibi_slopes_geometric_and_extended(log2_heads, extra):
    n = 2 ** log2_heads
    expected = torch.tensor([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)])
    torch.testing.assert_close(F.alibi_slopes(n), expected)
    # n + extra heads (below 2n): the n slopes first, then every other slope of 2n heads
    m = n + extra % n if n > 1 else n
    slopes = F.alibi_slopes(m)
    torch.testing.assert_close(slopes[:n], expected)
    torch.testing.assert_close(slopes[n:], F.alibi_slopes(2 * n)[0::2][: m - n])


@PROPERTY
@given(half=st.integers(2, 32), extra=st.integers(1, 400), bidirectional=st.booleans(),
       span=st.integers(1, 2000))
def test_t5_bucket_equals_hf(half, extra, bidirectional, span):
    T5Attention = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention
    num_buckets = 2 * half
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = exact + extra
    rel = torch.arange(-span, span + 1)
    ours = F.t5_bucket(rel, bidirectional, num_buckets, max_distance)
    hf = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, hf)
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


@PROPERTY
@given(log2_buckets=st.integers(3, 9), more=st.integers(0, 3), span=st.integers(1, 20000))
def test_deberta_log_buckets_equal_hf(log2_buckets, more, span):
    """HF's numbers on DeBERTa-v2/v3-style configs (power-of-two buckets and range; v3: 256, 512)."""
    hf = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    bucket_size, max_position = 2 ** log2_buckets, 2 ** (log2_buckets + more)
    rel = torch.arange(-span, span + 1)
    ours = F.log_bucket_position(rel, bucket_size, max_position)
    theirs = hf.make_log_bucket_position(rel, bucket_size, max_position).long()
    assert torch.equal(ours, theirs)


def test_deberta_log_buckets_equal_hf_at_exact_ceil_boundaries():
    hf = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    rel = torch.arange(-12, 13)  # bucket_size 4, max_position 4: log(3/2)/log(3/2) = 1 exactly
    assert torch.equal(F.log_bucket_position(rel, 4, 4), hf.make_log_bucket_position(rel, 4, 4).long())


@PROPERTY
@given(m=st.integers(0, 4096), n=st.integers(0, 4096), shift=st.integers(0, 4096),
       half=st.integers(1, 32), interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_the_offset(m, n, shift, half, interleaved, seed):
    """RoFormer eq. 16: ⟨R_m q, R_n k⟩ = ⟨q, R_{n−m} k⟩, so shifting both positions changes nothing."""
    head_dim = 2 * half
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, 1, head_dim, generator=g, dtype=torch.float64).unbind(0)
    inv_freq = F.rope_inv_freq(head_dim)

    def score(pm: int, pn: int) -> torch.Tensor:
        cos_m, sin_m = F.rope_cos_sin(torch.tensor([pm]), inv_freq)
        cos_n, sin_n = F.rope_cos_sin(torch.tensor([pn]), inv_freq)
        rq = F.apply_rotary(q, cos_m.double(), sin_m.double(), interleaved)
        rk = F.apply_rotary(k, cos_n.double(), sin_n.double(), interleaved)
        return (rq * rk).sum()

    # cos/sin are float32: ~1e-7 relative per channel
    tol = 1e-5 * float(q.norm() * k.norm())
    assert abs(float(score(m, n) - score(m + shift, n + shift))) <= tol
    assert abs(float(score(m, m) - (q * k).sum())) <= tol


def test_rope_tables_closed_form():
    inv_freq = F.rope_inv_freq(8, base=10000.0)
    torch.testing.assert_close(inv_freq, 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    cos, sin = F.rope_cos_sin(torch.arange(5), inv_freq)
    phase = torch.arange(5, dtype=torch.float64)[:, None] * inv_freq
    torch.testing.assert_close(cos, phase.cos().float())
    torch.testing.assert_close(sin, phase.sin().float())
    # half-split rotation of x = (1, 0 | 0, 0) by angle a: (cos a, 0 | sin a, 0)
    x = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4)
    c, s = F.rope_cos_sin(torch.tensor([3]), F.rope_inv_freq(4))
    torch.testing.assert_close(F.apply_rotary(x, c, s).flatten(),
                               torch.stack([c[0, 0], torch.tensor(0.0), s[0, 0], torch.tensor(0.0)]))
    assert F.yarn_get_mscale(1.0) == 1.0
    assert F.yarn_get_mscale(math.e, 2.0) == pytest.approx(1.2)


def test_sinusoidal_table_closed_form():
    pos = torch.arange(7)
    table = F.sinusoidal_table(pos, 6)
    i = torch.arange(3, dtype=torch.float64)
    phase = pos[:, None].double() / 10000.0 ** (2 * i / 6)
    torch.testing.assert_close(table[:, 0::2], phase.sin().float())
    torch.testing.assert_close(table[:, 1::2], phase.cos().float())


def _mae_2d_sincos(d: int, h: int, w: int) -> np.ndarray:
    """MAE's util/pos_embed.py get_2d_sincos_pos_embed, for an h×w grid."""
    def one_d(dim: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return np.concatenate([one_d(d // 2, grid[0]), one_d(d // 2, grid[1])], axis=1)


@PROPERTY
@given(h=st.integers(1, 6), w=st.integers(1, 6), quarter=st.integers(1, 8))
def test_sincos_grid_equals_mae(h, w, quarter):
    d = 4 * quarter
    ours = F.sincos_grid((h, w), d)
    torch.testing.assert_close(ours, torch.from_numpy(_mae_2d_sincos(d, h, w)).float())
    grid = mmpe.Grid((h, w))
    torch.testing.assert_close(ours, F.sincos_grid_embed(grid.query_positions, d))


def test_sincos_grid_3d_and_errors():
    table = F.sincos_grid((2, 3, 4), 12)
    assert table.shape == (24, 12)
    torch.testing.assert_close(table, F.sincos_grid_embed(mmpe.Grid((2, 3, 4)).query_positions, 12))
    with pytest.raises(ValueError, match="d_model"):
        F.sincos_grid((2, 3), 6)
    with pytest.raises(ValueError, match="shape"):
        F.sincos_grid((2, 0), 8)
    with pytest.raises(TypeError, match="shape"):
        F.sincos_grid(4, 8)


def test_sphere_closed_forms():
    # London–Paris, 343.5 km on a 6371 km sphere
    assert float(F.haversine(51.5074, -0.1278, 48.8566, 2.3522, radius=6371.0)) == pytest.approx(343.56, abs=0.1)
    lat = torch.tensor([0.3, -1.0], dtype=torch.float64)
    lon = torch.tensor([2.0, -0.5], dtype=torch.float64)
    torch.testing.assert_close(F.great_circle(lat, lon, -lat, lon + math.pi),
                               torch.full((2,), math.pi, dtype=torch.float64))
    y = F.real_spherical_harmonics(lat, lon, 1)  # [Y_0^0, Y_1^-1, Y_1^0, Y_1^1]
    torch.testing.assert_close(y[:, 0], torch.full((2,), 1 / math.sqrt(4 * math.pi), dtype=torch.float64))
    torch.testing.assert_close(y[:, 2], math.sqrt(3 / (4 * math.pi)) * torch.sin(lat))
    torch.testing.assert_close(y[:, 3], math.sqrt(3 / (4 * math.pi)) * torch.cos(lat) * torch.cos(lon))


def test_graph_closed_forms():
    n = 6
    path = np.array([np.arange(n - 1), np.arange(1, n)])
    hops = F.shortest_path_hops(path, n)
    assert np.array_equal(hops, np.abs(np.subtract.outer(np.arange(n), np.arange(n))))
    # a cycle: a walk never returns in 1 step, returns with probability 1/2 in 2
    cycle = np.array([np.arange(n), (np.arange(n) + 1) % n])
    rw = F.random_walk_pe(cycle, n, 3, undirected=True)
    np.testing.assert_allclose(rw[:, 0], 0.0)
    np.testing.assert_allclose(rw[:, 1], 0.5)
    # path Laplacian D − A: eigenvalues 2 − 2cos(πj/n)
    adjacency = np.zeros((n, n))
    adjacency[path[0], path[1]] = adjacency[path[1], path[0]] = 1.0
    vals, vecs = F.laplacian_eigenvectors(adjacency, 3, normalization=None)
    np.testing.assert_allclose(vals, 2 - 2 * np.cos(np.pi * np.arange(1, 4) / n), atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=0), 1.0)
    flipped = F.random_sign_flip(torch.from_numpy(vecs), torch.Generator().manual_seed(0))
    torch.testing.assert_close(flipped.abs(), torch.from_numpy(vecs).abs())


def test_block_mask_on_an_old_torch_is_a_clear_error(monkeypatch):
    """torch 2.5's create_block_mask indexes past the sequence (IndexError inside torch):
    mmpe says FlexAttention needs 2.6 instead."""
    from mmpe import flex_compile

    monkeypatch.setattr(flex_compile, "available", lambda: False)
    with pytest.raises(flex_compile.FlexUnavailableError, match=r"torch >= 2\.6"):
        F.block_mask(mmpe.Sequence(4, causal=True))
