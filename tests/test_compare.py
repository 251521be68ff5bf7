import json
import sys
import types

import pytest
from mmpe.recipes import RECIPES
from mmpe.recipes.compare import CompareSpec, compare, format_table, resolve_encodings

from mmpe import cli

SPEC = CompareSpec(metric="bpc", columns=["1x", "2x"], xlabel="length", lower_is_better=True,
                   default_encodings=["rope", "alibi"], title="toy")


def test_resolve_names_family_and_all():
    assert resolve_encodings(SPEC, None, None) == ["rope", "alibi"]
    assert resolve_encodings(SPEC, "t5, fire", None) == ["t5", "fire"]
    assert "rope" in resolve_encodings(SPEC, None, "rotary")
    assert {"alibi", "rope", "t5"} <= set(resolve_encodings(SPEC, "all", None))
    with pytest.raises(KeyError, match="unknown encoding 'bogus'"):
        resolve_encodings(SPEC, "rope,bogus", None)
    with pytest.raises(ValueError, match="no encoding of family"):
        resolve_encodings(SPEC, None, "nonsense")


def test_table_marks_na():
    table = format_table(SPEC, {"learned": {"1x": 2.5, "2x": None}}, {"learned": 3.0})
    assert "| learned | 2.500 | n/a | 3 |" in table


def test_compare_writes_table_json_and_plot(tmp_path, monkeypatch):
    """A recipe module stands in for training: compare must call it per encoding and report."""
    calls = []

    def run_one(encoding, *, seed, out_dir, cli_args):
        calls.append((encoding, seed, tuple(cli_args)))
        return {"1x": 2.0 if encoding == "rope" else 3.0, "2x": None}

    fake = types.ModuleType("mmpe.recipes.toy")
    fake.COMPARE, fake.run_one = SPEC, run_one
    monkeypatch.setitem(sys.modules, "mmpe.recipes.toy", fake)
    monkeypatch.setitem(RECIPES, "toy", ("mmpe.recipes.toy", "a stand-in"))
    table = compare("toy", "rope,alibi", out_dir=tmp_path, seed=3, cli_args=["--x", "1"])
    assert calls == [("rope", 3, ("--x", "1")), ("alibi", 3, ("--x", "1"))]
    assert "| rope | 2.000 | n/a |" in table and "| alibi | 3.000 | n/a |" in table
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"]["alibi"] == {"1x": 3.0, "2x": None}
    assert (tmp_path / "bpc.png").stat().st_size > 1000


def test_cli_list_and_errors(capsys):
    assert cli.main(["list", "--hook", "score"]) == 0
    out = capsys.readouterr().out
    assert "alibi" in out and "Press et al. 2022" in out and "rope " not in out
    assert cli.main(["compare", "nosuchrecipe"]) == 2
    assert "unknown recipe 'nosuchrecipe'" in capsys.readouterr().err


def test_a_recipe_can_accept_its_own_encoding_names():
    """``check_encoding`` replaces the registry lookup (aliases, ``a+b`` combinations)."""
    seen = []
    spec = CompareSpec(metric="m", columns=["x"], xlabel="x", lower_is_better=True,
                       default_encodings=["rope"], check_encoding=seen.append)
    assert resolve_encodings(spec, "spd,spd+alibi", None) == ["spd", "spd+alibi"]
    assert seen == ["spd", "spd+alibi"]
    with pytest.raises(KeyError):
        resolve_encodings(SPEC, "spd+alibi", None)
