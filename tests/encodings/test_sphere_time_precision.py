"""Sphere time stamps that float32 cannot resolve are refused, not silently merged."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpe import Sphere


def _sphere(times):
    n = len(times)
    return Sphere(np.zeros(n), np.linspace(-170, 170, n), units="deg", time=np.asarray(times))


def test_unix_seconds_one_second_apart_are_refused():
    with pytest.raises(ValueError, match="subtract a reference time"):
        _sphere([1.7e9, 1.7e9 + 1, 1.7e9 + 2])


def test_hours_since_1900_at_minute_steps_are_refused_on_grids_too():
    hours = 1_100_000.0 + np.arange(4) / 60.0
    with pytest.raises(ValueError, match="cannot resolve"):
        _sphere(hours)
    with pytest.raises(ValueError, match="cannot resolve"):
        Sphere.grid(2, 3, times=hours)


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1e4), st.floats(0.5, 100), st.integers(2, 6))
def test_resolvable_times_keep_their_steps(start, step, n):
    times = start + step * np.arange(n)
    s = _sphere(times)
    diffs = torch.diff(s.time.double())
    assert torch.allclose(diffs, torch.full_like(diffs, step), rtol=1e-3, atol=0.01 * step)
    g = Sphere.grid(2, 2, times=times)
    assert torch.equal(torch.unique(g.time), torch.unique(s.time))
