"""The public API of this release still imports, takes its arguments and builds.

`tests/data/api_surface.txt` lists what the release exports (written by `tests/api_snapshot.py`
from the release commit's own code, imported in a subprocess): its top-level names with their
arguments and public members, and every registered encoding with its options and their
defaults. mmpe keeps no compatibility code (no moved-name tables, no renamed-option doors): a
name or option removed or renamed after the snapshot fails here until the change is written
down in CHANGELOG.md and the snapshot is taken again (`python tests/api_snapshot.py`).
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import pytest
import torch

import mmpe
from mmpe.context import coords_context

SNAPSHOT = Path(__file__).parents[1] / "data" / "api_surface.txt"
LINES = [json.loads(line) for line in SNAPSHOT.read_text().splitlines()
         if line and not line.startswith("#")]
NAMES = [x for x in LINES if x["kind"] == "name"]
ENCODINGS = [x for x in LINES if x["kind"] == "encoding"]
COORDS = [lambda: mmpe.Sequence(6), lambda: mmpe.Sequence(6, causal=True),
          lambda: mmpe.Grid((2, 3), prefix_tokens=1), lambda: mmpe.Composite([2, (2, 2), 2]),
          lambda: mmpe.Sphere(torch.tensor([10.0, -20.0]), torch.tensor([0.0, 90.0])),
          lambda: mmpe.Graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=3)]
CONTEXT = {"d_model": 48, "num_heads": 2, "head_dim": 24, "max_len": 64}


def test_the_snapshot_is_a_whole_surface() -> None:
    assert len(NAMES) >= 30 and len(ENCODINGS) >= 60
    assert {"build", "register", "available", "MultiHeadAttention"} <= {x["name"] for x in NAMES}


@pytest.mark.parametrize("entry", NAMES, ids=[x["name"] for x in NAMES])
def test_every_name_still_imports_with_its_arguments(entry: dict) -> None:
    obj = getattr(mmpe, entry["name"])  # AttributeError: a public name was removed
    if "params" not in entry:
        return
    now = inspect.signature(obj).parameters
    lost = [p["name"] for p in entry["params"] if p["name"] not in now]
    assert not lost, f"{entry['name']}: arguments of the release gone: {lost}"


@pytest.mark.parametrize("entry", [x for x in NAMES if "members" in x],
                         ids=[x["name"] for x in NAMES if "members" in x])
def test_every_class_keeps_its_members(entry: dict) -> None:
    cls = getattr(mmpe, entry["name"])
    lost = [m for m in entry["members"] if not hasattr(cls, m)]
    assert not lost, f"{entry['name']}: members of the release gone: {lost}"


def _options(entry: dict) -> dict:
    # Every option the release gave a literal default, at that default: what a config can say.
    return {p["name"]: (tuple(p["default"]) if isinstance(p["default"], list) else p["default"])
            for p in entry["params"] if not p["required"] and "default" in p}


@pytest.mark.parametrize("entry", ENCODINGS, ids=[x["name"] for x in ENCODINGS])
def test_every_encoding_still_builds_with_its_options(entry: dict) -> None:
    now = mmpe.get(entry["name"])
    for alias in entry["aliases"]:
        assert mmpe.get(alias) is now
    assert now.hook == entry["hook"]
    coords = next((c() for c in COORDS if now.supports(c())), None)
    context = {**CONTEXT, **(coords_context(coords) if coords is not None else {})}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing of the surface is deprecated
        mmpe.build(entry["name"], context=context, **_options(entry))


def test_longrope_at_one_token_says_why() -> None:
    """LongRoPE's default attention factor divides by ln L: one original token is refused."""
    with pytest.raises(ValueError, match=r"original_max_position_embeddings must be >= 2"):
        mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=1)
    enc = mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=1,
                     attention_factor=1.0)
    assert enc.original_max_position_embeddings == 1
