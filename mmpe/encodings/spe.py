"""SPE: stable, basis-invariant Laplacian positions as an attention bias.

Huang et al. 2024 ("On the Stability of Expressive Positional Encodings for Graphs", ICLR),
eq. 2: with the Laplacian eigendecomposition `L = V diag(λ) Vᵀ`,

    SPE(V, λ) = ρ(V diag(φ_1(λ)) Vᵀ, …, V diag(φ_m(λ)) Vᵀ),

`φ_ℓ` permutation-equivariant maps of the eigenvalues (here, as in the paper's experiments,
one MLP applied to each eigenvalue, `φ(λ_i) ∈ R^m`). Each `Z_ℓ = V diag(φ_ℓ(λ)) Vᵀ` is an
`n × n` pair matrix that does not depend on the choice of basis within an eigenspace (a
rotation `V → VQ` that preserves `λ` leaves it unchanged; signs included) and is Lipschitz
in `L` (the paper's stability result). The paper reduces the `m` matrices to node features
with a GNN `ρ`; here they enter attention directly as pair features, one per head
(`m = n_h`):

    score_h(i, j) += Z_h[i, j] = Σ_t φ_h(λ_t) v_t[i] v_t[j].

Eigenpairs: the `k` smallest non-trivial ones of the symmetrised graph's Laplacian
([`mmpe.coords.graph_structure.laplacian_eigenpairs`][mmpe.coords.graph_structure.laplacian_eigenpairs]);
basis invariance holds when `k` does not cut a repeated eigenvalue's eigenspace (choose `k`
to cover it, or `n − 1` for the whole spectrum). Pairs with padding or the virtual token get 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.coords.graph_structure import GraphAdjacency, laplacian_eigenpairs
from mmpe.encodings._pair_bias import dense_bias_mod
from mmpe.encodings._precision import term_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.registry import register
from mmpe.validation import check_laplacian_normalization


@register("spe", hook="score", needs=(GraphLayout, GraphAdjacency), learnable=True,
          family="graph",
          paper="Huang et al. 2024, On the Stability of Expressive Positional Encodings for "
                "Graphs (ICLR), eq. 2",
          context=("num_heads",))


class SPE(SavesSettings, ScoreEncoding):
    """`score_h(i, j) += [V diag(φ_h(λ)) Vᵀ]_ij`, `φ: R → R^{n_h}` an MLP on each eigenvalue.

    Args:
        num_heads: `n_h` (one pair matrix per head).
        k: eigenpairs (the smallest non-trivial ones; a graph of `n` nodes has `n − 1`).
        hidden: width of `φ`'s hidden layer.
        normalization: Laplacian, `"sym"` or `None` (combinatorial).

    Shapes: `bias(ctx) -> [b, n_h, n_max, n_max]`; [`pair_bias`][mmpe.encodings.spe.SPE.pair_bias]
    takes eigenpairs directly.

    Raises:
        ValueError: `num_heads`, `k` or `hidden` < 1; an unknown `normalization`.
        TypeError: coordinates without `GraphLayout` and `GraphAdjacency`.
    """

    structure = "table"

    saved_settings = ("k", "normalization")  # k eigenpairs: no tensor shape holds it

    def __init__(self, num_heads: int, k: int = 8, hidden: int = 16,
                 normalization: str | None = "sym") -> None:
        super().__init__()
        if num_heads < 1 or k < 1 or hidden < 1:
            raise ValueError(f"spe: num_heads, k and hidden must be >= 1, got {num_heads}, {k}, {hidden}")
        check_laplacian_normalization("spe", normalization)
        self.num_heads, self.k, self.normalization = num_heads, k, normalization
        self.phi = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_heads))

    def pair_bias(self, vecs: Tensor, vals: Tensor, mask: Tensor) -> Tensor:
        """SPE's pair bias from the eigenvectors and eigenvalues.

        `vecs [b, n, k]`, `vals [b, k]`, column mask `[b, k]` → `Z [b, n_h, n, n]` float32
        (float64 in a float64 module; `φ` upcast to that dtype)."""
        if mask.numel() and not torch.compiler.is_compiling():
            # only the columns some graph has: a k past every graph's spectrum then gives the
            # same numbers as a k that just covers it (zero columns changed the sums' rounding)
            used = torch.nonzero(mask.any(0))
            width = int(used.max()) + 1 if used.numel() else 0
            vecs, vals, mask = vecs[..., :width], vals[:, :width], mask[:, :width]
        with torch.autocast(vecs.device.type, enabled=False):
            t = term_dtype(self)
            w = [p.to(t) for p in self.phi.parameters()]
            lam = vals.to(t)[..., None]  # [b, k, 1]
            f = torch.relu(lam @ w[0].t() + w[1]) @ w[2].t() + w[3]  # φ(λ) [b, k, n_h]
            f = f * mask.to(t)[..., None]
            v = vecs.to(t)
            return torch.einsum("bik,bkh,bjk->bhij", v, f, v)

    def _bias(self, coords: Coordinates) -> Tensor:
        return self.pair_bias(*laplacian_eigenpairs(coords, self.k, self.normalization))

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        return dense_bias_mod(self._bias(ctx.coords))
