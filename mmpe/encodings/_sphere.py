"""Helpers shared by the sphere encodings (not a registered module: the name starts with ``_``)."""

from __future__ import annotations

from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.encodings.base import Encoding


def sphere_angles(enc: Encoding, coords: Coordinates) -> tuple[Tensor, Tensor]:
    """Latitude and longitude (radians) ``[s]`` or ``[b, s]`` of ``coords`` after the type check.

    Any coordinates of kind ``"sphere"`` whose positions are ``(lat, lon[, …])`` in radians work
    (:class:`mmpe.coords.Sphere`); extra axes such as time are ignored.
    """
    enc.check_coords(coords)
    pos = coords.query_positions
    if pos.shape[-1] < 2:
        raise ValueError(f"{type(enc).__name__}: sphere positions must be (lat, lon) radians, "
                         f"got {pos.shape[-1]} axes")
    return pos[..., 0], pos[..., 1]


def check_positive_int(name: str, arg: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}")
