"""FIRE: functional interpolation for relative positions (Li et al. 2024)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Metric
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionContext, ScoreEncoding, ScoreMod
from mmpe.registry import register


@register(
    "fire", hook="score", needs=(Metric,),
    learnable=True, family="bias",
    paper="Li et al. 2024, Functional Interpolation for Relative Positions Improves Long "
          "Context Transformers (ICLR), eq. 4", context=("num_heads",))
class FIRE(SavesSettings, ScoreEncoding):
    """``b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) )`` per head (Li et al. 2024, eq. 4).

    ``ψ(x) = log(c·|x| + 1)`` with learnable ``c > 0``; ``L`` is a learnable threshold
    (``|L_mult · L_init|``) below which short queries are not over-normalised; ``f_θ`` is an MLP
    ``1 → width → n_h`` (ReLU), shared by all heads. Normalising by the query position maps
    every relative distance into ``[0, 1]``, so a model trained at length ``L`` meets no unseen
    inputs at length ``16L`` — the paper's route to length generalisation. ``i``, ``j`` are
    positions in tokens. On other coordinates ``|i − j|`` is their distance and ``i`` their
    ``extent`` (grid diagonal, graph diameter …), so the same MLP reads normalised distances.

    Args:
        num_heads: ``n_h``.
        mlp_width: hidden width of ``f_θ`` (32 in the paper).
        init_c: initial ``c`` (0.1).
        init_L: initial threshold ``L`` (tokens, 512).
        eps: added to the normaliser to keep it positive.

    Raises:
        ValueError: non-positive ``num_heads``, ``mlp_width``, ``init_c`` or ``init_L``.
    """

    saved_settings = ("eps",)

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        for arg, val in (("num_heads", num_heads), ("mlp_width", mlp_width),
                         ("init_c", init_c), ("init_L", init_L)):
            if val <= 0:
                raise ValueError(f"fire: {arg} must be > 0, got {val}")
        self.num_heads, self.eps = num_heads, eps
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.init_L = nn.Parameter(torch.tensor(float(init_L)), requires_grad=False)
        self.L_mult = nn.Parameter(torch.tensor(1.0))
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))

    def _psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c.float() * x) + 1.0)

    def normalised_distance(self, ctx: AttentionContext, q_idx: Tensor, kv_idx: Tensor,
                            b: Tensor) -> Tensor:
        """``ψ(i − j) / ψ(max(L, i))`` on the broadcast pairs (float32)."""
        coords = ctx.coords
        rel = coords.distance(q_idx, kv_idx, b).float()
        i = coords.extent(q_idx, b).float()
        threshold = torch.abs(self.L_mult.float() * self.init_L.float())
        return self._psi(rel) / (self._psi(torch.maximum(i, threshold)) + self.eps)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        # float32 weights: the normalised distance is float32 (a bf16 module keeps bf16 ones).
        w1, b1 = self.mlp[0].weight[:, 0].float(), self.mlp[0].bias.float()
        w2, b2 = self.mlp[2].weight.float(), self.mlp[2].bias.float()

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = self.normalised_distance(ctx, q_idx, kv_idx, b)
            # The MLP unrolled over its hidden units so FlexAttention sees scalar ops only.
            out = b2[h]
            for u in range(w1.shape[0]):
                out = out + w2[h, u] * torch.relu(x * w1[u] + b1[u])
            return score + out

        return mod

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The MLP on the pairs of queries ``start … stop−1``, ``[b or 1, n_h, stop−start, n_k]``."""
        self.check_context(ctx)
        coords = ctx.coords
        b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                                coords.device)
        x = self.normalised_distance(ctx, q[:, :, start:stop], k, b)  # [b, 1, rows, n_k]
        slope, intercept, cuts = self.pieces()
        # The MLP is piecewise linear in its one input: find each pair's piece, then one
        # multiply-add per head instead of a hidden layer per pair.
        piece = torch.searchsorted(cuts, x.detach().contiguous())  # [b, 1, rows, n_k]
        out = slope[piece] * x.unsqueeze(-1) + intercept[piece]  # [b, 1, rows, n_k, n_h]
        return out.squeeze(1).permute(0, 3, 1, 2)

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP ``f(x) = W₂ relu(w₁x + b₁) + b₂`` as linear pieces (float32).

        Returns ``slope``, ``intercept`` ``[W+1, n_h]`` and the sorted breakpoints ``cuts``
        ``[W]`` (``−b₁/w₁``): on the piece between two cuts the set of active hidden units is
        fixed, so ``f(x) = slope[p]·x + intercept[p]`` exactly, with gradients to every MLP
        parameter (the active sets are constants almost everywhere, as for the ReLU itself).
        """
        w1, b1 = self.mlp[0].weight[:, 0].float(), self.mlp[0].bias.float()
        w2, b2 = self.mlp[2].weight.float(), self.mlp[2].bias.float()
        with torch.no_grad():
            flat = w1 == 0
            cuts = torch.where(flat, torch.full_like(b1, 1e6),
                               (-b1 / torch.where(flat, torch.ones_like(w1), w1)).clamp(-1e6, 1e6))
            cuts = cuts.sort().values
            probe = torch.cat((cuts[:1] - 1, (cuts[:-1] + cuts[1:]) / 2, cuts[-1:] + 1))
            active = (probe[:, None] * w1 + b1 > 0).float()  # [W+1, W]
        slope = (active * w1) @ w2.T  # [W+1, n_h]
        intercept = (active * b1) @ w2.T + b2
        return slope, intercept, cuts

