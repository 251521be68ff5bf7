"""CoPE: contextual position encoding (Golovneva et al. 2024)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Causal
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_causal,
    require_qk,
)
from mmpe.encodings._precision import full_precision
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.registry import register


def contextual_positions(gates: Tensor) -> Tensor:
    """`p_ij = Σ_{t=j}^{i} g_it`: reverse cumulative sum of gates `[…, n_q, n_k]` over keys.

    Masked (future) keys must carry gate 0, so the sum over `t ≥ j` stops at `i`.
    """
    return gates.flip(-1).cumsum(-1).flip(-1)


def interpolate_logits(z: Tensor, positions: Tensor) -> Tensor:
    """`(1 − w)·z[⌊p⌋] + w·z[⌈p⌉]` with `w = p − ⌊p⌋`; `z` `[…, n_q, P]`, p `[…, n_q, n_k]`."""
    lo, hi = positions.floor(), positions.ceil()
    w = positions - lo
    shape = (*z.shape[:-1], positions.shape[-1])
    return (z.gather(-1, hi.long().expand(shape)) * w
            + z.gather(-1, lo.long().expand(shape)) * (1 - w))


@register(
    "cope", hook="score", needs=(Causal,), learnable=True, family="relative",
    paper="Golovneva, Wang, Weston & Sukhbaatar 2024, Contextual Position Encoding: Learning "
          "to Count What's Important (arXiv:2405.18719), eqs. 3-5", context=("head_dim", "max_len"))
class CoPE(ContentScoreEncoding):
    """Contextual positions counted by sigmoid gates (Golovneva et al. 2024, eqs. 3-5).

    Gates `g_ij = σ(q_i·k_j/√h_d)` (0 on masked keys); the position of key `j` seen from
    query `i` is `p_ij = Σ_{t=j}^{i} g_it` (fractional, clipped to `npos_max − 1`); its
    embedding interpolates integer ones, `e[p] = (p − ⌊p⌋)e[⌈p⌉] + (1 − p + ⌊p⌋)e[⌊p⌋]`; the
    logit gains `q_i·e[p_ij]`. Optimised form (§3): `z_i[p] = q_i·e[p]` is computed for the
    `npos_max` integers once, `[b, n_h, n_q, npos_max]`, and interpolated — never
    `n×n×h_d`. With all gates 1, `p_ij = i − j + 1`: ordinary relative positions.
    The embeddings `e` `[h_d, npos_max]` are shared by the heads and start at 0, as in
    the paper's code. Causal attention only.

    Args:
        head_dim: `h_d`.
        max_len: the training context (tokens); the default `npos_max`.
        npos_max: number of integer positions with an embedding (≥ 2).

    Raises:
        ValueError: `npos_max < 2`; coordinates that are not causal; q/k missing.
    """

    def __init__(self, head_dim: int, max_len: int = 64, npos_max: int | None = None) -> None:
        super().__init__()
        check_positive_int("cope", "head_dim", head_dim)
        npos_max = max_len if npos_max is None else npos_max
        check_positive_int("cope", "npos_max", npos_max, 2)
        self.head_dim, self.npos_max = head_dim, npos_max
        self.pos_emb = nn.Parameter(torch.zeros(head_dim, npos_max))

    def term(self, ctx: AttentionCall, gates: Tensor | None = None) -> Tensor:
        """`q_i·e[p_ij]` on every pair `[b, n_h, n_q, n_k]` (`gates` override for tests)."""
        # Gates, their cumulative sum and the interpolation weights are precision-critical (a
        # bf16 cumsum of 300 gates has a resolution of 2 positions): float32, no autocast.
        with full_precision(ctx.q.device):
            q, k = ctx.q.float(), ctx.k.float()
            if gates is None:
                gates = torch.sigmoid(q @ k.transpose(-2, -1) * ctx.head_dim ** -0.5)
                mask = ctx.coords.dense_mask()
                if mask is not None:
                    gates = gates.masked_fill(~mask, 0.0)
            pos = contextual_positions(gates.float()).clamp(max=self.npos_max - 1)
            return interpolate_logits(q @ self.pos_emb.float(), pos)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self.check_coords(ctx.coords)
        require_qk("cope", ctx)
        require_causal("cope", ctx)
        if ctx.head_dim != self.head_dim:
            raise ValueError(f"cope: built for head_dim={self.head_dim}, attention has {ctx.head_dim}")
        term, batch = self.term(ctx), ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + term[batch_index(b, batch), h, q_idx, kv_idx]

        return mod
