import os
import sys
import types

import pytest
from mmpe.recipes import RECIPES
from mmpe.recipes.compare import CompareSpec, compare, resolve_encodings

from mmpe import cli
from mmpe.results import store

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


def _fake_recipe(monkeypatch, calls, fail=None):
    """A recipe module standing in for training; ``fail`` = (encoding, seed) that raises."""

    def run_one(encoding, *, seed, out_dir, cli_args):
        if (encoding, seed) == fail:
            raise RuntimeError("training diverged")
        calls.append((encoding, seed, tuple(cli_args)))
        return {"1x": (2.0 if encoding == "rope" else 3.0) + seed / 100, "2x": None}

    fake = types.ModuleType("mmpe.recipes.toy")
    fake.COMPARE, fake.run_one = SPEC, run_one
    monkeypatch.setitem(sys.modules, "mmpe.recipes.toy", fake)
    monkeypatch.setitem(RECIPES, "toy", ("mmpe.recipes.toy", "a stand-in"))


def test_compare_stores_each_run_and_renders_mean_sd(tmp_path, monkeypatch):
    calls = []
    _fake_recipe(monkeypatch, calls)
    table = compare("toy", "rope,alibi", out_dir=tmp_path / "out", seed=3, seeds=2,
                    store=tmp_path / "store", cli_args=["--x", "1"])
    assert calls == [("rope", 3, ("--x", "1")), ("alibi", 3, ("--x", "1")),
                     ("rope", 4, ("--x", "1")), ("alibi", 4, ("--x", "1"))]
    table = table.replace(" †", "")  # the mark of runs from a tree with uncommitted changes
    assert "| rope | **2.035 ± 0.007** | n/a | 2 (3, 4) |" in table
    assert "| alibi | 3.035 ± 0.007 | n/a | 2 (3, 4) |" in table
    records = store.read(tmp_path / "store", "toy")
    assert len(records) == 4 and {r["setting"] for r in records} == {store.setting_name(["--x", "1"])}
    first = records[0]
    assert first["metrics"] == {"1x": 2.03, "2x": None} and first["cli_args"] == ["--x", "1"]
    assert first["versions"]["torch"] and first["device"].startswith(("cpu", "cuda"))
    assert first["wall_s"] >= 0 and first["threads"] >= 1 and "commit" in first["git"]
    assert (tmp_path / "out" / "bpc.png").stat().st_size > 1000
    assert "2.035 ± 0.007" in (tmp_path / "out" / "results.md").read_text()


def test_rerun_skips_stored_runs_and_survives_a_failure(tmp_path, monkeypatch):
    calls = []
    _fake_recipe(monkeypatch, calls, fail=("alibi", 1))
    with pytest.raises(RuntimeError, match="diverged"):
        compare("toy", "rope,alibi", out_dir=tmp_path, seeds=2, store=tmp_path / "s")
    assert [(e, s) for e, s, _ in calls] == [("rope", 0), ("alibi", 0), ("rope", 1)]
    assert store.done(tmp_path / "s", "toy", "default") == {("rope", 0), ("alibi", 0), ("rope", 1)}
    calls.clear()
    _fake_recipe(monkeypatch, calls)
    compare("toy", "rope,alibi", out_dir=tmp_path, seeds=2, store=tmp_path / "s")
    assert [(e, s) for e, s, _ in calls] == [("alibi", 1)]  # only what was missing
    calls.clear()
    compare("toy", "rope", out_dir=tmp_path, seeds=1, store=tmp_path / "s", rerun=True)
    assert [(e, s) for e, s, _ in calls] == [("rope", 0)]
    assert len(store.read(tmp_path / "s", "toy")) == 4  # the re-run replaced its record
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        compare("toy", "rope", out_dir=tmp_path, seeds=0, store=tmp_path / "s")


def test_cli_list_and_errors(capsys):
    assert cli.main(["list", "--hook", "score", "--width", "200"]) == 0  # whole paper cells
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


TOY_MODULE = '''
import os
from mmpe.recipes.compare import CompareSpec

COMPARE = CompareSpec(metric="m", columns=["x"], xlabel="x", lower_is_better=True,
                      default_encodings=["rope"])


def run_one(encoding, *, seed, out_dir, cli_args):
    return {"x": float(seed), "pid": float(os.getpid()), "threads": float(os.environ.get("MMPE_THREADS", "0"))}
'''


def test_parallel_jobs_store_the_same_records(tmp_path, monkeypatch):
    """--jobs 2 trains in two spawned processes (one thread each on 2 cores unless told) and
    stores what the serial run stores."""
    (tmp_path / "toy_parallel.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("MMPE_THREADS", raising=False)
    monkeypatch.setitem(RECIPES, "toyp", ("toy_parallel", "a stand-in"))
    compare("toyp", "rope,alibi", out_dir=tmp_path / "o", seeds=2, store=tmp_path / "p", jobs=2)
    compare("toyp", "rope,alibi", out_dir=tmp_path / "o", seeds=2, store=tmp_path / "s")
    par, ser = store.read(tmp_path / "p", "toyp"), store.read(tmp_path / "s", "toyp")
    key = lambda r: (r["encoding"], r["seed"])  # noqa: E731
    assert sorted(map(key, par)) == sorted(map(key, ser)) and len(par) == 4
    assert {r["metrics"]["pid"] for r in par}.isdisjoint({os.getpid()})
    assert {r["metrics"]["pid"] for r in ser} == {os.getpid()}
    assert {r["metrics"]["x"] for r in par} == {0.0, 1.0}
    cores = len(os.sched_getaffinity(0))
    assert {r["metrics"]["threads"] for r in par} == {float(max(1, cores // 2))}
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        compare("toyp", "rope", out_dir=tmp_path / "o", store=tmp_path / "p", jobs=0)


def test_record_names_the_threads_the_run_used(tmp_path, monkeypatch):
    """The recipe sets the threads when it builds its trainer: the record reads them after."""
    import torch

    def run_one(encoding, *, seed, out_dir, cli_args):
        torch.set_num_threads(1)
        return {"1x": 1.0, "2x": 1.0}

    fake = types.ModuleType("mmpe.recipes.toy")
    fake.COMPARE, fake.run_one = SPEC, run_one
    monkeypatch.setitem(sys.modules, "mmpe.recipes.toy", fake)
    monkeypatch.setitem(RECIPES, "toy", ("mmpe.recipes.toy", "a stand-in"))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        compare("toy", "rope", out_dir=tmp_path, seeds=1, store=tmp_path / "s")
    finally:
        torch.set_num_threads(before)
    assert store.read(tmp_path / "s", "toy")[0]["threads"] == 1


def test_record_keeps_the_flags_that_change_the_attention_path(monkeypatch):
    monkeypatch.delenv("MMPE_FLEX_DYNAMIC", raising=False)
    monkeypatch.delenv("MMPE_FLEX_STRICT", raising=False)
    monkeypatch.delenv("MMPE_ATTN_BLOCK_BYTES", raising=False)
    assert "flags" not in store.environment()
    monkeypatch.setenv("MMPE_FLEX_DYNAMIC", "0")
    monkeypatch.setenv("UNRELATED_VARIABLE", "1")
    assert store.environment()["flags"] == {"MMPE_FLEX_DYNAMIC": "0"}
