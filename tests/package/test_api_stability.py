"""The previous release's public API still imports and builds (deprecation policy).

`tests/data/api_previous_release.txt` lists what 0.1.0 exported (written once by
`tests/api_snapshot.py` from that release's own code): its top-level names with their
arguments, and every registered encoding with its options and their defaults. A renamed
option or argument must keep working under its old name, with a `FutureWarning`, for one
minor release (`mmpe.registry.REMOVED_IN`); anything else removed or renamed fails here.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.context import coords_context
from mmpe.encodings.base import ScoreEncoding

SNAPSHOT = Path(__file__).parents[1] / "data" / "api_previous_release.txt"
LINES = [json.loads(line) for line in SNAPSHOT.read_text().splitlines()
         if line and not line.startswith("#")]
NAMES = [x for x in LINES if x["kind"] == "name"]
ENCODINGS = [x for x in LINES if x["kind"] == "encoding"]
COORDS = [lambda: mmpe.Sequence(6), lambda: mmpe.Sequence(6, causal=True),
          lambda: mmpe.Grid((2, 3), prefix_tokens=1), lambda: mmpe.Composite([2, (2, 2), 2]),
          lambda: mmpe.Sphere(torch.tensor([10.0, -20.0]), torch.tensor([0.0, 90.0])),
          lambda: mmpe.Graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=3)]
CONTEXT = {"d_model": 48, "num_heads": 2, "head_dim": 24, "max_len": 64}
RENAMED_ARGS = {("register", "coords")}  # top-level arguments kept under their 0.1 name


def test_the_snapshot_is_the_previous_release() -> None:
    version = next(x["name"] for x in LINES if x["kind"] == "version")
    assert version == "0.1.0" and len(NAMES) >= 10 and len(ENCODINGS) >= 50


@pytest.mark.parametrize("entry", NAMES, ids=[x["name"] for x in NAMES])
def test_every_name_still_imports_with_its_arguments(entry: dict) -> None:
    obj = getattr(mmpe, entry["name"])  # AttributeError: a public name was removed
    if "params" not in entry:
        return
    now = inspect.signature(obj).parameters
    renamed = getattr(obj, "renamed_options", None) or {}
    lost = [p["name"] for p in entry["params"] if p["name"] not in now
            and p["name"] not in renamed and (entry["name"], p["name"]) not in RENAMED_ARGS]
    assert not lost, f"{entry['name']}: arguments of 0.1.0 gone without a deprecation: {lost}"


# Members 0.1 defined on every coordinate class (a base-class default that raised, or a flag),
# removed by the capability redesign: an encoding now asks `isinstance(coords, Metric)`, which
# holds exactly when the class defines `distance`, so a default on every class would make
# every class provide every capability. They cannot be kept; CHANGELOG lists them as Breaking.
CAPABILITY_MEMBERS = {"distance", "extent", "relation", "query_positions", "key_positions"}


@pytest.mark.parametrize("entry", [x for x in NAMES if "members" in x],
                         ids=[x["name"] for x in NAMES if "members" in x])
def test_every_class_keeps_its_members(entry: dict) -> None:
    cls = getattr(mmpe, entry["name"])
    lost = [m for m in entry["members"] if not hasattr(cls, m) and m not in CAPABILITY_MEMBERS]
    assert not lost, f"{entry['name']}: members of 0.1.0 gone without a deprecation: {lost}"


@pytest.mark.parametrize(("make", "directed"), [
    (lambda: mmpe.Sequence(4), True), (lambda: mmpe.Grid((2, 2)), False),
    (lambda: mmpe.Composite([2, (1, 2)]), True),
    (lambda: mmpe.Sphere(torch.zeros(2), torch.zeros(2)), False)])
def test_directed_flag_of_0_1(make, directed: bool) -> None:
    with pytest.warns(FutureWarning, match="isinstance"):
        assert make().directed is directed


def _old_options(entry: dict) -> dict:
    # Every option 0.1.0 gave a literal default, at that default: what a 0.1 config could say.
    return {p["name"]: (tuple(p["default"]) if isinstance(p["default"], list) else p["default"])
            for p in entry["params"] if not p["required"] and "default" in p}


@pytest.mark.parametrize("entry", ENCODINGS, ids=[x["name"] for x in ENCODINGS])
def test_every_encoding_still_builds_with_its_old_options(entry: dict) -> None:
    now = mmpe.get(entry["name"])
    for alias in entry["aliases"]:
        assert mmpe.get(alias) is now
    coords = next((c() for c in COORDS if now.supports(c())), None)
    context = {**CONTEXT, **(coords_context(coords) if coords is not None else {})}
    options = _old_options(entry)
    renamed = getattr(now.cls, "renamed_options", None) or {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enc = mmpe.build(entry["name"], context=context, **options)
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    old_names = sorted(set(options) & set(renamed))
    assert len(future) == len(old_names), future  # a warning per old name, none otherwise
    for old in old_names:
        assert any(repr(old) in m and repr(renamed[old]) in m for m in future), future
        assert getattr(enc, renamed[old]) == options[old]


SCALINGS = ["rope_dynamic_ntk", "rope_yarn", "rope_longrope", "rope_llama3"]


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(SCALINGS), length=st.integers(2, 1 << 20),
       route=st.sampled_from(["build", "config", "class", "context"]))
def test_max_len_means_original_max_position_embeddings(name: str, length: int,
                                                         route: str) -> None:
    """Every way 0.1 code passed ``max_len`` to a RoPE scaling gives the encoding that the new
    name gives, with one FutureWarning."""
    new = mmpe.build(name, head_dim=16, original_max_position_embeddings=length)
    with pytest.warns(FutureWarning, match="'max_len' (was renamed|is taken as) "
                                           "'original_max_position_embeddings'") as record:
        if route == "build":
            old = mmpe.build(name, head_dim=16, max_len=length)
        elif route == "config":  # a YAML/dict config goes through build
            old = mmpe.build({"name": name, "head_dim": 16, "max_len": length})
        elif route == "class":
            old = mmpe.get(name).cls(16, max_len=length)
        else:  # 0.1 handed every context key to each constructor that took it
            old = mmpe.build(name, context={"head_dim": 16, "max_len": length})
    assert len([w for w in record if issubclass(w.category, FutureWarning)]) == 1
    assert old.original_max_position_embeddings == length
    assert old.state_dict().keys() == new.state_dict().keys()
    pos = torch.arange(0, 3 * length, max(1, length // 2))[:8]
    q = torch.randn(1, 1, len(pos), 16, dtype=torch.float64)
    coords = mmpe.Sequence(position_ids=pos)
    torch.testing.assert_close(old(q, q, coords)[0], new(q, q, coords)[0], rtol=0, atol=0)


def test_longrope_at_one_token_says_why() -> None:
    """Found by the test above: LongRoPE's default attention factor divides by ln L."""
    with pytest.raises(ValueError, match=r"original_max_position_embeddings must be >= 2"):
        mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=1)
    enc = mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=1,
                     attention_factor=1.0)
    assert enc.original_max_position_embeddings == 1


def test_old_and_new_name_together_is_an_error() -> None:
    with pytest.raises(TypeError, match="pass original_max_position_embeddings only"):
        mmpe.build("rope_yarn", head_dim=16, max_len=64, original_max_position_embeddings=32)
    # A context naming the new key wins over the old one, silently: the model said both.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = mmpe.build("rope_yarn", context={"head_dim": 16, "max_len": 64,
                                               "original_max_position_embeddings": 32})
    assert enc.original_max_position_embeddings == 32


def test_yaml_config_with_the_old_name() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load("name: rope_yarn\nhead_dim: 16\nfactor: 8.0\nmax_len: 4096\n")
    with pytest.warns(FutureWarning, match="max_len"):
        enc = mmpe.build(config)
    assert enc.original_max_position_embeddings == 4096


def test_register_with_0_1_coordinate_kinds(monkeypatch) -> None:
    from mmpe import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    class OldStyle(ScoreEncoding):
        def score_mod(self, ctx):
            return lambda score, b, h, q, k: score

    with pytest.warns(FutureWarning, match="'coords' was renamed 'needs'"):
        mmpe.register("old_style_bias", hook="score", coords=("sequence",), learnable=False,
                      paper="0.1 style")(OldStyle)
    entry = mmpe.get("old_style_bias")
    assert entry.supports(mmpe.Sequence(4)) and entry.supports(mmpe.Sequence(4, causal=True))
    assert not entry.supports(mmpe.Grid((2, 2)))
    with pytest.raises(ValueError, match="unknown coordinate kinds"):
        mmpe.register("old_style_2", hook="score", coords=("sequense",), learnable=False,
                      paper="x")
    with pytest.raises(TypeError, match="pass needs only"):
        mmpe.register("old_style_3", hook="score", coords=("sequence",), needs=(mmpe.Metric,),
                      learnable=False, paper="x")


def test_the_0_1_compare_module_still_imports() -> None:
    pytest.importorskip("lightning", reason="mmpe.recipes.compare needs mmpe[recipes]")
    import importlib
    import sys

    sys.modules.pop("mmpe.compare", None)
    with pytest.warns(FutureWarning, match="mmpe.compare moved to mmpe.recipes.compare"):
        old = importlib.import_module("mmpe.compare")
    from mmpe.recipes import compare as new

    assert old.compare is new.compare and old.CompareSpec is new.CompareSpec
