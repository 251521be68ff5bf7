"""Coordinate systems: every data type is one (see `mmpe.coords.base`)."""

import warnings
from typing import Any

from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.composite import Composite
from mmpe.coords.cross import Cross, Latents, register_cross_distance, register_cross_positions
from mmpe.coords.graph import Graph
from mmpe.coords.grid import Grid
from mmpe.coords.numbers import Numbers
from mmpe.coords.packed_grid import PackedGrids
from mmpe.coords.points import Points
from mmpe.coords.randomized import randomized_positions
from mmpe.coords.sequence import Sequence
from mmpe.coords.spacetime import TimeLine
from mmpe.coords.sphere import Sphere
from mmpe.coords.table import Table
from mmpe.coords.vlm import (
           V2PESequence,
           VideoRoPEComposite,
           qwen2_5_vl_composite,
           v2pe_position_ids,
)

__all__ = ["Composite", "Coordinates", "Cross", "Graph", "Grid", "Latents", "Numbers", "PackedGrids", "Points", "Sequence",
           "Sphere", "Table", "TimeLine", "V2PESequence", "VideoRoPEComposite", "index_grid", "randomized_positions", "register_cross_distance",
           "qwen2_5_vl_composite", "register_cross_positions", "v2pe_position_ids"]


def __getattr__(name: str) -> Any:
    # PerImage is an encoding; it moved to mmpe.encodings in 0.2. Imported on first use, so
    # that the coordinates never import the encodings.
    if name == "PerImage":
        from mmpe.encodings.per_image import PerImage

        warnings.warn("mmpe.coords.PerImage moved to mmpe.encodings.per_image.PerImage (also "
                      "mmpe.PerImage) in 0.2; the old name is kept until 0.3", FutureWarning,
                      stacklevel=2)
        return PerImage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
