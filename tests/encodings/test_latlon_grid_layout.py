"""latlon_grid on coordinates that do not record a grid (not made by `Sphere.grid`): points
within a quarter cell of the centres of the table's grid read their cell silently; points
farther are binned with a warning that names the grid assumed (an ERA5 grid with rows on the
poles, scattered points)."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import Sphere


def _run(enc, coords):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = enc(coords)
    return out, [str(w.message) for w in caught if "latlon_grid" in str(w.message)]


def _offsets_ref(lat_deg, lon_deg, n_lat, n_lon):
    """Distance from the cell centre in cells, from Sphere.grid's layout (numpy, degrees)."""
    lat_cell = (lat_deg + 90) * n_lat / 180
    i = np.clip(np.floor(lat_cell), 0, n_lat - 1)
    lon_cell = (lon_deg + 180) * n_lon / 360
    d_lon = np.abs((lon_cell - np.round(lon_cell) + 0.5) % 1 - 0.5)
    return np.maximum(np.abs(lat_cell - (i + 0.5)), d_lon)


@settings(max_examples=40, deadline=None)
@given(n_lat=st.integers(1, 12), n_lon=st.integers(1, 24), seed=st.integers(0, 2**16),
       n=st.integers(1, 8), snap=st.booleans())
def test_warns_exactly_when_a_point_is_off_its_cell_centre(n_lat, n_lon, seed, n, snap):
    rng = np.random.default_rng(seed)
    lat = rng.uniform(-89.9, 89.9, n)
    lon = rng.uniform(-180, 180, n)
    if snap:  # the grid's own centres, given as a plain Sphere
        lat = -90 + (np.floor((lat + 90) * n_lat / 180) + 0.5) * 180 / n_lat
        lon = -180 + np.round((lon + 180) * n_lon / 360) * 360 / n_lon
    enc = mmpe.build("latlon_grid", d_model=4, grid_shape=(n_lat, n_lon))
    _, msgs = _run(enc, Sphere(torch.tensor(lat), torch.tensor(lon)))
    off = _offsets_ref(lat, lon, n_lat, n_lon)
    if off.max() > 0.25 + 1e-6:
        assert len(msgs) == 1 and f"{(off > 0.25).sum()} of {n} points" in msgs[0]
        assert f"{n_lat}×{n_lon} grid" in msgs[0] and f"Sphere.grid({n_lat}, {n_lon})" in msgs[0]
    elif off.max() < 0.25 - 1e-6:
        assert msgs == []


def test_grid_centres_without_grid_shape_read_fourcastnets_table_silently():
    enc = mmpe.build("latlon_grid", d_model=4, grid_shape=(6, 12))
    g = Sphere.grid(6, 12, times=[0.0, 1.0])
    plain = Sphere(g.lat, g.lon, units="rad", time=g.time)  # no grid_shape recorded
    out, msgs = _run(enc, plain)
    assert msgs == []
    torch.testing.assert_close(out, enc(g))


def test_an_era5_grid_with_rows_on_the_poles_is_named():
    """ERA5's 0.25° grid has 721 rows from pole to pole (here 5°: 37 rows); with a
    table of 37 rows in Sphere.grid's layout every row but the equator's is off-centre."""
    lat, lon = np.meshgrid(np.arange(90, -90.1, -5.0), np.arange(0, 360, 5.0), indexing="ij")
    enc = mmpe.build("latlon_grid", d_model=4, grid_shape=(37, 72))
    _, msgs = _run(enc, Sphere(torch.tensor(lat.ravel()), torch.tensor(lon.ravel())))
    assert len(msgs) == 1 and "of 2664 points" in msgs[0] and "37×72 grid" in msgs[0]
    assert "up to 0.50 cells away" in msgs[0]


def test_the_sst_recipes_hadisst_cells_a_tenth_off_centre_bin_silently():
    """HadISST's 5° cells centred on −179.5° + 5j (recipes/sst.py): 0.1 cells east."""
    lat, lon = np.meshgrid(87.5 - 5.0 * np.arange(36), -179.5 + 5.0 * np.arange(72), indexing="ij")
    enc = mmpe.build("latlon_grid", d_model=4, grid_shape=(36, 72))
    coords = Sphere(torch.tensor(lat.ravel()), torch.tensor(lon.ravel()))
    out, msgs = _run(enc, coords)
    assert msgs == []
    i, j = enc.cells(coords)
    assert len(set(zip(i.tolist(), j.tolist(), strict=True))) == 36 * 72  # a cell each
