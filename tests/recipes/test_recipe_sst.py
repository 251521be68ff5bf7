"""recipes/sst.py: OSTIA/HadISST loading, training-only climatology, area weights, held-out
masks, persistence, and a few training steps."""

import pytest

pytest.importorskip("lightning")
pytest.importorskip("iris_sample_data")
pytest.importorskip("netCDF4")

import numpy as np  # noqa: E402
from mmpe.recipes import RECIPES, sst  # noqa: E402
from mmpe.recipes.common import CONFIGS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def forecast():
    return sst.SSTData("forecast")


def test_ostia_loads_in_kelvin():
    d = sst.load_ostia()
    assert d["sst"].shape == (54, 18, 432)
    assert d["lat"].shape == (18,) and d["lon"].shape == (432,)
    assert -5.01 < d["lat"].min() < -4.99 and d["lat"].max() < 5.0
    assert d["lon"].min() == 0.0 and 359.0 < d["lon"].max() < 360.0
    ocean = d["sst"][np.isfinite(d["sst"])]
    assert 285.0 < ocean.min() and ocean.max() < 310.0        # K, tropical ocean
    assert np.isnan(d["sst"]).any()                            # land is masked
    assert (d["year"][0], d["month"][0]) == (2006, 4)
    assert (d["year"][-1], d["month"][-1]) == (2010, 9)


def test_coarse_grids(forecast):
    g = sst.ostia_grid(3, 9)
    assert g["sst"].shape == (54, 6, 48)
    assert forecast.grid_shape == (108, 48)
    if sst.hadisst_path().exists():
        h = sst.hadisst_grid(5)
        assert h["sst"].shape == (36, 72)
        assert np.nanmin(h["sst"]) >= -1.81 and np.nanmax(h["sst"]) < 35.0   # °C
        np.testing.assert_allclose(h["lat"][:2], [-87.5, -82.5])
        np.testing.assert_allclose(h["lon"][:2], [-179.5, -174.5])


def test_coarsen_ignores_land_and_needs_half_ocean():
    f = np.array([[1.0, 3.0, np.nan, np.nan], [5.0, np.nan, np.nan, 7.0]])
    out = sst.coarsen(f, 2, 2)
    np.testing.assert_allclose(out[0, 0], 3.0)   # 3 of 4 points ocean: their mean
    assert np.isnan(out[0, 1])                   # 1 of 4: land


def test_climatology_uses_training_months_only():
    rng = np.random.default_rng(0)
    months = np.tile(np.arange(1, 13), 3)        # three years
    field = rng.normal(size=(36, 2, 3))
    field[24:] += 100.0                           # the last year (not training) is far off
    train = np.arange(24)
    clim = sst.climatology(field, months, train)
    np.testing.assert_allclose(clim[0], field[[0, 12]].mean(0))
    anom = sst.anomalies(field, months, train)
    assert abs(anom[:24].mean()) < 0.5 and anom[24:].mean() > 99.0
    # the same with every month in the climatology would be a different (leaky) answer
    leaky = sst.climatology(field, months, np.arange(36))
    assert not np.allclose(leaky, clim)
    with pytest.raises(ValueError, match="calendar month"):
        sst.climatology(field, months, np.arange(6))


def test_recipe_anomaly_is_blind_to_test_months(forecast, monkeypatch):
    """Changing the validation/test SST changes neither the climatology nor a training anomaly."""
    g = sst.ostia_grid(3, 9)
    train = forecast.months["train"]
    hidden = np.concatenate([forecast.months["val"], forecast.months["test"]])
    base = sst.anomalies(g["sst"], g["month"], train)
    shifted = g["sst"].copy()
    shifted[hidden] += 5.0
    moved = sst.anomalies(shifted, g["month"], train)
    np.testing.assert_allclose(moved[train], base[train])
    np.testing.assert_allclose(moved[hidden], base[hidden] + 5.0)
    assert len(train) == 30 and len(forecast.months["test"]) == 12
    assert train.max() < forecast.months["val"].min() < forecast.months["test"].min()


def test_area_weights(forecast):
    w = sst.cell_weights(np.array([-60.0, 0.0, 60.0]))
    np.testing.assert_allclose(w, [0.75, 1.5, 0.75])
    assert w.sum() == pytest.approx(3.0)
    assert forecast.weight.shape == forecast.lat.shape == (6 * 48,)
    assert forecast.weight[forecast.cells].mean() == pytest.approx(1.0)
    assert sst.weighted_rmse(np.array([1.0, 0.0]), np.zeros(2), np.array([3.0, 1.0])) == \
        pytest.approx(np.sqrt(0.75))


def test_held_out_masks_are_disjoint(forecast):
    assert sst.in_sector(np.array([165.0, 179.9, -180.0, -165.1]), (165.0, 195.0)).all()
    assert not sst.in_sector(np.array([164.9, -165.0, 0.0]), (165.0, 195.0)).any()
    sector = forecast.cells[forecast.region[forecast.cells] == 1]
    assert len(sector) == 6 * 4                                  # 4 columns of 7.5°, all ocean
    assert not np.intersect1d(sector, forecast.train_cells).size
    assert len(forecast.train_cells) + len(sector) == len(forecast.cells)
    train_item = forecast.windows("train")[0]
    assert not (train_item["region"] == 1).any()                 # never seen in training
    test_item = forecast.windows("test")[0]
    assert (test_item["region"] == 1).any()
    split = forecast.months
    assert not set(split["train"]) & set(split["val"]) and not set(split["val"]) & set(split["test"])


def test_infill_regions_disjoint():
    if not sst.hadisst_path().exists():
        pytest.skip("cartopy's HadISST file is missing")
    d = sst.SSTData("infill")
    region, lat = d.field["region"], d.field["lat"]
    assert (np.abs(lat[region == 1]) > 60).all()
    assert (np.abs(lat[region == 2]) <= 60).all() and sst.in_sector(d.field["lon"][region == 2]).all()
    assert not sst.in_sector(d.field["lon"][region == 0]).any()
    train = d.examples("train", 4, 0)[(1, 2)]
    assert (train["region"] == 0).all()
    polar = d.examples("polar", 4, 0)[0]
    assert (polar["region"][~polar["observed"]] == 1).all()


def test_persistence_by_hand():
    anom = np.array([[0.5, -1.0], [0.25, 2.0], [1.0, 0.0]])   # [month, cell]
    np.testing.assert_allclose(sst.persistence(anom, np.array([1, 2])), [[0.5, -1.0], [0.25, 2.0]])
    with pytest.raises(ValueError):
        sst.persistence(anom, np.array([0]))


def test_forecast_window_layout(forecast):
    w = forecast.windows("val")
    item = w[0]
    n = len(forecast.cells)
    t = int(forecast.targets["val"][0])
    assert item["lat"].shape == (4 * n,)
    assert item["time"].tolist() == [float(i) for i in range(4) for _ in range(n)]
    assert item["observed"].sum() == 3 * n
    target = forecast.anom[t, forecast.cells] / forecast.std
    np.testing.assert_allclose(item["value"][3 * n:].numpy(), target, rtol=1e-6)
    np.testing.assert_allclose(item["last"][3 * n:].numpy(), forecast.anom[t - 1, forecast.cells] / forecast.std,
                               rtol=1e-6)


def test_encoding_spec_wraps_spatial_encodings_in_time():
    spec = sst.encoding_spec("latlon_sincos", None, "forecast")
    assert spec["name"] == "spacetime" and spec["spatial"]["name"] == "latlon_sincos"
    assert sst.encoding_spec("latlon_sincos", None, "infill") == {"name": "latlon_sincos"}
    assert sst.encoding_spec("latlon_grid", None, "infill", grid_shape=(36, 72))["grid_shape"] == (36, 72)
    assert sst.encoding_spec("alibi", None, "forecast")["name"] == "alibi"


def test_registered_and_configs():
    assert RECIPES["sst"][0] == "mmpe.recipes.sst"
    assert (CONFIGS / "sst" / "default.yaml").exists() and (CONFIGS / "sst" / "infill.yaml").exists()


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default.yaml", "infill.yaml"])
def test_few_training_steps(tmp_path, config):
    if config == "infill.yaml" and not sst.hadisst_path().exists():
        pytest.skip("cartopy's HadISST file is missing")
    cli = sst.make_cli(["--config", str(CONFIGS / "sst" / config), "--trainer.max_steps", "3",
                        "--trainer.default_root_dir", str(tmp_path),
                        "--trainer.logger.init_args.save_dir", str(tmp_path),
                        "--trainer.enable_checkpointing", "false", "--model.d_model", "32"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    for loader in cli.datamodule.test_sets().values():
        assert 0.0 < sst.evaluate(cli.model, loader) < 50.0


def test_baselines_are_rows_of_compare(tmp_path):
    """Baselines go through `mmpe compare sst` as rows: no training, the same numbers every seed,
    None on the task they do not address; damped persistence is persistence scaled by α."""
    from mmpe.recipes.compare import resolve_encodings

    assert resolve_encodings(sst.COMPARE, "persistence,latlon_raw", None) == ["persistence", "latlon_raw"]
    with pytest.raises(KeyError):
        resolve_encodings(sst.COMPARE, "persistance", None)
    runs = [sst.run_one(name, seed=s, out_dir=tmp_path, cli_args=[])
            for name in ("persistence", "damped_persistence") for s in (0, 1)]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    persist, damped = runs[0], runs[2]
    assert set(persist) >= set(sst.COLUMNS) and persist["infill RMSE"] is None
    assert 0.0 < damped["alpha"] < 1.0 and 0.0 < persist["fc RMSE"] < 2.0
    assert damped["fc RMSE"] <= persist["fc RMSE"] + 1e-9  # on this test year, damping helps
