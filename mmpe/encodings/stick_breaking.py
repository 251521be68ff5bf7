"""Stick-breaking attention (Tan et al. 2024): position from the order of breaks, no softmax."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Causal
from mmpe.encodings._content import require_causal
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, KernelEncoding
from mmpe.registry import register

SOFTPLUS_CUTOFF = 15.0


def stable_softplus(x: Tensor) -> Tensor:
    """`log(1 + e^x)`, and `x` itself for `x > 15` (the paper's cut-off; exact to 3e-7).

    The exponential is taken of `min(x, 15)` so neither branch overflows nor yields NaN
    gradients; `softplus(−inf) = 0`.
    """
    return torch.where(x > SOFTPLUS_CUTOFF, x, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_CUTOFF))))


def stick_breaking_log_weights(logits: Tensor) -> Tensor:
    """`log A_ij = z_ij − Σ_{k ≥ j} softplus(z_ik)` for logits `[…, n_q, n_k]`.

    That is `log β_ij + Σ_{j<k} log(1 − β_ik)` with `β = σ(z)`, using
    `log σ(z) = z − softplus(z)` and `log(1 − σ(z)) = −softplus(z)`. Masked keys carry
    `z = −inf`: weight 0, and they break nothing.
    """
    sp = stable_softplus(logits)
    tail = sp.flip(-1).cumsum(-1).flip(-1)  # Σ_{k ≥ j}
    return logits - tail


@register(
    "stick_breaking", hook="kernel", needs=(Causal,), learnable=False, family="kernel",
    paper="Tan, Shen, Yang, Courville & Panda 2024, Scaling Stick-Breaking Attention: An "
          "Efficient Implementation and In-depth Study (arXiv:2410.17980), eqs. 1-3",
)
class StickBreaking(SavesSettings, KernelEncoding):
    """Stick-breaking attention (Tan et al. 2024): `A_ij = β_ij Π_{j<k<i} (1 − β_ik)`.

    `β_ij = σ(z_ij)` with `z_ij = q_i·k_j/√d` (plus any score terms). Each query breaks a
    stick starting at the nearest earlier key: key `j` receives the fraction `β_ij` of what
    the keys between it and the query left over, so nearer keys come first and no positional
    encoding is needed. `o_i = Σ_j A_ij v_j`; the weights of a query sum to at most 1 (the
    rest is dropped). Computed in log space, `log A_ij = z_ij − Σ_{j≤k<i} softplus(z_ik)`,
    with the paper's `softplus(x) = x` cut-off for `x > 15` ([`stable_softplus`][mmpe.encodings.stick_breaking.stable_softplus]).

    Args:
        attend_current: let a query attend to its own token as the first break (the paper's
            formula covers `j < i` only: False).

    Shapes: `attend(scores [b, n_h, n_q, n_k] (masked at −inf), v [b, n_h, n_k, h_d])`.

    Raises:
        ValueError: coordinates that are not causal.
    """

    is_softmax = False
    saved_settings = ("attend_current",)

    def __init__(self, attend_current: bool = False) -> None:
        super().__init__()
        self.attend_current = bool(attend_current)

    def weights(self, scores: Tensor, ctx: AttentionCall) -> Tensor:
        """Attention weights `A` `[b, n_h, n_q, n_k]` (float32)."""
        self.check_coords(ctx.coords)
        require_causal("stick_breaking", ctx)
        z = scores.float()
        if not self.attend_current:
            coords = ctx.coords
            b, h, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                                    z.device)
            z = z.masked_fill(coords.relation(q, k, b) <= 0, float("-inf"))
        return stick_breaking_log_weights(z).exp()

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionCall) -> Tensor:
        return self.weights(scores, ctx) @ v.float()
