"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Directed
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_qk,
)
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.registry import register


def clipped_relative_index(ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor, b: Tensor,
                           k: int) -> Tensor:
    """Row of a `(2k+1)`-row table for each pair: `clip(j − i, −k, k) + k` (positions, tokens)."""
    rel = -ctx.coords.relation(q_idx, kv_idx, b)  # key − query, Shaw's j − i
    return rel.clamp(-k, k) + k


@register(
    "shaw", hook="score", needs=(Directed,), learnable=True, family="relative",
    aliases=("relative_shaw",),
    paper="Shaw, Uszkoreit & Vaswani 2018, Self-Attention with Relative Position "
          "Representations (NAACL), eqs. 3-4", context=("head_dim",))
class ShawRelative(ContentScoreEncoding):
    """Learned relative-position vectors on keys (and optionally values), Shaw et al. 2018.

    `e_ij = q_i · (k_j + a^K_ij) / sqrt(h_d)` (eq. 4) and, with `values=True`,
    `z_i = Σ_j α_ij (v_j + a^V_ij)` (eq. 3), where `a_ij = w_{clip(j − i, k)}` and
    `clip(x, k) = max(−k, min(k, x))`: a table of `2k+1` vectors of size `h_d`, shared by
    the heads as in the paper. `j − i` is in tokens (key position minus query position).

    Efficient form (the paper's §3.3): `q · wᵀ` is computed once, `[b, n_h, n_q, 2k+1]`,
    and each pair gathers its entry — no `n×n×h_d` tensor. The value term sums the
    probabilities per clipped offset (`[b, n_h, n_q, 2k+1]`) and multiplies by `w^V`.

    Args:
        head_dim: `h_d`.
        max_relative_position: the clipping distance `k` (tokens, ≥ 1; 16 here, the paper
            found k ≥ 2 enough for translation).
        values: also add the value-side term (runs on the explicit "math" attention path).

    Raises:
        ValueError: `max_relative_position < 1` or `head_dim < 1`; q/k missing from the
            attention context.
    """

    def __init__(self, head_dim: int, max_relative_position: int = 16, values: bool = False) -> None:
        super().__init__()
        check_positive_int("shaw", "head_dim", head_dim)
        check_positive_int("shaw", "max_relative_position (k)", max_relative_position)
        self.head_dim, self.k = head_dim, max_relative_position
        rows = 2 * max_relative_position + 1
        self.key_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim ** -0.5)
        self.values = bool(values)
        self.needs_probs = self.values  # instance override of the class flag
        self.value_table = nn.Parameter(torch.randn(rows, head_dim) * head_dim ** -0.5) if values else None

    def _check(self, ctx: AttentionCall) -> None:
        self.check_coords(ctx.coords)
        require_qk(type(self).registry_name, ctx)
        if ctx.head_dim != self.head_dim:
            raise ValueError(f"{type(self).registry_name}: built for head_dim={self.head_dim}, "
                             f"attention has {ctx.head_dim}")

    def key_logits(self, ctx: AttentionCall) -> Tensor:
        """`q_i · w_r / sqrt(h_d)` for every query and clipped offset, `[b, n_h, n_q, 2k+1]`."""
        return torch.einsum("bhnd,rd->bhnr", ctx.q.float(), self.key_table.float()) * ctx.head_dim ** -0.5

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self._check(ctx)
        qa, k, batch = self.key_logits(ctx), self.k, ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            r = clipped_relative_index(ctx, q_idx, kv_idx, b, k)
            return score + qa[batch_index(b, batch), h, q_idx, r]

        return mod

    def value_term(self, probs: Tensor, ctx: AttentionCall) -> Tensor | None:
        """`Σ_j α_ij a^V_ij` `[b, n_h, n_q, h_d]` from probabilities `[b, n_h, n_q, n_k]`."""
        if self.value_table is None:
            return None
        from mmpe.coords.base import index_grid

        coords = ctx.coords
        b, _, q, kk = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                                 coords.device)
        r = clipped_relative_index(ctx, q, kk, b, self.k).expand(
            probs.shape[0], probs.shape[1], coords.num_queries, coords.num_keys)
        per_offset = torch.zeros(*probs.shape[:3], 2 * self.k + 1, dtype=probs.dtype,
                                 device=probs.device).scatter_add_(-1, r, probs)
        return per_offset @ self.value_table.to(probs.dtype)
