"""Absolute time stamps on the sphere (ERA5 hours since 1900, Unix seconds) are held exactly:
a step of one minute or one second survives into `time_distance` and every temporal encoding
of the registry, with float32 latitudes and longitudes (a float32 model)."""

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import Sphere
from mmpe.coords.capabilities import provides
from mmpe.coords.spacetime import TimeLine
from mmpe.registry import available

#: (unit, largest epoch users have, the step that must survive): ERA5's hours since 1900 at
#: one-minute steps (≈ 1.1e6 today), Unix seconds at one-second steps (≈ 1.7e9), Unix
#: milliseconds at one-millisecond steps (≈ 1.7e12), days since year 0 at one-second steps
SCALES = [("hours", 2.0e6, 1 / 60), ("seconds", 4.0e9, 1.0), ("milliseconds", 4.0e12, 1.0),
          ("days", 1.0e6, 1 / 86400)]
#: every input encoding a spacetime encoding can take as its temporal part
TEMPORAL = sorted(e.name for e in available(hook="input") if provides(TimeLine, e.needs))


def _stamps(scale, fraction, n):
    _unit, top, step = scale
    epoch = math.floor(fraction * top)
    return np.float64(epoch) + step * np.arange(n), step


def _sphere(times, kind):
    n = len(times)
    lat, lon = torch.zeros(n), torch.zeros(n)  # float32: one place, many times
    given_times = {"tensor": torch.tensor(times, dtype=torch.float64), "numpy": times,
                   "list": list(times)}[kind]
    return Sphere(lat, lon, time=given_times)


@settings(max_examples=40, deadline=None)
@given(scale=st.sampled_from(SCALES), fraction=st.floats(0.0, 1.0), n=st.integers(2, 5),
       kind=st.sampled_from(["tensor", "numpy", "list"]))
def test_time_is_held_exactly_and_its_steps_reach_time_distance(scale, fraction, n, kind):
    times, step = _stamps(scale, fraction, n)
    s = _sphere(times, kind)
    assert s.time.dtype == torch.float64 and s.lat.dtype == torch.float32
    assert torch.equal(s.time, torch.tensor(times))  # the stamps as given, bit for bit
    assert torch.equal(s.query_positions[..., 2], s.time)
    d = s.time_distance(torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n))
    want = torch.arange(1, n, dtype=torch.float64) * step
    # float64 holds epoch + i·step to half an ulp of the epoch: far below the step
    tol = 2 * float(np.spacing(times[-1]))
    assert d.dtype == torch.float32
    torch.testing.assert_close(d.double(), want, rtol=1e-6, atol=tol)
    g = Sphere.grid(2, 3, times=times)  # time-major: slice t starts at token 6·t
    torch.testing.assert_close(g.time_distance(torch.tensor(0), torch.tensor(6 * (n - 1))).double(),
                               want[-1], rtol=1e-6, atol=tol)


@functools.cache
def _spacetime(temporal):
    torch.manual_seed(0)
    return mmpe.build("spacetime", d_model=32, spatial="latlon_sincos", temporal=temporal)


@pytest.mark.parametrize("name", TEMPORAL)
@settings(max_examples=10, deadline=None)
@given(scale=st.sampled_from(SCALES), fraction=st.floats(0.0, 1.0))
def test_every_temporal_encoding_sees_one_step(name, scale, fraction):
    """Two tokens at one place one step apart get different encodings, equal to the temporal
    encoding of the exact float64 stamps; encodings that need integer positions or the token
    embeddings refuse with their name instead."""
    times, _step = _stamps(scale, fraction, 2)
    enc = _spacetime(name)
    try:
        p = enc(_sphere(times, "tensor")).detach()
    except (ValueError, TypeError) as err:
        assert name in str(err)
        assert name in ("learned", "axial", "conv_pe"), f"{name} refused: {err}"
        return
    assert p.dtype == torch.float32
    exact = enc.temporal(TimeLine(torch.tensor(times))).detach()
    torch.testing.assert_close(p - p[0], exact - exact[0], rtol=0, atol=1e-5)
    assert float((p[1] - p[0]).abs().max()) > 1e-6, f"{name}: one step apart look the same"


@settings(max_examples=30, deadline=None)
@given(scale=st.sampled_from(SCALES), fraction=st.floats(0.0, 1.0))
def test_sinusoidal_time_rotates_by_the_step(scale, fraction):
    """Vaswani et al.'s relative-position property at absolute stamps: `PE(t + Δ)` is `PE(t)`
    rotated by `Δ·ω_i` in each (sin, cos) pair, to float32 rounding."""
    times, step = _stamps(scale, fraction, 2)
    enc = mmpe.build("spacetime", d_model=32, spatial="latlon_sincos", temporal="sinusoidal")
    time_part = enc.temporal(enc.time_coordinates(_sphere(times, "tensor"))).double()
    sin0, cos0, sin1, cos1 = time_part[0, 0::2], time_part[0, 1::2], time_part[1, 0::2], time_part[1, 1::2]
    angle = step * 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    # float32 output rounding, and the float64 phase t·ω_0 (ω_0 = 1) good to an ulp of t
    tol = 2e-6 + 4 * float(np.spacing(times[-1]))
    torch.testing.assert_close(sin1, sin0 * angle.cos() + cos0 * angle.sin(), rtol=0, atol=tol)
    torch.testing.assert_close(cos1, cos0 * angle.cos() - sin0 * angle.sin(), rtol=0, atol=tol)


def test_integer_stamps_are_exact_up_to_2_53_and_refused_beyond():
    unix = torch.tensor([1_700_000_000, 1_700_000_001], dtype=torch.int64)
    s = Sphere(torch.zeros(2), torch.zeros(2), time=unix)
    assert s.time.dtype == torch.float64 and torch.equal(s.time, unix.double())
    nanoseconds = torch.tensor([1_700_000_000_000_000_001, 1_700_000_000_000_000_002])
    with pytest.raises(ValueError, match=r"Sphere: time: integers beyond 2\^53.*reference epoch"):
        Sphere(torch.zeros(2), torch.zeros(2), time=nanoseconds)
    with pytest.raises(ValueError, match=r"Sphere: times: integers beyond 2\^53"):
        Sphere.grid(2, 2, times=nanoseconds)


def test_batched_stamps_keep_their_steps():
    times = torch.tensor([[1.7e9, 1.7e9 + 1], [1.7e9 + 5, 1.7e9 + 3]], dtype=torch.float64)
    s = Sphere(torch.zeros(2, 2), torch.zeros(2, 2), time=times)
    b = torch.tensor([0, 1])
    d = s.time_distance(torch.tensor([0, 0]), torch.tensor([1, 1]), b)
    assert d.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(("epoch", "step"), [(1_100_000.0, 1 / 60), (1.7e9, 1.0)])
def test_a_float32_model_sees_one_minute_and_one_second(epoch, step):
    """The issue's closing check: ERA5 hours one minute apart, Unix seconds one second apart,
    at one place, through a float32 Transformer whose input encoding is `spacetime`."""
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 2, 1, [mmpe.build("spacetime", d_model=32)])
    times = torch.tensor([epoch, epoch + step], dtype=torch.float64)
    coords = Sphere(torch.zeros(2), torch.zeros(2), time=times)
    out = model(torch.zeros(1, 2, 32), coords).detach()
    assert out.dtype == torch.float32
    assert float((out[0, 1] - out[0, 0]).abs().max()) > 1e-3
    assert float(coords.time_distance(torch.tensor(0), torch.tensor(1))) == pytest.approx(step)


_LAT, _LON = torch.tensor([10.0, 20.0, 30.0]), torch.tensor([0.0, 50.0, 100.0])
#: the input and rotary encodings that run on a timed sphere (score terms read the
#: great-circle distance, which time never enters)
_SPHERE_ENCODINGS = sorted(e.name for e in available(
    coords=Sphere(_LAT, _LON, time=torch.tensor([0.0, 1.0, 2.0]))) if e.hook != "score")


@pytest.mark.parametrize("name", _SPHERE_ENCODINGS)
def test_every_encoding_on_a_timed_sphere_sees_one_second_at_unix_scale(name):
    """Moving one token by one second changes a float32 model's output as much at Unix scale
    as at epoch 0, for every encoding that reads the time axis (rotary ones on `(lat, lon,
    time)` included: rope_mixed formed its phases in float32, the learned rotations (LieRE,
    ComRoPE) took exp(t·A) in float32, NaN at t ≈ 1e8); encodings that ignore time change by
    0 at both."""
    torch.manual_seed(0)
    model = mmpe.Transformer(48, 2, 1, [name], context={
        "num_axes": 3, "max_len": 64, "grid_shape": (4, 8)})
    x = torch.randn(1, 3, 48, generator=torch.Generator().manual_seed(1))

    def moved_by_one_second(epoch):
        outs = [model(x, Sphere(_LAT, _LON, time=torch.tensor([epoch, epoch + dt, epoch + 2],
                                                              dtype=torch.float64))).detach()
                for dt in (0.0, 1.0)]
        assert all(torch.isfinite(o).all() for o in outs)
        return float((outs[1] - outs[0]).abs().max())

    at_zero, at_unix = moved_by_one_second(0.0), moved_by_one_second(1.7e9)
    assert at_unix == pytest.approx(at_zero, rel=0.5, abs=1e-6), (at_zero, at_unix)
