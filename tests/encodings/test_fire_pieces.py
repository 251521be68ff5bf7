"""FIRE's `score_mod` as linear pieces of its MLP (what compiled FlexAttention runs on a GPU)
against the MLP evaluated hidden unit by hidden unit: the same scores and the same gradient
for `c`, `L` and every MLP parameter, over random weights, widths, heads, lengths and
coordinates (hypothesis); a control with the pieces read one off fails."""

from __future__ import annotations

import pytest
import torch
from helpers import CapturedUses
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall


def piecewise_score_mod(enc, ctx):
    """FIRE's own `score_mod`: the MLP as its linear pieces."""
    return enc.score_mod(ctx)


def _mlp_mod(enc, ctx):
    """The reference: the module's own MLP (`nn.Linear`, ReLU, `nn.Linear`) on `x`."""

    def mod(score, b, h, q_idx, kv_idx):
        x = enc.normalised_distance(ctx, q_idx, kv_idx, b)  # [1, 1, n_q, n_k]: no head axis
        f = enc.mlp(x.unsqueeze(-1).to(enc.mlp[0].weight.dtype))  # [1, 1, n_q, n_k, n_h]
        return score + f.movedim(-1, 1).squeeze(2)  # [1, n_h, n_q, n_k]

    return mod


def _c_term_scale(enc, coords, heads) -> float:
    """`|∂L/∂c|` through `ψ(d)` alone, the normaliser `ψ(max(L, i))` held fixed: the size of
    each of the two terms whose difference is c's gradient (`x = ψ(d) / ψ(max(L, i))` is
    float32, so that gradient is known to about 1e-6 of this, not of itself)."""
    b, _, q, k = index_grid(1, 1, coords.num_queries, coords.num_keys, coords.device)
    rel, i = coords.distance(q, k, b).float(), coords.extent(q, b).float()
    norm = enc._psi(torch.maximum(i, enc._threshold())).detach() + enc.eps
    x = enc._psi(rel) / norm
    scores = enc.mlp(x.unsqueeze(-1).to(enc.mlp[0].weight.dtype)).movedim(-1, 1).squeeze(2)
    weight = torch.randn((1, heads, coords.num_queries, coords.num_keys),
                         generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (grad,) = torch.autograd.grad((scores.double() * weight).sum(), enc.c)
    return float(grad.abs())


def _grid_scores(mod, coords, heads):
    b, h, q, k = index_grid(1, heads, coords.num_queries, coords.num_keys, coords.device)
    return mod(torch.zeros(()), b, h, q, k)


def _coords(kind: str, n: int):
    if kind == "sequence":
        return mmpe.Sequence(n, causal=True)
    side = max(1, int(n ** 0.5))
    return mmpe.Grid((side, max(1, n // side)))


def _scores_and_grads(enc, coords, heads, mod_of):
    ctx = AttentionCall(coords, heads, 8, 1, None, None, None, None)
    scores = _grid_scores(mod_of(enc, ctx), coords, heads).expand(
        1, heads, coords.num_queries, coords.num_keys)
    weight = torch.randn(scores.shape, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    params = [p for p in enc.parameters() if p.requires_grad]
    grads = torch.autograd.grad((scores.double() * weight).sum(), params, allow_unused=True)
    return scores, [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]


@settings(max_examples=40, deadline=None)
@given(heads=st.integers(1, 6), width=st.integers(1, 40), n=st.integers(1, 60),
       kind=st.sampled_from(["sequence", "grid"]), init_l=st.floats(1.0, 80.0),
       init_c=st.floats(0.01, 2.0), scale=st.floats(0.1, 3.0), seed=st.integers(0, 10**6))
def test_the_pieces_give_the_mlp_scores_and_gradients(heads, width, n, kind, init_l, init_c,
                                                       scale, seed) -> None:
    torch.manual_seed(seed)
    enc = mmpe.build("fire", context={"num_heads": heads}, mlp_width=width, init_L=init_l,
                     init_c=init_c).double()
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.mul_(scale)
    coords = _coords(kind, n)
    got, got_grads = _scores_and_grads(enc, coords, heads, piecewise_score_mod)
    want, want_grads = _scores_and_grads(enc, coords, heads, _mlp_mod)
    # x is float32 in both (FIRE's normalised distance); the sums differ in order only.
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5,
                               atol=1e-5 * float(want.abs().max()) + 1e-6)
    # A gradient is a sum over every pair of float32 terms (x is float32 in both forms), so
    # its rounding is about 1e-6 absolute whatever the sum: c's gradient of 4e-3 from 37²
    # pairs differed by 1.9e-6 (hypothesis found it). A wrong piece or slope is off by far more.
    # c's gradient is the difference of its terms in ψ(d) and in the normaliser ψ(max(L, i)),
    # each far larger than it where c·d is small (hypothesis found c = 0.0117 on two tokens:
    # -0.00208 against -0.00210), so its tolerance follows the size of those terms.
    names = [n for n, p in enc.named_parameters() if p.requires_grad]
    c_scale = _c_term_scale(enc, coords, heads)
    for name, g, w in zip(names, got_grads, want_grads, strict=True):
        atol = 1e-4 * float(w.abs().max()) + 1e-5
        if name == "c":
            atol += 1e-5 * c_scale
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=atol)


def test_a_piece_read_one_off_fails_the_comparison(monkeypatch) -> None:
    """Control: the same kernel with every piece index shifted by one head row differs."""
    torch.manual_seed(0)
    enc = mmpe.build("fire", context={"num_heads": 3}, mlp_width=16, init_L=8.0).double()
    with torch.no_grad():
        enc.mlp[0].bias.copy_(torch.linspace(-1.0, 0.2, 16, dtype=torch.float64))
    coords = mmpe.Sequence(40, causal=True)
    want, _ = _scores_and_grads(enc, coords, 3, _mlp_mod)
    slope, intercept, cuts = enc.pieces()
    shifted = (torch.roll(slope, 1, 0), torch.roll(intercept, 1, 0), cuts)
    monkeypatch.setattr(type(enc), "pieces", lambda self: shifted)
    got, _ = _scores_and_grads(enc, coords, 3, piecewise_score_mod)
    assert not torch.allclose(got.double(), want.double(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("width", [1, 32])
def test_the_kernel_reads_each_tensor_that_takes_a_gradient_once(width) -> None:
    """Two reads per score of tensors that need a gradient (slope, intercept) plus `c` and `L`
    per head, whatever the width (the unrolled MLP read `3W + 1`)."""
    enc = mmpe.build("fire", context={"num_heads": 2}, mlp_width=width)
    coords = mmpe.Sequence(5, causal=True)
    ctx = AttentionCall(coords, 2, 8, 1, None, None, None, None)
    mod = piecewise_score_mod(enc, ctx)
    scalar = [torch.tensor(v) for v in (0, 1, 3, 2)]
    with CapturedUses() as uses:
        mod(torch.tensor(0.0), *scalar)
    assert sorted(uses.reads.values()) == [1, 1, 1, 1] and not uses.other
