"""FoX, the Forgetting Transformer: forget gates as a data-dependent decay (Lin et al. 2025)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Causal
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_causal,
    require_qk,
)
from mmpe.encodings.base import AttentionContext, ScoreMod
from mmpe.registry import register


@register(
    "fox", hook="score", needs=(Causal,), learnable=True, family="gate",
    aliases=("forgetting_transformer",),
    paper="Lin, Nikishin, He & Courville 2025, Forgetting Transformer: Softmax Attention with "
          "a Forget Gate (ICLR), eqs. 4-6", context=("d_model", "num_heads"))
class ForgettingGate(ContentScoreEncoding):
    """Per-head scalar forget gates turned into an additive decay (Lin et al. 2025).

    ``f_t = σ(w_hᵀ x_t + b_h)`` per head and token; ``D_ij = Σ_{l=j+1}^{i} log f_l`` for
    ``j ≤ i`` (masked otherwise); ``O = softmax(QKᵀ/√d + D) V``. With per-token cumulative
    sums ``c_i = Σ_{l ≤ i} log f_l`` the term is ``D_ij = c_i − c_j``, so the score mod reads
    two ``[b, n_h, n]`` vectors: memory O(n), never an ``n×n`` tensor (the FlexAttention form
    the paper recommends). All gates 1 (``log f = 0``) give ``D = 0``: no positional term.
    ``log f`` is computed with ``logsigmoid`` (no underflow). Causal attention only; the gates
    are read from the attention input ``x``, so a key/value cache is not supported.

    Args:
        d_model: width of ``x``.
        num_heads: ``n_h``.

    Raises:
        ValueError: non-positive sizes; non-causal coordinates; ``x`` missing or not
            covering every key.
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        check_positive_int("fox", "d_model", d_model)
        check_positive_int("fox", "num_heads", num_heads)
        self.num_heads = num_heads
        self.gate = nn.Linear(d_model, num_heads)

    def cumulative_log_forget(self, x: Tensor) -> Tensor:
        """``c [b, n_h, n]``: cumulative sum over tokens of ``log f`` from ``x [b, n, d_model]``."""
        log_f = F.logsigmoid(self.gate(x.float()))  # [b, n, n_h]
        return log_f.cumsum(dim=1).transpose(1, 2)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_coords(ctx.coords)
        require_qk("fox", ctx, x=True)
        require_causal("fox", ctx)
        self.check_context(ctx)
        c, batch = self.cumulative_log_forget(ctx.x), ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = batch_index(b, batch)
            return score + c[bb, h, q_idx] - c[bb, h, kv_idx]

        return mod
