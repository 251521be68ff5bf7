"""What `mmpe.available(coords=obj)` promises, `mmpe.build(name, coords=obj)` delivers.

`available` lists an encoding when the coordinates provide the capabilities it needs; an
encoding also has settings that depend on the coordinates (``num_axes`` of `rope_mixed`,
``grid_shape`` of the learned grid tables), which a plain ``build(name)`` cannot know: it built
`rope_mixed` for 2 axes and refused a `Sequence`. ``build(name, coords=obj)`` takes them from
the object. The whole class: every listed encoding on every shipped coordinate type runs a
forward, and every unlisted one is refused at build time, naming the capability.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpe
from mmpe.encodings.base import InputEncoding

D_MODEL, HEADS = 48, 2
MODEL = {"d_model": D_MODEL, "num_heads": HEADS, "head_dim": D_MODEL // HEADS, "max_len": 64,
         "original_max_position_embeddings": 4}
pytestmark = pytest.mark.filterwarnings("error::FutureWarning")  # no deprecated route here


def _table():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(32, 2))
    return mmpe.Table.from_data(np.concatenate([base, base @ rng.normal(size=(2, 4))], 1), knn=2)


COORDS = {
    "sequence": lambda: mmpe.Sequence(6),
    "sequence_causal": lambda: mmpe.Sequence(6, causal=True),
    "grid": lambda: mmpe.Grid((2, 3), prefix_tokens=1),
    "video": lambda: mmpe.Grid((2, 2, 2)),
    "composite": lambda: mmpe.Composite([2, (2, 2), 2], causal=True),
    "sphere": lambda: mmpe.Sphere(torch.tensor([10.0, -20.0, 45.0]), torch.tensor([0.0, 90.0, -170.0])),
    "points": lambda: mmpe.Points(torch.randn(1, 5, 3)),
    "graph": lambda: mmpe.Graph(torch.tensor([[0, 1, 2], [1, 2, 3]]), num_nodes=4),
    "table": _table,
}


def _run(enc, coords) -> torch.Tensor:
    x = torch.randn(coords.batch_size or 1, coords.num_queries, D_MODEL)
    with torch.no_grad():
        if isinstance(enc, InputEncoding):
            if getattr(enc, "width", None) and not getattr(enc, "project", True):
                x = x[..., : D_MODEL - enc.width]  # Tab-PET concatenates its own channels
            return enc.combine(x, coords)
        attn = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
        attn.route = "math"  # every hook runs on it; the matrix test compares the paths
        return attn(x, coords)


@pytest.mark.parametrize("cname", sorted(COORDS))
def test_every_listed_encoding_builds_and_runs_on_the_object(cname: str) -> None:
    coords = COORDS[cname]()
    listed = mmpe.available(coords=coords)
    assert listed
    for entry in listed:
        enc = mmpe.build(entry.name, coords=coords, context=MODEL)
        out = _run(enc, coords)
        assert torch.isfinite(out).all(), (entry.name, cname)


@pytest.mark.parametrize("cname", sorted(COORDS))
def test_every_unlisted_encoding_is_refused_at_build_time(cname: str) -> None:
    coords = COORDS[cname]()
    listed = {e.name for e in mmpe.available(coords=coords)}
    for entry in mmpe.available():
        if entry.name in listed:
            continue
        with pytest.raises(TypeError, match=rf"build\('{entry.name}', coords=\.\.\.\).*"
                                            rf"{type(coords).__name__} does not"):
            mmpe.build(entry.name, coords=coords, context=MODEL)


def test_rope_mixed_on_a_sequence() -> None:
    """The issue's case: listed for a Sequence, and now built for its one axis."""
    seq = mmpe.Sequence(6)
    assert "rope_mixed" in {e.name for e in mmpe.available(coords=seq)}
    enc = mmpe.build("rope_mixed", coords=seq, head_dim=16, num_heads=2)
    assert enc.num_axes == 1
    q = torch.randn(1, 2, 6, 16)
    assert enc(q, q, seq)[0].shape == q.shape
    # An explicit context value wins over the object's (the model said so).
    assert mmpe.build("rope_mixed", coords=seq, head_dim=16, num_heads=2,
                      context={"num_axes": 1}).num_axes == 1
