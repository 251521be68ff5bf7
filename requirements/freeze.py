"""Write the lock of the running environment: `python requirements/freeze.py LOCK [TITLE]`.

Every installed distribution at its exact version (`pip freeze --all`, without the editable
mmpe), under a header saying how it was made; prints what moved against the previous lock, for
the CHANGELOG.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

HEADER = """\
# {title}.
# Every package at its exact version, as `make lock` resolved and tested it on {date}
# (Python {python}). Installed with --no-deps (the lock is complete), then mmpe editable on top;
# do not edit by hand: change requirements/lock.in or pyproject.toml and run `make lock`.
"""


def pins(text: str) -> dict[str, str]:
    """`name -> version` of a lock's `name==version` lines (names normalised as pip does)."""
    found = (re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line) for line in text.splitlines())
    return {re.sub(r"[-_.]+", "-", m[1]).lower(): m[2] for m in found if m}


def main(lock: str, title: str = "The development environment") -> None:
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            check=True, capture_output=True, text=True).stdout
    lines = sorted((ln for ln in frozen.splitlines() if "==" in ln), key=str.lower)
    path = Path(lock)
    old = pins(path.read_text()) if path.exists() else {}
    header = HEADER.format(title=title, date=datetime.date.today().isoformat(),
                           python=".".join(map(str, sys.version_info[:2])))
    path.write_text(header + "\n".join(lines) + "\n")
    new = pins(path.read_text())
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            print(f"{path.name}: {name} {old.get(name, '(new)')} -> {new.get(name, '(removed)')}")


if __name__ == "__main__":
    main(*sys.argv[1:])
