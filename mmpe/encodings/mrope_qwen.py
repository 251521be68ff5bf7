"""Interleaved M-RoPE (Qwen3-VL): temporal, height and width frequencies interleaved."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.capabilities import Positioned
from mmpe.encodings.mrope import MRoPE
from mmpe.encodings.rope import apply_rotary, rotation_dtype
from mmpe.registry import register


def default_interleaved_section(head_dim: int) -> tuple[int, int, int]:
    """Qwen3-VL's `mrope_section`: `(24, 20, 20)` at `h_d = 128`.

    Height and width get `5/16` of the `h_d/2` pairs each (rounded down, at least 1), time
    the rest.
    """
    half = head_dim // 2
    hw = max(1, (5 * half) // 16)
    return (half - 2 * hw, hw, hw)


def interleaved_axes(section: tuple[int, int, int]) -> torch.Tensor:
    """Which position id (0 = t, 1 = h, 2 = w) rotates each of the `sum(section)` pairs.

    Pair `j` is height when `j ≡ 1 (mod 3)` and `j < 3·s_h`, width when `j ≡ 2 (mod 3)`
    and `j < 3·s_w`, temporal otherwise (HF transformers' `Qwen3VLTextRotaryEmbedding`).

    Raises:
        ValueError: a section the interleaving cannot realise (the counts of each axis would
            not be `section`; e.g. `3·s_h > h_d/2 + 1`).
    """
    half = sum(section)
    # a setting, counted on the host whatever device the model is built on (meta included)
    j = torch.arange(half, device="cpu")
    axis = torch.zeros(half, dtype=torch.long, device="cpu")
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    counts = tuple(int((axis == a).sum()) for a in range(3))
    if counts != tuple(section):
        raise ValueError(f"mrope_interleaved: mrope_section {tuple(section)} cannot be "
                         f"interleaved over {half} pairs (every 3rd pair from 1 for h, from 2 for "
                         f"w gives {counts}); use h and w sections <= {(half + 1) // 3}")
    return axis


@register(
    "mrope_interleaved", hook="rotary", needs=(Positioned,), learnable=False,
    family="rotary", aliases=("qwen3vl_rope", "interleaved_mrope"),
    paper="Qwen Team 2025, Qwen3-VL Technical Report, Interleaved-MRoPE; reference: HF "
          "transformers Qwen3VLTextRotaryEmbedding", context=("head_dim",))
class InterleavedMRoPE(MRoPE):
    """M-RoPE whose temporal, height and width frequencies are interleaved (Qwen3-VL).

    Qwen2-VL's [`mrope`][mmpe.encodings.mrope.MRoPE] gives each of t, h, w a contiguous band of
    frequencies (t the highest, w the lowest); Qwen3-VL interleaves them so every axis spans
    the whole spectrum: pair `j` (frequency `θ_j = base^(−2j/h_d)`) rotates by the height
    id when `j ≡ 1 (mod 3)` and `j < 3·s_h`, by the width id when `j ≡ 2 (mod 3)` and
    `j < 3·s_w`, and by the temporal id otherwise
    ([`interleaved_axes`][mmpe.encodings.mrope_qwen.interleaved_axes]). Pairs are
    `(j, j + h_d/2)` (HF's `rotate_half`). Position ids are those of `mrope` (Qwen3-VL's
    `get_rope_index` is Qwen2-VL's, with each video frame its own `(1, H, W)` segment after a
    timestamp text: give the frames as separate segments of a
    [`Composite`][mmpe.coords.composite.Composite]). Text tokens `(p, p, p)` get plain 1D RoPE.

    Equals HF transformers' `Qwen3VLTextRotaryEmbedding` + `apply_rotary_pos_emb`
    (`tests/encodings/test_vlm_rope.py`).

    Args:
        head_dim: `h_d` (even).
        mrope_section: pairs per axis `(s_t, s_h, s_w)` summing to `h_d/2`, with
            `3·s_h, 3·s_w ≤ h_d/2 + 1`; default
            [`default_interleaved_section`][mmpe.encodings.mrope_qwen.default_interleaved_section]
            (`(24, 20, 20)` at `h_d = 128`, Qwen3-VL's).
        base: frequency base (Qwen3-VL: `rope_theta = 5e6`; default 10000).

    Raises:
        ValueError: odd `head_dim`, a section that does not sum to `h_d/2`, has negative
            entries or cannot be interleaved, grids of more than 3 axes.
    """

    def __init__(self, head_dim: int, mrope_section: tuple[int, int, int] | None = None,
                 base: float = 10000.0) -> None:
        if mrope_section is None and head_dim > 0 and head_dim % 2 == 0:
            mrope_section = default_interleaved_section(head_dim)
        super().__init__(head_dim, mrope_section, base)
        here = torch.empty(0).device  # the device the model is built on (meta included)
        self.register_buffer("axis", interleaved_axes(self.mrope_section).to(here),
                             persistent=False)

    def _rotate(self, x: Tensor, phase: Tensor) -> Tensor:
        # float64 phases reduced mod 2π, tables in the input's rotation dtype (float64 stays
        # float64; bf16/fp16 rotate in their own dtype, as RoPE)
        phase = torch.remainder(phase, 2 * math.pi)
        dtype = rotation_dtype(x.dtype)
        return apply_rotary(x, phase.cos().to(dtype), phase.sin().to(dtype), False)
