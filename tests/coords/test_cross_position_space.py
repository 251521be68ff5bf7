"""Cross-attention offers positions to rotary encodings only within one position space.

A rotary score depends on ``p_q − p_k``; between unrelated coordinate systems (sphere radians
→ points in metres, grid cells → the sphere, token indices → metres) that difference means
nothing, so `Cross` offers no positions and every rotary encoding is refused with an error
naming both coordinate types. The whole class: every pair of shipped positioned coordinate
types, both ways round.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import mmpe
from mmpe.coords import Cross, register_cross_positions
from mmpe.coords.cross import _CROSS_POSITIONS

SAMPLES = {
    "Sequence": lambda: mmpe.Sequence(4),
    "Grid": lambda: mmpe.Grid((2, 2)),
    "Composite": lambda: mmpe.Composite([2, (1, 2), 1]),
    "Sphere": lambda: mmpe.Sphere(torch.tensor([0.0, 30.0, -10.0]), torch.tensor([0.0, 90.0, 5.0])),
    "Points1": lambda: mmpe.Points(torch.randn(3, 1), units="m"),
    "Points2": lambda: mmpe.Points(torch.randn(3, 2), units="m"),
    "Points3": lambda: mmpe.Points(torch.randn(3, 3), units="Å"),
}
ROTARY = {1: "rope", 2: "rope_axial", 3: "rope_axial"}


def _rotary(num_axes: int):
    if num_axes == 1:
        return mmpe.build("rope", head_dim=12)
    return mmpe.build("rope_axial", head_dim=12, num_axes=num_axes)


@pytest.mark.parametrize(("q_name", "k_name"), list(itertools.product(SAMPLES, SAMPLES)))
def test_rotary_cross_attention_needs_one_position_space(q_name: str, k_name: str) -> None:
    queries, keys = SAMPLES[q_name](), SAMPLES[k_name]()
    pair = Cross(queries, keys)
    same_space = q_name == k_name  # the shipped types share a space only with themselves
    assert isinstance(pair, mmpe.Positioned) == same_space, (q_name, k_name)
    if same_space:
        q, k = torch.randn(1, 2, queries.num_queries, 12), torch.randn(1, 2, keys.num_keys, 12)
        rq, rk = _rotary(pair.num_axes)(q, k, pair)
        assert rq.shape == q.shape and rk.shape == k.shape
        return
    for num_axes in sorted({getattr(queries, "num_axes", 1), getattr(keys, "num_axes", 1)}):
        with pytest.raises(TypeError) as info:
            _rotary(num_axes).check_coords(pair)
        message = str(info.value)
        assert "Positioned" in message
        assert type(queries).__name__ in message and type(keys).__name__ in message


def test_points_in_other_units_share_no_position_space() -> None:
    pair = Cross(mmpe.Points(torch.randn(3, 2), units="m"), mmpe.Points(torch.randn(4, 2), units="km"))
    assert not isinstance(pair, mmpe.Positioned)
    with pytest.raises(TypeError, match=r"not in one position space.*units"):
        _rotary(2).check_coords(pair)


def test_registered_pair_shares_its_space() -> None:
    """A user who knows two classes are one space (grid cells laid on metres) says so."""
    before = dict(_CROSS_POSITIONS)
    try:
        register_cross_positions(mmpe.Grid, mmpe.Points,
                                 lambda q, k: k.units == "cells")
        assert isinstance(Cross(mmpe.Grid((2, 2)), mmpe.Points(torch.randn(3, 2), units="cells")),
                          mmpe.Positioned)
        assert not isinstance(Cross(mmpe.Grid((2, 2)), mmpe.Points(torch.randn(3, 2), units="m")),
                              mmpe.Positioned)
    finally:
        _CROSS_POSITIONS.clear()
        _CROSS_POSITIONS.update(before)
