"""Building blocks for attention across modalities.

Building blocks for attention across modalities: a decoder layer, Flamingo's gated
cross-attention and Perceiver resampler.

* [`DecoderBlock`][mmpe.cross_blocks.DecoderBlock] — pre-norm self-attention over the decoder's own coordinates, then
  cross-attention to a memory with its own coordinates, then an MLP: the encoder–decoder
  layer (Vaswani et al. 2017) and DETR's decoder (Carion et al. 2020: object queries as
  [`Latents`][mmpe.coords.cross.Latents], image features on a `Grid`).
* [`GatedCrossAttentionBlock`][mmpe.cross_blocks.GatedCrossAttentionBlock] — Flamingo's `tanh`-gated cross-attention and MLP
  inserted before a frozen language model layer (Alayrac et al. 2022, eq. 1 and Fig. 4); the
  gates start at 0, so the block starts as the identity.
* [`PerceiverResampler`][mmpe.cross_blocks.PerceiverResampler] — Flamingo's resampler (Alayrac et al. 2022, §2.1 and Fig. 5):
  learned latents attend to the media features plus a learned embedding of each frame's time
  index, keys being the media tokens and the latents themselves; a fixed number of visual
  tokens comes out whatever the number of frames or patches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from einops import rearrange
from torch import Tensor, nn

from mmpe.attention import CrossAttention, MultiHeadAttention
from mmpe.cache import KVCache
from mmpe.coords.base import Coordinates
from mmpe.coords.cross import Cross, Latents
from mmpe.encodings.base import Encoding


def _mlp(d_model: int, mlp_ratio: float) -> nn.Sequential:
    hidden = int(d_model * mlp_ratio)
    return nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))


class DecoderBlock(nn.Module):
    """`x + SelfAttn(LN x)`, `x + CrossAttn(LN x, memory)`, `x + MLP(LN x)` (pre-norm).

    Args:
        d_model: width of `x`.
        num_heads: heads of both attentions.
        self_encodings: rotary/score/kernel encodings of the self-attention (the decoder's
            coordinates, e.g. RoPE on text, or none for DETR's object queries).
        cross_encodings: encodings of the cross-attention (read `Cross(coords,
            memory_coords)`: positions on both sides for rotary encodings, a distance only
            when both sides share a space).
        kv_dim: width of `memory` (default `d_model`).
        mlp_ratio, dropout: MLP width and residual dropout.

    Shapes: `forward(x [b, n, d_model], coords, memory [b, m, kv_dim], memory_coords,
    cache=None) -> [b, n, d_model]`; `cache` (a [`KVCache`][mmpe.cache.KVCache]) caches the
    self-attention for decoding.
    """

    def __init__(self, d_model: int, num_heads: int, self_encodings: Seq[Encoding] = (),
                 cross_encodings: Seq[Encoding] = (), *, kv_dim: int | None = None,
                 mlp_ratio: float = 4.0, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.self_attn = MultiHeadAttention(d_model, num_heads, self_encodings)
        self.cross_attn = CrossAttention(d_model, num_heads, cross_encodings, kv_dim=kv_dim)
        self.mlp = _mlp(d_model, mlp_ratio)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, coords: Coordinates, memory: Tensor,
                memory_coords: Coordinates, cache: KVCache | None = None) -> Tensor:
        x = x + self.drop(self.self_attn(self.norm1(x), coords, cache))
        # the causal flag of `coords` is the self-attention's: cross-attention has none
        pair = Cross(coords, memory_coords, ignore_causal=True)
        x = x + self.drop(self.cross_attn(self.norm2(x), pair, memory, memory_coords))
        return x + self.drop(self.mlp(self.norm3(x)))


class GatedCrossAttentionBlock(nn.Module):
    """Flamingo's gated cross-attention dense block (Alayrac et al. 2022, Fig. 4).

    `x ← x + tanh(α_attn)·CrossAttn(LN x, media)`, `x ← x + tanh(α_ff)·MLP(LN x)` with
    `α` learned scalars initialised to 0 (`gate_init`), so inserting the block leaves a
    pretrained language model unchanged at the start of training.

    At 0 the gradient of every cross-attention weight is multiplied by `tanh(0) = 0`: only the
    gates themselves learn at first, and their gradient is the correlation of a random
    cross-attention output with the loss gradient. With a frozen, pretrained language model
    and long training (Flamingo) the gates open; a model trained from scratch for a few hundred
    steps may never open them. `gate_init > 0` starts the block partly open.

    Args:
        d_model: width of the text tokens `x`.
        num_heads: heads.
        encodings: cross-attention encodings (none in Flamingo).
        kv_dim: width of the media tokens (default `d_model`).
        mlp_ratio: MLP width.
        gate_init: the initial `α` of both gates (0: Flamingo; must be finite).

    Raises:
        ValueError: a non-finite `gate_init`.

    Shapes: `forward(x [b, n, d_model], coords, media [b, m, kv_dim], media_coords)
    -> [b, n, d_model]`.
    """

    def __init__(self, d_model: int, num_heads: int, encodings: Seq[Encoding] = (), *,
                 kv_dim: int | None = None, mlp_ratio: float = 4.0, gate_init: float = 0.0) -> None:
        super().__init__()
        if not math.isfinite(gate_init):
            raise ValueError(f"GatedCrossAttentionBlock: gate_init must be finite, got {gate_init}")
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.cross_attn = CrossAttention(d_model, num_heads, encodings, kv_dim=kv_dim)
        self.mlp = _mlp(d_model, mlp_ratio)
        self.attn_gate = nn.Parameter(torch.full((), float(gate_init)))
        self.mlp_gate = nn.Parameter(torch.full((), float(gate_init)))

    def forward(self, x: Tensor, coords: Coordinates, media: Tensor,
                media_coords: Coordinates) -> Tensor:
        pair = Cross(coords, media_coords, ignore_causal=True)  # causal: the text's own flag
        x = x + self.attn_gate.tanh() * self.cross_attn(self.norm1(x), pair, media, media_coords)
        return x + self.mlp_gate.tanh() * self.mlp(self.norm2(x))


class PerceiverResampler(nn.Module):
    """Flamingo's Perceiver resampler: `num_latents` visual tokens from any number of frames.

    Media features `[b, T, n, d]` get a learned time embedding per frame (`max_frames`
    rows: Flamingo's only positional information; spatial position comes from the vision
    encoder), are flattened to `T·n` tokens, and `depth` layers update the latents with
    `latents += CrossAttn(LN latents, [media; latents])` and `latents += MLP(LN latents)`.
    Latents have no position ([`Latents`][mmpe.coords.cross.Latents]).

    Args:
        d_model: feature width.
        num_heads: heads.
        depth: layers.
        num_latents: output tokens (64 in Flamingo).
        max_frames: rows of the time embedding (frames per example at most).
        mlp_ratio: MLP width.

    Shapes: `forward(media [b, T, n, d_model] or [b, n, d_model]) -> [b, num_latents,
    d_model]`.

    Raises:
        ValueError: non-positive sizes; `media` of the wrong rank or width, or more than
            `max_frames` frames (naming both numbers).
    """

    def __init__(self, d_model: int, num_heads: int, depth: int = 2, num_latents: int = 64,
                 max_frames: int = 8, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        for arg, value in (("depth", depth), ("num_latents", num_latents),
                           ("max_frames", max_frames)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PerceiverResampler: {arg} must be an int >= 1, got {value!r}")
        self.d_model, self.max_frames = d_model, max_frames
        self.latents = nn.Parameter(torch.randn(num_latents, d_model) * 0.02)
        self.time_embed = nn.Parameter(torch.zeros(max_frames, d_model))
        self.layers = nn.ModuleList(
            nn.ModuleDict({"norm_media": nn.LayerNorm(d_model), "norm_latents": nn.LayerNorm(d_model),
                           "attn": CrossAttention(d_model, num_heads),
                           "norm_mlp": nn.LayerNorm(d_model), "mlp": _mlp(d_model, mlp_ratio)})
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(self, media: Tensor) -> Tensor:
        if media.dim() == 3:
            media = media.unsqueeze(1)
        if media.dim() != 4 or media.shape[-1] != self.d_model:
            raise ValueError(f"PerceiverResampler: media must be [b, T, n, {self.d_model}] or "
                             f"[b, n, {self.d_model}], got {tuple(media.shape)}")
        b, frames = media.shape[:2]
        if frames > self.max_frames:
            raise ValueError(f"PerceiverResampler: {frames} frames but max_frames="
                             f"{self.max_frames} time embeddings")
        media = rearrange(media + self.time_embed[:frames, None], "b t n d -> b (t n) d")
        lat = self.latents.expand(b, -1, -1)
        lat_coords = Latents(lat.shape[1], device=media.device)
        for layer in self.layers:
            keys = torch.cat((layer["norm_media"](media), layer["norm_latents"](lat)), dim=1)
            lat = lat + layer["attn"](layer["norm_latents"](lat), lat_coords, keys,
                                      Latents(keys.shape[1], device=media.device))
            lat = lat + layer["mlp"](layer["norm_mlp"](lat))
        return self.norm(lat)
