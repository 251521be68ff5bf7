"""Write tests/data/api_surface.txt: the public API of this release.

Run once per release (``python tests/api_snapshot.py [--commit C]``; without ``--commit``, the
checkout's working tree); `tests/package/test_api_stability.py` checks that every name in it still imports,
takes its arguments and keeps its members, and every encoding still builds with the option
names and defaults it had. mmpe keeps no compatibility code: a change to the surface is
written in CHANGELOG.md and the snapshot is taken again.

The snapshot is taken by importing that ``mmpe`` (a commit's extracted with ``git archive``)
in a subprocess from a copy, so the file lists what the release really exports, not what its docs say.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "api_surface.txt"

# Runs inside the old release: one JSON object per line.
DUMP = r'''
import ast, inspect, json, mmpe

def literal(value):
    try:
        return ast.literal_eval(repr(value)) == value, value
    except (ValueError, SyntaxError, TypeError):
        return False, None

def params(obj):
    out = []
    for p in inspect.signature(obj).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        entry = {"name": p.name, "required": p.default is p.empty}
        ok, value = literal(p.default) if p.default is not p.empty else (False, None)
        if ok:
            entry["default"] = value
        out.append(entry)
    return out

print(json.dumps({"kind": "version", "name": mmpe.__version__}))
for name in sorted(mmpe.__all__):
    obj = getattr(mmpe, name)
    line = {"kind": "name", "name": name}
    if inspect.isclass(obj):  # public members, less those every torch module has
        import torch
        line["members"] = sorted(a for a in dir(obj) if not a.startswith("_")
                                 and not hasattr(torch.nn.Module, a))
    if callable(obj):
        try:
            line["params"] = params(obj)
        except (TypeError, ValueError):
            pass
    print(json.dumps(line))
for e in mmpe.available():
    print(json.dumps({"kind": "encoding", "name": e.name, "aliases": list(e.aliases),
                      "hook": e.hook, "params": params(e.cls)}))
'''


def snapshot(commit: str | None) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        if commit is None:
            shutil.copytree(ROOT / "mmpe", Path(tmp) / "mmpe",
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            archive = subprocess.run(["git", "archive", commit, "mmpe"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        run = subprocess.run([sys.executable, "-c", DUMP], cwd=tmp, capture_output=True,
                             text=True, env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"},
                             check=True)
    return run.stdout.splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", help="the release commit (default: the working tree)")
    args = parser.parse_args()
    commit = args.commit and subprocess.run(["git", "rev-parse", args.commit], cwd=ROOT,
                                            check=True, capture_output=True, text=True).stdout
    lines = snapshot(commit and commit.strip())
    where = f"the release at {commit[:12]}" if commit else "the release's working tree"
    header = (f"# The public API of {where}, one JSON object a line; written by "
              "tests/api_snapshot.py, checked by tests/package/test_api_stability.py")
    OUT.write_text("\n".join([header, *lines]) + "\n")
    print(f"wrote {len(lines)} entries to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
