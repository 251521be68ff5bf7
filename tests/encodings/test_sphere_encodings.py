"""Sphere encodings: spherical harmonics against SciPy and quadrature, date-line continuity,
pole invariance, closed forms, and the 1D score methods on great-circle distance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mmpe
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.coords import Sequence, Sphere, index_grid
from mmpe.encodings.alibi import alibi_slopes
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.fourier_sphere import nerf_frequencies
from mmpe.encodings.rope_sphere import integer_frequencies
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.encodings.sphere2vec import sphere2vec_frequencies
from mmpe.encodings.spherical_harmonics import real_spherical_harmonics
from mmpe.encodings.t5 import t5_bucket

D = 32
SPHERE_INPUTS = ["spherical_harmonics", "fourier_sphere", "sphere_c", "sphere_c_plus", "sphere_m",
                 "sphere_m_plus", "latlon_sincos", "latlon_raw"]


def scipy_real_sh(lat: np.ndarray, lon: np.ndarray, L: int) -> np.ndarray:
    """Real SH from SciPy's complex ones: √2(−1)^m Re Y_l^m (m>0), √2(−1)^m Im Y_l^|m| (m<0)."""
    special = pytest.importorskip("scipy.special")
    theta = math.pi / 2 - lat
    cols = []
    for l in range(L + 1):  # noqa: E741
        for m in range(-l, l + 1):
            if hasattr(special, "sph_harm_y"):
                c = special.sph_harm_y(l, abs(m), theta, lon)
            else:  # SciPy < 1.15: sph_harm(m, n, azimuth, polar)
                c = special.sph_harm(abs(m), l, lon, theta)
            sign = (-1) ** abs(m)
            cols.append(c.real if m == 0 else math.sqrt(2) * sign * (c.real if m > 0 else c.imag))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("L", [0, 3, 12, 40])
def test_real_spherical_harmonics_match_scipy(L):
    rng = np.random.default_rng(L)
    lat = np.concatenate([np.arcsin(rng.uniform(-1, 1, 300)), [math.pi / 2, -math.pi / 2, 0.0]])
    lon = rng.uniform(-math.pi, math.pi, 303)
    got = real_spherical_harmonics(torch.tensor(lat), torch.tensor(lon), L).numpy()
    assert got.shape == (303, (L + 1) ** 2)
    np.testing.assert_allclose(got, scipy_real_sh(lat, lon, L), atol=1e-11, rtol=0)


def test_spherical_harmonics_orthonormal_by_quadrature():
    # Gauss–Legendre in cos θ = sin φ (exact for polynomials of degree 2n−1) × uniform longitude
    # (exact for trigonometric polynomials of degree < n_lon): exact for products of degree ≤ L.
    L = 15
    x, w = np.polynomial.legendre.leggauss(L + 2)
    n_lon = 2 * L + 2
    lon = np.arange(n_lon) * 2 * math.pi / n_lon - math.pi
    lat_g, lon_g = np.meshgrid(np.arcsin(x), lon, indexing="ij")
    Y = real_spherical_harmonics(torch.tensor(lat_g), torch.tensor(lon_g), L).numpy()
    weights = (w[:, None] * np.full(n_lon, 2 * math.pi / n_lon)[None, :])[..., None]
    gram = np.einsum("ija,ijb->ab", Y * weights, Y)
    np.testing.assert_allclose(gram, np.eye((L + 1) ** 2), atol=1e-12)


def sphere(lat, lon, units="deg"):
    return Sphere(torch.tensor(lat, dtype=torch.float64), torch.tensor(lon, dtype=torch.float64),
                  units=units)


def build(name, **kw):
    torch.manual_seed(0)
    return mmpe.build(name, context={"d_model": D, "num_heads": 4, "head_dim": 16}, **kw)


def dateline_jump(enc) -> tuple[float, float]:
    """(‖P(λ=−180°) − P(λ=180°−ε)‖, ‖P(λ=0) − P(λ=ε)‖) at several latitudes, ε = 1e-3°."""
    lats = [-60.0, -20.0, 0.0, 35.0, 80.0]
    eps = 1e-3
    with torch.no_grad():
        a = enc(sphere(lats, [-180.0] * 5))
        b = enc(sphere(lats, [180.0 - eps] * 5))
        c = enc(sphere(lats, [0.0] * 5))
        d = enc(sphere(lats, [eps] * 5))
    return float((a - b).norm(dim=-1).max()), float((c - d).norm(dim=-1).max())


def pole_spread(enc) -> float:
    """Largest difference between encodings of one pole reached at 12 longitudes (both poles)."""
    lons = np.linspace(-180, 170, 12).tolist()
    with torch.no_grad():
        out = [enc(sphere([pole] * 12, lons)) for pole in (90.0, -90.0)]
    return max(float((p - p[:1]).abs().max()) for p in out)


SPHERICAL = [("spherical_harmonics", {}), ("fourier_sphere", {}), ("fourier_sphere", {"random": False}),
             ("sphere_c", {"periodic": True}), ("sphere_m", {"periodic": True})]


@pytest.mark.parametrize("name, kw", SPHERICAL)
def test_spherical_encodings_continuous_across_dateline_and_equal_at_poles(name, kw):
    enc = build(name, **kw)
    jump, step = dateline_jump(enc)
    assert jump <= 3 * step + 1e-6, (jump, step)
    assert pole_spread(enc) < 1e-5


@pytest.mark.parametrize("name", ["latlon_sincos", "latlon_raw", "sphere_c", "sphere_m_plus"])
def test_flat_and_paper_multiscale_encodings_jump_at_the_dateline(name):
    # The checks above can fail: flat (lat, lon) encodings, and Sphere2Vec's non-integer scales
    # (as published), jump at the date line and differ at the pole between longitudes.
    enc = build(name)
    jump, step = dateline_jump(enc)
    assert jump > 100 * step
    assert pole_spread(enc) > 1e-3


@pytest.mark.parametrize("name", SPHERE_INPUTS)
def test_input_encodings_shapes_batched_and_coordinate_check(name):
    enc = build(name)
    lat, lon = torch.rand(3, 7) * 180 - 90, torch.rand(3, 7) * 360 - 180
    out = enc(Sphere(lat, lon))
    assert out.shape == (3, 7, D) and out.dtype == torch.float32
    torch.testing.assert_close(enc(Sphere(lat[1], lon[1])), out[1])
    with pytest.raises(TypeError, match="Spherical.*lat, lon"):
        enc(Sequence(4))
    assert mmpe.registry.get(name).coords == ("sphere",)


def test_spherical_harmonics_module_uses_the_basis():
    enc = build("spherical_harmonics", max_degree=4, network="linear")
    c = sphere([10.0, -50.0], [20.0, 170.0])
    feats = real_spherical_harmonics(c.lat, c.lon, 4).float()
    torch.testing.assert_close(enc.features(c), feats)
    torch.testing.assert_close(enc(c), enc.net(feats))
    for net in ("siren", "mlp"):
        assert build("spherical_harmonics", network=net, num_layers=2)(c).shape == (2, D)
    with pytest.raises(ValueError, match="network"):
        build("spherical_harmonics", network="transformer")
    with pytest.raises(ValueError, match="max_degree"):
        build("spherical_harmonics", max_degree=-1)


def test_fourier_sphere_closed_forms():
    c = sphere([30.0], [45.0])
    u = c.unit_vectors[0]
    det = build("fourier_sphere", random=False, num_frequencies=3)
    phases = torch.cat([(2.0 ** k) * math.pi * u for k in range(3)])
    expected = torch.cat([u, phases.cos(), phases.sin()]).float()
    torch.testing.assert_close(det.features(c)[0], expected)
    assert nerf_frequencies(2).shape == (6, 3)
    rnd = build("fourier_sphere", num_frequencies=5, scale=2.0, seed=3)
    B = rnd.B.double()
    ph = 2 * math.pi * (B @ u)
    torch.testing.assert_close(rnd.features(c)[0], torch.cat([ph.cos(), ph.sin()]).float())
    assert torch.equal(build("fourier_sphere", seed=3).B, build("fourier_sphere", seed=3).B)
    with pytest.raises(ValueError, match="scale"):
        build("fourier_sphere", scale=0.0)


def test_sphere2vec_closed_forms():
    freqs = sphere2vec_frequencies(4, 0.01, 1.0)
    torch.testing.assert_close(freqs, torch.tensor([100.0, 100 ** (2 / 3), 100 ** (1 / 3), 1.0],
                                                   dtype=torch.float64))
    phi, lam = math.radians(25.0), math.radians(-100.0)
    c = sphere([25.0], [-100.0])
    one = build("sphere_c", num_scales=1)  # r_max = 1: exactly the unit vector
    torch.testing.assert_close(one.features(c)[0], torch.tensor(
        [math.sin(phi), math.cos(phi) * math.cos(lam), math.cos(phi) * math.sin(lam)]))
    m = build("sphere_m_plus", num_scales=2, min_radius=0.5, max_radius=1.0)
    f = m.features(c)[0].view(8, 2)  # [feature, scale]
    w = 2.0  # frequency of the finest scale
    ps, ls = w * phi, w * lam
    expected = [math.sin(ps), math.cos(ps) * math.cos(lam), math.cos(phi) * math.cos(ls),
                math.cos(ps) * math.sin(lam), math.cos(phi) * math.sin(ls), math.cos(ps),
                math.sin(ls), math.cos(ls)]
    torch.testing.assert_close(f[:, 0], torch.tensor(expected, dtype=torch.float32))
    periodic = build("sphere_c", periodic=True)
    assert torch.all(periodic.freqs % 2 == 1)
    with pytest.raises(ValueError, match="min_radius"):
        build("sphere_c", min_radius=2.0, max_radius=1.0)


def test_latlon_baselines_closed_forms():
    c = sphere([12.0, -45.0], [100.0, -3.0])
    got = build("latlon_sincos")(c)
    ref = torch.cat([sinusoidal_table(torch.tensor([12.0, -45.0]), D // 2),
                     sinusoidal_table(torch.tensor([100.0, -3.0]), D // 2)], dim=-1)
    torch.testing.assert_close(got, ref)
    raw = build("latlon_raw")
    x = torch.tensor([[12 / 90, 100 / 180], [-45 / 90, -3 / 180]])
    torch.testing.assert_close(raw(c), raw.proj(x))
    with pytest.raises(ValueError, match="multiple of 4"):
        build("latlon_sincos", d_model=30)


def test_rope_sphere_relative_periodic_and_not_pole_invariant():
    torch.testing.assert_close(integer_frequencies(4, 64.0),
                               torch.tensor([1.0, 4.0, 16.0, 64.0], dtype=torch.float64))
    enc = build("rope_sphere")
    q, k = torch.randn(1, 2, 2, 16), torch.randn(1, 2, 2, 16)

    def score(lats, lons):
        qr, kr = enc(q, k, sphere(lats, lons))
        return (qr[..., 0, :] * kr[..., 1, :]).sum(-1)

    # Only differences count, and a shift across the date line changes nothing.
    base = score([10.0, 40.0], [100.0, 150.0])
    torch.testing.assert_close(score([10.0, 40.0], [150.0, -160.0]), base, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(score([-5.0, 25.0], [-170.0, -120.0]), base, atol=1e-4, rtol=1e-4)
    # 2π-periodic rotation: −180° and 180° − ε rotate (almost) alike.
    cos_a, sin_a = enc.cos_sin(sphere([0.0], [-180.0]))
    cos_b, sin_b = enc.cos_sin(sphere([0.0], [180.0 - 1e-4]))
    assert float((cos_a - cos_b).abs().max() + (sin_a - sin_b).abs().max()) < 1e-3
    # Documented limitation: rotations by longitude differ at the pole.
    c1, _ = enc.cos_sin(sphere([90.0], [0.0]))
    c2, _ = enc.cos_sin(sphere([90.0], [90.0]))
    assert float((c1 - c2).abs().max()) > 0.1
    with pytest.raises(ValueError, match="multiple of 4"):
        mmpe.build("rope_sphere", head_dim=18)
    with pytest.raises(TypeError, match="sphere"):
        enc(q, k, Sequence(2))


def _ctx(coords, heads=4):
    return AttentionCall(coords, heads, 8, coords.batch_size or 1)


def test_geodesic_alibi_equals_slope_times_great_circle():
    rng = np.random.default_rng(0)
    lat, lon = np.degrees(np.arcsin(rng.uniform(-1, 1, (2, 9)))), rng.uniform(-180, 180, (2, 9))
    coords = Sphere(torch.tensor(lat), torch.tensor(lon))
    unit = math.radians(1.0)
    alibi = mmpe.build("alibi", num_heads=4, distance_unit=unit)
    bias = dense_bias([alibi], _ctx(coords))
    u = np.stack([np.cos(np.radians(lat)) * np.cos(np.radians(lon)),
                  np.cos(np.radians(lat)) * np.sin(np.radians(lon)), np.sin(np.radians(lat))], -1)
    ang = np.arccos(np.clip(np.einsum("bid,bjd->bij", u, u), -1, 1))  # radians
    ref = -alibi_slopes(4).numpy()[None, :, None, None] * np.degrees(ang)[:, None]
    np.testing.assert_allclose(bias.numpy(), ref, atol=2e-4)
    # The same mod on scalar indices (FlexAttention's view) and the SDPA/math routes agree.
    mod = alibi.score_mod(_ctx(coords))
    one = mod(torch.zeros(()), torch.tensor(1), torch.tensor(2), torch.tensor(3), torch.tensor(5))
    assert float(one) == pytest.approx(float(bias[1, 2, 3, 5]), abs=1e-5)
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, [alibi])
    x = torch.randn(2, 9, 32)
    attn.route = "sdpa"
    a = attn(x, coords)
    attn.route = "math"
    torch.testing.assert_close(attn(x, coords), a, atol=1e-5, rtol=1e-5)


def test_t5_and_fire_on_great_circle_distance():
    coords = sphere([0.0, 0.0, 0.0, 45.0], [0.0, 3.4, 100.0, 0.0])
    t5 = mmpe.build("t5", num_heads=4, distance_unit=math.radians(1.0))
    b, _, q, k = index_grid(1, 1, 4, 4)
    buckets = t5.buckets(_ctx(coords), q, k, b)[0, 0]
    assert int(buckets[0, 1]) == 3  # 3.4° → 3 steps of 1°: an exact bucket
    assert int(buckets[0, 2]) == int(t5_bucket(torch.tensor(-100), False, 32, 128))
    assert int(buckets[0, 3]) == int(t5_bucket(torch.tensor(-45), False, 32, 128))
    fire = mmpe.build("fire", num_heads=4, init_L=math.pi)
    x = fire.normalised_distance(_ctx(coords), q, k, b).detach()
    assert float(x.max()) <= 1.0 and float(x.min()) == 0.0
    far = sphere([0.0, 0.0], [0.0, -180.0])
    xf = fire.normalised_distance(_ctx(far), *index_grid(1, 1, 2, 2)[2:], index_grid(1, 1, 2, 2)[0])
    assert float(xf[0, 0, 0, 1]) == pytest.approx(1.0, abs=1e-5)  # antipodes: ψ(π)/ψ(π)
    assert dense_bias([fire], _ctx(coords)).shape == (1, 4, 4, 4)


def test_sphere_registry_lists_every_encoding():
    names = {e.name for e in mmpe.registry.available(coords="sphere")}
    assert set(SPHERE_INPUTS) | {"rope_sphere", "alibi", "t5", "fire"} <= names
