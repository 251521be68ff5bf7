"""Points on the sphere S² given by latitude and longitude (climate, weather, remote sensing).

Flat 2D encodings of `(lat, lon)` break in two places on the globe: at the date line
(longitude −180° and +180° are the same meridian) and at the poles (every longitude is the same
point). [`Sphere`][mmpe.coords.sphere.Sphere] stores positions so that encodings can avoid both: as angles (radians),
as unit vectors on S², and with the great-circle angle between any two tokens.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, safe_sqrt

UNITS = ("deg", "rad")
_REAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                torch.int16, torch.int32, torch.int64, torch.uint8)


class Sphere(Coordinates):
    """Tokens at points on the unit sphere, optionally with a time stamp each.

    Args:
        lat: latitudes, `[n]` or `[b, n]` (a scalar is one point). In `[−90°, 90°]`
            (`[−π/2, π/2]` with `units="rad"`).
        lon: longitudes, same shape as `lat`; any finite value, wrapped to `[−180°, 180°)`.
        units: `"deg"` (default) or `"rad"`: the units of `lat`, `lon`.
        time: optional time stamp per token, same shape as `lat` (any unit, e.g. hours or
            steps), for `lat × lon × time` tokens as in EarthFormer-style models. Absolute
            stamps are welcome (ERA5's hours since 1900 ≈ 1.1e6, Unix seconds ≈ 1.7e9).
        device: where the position tensors live.

    Positions are stored in radians: float64 when `lat` or `lon` is a float64 tensor, float32
    otherwise (degrees are converted in float64 first). Time stamps are always held in float64,
    exactly as given (any float, and integers up to 2⁵³), whatever the dtype of `lat`/`lon`:
    float32 would round Unix seconds to 128 s and ERA5 hours to 7.5 min, so a float32 model
    still sees one-second and one-minute steps (the temporal encodings form their phases in
    float64, `time_distance` subtracts in float64).

    * `query_positions` / `key_positions`: `[n, 2]` or `[b, n, 2]` — `(lat, lon)` in
      radians; `[..., 3]` float64 with the time stamp appended when `time` is given.
    * [`unit_vectors`][mmpe.coords.sphere.Sphere.unit_vectors]: `[n, 3]` or `[b, n, 3]`, `(cos φ cos λ, cos φ sin λ, sin φ)`.
    * `distance(q, k, b)` = the great-circle angle (**radians**, in `[0, π]`)
      by the haversine formula in its two-sided form (below), accurate for tiny and for
      antipodal angles. Multiply by the radius for a length (6371.0 km for the Earth). Time does
      not enter the distance: see [`time_distance`][mmpe.coords.sphere.Sphere.time_distance].
    * `extent` is π, the diameter of the sphere (FIRE's normaliser).
    * `distance`, `extent` and [`time_distance`][mmpe.coords.sphere.Sphere.time_distance] return float32 (attention's dtype).
    * Capabilities: `Metric`, `Positioned` (`(lat, lon[, time])`) and `Spherical`; the
      sphere has no direction, so it is not `Directed`.

    With `h = sin²(Δφ/2) + cos φ₁ cos φ₂ sin²(Δλ/2)` (the haversine of the angle `d`) and
    `1 − h = sin²((φ₁+φ₂)/2) + cos φ₁ cos φ₂ cos²(Δλ/2)` (the haversine of `π − d`, the angle to
    the antipode), `d = 2·atan2(√h, √(1−h))`: both are sums of non-negative terms, so neither
    `arcsin` near 1 (antipodes) nor `arccos` near 1 (tiny angles) loses precision.

    Raises:
        ValueError: `units` not `"deg"`/`"rad"`; `lat` NaN or outside its range; `lon`
            or `time` not finite; integer `time` beyond 2⁵³ that float64 cannot hold exactly;
            shapes that differ or are not `[n]` / `[b, n]`; no points.
        TypeError: non-numeric input.
    """

    kind = "sphere"

    def __init__(
        self,
        lat: Tensor | np.ndarray | Seq[float] | float,
        lon: Tensor | np.ndarray | Seq[float] | float,
        units: str = "deg",
        time: Tensor | np.ndarray | Seq[float] | None = None,
        device: torch.device | str | None = None,
        *,
        grid_shape: tuple[int, ...] | None = None,
    ) -> None:
        if units not in UNITS:
            raise ValueError(f"Sphere: units must be one of {UNITS}, got {units!r}")
        keep64 = any(isinstance(v, Tensor) and v.dtype == torch.float64 for v in (lat, lon))
        dtype = torch.float64 if keep64 else torch.float32
        lat_t = _as_points("lat", lat, device)
        lon_t = _as_points("lon", lon, device)
        if lat_t.shape != lon_t.shape:
            raise ValueError(
                f"Sphere: lat {tuple(lat_t.shape)} and lon {tuple(lon_t.shape)} must have the same shape"
            )
        lat64, lon64 = lat_t.to(torch.float64), lon_t.to(torch.float64)
        if bool(torch.isnan(lat64).any()):
            raise ValueError("Sphere: lat contains NaN; latitudes must be numbers in [-90, 90] degrees")
        limit = 90.0 if units == "deg" else math.pi / 2
        # Radians typed as float32(π/2) lie 4e-8 past the pole; accept that rounding.
        tol = 0.0 if units == "deg" else 1e-6
        if bool((lat64.abs() > limit + tol).any()):
            worst = float(lat64.abs().max())
            unit = "degrees" if units == "deg" else "radians"
            raise ValueError(
                f"Sphere: lat must lie in [-{limit:g}, {limit:g}] {unit}, got |lat| = {worst:g}"
            )
        if not bool(torch.isfinite(lon64).all()):
            raise ValueError("Sphere: lon must be finite (NaN or inf given)")
        if units == "deg":
            _warn_if_radians(lat64, lon64)
            lat64, lon64 = torch.deg2rad(lat64), torch.deg2rad(lon64)
        lat64 = lat64.clamp(-math.pi / 2, math.pi / 2)
        self._lat = lat64.to(dtype)
        self._lon = wrap_longitude(lon64).to(dtype)
        self._time = None
        if time is not None:
            t = _as_times("time", time, device)
            if t.shape != lat_t.shape:
                raise ValueError(
                    f"Sphere: time must have the shape of lat {tuple(lat_t.shape)}, got {tuple(t.shape)}"
                )
            self._time = t
        #: ``(n_time, n_lat, n_lon)`` or ``(n_lat, n_lon)`` for tokens made by `grid`.
        self.grid_shape = grid_shape

    # -- construction -------------------------------------------------------------------
    @classmethod
    def grid(
        cls,
        n_lat: int,
        n_lon: int,
        times: Tensor | np.ndarray | Seq[float] | None = None,
        device: torch.device | str | None = None,
    ) -> Sphere:
        """A regular `n_lat × n_lon` grid of cell centres, optionally repeated at `times`.

        Latitudes `−90 + (i + ½)·180/n_lat` (cell centres, so no row sits on a pole), longitudes
        `−180 + j·360/n_lon`. Tokens are ordered row-major `(lat, lon)`; with `times`
        (`[n_t]`) `(time, lat, lon)`, time-major (EarthFormer's `T × H × W` cuboid order).
        `grid_shape` records `(n_lat, n_lon)` or `(n_t, n_lat, n_lon)`.

        Raises:
            ValueError: `n_lat` or `n_lon` not a positive int; `times` not 1D, not finite, or
                integers beyond 2⁵³ (held in float64, exactly, as `Sphere`'s `time`).
        """
        for arg, val in (("n_lat", n_lat), ("n_lon", n_lon)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"Sphere.grid: {arg} must be a positive int, got {val!r}")
        lat = -90.0 + (torch.arange(n_lat, dtype=torch.float64) + 0.5) * (180.0 / n_lat)
        lon = -180.0 + torch.arange(n_lon, dtype=torch.float64) * (360.0 / n_lon)
        lat_g, lon_g = torch.meshgrid(lat, lon, indexing="ij")
        if times is None:
            return cls(lat_g.flatten().float(), lon_g.flatten().float(), units="deg",
                       device=device, grid_shape=(n_lat, n_lon))
        t = _as_times("times", times, None)
        if t.dim() != 1 or t.numel() < 1:
            raise ValueError(f"Sphere.grid: times must be a non-empty 1D sequence, got shape {tuple(t.shape)}")
        n_t = t.numel()
        rep = lambda v: v.flatten().repeat(n_t).float()  # noqa: E731
        return cls(rep(lat_g), rep(lon_g), units="deg", time=t.repeat_interleave(n_lat * n_lon),
                   device=device, grid_shape=(n_t, n_lat, n_lon))

    # -- protocol -----------------------------------------------------------------------
    @property
    def num_queries(self) -> int:
        return self._lat.shape[-1]

    @property
    def num_keys(self) -> int:
        return self._lat.shape[-1]

    @property
    def lat(self) -> Tensor:
        """Latitudes φ `[n]` or `[b, n]`, radians in `[−π/2, π/2]`."""
        return self._lat

    @property
    def lon(self) -> Tensor:
        """Longitudes λ `[n]` or `[b, n]`, radians in `[−π, π)`."""
        return self._lon

    @property
    def time(self) -> Tensor | None:
        """Time stamps `[n]` or `[b, n]` float64 (the caller's unit, exact), or None."""
        return self._time

    @property
    def query_positions(self) -> Tensor:
        """`(lat, lon[, time])` of every token.

        `(lat, lon[, time])` per token, `[n, 2|3]` or `[b, n, 2|3]` (radians; float64 with
        a time axis, which keeps the stamps exact)."""
        parts = [self._lat, self._lon] + ([self._time] if self._time is not None else [])
        return torch.stack(parts, dim=-1)

    @property
    def key_positions(self) -> Tensor:
        return self.query_positions

    @property
    def num_axes(self) -> int:
        """2 — `(lat, lon)` — or 3 with a time axis."""
        return 2 if self._time is None else 3

    @property
    def unit_vectors(self) -> Tensor:
        """Points as unit vectors `(cos φ cos λ, cos φ sin λ, sin φ)`, `[n, 3]` or `[b, n, 3]`."""
        return lat_lon_to_unit(self._lat, self._lon)

    @property
    def device(self) -> torch.device:
        return self._lat.device

    @property
    def batch_size(self) -> int | None:
        return self._lat.shape[0] if self._lat.dim() == 2 else None

    def _gather(self, values: Tensor, idx: Tensor, b: Tensor | None) -> Tensor:
        if values.dim() == 1:
            return values[idx]
        if b is None:
            raise ValueError("Sphere: batched positions [b, n] need the batch index b")
        return values[b, idx]

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Great-circle angle between query `q_idx` and key `kv_idx`, radians in `[0, π]`.

        Computed in the positions' dtype and returned as float32, the dtype attention scores use
        (call [`great_circle`][mmpe.coords.sphere.great_circle] on [`lat`][mmpe.coords.sphere.Sphere.lat] / [`lon`][mmpe.coords.sphere.Sphere.lon] for float64 angles).
        """
        return great_circle(self._gather(self._lat, q_idx, b), self._gather(self._lon, q_idx, b),
                            self._gather(self._lat, kv_idx, b),
                            self._gather(self._lon, kv_idx, b)).to(torch.float32)

    def time_distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The time distance `|t_q − t_k|` in the time stamps' unit.

        `|t_q − t_k|` in the time stamps' unit, float32: subtracted in float64, so absolute
        stamps one second (Unix seconds) or one minute (hours since 1900) apart give that step.

        Raises:
            ValueError: the coordinates have no time axis.
        """
        if self._time is None:
            raise ValueError("Sphere: these coordinates have no time axis (pass time=...)")
        return (self._gather(self._time, q_idx, b) - self._gather(self._time, kv_idx, b)).abs().float()

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """π (radians): the largest great-circle angle, for every query."""
        return torch.full(torch.broadcast_shapes(q_idx.shape, () if b is None else b.shape),
                          math.pi, dtype=torch.float32, device=q_idx.device)

    def __repr__(self) -> str:
        return (f"Sphere(n={self.num_queries}, batched={self.batch_size is not None}, "
                f"time={self._time is not None}, grid_shape={self.grid_shape})")


# -- pure functions ----------------------------------------------------------------------
def wrap_longitude(lon: Tensor) -> Tensor:
    """Longitudes (radians) wrapped to `[−π, π)`."""
    out = torch.remainder(lon + math.pi, 2 * math.pi) - math.pi
    # remainder(-tiny, 2π) rounds to 2π: fold that back onto −π.
    return torch.where(out >= math.pi, out - 2 * math.pi, out)


def lat_lon_to_unit(lat: Tensor, lon: Tensor) -> Tensor:
    """Unit vectors `(cos φ cos λ, cos φ sin λ, sin φ)` `[..., 3]` from radians `lat`, `lon`."""
    cos_lat = torch.cos(lat)
    return torch.stack((cos_lat * torch.cos(lon), cos_lat * torch.sin(lon), torch.sin(lat)), dim=-1)


def _warn_if_radians(lat: Tensor, lon: Tensor) -> None:
    """Degrees that all fit radians' ranges, spread over more than a radian: radians passed as
    degrees would make every point sit within ~1.6° of (0°, 0°), a plausible-looking cloud."""
    if lat.numel() < 3:
        return
    lat, lon = lat.detach(), lon.detach()
    spread = max(float(lat.max() - lat.min()), float(lon.max() - lon.min()))
    if float(lat.abs().max()) <= math.pi / 2 and float(lon.abs().max()) <= math.pi and spread > 1.0:
        warnings.warn("Sphere: every lat is within ±π/2 and every lon within ±π, spread over "
                      f"{spread:.2f} units, with units='deg': these look like radians (a patch "
                      "of a few degrees near 0°N 0°E otherwise); pass units='rad' if they are",
                      UserWarning, stacklevel=3)


def great_circle(lat1: Tensor, lon1: Tensor, lat2: Tensor, lon2: Tensor) -> Tensor:
    """Great-circle angle (radians) between `(lat1, lon1)` and `(lat2, lon2)` (radians).

    `d = 2·atan2(√h, √(1−h))` with `h = sin²(Δφ/2) + cos φ₁ cos φ₂ sin²(Δλ/2)` and `1 − h`
    formed directly as `sin²((φ₁+φ₂)/2) + cos φ₁ cos φ₂ cos²(Δλ/2)`: stable for tiny and for
    antipodal angles. Inputs broadcast; the result has their broadcast shape.
    """
    cc = torch.cos(lat1) * torch.cos(lat2)
    dlon = (lon2 - lon1) / 2
    h = torch.sin((lat2 - lat1) / 2) ** 2 + cc * torch.sin(dlon) ** 2
    h_anti = torch.sin((lat2 + lat1) / 2) ** 2 + cc * torch.cos(dlon) ** 2
    # safe_sqrt: coincident (or antipodal) points differentiate to 0, not NaN
    return 2 * torch.atan2(safe_sqrt(h.clamp(min=0)), safe_sqrt(h_anti.clamp(min=0)))


def haversine(lat1, lon1, lat2, lon2, radius: float = 1.0, units: str = "deg") -> Tensor:
    """Great-circle distance `radius · angle` between points given in `units` (float64).

    `haversine(51.5074, -0.1278, 48.8566, 2.3522, radius=6371.0)` is London–Paris in km.
    """
    if units not in UNITS:
        raise ValueError(f"haversine: units must be one of {UNITS}, got {units!r}")
    vals = [torch.as_tensor(np.asarray(v, dtype=np.float64)) for v in (lat1, lon1, lat2, lon2)]
    if units == "deg":
        vals = [torch.deg2rad(v) for v in vals]
    return radius * great_circle(*vals)


def _as_times(name: str, value, device) -> Tensor:
    """Time stamps as float64, exactly as given: every float dtype converts exactly, and
    integers up to 2⁵³ (Unix nanoseconds ≈ 1.7e18 do not).

    Raises:
        ValueError: integers float64 cannot hold exactly (names the fix); what `_as_points`
            raises; stamps that are not finite.
    """
    t = _as_points(name, value, device, keep_integers=True)
    exact = t.to(torch.float64)
    if not t.is_floating_point() and not bool((exact.to(t.dtype) == t).all()):
        raise ValueError(f"Sphere: {name}: integers beyond 2^53 (largest |{name}| = "
                         f"{int(t.abs().max())}) are not exact in float64; subtract a reference "
                         f"epoch first (e.g. {name} - {name}.min()) or use a coarser unit")
    if not bool(torch.isfinite(exact).all()):
        raise ValueError(f"Sphere: {name} must be finite")
    return exact


def _as_points(name: str, value, device, keep_integers: bool = False) -> Tensor:
    if isinstance(value, Tensor):
        t = value
    else:
        try:
            t = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as err:
            raise TypeError(f"Sphere: {name} must be numeric (tensor, array or floats), got "
                            f"{type(value).__name__}") from err
    if t.dtype == torch.bool or t.is_complex() or t.dtype not in _REAL_DTYPES:
        raise TypeError(f"Sphere: {name} must hold real numbers, got dtype {t.dtype}")
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() not in (1, 2):
        raise ValueError(f"Sphere: {name} must have shape [n] or [b, n], got {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"Sphere: {name} holds no points")
    if not t.dtype.is_floating_point and not keep_integers:
        t = t.to(torch.float32)
    return t.to(device) if device is not None else t
