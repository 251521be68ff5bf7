"""Random-walk structural encoding (RWSE) for graphs.

Dwivedi et al. 2022 ("Graph Neural Networks with Learnable Structural and Positional
Representations", ICLR; RWPE) as GraphGPS (Rampášek et al. 2022) uses it: the return
probabilities of a `t`-step random walk, `R_i = ([RW]_ii, [RW²]_ii, …, [RW^k]_ii)` with
`RW = D⁻¹A` (the `GraphLayout` member `rwse`; [`mmpe.graph_maths.random_walk_pe`][mmpe.graph_maths.random_walk_pe],
equal to PyG's `AddRandomWalkPE`), projected to the model width and added to the node
embeddings.
"""

from __future__ import annotations

from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout
from mmpe.encodings._precision import module_dtype
from mmpe.encodings.base import InputEncoding
from mmpe.encodings.lappe import make_projection
from mmpe.registry import register


@register("rwse", hook="input", needs=(GraphLayout,), learnable=True, family="graph",
          aliases=("rwpe",),
          paper="Dwivedi et al. 2022, Graph Neural Networks with Learnable Structural and "
                "Positional Representations (ICLR); Rampášek et al. 2022 (GraphGPS, NeurIPS)", context=("d_model",))
class RWSE(InputEncoding):
    """`P_i = proj(([RW^t]_ii)_{t=1..k})` with `RW = D⁻¹A`.

    Args:
        d_model: width of `P`.
        k: walk lengths `1 … k` (GraphGPS: 16-20).
        projection: `"linear"` or `"mlp"`.

    Shapes: `forward(coords) -> [b, n_max, d_model]` (zero at padding and virtual token).

    Raises:
        ValueError: `k < 1`, an unknown `projection`.
        TypeError: coordinates without the `GraphLayout` capability.
    """

    def __init__(self, d_model: int, k: int = 16, projection: str = "linear") -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"rwse: k must be >= 1, got {k}")
        self.k = k
        self.proj = make_projection(k, d_model, projection)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        return self.proj(coords.rwse(self.k).to(module_dtype(self.proj))) * coords.node_mask[..., None]
