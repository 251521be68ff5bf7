"""DeBERTa-v2 log buckets equal HF transformers' over the whole parameter space.

``make_log_bucket_position`` (``transformers.models.deberta_v2``) is the reference: every bucket
size from 2 to 512, every ``max_position`` the encoding accepts (``> bucket_size // 2 + 1``) up
to 4·bucket_size + 64 and the powers of two DeBERTa-v2/v3 use, every relative position in
``[−2·max_position, 2·max_position]`` (past ``max_position`` the buckets keep growing, and HF's
numbers are still the reference). The defect this guards: a float64 ``math.log`` of the
constant against HF's float32 ``torch.log`` put ``|i − j| = max_position − 1`` one bucket too
high whenever the float32 ratio of the two logs is exactly 1.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpe.encodings.deberta import log_bucket_position

hf = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


@st.composite
def bucket_settings(draw) -> tuple[int, int]:
    bucket_size = draw(st.integers(2, 512))
    mid = bucket_size // 2
    max_position = draw(st.one_of(
        st.integers(mid + 2, 4 * bucket_size + 64),
        st.sampled_from([2 ** p for p in range(1, 13) if 2 ** p > mid + 1] or [mid + 2]),
        st.just(mid + 2),  # the smallest accepted
    ))
    return bucket_size, max_position


def _check(bucket_size: int, max_position: int) -> None:
    rel = torch.arange(-2 * max_position, 2 * max_position + 1)
    ours = log_bucket_position(rel, bucket_size, max_position)
    theirs = hf.make_log_bucket_position(rel, bucket_size, max_position).long()
    bad = (ours != theirs).nonzero().flatten()
    assert not bad.numel(), (f"bucket_size={bucket_size}, max_position={max_position}: "
                             f"offsets {rel[bad][:8].tolist()} -> {ours[bad][:8].tolist()}, HF "
                             f"{theirs[bad][:8].tolist()}")
    assert ours.dtype == torch.int64
    # HF's shape of the bucketing: exact near 0, odd in the offset, monotone, and within
    # ±(bucket_size − 1) up to max_position.
    assert torch.equal(ours[rel.abs() <= bucket_size // 2], rel[rel.abs() <= bucket_size // 2])
    assert torch.equal(ours, -ours.flip(0))
    assert bool((ours.diff() >= 0).all())
    inside = rel.abs() <= max_position - 1
    assert int(ours[inside].abs().max()) <= bucket_size - 1 + bucket_size % 2


@settings(max_examples=300, deadline=None)
@given(bucket_settings())
def test_log_buckets_equal_hf(params: tuple[int, int]) -> None:
    _check(*params)


@pytest.mark.parametrize("bucket_size", [2, 3, 4, 5, 6, 7, 8, 16, 63, 64, 65, 256])
def test_log_buckets_equal_hf_at_every_max_position(bucket_size: int) -> None:
    """Every max_position from the smallest accepted to 2·bucket_size + 8, exhaustively (larger
    bucket sizes are sampled by the property test above)."""
    for max_position in range(bucket_size // 2 + 2, 2 * bucket_size + 9):
        _check(bucket_size, max_position)


def test_the_reported_boundary() -> None:
    """bucket_size 4, max_position 4: log(3/2)/log(3/2) = 1, so offset 3 is bucket ±3 (HF)."""
    rel = torch.arange(-4, 5)
    assert log_bucket_position(rel, 4, 4).tolist() == [-4, -3, -2, -1, 0, 1, 2, 3, 4]
    assert log_bucket_position(rel, 4, 4).tolist() == hf.make_log_bucket_position(rel, 4, 4).long().tolist()
