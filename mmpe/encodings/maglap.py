"""Magnetic Laplacian eigenvector positions for directed graphs.

Geisler et al. 2023 ("Transformers Meet Directed Graphs", ICML), §3, eq. 2: the magnetic
Laplacian

    L_q = D_s − A_s ⊙ exp(iΘ^(q)),   Θ^(q)_uv = 2π q (A_uv − A_vu),

(`A_s` the symmetrised adjacency, `D_s` its degrees; the paper's normalised form
`I − D_s^{-½}(A_s ⊙ exp(iΘ)) D_s^{-½}` is the default) is Hermitian; its eigenvectors are
complex and encode direction through their phases when the potential `q > 0`. At `q = 0` it
is the ordinary Laplacian of the symmetrised graph, and the encoding is LapPE's (plus the
trivial first eigenvector); on a graph whose every edge has its reverse (e.g. a molecule as
PyG stores it) `Θ = 0` for every `q`.

The `k` eigenvectors of the smallest eigenvalues (the first included) come from
`torch.linalg.eigh` per graph, each column's phase fixed so that its largest-|entry| is real
and positive ([`mmpe.coords.graph_structure.magnetic_laplacian_pe`][mmpe.coords.graph_structure.magnetic_laplacian_pe]);
the node features are their real and imaginary parts `[Re V, Im V] ∈ R^{2k}`, projected to the
model width and added to the node embeddings. (The paper further processes them with a
SignNet-like network; this is the plain projection, as LapPE.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.coords.graph_structure import GraphAdjacency, magnetic_laplacian_pe
from mmpe.encodings._precision import module_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.encodings.lappe import make_projection
from mmpe.registry import register
from mmpe.validation import check_laplacian_normalization


@register("maglap", hook="input", needs=(GraphLayout, GraphAdjacency), learnable=True,
          family="graph", aliases=("magnetic_laplacian",),
          paper="Geisler et al. 2023, Transformers Meet Directed Graphs (ICML), eq. 2",
          context=("d_model",))
class MagLap(SavesSettings, InputEncoding):
    """`P_i = proj([Re V_i, Im V_i])`, `V` the `k` lowest eigenvectors of `L_q`.

    Args:
        d_model: width of `P`.
        k: eigenvectors (graphs with fewer than `k` nodes get zero columns).
        q: the potential (≥ 0; 0: the symmetrised graph's Laplacian; MagNet, Zhang et al.
            2021, searches `q ∈ [0, 0.25]`; the default is its upper end). Geisler et al.
            also scale `q` by the graph size; this module takes it as given.
        normalization: `"sym"` (`I − D_s^{-½} … D_s^{-½}`) or `None` (`D_s − …`).
        projection: `"linear"` or `"mlp"`.

    Shapes: `forward(coords) -> [b, n_max, d_model]` (zero at padding and virtual token);
    [`features`][mmpe.encodings.maglap.MagLap.features] gives `[b, n_max, 2k]`.

    Raises:
        ValueError: `k < 1`; `q` negative or not finite; an unknown `normalization` or
            `projection`.
        TypeError: coordinates without `GraphLayout` and `GraphAdjacency`.
    """

    saved_settings = ("q", "normalization")

    def __init__(self, d_model: int, k: int = 8, q: float = 0.25,
                 normalization: str | None = "sym", projection: str = "linear") -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"maglap: k must be >= 1, got {k}")
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q < 0:
            raise ValueError(f"maglap: q must be a finite float >= 0, got {q!r}")
        check_laplacian_normalization("maglap", normalization)
        self.k, self.q, self.normalization = k, float(q), normalization
        self.proj = make_projection(2 * k, d_model, projection)

    def features(self, coords: Coordinates) -> Tensor:
        """`[Re V, Im V]` per node, `[b, n_max, 2k]` float32."""
        vecs, _, _ = magnetic_laplacian_pe(coords, self.k, self.q, self.normalization)
        return torch.cat([vecs.real, vecs.imag], dim=-1)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        x = self.features(coords).to(module_dtype(self.proj))
        return self.proj(x) * coords.node_mask[..., None]
