"""KERPLE: kernelized relative positional embeddings (Chi et al. 2022), log and power variants."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Metric
from mmpe.encodings._content import check_positive_int
from mmpe.encodings.base import AttentionCall, ScoreEncoding, Term
from mmpe.registry import register

PAPER = ("Chi, Fan, Ramadge & Rudnicky 2022, KERPLE: Kernelized Relative Positional Embedding "
         "for Length Extrapolation (NeurIPS), eq. 8")


class _Kerple(ScoreEncoding):
    """Per-head conditionally positive definite kernel of the distance, added to the logits."""

    eps = 1e-2
    structure = "distance"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        check_positive_int(type(self).registry_name, "num_heads", num_heads)
        self.num_heads = num_heads
        # Our initialisation: r1 spread over (0, 2], r2 over (0, 1] across heads.
        self.r1 = nn.Parameter(torch.rand(num_heads) * 2 + self.eps)
        self.r2 = nn.Parameter(torch.rand(num_heads) + self.eps)

    def kernel(self, dist: Tensor, r1: Tensor, r2: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def constrained(self) -> tuple[Tensor, Tensor]:
        """`(r1, r2)` after the constraints (`r1, r2 ≥ eps`; power: `r2 ≤ 2`)."""
        return self.r1.clamp(min=self.eps), self.r2.clamp(min=self.eps)

    def distance_term(self, ctx: AttentionCall) -> Term:
        """`term(d, h) = kernel(d, r1_h, r2_h)` with the constrained `r1, r2`."""
        r1, r2 = self.constrained()

        def term(dist: Tensor, h: Tensor) -> Tensor:
            return self.kernel(dist, r1[h], r2[h])

        return term


@register("kerple_log", hook="score", needs=(Metric,), context=("num_heads",), learnable=True,
          family="bias", paper=PAPER)
class KerpleLog(_Kerple):
    """KERPLE-log: `score + (−r1·log(1 + r2·|i − j|))` per head, `r1, r2 > 0` (Chi et al. 2022).

    `|i − j|` is the coordinates' distance (tokens on a sequence). The logarithmic variant is
    the one the paper finds best for extrapolation.

    Args:
        num_heads: `n_h`.

    Raises:
        ValueError: `num_heads < 1`.
    """

    def kernel(self, dist: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
        return -r1 * torch.log1p(r2 * dist)

@register("kerple_power", hook="score", needs=(Metric,), context=("num_heads",), learnable=True,
          family="bias", paper=PAPER)
class KerplePower(_Kerple):
    """KERPLE-power: `score + (−r1·|i − j|^{r2})` per head, `r1 > 0`, `0 < r2 ≤ 2` (Chi et al. 2022).

    Args:
        num_heads: `n_h`.

    Raises:
        ValueError: `num_heads < 1`.
    """

    def constrained(self) -> tuple[Tensor, Tensor]:
        return self.r1.clamp(min=self.eps), self.r2.clamp(min=self.eps, max=2.0)

    def kernel(self, dist: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
        # |i−j|^r2 with 0^r2 = 0; the clamp keeps d/dr2 finite at distance 0.
        return -r1 * torch.where(dist > 0, dist.clamp(min=1e-12).pow(r2), torch.zeros_like(dist))
