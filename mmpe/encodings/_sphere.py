"""Helpers shared by the sphere encodings (not a registered module: the name starts with `_`)."""

from __future__ import annotations

from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.encodings.base import Encoding
from mmpe.validation import check_positive_int  # noqa: F401  (re-exported: the one copy)


def sphere_angles(enc: Encoding, coords: Coordinates) -> tuple[Tensor, Tensor]:
    """Latitude and longitude (radians) `[s]` or `[b, s]` of `coords` after the check.

    Any coordinates providing the `Spherical` capability (`lat`, `lon` in radians) work,
    [`mmpe.coords.Sphere`][mmpe.coords.sphere.Sphere] or a user's own class.
    """
    enc.check_coords(coords)
    return coords.lat, coords.lon
