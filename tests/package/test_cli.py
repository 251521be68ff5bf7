"""The `mmpe` command line as a newcomer meets it: a version, a table with a header that fits
the terminal, close matches for misspelt names, a line when a check passes, and every error on
malformed input as ONE line on stderr that names the argument or the file (no traceback, a
non-zero exit code). Each case runs in-process (`cli.main`), so the table is quick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mmpe
from mmpe import cli, registry


def _has_recipes() -> bool:
    """Lightning importable (and the extras not hidden, as `make test-core` hides them)."""
    import importlib.util
    import os

    hidden = os.environ.get("MMPE_HIDE_EXTRAS") == "1"
    return not hidden and importlib.util.find_spec("lightning") is not None


def _store(tmp: Path, name: str, content: bytes) -> str:
    folder = tmp / name
    folder.mkdir()
    (folder / "text.jsonl").write_bytes(content)
    return str(folder)


RECORD = {"recipe": "text", "setting": "default", "encoding": "rope", "seed": 0}


@pytest.fixture
def bad(tmp_path: Path) -> dict[str, str]:
    """Malformed stores, pages and checkpoints, by name."""
    files = {
        "metrics_str": _store(tmp_path, "metrics_str",
                              json.dumps({**RECORD, "metrics": "oops"}).encode() + b"\n"),
        "metrics_list": _store(tmp_path, "metrics_list",
                               json.dumps({**RECORD, "metrics": [1, 2]}).encode() + b"\n"),
        "not_utf8": _store(tmp_path, "not_utf8", b"\xff\xfe\x00 not text\n"),
        "not_json": _store(tmp_path, "not_json", b"{\"recipe\": \"text\", \n"),
        "not_object": _store(tmp_path, "not_object", b"[1, 2, 3]\n"),
    }
    page = tmp_path / "page.md"
    page.write_text("<!-- mmpe:report text -->\n<!-- mmpe:end -->\n", encoding="utf-8")
    files["page"] = str(page)
    (tmp_path / "latin1.md").write_bytes("caf\xe9\n".encode("latin-1"))
    files["latin1_page"] = str(tmp_path / "latin1.md")
    files["folder"] = str(tmp_path)
    files["missing"] = str(tmp_path / "nofile.md")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    files["empty_ckpt"] = str(tmp_path / "empty.ckpt")
    (tmp_path / "garbage.ckpt").write_bytes(b"garbage\n")
    files["garbage_ckpt"] = str(tmp_path / "garbage.ckpt")
    torch.save(torch.arange(3), tmp_path / "truncated.ckpt")
    data = (tmp_path / "truncated.ckpt").read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    files["truncated_ckpt"] = str(tmp_path / "truncated.ckpt")
    torch.save([1, 2], tmp_path / "list.ckpt")
    files["list_ckpt"] = str(tmp_path / "list.ckpt")
    torch.save({"state_dict": {"x": torch.zeros(1)}}, tmp_path / "noschedule.ckpt")
    files["noschedule_ckpt"] = str(tmp_path / "noschedule.ckpt")
    files["out"] = str(tmp_path / "plots")
    return files


#: (argv with {placeholders} from `bad`, what the one error line must contain)
CASES = {
    # report: malformed stores, for a recipe's table, --check and --write
    "report metrics is a string": (["report", "text", "--store", "{metrics_str}"],
                                   ["metrics_str", "line 1", "'metrics'"]),
    "report metrics is a list": (["report", "text", "--store", "{metrics_list}"],
                                 ["metrics_list", "line 1", "'metrics'"]),
    "report store not UTF-8": (["report", "text", "--store", "{not_utf8}"],
                               ["not_utf8", "not UTF-8"]),
    "report store line not JSON": (["report", "text", "--store", "{not_json}"],
                                   ["not_json", "line 1", "not JSON"]),
    "report store line not an object": (["report", "text", "--store", "{not_object}"],
                                        ["not_object", "line 1"]),
    "report --check on a bad store": (["report", "--store", "{metrics_str}", "--check", "{page}"],
                                      ["--store", "metrics_str", "'metrics'"]),
    "report --write on a bad store": (["report", "--store", "{not_utf8}", "--write", "{page}"],
                                      ["--store", "not UTF-8"]),
    "report --check a missing file": (["report", "--check", "{missing}"],
                                      ["--check", "nofile.md"]),
    "report --write a missing file": (["report", "--write", "{missing}"],
                                      ["--write", "nofile.md"]),
    "report --check a folder": (["report", "--check", "{folder}"], ["--check", "folder"]),
    "report --check a file not UTF-8": (["report", "--check", "{latin1_page}"],
                                        ["--check", "latin1.md", "not UTF-8"]),
    "report an unknown recipe": (["report", "txt"], ["unknown recipe 'txt'", "'text'"]),
    # compare: refused before any training
    "compare --encodings ,,": (["compare", "context", "--encodings", ",,"],
                               ["--encodings", "names no encoding"]),
    "compare --encodings a,,b": (["compare", "text", "--encodings", "rope,,alibi"],
                                 ["--encodings", "empty name"]),
    "compare a misspelt recipe": (["compare", "txet"], ["unknown recipe 'txet'", "'text'"]),
    "compare on a bad store": (["compare", "text", "--store", "{metrics_str}"],
                               ["metrics_str", "'metrics'"]),
    # show: checkpoints, presets and their options
    "show an empty checkpoint": (["show", "{empty_ckpt}"], ["empty.ckpt", "not a readable"]),
    "show a garbage checkpoint": (["show", "{garbage_ckpt}"], ["garbage.ckpt", "not a readable"]),
    "show a truncated checkpoint": (["show", "{truncated_ckpt}"],
                                    ["truncated.ckpt", "not a readable"]),
    "show a checkpoint of a list": (["show", "{list_ckpt}"], ["list.ckpt", "list"]),
    "show a checkpoint without schedule": (["show", "{noschedule_ckpt}"],
                                           ["noschedule.ckpt", "no layer schedule"]),
    "show a negative base": (["show", "gemma3", "--option", "local_base=-5"],
                             ["local_base=-5", "base must be"]),
    "show a window that is text": (["show", "gemma3", "--option", "sliding_window=wide"],
                                   ["window", "'wide'"]),
    "show an unknown option": (["show", "gemma3", "--option", "colour=red"], ["colour"]),
    "show an option without =": (["show", "gemma3", "--option", "local_base"],
                                 ["--option", "KEY=VALUE"]),
    "show a huge depth": (["show", "gemma3", "--depth", "20000000"], ["--depth", "20000000"]),
    "show depth 0": (["show", "llama4", "--depth", "0"], ["--depth", "got 0"]),
    "show a misspelt encoding": (["show", "ropee"], ["'ropee'", "Did you mean 'rope'"]),
    # plot
    "plot a corrupt checkpoint": (["plot", "alibi", "--checkpoint", "{garbage_ckpt}",
                                   "--out", "{out}"], ["garbage.ckpt", "not a readable"]),
    "plot a misspelt encoding": (["plot", "alibii", "--out", "{out}"], ["Did you mean 'alibi'"]),
    # list and the parser
    "list a misspelt coordinate kind": (["list", "--coords", "gird"],
                                        ["'gird'", "Did you mean 'grid'"]),
    "list an unknown hook": (["list", "--hook", "bias"], ["--hook", "'bias'"]),
    "an unknown command": (["frobnicate"], ["'frobnicate'"]),
    "a misspelt command": (["lst"], ["'lst'", "did you mean 'list'"]),
    # arguments the command does not read are refused by name, never ignored (as plot does)
    "show an encoding with --option": (["show", "rope", "--option", "base=abc"],
                                       ["--option", "mmpe show rope", "leave it out"]),
    "show an encoding with --depth": (["show", "rope", "--depth", "3"],
                                      ["--depth", "mmpe show rope", "leave it out"]),
    "show a checkpoint with --depth": (["show", "{noschedule_ckpt}", "--depth", "3"],
                                       ["--depth", "noschedule.ckpt", "leave it out"]),
    "report --check with a recipe": (["report", "text", "--check", "{page}"],
                                     ["RECIPE", "--check", "leave it out"]),
    "report --write with --plot": (["report", "--write", "{page}", "--plot", "x.png"],
                                   ["--plot", "--write", "leave it out"]),
    "report a table with --no-plots": (["report", "text", "--no-plots"],
                                       ["--no-plots", "leave it out"]),
    "a bad --depth type": (["show", "gemma3", "--depth", "many"], ["--depth", "'many'"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_error_is_one_line(name: str, bad: dict[str, str], capsys) -> None:
    argv, wanted = CASES[name]
    if argv[:2] == ["report", "text"] and not _has_recipes():
        pytest.skip("`mmpe report <recipe>` reads the recipe's spec: needs the recipes extra")
    argv = [a.format(**bad) for a in argv]
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors exit
        code = exit_.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code not in (0, None), (argv, captured)
    assert len(lines) == 1, f"{argv}: {len(lines)} lines:\n{captured.err}"
    assert "Traceback" not in captured.err
    for text in wanted:
        assert text in lines[0], (argv, lines[0])


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"mmpe {mmpe.__version__} (torch ") and out.count("\n") == 1


def test_list_has_a_header_and_fits_the_width(capsys) -> None:
    assert cli.main(["list", "--width", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "HOOK", "PARAMS", "NEEDS", "RUNS", "ON", "PAPER"]
    assert len(lines) == 1 + len(registry.available()) + 1
    assert max(map(len, lines)) <= 100
    assert any(line.startswith("alibi ") and "Press et al." in line for line in lines)


def test_list_filters_and_matrix(capsys) -> None:
    assert cli.main(["list", "--hook", "rotary", "--coords", "sphere", "--width", "120"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:-1]
    assert rows and all(row.split()[1] == "rotary" for row in rows)
    assert {row.split()[0] for row in rows} == {
        e.name for e in registry.available(hook="rotary", coords="sphere")}
    assert cli.main(["list", "--matrix", "--width", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = list(registry.shipped_coordinate_types())
    assert lines[0].split() == ["NAME", "HOOK", *kinds]
    rope = next(line.split() for line in lines if line.startswith("rope "))
    assert rope[2 + kinds.index("sequence")] == "✓" and rope[2 + kinds.index("graph")] == "·"


def test_report_check_says_when_it_passes(tmp_path: Path, capsys) -> None:
    page = tmp_path / "page.md"
    page.write_text("no blocks here\n", encoding="utf-8")
    assert cli.main(["report", "--store", str(tmp_path), "--check", str(page)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"report --check: all 0 blocks of 1 file match the store {tmp_path}"]


#: a value for each optional argument of `mmpe show` (a new one must be added here)
SHOW_FLAGS = {"--depth": ["3"], "--option": ["base=abc"]}


def test_show_refuses_every_argument_its_form_does_not_read(bad: dict[str, str],
                                                             capsys) -> None:
    """An encoding's card and a checkpoint's stored schedule read no optional argument of
    `mmpe show`: each is refused naming itself (a preset reads them all)."""
    import argparse

    parser = argparse.ArgumentParser()
    cli._show_arguments(parser)
    flags = {a.option_strings[0] for a in parser._actions
             if a.option_strings and a.dest != "help"}
    assert flags == set(SHOW_FLAGS), "add the new `mmpe show` argument to SHOW_FLAGS"
    for name in ("rope", "alibi", bad["noschedule_ckpt"]):
        for flag, values in SHOW_FLAGS.items():
            assert cli.main(["show", name, flag, *values]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"mmpe show: error: {flag} does not change"), err
    for flag, values in SHOW_FLAGS.items():  # a preset reads them
        value = ["sliding_window=512"] if flag == "--option" else values
        assert cli.main(["show", "gemma3", flag, *value]) == 0, capsys.readouterr().err
