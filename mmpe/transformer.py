"""A small pre-norm transformer stack built on :class:`mmpe.attention.MultiHeadAttention`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import Tensor, nn

from mmpe.attention import MultiHeadAttention
from mmpe.cache import KVCache, ModelCache
from mmpe.context import check_context
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import Encoding, InputEncoding
from mmpe.prepare import forward_scope
from mmpe.registry import build

EncodingSpec = str | Mapping[str, Any] | Encoding


def build_encodings(specs: Seq[EncodingSpec], **context: Any) -> list[Encoding]:
    """Build each spec (registry name, config dict, or an already built module).

    ``context`` (keys of :data:`mmpe.context.CONTEXT_KEYS`) fills the options each encoding
    declares and the spec does not set.
    """
    if isinstance(specs, (str, Mapping, Encoding)):
        raise TypeError(f"encodings must be a list of encodings (names, config dicts or built "
                        f"modules), got a single {type(specs).__name__} {specs!r}: write [{specs!r}]")
    built = [s if isinstance(s, Encoding) else build(s, context=context) for s in specs]
    _warn_duplicates(built)
    return built


def _check_input(x: Tensor, weight: Tensor) -> None:
    """Type and dtype of the model input (its width may change: input encodings concatenate)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"transformer: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"transformer: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"transformer: x must be [b, s, d], got {tuple(x.shape)}")
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"transformer: x is {x.dtype} but the model's weights are "
                        f"{weight.dtype}; cast one to the other or run under torch.autocast")


def _warn_duplicates(encodings: Seq[Encoding]) -> None:
    """Two rotary or two input encodings of one kind apply position twice: almost always a
    configuration mistake (RoPE on RoPE rotates by twice the angle)."""
    seen: dict[tuple[str, str], int] = {}
    for enc in encodings:
        if enc.hook in ("rotary", "input"):
            key = (enc.hook, getattr(enc, "registry_name", type(enc).__name__))
            seen[key] = seen.get(key, 0) + 1
    for (hook, name), count in seen.items():
        if count > 1:
            warnings.warn(f"{count} {hook} encodings {name!r} in one model: position is applied "
                          f"{count} times", UserWarning, stacklevel=3)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x))`` then ``x + MLP(LN(x))`` (GELU MLP).

    Shapes: ``forward(x [b, s, d_model], coords) -> [b, s, d_model]``.
    """

    def __init__(self, d_model: int, num_heads: int, encodings: Seq[Encoding] = (),
                 mlp_ratio: float = 4.0, dropout: float = 0.0, backend: str = "auto",
                 num_kv_heads: int | None = None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, encodings, backend=backend,
                                       num_kv_heads=num_kv_heads)
        self.norm2 = nn.LayerNorm(d_model)
        hidden = int(d_model * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, coords: Coordinates, cache: KVCache | None = None) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), coords, cache))
        return x + self.drop(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """Encoder or decoder stack (causality comes from the coordinates) with any encodings.

    Input encodings are applied once to the embeddings; rotary, score and kernel encodings
    enter every layer's attention. By default one set of attention encodings is shared by all
    layers, as T5 shares its relative bias; ``share_encodings=False`` gives each layer its own.

    Args:
        d_model: width.
        num_heads: ``n_h``.
        depth: number of blocks.
        encodings: registry names, config dicts or built encodings.
        mlp_ratio, dropout, backend, num_kv_heads: per block (see :class:`MultiHeadAttention`).
        share_encodings: share attention encodings across layers.
        encoding_context: model-wide values for building encodings, keys of
            :data:`mmpe.context.CONTEXT_KEYS` (e.g. ``max_len``,
            ``original_max_position_embeddings``, ``grid_shape``); ``d_model``, ``num_heads``
            and ``head_dim`` are filled in.

    Raises:
        TypeError: ``encodings`` given as a single name/config/module instead of a list.
        ValueError: ``depth < 1``; an unknown context key or an invalid context value.

    Shapes: ``forward(x [b, s, d_model], coords, cache=None) -> [b, s, d_model]`` (final
    LayerNorm applied). For cached decoding pass ``cache = model.make_cache()`` and, each step,
    coordinates with ``offset = cache.length`` (see :mod:`mmpe.cache`). Position-derived
    tensors (rotary tables, shared biases, masks) are computed once per forward and shared by
    the layers (:mod:`mmpe.prepare`).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        depth: int,
        encodings: Seq[EncodingSpec] = (),
        *,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        backend: str = "auto",
        share_encodings: bool = True,
        encoding_context: Mapping[str, Any] | None = None,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"transformer: depth must be >= 1, got {depth}")
        context = check_context({"d_model": d_model, "num_heads": num_heads,
                                 "head_dim": d_model // num_heads, **(encoding_context or {})},
                                "Transformer(encoding_context=...)")
        built = build_encodings(encodings, **context)
        self.input_encodings = nn.ModuleList(e for e in built if isinstance(e, InputEncoding))
        specs = [s for s, e in zip(encodings, built, strict=True) if not isinstance(e, InputEncoding)]
        shared = [e for e in built if not isinstance(e, InputEncoding)]

        def layer_encodings() -> list[Encoding]:
            return shared if share_encodings else build_encodings(specs, **context)

        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, num_heads, layer_encodings(), mlp_ratio, dropout, backend,
                             num_kv_heads)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, coords: Coordinates, cache: ModelCache | None = None) -> Tensor:
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"transformer: cache has {len(cache)} layers, the model "
                             f"{len(self.blocks)}; make it with model.make_cache()")
        _check_input(x, self.norm.weight)
        with forward_scope(coords):
            for enc in self.input_encodings:
                x = enc.combine(x, coords)
            for i, block in enumerate(self.blocks):
                x = block(x, coords, None if cache is None else cache[i])
        return self.norm(x)

    def make_cache(self) -> ModelCache:
        """An empty key/value cache with one :class:`~mmpe.cache.KVCache` per layer."""
        return ModelCache(len(self.blocks))
