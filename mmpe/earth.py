"""Area-weighted metrics for fields on a latitude–longitude grid (weather and climate models).

A regular lat/lon grid over-samples the poles: a cell's area is proportional to `cos φ`.
Global scores therefore weight every cell by its latitude — WeatherBench (Rasp et al. 2020,
eq. 1-2) and FourCastNet (Pathak et al. 2022, §4) report the latitude-weighted RMSE

    `RMSE = √( Σ L(φ_i) (pred_i − target_i)² / Σ L(φ_i) )`, `L(φ) = cos φ / mean(cos φ)`

over the grid's cells, which for an `n_lat × n_lon` grid is WeatherBench's
`√(1/(N_lat N_lon) Σ_j Σ_k L(φ_j)(f_jk − t_jk)²)`.

    >>> import torch
    >>> lat = torch.tensor([-60.0, 0.0, 60.0])
    >>> area_weights(lat, units="deg")
    tensor([0.7500, 1.5000, 0.7500])
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

__all__ = ["area_weights", "weighted_mean", "weighted_rmse"]

UNITS = ("deg", "rad")


def _lat_radians(lat: Tensor, units: str, where: str) -> Tensor:
    if units not in UNITS:
        raise ValueError(f"{where}: units must be one of {UNITS}, got {units!r}")
    if not isinstance(lat, Tensor):
        lat = torch.as_tensor(lat)
    if lat.dtype == torch.bool or lat.is_complex():
        raise TypeError(f"{where}: lat must hold real numbers, got dtype {lat.dtype}")
    lat = lat.to(torch.promote_types(lat.dtype, torch.float32)) if lat.dtype.is_floating_point \
        else lat.to(torch.float32)
    limit = 90.0 if units == "deg" else math.pi / 2
    if bool((lat.abs() > limit * (1 + 1e-6)).any()) or not bool(torch.isfinite(lat).all()):
        raise ValueError(f"{where}: lat must be finite and lie in [-{limit:g}, {limit:g}] ({units})")
    return torch.deg2rad(lat) if units == "deg" else lat


def area_weights(lat: Tensor, units: str = "deg") -> Tensor:
    """`L(φ) = cos φ / mean(cos φ)`: each latitude's weight, mean 1 over `lat`.

    Args:
        lat: latitudes, any shape (the rows of a grid `[n_lat]`, or per token `[n]`).
        units: `"deg"` (default) or `"rad"`.

    Returns:
        The weights, `lat`'s shape (float32, or float64 for float64 input).

    Raises:
        ValueError: unknown `units`, a latitude outside `[−90°, 90°]`, or weights that sum
            to 0 (every latitude at a pole).
        TypeError: non-real `lat`.
    """
    w = torch.cos(_lat_radians(lat, units, "area_weights")).clamp_min(0.0)
    total = w.mean()
    if not bool(total > 0):
        raise ValueError("area_weights: every latitude is at a pole; the weights sum to 0")
    return w / total


def _reduce_dims(pred: Tensor, lat: Tensor, dim: int | Seq[int], where: str) -> tuple[int, ...]:
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        raise ValueError(f"{where}: dim must name at least one dimension")
    dims = tuple(d % pred.dim() for d in dims)
    if len(set(dims)) != len(dims):
        raise ValueError(f"{where}: dim has repeated dimensions: {dim}")
    if lat.dim() != len(dims):
        raise ValueError(
            f"{where}: lat must have one dimension per reduced dimension ({len(dims)} for "
            f"dim={dim}), got shape {tuple(lat.shape)}; for a grid [..., n_lat, n_lon] pass "
            "lat[:, None] ([n_lat, 1]), for tokens [..., n] pass lat [n] with dim=-1")
    target = tuple(pred.shape[d] for d in dims)
    for got, want in zip(lat.shape, target, strict=True):
        if got not in (1, want):
            raise ValueError(f"{where}: lat of shape {tuple(lat.shape)} does not broadcast to "
                             f"the reduced dimensions {target} of pred {tuple(pred.shape)}")
    return dims


def weighted_mean(values: Tensor, lat: Tensor, dim: int | Seq[int] = (-2, -1),
                  units: str = "deg") -> Tensor:
    """`Σ cos φ · values / Σ cos φ` over `dim` (area-weighted mean on the sphere).

    `lat` has one dimension per reduced dimension and broadcasts against them: `[n_lat, 1]`
    for `values [..., n_lat, n_lon]` (the default `dim`), `[n]` with `dim=-1` for
    per-token values `[..., n]`.

    Raises:
        ValueError: `lat` not matching the reduced dimensions, or as [`area_weights`][mmpe.earth.area_weights].
    """
    if not isinstance(values, Tensor) or not values.dtype.is_floating_point:
        raise TypeError("weighted_mean: values must be a floating-point tensor")
    lat = torch.as_tensor(lat, device=values.device)
    dims = _reduce_dims(values, lat, dim, "weighted_mean")
    w = torch.cos(_lat_radians(lat, units, "weighted_mean")).clamp_min(0.0).to(values.dtype)
    shape = [1] * values.dim()
    for d, size in zip(dims, w.shape, strict=True):
        shape[d] = size
    order = sorted(range(len(dims)), key=lambda i: dims[i])  # lat's axes in values' order
    w = w.permute(order).reshape(shape) if order != list(range(len(dims))) else w.reshape(shape)
    w = w.expand_as(values)
    total = w.sum(dim=dims)
    if not bool((total > 0).all()):
        raise ValueError("weighted_mean: the weights sum to 0 (every latitude at a pole)")
    return (w * values).sum(dim=dims) / total


def weighted_rmse(pred: Tensor, target: Tensor, lat: Tensor, dim: int | Seq[int] = (-2, -1),
                  units: str = "deg") -> Tensor:
    """Latitude-weighted RMSE.

    Latitude-weighted RMSE (WeatherBench eq. 2, FourCastNet §4): `√(weighted_mean((pred −
    target)², lat))` over `dim`, one value per remaining index (time, channel, batch).

    Args:
        pred, target: the same shape, e.g. `[time, channel, n_lat, n_lon]`.
        lat: `[n_lat, 1]` for a grid (default `dim=(-2, -1)`), or `[n]` per token with
            `dim=-1`; degrees by default.
        dim: the dimensions reduced (the grid's, or the tokens').
        units: `"deg"` or `"rad"` for `lat`.

    Returns:
        `pred`'s shape without `dim`.

    Raises:
        ValueError: `pred` and `target` of different shapes, `lat` not matching `dim`.
        TypeError: non-floating `pred`.
    """
    if not isinstance(pred, Tensor) or not isinstance(target, Tensor):
        raise TypeError("weighted_rmse: pred and target must be tensors")
    if pred.shape != target.shape:
        raise ValueError(f"weighted_rmse: pred {tuple(pred.shape)} and target "
                         f"{tuple(target.shape)} must have the same shape")
    err = (pred - target)
    if not err.dtype.is_floating_point:
        raise TypeError(f"weighted_rmse: pred and target must be floating point, got {err.dtype}")
    return weighted_mean(err * err, lat, dim, units).sqrt()
