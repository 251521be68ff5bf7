"""The globe recipe: real data loaders, area-uniform sampling, held-out regions, a smoke run."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from helpers import require_debian
from mmpe.recipes import sphere as recipe
from mmpe.recipes.common import MissingDataError

GTX = "/usr/share/proj/egm96_15.gtx"


def test_sampling_is_uniform_by_area_and_respects_regions():
    rng = np.random.default_rng(0)
    lat, lon = recipe.sample_sphere(rng, 200_000, "all")
    # Area fraction of |lat| < 30° is sin 30° = 1/2 (uniform latitude would give 1/3).
    assert np.mean(np.abs(lat) < 30) == pytest.approx(0.5, abs=0.01)
    assert np.mean(lon < 0) == pytest.approx(0.5, abs=0.01)
    lat, lon = recipe.sample_sphere(rng, 5000, "train", cap_deg=70, band_deg=10)
    assert lat.max() < 70 and np.abs(lon).max() < 170
    lat, _ = recipe.sample_sphere(rng, 5000, "polar", cap_deg=70)
    assert lat.min() >= 70
    _, lon = recipe.sample_sphere(rng, 5000, "dateline", band_deg=10)
    assert np.abs(lon).min() >= 170 and lon.max() < 180
    with pytest.raises(ValueError, match="region"):
        recipe.sample_sphere(rng, 5, "moon")


def test_land_mask_known_points():
    # London, Sahara, Antarctic plateau on land; mid-Pacific, South Atlantic at sea.
    land = recipe.is_land(np.array([51.5, 23.0, -80.0, 0.0, -30.0]),
                          np.array([-0.12, 10.0, 30.0, -150.0, -15.0]))
    assert land.tolist() == [True, True, True, False, False]
    rng = np.random.default_rng(1)
    frac = recipe.is_land(*recipe.sample_sphere(rng, 100_000, "all")).mean()
    assert frac == pytest.approx(0.29, abs=0.01)  # ~29 % of the Earth's surface is land


def test_geoid_grid_values_and_interpolation():
    require_debian("proj-data", path=GTX)
    grid = recipe.load_geoid()
    assert grid.shape == (721, 1440)
    assert grid.min() == pytest.approx(-107.0, abs=1.0) and grid.max() == pytest.approx(85.4, abs=1.0)
    # EGM96 at (0°, 0°) is 17.16 m (NGA's published value); at nodes the interpolation is exact.
    assert float(recipe.geoid_at(np.array([0.0]), np.array([0.0]))[0]) == pytest.approx(17.16, abs=0.01)
    assert float(recipe.geoid_at(np.array([10.0]), np.array([20.0]))[0]) == grid[400, 800]
    # Periodic in longitude: −180° and 180° are the same meridian.
    lat = np.array([-33.0, 12.3, 60.0])
    np.testing.assert_allclose(recipe.geoid_at(lat, np.full(3, -180.0)), recipe.geoid_at(lat, np.full(3, 180.0)))
    # Bilinear across the seam: lat 0.1° (row 360.4), lon 179.9° (column 1439.6, next column 0).
    mid = float(recipe.geoid_at(np.array([0.1]), np.array([179.9]))[0])
    top = 0.4 * grid[360, 1439] + 0.6 * grid[360, 0]
    bot = 0.4 * grid[361, 1439] + 0.6 * grid[361, 0]
    assert mid == pytest.approx(0.6 * top + 0.4 * bot, abs=1e-9)


def test_missing_geoid_names_the_install(monkeypatch):
    monkeypatch.setattr(recipe, "GEOID_PATH", "/nonexistent/egm96_15.gtx")
    recipe.load_geoid.cache_clear()
    try:
        with pytest.raises(MissingDataError, match="apt-get install proj-data"):
            recipe.load_geoid()
    finally:
        recipe.load_geoid.cache_clear()


def test_missing_land_mask_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "global_land_mask.globe", None)  # import now fails
    with pytest.raises(MissingDataError, match="pip install global-land-mask"):
        recipe.is_land(np.array([0.0]), np.array([0.0]))


def test_geoid_examples_hold_out_regions_and_hide_query_values():
    require_debian("proj-data", path=GTX)
    data = recipe.GlobeData("geoid", n_obs=64, n_query=32, test_examples=2)
    train = data.dataset("train", 4, 0)[0]
    assert train["lat"].shape == (96,) and int(train["observed"].sum()) == 64
    assert float(train["lat"].max()) < 70 and float(train["lon"].abs().max()) < 170
    polar = data.dataset("polar", 2, 5)[1]
    assert float(polar["lat"][64:].min()) >= 70
    dateline = data.dataset("dateline", 2, 5)[0]
    assert float(dateline["lon"][64:].abs().min()) >= 170
    heights = recipe.geoid_at(train["lat"].double().numpy(), train["lon"].double().numpy())
    np.testing.assert_allclose(train["value"].numpy() * data.std + data.mean, heights, atol=1e-3)
    # The model never reads a query's value: changing it leaves the predictions unchanged.
    model = recipe.GlobeModel("spherical_harmonics", task="geoid", value_std=data.std)
    batch = {k: v[None] for k, v in train.items()}
    out = model(batch)
    batch["value"] = torch.where(batch["observed"], batch["value"], torch.full_like(batch["value"], 99.0))
    torch.testing.assert_close(model(batch), out)
    with pytest.raises(ValueError, match="task"):
        recipe.GlobeData("ocean")


def test_recipe_smoke_run_both_tasks(tmp_path, one_thread):
    require_debian("proj-data", path=GTX)
    args = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
            "--trainer.logger", "false", "--data.batch_size", "2", "--data.n_obs", "16",
            "--data.n_query", "8", "--data.test_examples", "2"]
    out = recipe.run_one("spherical_harmonics", seed=0, out_dir=tmp_path, cli_args=args)
    assert set(out) == set(recipe.COMPARE.columns)
    assert 0.0 <= out["land err %"] <= 100.0
    for col in ("geoid RMSE", "polar RMSE", "dateline RMSE"):
        assert math.isfinite(out[col]) and 0.0 < out[col] < 200.0


@pytest.mark.slow
def test_recipe_learns_the_geoid_with_spherical_harmonics(tmp_path):
    require_debian("proj-data", path=GTX)
    out = recipe.run_one("spherical_harmonics", seed=0, out_dir=tmp_path, cli_args=[])
    # Predicting the mean gives ~31 m; the default run reaches a few metres.
    assert out["geoid RMSE"] < 8.0 and out["polar RMSE"] < 15.0
    assert out["land err %"] < 15.0
