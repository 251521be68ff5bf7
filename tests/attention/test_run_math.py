"""`run_math` with what HF's eager attention brings: an additive mask, a boolean mask on top of
the coordinates' own, dropout on the weights, and the weights returned.

Each case is held to the computation written out by hand (the dense bias through the door,
the masks, the softmax), so the HF bridge's eager path and mmpe's math route are one path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mmpe
from mmpe.attention.dispatch import run_math
from mmpe.attention.forms import dense_bias
from mmpe.encodings.base import AttentionCall

B, H, N, D = 2, 4, 7, 8
SCALE = D ** -0.5


def _context(coords=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    coords = mmpe.Sequence(N, causal=True) if coords is None else coords
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    return AttentionCall(coords, H, D, B, None, q, k, v)


def _encodings(name):
    torch.manual_seed(0)
    enc = mmpe.build(name, context={"num_heads": H, "max_len": 64})
    with torch.no_grad():  # T5's table starts at 0: give it values that show
        for p in enc.parameters():
            p.normal_()
    return [enc]


def _manual(scores, ctx, mask=None, allowed=None):
    """The weights by hand: scaled logits + the dense bias (+ the additive mask), the
    coordinates' mask at -inf, the boolean mask at the float32 minimum, softmax."""
    logits = (ctx.q @ ctx.k.transpose(-2, -1)) * SCALE + dense_bias(scores, ctx)
    if mask is not None:
        logits = logits + mask
    own = ctx.coords.dense_mask()
    if own is not None:
        logits = logits.masked_fill(~own, float("-inf"))
    if allowed is not None:
        logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
    return logits.softmax(-1)


def _padding_mask():
    """HF's additive padding mask `[b, 1, 1, n_k]`: example 1's first three keys are padding."""
    mask = torch.zeros(B, 1, 1, N)
    mask[1, ..., :3] = torch.finfo(torch.float32).min
    return mask


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_additive_mask_equals_the_manual_computation(name):
    scores, ctx = _encodings(name), _context()
    mask = _padding_mask()
    out, probs = run_math(scores, None, ctx, SCALE, mask=mask, return_probs=True)
    expect = _manual(scores, ctx, mask=mask)
    torch.testing.assert_close(probs, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, expect @ ctx.v, rtol=1e-5, atol=1e-5)
    real = torch.arange(N) >= 3  # example 1's real queries see no padding key
    assert probs[1][:, real][..., :3].abs().max() == 0


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_boolean_mask_on_top_of_the_coordinates(name):
    scores, ctx = _encodings(name), _context(mmpe.Sequence(N))  # bidirectional coordinates
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool).tril()  # the caller's causal mask
    allowed[1, :, :, :2] = False  # example 1's first two queries see nothing
    out, probs = run_math(scores, None, ctx, SCALE, allowed=allowed, return_probs=True)
    expect = _manual(scores, ctx, allowed=allowed)
    torch.testing.assert_close(probs, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, expect @ ctx.v, rtol=1e-5, atol=1e-5)
    # rows with an allowed key put no weight elsewhere and sum to 1 over the allowed keys
    rows = allowed.any(-1).expand(B, H, N)
    masked = ~allowed.expand_as(probs) & rows[..., None]
    assert probs[masked].abs().max() == 0
    torch.testing.assert_close(probs.sum(-1)[rows], torch.ones(int(rows.sum())))


def test_a_row_masked_entirely_is_finite_not_nan():
    """An HF padding query may see no key at all: its weights stay finite (the float32 minimum,
    not -inf), as HF's eager attention left them."""
    scores, ctx = _encodings("alibi"), _context()
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool).tril()
    allowed[1, :, :2] = False  # example 1's first two queries see nothing
    out, probs = run_math(scores, None, ctx, SCALE, allowed=allowed, return_probs=True)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(B, H, N))
    # the float32 minimum overrides the coordinates' -inf too: uniform over every key
    torch.testing.assert_close(probs[1, :, :2], torch.full((H, 2, N), 1 / N))


def test_the_defaults_are_the_math_route():
    """No mask, no dropout: the tensor alone, the numbers of the layers' math route."""
    scores, ctx = _encodings("t5"), _context()
    out = run_math(scores, None, ctx, SCALE)
    assert isinstance(out, torch.Tensor)
    again, probs = run_math(scores, None, ctx, SCALE, return_probs=True)
    assert torch.equal(out, again)
    torch.testing.assert_close(probs, _manual(scores, ctx), rtol=1e-5, atol=1e-6)
    layer = mmpe.MultiHeadAttention(H * D, H, scores, route="math")
    assert layer.attend(ctx).shape == out.shape
    torch.testing.assert_close(layer.attend(ctx), out)


def test_dropout_drops_the_weights_as_hf_does():
    """`F.dropout(weights, p, training=True)` after the softmax; the value-side terms and the
    returned weights are the dropped ones; p = 0 draws nothing."""
    scores, ctx = _encodings("alibi"), _context()
    torch.manual_seed(3)
    out, probs = run_math(scores, None, ctx, SCALE, dropout=0.4, return_probs=True)
    torch.manual_seed(3)
    expect = F.dropout(_manual(scores, ctx), p=0.4, training=True)
    torch.testing.assert_close(probs, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, expect @ ctx.v, rtol=1e-5, atol=1e-5)
    state = torch.random.get_rng_state()
    plain = run_math(scores, None, ctx, SCALE, dropout=0.0)
    assert torch.equal(torch.random.get_rng_state(), state)  # p = 0 draws no random numbers
    assert torch.equal(plain, run_math(scores, None, ctx, SCALE))


def test_a_non_softmax_kernel_reads_the_boolean_mask_at_minus_inf():
    kernel = mmpe.build("stick_breaking")
    ctx = _context(mmpe.Sequence(N, causal=True))
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    allowed[1, ..., :2] = False
    out, probs = run_math([], kernel, ctx, SCALE, allowed=allowed, return_probs=True)
    assert probs is None
    logits = (ctx.q @ ctx.k.transpose(-2, -1)) * SCALE
    logits = logits.masked_fill(~ctx.coords.dense_mask(), float("-inf"))
    expect = kernel.attend(logits.masked_fill(~allowed, float("-inf")), ctx.v, ctx)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
