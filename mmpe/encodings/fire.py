"""FIRE: functional interpolation for relative positions (Li et al. 2024)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Metric
from mmpe.encodings._captured import per_head
from mmpe.encodings._precision import term_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.registry import register


@register(
    "fire", hook="score", needs=(Metric,),
    learnable=True, family="bias",
    paper="Li et al. 2024, Functional Interpolation for Relative Positions Improves Long "
          "Context Transformers (ICLR), eq. 4", context=("num_heads",))
class FIRE(SavesSettings, ScoreEncoding):
    """`b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) )` per head (Li et al. 2024, eq. 4).

    `ψ(x) = log(c·|x| + 1)` with learnable `c > 0`; `L` is a learnable threshold
    (`|L_mult · L_init|`) below which short queries are not over-normalised; `f_θ` is an MLP
    `1 → width → n_h` (ReLU), shared by all heads. Normalising by the query position maps
    every relative distance into `[0, 1]`, so a model trained at length `L` meets no unseen
    inputs at length `16L` — the paper's route to length generalisation. `i`, `j` are
    positions in tokens. On other coordinates `|i − j|` is their distance and `i` their
    `extent` (grid diagonal, graph diameter …), so the same MLP reads normalised distances.

    Args:
        num_heads: `n_h`.
        mlp_width: hidden width of `f_θ` (32 in the paper).
        init_c: initial `c` (0.1).
        init_L: initial threshold `L` (tokens, 512).
        eps: added to the normaliser to keep it positive.

    Raises:
        ValueError: non-positive `num_heads`, `mlp_width`, `init_c` or `init_L`.
    """

    saved_settings = ("eps",)
    #: a function of the distance *and* the query's extent: no structure narrower than a pair
    #: (on a Grid the extent is the diagonal for every query, which the grid plans know from
    #: FIRE's fast forms, mmpe/attention/fast_forms/fire.py)
    structure = "pair"

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

    def _psi(self, x: Tensor, c: Tensor | None = None) -> Tensor:
        return torch.log(torch.abs((self.c.to(term_dtype(self)) if c is None else c) * x) + 1.0)

    def _threshold(self) -> Tensor:
        t = term_dtype(self)
        return torch.abs(self.L_mult.to(t) * self.init_L.to(t))

    def normalised_distance(self, ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor,
                            b: Tensor, c: Tensor | None = None,
                            threshold: Tensor | None = None) -> Tensor:
        """FIRE's normalised distance of the broadcast pairs.

        `ψ(i − j) / ψ(max(L, i))` on the broadcast pairs (float32; float64 in a float64 module); `c` and `threshold`
        default to the module's (a `score_mod` passes its per-head copies)."""
        coords = ctx.coords
        threshold = self._threshold() if threshold is None else threshold
        t = threshold.dtype  # the term's (no parameter read inside a score_mod)
        rel, i = coords.distance(q_idx, kv_idx, b).to(t), coords.extent(q_idx, b).to(t)
        return self._psi(rel, c) / (self._psi(torch.maximum(i, threshold), c) + self.eps)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        """FIRE's `score_mod`: the MLP as its linear pieces.

        `score + slope[p, h]·x + intercept[p, h]`, `p` the piece of `x = ψ(i − j)/ψ(max(L,
        i))`: the MLP as its linear pieces ([pieces][mmpe.encodings.fire.FIRE.pieces]), equal
        to the hidden layer up to rounding, with gradients to `c`, `L` and every MLP parameter.

        The kernel counts the breakpoints below `x` (comparisons with a tensor that takes no
        gradient) and reads that piece's slope and intercept for its head: two reads of tensors
        that take a gradient per score. Compiled FlexAttention turns every such read into an
        atomic add per (query, key) pair in its backward; the hidden layer unrolled into scalar
        code read `3W + 1` and made FIRE's GPU training 8.5× ALiBi's (H100, the main job)."""
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        n_h = self.num_heads
        c, threshold = per_head(self.c.to(term_dtype(self)), n_h), per_head(self._threshold(), n_h)
        slope, intercept, cuts = self.pieces()  # [W + 1, n_h], [W + 1, n_h], [W] sorted
        slope, intercept = slope.reshape(-1), intercept.reshape(-1)  # read at piece · n_h + h
        width = cuts.shape[0]

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = self.normalised_distance(ctx, q_idx, kv_idx, b, c[h], threshold[h])
            piece = torch.zeros_like(h)
            for u in range(width):  # the breakpoints below x: searchsorted, unrolled
                piece = piece + (x > cuts[u]).to(h.dtype)
            at = piece * n_h + h
            return score + (slope[at] * x + intercept[at])

        return mod

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP `f(x) = W₂ relu(w₁x + b₁) + b₂` as linear pieces (float32; float64 in a float64 module).

        Returns `slope`, `intercept` `[W+1, n_h]` and the sorted breakpoints `cuts`
        `[W]` (`−b₁/w₁`): on the piece between two cuts the set of active hidden units is
        fixed, so `f(x) = slope[p]·x + intercept[p]` exactly, with gradients to every MLP
        parameter (the active sets are constants almost everywhere, as for the ReLU itself).
        """
        slope, intercept, cuts = self._pieces()
        return slope, intercept, cuts.detach()

    def _pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """[pieces][mmpe.encodings.fire.FIRE.pieces] with the cuts' graph (`−b₁/w₁`)."""
        t = term_dtype(self)
        w1, b1 = self.mlp[0].weight[:, 0].to(t), self.mlp[0].bias.to(t)
        w2, b2 = self.mlp[2].weight.to(t), self.mlp[2].bias.to(t)
        flat = (w1 == 0).detach()
        cuts = torch.where(flat, torch.full_like(b1, 1e6),
                           (-b1 / torch.where(flat, torch.ones_like(w1), w1)).clamp(-1e6, 1e6))
        cuts = cuts.sort().values
        with torch.no_grad():
            c = cuts.detach()
            probe = torch.cat((c[:1] - 1, (c[:-1] + c[1:]) / 2, c[-1:] + 1))
            active = (probe[:, None] * w1 + b1 > 0).to(t)  # [W+1, W]
        slope = (active * w1) @ w2.T  # [W+1, n_h]
        intercept = (active * b1) @ w2.T + b2
        return slope, intercept, cuts

