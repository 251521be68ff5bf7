"""The generated reasoning tasks of the length-generalisation recipe: answers are right,
examples are deterministic per seed, lengths are what they say."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mmpe.recipes import algorithmic as alg


def rng(seed=0):
    return np.random.default_rng(seed)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_answers(n, seed):
    x, y = alg.sample("copy", n, rng(seed))
    assert x == y and len(x) == n
    x, y = alg.sample("reverse", n, rng(seed))
    assert y == x[::-1]
    x, y = alg.sample("sort", n, rng(seed))
    assert y == sorted(x)
    x, y = alg.sample("parity", n, rng(seed))
    assert set(x) <= {"0", "1"} and y == [str(x.count("1") % 2)]
    x, y = alg.sample("addition", n, rng(seed))
    plus = x.index("+")
    a, b = int("".join(x[:plus][::-1])), int("".join(x[plus + 1:][::-1]))
    assert plus == n and len(x) == 2 * n + 1
    assert int("".join(y[::-1])) == a + b and len(str(a)) == n


def test_passkey_plants_the_key_once():
    for seed in range(20):
        x, y = alg.sample("passkey", 30, rng(seed))
        at = x.index("#")
        assert x[at + 1:at + 6] == y and x.count("#") == 1 and x[-1] == "?"
        assert len(x) == 30 + 6 + 1


def test_scan_is_the_papers_grammar():
    """Lake & Baroni 2018: 20,910 commands; examples from the paper's Fig. 1 / Table 1."""
    commands = alg.scan_commands()
    assert sum(len(v) for v in commands.values()) == 20_910
    meaning = {" ".join(w): " ".join(a) for pool in commands.values() for w, a in pool}
    assert meaning["jump"] == "I_JUMP"
    assert meaning["jump left"] == "I_TURN_LEFT I_JUMP"
    assert meaning["jump around right"] == " ".join(["I_TURN_RIGHT I_JUMP"] * 4)
    assert meaning["turn left twice"] == "I_TURN_LEFT I_TURN_LEFT"
    assert meaning["jump thrice"] == "I_JUMP I_JUMP I_JUMP"
    assert meaning["jump opposite left after walk around left"] == (
        " ".join(["I_TURN_LEFT I_WALK"] * 4) + " I_TURN_LEFT I_TURN_LEFT I_JUMP")
    assert max(commands) == 48 and min(commands) == 1


def test_deterministic_per_seed_and_different_across_seeds():
    for task in alg.TASKS:
        n = 6
        assert alg.sample(task, n, rng(3)) == alg.sample(task, n, rng(3))
        draws = {str(alg.sample(task, n, rng(s))) for s in range(10)}
        assert len(draws) > 1


def test_vocabulary_covers_every_token():
    vocab = set(alg.vocabulary())
    assert len(vocab) == len(alg.vocabulary())
    for task in alg.TASKS:
        tokens, sep = alg.layout(task, alg.sample(task, 5, rng()))
        assert set(tokens) <= vocab and tokens[sep] == "="


@pytest.mark.parametrize("call, match", [
    (lambda: alg.sample("multiply", 3, rng()), "unknown task 'multiply'"),
    (lambda: alg.sample("copy", 0, rng()), "instance length"),
    (lambda: alg.sample("scan", 23, rng()), "no command means 23 actions"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
