"""FIRE's `score_mod` as the linear pieces of its MLP (the form FlexAttention compiles).

FIRE's `f_θ` is `1 → W → n_h` with a ReLU: piecewise linear in its one input, with at most
`W + 1` pieces between the breakpoints `−b₁/w₁` (`FIRE.pieces`). The kernel then counts the
breakpoints below a score's normalised distance `x` (comparisons with a tensor that takes no
gradient) and reads that piece's slope and intercept for its head: two reads of tensors that
take a gradient per score, where the hidden layer unrolled into scalar code read `3W + 1`.
Compiled FlexAttention turns every such read into an atomic add per (query, key) pair in its
backward, and with one `[n_h]` tensor per hidden unit every pair of a head added into the same
address: FIRE's GPU training (H100, run 3: 188 s for the main job's text model against 22 s
for ALiBi) and its compilation (over 100 s at 4,096 tokens on an H200, run 4) were that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mmpe.encodings._captured import per_head

if TYPE_CHECKING:
    from mmpe.encodings.base import AttentionContext, ScoreMod
    from mmpe.encodings.fire import FIRE


def piecewise_score_mod(enc: FIRE, ctx: AttentionContext) -> ScoreMod:
    """`score + slope[p, h]·x + intercept[p, h]`, `p` the piece of `x = ψ(i − j)/ψ(max(L, i))`:
    FIRE's term, equal to the MLP's up to rounding, with gradients to `c`, `L` and every MLP
    parameter (through `x` and through the pieces' autograd graph, built once per call)."""
    n_h = enc.num_heads
    c, threshold = per_head(enc.c.float(), n_h), per_head(enc._threshold(), n_h)
    slope, intercept, cuts = enc.pieces()  # [W + 1, n_h], [W + 1, n_h], [W] sorted, no grad
    slope, intercept = slope.reshape(-1), intercept.reshape(-1)  # read at piece · n_h + h
    width = cuts.shape[0]

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        x = enc.normalised_distance(ctx, q_idx, kv_idx, b, c[h], threshold[h])
        piece = torch.zeros_like(h)
        for u in range(width):  # the breakpoints below x: searchsorted, unrolled
            piece = piece + (x > cuts[u]).to(h.dtype)
        at = piece * n_h + h
        return score + (slope[at] * x + intercept[at])

    return mod
