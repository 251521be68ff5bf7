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

from packaging.utils import canonicalize_name

HEADER = """\
# {title}.
# Every package at its exact version, as `make lock` resolved and tested it on {date}
# (Python {python}). Installed with --no-deps (the lock is complete), then mmpe editable on top;
# do not edit by hand: change requirements/lock.in or pyproject.toml and run `make lock`.
"""


def pins(text: str, source: str = "lock") -> dict[str, str]:
    """`name -> version` of a requirements text's pins (names canonical, as pip compares them).

    Blank and `#` lines are skipped; every other line must be one exact `name==version`.

    Raises:
        ValueError: a line that is not an exact pin, or a package pinned twice (names `source`).
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)", line.strip())
        if m is None:
            raise ValueError(f"{source}: not an exact pin: {line!r}")
        name = canonicalize_name(m[1])
        if name in found:
            raise ValueError(f"{source}: {m[1]} pinned twice")
        found[name] = m[2]
    return found


def main(lock: str, title: str = "The development environment") -> None:
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            check=True, capture_output=True, text=True).stdout
    lines = sorted((ln for ln in frozen.splitlines() if "==" in ln), key=str.lower)
    path = Path(lock)
    old = pins(path.read_text(), lock) if path.exists() else {}
    header = HEADER.format(title=title, date=datetime.date.today().isoformat(),
                           python=".".join(map(str, sys.version_info[:2])))
    path.write_text(header + "\n".join(lines) + "\n")
    new = pins(path.read_text(), lock)
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            print(f"{path.name}: {name} {old.get(name, '(new)')} -> {new.get(name, '(removed)')}")


if __name__ == "__main__":
    main(*sys.argv[1:])
