"""The table of hand-written fast forms.

The table of hand-written fast forms: exact encoding class -> {form name: function} (see
[mmpe.attention.fast_forms][])."""

from __future__ import annotations

from typing import Any

from mmpe.encodings.base import ScoreEncoding

#: the form names a class may register
FORMS = ("dense", "rows", "tiles", "compact", "pair_term", "offset_on_grids")

#: exact encoding class -> {form name: function}
FAST_FORMS: dict[type, dict[str, Any]] = {}


def register(cls: type, **forms: Any) -> None:
    """Register hand-written fast forms of the exact class `cls`.

    Register hand-written fast forms of the exact class `cls` (see the table of
    [mmpe.attention.fast_forms][]).

    Raises:
        TypeError: `cls` is not a `ScoreEncoding` subclass.
        ValueError: an unknown form name.
    """
    if not (isinstance(cls, type) and issubclass(cls, ScoreEncoding)):
        raise TypeError(f"fast_forms.register: cls must be a ScoreEncoding subclass, got {cls!r}")
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise ValueError(f"fast_forms.register: unknown forms {unknown}; known: {list(FORMS)}")
    FAST_FORMS.setdefault(cls, {}).update(forms)


def get(enc: ScoreEncoding, form: str) -> Any:
    """The fast form `form` of `enc`'s exact class, or None."""
    return FAST_FORMS.get(type(enc), {}).get(form)
