"""Axial positional embeddings (Kitaev, Kaiser & Levskaya 2020, Reformer)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._positions import position_bound, table_positions
from mmpe.encodings.base import InputEncoding, PositionOutOfRangeError
from mmpe.registry import register


@register(
    "axial", hook="input", needs=(Positioned1D,), learnable=True, family="absolute",
    extrapolates=False, aliases=("axial_position",),
    paper="Kitaev, Kaiser & Levskaya 2020, Reformer: The Efficient Transformer (ICLR); axial "
          "positional embeddings of the trax/HF Reformer", context=("d_model", "max_len"))
class AxialPE(InputEncoding):
    """Learned embeddings factored over a 2D grid of positions (Reformer).

    Position `p < n1·n2` is the cell `(p // n2, p mod n2)` (row-major, as HF
    `ReformerAxialPositionEmbeddings`) and `P[p] = [P1[p // n2] ; P2[p mod n2]]`: two
    tables `P1 [n1, d1]` and `P2 [n2, d2]` with `d1 + d2 = d_model` — `n1·d1 + n2·d2`
    parameters instead of `n1·n2·d_model`. Positions `≥ n1·n2` have no embedding
    (cannot extrapolate).

    Args:
        d_model: embedding width.
        max_len: positions to cover (tokens); sets `shape` when it is not given.
        shape: `(n1, n2)`; default `n2 = ⌈√max_len⌉`, `n1 = ⌈max_len/n2⌉`.
        dims: `(d1, d2)` summing to `d_model`; default halves.

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: non-positive sizes, `dims` not summing to `d_model`.
        PositionOutOfRangeError: (a `ValueError`) a position `≥ n1·n2`.
    """

    def __init__(self, d_model: int, max_len: int = 4096, shape: tuple[int, int] | None = None,
                 dims: tuple[int, int] | None = None) -> None:
        super().__init__()
        if d_model < 2:
            raise ValueError(f"axial: d_model must be >= 2, got {d_model}")
        if max_len < 1:
            raise ValueError(f"axial: max_len must be >= 1 (tokens), got {max_len}")
        if shape is None:
            n2 = math.ceil(math.sqrt(max_len))
            shape = (math.ceil(max_len / n2), n2)
        if dims is None:
            dims = (d_model // 2, d_model - d_model // 2)
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"axial: shape must be two positive ints (n1, n2), got {shape}")
        if len(dims) != 2 or min(dims) < 1 or sum(dims) != d_model:
            raise ValueError(f"axial: dims must be two positive ints summing to d_model={d_model}, got {dims}")
        self.shape, self.dims = tuple(shape), tuple(dims)
        self.max_len = shape[0] * shape[1]
        self.row = nn.Parameter(torch.randn(shape[0], dims[0]) * 0.02)
        self.col = nn.Parameter(torch.randn(shape[1], dims[1]) * 0.02)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        pos = table_positions("axial", coords)
        top = position_bound(coords) - 1  # read once per coordinates object
        if top >= self.max_len:
            raise PositionOutOfRangeError(
                f"axial: position {top} is past the {self.shape[0]}x{self.shape[1]} = {self.max_len} "
                "positions of the axial tables; axial embeddings cannot extrapolate"
            )
        n2 = self.shape[1]
        return torch.cat((self.row[pos // n2], self.col[pos % n2]), dim=-1)
