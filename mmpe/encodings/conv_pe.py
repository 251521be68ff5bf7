"""wav2vec 2.0's convolutional relative position embedding (Baevski et al. 2020, §2)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Capability, GridLayout, Positioned1D, missing
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register
from mmpe.validation import check_int


class FrameAxis(Capability):
    """Tokens on a regular axis of frames that a convolution may slide along (time).

    Provided by a non-causal line of tokens (`Positioned1D` with `causal` not true: a
    bidirectional encoder's frame sequence) and by any `GridLayout` (its time axis: the axis
    named `"t"`, else axis 0 — a `(t, f)` spectrogram grid, a `(t, h, w)` video grid).
    A causal decoder does not qualify: the convolution reads future frames.
    """

    members = ("query_positions", "num_axes")

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        if not missing(coords, GridLayout):
            return []
        if missing(coords, Positioned1D):
            return ["num_axes == 1 or GridLayout (a line of frames, or a grid with a time axis)"]
        if not isinstance(coords, type) and getattr(coords, "causal", False) is True:
            return ["causal == False (the convolution reads future frames)"]
        return []


def fairseq_conv_pe(x: Tensor, weight: Tensor, bias: Tensor, groups: int) -> Tensor:
    """`GELU(SamePad(conv1d(x, W, padding=K//2, groups)))` on `x` `[b, d, T]` → `[b, d, T]`.

    fairseq's `pos_conv`: zero padding `K//2` on both sides, and with an even kernel the
    last output frame (one past the input) dropped (`SamePad`), so output frame `t` reads
    input frames `t − K/2 … t + K/2 − 1`.
    """
    k = weight.shape[-1]
    out = F.conv1d(x, weight, bias, padding=k // 2, groups=groups)
    if k % 2 == 0:
        out = out[..., :-1]
    return F.gelu(out)


@register(
    "conv_pe", hook="input", needs=(FrameAxis,), learnable=True, family="relative",
    aliases=("wav2vec2_conv_pos", "conv_pos"),
    paper="Baevski et al. 2020, wav2vec 2.0: A Framework for Self-Supervised Learning of Speech "
          "Representations (NeurIPS), §2 / §4.2 (relative positional embedding by convolution, "
          "kernel 128, 16 groups); Hsu et al. 2021, HuBERT",
    context=("d_model",))
class ConvPositionalEmbedding(InputEncoding):
    """`x + GELU(WeightNorm(Conv1d_{K, G})(x))` along the frame axis (wav2vec 2.0, HuBERT).

    wav2vec 2.0 (Baevski et al. 2020, §2) adds no absolute positions: its context network
    starts with "a convolutional layer similar to (Mohamed et al. 2019) which acts as relative
    positional embedding" — a grouped 1D convolution over the frame sequence (kernel `K = 128`,
    `G = 16` groups, weight normalisation over the kernel axis), a GELU, and the result added
    to the input ([`fairseq_conv_pe`][mmpe.encodings.conv_pe.fairseq_conv_pe]; fairseq's `pos_conv`, HF's
    `Wav2Vec2PositionalConvEmbedding`). Initialisation as fairseq:
    `W ~ N(0, 4/(K·d))`, bias 0, then weight norm with `dim=2`.

    The term depends on the token content, so this input encoding acts in [`combine`][mmpe.encodings.conv_pe.ConvPositionalEmbedding.combine]
    (`x [b, n, d_model]`, as `mmpe.Transformer` calls it); `forward`, which receives
    only coordinates, raises. The term is translation-equivariant along the frames (shifting
    the input shifts it) and reaches `±K/2` frames.

    On a sequence (`Sequence(n)`, non-causal) the frames are the tokens in order (padded
    frames, `padding_mask` False, are zeroed before the convolution, as fairseq does). On a
    grid the convolution slides along the time axis (named `"t"`, else axis 0) of every other
    row separately — each frequency bin of a `(t, f)` spectrogram grid convolved over time,
    with the same kernel; prefix tokens (cls) are left unchanged.

    Args:
        d_model: width `d`, divisible by `groups`.
        kernel_size: `K` (128 in wav2vec 2.0 / HuBERT; an even kernel drops the last frame).
        groups: `G` (16).

    Shapes: `combine(x [b, n, d_model], coords) -> [b, n, d_model]`.

    Raises:
        ValueError: `d_model` not a positive multiple of `groups`, non-positive
            `kernel_size`/`groups`; `x` not `[b, n, d_model]` with the coordinates'
            `n`; a cached (offset) or document-packed sequence.
        TypeError: `forward(coords)` (use `combine`); coordinates without a frame axis.
    """

    shard_refusal = ("its convolution reads the inputs of neighbouring tokens, which lie on "
                     "other ranks at a shard's edges (it would need a halo exchange)")

    def __init__(self, d_model: int, kernel_size: int = 128, groups: int = 16) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("kernel_size", kernel_size), ("groups", groups)):
            check_int("conv_pe", arg, val)
        if d_model % groups:
            raise ValueError(f"conv_pe: d_model={d_model} must be divisible by groups={groups}")
        self.d_model, self.kernel_size, self.groups = d_model, kernel_size, groups
        conv = nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2, groups=groups)
        nn.init.normal_(conv.weight, mean=0.0, std=math.sqrt(4.0 / (kernel_size * d_model)))
        nn.init.zeros_(conv.bias)
        self.conv = weight_norm(conv, name="weight", dim=2)

    def forward(self, coords: Coordinates) -> Tensor:
        raise TypeError("conv_pe: the convolutional position embedding is computed from the "
                        "token embeddings, not from coordinates alone; call "
                        "conv_pe.combine(x, coords) (mmpe.Transformer does)")

    def _conv(self, frames: Tensor) -> Tensor:
        """`[B, d, T]` → `[B, d, T]` through the weight-normalised convolution and GELU."""
        out = self.conv(frames)
        if self.kernel_size % 2 == 0:
            out = out[..., :-1]
        return F.gelu(out)

    def term(self, x: Tensor, coords: Coordinates) -> Tensor:
        """The added term `GELU(conv(x))` `[b, n, d_model]` (0 at a grid's prefix tokens)."""
        self.check_coords(coords)
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[1] != coords.num_queries \
                or x.shape[2] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"conv_pe: x must be [b, {coords.num_queries}, {self.d_model}] "
                             f"(batch, the coordinates' tokens, d_model), got {shape}")
        h = x.to(self.conv.parametrizations.weight.original1.dtype)
        if isinstance(coords, GridLayout):
            return self._grid_term(h, coords)
        return self._sequence_term(h, coords)

    def _sequence_term(self, x: Tensor, coords: Coordinates) -> Tensor:
        if coords.num_keys != coords.num_queries:
            raise ValueError("conv_pe: cached decoding (keys beyond the queries) is not "
                             "supported: the convolution needs every frame")
        if getattr(coords, "document_ids", None) is not None:
            raise ValueError("conv_pe: packed documents (document_ids) would be convolved across "
                             "document boundaries; run one sequence per row")
        mask = coords.key_mask
        if mask is not None:
            x = x * mask.to(x.device).unsqueeze(-1).to(x.dtype)
        return self._conv(x.transpose(1, 2)).transpose(1, 2)

    def _grid_term(self, x: Tensor, coords: Coordinates) -> Tensor:
        shape, prefix = tuple(coords.shape), coords.prefix_tokens
        axes = tuple(getattr(coords, "axes", ()) or ())
        t_axis = axes.index("t") if "t" in axes else 0
        b, d = x.shape[0], x.shape[-1]
        cells = x[:, prefix:].reshape(b, *shape, d)
        # [b, *shape, d] -> [b, *others, d, T] -> [b·others, d, T]
        order = [0] + [1 + a for a in range(len(shape)) if a != t_axis] + [len(shape) + 1, 1 + t_axis]
        moved = cells.permute(order)
        out = self._conv(moved.reshape(-1, d, shape[t_axis])).reshape(moved.shape)
        inverse = [order.index(i) for i in range(len(order))]
        out = out.permute(inverse).reshape(b, -1, d)
        return torch.cat((out.new_zeros(b, prefix, d), out), dim=1)

    def combine(self, x: Tensor, coords: Coordinates) -> Tensor:
        """`x + GELU(conv(x))` along the frame axis (wav2vec 2.0's context-network input)."""
        return x + self.term(x, coords).to(x.dtype)
