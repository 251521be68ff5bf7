"""Coordinate systems: every data type is one (see ``mmpe.coords.base``)."""

from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.sequence import Sequence

__all__ = ["Coordinates", "Sequence", "index_grid"]
