"""The views a spatio-temporal encoding splits sphere coordinates into: time, and lat/lon alone.

[`spacetime`][mmpe.encodings.spacetime.SpaceTimePE] runs a temporal 1D encoding on the tokens'
time stamps (`TimeLine`) and a spatial one on their latitude and longitude; `LatLonOnly` is the
class that provides exactly what a spatial part may read, so `provides(LatLonOnly,
entry.needs)` says whether an encoding fits there.
"""

from __future__ import annotations

from torch import Tensor

from mmpe.coords.base import Coordinates, StoredPositions

__all__ = ["LatLonOnly", "TimeLine"]


class TimeLine(StoredPositions):
    """The time stamps of spatio-temporal tokens as 1D coordinates (`Positioned1D`).

    `query_positions` = `key_positions` = `time[..., None]` (the time stamps' unit, e.g.
    hours or steps). A view for temporal encodings; it registers no `kind`.
    """

    num_axes = 1

    def __init__(self, time: Tensor) -> None:
        self._pos = time.unsqueeze(-1)


class LatLonOnly(Coordinates):
    """A class with the `Spherical` members only (`lat`, `lon`): what a spatial part may need.
    Never instantiated; capability checks read its members."""

    lat: Tensor
    lon: Tensor

    @property
    def num_queries(self) -> int:  # pragma: no cover - never instantiated
        return 0
