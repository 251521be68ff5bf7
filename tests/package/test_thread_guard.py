"""The test session's guard on torch's CPU thread count (`tests/conftest.py`).

torch's compiled CPU FlexAttention kernel (torch <= 2.11) sizes per-thread buffers for the
thread count it was compiled under; run under more threads, in the process or from inductor's
on-disk cache, it writes past them and the process aborts. A test file that set one thread at
import once made `make test` compile under one thread and `make test-core` load those kernels
under two. These tests check the three parts of the guard.
"""

from __future__ import annotations

import os

import conftest
import pytest
import torch


def _other() -> int:
    """A thread count other than the session's."""
    return 1 if conftest.SESSION_THREADS != 1 else 2


def test_a_module_that_changes_the_thread_count_at_import_stops_the_run() -> None:
    other = _other()
    torch.set_num_threads(other)
    try:
        with pytest.raises(pytest.UsageError, match=f"thread count to {other} at import"):
            conftest.pytest_collection_finish(None)
    finally:
        torch.set_num_threads(conftest.SESSION_THREADS)
    conftest.pytest_collection_finish(None)  # the session's count passes


def test_a_test_that_changes_the_thread_count_gets_it_back() -> None:
    conftest.check_threads()
    torch.set_num_threads(_other())
    conftest.restore_threads()
    assert torch.get_num_threads() == conftest.SESSION_THREADS


def test_a_test_that_starts_at_another_thread_count_fails() -> None:
    other = _other()
    torch.set_num_threads(other)
    try:
        with pytest.raises(AssertionError, match=f"thread count at {other}"):
            conftest.check_threads()
    finally:
        torch.set_num_threads(conftest.SESSION_THREADS)


def test_inductor_cache_is_one_per_thread_count() -> None:
    if conftest.INDUCTOR_CACHE_PRESET:
        pytest.skip("TORCHINDUCTOR_CACHE_DIR was set before the session: it is kept")
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert cache.endswith(f"_{conftest.SESSION_THREADS}threads")
