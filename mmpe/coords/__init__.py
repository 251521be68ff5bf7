"""Coordinate systems: every data type is one (see `mmpe.coords.base`)."""

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

