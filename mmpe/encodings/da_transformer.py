"""DA-Transformer: distance-aware attention rescaling (Wu, Wu & Huang 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Metric
from mmpe.encodings._content import check_positive_int
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.registry import register


@register(
    "da_transformer", hook="score", needs=(Metric,),
    learnable=True, family="bias",
    paper="Wu, Wu & Huang 2021, DA-Transformer: Distance-aware Transformer (NAACL), eqs. 5-8", context=("num_heads",))
class DATransformer(ScoreEncoding):
    """Rescale clipped logits by a learnable sigmoid of the weighted distance (Wu et al. 2021).

    `R^(h)_ij = w_h·|i − j|` (eq. 5); `R̂^(h) = (1 + e^{v_h}) / (1 + e^{v_h − R^(h)})` (eq. 6);
    `A^(h) = softmax(ReLU(Q Kᵀ) ⊙ R̂^(h) / √d)` (eq. 7). A positive `w_h` favours distant
    tokens, a negative one local tokens; `R̂ ∈ (0, 1 + e^{v})` with `R̂ = 1` at distance 0.
    Computed as `exp(softplus(v) − softplus(v − w·d))` (no overflow). The mod rescales the
    score (`additive = False`), so attention runs on the flex or math route.

    Args:
        num_heads: `n_h`.
        init_std: std of the initial `w_h` (`v_h` starts at 0).

    Raises:
        ValueError: `num_heads < 1`.
    """

    additive = False

    def __init__(self, num_heads: int, init_std: float = 0.02) -> None:
        super().__init__()
        check_positive_int("da_transformer", "num_heads", num_heads)
        self.num_heads = num_heads
        self.w = nn.Parameter(torch.randn(num_heads) * init_std)
        self.v = nn.Parameter(torch.zeros(num_heads))

    def rescale(self, dist: Tensor, w: Tensor, v: Tensor) -> Tensor:
        """`(1 + e^v) / (1 + e^{v − w·dist})`."""
        return torch.exp(F.softplus(v) - F.softplus(v - w * dist))

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        coords, w, v = ctx.coords, self.w, self.v

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            dist = coords.distance(q_idx, kv_idx, b)
            return torch.relu(score) * self.rescale(dist, w[h], v[h])

        return mod
