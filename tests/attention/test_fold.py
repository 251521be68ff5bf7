"""The fold route (`mmpe.attention.fold`): causal ALiBi folded into `q` and `k` equals the math
route, forward and gradients, over the whole space (dtype, heads, GQA, learnable slopes,
distance unit, padding, documents, windows, a KV cache); in bf16 its logits hold at 32k
tokens; its SDPA call is one the flash and cuDNN kernels take (no mask, `is_causal`, head dim
a multiple of 8); what it cannot fold is refused by name; the rule takes it on CUDA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sdpa_rules import cudnn_violations, flash_violations, record_calls

import mmpe
from mmpe.attention import which_route
from mmpe.attention.fold import run_fold
from mmpe.attention.masks import LocalWindow
from mmpe.encodings.base import AttentionCall


def _pair(heads: int, kv_heads: int, dtype: torch.dtype, learnable: bool, unit: float,
          seed: int, window: LocalWindow | None = None):
    torch.manual_seed(seed)
    factor = torch.rand(heads) + 0.5

    def alibi():
        enc = mmpe.build("alibi", num_heads=heads, learnable_slopes=learnable,
                         distance_unit=unit)
        if learnable:  # away from the fixed slopes: a gradient of its own
            with torch.no_grad():
                enc.slopes.mul_(factor)
        return enc

    layers = [mmpe.MultiHeadAttention(8 * heads, heads, [alibi()], num_kv_heads=kv_heads,
                                      route=route, window=window).to(dtype)
              for route in ("fold", "math")]
    layers[1].load_state_dict(layers[0].state_dict())
    return layers


def _outputs_and_grads(layer, x, coords):
    x = x.detach().clone().requires_grad_()
    out = layer(x, coords)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * weight).sum(), [x, *params])
    return out, grads


def _coords(kind: str, n: int, batch: int):
    if kind == "plain":
        return mmpe.Sequence(n, causal=True)
    if kind == "padded":
        pad = torch.ones(batch, n, dtype=torch.bool)
        pad[0, : n // 3] = False  # left padding: positions count real tokens
        return mmpe.Sequence(n, causal=True, padding_mask=pad)
    if kind == "documents":
        docs = (torch.arange(n) >= n // 2).long().expand(batch, n)
        return mmpe.Sequence(n, causal=True, document_ids=docs)
    raise ValueError(kind)


@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([1, 2]),
       dtype=st.sampled_from([torch.float32, torch.float64]), learnable=st.booleans(),
       unit=st.sampled_from([1.0, 0.5, 3.0]), n=st.integers(1, 40), batch=st.integers(1, 3),
       kind=st.sampled_from(["plain", "padded", "documents"]), windowed=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_fold_equals_the_math_route(heads, group, dtype, learnable, unit, n, batch, kind,
                                        windowed, seed) -> None:
    kv_heads = max(1, heads // group)
    window = LocalWindow("sliding", 5) if windowed else None
    fold, math = _pair(heads, kv_heads, dtype, learnable, unit, seed, window)
    x = torch.randn(batch, n, 8 * heads, dtype=dtype)
    coords = _coords(kind, n, batch)
    (a, ga), (b, gb) = (_outputs_and_grads(layer, x, coords) for layer in (fold, math))
    # the math route forms its logits and weights in float32 also in a float64 layer
    tol = 1e-5 if dtype == torch.float32 else 2e-6
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for u, w in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, w, rtol=10 * tol, atol=10 * tol)


def test_a_wrong_slope_fails_the_same_comparison() -> None:
    """Control: the fold with the slopes of another head count differs from the math route."""
    fold, math = _pair(4, 4, torch.float64, False, 1.0, 0)
    with torch.no_grad():
        fold.scores[0].slopes.copy_(mmpe.build("alibi", num_heads=8).slopes[:4])
    x = torch.randn(2, 24, 32, dtype=torch.float64)
    coords = mmpe.Sequence(24, causal=True)
    assert not torch.allclose(fold(x, coords), math(x, coords), atol=1e-4)


@pytest.mark.parametrize("prefill", [7, 16])
def test_cached_decoding_equals_a_full_forward(prefill: int) -> None:
    fold, _ = _pair(4, 2, torch.float64, False, 1.0, 1)
    x = torch.randn(2, prefill + 3, 32, dtype=torch.float64)
    full = fold(x, mmpe.Sequence(prefill + 3, causal=True))
    cache = fold.make_cache() if hasattr(fold, "make_cache") else mmpe.KVCache()
    steps = [fold(x[:, :prefill], mmpe.Sequence(prefill, causal=True), cache)]
    for t in range(prefill, prefill + 3):
        steps.append(fold(x[:, t:t + 1], mmpe.Sequence(1, offset=t, causal=True), cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)  # fold both


def test_bf16_logits_hold_at_32k_tokens() -> None:
    """The last queries of a 32,768-token causal sequence (a cache's layout: every key before
    them), in bf16 against the float64 math route: the high/low split keeps the positions
    exact (bf16 alone rounds 32,767 to 32,768)."""
    n, rows, heads, d = 32768, 4, 8, 16
    torch.manual_seed(0)
    alibi = mmpe.build("alibi", num_heads=heads)
    coords = mmpe.Sequence(rows, offset=n - rows, causal=True)
    q = torch.randn(1, heads, rows, d, dtype=torch.float64)
    k = torch.randn(1, heads, n, d, dtype=torch.float64)
    v = torch.randn(1, heads, n, d, dtype=torch.float64)
    scale = d ** -0.5
    want = mmpe.attention.run_math([alibi], None, AttentionCall(coords, heads, d, 1, None, q, k, v),
                                   scale)
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    got = run_fold([alibi], AttentionCall(coords, heads, d, 1, None, *low), scale)
    # bf16 inputs alone move the output by about 1e-2; a position off by one in the steepest
    # head (slope 1/2) moves the weights by e^0.5
    assert float((got.double() - want).abs().max()) < 3e-2
    # control: positions rounded to bf16 (no split) fail it
    rounded = (k.new_tensor(range(n)).to(torch.bfloat16).double() - torch.arange(n)).abs()
    assert float(rounded.max()) >= 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_its_call_is_one_the_flash_and_cudnn_kernels_take(monkeypatch, dtype) -> None:
    calls = record_calls(monkeypatch)
    fold, _ = _pair(8, 2, dtype, True, 1.0, 0)
    fold(torch.randn(2, 64, 64, dtype=dtype), mmpe.Sequence(64, causal=True))
    assert len(calls) == 1
    call = calls[0]
    assert call.attn_mask is None and call.is_causal
    assert call.q.shape[-1] % 8 == 0 and call.q.shape[-1] == call.v.shape[-1]
    assert flash_violations(call) == [] and cudnn_violations(call) == []


@pytest.mark.parametrize(("name", "coords", "why"), [
    ("alibi", lambda: mmpe.Sequence(6), "bidirectional ALiBi"),
    ("alibi", lambda: mmpe.Sequence(6, causal=True, position_ids=torch.tensor([0, 2, 1, 3, 4, 5])),
     "explicit position_ids"),
    ("alibi", lambda: mmpe.Grid((2, 3)), "the coordinates are Grid"),
    ("t5", lambda: mmpe.Sequence(6, causal=True), "only ALiBi folds"),
])
def test_what_does_not_fold_is_refused_by_name(name, coords, why) -> None:
    c = coords()
    enc = mmpe.build(name, num_heads=2) if name == "alibi" else mmpe.build(name, num_heads=2)
    layer = mmpe.MultiHeadAttention(16, 2, [enc], route="fold")
    with pytest.raises(ValueError, match=why):
        layer(torch.randn(1, c.num_queries, 16), c)


def test_the_rule_folds_causal_alibi_on_cuda_within_its_precision() -> None:
    layer = mmpe.MultiHeadAttention(64, 8, [mmpe.build("alibi", num_heads=8)])
    causal = mmpe.Sequence(4096, causal=True)
    assert which_route(layer, causal, device="cuda", dtype=torch.bfloat16) == "fold"
    assert which_route(layer, mmpe.Sequence(4096), device="cuda") != "fold"
    # float32: the steepest slope (1/2) times 4,095 positions exceeds 2^10
    assert which_route(layer, causal, device="cuda", dtype=torch.float32) != "fold"
    assert which_route(layer, mmpe.Sequence(1024, causal=True), device="cuda",
                       dtype=torch.float32) == "fold"
    assert which_route(layer, causal, device="cpu") == "sdpa"  # no stored CPU row yet
