"""Relative random-walk probabilities (RRWP) for graphs.

Ma et al. 2023 ("Graph Inductive Biases in Transformers without Message Passing", ICML; GRIT),
§3.1: with the random-walk matrix `M = D⁻¹A`, every node pair gets the `K`-vector

    P_ij = [I, M, M², …, M^{K−1}]_ij  ∈ R^K,

the probabilities that a walk from `i` is at `j` after `0 … K−1` steps (units: steps). GRIT
feeds the diagonal `P_ii` to the node features and `P_ij` to its pair (edge) features through
learned linear maps. Here the two are two encodings:

* `rrwp` (score hook): `score_h(i, j) += w_hᵀ P_ij` — a learned linear map of the `K`-vector to
  one bias per head, on the pair grid of the graph coordinates (memory `O(n² K)` per graph,
  like Graphormer's SPD table);
* `rrwp_node` (input hook): `x_i += proj(P_ii)`.

`A` is the coalesced adjacency of the edge list as given (self-loops kept, `D` clamped to ≥ 1),
the walk of `rwse`: `P_ii[1:]` equals RWSE's return probabilities. Pairs from different graphs
never meet (each graph is its own block of the padded batch); pairs with padding or the
virtual token have `P = 0`. Values: [`mmpe.coords.graph_structure.rrwp`][mmpe.coords.graph_structure.rrwp].
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.coords.graph_structure import GraphAdjacency, rrwp
from mmpe.encodings._pair_bias import dense_bias_mod
from mmpe.encodings._precision import module_dtype, term_dtype
from mmpe.encodings.base import AttentionCall, InputEncoding, ScoreEncoding, ScoreMod
from mmpe.encodings.lappe import make_projection
from mmpe.registry import register

PAPER = ("Ma et al. 2023, Graph Inductive Biases in Transformers without Message Passing "
         "(ICML; GRIT), §3.1")


@register("rrwp", hook="score", needs=(GraphLayout, GraphAdjacency), learnable=True,
          family="graph", paper=PAPER, context=("num_heads",))


class RRWP(ScoreEncoding):
    """`score(i, j) += Σ_t W[h, t] · [M^t]_ij`, `t = 0 … k−1`, `M = D⁻¹A`.

    Args:
        num_heads: `n_h`.
        k: walk lengths `0 … k−1` (GRIT: 21 on ZINC).

    Shapes: `bias(ctx) -> [b, n_h, n_max, n_max]`.

    Raises:
        ValueError: `num_heads` or `k` < 1.
        TypeError: coordinates without `GraphLayout` and `GraphAdjacency`
            ([`mmpe.coords.Graph`][mmpe.coords.graph.Graph] has both).
    """

    structure = "table"

    def __init__(self, num_heads: int, k: int = 21) -> None:
        super().__init__()
        if num_heads < 1 or k < 1:
            raise ValueError(f"rrwp: num_heads and k must be >= 1, got {num_heads}, {k}")
        self.num_heads, self.k = num_heads, k
        self.weight = nn.Parameter(torch.randn(num_heads, k) * k ** -0.5)  # W [n_h, k]

    def pair_bias(self, coords: Coordinates) -> Tensor:
        """`[b, n_h, n, n]` float32 (float64 in a float64 module): `W` applied to `P_ij`."""
        t = term_dtype(self)
        p = rrwp(coords, self.k).to(t)  # [b, n, n, k]
        return (p @ self.weight.to(t).t()).permute(0, 3, 1, 2)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        return dense_bias_mod(self.pair_bias(ctx.coords))


@register("rrwp_node", hook="input", needs=(GraphLayout, GraphAdjacency), learnable=True,
          family="graph", paper=PAPER, context=("d_model",))


class RRWPNode(InputEncoding):
    """`P_i = proj(([M^t]_ii)_{t=0..k−1})`: GRIT's node term, the diagonal of RRWP.

    Args:
        d_model: width of `P`.
        k: walk lengths `0 … k−1` (as `rrwp`; column 0 is 1 at every node).
        projection: `"linear"` or `"mlp"`.

    Shapes: `forward(coords) -> [b, n_max, d_model]` (zero at padding and virtual token).

    Raises:
        ValueError: `k < 1`, an unknown `projection`.
        TypeError: coordinates without `GraphLayout` and `GraphAdjacency`.
    """

    def __init__(self, d_model: int, k: int = 21, projection: str = "linear") -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"rrwp_node: k must be >= 1, got {k}")
        self.k = k
        self.proj = make_projection(k, d_model, projection)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        diag = rrwp(coords, self.k).diagonal(dim1=1, dim2=2).transpose(1, 2)  # [b, n, k]
        return self.proj(diag.to(module_dtype(self.proj))) * coords.node_mask[..., None]
