"""Sea-surface temperature (SST) on the globe: next month's anomaly, and infilling a global field.

Two tasks on real SST analyses that ship offline, tokens placed on the sphere
([`mmpe.coords.Sphere`][mmpe.coords.sphere.Sphere], with a time axis for the forecast):

* `task: forecast` — predict next month's SST anomaly from the previous `k` months.
  Data: the monthly OSTIA analysis (Donlon et al. 2012, *The Operational Sea Surface
  Temperature and Sea Ice Analysis (OSTIA) system*, Remote Sens. Environ. 116) in the
  `iris-sample-data` package (`pip install iris-sample-data`,
  `sample_data/ostia_monthly.nc`): 54 months (2006-04 … 2010-09), latitudes −5° … +5° (a
  tropical band, 18 rows) × 432 longitudes (0° … 359.17°E, the full circle, date line included),
  in K, masked over land. The field is averaged to a coarse grid (default 3 × 9 points: 6 rows
  of ≈1.67° × 48 columns of 7.5°; a cell is ocean when at least half of its points are). Months
  are split by time: the last 12 months (2009-10 … 2010-09) are the test year, the 12 before
  the validation year, the first 30 train. The anomaly is the SST minus the per-calendar-month
  climatology computed on the **training months only** (2–3 years per calendar month). An
  example is one target month `t`: tokens `(lat, lon, month)` for the `k` previous months
  (time stamps `0 … k−1` months, carrying their anomaly) and query tokens at month `t`
  (time stamp `k`), on which the model predicts the anomaly. The **date-line sector**
  165°E … 195°E (165°E–165°W) is held out: its cells appear in no training example (neither
  as history nor as target); at validation/test time every cell is given as history and the
  error inside the sector is reported separately.
* `task: infill` — reconstruct the SST at masked ocean cells of one global field from
  visible ones. Data: the HadISST1 month (Rayner et al. 2003, *Global analyses of sea surface
  temperature, sea ice, and night marine air temperature since the late nineteenth century*,
  J. Geophys. Res. 108, D14, 4407) that ships with cartopy
  (`cartopy/data/netcdf/HadISST1_SST_update.nc`: 2012-08, 1° × 1°, °C; sea ice is −1.8 °C).
  It holds one month only, so no sequence can come from it. Averaged to 5° cells (36 × 72,
  centred on 179.5°W + 5°·j, latitudes −87.5° + 5°·i). Each example holds `n_obs` visible
  ocean cells (tokens carry their SST) and `n_query` query cells. Held-out regions: **polar**
  (`|lat| > 60°`) and the **date line** (165°E … 195°E, `|lat| ≤ 60°`; the two are
  disjoint) never appear in training; the test sets put the queries inside a region and the
  visible cells anywhere.

Metrics: area-weighted RMSE (weights `cos φ` over ocean cells; WeatherBench eq. 2, FourCastNet
§4) in K (an SST difference of 1 K is 1 °C). Losses are area-weighted MSEs.

Encodings. `--model.encoding` names a registered encoding. For the forecast a spatial input
encoding on the sphere (family `sphere`: `latlon_raw`, `latlon_sincos`, `latlon_grid`,
`spherical_harmonics`, `sphere_m` …) is composed with sinusoids of the time stamp (months)
through `spacetime` (`P = P_space(φ, λ) + P_time(t)`, the Earthformer sum of per-axis
embeddings: Gao et al. 2022, *Earthformer: Exploring Space-Time Transformers for Earth System
Forecasting*, NeurIPS), so `latlon_sincos` gives the *flat* lat/lon/time encoding and
`spherical_harmonics` the *spherical + temporal* one; `latlon_grid` is FourCastNet's learned
per-cell table (Pathak et al. 2022, *FourCastNet: A Global Data-driven High-resolution Weather
Model using Adaptive Fourier Neural Operators*, arXiv:2202.11214) plus time sinusoids. Other
encodings are used as they are (`Positioned` ones such as `sincos` read `(lat, lon,
time)` in radians and months; score encodings such as `alibi` read only the great-circle
angle, so they cannot tell the months apart).

Baselines (`python -m mmpe.recipes.sst baselines`), on the same test sets: forecast —
climatology (anomaly 0), persistence (anomaly of month `t` = anomaly of month `t − 1`) and
damped persistence (`α ·` that, `α` fitted on the training windows); infill — the mean of
the visible cells, their mean in the query's latitude band (±5°), and the nearest visible cell
(great circle).

    python -m mmpe.recipes.sst fit --config configs/sst/default.yaml --model.encoding spherical_harmonics
    python -m mmpe.recipes.sst fit --config configs/sst/infill.yaml --model.encoding latlon_sincos
    mmpe compare sst               # the five encodings and the baselines, 3 seeds each
    python -m mmpe.recipes.sst baselines
    mmpe report sst
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from mmpe.recipes.common import (
    LossMetricSteps,
    MissingDataError,
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    require,
    split_index,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mmpe import registry
from mmpe.coords import Sphere
from mmpe.coords.sphere import great_circle
from mmpe.transformer import Transformer

TASKS = ("forecast", "infill")
OSTIA_INSTALL = "pip install iris-sample-data"
HADISST_INSTALL = "pip install cartopy"
#: Held-out date-line sector, degrees east (165°E … 195°E = 165°W).
DATELINE_DEG = (165.0, 195.0)
#: Infill: latitudes beyond this (degrees, either hemisphere) form the held-out polar region.
POLAR_DEG = 60.0
INFILL_SETS = ("global", "polar", "dateline")

#: Per-task options given to a spatial encoding when ``encoding_options`` does not set them:
#: the forecast grid's rows are 1.67° apart, far finer than degree-9 harmonics (≈20°) resolve.
SPATIAL_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "forecast": {"spherical_harmonics": {"max_degree": 24}},
    "infill": {"spherical_harmonics": {"max_degree": 16}},
}

COLUMNS = ["fc RMSE", "fc dateline", "infill RMSE", "infill polar", "infill dateline"]

#: Baselines ``mmpe compare sst`` accepts as rows (no training): name -> key in
#: :func:`forecast_baselines` / :func:`infill_baselines`.
BASELINES = {"climatology": "climatology (anomaly 0)", "persistence": "persistence",
             "damped_persistence": "damped persistence", "visible_mean": "visible mean",
             "latband_mean": "latitude-band mean", "nearest_cell": "nearest visible cell"}


def _check_encoding(name: str) -> object:
    """A registry encoding or one of [`BASELINES`][mmpe.recipes.sst.BASELINES]."""
    return BASELINES.get(name) or registry.get(name)

COMPARE = CompareSpec(
    metric="rmse",
    columns=COLUMNS,
    xlabel="test set (area-weighted RMSE, K)",
    lower_is_better=True,
    default_encodings=["latlon_raw", "latlon_sincos", "latlon_grid", "spherical_harmonics",
                       "sphere_m", *BASELINES],
    coords="sphere",
    check_encoding=_check_encoding,
    title="SST: next-month anomaly (OSTIA, tropical band) and global infilling (HadISST), "
          "area-weighted RMSE in K",
    notes=[
        "fc RMSE / fc dateline: next-month SST anomaly (OSTIA 2006-04…2010-09, 5°S–5°N, 6 × 48 "
        "cells) on the test year 2009-10…2010-09, outside / inside the held-out date-line sector "
        "165°E–195°E (never seen in training); k = 3 months of history.",
        "infill RMSE / polar / dateline: HadISST 2012-08 on 5° cells, 64 queries from 192 visible "
        "cells; queries outside the held-out regions / at |lat| > 60° / in 165°E–195°E.",
        "For the forecast, spatial encodings are composed with time sinusoids (spacetime); "
        f"baselines (no training, the same every seed): {', '.join(BASELINES)}.",
    ],
)


# ---------------------------------------------------------------------------------------------
# Data: files, coarse grids, climatology, held-out masks
# ---------------------------------------------------------------------------------------------
def ostia_path() -> Path:
    """`ostia_monthly.nc` of `iris-sample-data`.

    Raises:
        mmpe.recipes.common.MissingDataError: the package is not installed (names the command).
    """
    pkg = require("iris_sample_data", OSTIA_INSTALL)
    path = Path(pkg.__path__[0]) / "sample_data" / "ostia_monthly.nc"
    if not path.exists():
        raise MissingDataError(f"{path} is missing: run `{OSTIA_INSTALL}`")
    return path


def hadisst_path() -> Path:
    """cartopy's `HadISST1_SST_update.nc` (one month, 2012-08).

    Raises:
        mmpe.recipes.common.MissingDataError: cartopy is not installed (names the command).
    """
    pkg = require("cartopy", HADISST_INSTALL)
    path = Path(pkg.__path__[0]) / "data" / "netcdf" / "HadISST1_SST_update.nc"
    if not path.exists():
        raise MissingDataError(f"{path} is missing: run `{HADISST_INSTALL}`")
    return path


@functools.lru_cache(maxsize=1)
def load_ostia() -> dict[str, np.ndarray]:
    """The OSTIA monthly field.

    Returns:
        `{"sst": [54, 18, 432] float64 K (NaN over land), "lat": [18] degrees north
            (−5 … 4.44), "lon": [432] degrees east (0 … 359.17), "year": [54], "month": [54]
            (1 … 12)}`.
    """
    netcdf = require("netCDF4", "pip install netCDF4")
    with netcdf.Dataset(ostia_path()) as ds:
        var = ds.variables["surface_temperature"]
        if getattr(var, "units", "K") != "K":
            raise ValueError(f"OSTIA: expected SST in K, got {var.units!r}")
        sst = np.ma.filled(np.ma.asarray(var[:], dtype=np.float64), np.nan)
        lat = np.asarray(ds.variables["latitude"][:], dtype=np.float64)
        lon = np.asarray(ds.variables["longitude"][:], dtype=np.float64)
        t = ds.variables["time"]
        dates = netcdf.num2date(t[:], t.units, getattr(t, "calendar", "standard"))
    year = np.array([d.year for d in dates])
    month = np.array([d.month for d in dates])
    return {"sst": sst, "lat": lat, "lon": lon, "year": year, "month": month}


@functools.lru_cache(maxsize=1)
def load_hadisst() -> dict[str, np.ndarray]:
    """The HadISST month of cartopy.

    Returns:
        `{"sst": [180, 360] float64 °C (NaN over land; sea ice −1.8 °C), "lat": [180]
            ascending (−89.5 … 89.5), "lon": [360] (−179.5 … 179.5)}`.
    """
    netcdf = require("netCDF4", "pip install netCDF4")
    with netcdf.Dataset(hadisst_path()) as ds:
        sst = np.ma.filled(np.ma.asarray(ds.variables["sst"][0], dtype=np.float64), np.nan)
        lat = np.asarray(ds.variables["lat"][:], dtype=np.float64)
        lon = np.asarray(ds.variables["lon"][:], dtype=np.float64)
    sst[sst < -100] = np.nan  # fill values that escaped the mask
    if lat[0] > lat[-1]:
        sst, lat = sst[::-1].copy(), lat[::-1].copy()
    return {"sst": sst, "lat": lat, "lon": lon}


def coarsen(field: np.ndarray, fy: int, fx: int, min_ocean: float = 0.5) -> np.ndarray:
    """Block means of `fy × fx` points over the last two axes, ignoring NaN (land).

    A block with fewer than `min_ocean` of its points valid is NaN (land).
    """
    *lead, ny, nx = field.shape
    if ny % fy or nx % fx:
        raise ValueError(f"coarsen: {ny}×{nx} is not divisible into {fy}×{fx} blocks")
    blocks = field.reshape(*lead, ny // fy, fy, nx // fx, fx)
    valid = np.isfinite(blocks)
    count = valid.sum(axis=(-3, -1))
    total = np.where(valid, blocks, 0.0).sum(axis=(-3, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    return np.where(count >= min_ocean * fy * fx, mean, np.nan)


def ostia_grid(lat_block: int = 3, lon_block: int = 9) -> dict[str, np.ndarray]:
    """OSTIA on the coarse grid: `sst [54, ny, nx]` K, `lat [ny]`, `lon [nx]` (cell means of
    the points' coordinates, degrees east in `[0, 360)`), `year`, `month`."""
    d = load_ostia()
    sst = coarsen(d["sst"], lat_block, lon_block)
    lat = d["lat"].reshape(-1, lat_block).mean(1)
    lon = d["lon"].reshape(-1, lon_block).mean(1)
    return {"sst": sst, "lat": lat, "lon": lon, "year": d["year"], "month": d["month"]}


def hadisst_grid(block: int = 5) -> dict[str, np.ndarray]:
    """HadISST on `block`° cells: `sst [180/block, 360/block]` °C, `lat`, `lon` (degrees).

    Columns are shifted by `block // 2` points so that cell `j` is centred on
    `−179.5° + block·j`, half a point from [`mmpe.Sphere.grid`][mmpe.coords.sphere.Sphere.grid]'s `−180° + block·j`:
    every cell then falls in its own column of a `latlon_grid` table.
    """
    d = load_hadisst()
    shift = block // 2
    sst = coarsen(np.roll(d["sst"], shift, axis=-1), block, block)
    lat = d["lat"].reshape(-1, block).mean(1)
    lon = -179.5 + block * np.arange(360 // block) + (block - 1) / 2 - shift
    return {"sst": sst, "lat": lat, "lon": lon}


def in_sector(lon: np.ndarray, sector: tuple[float, float] = DATELINE_DEG) -> np.ndarray:
    """Whether longitudes (degrees, any convention) lie in `[west, east)` degrees east
    (`east` may exceed 360: 165 … 195 is 165°E … 165°W)."""
    west, east = sector
    rel = np.mod(np.asarray(lon, dtype=np.float64) - west, 360.0)
    return rel < (east - west)


def split_months(n_months: int, n_val: int = 12, n_test: int = 12) -> dict[str, np.ndarray]:
    """Month indices by split, in time order: train first, then validation, then test."""
    if n_months - n_val - n_test < 1:
        raise ValueError(f"split_months: {n_months} months leave no training months")
    idx = np.arange(n_months)
    return {"train": idx[: n_months - n_val - n_test],
            "val": idx[n_months - n_val - n_test: n_months - n_test],
            "test": idx[n_months - n_test:]}


def climatology(sst: np.ndarray, month: np.ndarray, train: np.ndarray) -> np.ndarray:
    """Per-calendar-month mean `[12, ...]` of `sst [T, ...]` over the months `train` only.

    Raises:
        ValueError: a calendar month has no training month.
    """
    month = np.asarray(month)
    out = np.empty((12, *sst.shape[1:]))
    for m in range(1, 13):
        sel = np.asarray(train)[month[train] == m]
        if len(sel) == 0:
            raise ValueError(f"climatology: no training month is calendar month {m}")
        out[m - 1] = sst[sel].mean(0)
    return out


def anomalies(sst: np.ndarray, month: np.ndarray, train: np.ndarray) -> np.ndarray:
    """`sst − climatology[calendar month]` with the climatology of the `train` months only."""
    clim = climatology(sst, month, train)
    return sst - clim[np.asarray(month) - 1]


def persistence(anom: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Persistence forecast: the anomaly of month `t − 1` for every target month `t`."""
    targets = np.asarray(targets)
    if (targets < 1).any():
        raise ValueError("persistence: a target month needs a previous month")
    return anom[targets - 1]


def cell_weights(lat: np.ndarray) -> np.ndarray:
    """Area weights `cos φ` (latitudes in degrees), normalised to mean 1 over `lat`."""
    w = np.cos(np.radians(np.asarray(lat, dtype=np.float64)))
    return w / w.mean()


def weighted_rmse(pred: np.ndarray, target: np.ndarray, weight: np.ndarray) -> float:
    """`√(Σ w (pred − target)² / Σ w)` over all entries (broadcast)."""
    pred, target = np.broadcast_arrays(np.asarray(pred, float), np.asarray(target, float))
    w = np.broadcast_to(np.asarray(weight, float), pred.shape)
    return float(np.sqrt((w * (pred - target) ** 2).sum() / w.sum()))


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------
class ForecastWindows(Dataset):
    """One item per target month: the `k` previous months of `cells` and the target month.

    Item: `{"lat", "lon" [n] (degrees), "time" [n] (months: 0 … k−1 history, k target),
    "value" [n] (normalised anomaly; targets hold theirs), "last" [n] (targets: the cell's
    anomaly at month t − 1, the persistence forecast; 0 on history), "observed" [n] bool,
    "weight" [n] (area weight), "region" [n] (1 inside the date-line sector)}` with `n = (k + 1)·len(cells)`,
    history first (time-major).
    """

    def __init__(self, anom: np.ndarray, lat: np.ndarray, lon: np.ndarray, weight: np.ndarray,
                 region: np.ndarray, targets: np.ndarray, cells: np.ndarray, k: int,
                 std: float) -> None:
        self.anom, self.targets, self.cells, self.k, self.std = anom, np.asarray(targets), cells, k, std
        rep = lambda v: torch.tensor(np.tile(v[cells], k + 1), dtype=torch.float32)  # noqa: E731
        self.lat, self.lon, self.weight = rep(lat), rep(lon), rep(weight)
        self.region = torch.tensor(np.tile(region[cells], k + 1).astype(np.int64))
        self.time = torch.arange(k + 1, dtype=torch.float32).repeat_interleave(len(cells))
        self.observed = self.time < k

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int | tuple[int, int]) -> dict[str, Tensor]:
        _, i = split_index(index)
        t = int(self.targets[i])
        window = self.anom[t - self.k: t + 1][:, self.cells] / self.std
        last = np.concatenate([np.zeros(self.k * len(self.cells)), window[-2]])
        return {"lat": self.lat, "lon": self.lon, "time": self.time, "observed": self.observed,
                "value": torch.tensor(window.reshape(-1), dtype=torch.float32),
                "last": torch.tensor(last, dtype=torch.float32), "weight": self.weight,
                "region": self.region}


class InfillExamples(Dataset):
    """Random visible/query cells of one field; item `i` (or `(0, i)`) from the stream
    `(seed, i)`, `(epoch, i)` from `(seed, i, epoch)`: fresh cells every training epoch.

    `split`: `train`/`global` — visible and query cells outside the held-out regions;
    `polar`/`dateline` — queries in that region, visible cells anywhere else.
    Item: `{"lat", "lon", "value" (normalised SST), "observed", "weight", "region"}`, visible
    cells first.
    """

    def __init__(self, field: dict[str, np.ndarray], split: str, size: int, seed: int, n_obs: int,
                 n_query: int, mean: float, std: float) -> None:
        self.f, self.split, self.size, self.seed = field, split, size, seed
        self.n_obs, self.n_query, self.mean, self.std = n_obs, n_query, mean, std
        self.train_cells = np.flatnonzero(field["region"] == 0)
        self.query_cells = self.train_cells if split in ("train", "global") else \
            np.flatnonzero(field["region"] == {"polar": 1, "dateline": 2}[split])
        if len(self.query_cells) < n_query or len(self.train_cells) < n_obs + n_query:
            raise ValueError(f"infill: too few ocean cells for {n_obs} visible + {n_query} queries")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int | tuple[int, int]) -> dict[str, Tensor]:
        epoch, i = split_index(index)
        rng = np.random.default_rng([self.seed, i] if epoch == 0 else [self.seed, i, epoch])
        query = rng.choice(self.query_cells, self.n_query, replace=False)
        pool = self.train_cells if self.split in ("train", "global") else \
            np.arange(len(self.f["value"]))
        pool = np.setdiff1d(pool, query)
        obs = rng.choice(pool, self.n_obs, replace=False)
        cells = np.concatenate([obs, query])
        f = self.f
        as_t = lambda v, dt=torch.float32: torch.tensor(v[cells], dtype=dt)  # noqa: E731
        return {"lat": as_t(f["lat"]), "lon": as_t(f["lon"]),
                "value": torch.tensor((f["value"][cells] - self.mean) / self.std, dtype=torch.float32),
                "observed": torch.arange(len(cells)) < self.n_obs, "weight": as_t(f["weight"]),
                "region": as_t(f["region"], torch.int64)}


class SSTData(L.LightningDataModule):
    """Forecast windows (OSTIA) or infill examples (HadISST); see the module docstring.

    Args:
        task: `"forecast"` or `"infill"`.
        history: forecast: months of history `k`.
        lat_block, lon_block: forecast: OSTIA points per coarse cell (3 × 9 → 6 × 48 cells).
        val_months, test_months: forecast: months at the end held out for validation and test.
        cell_deg: infill: cell size in degrees (5 → 36 × 72).
        n_obs, n_query: infill: visible and query cells per example.
        batch_size: examples per step.
        train_examples: infill: examples per training epoch (fresh cells every epoch).
        test_examples: infill: examples per test set (fixed seeds).
        seed: infill: data seed (test sets use `seed + 1000 …`).

    Raises:
        ValueError: unknown `task` or non-positive sizes.
        mmpe.recipes.common.MissingDataError: the task's data package is missing.
    """

    def __init__(self, task: str = "forecast", history: int = 3, lat_block: int = 3,
                 lon_block: int = 9, val_months: int = 12, test_months: int = 12,
                 cell_deg: int = 5, n_obs: int = 192, n_query: int = 64, batch_size: int = 4,
                 train_examples: int = 4096, test_examples: int = 32, seed: int = 0) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        for arg, val in (("history", history), ("lat_block", lat_block), ("lon_block", lon_block),
                         ("cell_deg", cell_deg), ("n_obs", n_obs), ("n_query", n_query),
                         ("batch_size", batch_size), ("train_examples", train_examples),
                         ("test_examples", test_examples)):
            if val < 1:
                raise ValueError(f"{arg} must be >= 1, got {val}")
        self.save_hyperparameters()
        if task == "forecast":
            self._setup_forecast()
        else:
            self._setup_infill()

    # -- forecast --------------------------------------------------------------------------
    def _setup_forecast(self) -> None:
        hp = self.hparams
        g = ostia_grid(hp.lat_block, hp.lon_block)
        ny, nx = g["sst"].shape[1:]
        self.months = split_months(len(g["month"]), hp.val_months, hp.test_months)
        anom = anomalies(g["sst"], g["month"], self.months["train"]).reshape(len(g["month"]), -1)
        lat2, lon2 = np.meshgrid(g["lat"], g["lon"], indexing="ij")
        ocean = np.isfinite(g["sst"]).all(0).reshape(-1)
        self.cells = np.flatnonzero(ocean)
        self.lat, self.lon = lat2.reshape(-1), np.mod(lon2.reshape(-1) + 180.0, 360.0) - 180.0
        w = cell_weights(self.lat)
        self.weight = w / w[ocean].mean()  # mean 1 over the ocean cells
        self.region = in_sector(self.lon).astype(np.int64)
        self.train_cells = self.cells[self.region[self.cells] == 0]
        self.anom = anom
        tr = self.months["train"]
        self.std = float(np.nanstd(anom[np.ix_(tr, self.train_cells)]))
        self.grid_shape = (int(round(180.0 / (g["lat"][1] - g["lat"][0]))) if ny > 1 else 1, nx)
        k = hp.history
        self.targets = {s: m[m >= k] for s, m in self.months.items()}

    def windows(self, split: str) -> ForecastWindows:
        hp = self.hparams
        cells = self.train_cells if split == "train" else self.cells
        return ForecastWindows(self.anom, self.lat, self.lon, self.weight, self.region,
                               self.targets[split], cells, hp.history, self.std)

    # -- infill ----------------------------------------------------------------------------
    def _setup_infill(self) -> None:
        hp = self.hparams
        g = hadisst_grid(hp.cell_deg)
        lat2, lon2 = np.meshgrid(g["lat"], g["lon"], indexing="ij")
        ocean = np.isfinite(g["sst"]).reshape(-1)
        lat, lon = lat2.reshape(-1)[ocean], lon2.reshape(-1)[ocean]
        region = np.where(np.abs(lat) > POLAR_DEG, 1, np.where(in_sector(lon), 2, 0))
        self.field = {"lat": lat, "lon": lon, "value": g["sst"].reshape(-1)[ocean],
                      "weight": cell_weights(lat), "region": region}
        train = self.field["value"][region == 0]
        self.mean, self.std = float(train.mean()), float(train.std())
        self.grid_shape = g["sst"].shape

    def examples(self, split: str, size: int, seed: int) -> InfillExamples:
        hp = self.hparams
        return InfillExamples(self.field, split, size, seed, hp.n_obs, hp.n_query, self.mean, self.std)

    # -- shared ----------------------------------------------------------------------------
    @property
    def value_std(self) -> float:
        """K per unit of normalised value: model outputs × this = K."""
        return self.std

    @property
    def table_shape(self) -> tuple[int, int]:
        """`(n_lat, n_lon)` of a global `latlon_grid` table whose cells are this grid's."""
        return tuple(int(v) for v in self.grid_shape)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        if hp.task == "forecast":
            return epoch_loader(self.windows("train"), hp.batch_size, shuffle=True)
        return epoch_loader(self.examples("train", hp.train_examples, hp.seed), hp.batch_size,
                            shuffle=False, with_epoch=True)

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        if hp.task == "forecast":
            return DataLoader(self.windows("val"), batch_size=hp.batch_size)
        return DataLoader(self.examples("global", hp.test_examples, hp.seed + 500),
                          batch_size=hp.batch_size)

    def test_sets(self) -> dict[str, DataLoader]:
        """Fixed test loaders: `{"forecast": …}` (test year, every cell) or
        `{"global", "polar", "dateline": …}`."""
        hp = self.hparams
        if hp.task == "forecast":
            return {"forecast": DataLoader(self.windows("test"), batch_size=hp.batch_size)}
        return {name: DataLoader(self.examples(name, hp.test_examples, hp.seed + 1000 + k),
                                 batch_size=hp.batch_size) for k, name in enumerate(INFILL_SETS)}

    def test_dataloader(self) -> list[DataLoader]:
        return list(self.test_sets().values())


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
def encoding_spec(encoding: str, options: dict[str, Any] | None, task: str,
                  temporal: str | dict[str, Any] = "sinusoidal",
                  grid_shape: tuple[int, int] = (108, 48)) -> dict[str, Any]:
    """The encoding spec the model builds.

    Spatial sphere encodings get [`SPATIAL_DEFAULTS`][mmpe.recipes.sst.SPATIAL_DEFAULTS] for the task (unless `options` set
    them) and `latlon_grid` the `grid_shape` of the data; for the forecast an input encoding
    of family `sphere` is wrapped as `{"name": "spacetime", "spatial": ..., "temporal":
    temporal}`.
    """
    entry = registry.get(encoding)
    spec = {"name": entry.name, **SPATIAL_DEFAULTS.get(task, {}).get(entry.name, {}), **(options or {})}
    if entry.name == "latlon_grid":
        spec.setdefault("grid_shape", tuple(grid_shape))
    if task == "forecast" and entry.hook == "input" and entry.family == "sphere" \
            and entry.name != "spacetime":
        return {"name": "spacetime", "spatial": spec, "temporal": temporal}
    return spec


class SSTModel(LossMetricSteps, L.LightningModule):
    """Tokens on the sphere → [`mmpe.Transformer`][mmpe.transformer.Transformer] → a normalised value per query token.

    Token embeddings: `Linear(value) + e_visible` for history/visible tokens, `e_query` for
    queries. With `residual` (forecast only) a query token also carries its cell's anomaly of
    the last month, `Linear(last) + e_query`, and the prediction is that persistence forecast
    plus the model's correction. Loss: area-weighted MSE on the queries.

    Args:
        encoding: registry name of the positional encoding (see [`encoding_spec`][recipes.sst.encoding_spec]).
        encoding_options: extra options for it.
        temporal: the temporal part of `spacetime` for the forecast (spec).
        residual: forecast: predict the correction to persistence (see above).
        task: `"forecast"` or `"infill"` (linked from the data).
        value_std: K per unit of normalised value (linked from the data).
        grid_shape: `(n_lat, n_lon)` of a `latlon_grid` table (linked from the data).
        d_model, num_heads, depth, mlp_ratio: transformer size.
        distance_unit_deg: the great-circle angle (degrees) that counts as one step for ALiBi/T5.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
    """

    metric_name = "rmse"  # logged as train/rmse, val/rmse, test/rmse

    def __init__(self, encoding: str = "spherical_harmonics",
                 encoding_options: dict[str, Any] | None = None,
                 temporal: str | dict[str, Any] = "sinusoidal", residual: bool = True,
                 task: str = "forecast",
                 value_std: float = 1.0, grid_shape: tuple[int, int] = (108, 48),
                 d_model: int = 48, num_heads: int = 4, depth: int = 2, mlp_ratio: float = 2.0,
                 distance_unit_deg: float = 1.0, lr: float = 2e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 30) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.save_hyperparameters()
        spec = encoding_spec(encoding, encoding_options, task, temporal, tuple(grid_shape))
        if spec["name"] == "fire":
            spec.setdefault("init_L", math.pi)
        context = {"distance_unit": math.radians(distance_unit_deg)}
        self.transformer = Transformer(d_model, num_heads, depth, [spec], mlp_ratio=mlp_ratio,
                                       context=context)
        self.token = nn.Parameter(torch.randn(2, d_model) * 0.02)  # [visible, query]
        self.value_in = nn.Linear(1, d_model)
        self.head = nn.Linear(d_model, 1)

    def coords(self, batch: dict[str, Tensor]) -> Sphere:
        time = batch.get("time") if self.hparams.task == "forecast" else None
        return Sphere(batch["lat"], batch["lon"], units="deg", time=time)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Normalised value per token `[b, n]` (meaningful at the queries)."""
        obs = batch["observed"]
        value = torch.where(obs, batch["value"], torch.zeros_like(batch["value"]))
        query_in = self.token[1]
        residual = self.hparams.residual and self.hparams.task == "forecast"
        if residual:
            query_in = self.value_in(batch["last"][..., None]) + self.token[1]
        x = torch.where(obs[..., None], self.value_in(value[..., None]) + self.token[0], query_in)
        out = self.head(self.transformer(x, self.coords(batch))).squeeze(-1)
        return out + batch["last"] if residual else out

    def loss_and_metric(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(area-weighted MSE on queries, area-weighted RMSE in K)."""
        query = ~batch["observed"]
        w = batch["weight"] * query
        err = (self(batch) - batch["value"]) ** 2
        mse = (w * err).sum() / w.sum()
        return mse, mse.sqrt() * self.hparams.value_std


class _Sums:
    """Area-weighted squared errors per region, for RMSEs over a whole test set."""

    def __init__(self) -> None:
        self.se: dict[int, float] = {}
        self.w: dict[int, float] = {}

    def add(self, pred: Tensor, batch: dict[str, Tensor]) -> None:
        query = ~batch["observed"]
        err = (pred - batch["value"]) ** 2
        for r in torch.unique(batch["region"][query]).tolist():
            sel = query & (batch["region"] == r)
            self.se[r] = self.se.get(r, 0.0) + float((batch["weight"] * err)[sel].sum())
            self.w[r] = self.w.get(r, 0.0) + float(batch["weight"][sel].sum())

    def rmse(self, region: int | None = None, scale: float = 1.0) -> float:
        keys = list(self.se) if region is None else [region]
        se, w = sum(self.se.get(k, 0.0) for k in keys), sum(self.w.get(k, 0.0) for k in keys)
        return math.sqrt(se / w) * scale if w > 0 else float("nan")


@torch.no_grad()
def evaluate(model: SSTModel, loader: DataLoader, region: int | None = None) -> float:
    """Area-weighted RMSE (K) over the query tokens of `loader` (of one `region` code: 0
    outside the held-out regions, 1 date line (forecast) / polar (infill), 2 date line (infill))."""
    model.eval()
    sums = _Sums()
    for batch in loader:
        sums.add(model(batch), batch)
    return sums.rmse(region, model.hparams.value_std)


def forecast_baselines(data: SSTData) -> dict[str, dict[str, float]]:
    """Climatology, persistence and damped persistence (`α·` persistence, `α` fitted by
    least squares on the training months, in its row as `alpha`) on the forecast's test year:
    `{name: {"fc RMSE": outside the sector, "fc dateline": inside}}` (K)."""
    anom, tr = data.anom, data.targets["train"]
    prev, cur = anom[np.ix_(tr - 1, data.train_cells)], anom[np.ix_(tr, data.train_cells)]
    w_tr = data.weight[data.train_cells]
    alpha = float((w_tr * prev * cur).sum() / (w_tr * prev * prev).sum())
    test = data.targets["test"]
    target = anom[test]
    preds = {"climatology (anomaly 0)": np.zeros_like(target),
             "persistence": persistence(anom, test),
             "damped persistence": alpha * persistence(anom, test)}
    out = {}
    for name, pred in preds.items():
        row = {"alpha": alpha} if name == "damped persistence" else {}
        for col, reg in (("fc RMSE", 0), ("fc dateline", 1)):
            cells = data.cells[data.region[data.cells] == reg]
            row[col] = weighted_rmse(pred[:, cells], target[:, cells], data.weight[cells])
        out[name] = row
    return out


def infill_baselines(data: SSTData) -> dict[str, dict[str, float]]:
    """Mean of the visible cells, their latitude-band mean (±`cell_deg`) and the nearest
    visible cell, on the infill test sets: `{name: {"infill RMSE", "infill polar",
    "infill dateline"}}` (K)."""
    cols = {"global": "infill RMSE", "polar": "infill polar", "dateline": "infill dateline"}
    band = float(data.hparams.cell_deg)
    out: dict[str, dict[str, float]] = {"visible mean": {}, "latitude-band mean": {},
                                        "nearest visible cell": {}}
    for name, loader in data.test_sets().items():
        sums = {k: _Sums() for k in out}
        for batch in loader:
            obs = batch["observed"][0]
            lat, lon, val = batch["lat"], batch["lon"], batch["value"]
            lat_r, lon_r = torch.deg2rad(lat.double()), torch.deg2rad(lon.double())
            ang = great_circle(lat_r[:, :, None], lon_r[:, :, None], lat_r[:, None, obs], lon_r[:, None, obs])
            vis = val[:, obs]
            nearest = vis.gather(1, ang.argmin(-1))
            near_band = (lat[:, :, None] - lat[:, None, obs]).abs() <= band
            n_band = near_band.sum(-1)
            band_mean = (near_band * vis[:, None, :]).sum(-1) / n_band.clamp(min=1)
            by_lat = vis.gather(1, (lat[:, :, None] - lat[:, None, obs]).abs().argmin(-1))
            band_mean = torch.where(n_band > 0, band_mean, by_lat)
            mean = vis.mean(-1, keepdim=True).expand_as(val)
            for key, pred in (("visible mean", mean), ("latitude-band mean", band_mean),
                              ("nearest visible cell", nearest)):
                sums[key].add(pred.float(), batch)
        reg = {"global": 0, "polar": 1, "dateline": 2}[name]
        for key in out:
            out[key][cols[name]] = sums[key].rmse(reg, data.std)
    return out


def baselines(cli_args: list[str] | None = None) -> dict[str, dict[str, float]]:
    """The baselines on the test sets of `configs/sst/default.yaml` and `infill.yaml`
    (`cli_args` override both): `{method: {column: RMSE in K}}`."""
    from mmpe.recipes.common import CONFIGS

    rows: dict[str, dict[str, float]] = {}
    for config in ("default.yaml", "infill.yaml"):
        cli = make_cli(["--config", str(CONFIGS / "sst" / config), *(cli_args or [])], run=False)
        data = cli.datamodule
        rows.update(forecast_baselines(data) if data.hparams.task == "forecast" else infill_baselines(data))
    return rows


def _table(rows: dict[str, dict[str, float]]) -> str:
    lines = [f"| method | {' | '.join(COLUMNS)} |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, m in rows.items():
        cells = [f"{m[c]:.3f}" if m.get(c) is not None else "–" for c in COLUMNS]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


class SSTCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.task", "model.task")
        parser.link_arguments("data.value_std", "model.value_std", apply_on="instantiate")
        parser.link_arguments("data.table_shape", "model.grid_shape", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> SSTCLI:
    return make_lightning_cli(SSTCLI, SSTModel, SSTData, args, run)


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train `encoding` on both tasks (`configs/sst/default.yaml`, `infill.yaml`); test RMSEs
    (K). A name of [`BASELINES`][mmpe.recipes.sst.BASELINES] trains nothing: its RMSEs (None on the other task)."""
    if encoding in BASELINES:
        row = baselines(cli_args)[BASELINES[encoding]]
        return {**dict.fromkeys(COLUMNS), **row}
    results: dict[str, float | None] = {}
    for task, config in (("forecast", "default.yaml"), ("infill", "infill.yaml")):
        cli = fit_for_compare(make_cli, "sst", encoding, seed=seed, out_dir=Path(out_dir) / task,
                              cli_args=cli_args, config=config)
        data = cli.datamodule
        for name, loader in data.test_sets().items():
            if name == "forecast":
                results["fc RMSE"] = evaluate(cli.model, loader, 0)
                results["fc dateline"] = evaluate(cli.model, loader, 1)
            else:
                reg = {"global": 0, "polar": 1, "dateline": 2}[name]
                results[{"global": "infill RMSE", "polar": "infill polar",
                         "dateline": "infill dateline"}[name]] = evaluate(cli.model, loader, reg)
    return results


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "baselines":
        print(_table(baselines(sys.argv[2:])))
    elif len(sys.argv) > 1 and sys.argv[1] == "report":
        sys.exit("`python -m mmpe.recipes.sst report` is replaced by `mmpe report sst` (tables and "
                 "plots from stored runs; the baselines are rows of `mmpe compare sst`)")
    else:
        make_cli()
