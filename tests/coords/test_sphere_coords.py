"""Sphere coordinates: validation, wrapping, unit vectors, great-circle distances, grids, time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmpe.coords import Sphere, index_grid
from mmpe.coords.capabilities import Directed
from mmpe.coords.sphere import great_circle, haversine, wrap_longitude

EARTH_KM = 6371.0


def test_city_pairs_on_a_6371_km_sphere():
    # London (51.5074 N, 0.1278 W), Paris (48.8566 N, 2.3522 E), New York (40.7128 N, 74.0060 W).
    london_paris = float(haversine(51.5074, -0.1278, 48.8566, 2.3522, radius=EARTH_KM))
    ny_london = float(haversine(40.7128, -74.0060, 51.5074, -0.1278, radius=EARTH_KM))
    assert london_paris == pytest.approx(343.5, abs=0.5)
    assert ny_london == pytest.approx(5570.0, abs=5.0)
    # One degree of a great circle is 2π·6371/360 km.
    assert float(haversine(0.0, 10.0, 0.0, 11.0, radius=EARTH_KM)) == pytest.approx(
        2 * math.pi * EARTH_KM / 360, rel=1e-12)


def test_distance_matches_vector_formula_on_random_pairs():
    rng = np.random.default_rng(0)
    lat1, lat2 = np.arcsin(rng.uniform(-1, 1, (2, 2000)))
    lon1, lon2 = rng.uniform(-math.pi, math.pi, (2, 2000))
    u = np.stack([np.cos(lat1) * np.cos(lon1), np.cos(lat1) * np.sin(lon1), np.sin(lat1)], -1)
    v = np.stack([np.cos(lat2) * np.cos(lon2), np.cos(lat2) * np.sin(lon2), np.sin(lat2)], -1)
    # Independent stable form: atan2(|u × v|, u · v).
    ref = np.arctan2(np.linalg.norm(np.cross(u, v), axis=-1), (u * v).sum(-1))
    got = great_circle(*(torch.tensor(a) for a in (lat1, lon1, lat2, lon2))).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-13, rtol=0)


def test_tiny_and_antipodal_angles_are_accurate():
    t = torch.tensor
    # Tiny: 1e-10 rad apart (0.6 mm on the Earth) in latitude and in longitude.
    tiny = great_circle(t([0.3], dtype=torch.float64), t([1.0], dtype=torch.float64),
                        t([0.3 + 1e-10], dtype=torch.float64), t([1.0], dtype=torch.float64))
    assert float(tiny) == pytest.approx(1e-10, rel=1e-6)
    tiny_lon = great_circle(t([0.0], dtype=torch.float64), t([2.0], dtype=torch.float64),
                            t([0.0], dtype=torch.float64), t([2.0 + 1e-10], dtype=torch.float64))
    assert float(tiny_lon) == pytest.approx(1e-10, rel=1e-6)
    # Exactly antipodal points, anywhere.
    rng = np.random.default_rng(1)
    lat = torch.tensor(np.arcsin(rng.uniform(-1, 1, 500)))
    lon = torch.tensor(rng.uniform(-math.pi, math.pi, 500))
    anti = great_circle(lat, lon, -lat, wrap_longitude(lon + math.pi))
    np.testing.assert_allclose(anti.numpy(), math.pi, atol=1e-12)
    # Nearly antipodal: π − 1e-9 on the equator keeps its 1e-9 deficit (arccos would round it off).
    near = great_circle(t([0.0], dtype=torch.float64), t([0.0], dtype=torch.float64),
                        t([0.0], dtype=torch.float64), t([math.pi - 1e-9], dtype=torch.float64))
    assert math.pi - float(near) == pytest.approx(1e-9, rel=1e-5)


def test_distance_pairs_batched_and_extent():
    lat = torch.tensor([[0.0, 0.0, 90.0], [10.0, -10.0, 45.0]])
    lon = torch.tensor([[0.0, 90.0, 33.0], [0.0, 0.0, 179.0]])
    c = Sphere(lat, lon)
    assert c.kind == "sphere" and not isinstance(c, Directed) and c.batch_size == 2
    b, _, q, k = index_grid(2, 1, 3, 3)
    d = c.distance(q, k, b)[:, 0]
    assert d.shape == (2, 3, 3)
    assert float(d[0, 0, 1]) == pytest.approx(math.pi / 2, abs=1e-6)
    assert float(d[0, 0, 2]) == pytest.approx(math.pi / 2, abs=1e-6)
    assert float(d[1, 0, 1]) == pytest.approx(math.radians(20.0), abs=1e-6)
    torch.testing.assert_close(d, d.transpose(-1, -2))
    assert torch.all(torch.diagonal(d, dim1=-2, dim2=-1) == 0)
    ext = c.extent(q, b)
    assert torch.all(ext == math.pi)
    # Scalar indices (the FlexAttention path) give the same numbers.
    assert float(c.distance(torch.tensor(0), torch.tensor(1), torch.tensor(1))) == float(d[1, 0, 1])
    with pytest.raises(ValueError, match="batch index"):
        c.distance(q, k)


def test_positions_unit_vectors_and_wrapping():
    c = Sphere([90.0, -90.0, 0.0, 0.0, 10.0], [123.0, -45.0, 180.0, 540.0, -190.0])
    pos = c.query_positions
    assert pos.shape == (5, 2) and pos.dtype == torch.float32
    np.testing.assert_allclose(torch.rad2deg(c.lon).numpy(), [123, -45, -180, -180, 170], atol=1e-4)
    u = c.unit_vectors
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(5))
    torch.testing.assert_close(u[0], torch.tensor([0.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(u[2], torch.tensor([-1.0, 0.0, 0.0]), atol=1e-6, rtol=0)
    rad = Sphere(torch.tensor([math.pi / 2]), torch.tensor([7.0]), units="rad")
    assert float(rad.lon) == pytest.approx(7.0 - 2 * math.pi, abs=1e-6)
    lon = wrap_longitude(torch.tensor([-1e-20, math.pi, -math.pi, 3 * math.pi], dtype=torch.float64))
    assert torch.all((lon >= -math.pi) & (lon < math.pi))
    f64 = Sphere(torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64))
    assert f64.query_positions.dtype == torch.float64


@pytest.mark.parametrize("lat, match", [(91.0, r"lat must lie in \[-90, 90\]"), (-90.5, "lat must"),
                                        (float("nan"), "lat contains NaN")])
def test_bad_latitude_raises(lat, match):
    with pytest.raises(ValueError, match=match):
        Sphere([0.0, lat], [0.0, 0.0])


def test_other_validation_errors():
    with pytest.raises(ValueError, match="radians"):
        Sphere([1.6], [0.0], units="rad")
    with pytest.raises(ValueError, match="units"):
        Sphere([0.0], [0.0], units="grad")
    with pytest.raises(ValueError, match="lon must be finite"):
        Sphere([0.0], [float("inf")])
    with pytest.raises(ValueError, match="same shape"):
        Sphere([0.0, 1.0], [0.0])
    with pytest.raises(ValueError, match=r"\[n\] or \[b, n\]"):
        Sphere(torch.zeros(2, 2, 2), torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="no points"):
        Sphere([], [])
    with pytest.raises(TypeError, match="real numbers"):
        Sphere(torch.tensor([True]), torch.tensor([False]))
    with pytest.raises(TypeError, match="numeric"):
        Sphere(["north"], ["east"])
    with pytest.raises(ValueError, match="time must have the shape"):
        Sphere([0.0, 1.0], [0.0, 1.0], time=[0.0])
    with pytest.raises(ValueError, match="no time axis"):
        Sphere([0.0], [0.0]).time_distance(torch.tensor(0), torch.tensor(0))
    with pytest.raises(ValueError, match="n_lat"):
        Sphere.grid(0, 4)


def test_grid_and_time_axis():
    g = Sphere.grid(3, 4)
    assert g.grid_shape == (3, 4) and g.num_queries == 12
    np.testing.assert_allclose(torch.rad2deg(g.lat).view(3, 4)[:, 0].numpy(), [-60, 0, 60], atol=1e-4)
    np.testing.assert_allclose(torch.rad2deg(g.lon).view(3, 4)[0].numpy(), [-180, -90, 0, 90], atol=1e-4)
    gt = Sphere.grid(3, 4, times=[0.0, 6.0])
    assert gt.grid_shape == (2, 3, 4) and gt.num_queries == 24
    pos = gt.query_positions
    assert pos.shape == (24, 3)
    np.testing.assert_allclose(pos[:12, 2].numpy(), 0.0)
    np.testing.assert_allclose(pos[12:, 2].numpy(), 6.0)
    torch.testing.assert_close(pos[:12, :2], pos[12:, :2])
    q, k = torch.arange(24).view(-1, 1), torch.arange(24).view(1, -1)
    assert float(gt.time_distance(q, k)[0, 12]) == 6.0
    assert float(gt.distance(q, k)[0, 12]) == 0.0  # same place, another time
