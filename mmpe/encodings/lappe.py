"""Laplacian eigenvector positional encoding (LapPE) for graphs.

Dwivedi & Bresson 2020 ("A Generalization of Transformer Networks to Graphs", AAAI-W) and
Dwivedi et al. 2020 ("Benchmarking Graph Neural Networks"), as GraphGPS (Rampášek et al. 2022,
NeurIPS) uses it: the `k` smallest non-trivial eigenvectors `U [n, k]` of the symmetric
normalised Laplacian `I − D^-½ A D^-½` (the `GraphLayout` member `laplacian_pe`;
[`mmpe.graph_maths.laplacian_pe`][mmpe.graph_maths.laplacian_pe]) are projected to the model width, `P = proj(U)`, and
added to the node embeddings. During training every eigenvector's sign is flipped at random
(the sign is arbitrary), per graph.
"""

from __future__ import annotations

from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.encodings._precision import module_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.graph_maths import random_sign_flip
from mmpe.registry import register


def make_projection(k: int, d_model: int, kind: str, hidden: int | None = None) -> nn.Module:
    """`"linear"`: `Linear(k, d)`; `"mlp"`: `Linear(k, hidden) → ReLU → Linear(hidden, d)`."""
    if kind == "linear":
        return nn.Linear(k, d_model)
    if kind == "mlp":
        hidden = hidden or 2 * k
        return nn.Sequential(nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, d_model))
    raise ValueError(f"projection must be 'linear' or 'mlp', got {kind!r}")


@register("lappe", hook="input", needs=(GraphLayout,), learnable=True, family="graph",
          aliases=("laplacian_pe",),
          paper="Dwivedi & Bresson 2020, A Generalization of Transformer Networks to Graphs "
                "(AAAI DLG workshop); Rampášek et al. 2022, Recipe for a General, Powerful, "
                "Scalable Graph Transformer (NeurIPS)", context=("d_model",))
class LapPE(SavesSettings, InputEncoding):
    """`P_i = proj(s ⊙ U_i)`: Laplacian eigenvectors, random signs `s ∈ {±1}^k` in training.

    Args:
        d_model: width of `P`.
        k: number of eigenvectors (graphs with fewer than `k + 1` nodes get zero columns).
        projection: `"linear"` or `"mlp"`.
        normalization: `"sym"` or `None` (combinatorial Laplacian).
        sign_flip: flip signs at random while `self.training`.

    Shapes: `forward(coords) -> [b, n_max, d_model]` (zero at padding and virtual token).

    Raises:
        ValueError: `k < 1`, an unknown `projection`.
        TypeError: coordinates without the `GraphLayout` capability.
    """

    saved_settings = ("normalization",)

    def __init__(self, d_model: int, k: int = 8, projection: str = "linear",
                 normalization: str | None = "sym", sign_flip: bool = True) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"lappe: k must be >= 1, got {k}")
        self.k, self.normalization, self.sign_flip = k, normalization, sign_flip
        self.proj = make_projection(k, d_model, projection)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        pe, _ = coords.laplacian_pe(self.k, self.normalization)
        if self.training and self.sign_flip:
            pe = random_sign_flip(pe)
        return self.proj(pe.to(module_dtype(self.proj))) * coords.node_mask[..., None]
