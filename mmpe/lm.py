"""A small causal language model around [`mmpe.Transformer`][mmpe.transformer.Transformer], for generation and tests."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import Tensor, nn

from mmpe.cache import ModelCache
from mmpe.coords.sequence import Sequence
from mmpe.transformer import EncodingSpec, Transformer


class CausalLM(nn.Module):
    """Token embedding → causal [`Transformer`][mmpe.transformer.Transformer] → logits.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, depth, encodings: as [`Transformer`][mmpe.transformer.Transformer].
        **transformer_options: further [`Transformer`][mmpe.transformer.Transformer] options
            (`num_kv_heads`, `context`, `mlp_ratio` …).

    Shapes: `forward(tokens [b, s] int64, coords=None, cache=None) -> logits [b, s, vocab]`;
    `coords` defaults to `Sequence(s, offset=cache.length, causal=True)`.

    Raises:
        ValueError: `vocab_size < 1`; `tokens` not `[b, s]` integers.
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, depth: int,
                 encodings: Seq[EncodingSpec] = (), *,
                 context: Mapping[str, Any] | None = None,
                 **transformer_options: Any) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"CausalLM: vocab_size must be an int >= 1, got {vocab_size!r}")
        self.embed = nn.Embedding(vocab_size, d_model)
        self.transformer = Transformer(d_model, num_heads, depth, encodings,
                                       context=context, **transformer_options)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: Tensor, coords: Sequence | None = None,
                cache: ModelCache | None = None) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"CausalLM: tokens must be [b, s] integer ids, got {shape}")
        if tokens.device.type == "cpu" and tokens.numel() and not torch.compiler.is_compiling():
            # nn.Embedding says only "index out of range in self". Checked on the CPU only:
            # on a GPU the check would synchronise every step (CUDA asserts in the kernel).
            low, high = int(tokens.min()), int(tokens.max())
            if low < 0 or high >= self.embed.num_embeddings:
                raise ValueError(f"CausalLM: tokens must be ids in [0, vocab_size="
                                 f"{self.embed.num_embeddings}), got ids in [{low}, {high}]")
        if coords is None:
            offset = 0 if cache is None else cache.length
            coords = Sequence(tokens.shape[1], offset=offset, causal=True, device=tokens.device)
        return self.head(self.transformer(self.embed(tokens), coords, cache=cache))

    def make_cache(self) -> ModelCache:
        """An empty key/value cache for `forward` (see [`mmpe.cache`][mmpe.cache])."""
        return self.transformer.make_cache()
