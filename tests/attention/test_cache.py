"""Cached decoding equals full recomputation, for every encoding that runs on a causal sequence.

Registry-driven: each encoding the registry allows on ``Sequence(n, causal=True)`` is put in a
small causal LM; the logits of token ``t`` from a cached step must equal the logits of a full
forward over tokens ``0 … t`` (float32, 1e-5), and greedy ``generate`` with and without the
cache must produce the same tokens. Also: left-padded batches (per-example positions), GQA.
"""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe.encodings.base import CachedDecodingError
from mmpe.generation import generate
from mmpe.lm import CausalLM

VOCAB, D, H, N = 17, 32, 4, 10
CTX = {"max_len": 64, "original_max_position_embeddings": 4,  # scalings switch on at 5 tokens
       "num_axes": 1}


def _causal_encodings() -> list[str]:
    probe = mmpe.Sequence(4, causal=True)
    return [e.name for e in mmpe.available() if e.supports(probe)]


def _lm(name: str, **options) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(VOCAB, D, H, 2, [name], context=CTX, **options).eval()
    with torch.no_grad():  # non-trivial parameters (T5 tables and CoPE start at zero)
        for p in model.transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("name", _causal_encodings())
def test_cached_step_logits_equal_full_recomputation(name: str) -> None:
    model = _lm(name)
    tokens = torch.randint(0, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
    cache = model.make_cache()
    with torch.no_grad():
        prompt = model(tokens[:, :4], cache=cache)
        torch.testing.assert_close(prompt, model(tokens[:, :4]), atol=1e-5, rtol=1e-5)
        for t in range(4, N):
            try:
                step = model(tokens[:, t:t + 1], cache=cache)[:, 0]
            except CachedDecodingError:
                # Refused, never a wrong number: only where the method depends on the length.
                assert any(e.length_dependent for e in model.transformer.blocks[0].attn.rotary)
                return
            full = model(tokens[:, :t + 1])[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5,
                                       msg=lambda m, t=t: f"{name}, token {t}: {m}")
    assert cache.length == N


@pytest.mark.parametrize("name", _causal_encodings())
def test_greedy_generate_with_and_without_cache(name: str) -> None:
    model = _lm(name)
    prompt = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(2))
    plain = generate(model, prompt, 6, use_cache=False)
    try:
        cached = generate(model, prompt, 6, use_cache=True)
    except CachedDecodingError:
        return
    assert torch.equal(cached, plain), name
    assert cached.shape == (2, 9) and torch.equal(cached[:, :3], prompt)


@pytest.mark.parametrize("name", ["rope", "alibi", "fox", "t5"])
def test_left_padded_batch_matches_each_prompt_alone(name: str) -> None:
    model = _lm(name)
    a = torch.tensor([[3, 5, 7, 2, 9]])
    b = torch.tensor([[4, 1, 6]])
    batch = torch.tensor([[3, 5, 7, 2, 9], [0, 0, 4, 1, 6]])
    pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
    out = generate(model, batch, 4, padding_mask=pad)
    assert torch.equal(out[0:1, 5:], generate(model, a, 4)[:, 5:])
    assert torch.equal(out[1:2, 5:], generate(model, b, 4)[:, 3:])
    assert torch.equal(out, generate(model, batch, 4, padding_mask=pad, use_cache=False))


def test_grouped_query_attention_cache_keeps_kv_heads() -> None:
    model = _lm("rope", num_kv_heads=2)
    cache = model.make_cache()
    tokens = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        model(tokens[:, :5], cache=cache)
        step = model(tokens[:, 5:], cache=cache)[:, 0]
        torch.testing.assert_close(step, model(tokens)[:, -1], atol=1e-5, rtol=1e-5)
    assert cache[0].k.shape == (1, 2, 6, D // H)
    mqa = mmpe.MultiHeadAttention(D, H, num_kv_heads=1)
    assert mqa.qkv.out_features == (H + 2) * (D // H)


def test_cache_misuse_is_refused() -> None:
    model = _lm("rope")
    cache = model.make_cache()
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 4)), cache=cache)
        with pytest.raises(ValueError, match="offset=4"):
            model(torch.randint(0, VOCAB, (1, 1)), mmpe.Sequence(1, causal=True), cache=cache)
        with pytest.raises(ValueError, match="cache has 1 layers"):
            model.transformer(torch.randn(1, 1, D), mmpe.Sequence(1, offset=4, causal=True),
                              cache=mmpe.cache.ModelCache(1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(2), 3)
