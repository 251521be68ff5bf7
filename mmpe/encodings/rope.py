"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer)."""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import (
    CachedDecodingError,
    RotaryEncoding,
    check_qk,
    position_bound,
    rotary_positions,
)
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int


def rope_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """``θ_i = base^(−2i/d)`` for ``i = 0 … d/2−1``, float64 (radians per token).

    Raises:
        TypeError/ValueError: ``rotary_dim`` not a positive even int, ``base`` not a finite
            number > 1.
    """
    if not torch.compiler.is_compiling():  # checked eagerly; a traced base may be symbolic
        check_int("rope_inv_freq", "rotary_dim", rotary_dim, 2)
        if rotary_dim % 2:
            raise ValueError(f"rope_inv_freq: rotary_dim must be even (channel pairs), got "
                             f"{rotary_dim}")
        check_finite_float("rope_inv_freq", "base", base, low=1.0, low_open=True)
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """``cos(m·θ_i)`` and ``sin(m·θ_i)`` for positions ``m``, each ``[*positions.shape, d/2]``.

    The phase ``m·θ`` is formed and reduced modulo 2π in float64, then cos/sin are returned in
    float32. Building positions in the input's dtype would round them (bf16 turns 257 into
    256), and a float32 phase is off by ~0.5 rad at m = 10⁷.
    """
    phase = positions.to(torch.float64).unsqueeze(-1) * inv_freq.to(positions.device)
    phase = torch.remainder(phase, 2 * math.pi)
    return (phase.cos() * scale).to(torch.float32), (phase.sin() * scale).to(torch.float32)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                 layout: str = "bhsd") -> Tensor:
    """Rotate the first ``2·cos.shape[-1]`` channels of ``x`` pairwise.

    ``x`` is ``[b, n_h, s, h_d]`` (``layout="bhsd"``, PyTorch's SDPA/FlexAttention layout) or
    ``[b, s, n_h, h_d]`` (``layout="bshd"``, flash-attn's and HF's projection layout);
    ``cos``/``sin`` are ``[s, r/2]`` or ``[b, s, r/2]`` (or already broadcastable to ``x``'s
    rank). With ``interleaved`` the pairs are channels ``(2i, 2i+1)`` (RoFormer, GPT-J);
    otherwise ``(i, i + r/2)`` (GPT-NeoX, Llama, HF). The product is taken in at least float32
    and cast back to ``x.dtype``.

    Raises:
        ValueError: an unknown ``layout``, ``x`` not rank 4, or more rotated channels than
            ``x`` has.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"apply_rotary: layout must be 'bhsd' or 'bshd', got {layout!r}")
    if x.dim() != 4:
        raise ValueError(f"apply_rotary: x must be rank 4 ({layout}), got {tuple(x.shape)}")
    half = cos.shape[-1]
    if 2 * half > x.shape[-1]:
        raise ValueError(f"apply_rotary: cos/sin rotate {2 * half} channels but x has "
                         f"{x.shape[-1]}")
    rot = x[..., : 2 * half]
    if cos.dim() == 3:  # per-example positions [b, s, r/2]: insert the head axis
        axis = 1 if layout == "bhsd" else 2
        cos, sin = cos.unsqueeze(axis), sin.unsqueeze(axis)
    elif cos.dim() == 2 and layout == "bshd":  # [s, r/2] against [b, s, n_h, r]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = rot.to(torch.promote_types(x.dtype, torch.float32))
    if interleaved:
        pairs = rearrange(rot, "... (r two) -> ... r two", two=2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleaved:
        out = rearrange(torch.stack((y1, y2), dim=-1), "... r two -> ... (r two)")
    else:
        out = torch.cat((y1, y2), dim=-1)
    out = out.to(x.dtype)
    if 2 * half == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 2 * half :]), dim=-1)


@register(
    "rope", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    paper="Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding "
          "(arXiv:2104.09864), eq. 34", context=("head_dim",))
class RoPE(SavesSettings, RotaryEncoding):
    """Rotary position embedding (Su et al. 2021, eq. 34).

    Each channel pair ``(x_{2i}, x_{2i+1})`` of a query at position ``m`` is rotated by the angle
    ``m·θ_i`` with ``θ_i = base^(−2i/d)`` (radians per token), keys likewise at ``n``; the score
    ``q_mᵀ k_n`` then depends on positions only through ``m − n``.

    Args:
        head_dim: ``h_d`` of the queries and keys.
        base: frequency base (10000 in the paper; 500000 in Llama 3).
        rotary_dim: channels rotated (even, ≤ ``head_dim``; partial rotary as in GPT-NeoX);
            defaults to ``head_dim``.
        interleaved: pair adjacent channels as in the paper (True) or split halves as in
            GPT-NeoX / Llama / HF transformers (False, default).

    Shapes: ``forward(q [b, n_h, n_q, h_d], k [b, n_h, n_k, h_d], coords) -> (q, k)`` in the
    inputs' dtype. Queries use ``coords.query_positions``, keys ``coords.key_positions`` (so a
    cached decoder rotates new queries at ``offset + i``).

    Raises:
        ValueError: odd ``rotary_dim``/``head_dim``, ``rotary_dim > head_dim``, ``base <= 1``,
            or q/k that are not rank 4 with ``h_d = head_dim``.

    Subclasses (position interpolation, NTK, YaRN …) override :meth:`inv_freq` and
    :attr:`attention_scaling`.
    """

    #: what changes the rotation without being a tensor: saved in the state_dict and checked
    #: on load (:mod:`mmpe.encodings._state`); the scalings extend it.
    saved_settings = ("base", "rotary_dim", "interleaved")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rope: head_dim must be a positive even int, got {head_dim}")
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(
                f"rope: rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}"
            )
        if base <= 1:
            raise ValueError(f"rope: base must be > 1, got {base}")
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, float(base)
        self.interleaved = interleaved
        #: multiplies cos and sin (so the logits by its square); YaRN's temperature uses it.
        self.attention_scaling = 1.0
        # cos/sin table for positions 0..size-1, built once in float64 and gathered by position.
        self._cache: tuple[object, Tensor, Tensor] | None = None

    def inv_freq(self, seq_len: int) -> Tensor:
        """Angular frequencies ``θ_i`` (radians per token), float64, ``[rotary_dim/2]``.

        ``seq_len`` (tokens seen by this call) lets dynamic scaling methods adapt.
        """
        return rope_inv_freq(self.rotary_dim, self.base)  # rotary_dim/2 values: not worth a cache

    #: positions up to this many are served from the cached table; larger ones are computed.
    cache_limit = 1 << 16

    def freq_key(self, seq_len: int) -> object:
        """What the frequencies depend on besides the constructor's arguments: nothing for
        fixed-frequency RoPE; dynamic scalings return the length they adapt to. The cos/sin
        table is rebuilt when it changes (and when the device or the scaling changes)."""
        return None

    def cos_sin(self, positions: Tensor, inv_freq: Tensor, top: int) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` of ``positions`` (``top`` = max position + 1) from the cached table."""
        scale = self.attention_scaling
        if positions.is_floating_point() or top > self.cache_limit or \
                torch.compiler.is_compiling():  # a compiled graph computes them, no side effect
            return rope_cos_sin(positions, inv_freq, scale)
        key = (self.freq_key(top), scale, positions.device, self.base, self.rotary_dim,
               getattr(self, "factor", None))
        cache = self._cache
        if cache is None or cache[0] != key or cache[1].shape[0] < top:
            size = max(256, 1 << (top - 1).bit_length())
            cos, sin = rope_cos_sin(torch.arange(size, device=positions.device), inv_freq, scale)
            cache = self._cache = (key, cos, sin)
        return cache[1][positions], cache[2][positions]

    def _check_cached(self, coords: Coordinates, top: int) -> None:
        """Refuse cached steps past the length where a length-dependent scaling switches on:
        its frequencies then depend on the total length, so the hidden states of earlier
        tokens (computed at a shorter length) differ from a full recomputation's."""
        limit = getattr(self, "original_max_position_embeddings", None)
        cached_step = coords.num_keys > coords.num_queries
        if self.length_dependent and limit is not None and top > limit and cached_step:
            name = getattr(self, "registry_name", type(self).__name__)
            raise CachedDecodingError(
                f"{name}: cached decoding past original_max_position_embeddings={limit} "
                f"tokens (now {top}) is not exact: the rotation of every token depends on the "
                "total length; decode without a cache (generate(..., use_cache=False))")

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope", q, k, self.head_dim, coords)
        qpos, kpos = (p[..., 0] for p in rotary_positions(coords, k))
        top = position_bound(coords)
        self._check_cached(coords, top)
        inv_freq = self.inv_freq(top)
        qcos, qsin = self.cos_sin(qpos, inv_freq, top)
        kcos, ksin = self.cos_sin(kpos, inv_freq, top)
        return (apply_rotary(q, qcos, qsin, self.interleaved),
                apply_rotary(k, kcos, ksin, self.interleaved))
