"""Print the bad-input suite's cases per category and per part (the issue's closing count).

    python tests/bad_input_counts.py

Counts distinct cases, without running them: every (encoding, option, malformed value) triple
that tests/package/test_bad_input.py drives (hypothesis samples each option's values), its coordinate,
forward and newer-API cases, and the tests of tests/package/test_misuse_edges.py. Case lists and
categories are read from the test modules, so the count follows them.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "package"))

import test_bad_input as bad  # noqa: E402
import test_misuse_edges as misuse  # noqa: E402


def counts() -> dict[str, Counter]:
    parts: dict[str, Counter] = {}
    options = Counter()
    for param in bad._options():
        _name, _arg, kind, values = param.values
        options.update(bad.option_category(kind, v) for v in values)
    parts["constructor options"] = options
    for part, cases in (("coordinates", bad.COORDINATES), ("forwards", bad.FORWARD),
                        ("newer APIs", bad.NEWER)):
        parts[part] = Counter(p.values[2] for p in cases)
    parts["misuse edges"] = Counter(misuse.CATEGORY.values())
    return parts


def main() -> None:
    parts = counts()
    cols = [*bad.CATEGORIES, "total"]
    widths = [len(c) + 2 for c in cols]
    first = max(map(len, parts)) + 2

    def row(label: str, c: Counter) -> str:
        values = [c[k] for k in bad.CATEGORIES] + [sum(c.values())]
        return f"{label:{first}}" + "".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True))

    print(f"{'part':{first}}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    total = Counter()
    for part, c in parts.items():
        total.update(c)
        print(row(part, c))
    print(row("all", total))


if __name__ == "__main__":
    main()
