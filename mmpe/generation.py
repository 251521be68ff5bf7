"""Autoregressive generation, with or without a key/value cache (greedy or sampled).

`model(tokens [b, s], coords, cache=None) -> logits [b, s, vocab]` and
`model.make_cache()` are all it needs ([`mmpe.lm.CausalLM`][mmpe.lm.CausalLM], the text recipe's model).
With a cache each step feeds one token at `offset = cache.length`; without one each step
re-reads the whole sequence. Both give the same tokens (tested for every causal encoding).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mmpe.coords.sequence import Sequence


def generate(
    model: Any,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    padding_mask: Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Extend `prompt` `[b, s]` by `max_new_tokens` tokens; returns `[b, s + new]`.

    Args:
        model: callable as `model(tokens, coords, cache=None)` with `make_cache()`.
        prompt: int64 token ids. A batch of prompts of different lengths is left-padded, with
            `padding_mask` `[b, s]` (True at real tokens): each example's positions then
            start at its first real token.
        max_new_tokens: tokens to add (>= 0).
        use_cache: decode one token per step from a key/value cache (True) or recompute the
            whole sequence each step (False).
        temperature: 0 for greedy decoding (argmax), else the softmax temperature.
        top_k: sample among the `top_k` most likely tokens only.
        generator: random generator for sampling.

    Raises:
        ValueError: a prompt that is not `[b, s]` integers, a `padding_mask` of another
            shape or dtype, negative `max_new_tokens` or `temperature`, `top_k < 1`.
    """
    _check(prompt, padding_mask, max_new_tokens, temperature, top_k)
    tokens, mask = prompt, padding_mask
    cache = model.make_cache() if use_cache else None
    with torch.no_grad():
        step_tokens = tokens
        for _ in range(max_new_tokens):
            offset = 0 if cache is None else cache.length
            coords = Sequence(step_tokens.shape[1], offset=offset, causal=True,
                              padding_mask=mask, device=tokens.device)
            logits = model(step_tokens, coords, cache=cache)[:, -1].float()
            nxt = _pick(logits, temperature, top_k, generator)
            tokens = torch.cat((tokens, nxt), dim=1)
            if mask is not None:
                mask = torch.cat((mask, torch.ones_like(nxt, dtype=torch.bool)), dim=1)
            step_tokens = nxt if cache is not None else tokens
    return tokens


def _pick(logits: Tensor, temperature: float, top_k: int | None,
          generator: torch.Generator | None) -> Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)


def _check(prompt: Tensor, mask: Tensor | None, max_new_tokens: int, temperature: float,
           top_k: int | None) -> None:
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.is_floating_point():
        shape = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
        raise ValueError(f"generate: prompt must be [b, s] integer token ids, got {shape}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool
                             or mask.shape != prompt.shape):
        raise ValueError(f"generate: padding_mask must be a bool tensor shaped like the prompt "
                         f"{tuple(prompt.shape)}")
    if mask is not None and not bool(mask.any(dim=-1).all()):
        empty = (~mask.any(dim=-1)).nonzero().flatten().tolist()
        raise ValueError(f"generate: padding_mask marks no real token in example(s) {empty}; "
                         "each prompt needs at least one")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"generate: temperature must be >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"generate: top_k must be an int >= 1, got {top_k!r}")
