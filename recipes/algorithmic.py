"""Synthetic reasoning tasks for length generalisation, generated on the machine.

Every task maps an *instance length* `n` and a `numpy` generator to one example, a pair of
token lists `(input, output)`; the same generator state gives the same example. The tasks
follow the papers' descriptions:

* `copy`, `reverse`, `sort`: a string of `n` random digits, returned as is, reversed,
  or sorted (Kazemnejad et al. 2023, Appendix E; Ruoss et al. 2023, Table A.1).
* `addition`: two `n`-digit numbers and their sum, every number written least-significant
  digit first (Kazemnejad et al. 2023; McLeish et al. 2024 write numbers the same way).
* `parity`: `n` random bits, answer their parity (Kazemnejad et al. 2023; Ruoss et al.).
* `scan`: SCAN commands (Lake & Baroni 2018, "Generalization without Systematicity", ICML,
  Section 2): the full phrase-structure grammar of the paper, all 20,910 commands enumerated
  with their action sequences; `n` is the number of actions (the paper's length split).
* `passkey`: `n` random filler letters with a five-digit key planted at a random place
  after a marker, asked for at the end (Mohtashami & Jaggi 2023, "Landmark Attention",
  Section 4.2, with letters instead of sentences).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np

DIGITS = [str(d) for d in range(10)]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
SCAN_WORDS = ["walk", "look", "run", "jump", "turn", "left", "right", "opposite", "around",
              "twice", "thrice", "and", "after"]
SCAN_ACTIONS = ["I_WALK", "I_LOOK", "I_RUN", "I_JUMP", "I_TURN_LEFT", "I_TURN_RIGHT"]
#: Separators and markers: the answer starts after `=` and ends with `<eos>`.
SPECIALS = ["<pad>", "<eos>", "=", "+", "?", "#"]

Example = tuple[list[str], list[str]]


def _digits(rng: np.random.Generator, n: int, low: int = 0) -> list[str]:
    return [DIGITS[d] for d in rng.integers(low, 10, n)]


def copy_task(n: int, rng: np.random.Generator) -> Example:
    x = _digits(rng, n)
    return x, list(x)


def reverse_task(n: int, rng: np.random.Generator) -> Example:
    x = _digits(rng, n)
    return x, x[::-1]


def sort_task(n: int, rng: np.random.Generator) -> Example:
    x = _digits(rng, n)
    return x, sorted(x)


def addition_task(n: int, rng: np.random.Generator) -> Example:
    """Two numbers of exactly `n` digits (no leading zero), least-significant digit first."""
    a, b = (int("".join(_digits(rng, 1, low=1 if n > 1 else 0) + _digits(rng, n - 1))) for _ in range(2))
    return list(str(a)[::-1]) + ["+"] + list(str(b)[::-1]), list(str(a + b)[::-1])


def parity_task(n: int, rng: np.random.Generator) -> Example:
    bits = rng.integers(0, 2, n)
    return [DIGITS[b] for b in bits], [DIGITS[int(bits.sum()) % 2]]


def passkey_task(n: int, rng: np.random.Generator) -> Example:
    """`n` filler letters, `# d d d d d` planted before filler letter `p` (uniform in
    `0 … n`), then `?`; the answer is the five digits."""
    filler = [LETTERS[i] for i in rng.integers(0, len(LETTERS), n)]
    key = _digits(rng, 5)
    place = int(rng.integers(0, n + 1))
    return filler[:place] + ["#", *key] + filler[place:] + ["?"], key


# --- SCAN ------------------------------------------------------------------------------------
_PRIMITIVE = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}
_TURN = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}


def _scan_verbs() -> list[tuple[list[str], list[str]]]:
    """Every V of the grammar with its meaning: U, D, `x opposite dir`, `x around dir`."""
    out = [([u], [a]) for u, a in _PRIMITIVE.items()]
    for d, turn in _TURN.items():
        out.append((["turn", d], [turn]))
        out.append((["turn", "opposite", d], [turn, turn]))
        out.append((["turn", "around", d], [turn] * 4))
        for u, a in _PRIMITIVE.items():
            out.append(([u, d], [turn, a]))
            out.append(([u, "opposite", d], [turn, turn, a]))
            out.append(([u, "around", d], [turn, a] * 4))
    return out


@functools.cache
def scan_commands() -> dict[int, list[Example]]:
    """All SCAN commands grouped by the number of actions they mean (Lake & Baroni 2018)."""
    phrases = []
    for words, acts in _scan_verbs():
        phrases += [(words, acts), (words + ["twice"], acts * 2), (words + ["thrice"], acts * 3)]
    commands = list(phrases)
    for (w1, a1), (w2, a2) in itertools.product(phrases, repeat=2):
        commands.append((w1 + ["and"] + w2, a1 + a2))
        commands.append((w1 + ["after"] + w2, a2 + a1))
    by_length: dict[int, list[Example]] = {}
    for words, acts in commands:
        by_length.setdefault(len(acts), []).append((words, acts))
    return by_length


def scan_task(n: int, rng: np.random.Generator) -> Example:
    """A uniformly drawn SCAN command meaning exactly `n` actions.

    Raises:
        ValueError: no SCAN command means `n` actions (see `scan_lengths`).
    """
    pool = scan_commands().get(n)
    if not pool:
        raise ValueError(f"scan: no command means {n} actions; lengths: {scan_lengths()}")
    words, acts = pool[int(rng.integers(0, len(pool)))]
    return list(words), list(acts)


def scan_lengths() -> list[int]:
    return sorted(scan_commands())


#: Task name -> generator. `lengths` of a task: the instance lengths it can produce.
TASKS: dict[str, Callable[[int, np.random.Generator], Example]] = {
    "copy": copy_task, "reverse": reverse_task, "sort": sort_task, "addition": addition_task,
    "parity": parity_task, "scan": scan_task, "passkey": passkey_task,
}


def vocabulary() -> list[str]:
    """Every token of every task, `<pad>` first (id 0), then one task marker per task."""
    return SPECIALS + [f"[{t}]" for t in TASKS] + DIGITS + LETTERS + SCAN_WORDS + SCAN_ACTIONS


def task_lengths(task: str, low: int, high: int) -> list[int]:
    """Instance lengths in `[low, high]` the task can produce (every one, except SCAN's gaps)."""
    check_task(task)
    if task == "scan":
        return [n for n in scan_lengths() if low <= n <= high]
    return list(range(max(low, 1), high + 1))


def check_task(task: str) -> None:
    """Raises ValueError naming the known tasks for an unknown one."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")


def has_digits(task: str) -> bool:
    """Whether the task's inputs contain numbers (what Abacus embeddings read)."""
    check_task(task)
    return task != "scan"


def sample(task: str, n: int, rng: np.random.Generator) -> Example:
    """One example of `task` with instance length `n`."""
    check_task(task)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{task}: instance length must be an int >= 1, got {n!r}")
    return TASKS[task](int(n), rng)


def layout(task: str, example: Example) -> tuple[list[str], int]:
    """The token sequence `[task] input = output <eos>` and the index of `=` (the model is
    scored on every token after it)."""
    inp, out = example
    tokens = [f"[{task}]", *inp, "=", *out, "<eos>"]
    return tokens, len(inp) + 1
