"""`mmpe.build` errors name the cause first, over every registered encoding (issue 59, item 3).

* An option the constructor does not take names the encoding, the option, and a "did you
  mean" among the constructor's own parameters (a typo of every option of every encoding).
* A required option missing is named with what supplies it; one that coordinates supply
  (`grid_shape` of a grid) names the capabilities first, never Python's bare "missing
  positional argument".
* Coordinates an encoding cannot run on are refused naming the missing capability, before any
  option is looked at (every encoding × every shipped coordinate type it refuses).
* A "did you mean" over encoding names lists each encoding once, its close aliases in brackets.
"""

from __future__ import annotations

import inspect
import re

import pytest
from helpers import SAMPLE_COORDS

import mmpe
from mmpe import registry

ENTRIES = registry.available()


def _options(entry: registry.Entry) -> list[inspect.Parameter]:
    params = inspect.signature(entry.cls).parameters.values()
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _typo(name: str) -> str:
    """A one-letter slip: the last letter dropped (or doubled, for a short name)."""
    return name[:-1] if len(name) > 4 else name + name[-1]


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_an_option_typo_names_the_encoding_the_option_and_the_close_one(name: str) -> None:
    entry = registry.get(name)
    names = [p.name for p in _options(entry)]
    for option in names or ["base"]:
        typo = _typo(option)
        if typo in names:
            continue
        with pytest.raises(TypeError) as err:
            mmpe.build(name, **{typo: 1})
        message = str(err.value)
        assert message.startswith(f"build({name!r}): {name} has no option {typo!r}."), message
        if names:
            assert f"Did you mean {option!r}" in message or f"{option!r}?" in message \
                or f"{option!r}," in message or f"{option!r} or" in message, message
        assert "unexpected keyword" not in message, message


def test_the_alibi_typo_of_the_issue() -> None:
    with pytest.raises(TypeError, match=r"alibi has no option 'num_head'. Did you mean "
                                        r"'num_heads'\?"):
        mmpe.build("alibi", num_head=8)


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_missing_options_are_named_never_as_python_positional_arguments(name: str) -> None:
    entry = registry.get(name)
    required = [p.name for p in _options(entry) if p.default is p.empty]
    if not required:
        mmpe.build(name)
        return
    with pytest.raises(TypeError) as err:
        mmpe.build(name)
    message = str(err.value)
    assert "positional argument" not in message, message
    for option in required:
        assert f"{option}=..." in message, message
    derived = [k for k in required if k in registry.COORDS_KEYS]
    if derived:
        # the coordinates' capabilities come first: they are what supplies the option
        head = f"build({name!r}): {name} needs coordinates providing "
        assert message.startswith(head + str([c.__name__ for c in entry.needs])), message
        assert "coords=" in message, message


def test_derived_options_of_the_issue() -> None:
    for name in ("swin", "learned_grid"):
        with pytest.raises(TypeError, match=rf"{name} needs coordinates providing \['GridLayout'\]"):
            mmpe.build(name)
    assert {e.name for e in ENTRIES if any(
        p.name in registry.COORDS_KEYS and p.default is p.empty for p in _options(e))} >= {
            "swin", "learned_grid", "swinv2_cpb", "factorized"}


def _refused() -> list:
    out = []
    for cname, make in SAMPLE_COORDS.items():
        coords = make()
        out += [pytest.param(e.name, cname, id=f"{e.name}-{cname}")
                for e in ENTRIES if not e.supports(coords)]
    return out


@pytest.mark.parametrize(("name", "cname"), _refused())
def test_refused_coordinates_are_named_before_any_option(name: str, cname: str) -> None:
    """No option at all given: the capability is still the error (it is the cause)."""
    entry = registry.get(name)
    coords = SAMPLE_COORDS[cname]()
    with pytest.raises(TypeError) as err:
        mmpe.build(name, coords=coords)
    message = str(err.value)
    assert message.startswith(f"build({name!r}, coords=...): {name} needs coordinates "
                              f"providing {[c.__name__ for c in entry.needs]}; "
                              f"{type(coords).__name__} does not"), message
    assert "option" not in message, message


def _suggested(message: str) -> list[str]:
    """The names a "Did you mean …?" offers, bracketed aliases left out."""
    offer = message.split("Did you mean ", 1)[1].split("?", 1)[0]
    return re.findall(r"'([^']+)'", re.sub(r"\([^)]*\)", "", offer))


@pytest.mark.parametrize("alias", sorted(registry._ALIASES))
def test_did_you_mean_names_each_encoding_once_with_its_aliases(alias: str) -> None:
    typo = _typo(alias)
    if typo in registry._ALIASES or typo in registry._REGISTRY:
        pytest.skip(f"{typo!r} is itself a name")
    with pytest.raises(KeyError) as err:
        registry.get(typo)
    message = err.value.args[0]
    names = _suggested(message)
    assert len(names) == len(set(names)), message
    assert set(names) <= set(registry._REGISTRY), message  # aliases only in brackets
    assert registry._ALIASES[alias] in names, message


def test_prope_and_p_rope_are_one_suggestion() -> None:
    with pytest.raises(KeyError) as err:
        registry.get("prop")
    assert "'p_rope' (alias prope)" in err.value.args[0]
    assert _suggested(err.value.args[0]).count("p_rope") == 1
