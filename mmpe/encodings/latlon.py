"""Flat baselines on the sphere: latitude/longitude read as if they were a 2D plane.

Both treat `(lat, lon)` as Cartesian coordinates of a rectangle (the equirectangular map),
the assumption of image-style 2D encodings. They are here to be compared against: they jump at
the date line (λ = −180° and +180° are far apart on the map) and give different vectors for the
same pole point at different longitudes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.encodings._sphere import check_positive_int, sphere_angles
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.registry import register


@register(
    "latlon_sincos", hook="input", needs=(Spherical,), learnable=False, family="sphere",
    paper="Vaswani et al. 2017 sinusoids applied per axis to (lat, lon) in degrees, as the 2D "
          "sincos embedding of MAE (He et al. 2022) does on image rows/columns (flat baseline)", context=("d_model",))
class LatLonSinCos(SavesSettings, InputEncoding):
    """Fixed 2D sincos of raw `(lat, lon)` in degrees: `[PE(lat°), PE(lon°)]`.

    Half of `d_model` holds `sinusoidal_table(lat°, d_model/2)`, the other half the same for
    `lon°`: `sin(x / base^(2i/(d/2)))`, `cos(…)` — the equirectangular map seen as a 1°
    pixel grid, as a ViT's 2D sincos embedding would see it.

    Args:
        d_model: width, a multiple of 4.
        base: wavelength base (10000).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: `d_model` not a positive multiple of 4; `base <= 0`.
        TypeError: coordinates not on the sphere.
    """

    saved_settings = ("base",)

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 4 or d_model % 4:
            raise ValueError(f"latlon_sincos: d_model must be a positive multiple of 4, got {d_model!r}")
        if base <= 0:
            raise ValueError(f"latlon_sincos: base must be > 0, got {base}")
        self.d_model, self.base = d_model, float(base)

    def forward(self, coords: Coordinates) -> Tensor:
        lat, lon = sphere_angles(self, coords)
        half = self.d_model // 2
        return torch.cat((sinusoidal_table(torch.rad2deg(lat.double()), half, self.base),
                          sinusoidal_table(torch.rad2deg(lon.double()), half, self.base)), dim=-1)


@register(
    "latlon_raw", hook="input", needs=(Spherical,), learnable=True, family="sphere",
    paper="Direct (lat, lon) input, the 'direct'/'wrap'-free baseline of Mai et al. 2023 and "
          "Rußwurm et al. 2024 (flat baseline)", context=("d_model",))
class LatLonRaw(InputEncoding):
    """`P = W · (φ/(π/2), λ/π) + c`: raw latitude and longitude, scaled to `[−1, 1]`, linear.

    Args:
        d_model: output width.

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: non-positive `d_model`.
        TypeError: coordinates not on the sphere.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        check_positive_int("latlon_raw", "d_model", d_model)
        self.proj = nn.Linear(2, d_model)

    def forward(self, coords: Coordinates) -> Tensor:
        lat, lon = sphere_angles(self, coords)
        x = torch.stack((lat.float() / (math.pi / 2), lon.float() / math.pi), dim=-1)
        return self.proj(x.to(self.proj.weight.dtype))
