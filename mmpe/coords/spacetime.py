"""The views a spatio-temporal encoding splits sphere coordinates into: time, and lat/lon alone.

[`spacetime`][mmpe.encodings.spacetime.SpaceTimePE] runs a temporal 1D encoding on the tokens'
time stamps (`TimeLine`) and a spatial one on their latitude and longitude; `LatLonOnly` is the
class that provides exactly what a spatial part may read, so `provides(LatLonOnly,
entry.needs)` says whether an encoding fits there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, StoredPositions

__all__ = ["LatLonOnly", "TimeLine"]


class TimeLine(StoredPositions):
    """The time stamps of spatio-temporal tokens as 1D coordinates (`Positioned1D`).

    `query_positions` = `key_positions` = `time[..., None]` (the time stamps' unit, e.g.
    hours or steps). A view for temporal encodings; it registers no `kind`.

    Raises:
        ValueError: `time` not a real tensor `[n]` or `[b, n]` of finite stamps.
    """

    num_axes = 1

    def __init__(self, time: Tensor) -> None:
        if not isinstance(time, Tensor) or time.dim() not in (1, 2) or time.is_complex() or \
                time.dtype == torch.bool:
            what = tuple(time.shape) if isinstance(time, Tensor) else type(time).__name__
            raise ValueError(f"TimeLine: time must be a real tensor [n] or [b, n], got {what}")
        if time.is_floating_point() and not bool(torch.isfinite(time).all()):
            raise ValueError("TimeLine: time must be finite (NaN or inf given)")
        self._pos = time.unsqueeze(-1)


class LatLonOnly(Coordinates):
    """A class with the `Spherical` members only (`lat`, `lon`): what a spatial part may need.
    Never instantiated; capability checks read its members."""

    lat: Tensor
    lon: Tensor

    @property
    def num_queries(self) -> int:  # pragma: no cover - never instantiated
        return 0
