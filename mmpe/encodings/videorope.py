"""VideoRoPE: low-frequency temporal allocation of a 3D (t, h, w) rotary embedding."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.capabilities import Positioned
from mmpe.encodings.mrope import MRoPE, default_mrope_section
from mmpe.encodings.rope import apply_rotary, rotation_dtype
from mmpe.registry import register


def videorope_axes(head_dim: int, temporal_pairs: int) -> torch.Tensor:
    """Which position id (0 = t, 1 = h, 2 = w) rotates each of the `h_d/2` pairs.

    With `S = h_d/2 − temporal_pairs` spatial pairs: pair `j < S` is height for even `j`,
    width for odd `j` (x and y interleaved over the high frequencies); pairs `j ≥ S` (the
    lowest frequencies `θ_j = base^(−2j/h_d)`) are temporal.
    """
    half = head_dim // 2
    spatial = half - temporal_pairs
    j = torch.arange(half)
    axis = torch.where(j % 2 == 0, 1, 2)
    axis[spatial:] = 0
    return axis.long()


@register(
    "videorope", hook="rotary", needs=(Positioned,), learnable=False, family="rotary",
    aliases=("video_rope",),
    paper="Wei et al. 2025, VideoRoPE: What Makes for Good Video Rotary Position Embedding? "
          "(arXiv:2502.05173): Low-frequency Temporal Allocation, Diagonal Layout, Adjustable "
          "Temporal Spacing; reference code Wiselnn570/VideoRoPE", context=("head_dim",))
class VideoRoPE(MRoPE):
    """3D RoPE with the temporal id on the lowest frequencies (VideoRoPE, Wei et al. 2025).

    Of the `h_d/2` pairs (frequencies `θ_j = base^(−2j/h_d)`, decreasing in `j`), the last
    `temporal_pairs` — the lowest frequencies — rotate by the temporal id `t`, and the first
    `S = h_d/2 − temporal_pairs` alternate between the height id (even `j`) and the width
    id (odd `j`) ([`videorope_axes`][mmpe.encodings.videorope.videorope_axes]): the paper's
    "Low-frequency Temporal Allocation" (LTA), the reference's
    `apply_m_modify_multimodal_rotary_pos_emb`. Low temporal frequencies have long periods, so
    the temporal part of a score does not oscillate over long videos (the paper's
    "distractor" argument against M-RoPE's high-frequency temporal band). Pairs are
    `(j, j + h_d/2)` (HF's `rotate_half`).

    The diagonal layout and the adjustable temporal spacing δ are the position ids'
    business: use [`VideoRoPEComposite`][mmpe.coords.vlm.VideoRoPEComposite]. On a
    [`Composite`][mmpe.coords.composite.Composite] (Qwen2-VL ids) this is M-RoPE with LTA
    alone; on a sequence `(p, p, p)` it is plain 1D RoPE (the pairs' frequencies are
    unchanged, only which id rotates them).

    Args:
        head_dim: `h_d` (even, ≥ 6).
        temporal_pairs: pairs given to time (default: Qwen2-VL's temporal section,
            [`default_mrope_section`][mmpe.encodings.mrope.default_mrope_section]`(h_d)[0]`,
            16 at `h_d = 128`, as the paper's Qwen2-VL based models).
        base: frequency base (Qwen2-VL: `rope_theta = 1e6`; default 10000).

    Shapes: `forward(q [b, n_h, n, h_d], k [b, n_kv, s_k, h_d], coords) -> (q, k)` with
    positions `[n, 3]` `(t, h, w)` (1 axis is repeated, 2 axes get `t = 0`, as `mrope`).

    Raises:
        ValueError: odd `head_dim`, `temporal_pairs` outside `[1, h_d/2 − 2]`, grids of more
            than 3 axes, bad q/k shapes.
    """

    def __init__(self, head_dim: int, temporal_pairs: int | None = None,
                 base: float = 10000.0) -> None:
        if head_dim <= 0 or head_dim % 2 or head_dim < 6:
            raise ValueError(f"videorope: head_dim must be an even int >= 6 (a pair each for t, "
                             f"h and w), got {head_dim}")
        half = head_dim // 2
        if temporal_pairs is None:
            temporal_pairs = default_mrope_section(head_dim)[0]
        if isinstance(temporal_pairs, bool) or not isinstance(temporal_pairs, int) or not (
                1 <= temporal_pairs <= half - 2):
            raise ValueError(f"videorope: temporal_pairs must be an int in [1, h_d/2 - 2 = "
                             f"{half - 2}] (at least one pair for each of h and w), got "
                             f"{temporal_pairs!r}")
        spatial = half - temporal_pairs
        super().__init__(head_dim, (temporal_pairs, (spatial + 1) // 2, spatial // 2), base)
        self.temporal_pairs = temporal_pairs
        self.register_buffer("axis", videorope_axes(head_dim, temporal_pairs), persistent=False)

    def _rotate(self, x: Tensor, phase: Tensor) -> Tensor:
        # float64 phases reduced mod 2π, tables in the input's rotation dtype (float64 stays
        # float64; bf16/fp16 rotate in their own dtype, as RoPE)
        phase = torch.remainder(phase, 2 * math.pi)
        dtype = rotation_dtype(x.dtype)
        return apply_rotary(x, phase.cos().to(dtype), phase.sin().to(dtype), False)
