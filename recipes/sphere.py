"""Points on the globe: land/sea from position alone, and a global field from scattered samples.

Two tasks on real global data that ships offline, both reading tokens placed on the sphere
([`mmpe.coords.Sphere`][mmpe.coords.sphere.Sphere], batched: every example has its own points):

* `task: land` — land/sea classification from position alone. Data: the 30″ global land
  mask of `global-land-mask` (`pip install global-land-mask`; derived from the GLOBE DEM,
  NOAA, public domain), `globe.is_land(lat, lon)`. Each example is `n_points` points drawn
  uniformly by area (`sin φ ~ U(−1, 1)`, `λ ~ U(−180°, 180°)`); each token carries only its
  position and is classified land or sea. About 29 % of the surface is land.
* `task: geoid` — reconstruction of the EGM96 geoid (heights of the geoid above the WGS84
  ellipsoid, metres, −107 … 85 m; NGA/NASA, public domain; 0.25° grid in the Debian package
  `proj-data`: `apt-get install proj-data`, `/usr/share/proj/egm96_15.gtx`) from scattered
  observations. Each example holds `n_obs` observed points (tokens carry their height) and
  `n_query` query points (tokens carry a learned "query" vector); the model predicts the
  height at the queries. Values are bilinearly interpolated from the grid.

Held-out regions: a polar cap (`lat ≥ polar_cap_deg`, default 70°N) and a band across the date
line (`|lon| ≥ 180° − dateline_halfwidth_deg`, default 170°E…170°W) never appear in training
(neither as observations nor as queries). Test sets (fixed seeds): `geoid RMSE` — observations
and queries outside the held-out regions; `polar RMSE` and `dateline RMSE` — observations
everywhere (including inside the region) and queries inside the region. A flat encoding of
`(lat, lon)` meets positions it never saw there, and at the date line puts 179.9°E far from
179.9°W; encodings built on the sphere see neighbours as neighbours.

    python -m mmpe.recipes.sphere fit --config configs/sphere/default.yaml --model.encoding spherical_harmonics
    python -m mmpe.recipes.sphere fit --config configs/sphere/land.yaml --model.encoding fourier_sphere
    mmpe compare sphere --encodings latlon_raw,latlon_sincos,fourier_sphere,spherical_harmonics,alibi

Score encodings (`alibi`, `t5`, `fire`) read the great-circle angle; the model passes
`distance_unit = model.distance_unit_deg` (1° by default) to ALiBi and T5 — the "geodesic
ALiBi" — and `init_L = π` to FIRE.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
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

from mmpe.coords import Sphere
from mmpe.transformer import Transformer

LAND_INSTALL = "pip install global-land-mask"
GEOID_PATH = "/usr/share/proj/egm96_15.gtx"
GEOID_INSTALL = "apt-get install proj-data"
TASKS = ("land", "geoid")
GEOID_SETS = ("global", "polar", "dateline")

COMPARE = CompareSpec(
    metric="error",
    columns=["land err %", "geoid RMSE", "polar RMSE", "dateline RMSE"],
    xlabel="task (land: % misclassified; geoid: RMSE in metres, overall / held-out regions)",
    lower_is_better=True,
    default_encodings=["latlon_raw", "latlon_sincos", "fourier_sphere", "spherical_harmonics",
                       "alibi"],
    coords="sphere",
    title="Globe: land/sea error and EGM96 geoid reconstruction RMSE",
    notes=[
        "land err %: 100 − accuracy of land/sea from position alone (global-land-mask; ~29 % land).",
        "geoid RMSE (m): EGM96 heights at 64 query points from 192 scattered observations, outside "
        "the held-out regions; polar (≥70°N) and dateline (170°E–170°W) RMSE: queries inside "
        "regions never seen in training, observations everywhere.",
        "References on the same geoid test sets (global / polar / dateline): predicting the mean "
        "30.3 / 21.5 / 29.5 m; copying the nearest observation 12.0 / 12.4 / 12.3 m.",
        "alibi: geodesic ALiBi (great-circle angle, distance_unit 1°), no input encoding: a "
        "relative bias has no absolute position, so land/sea falls to the majority class.",
    ],
)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def load_geoid() -> np.ndarray:
    """EGM96 geoid heights `[721, 1440]` (metres), rows lat −90…90°, columns lon −180…179.75°.

    Raises:
        mmpe.recipes.common.MissingDataError: `proj-data` is not installed (names the apt command).
    """
    path = Path(GEOID_PATH)
    if not path.exists():
        raise MissingDataError(f"the EGM96 geoid grid {GEOID_PATH} is missing: run `{GEOID_INSTALL}`")
    grid = np.fromfile(path, ">f4", offset=40).astype(np.float64)
    return grid.reshape(721, 1440)


def geoid_at(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Bilinear EGM96 height (metres) at `lat`, `lon` (degrees; lon wrapped), any shape."""
    grid = load_geoid()
    y = (np.clip(lat, -90.0, 90.0) + 90.0) * 4.0
    x = (np.mod(np.asarray(lon) + 180.0, 360.0)) * 4.0
    y0 = np.clip(np.floor(y).astype(int), 0, 719)
    x0 = np.floor(x).astype(int) % 1440
    x1 = (x0 + 1) % 1440
    fy, fx = y - y0, x - np.floor(x)
    top = grid[y0, x0] * (1 - fx) + grid[y0, x1] * fx
    bot = grid[y0 + 1, x0] * (1 - fx) + grid[y0 + 1, x1] * fx
    return top * (1 - fy) + bot * fy


def is_land(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """`global_land_mask.globe.is_land` (bool) at degrees `lat`, `lon` (lon in [−180, 180))."""
    globe = require("global_land_mask.globe", LAND_INSTALL)
    lon = np.mod(np.asarray(lon) + 180.0, 360.0) - 180.0
    return np.asarray(globe.is_land(np.asarray(lat), lon), dtype=bool)


def sample_sphere(rng: np.random.Generator, n: int, region: str = "all", *, cap_deg: float = 70.0,
                  band_deg: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """`n` points uniform by area (degrees) in `region`: `all`, `train` (outside the held-out
    regions), `polar` (`lat ≥ cap_deg`) or `dateline` (`|lon| ≥ 180 − band_deg`)."""
    if region == "polar":
        z = rng.uniform(math.sin(math.radians(cap_deg)), 1.0, n)
        return np.degrees(np.arcsin(z)), rng.uniform(-180.0, 180.0, n)
    if region == "dateline":
        lon = rng.uniform(180.0 - band_deg, 180.0 + band_deg, n)
        return np.degrees(np.arcsin(rng.uniform(-1.0, 1.0, n))), np.mod(lon + 180.0, 360.0) - 180.0
    if region not in ("all", "train"):
        raise ValueError(f"sample_sphere: unknown region {region!r}")
    lats, lons, have = [], [], 0
    while have < n:
        lat = np.degrees(np.arcsin(rng.uniform(-1.0, 1.0, 2 * n)))
        lon = rng.uniform(-180.0, 180.0, 2 * n)
        if region == "train":
            keep = (lat < cap_deg) & (np.abs(lon) < 180.0 - band_deg)
            lat, lon = lat[keep], lon[keep]
        lats.append(lat)
        lons.append(lon)
        have += len(lat)
    return np.concatenate(lats)[:n], np.concatenate(lons)[:n]


class GlobeExamples(Dataset):
    """Examples of one task, each made from its own RNG stream (reproducible, in any order).

    Item `i` (or `(0, i)`) uses the stream `(seed, i)`; item `(epoch, i)` with
    `epoch > 0` (training epochs after the first) uses `(seed, i, epoch)`: fresh points.

    Land: `{"lat", "lon" [n] (degrees), "label" [n] float 0/1}`. Geoid: `{"lat", "lon",
    "value" [n] (normalised heights; queries hold their target), "observed" [n] bool}` with the
    `n_obs` observations first. `split` picks where points lie (see [`sample_sphere`][recipes.sphere.sample_sphere]).
    """

    def __init__(self, task: str, size: int, seed: int, split: str, n_obs: int, n_query: int,
                 cap_deg: float, band_deg: float, mean: float = 0.0, std: float = 1.0) -> None:
        self.task, self.size, self.seed, self.split = task, size, seed, split
        self.n_obs, self.n_query, self.cap, self.band = n_obs, n_query, cap_deg, band_deg
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int | tuple[int, int]) -> dict[str, Tensor]:
        epoch, i = split_index(index)
        rng = np.random.default_rng([self.seed, i] if epoch == 0 else [self.seed, i, epoch])
        kw = {"cap_deg": self.cap, "band_deg": self.band}
        if self.task == "land":
            lat, lon = sample_sphere(rng, self.n_obs, "all", **kw)
            label = is_land(lat, lon).astype(np.float32)
            return {"lat": torch.tensor(lat, dtype=torch.float32),
                    "lon": torch.tensor(lon, dtype=torch.float32), "label": torch.tensor(label)}
        obs_region = "train" if self.split in ("train", "global") else "all"
        q_region = "train" if self.split in ("train", "global") else self.split
        olat, olon = sample_sphere(rng, self.n_obs, obs_region, **kw)
        qlat, qlon = sample_sphere(rng, self.n_query, q_region, **kw)
        lat, lon = np.concatenate([olat, qlat]), np.concatenate([olon, qlon])
        value = (geoid_at(lat, lon) - self.mean) / self.std
        observed = np.arange(len(lat)) < self.n_obs
        return {"lat": torch.tensor(lat, dtype=torch.float32),
                "lon": torch.tensor(lon, dtype=torch.float32),
                "value": torch.tensor(value, dtype=torch.float32), "observed": torch.tensor(observed)}


class GlobeData(L.LightningDataModule):
    """Land/sea or geoid examples on the globe (see the module docstring).

    Args:
        task: `"land"` or `"geoid"`.
        n_obs: points per land example, observations per geoid example.
        n_query: query points per geoid example.
        batch_size: examples per step.
        train_examples: examples per training epoch (in order; fresh points each epoch).
        test_examples: examples per test set (fixed seeds; per region for the geoid).
        polar_cap_deg: southern edge of the held-out polar cap (°N).
        dateline_halfwidth_deg: half width of the held-out date-line band (degrees of longitude).
        seed: data seed (test sets use `seed + 1000 …`).

    Raises:
        ValueError: unknown `task` or non-positive sizes.
        mmpe.recipes.common.MissingDataError: the task's data package is missing (names its install).
    """

    def __init__(self, task: str = "geoid", n_obs: int = 192, n_query: int = 64, batch_size: int = 16,
                 train_examples: int = 100_000, test_examples: int = 32, polar_cap_deg: float = 70.0,
                 dateline_halfwidth_deg: float = 10.0, seed: int = 0) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        for arg, val in (("n_obs", n_obs), ("n_query", n_query), ("batch_size", batch_size),
                         ("train_examples", train_examples), ("test_examples", test_examples)):
            if val < 1:
                raise ValueError(f"{arg} must be >= 1, got {val}")
        self.save_hyperparameters()
        if task == "land":
            require("global_land_mask.globe", LAND_INSTALL)
            self.mean, self.std = 0.0, 1.0
        else:
            lat, lon = sample_sphere(np.random.default_rng(seed + 999), 200_000, "train",
                                     cap_deg=polar_cap_deg, band_deg=dateline_halfwidth_deg)
            heights = geoid_at(lat, lon)
            self.mean, self.std = float(heights.mean()), float(heights.std())

    @property
    def value_std(self) -> float:
        """Standard deviation (metres) of the training heights: model outputs × this = metres."""
        return self.std

    def dataset(self, split: str, size: int, seed: int) -> GlobeExamples:
        hp = self.hparams
        return GlobeExamples(hp.task, size, seed, split, hp.n_obs, hp.n_query, hp.polar_cap_deg,
                             hp.dateline_halfwidth_deg, self.mean, self.std)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        # In order, every example from its own (seed, epoch, index) stream; sharded under DDP.
        return epoch_loader(self.dataset("train", hp.train_examples, hp.seed), hp.batch_size,
                            shuffle=False, with_epoch=True)

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        split = "all" if hp.task == "land" else "global"
        return DataLoader(self.dataset(split, hp.test_examples, hp.seed + 500), batch_size=hp.batch_size)

    def test_sets(self) -> dict[str, DataLoader]:
        """Fixed test loaders: `{"land": …}` or `{"global", "polar", "dateline": …}`."""
        hp = self.hparams
        names = ("land",) if hp.task == "land" else GEOID_SETS
        return {name: DataLoader(self.dataset("all" if name == "land" else name, hp.test_examples,
                                              hp.seed + 1000 + k), batch_size=hp.batch_size)
                for k, name in enumerate(names)}

    def test_dataloader(self) -> list[DataLoader]:
        return list(self.test_sets().values())


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
class GlobeModel(LossMetricSteps, L.LightningModule):
    """Tokens on the sphere → [`mmpe.Transformer`][mmpe.transformer.Transformer] → a logit (land) or a height (geoid).

    Token embeddings: land — one learned vector for every token (position enters only through
    the encoding); geoid — `Linear(height) + e_obs` for observations, `e_query` for queries.

    Args:
        encoding: registry name of the positional encoding (any with `"sphere"` coordinates).
        encoding_options: extra options for it.
        task: `"land"` or `"geoid"` (linked from the data).
        value_std: metres per unit of normalised height (linked from the data).
        d_model, num_heads, depth, mlp_ratio: transformer size.
        distance_unit_deg: the great-circle angle (degrees) that counts as one step for ALiBi
            and T5.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
    """

    metric_name = "metric"  # logged as train/metric, val/metric, test/metric

    def __init__(self, encoding: str = "spherical_harmonics",
                 encoding_options: dict[str, Any] | None = None, task: str = "geoid",
                 value_std: float = 1.0, d_model: int = 64, num_heads: int = 4, depth: int = 2,
                 mlp_ratio: float = 2.0, distance_unit_deg: float = 1.0, lr: float = 2e-3,
                 weight_decay: float = 0.01, warmup_steps: int = 50) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.save_hyperparameters()
        spec = {"name": encoding, **(encoding_options or {})}
        if encoding == "fire":  # FIRE's threshold L starts at the sphere's extent, π radians
            spec.setdefault("init_L", math.pi)
        context = {"distance_unit": math.radians(distance_unit_deg)}
        self.transformer = Transformer(d_model, num_heads, depth, [spec], mlp_ratio=mlp_ratio,
                                       context=context)
        self.token = nn.Parameter(torch.randn(2, d_model) * 0.02)  # [observed, query] / land
        self.value_in = nn.Linear(1, d_model)
        if task == "land":  # no observed values: frozen, so DDP need not look for unused parameters
            self.value_in.requires_grad_(False)
        self.head = nn.Linear(d_model, 1)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Per-token output `[b, n]`: land logit or normalised height."""
        coords = Sphere(batch["lat"], batch["lon"], units="deg")
        lat = batch["lat"]
        if self.hparams.task == "land":
            x = self.token[0].expand(*lat.shape, -1)
        else:
            obs = batch["observed"]
            value = torch.where(obs, batch["value"], torch.zeros_like(batch["value"]))
            x = torch.where(obs[..., None], self.value_in(value[..., None]) + self.token[0], self.token[1])
        return self.head(self.transformer(x, coords)).squeeze(-1)

    def loss_and_metric(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Land: (BCE, error %); geoid: (MSE on queries, RMSE in metres)."""
        out = self(batch)
        if self.hparams.task == "land":
            loss = F.binary_cross_entropy_with_logits(out, batch["label"])
            err = ((out > 0).float() != batch["label"]).float().mean() * 100
            return loss, err
        query = ~batch["observed"]
        mse = F.mse_loss(out[query], batch["value"][query])
        return mse, mse.sqrt() * self.hparams.value_std


@torch.no_grad()
def evaluate(model: GlobeModel, loader: DataLoader) -> float:
    """Land: error % over all points; geoid: RMSE (metres) over all query points of `loader`."""
    model.eval()
    total, count = 0.0, 0
    for batch in loader:
        out = model(batch)
        if model.hparams.task == "land":
            total += float(((out > 0).float() != batch["label"]).float().sum())
            count += batch["label"].numel()
        else:
            query = ~batch["observed"]
            total += float(((out[query] - batch["value"][query]) ** 2).sum())
            count += int(query.sum())
    metric = total / count
    return metric * 100 if model.hparams.task == "land" else math.sqrt(metric) * model.hparams.value_std


class GlobeCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.task", "model.task")
        parser.link_arguments("data.value_std", "model.value_std", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> GlobeCLI:
    return make_lightning_cli(GlobeCLI, GlobeModel, GlobeData, args, run)


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train `encoding` on both tasks (`configs/sphere/land.yaml`, `default.yaml`); test errors."""
    results: dict[str, float | None] = {}
    for task, config in (("land", "land.yaml"), ("geoid", "default.yaml")):
        cli = fit_for_compare(make_cli, "sphere", encoding, seed=seed, out_dir=Path(out_dir) / task,
                              cli_args=cli_args, config=config)
        for name, loader in cli.datamodule.test_sets().items():
            column = {"land": "land err %", "global": "geoid RMSE", "polar": "polar RMSE",
                      "dateline": "dateline RMSE"}[name]
            results[column] = evaluate(cli.model, loader)
    return results


if __name__ == "__main__":
    make_cli()
