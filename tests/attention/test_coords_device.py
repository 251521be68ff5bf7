"""Coordinates on another device than the tensors are refused before any term is built,
naming both devices, through every attention entry (`forward`, `forward_heads`, cross
attention) and for every shipped coordinate type."""

from __future__ import annotations

import pytest
import torch
from helpers import D_MODEL, HEADS, model_context
from helpers import SAMPLE_COORDS as COORDS

import mmpe


@pytest.mark.parametrize("cname", sorted(COORDS))
def test_coordinates_on_meta_with_tensors_on_the_cpu_are_named(cname: str, monkeypatch) -> None:
    coords = COORDS[cname]()
    # every type the same way (not all of them have .to()): its device says meta
    monkeypatch.setattr(type(coords), "device", property(lambda self: torch.device("meta")))
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [mmpe.build("alibi", num_heads=HEADS)]
                                  if mmpe.get("alibi").supports(coords) else [])
    x = torch.randn(coords.batch_size or 1, coords.num_queries, D_MODEL)
    with pytest.raises(ValueError, match=r"coordinates are on meta but x is on cpu"):
        mha(x, coords)
    q = torch.randn(x.shape[0], HEADS, coords.num_queries, D_MODEL // HEADS)
    with pytest.raises(ValueError, match=r"coordinates are on meta but q is on cpu"):
        mha.forward_heads(q, q, q, coords)
    # a model: before its input encodings read the coordinates (fourier_features' B on the
    # CPU met meta positions in a matmul)
    inputs = [e.name for e in mmpe.available(hook="input", coords=coords)][:3]
    model = mmpe.Transformer(D_MODEL, HEADS, 1, inputs, context=model_context(coords))
    with pytest.raises(ValueError, match=r"coordinates are on meta but x is on cpu"):
        model(x, coords)


def test_points_moved_to_meta_in_the_tiles_plan_and_cross_attention() -> None:
    """The issue's case: `Points.to("meta")` with CPU heads reached the tiles plan's
    `.item()`."""
    points = mmpe.Points(torch.randn(10, 2)).to("meta")
    mha = mmpe.MultiHeadAttention(16, 2, [mmpe.build("alibi", num_heads=2)])
    q = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match=r"coordinates are on meta but q is on cpu"):
        mha.forward_heads(q, q, q, points)
    cross = mmpe.CrossAttention(16, 2, [])
    with pytest.raises(ValueError, match=r"coordinates are on meta but x is on cpu"):
        cross(torch.randn(1, 10, 16), points, torch.randn(1, 4, 16), mmpe.Sequence(4))
