"""SignNet: sign-invariant Laplacian eigenvector positions for graphs.

Lim et al. 2022 ("Sign and Basis Invariant Networks for Spectral Graph Representation
Learning", ICLR 2023), eq. 1 / Theorem 1: for eigenvectors `v_1 … v_k` (`[n]` each),

    f(v_1, …, v_k) = ρ([φ(v_i) + φ(−v_i)]_{i=1..k}),

which is invariant to every sign flip `v_i → −v_i` (and universal among such functions).
`φ: R^n → R^{n×c}` is a permutation-equivariant network over the graph — here, as in the
paper's graph-regression models, a GIN (Xu et al. 2019: `h ← MLP((1 + ε) h + A h)`, `A` the symmetrised
adjacency) applied to every eigenvector separately with shared weights, the eigenvector's
entries as one input channel; `ρ` is an MLP on the concatenated `k · c` channels of a node
(GraphGPS's SignNet encoder). Eigenvectors: the `GraphLayout` member `laplacian_pe(k)` (the
`k` smallest non-trivial ones, as LapPE); columns a small graph lacks are masked to zero
before `ρ`. No random sign flips are needed (the output does not depend on the signs).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.coords.graph_structure import GraphAdjacency, dense_adjacency
from mmpe.encodings._precision import module_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register
from mmpe.validation import check_laplacian_normalization


class DenseGIN(nn.Module):
    """GIN layers on padded dense adjacencies.

    GIN layers on padded dense adjacencies (Xu et al. 2019, eq. 4.1, sum aggregation;
    PyG's `DenseGINConv` with a learnable `ε`): `h ← MLP((1 + ε) h + A h)` per layer.

    `forward(h [b, n, k, c_in], adj [b, n, n]) -> [b, n, k, hidden]`: the `k` axis holds
    independent signals on the same graph (the eigenvectors), sharing weights.
    """

    def __init__(self, c_in: int, hidden: int, layers: int) -> None:
        super().__init__()
        dims = [c_in] + [hidden] * layers
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(a, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            for a in dims[:-1])
        self.eps = nn.Parameter(torch.zeros(layers))

    def forward(self, h: Tensor, adj: Tensor) -> Tensor:
        for i, mlp in enumerate(self.mlps):
            h = mlp((1 + self.eps[i]) * h + torch.einsum("bij,bjkc->bikc", adj, h))
            if i + 1 < len(self.mlps):
                h = torch.relu(h)
        return h


@register("signnet", hook="input", needs=(GraphLayout, GraphAdjacency), learnable=True,
          family="graph",
          paper="Lim et al. 2022, Sign and Basis Invariant Networks for Spectral Graph "
                "Representation Learning (ICLR 2023), eq. 1",
          context=("d_model",))
class SignNet(SavesSettings, InputEncoding):
    """`P_i = ρ([φ(v_j) + φ(−v_j)]_{j=1..k})_i` — sign-invariant Laplacian eigenvector positions.

    Args:
        d_model: width of `P`.
        k: eigenvectors (graphs with fewer than `k + 1` nodes get masked columns).
        hidden: channels `c` of `φ`'s output per eigenvector.
        layers: GIN layers of `φ`.
        normalization: Laplacian, `"sym"` or `None` (combinatorial).

    Shapes: `forward(coords) -> [b, n_max, d_model]` (zero at padding and virtual token);
    [`encode`][mmpe.encodings.signnet.SignNet.encode] takes the eigenvectors directly.

    Raises:
        ValueError: `k`, `hidden` or `layers` < 1.
        TypeError: coordinates without `GraphLayout` and `GraphAdjacency`.
    """

    saved_settings = ("normalization",)

    def __init__(self, d_model: int, k: int = 8, hidden: int = 16, layers: int = 2,
                 normalization: str | None = "sym") -> None:
        super().__init__()
        if k < 1 or hidden < 1 or layers < 1:
            raise ValueError(f"signnet: k, hidden and layers must be >= 1, got {k}, {hidden}, {layers}")
        check_laplacian_normalization("signnet", normalization)
        self.k, self.normalization = k, normalization
        self.phi = DenseGIN(1, hidden, layers)
        self.rho = nn.Sequential(nn.Linear(k * hidden, d_model), nn.ReLU(),
                                 nn.Linear(d_model, d_model))

    def encode(self, vecs: Tensor, mask: Tensor, adj: Tensor) -> Tensor:
        """`vecs [b, n, k]`, column mask `[b, k]`, adjacency `[b, n, n]` → `[b, n, d_model]`."""
        dtype = module_dtype(self.rho)
        v, a = vecs.to(dtype)[..., None], adj.to(dtype)  # [b, n, k, 1]
        z = (self.phi(v, a) + self.phi(-v, a)) * mask.to(dtype)[:, None, :, None]
        return self.rho(z.flatten(2))

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        vecs, mask = coords.laplacian_pe(self.k, self.normalization)
        return self.encode(vecs, mask, dense_adjacency(coords)) * coords.node_mask[..., None]
