"""PaTH attention and PaTH-FoX (Yang et al. 2025) against the definition with explicit products.

The reference builds every `H_t = I − β_t w_t w_tᵀ` as a `d × d` matrix in float64 and multiplies
them for each pair, `A_ij ∝ exp(k_jᵀ H_{j+1} ⋯ H_i q_i / √d)`; the blockwise algorithm of
`mmpe.encodings.path.path_logits` and the encodings in attention are checked against it, forward
and gradients, over random transforms, lengths, heads and block sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bfloat16_and_autocast_follow_float32
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.cache import KVCache
from mmpe.coords import Grid, Sequence
from mmpe.encodings.path import PaTH, path_logits

D_MODEL, HEADS = 16, 2


# ----------------------------------------------------------------------------- references
def transforms64(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Every `H_t` as a matrix: `[..., n, d, d]`."""
    eye = torch.eye(w.shape[-1], dtype=w.dtype)
    return eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]


def logits64(q, k, w, beta) -> torch.Tensor:
    """`L_ij = k_jᵀ (H_{j+1} ⋯ H_i) q_i` for `j ≤ i` (0 above), by explicit products."""
    n, d = q.shape[-2:]
    h = transforms64(w, beta)
    out = torch.zeros(*q.shape[:-2], n, n, dtype=q.dtype)
    for i in range(n):
        for j in range(i + 1):
            prod = torch.eye(d, dtype=q.dtype).expand(*q.shape[:-2], d, d)
            for s in range(j + 1, i + 1):
                prod = prod @ h[..., s, :, :]
            out[..., i, j] = (k[..., j, None, :] @ prod @ q[..., i, :, None])[..., 0, 0]
    return out


def _projected64(mha, enc, x):
    """`(x, q, k, v, u)` in float64: the layer's heads `[b, h, n, d]` and `enc`'s low-rank
    projection `u` of `x` (before the convolution)."""
    h, d = HEADS, D_MODEL // HEADS
    x = x.double()
    qkv = F.linear(x, mha.qkv.weight.double(), mha.qkv.bias.double())
    q, k, v = (t.unflatten(-1, (h, d)).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
    u = x
    for layer in enc.w_proj:
        u = F.linear(u, layer.weight.double())
    return x, q, k, v, u


def layer_reference(mha, enc, x, *, docs=None, real=None, gates=False) -> torch.Tensor:
    """The whole layer in float64 from its parameters: projections, the paper's `w` (low-rank
    projection, causal depthwise convolution over the real tokens of the document, SiLU, L2
    norm), `β = 2σ(·)` (0 at pads),
    explicit products, the mask, softmax, output projection."""
    b, n, _ = x.shape
    h, d = HEADS, D_MODEL // HEADS
    x, q, k, v, u = _projected64(mha, enc, x)
    docs = torch.zeros(b, n, dtype=torch.long) if docs is None else docs.expand(b, n)
    real = torch.ones(b, n, dtype=torch.bool) if real is None else real.expand(b, n)
    taps = enc.w_conv.double()
    mixed = torch.zeros_like(u)
    for bi in range(b):
        for t in range(n):
            # the token, then the real tokens before it in its document, nearest first
            sources = [t] + [s for s in range(t - 1, -1, -1)
                             if real[bi, s] and docs[bi, s] == docs[bi, t]]
            for lag, s in enumerate(sources[: enc.conv_size]):
                mixed[bi, t] = mixed[bi, t] + taps[:, enc.conv_size - 1 - lag] * u[bi, s]
    w = F.normalize(F.silu(mixed).unflatten(-1, (h, d)), dim=-1).transpose(1, 2)
    beta = 2 * torch.sigmoid(F.linear(x, enc.beta_proj.weight.double(),
                                      enc.beta_proj.bias.double())).transpose(1, 2)
    beta = beta * real[:, None, :]
    z = logits64(q, k, w, beta) / math.sqrt(d)
    if gates:
        log_f = F.logsigmoid(F.linear(x, enc.forget.gate.weight.double(),
                                      enc.forget.gate.bias.double())).transpose(1, 2)
        c = log_f.cumsum(-1)
        z = z + c[..., :, None] - c[..., None, :]
    i = torch.arange(n)
    allowed = (i[None, :] <= i[:, None]) & (docs[:, None, :, None] == docs[:, None, None, :]).squeeze(1)
    allowed = allowed & (real[:, None, :] | torch.eye(n, dtype=torch.bool))
    z = z.masked_fill(~allowed[:, None], float("-inf"))
    out = z.softmax(-1) @ v
    return F.linear(out.transpose(1, 2).flatten(-2), mha.proj.weight.double(),
                    mha.proj.bias.double())


def make(name="path", conv_size=3, seed=0):
    torch.manual_seed(seed)
    enc = mmpe.build(name, d_model=D_MODEL, num_heads=HEADS, conv_size=conv_size, w_rank=4)
    return enc, mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])


def random_inputs(draw_seed, lead, n, d, low=0.0, high=2.0):
    g = torch.Generator().manual_seed(draw_seed)
    q, k, w = (torch.randn(*lead, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    w = F.normalize(w, dim=-1)
    beta = low + (high - low) * torch.rand(*lead, n, generator=g, dtype=torch.float64)
    return q, k, w, beta


# ----------------------------------------------------------------------------- the algorithm
@settings(max_examples=25)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 9), heads=st.integers(1, 3),
       d=st.integers(1, 5), chunk=st.integers(1, 5))
def test_blockwise_logits_and_gradients_equal_explicit_products(seed, n, heads, d, chunk):
    q, k, w, beta = random_inputs(seed, (2, heads), n, d)
    inputs = [t.requires_grad_() for t in (q, k, w, beta)]
    got = path_logits(*inputs, chunk_size=chunk)
    want = logits64(*inputs)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    assert (got - want)[..., mask].abs().max() < 1e-12
    weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(seed),
                         dtype=torch.float64) * mask
    # (one token has no transform between key and query: w and β then take no gradient)
    g_got = torch.autograd.grad((got * weight).sum(), inputs, allow_unused=True)
    g_want = torch.autograd.grad((want * weight).sum(), inputs, allow_unused=True)
    for t, a, b in zip(inputs, g_got, g_want, strict=True):
        a, b = (torch.zeros_like(t) if g is None else g for g in (a, b))
        assert (a - b).abs().max() < 1e-11


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 8), chunk=st.integers(1, 4))
def test_states_continue_the_running_product(seed, n, chunk):
    """What a cache keeps: queries carried to the first token, keys through the last, and the
    product of all transforms, each equal to its explicit form."""
    q, k, w, beta = random_inputs(seed, (1, 2), n, 3)
    _, starts, ends, total = path_logits(q, k, w, beta, chunk_size=chunk, states=True)
    h = transforms64(w, beta)
    eye = torch.eye(3, dtype=torch.float64)
    for i in range(n):
        down = eye.expand(1, 2, 3, 3)
        for s in range(i + 1):  # H_0 ⋯ H_i
            down = down @ h[..., s, :, :]
        assert torch.allclose(starts[..., i, :], (down @ q[..., i, :, None])[..., 0], atol=1e-12)
        up = eye.expand(1, 2, 3, 3)
        for s in range(i + 1, n):  # H_{n−1} ⋯ H_{i+1}
            up = h[..., s, :, :] @ up
        assert torch.allclose(ends[..., i, :], (up @ k[..., i, :, None])[..., 0], atol=1e-12)
    prod = eye.expand(1, 2, 3, 3)
    for s in range(n):
        prod = h[..., s, :, :] @ prod
    assert torch.allclose(total, prod, atol=1e-12)


def test_beta_zero_is_plain_dot_products():
    q, k, w, _ = random_inputs(3, (2, 2), 7, 4)
    got = path_logits(q, k, w, torch.zeros(2, 2, 7, dtype=torch.float64), chunk_size=3)
    assert torch.allclose(got, (q @ k.transpose(-1, -2)).tril(), atol=1e-13)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 8))
def test_beta_two_gives_a_product_of_reflections(seed, n):
    q, k, w, _ = random_inputs(seed, (1, 2), n, 4)
    beta = torch.full((1, 2, n), 2.0, dtype=torch.float64)
    h = transforms64(w, beta)
    eye = torch.eye(4, dtype=torch.float64)
    assert torch.allclose(h @ h.transpose(-1, -2), eye.expand_as(h), atol=1e-12)  # orthogonal
    assert torch.allclose(h @ h, eye.expand_as(h), atol=1e-12)  # an involution: H² = I
    assert torch.allclose(torch.linalg.det(h), -torch.ones(1, 2, n, dtype=torch.float64))
    got = path_logits(q, k, w, beta, chunk_size=3)
    for i in range(n):
        for j in range(i + 1):
            refl = eye
            for s in range(j + 1, i + 1):  # reflect q_i across w_i^⊥, then w_{i−1}^⊥, …
                refl = refl @ h[0, :, s]
            want = (k[0, :, j, None, :] @ refl @ q[0, :, i, :, None])[:, 0, 0]
            assert torch.allclose(got[0, :, i, j], want, atol=1e-12)
            # A product of reflections keeps lengths: |L_ij| ≤ |q_i||k_j|.
            assert (got[0, :, i, j].abs() <= q[0, :, i].norm(dim=-1) * k[0, :, j].norm(dim=-1)
                    + 1e-12).all()


# ----------------------------------------------------------------------------- in attention
@settings(max_examples=8)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 7), conv=st.sampled_from([None, 1, 2, 3]),
       chunk=st.integers(1, 4), fox=st.booleans())
def test_layer_forward_and_gradients_equal_the_definition(seed, n, conv, chunk, fox):
    name = "path_fox" if fox else "path"
    enc, mha = make(name, conv_size=conv, seed=seed)
    enc.chunk_size = chunk
    with torch.no_grad():  # β spread over (0, 2)
        enc.beta_proj.weight.normal_(0, 1.0)
    x = torch.randn(2, n, D_MODEL, generator=torch.Generator().manual_seed(seed))
    got = mha(x, Sequence(n, causal=True))
    want = (layer_reference(mha, enc, x, gates=fox) if conv else
            _reference_without_conv(mha, enc, x, fox))
    assert (got.double() - want).abs().max() < 2e-5
    params = [p for p in mha.parameters() if p.requires_grad]
    weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(seed + 1))
    g_got = torch.autograd.grad((got * weight).sum(), params, allow_unused=True)
    g_want = torch.autograd.grad((want * weight.double()).sum(), params, allow_unused=True)
    for p, a, b in zip(params, g_got, g_want, strict=True):  # n = 1: no transform is used
        a, b = (torch.zeros_like(p, dtype=torch.float64) if g is None else g.double()
                for g in (a, b))
        assert (a - b).abs().max() < 1e-4 * (1 + b.abs().max()), p.shape


def _reference_without_conv(mha, enc, x, fox):
    """`conv_size=0`: `w` is the normalised projection itself (no convolution, no SiLU)."""
    b, n, _ = x.shape
    h, d = HEADS, D_MODEL // HEADS
    xd, q, k, v, u = _projected64(mha, enc, x)
    w = F.normalize(u.unflatten(-1, (h, d)), dim=-1).transpose(1, 2)
    beta = 2 * torch.sigmoid(F.linear(xd, enc.beta_proj.weight.double(),
                                      enc.beta_proj.bias.double())).transpose(1, 2)
    z = logits64(q, k, w, beta) / math.sqrt(d)
    if fox:
        c = F.logsigmoid(F.linear(xd, enc.forget.gate.weight.double(),
                                  enc.forget.gate.bias.double())).transpose(1, 2).cumsum(-1)
        z = z + c[..., :, None] - c[..., None, :]
    z = z.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    out = z.softmax(-1) @ v
    return F.linear(out.transpose(1, 2).flatten(-2), mha.proj.weight.double(),
                    mha.proj.bias.double())


def _plain_copy(mha):
    plain = mmpe.MultiHeadAttention(D_MODEL, HEADS, [])
    plain.load_state_dict({k: v for k, v in mha.state_dict().items()
                           if k.startswith(("qkv.", "proj."))})
    return plain


def test_beta_to_zero_is_nope():
    enc, mha = make()
    with torch.no_grad():
        enc.beta_proj.weight.zero_()
        enc.beta_proj.bias.fill_(-40.0)  # β = 2σ(−40) ≈ 8e-18
    x = torch.randn(2, 9, D_MODEL)
    coords = Sequence(9, causal=True)
    torch.testing.assert_close(mha(x, coords), _plain_copy(mha)(x, coords), atol=1e-6, rtol=1e-5)


def test_path_fox_with_open_gates_is_path():
    fox, mha_fox = make("path_fox", seed=4)
    with torch.no_grad():
        fox.forget.gate.weight.zero_()
        fox.forget.gate.bias.fill_(40.0)  # log σ(40) ≈ −4e-18
    path, mha = make("path", seed=5)
    path.load_state_dict({k: v for k, v in fox.state_dict().items() if not k.startswith("forget")})
    mha.load_state_dict({k: v for k, v in mha_fox.state_dict().items()
                         if k.startswith(("qkv.", "proj."))}, strict=False)
    x = torch.randn(2, 8, D_MODEL)
    coords = Sequence(8, causal=True)
    torch.testing.assert_close(mha_fox(x, coords), mha(x, coords), atol=1e-6, rtol=1e-5)


def test_block_size_changes_nothing_but_rounding():
    enc, mha = make()
    x, coords = torch.randn(2, 23, D_MODEL), Sequence(23, causal=True)
    outs = []
    for chunk in (1, 4, 7, 64):
        enc.chunk_size = chunk
        outs.append(mha(x, coords))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=1e-5)


def test_other_score_terms_add_to_the_logits():
    """ALiBi in the same layer adds its bias to PaTH's logits (not to q·kᵀ's)."""
    torch.manual_seed(0)
    enc = mmpe.build("path", d_model=D_MODEL, num_heads=HEADS)
    alibi = mmpe.build("alibi", num_heads=HEADS)
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc, alibi])
    x, coords = torch.randn(1, 6, D_MODEL), Sequence(6, causal=True)
    with torch.no_grad():
        q, k, v = mha._project(x)
        from mmpe.encodings.base import AttentionCall

        ctx = AttentionCall(coords, HEADS, D_MODEL // HEADS, 1, x, q, k, v)
        z = enc.logits(ctx)
        i = torch.arange(6)
        bias = -alibi.slopes.view(-1, 1, 1) * (i[:, None] - i[None, :]).float()
        z = (z + bias).masked_fill(i[None, :] > i[:, None], float("-inf"))
        want = mha.proj((z.softmax(-1) @ v).transpose(1, 2).flatten(-2))
        torch.testing.assert_close(mha(x, coords), want, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- documents, padding
@pytest.mark.parametrize("name", ["path", "path_fox"])
def test_packed_documents_equal_separate_sequences(name):
    enc, mha = make(name, seed=2)
    a, b = torch.randn(1, 5, D_MODEL), torch.randn(1, 4, D_MODEL)
    docs = torch.tensor([0] * 5 + [1] * 4)
    packed = mha(torch.cat((a, b), 1), Sequence(9, causal=True, document_ids=docs))
    alone = torch.cat((mha(a, Sequence(5, causal=True)), mha(b, Sequence(4, causal=True))), 1)
    torch.testing.assert_close(packed, alone, atol=1e-6, rtol=1e-5)
    want = layer_reference(mha, enc, torch.cat((a, b), 1), docs=docs[None], gates=name == "path_fox")
    assert (packed.double() - want).abs().max() < 2e-5


def test_padding_equals_the_unpadded_tokens():
    """A left-padded batch (generation) and a pad in the middle: the pads' transforms are the
    identity and the convolution skips them, so the real tokens get what they would alone."""
    enc, mha = make(seed=3)
    x = torch.randn(2, 7, D_MODEL)
    real = torch.tensor([[False, False, True, True, True, True, True],
                         [True, True, False, True, True, False, True]])
    out = mha(x, Sequence(7, causal=True, padding_mask=real))
    for row in range(2):
        keep = real[row]
        alone = mha(x[row:row + 1, keep], Sequence(int(keep.sum()), causal=True))
        torch.testing.assert_close(out[row:row + 1, keep], alone, atol=1e-6, rtol=1e-5)
    want = layer_reference(mha, enc, x, real=real)
    assert (out.double() - want)[real].abs().max() < 2e-5


# ----------------------------------------------------------------------------- cached decoding
@pytest.mark.parametrize("name", ["path", "path_fox"])
@pytest.mark.parametrize("steps", [(1,) * 9, (4, 1, 3, 1), (9,)])
def test_cached_decoding_equals_the_full_pass(name, steps):
    enc, mha = make(name, seed=6)
    enc.chunk_size = 2
    x = torch.randn(2, 9, D_MODEL)
    full = mha(x, Sequence(9, causal=True))
    cache, outs, done = KVCache(), [], 0
    with torch.no_grad():
        for s in steps:
            outs.append(mha(x[:, done:done + s], Sequence(s, offset=done, causal=True),
                            cache=cache))
            done += s
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=2e-6, rtol=1e-5)


def test_cached_decoding_with_documents_and_padding():
    enc, mha = make(seed=7)
    x = torch.randn(1, 8, D_MODEL)
    docs = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    real = torch.tensor([True, True, True, True, False, True, True, True])
    full = mha(x, Sequence(8, causal=True, document_ids=docs, padding_mask=real))
    cache, outs = KVCache(), []
    with torch.no_grad():
        for t in range(8):
            outs.append(mha(x[:, t:t + 1], Sequence(1, offset=t, causal=True,
                                                    document_ids=docs[: t + 1],
                                                    padding_mask=real[: t + 1]), cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1)[:, real], full[:, real], atol=2e-6, rtol=1e-5)


def test_a_cache_filled_elsewhere_is_refused():
    enc, mha = make()
    cache = KVCache()
    cache.update(torch.zeros(1, HEADS, 3, D_MODEL // HEADS), torch.zeros(1, HEADS, 3, D_MODEL // HEADS))
    with pytest.raises(ValueError, match="path: the cache holds 3 keys"):
        mha(torch.randn(1, 1, D_MODEL), Sequence(1, offset=3, causal=True), cache=cache)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["path", "path_fox"])
def test_bidirectional_and_non_sequence_coordinates_are_refused(name):
    enc, mha = make(name)
    with pytest.raises(ValueError, match=rf"{name}.*causal"):
        mha(torch.randn(1, 5, D_MODEL), Sequence(5))
    with pytest.raises(TypeError, match=rf"{name} needs coordinates providing \['Causal'\]"):
        mha(torch.randn(1, 6, D_MODEL), Grid((2, 3)))
    assert name not in {e.name for e in mmpe.available(coords=Grid((2, 3)))}


def test_out_of_order_positions_and_resumed_documents_are_refused():
    enc, mha = make()
    with pytest.raises(ValueError, match="path: a query attends to a key after it"):
        mha(torch.randn(1, 4, D_MODEL), Sequence(position_ids=torch.tensor([3, 2, 1, 0]),
                                                 causal=True))
    with pytest.raises(ValueError, match="path: document_ids must give each document one run"):
        mha(torch.randn(1, 5, D_MODEL), Sequence(5, causal=True,
                                                 document_ids=torch.tensor([0, 0, 1, 1, 0])))


def test_context_parallel_is_refused_with_a_reason():
    assert PaTH.shard_refusal and "every token" in PaTH.shard_refusal
    assert mmpe.build("path_fox", d_model=8, num_heads=2).shard_refusal == PaTH.shard_refusal


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"d_model": 0, "num_heads": 2}, "d_model"),
    ({"d_model": 8, "num_heads": 3}, "num_heads=3"),
    ({"d_model": 8, "num_heads": 2, "w_rank": 0}, "w_rank"),
    ({"d_model": 8, "num_heads": 2, "conv_size": 0}, "conv_size"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mmpe.build("path", **kwargs)


def test_wrong_heads_and_missing_x_are_refused():
    enc = mmpe.build("path", d_model=D_MODEL, num_heads=4)
    with pytest.raises(ValueError, match="path: built for num_heads=4"):
        mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])(torch.randn(1, 3, D_MODEL),
                                                       Sequence(3, causal=True))
    enc, mha = make()
    q = k = v = torch.randn(1, HEADS, 3, D_MODEL // HEADS)
    with pytest.raises(ValueError, match="path: needs the layer's x"):
        mha.forward_heads(q, k, v, Sequence(3, causal=True))
    with pytest.raises(ValueError, match="path_logits|path: q, k, w"):
        path_logits(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3))


def test_runs_in_bfloat16_and_under_autocast():
    enc, mha = make()
    x, coords = torch.randn(2, 10, D_MODEL), Sequence(10, causal=True)
    assert_bfloat16_and_autocast_follow_float32(mha, x, coords)
