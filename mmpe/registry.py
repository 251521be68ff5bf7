"""One door to every encoding: register by the field's name, build from a name or a config.

    >>> import mmpe
    >>> alibi = mmpe.build("alibi", num_heads=8)
    >>> rope = mmpe.build({"name": "rope", "head_dim": 64})
    >>> [e.name for e in mmpe.available(hook="score")]            # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

HOOKS = ("input", "rotary", "score", "kernel")


@dataclass(frozen=True)
class Entry:
    """Metadata of one registered encoding.

    Attributes:
        name: registry name, the field's own (``"rope"``, ``"alibi"``, ``"t5"`` …).
        cls: the class (or factory) that builds it.
        hook: where position enters attention: ``input``, ``rotary``, ``score`` or ``kernel``.
        coords: coordinate types it supports (``"sequence"``, ``"grid"``, ``"graph"`` …).
        learnable: whether it has trainable parameters.
        paper: citation of the paper whose formula it implements.
        family: a short group name used by ``mmpe compare --family``.
        extrapolates: ``False`` where the method cannot, by construction, encode
            positions beyond those it was built for (a learned table).
    """

    name: str
    cls: Callable[..., Any]
    hook: str
    coords: tuple[str, ...]
    learnable: bool
    paper: str
    family: str = ""
    extrapolates: bool = True
    aliases: tuple[str, ...] = field(default=())


_REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str,
    *,
    hook: str,
    coords: tuple[str, ...] | list[str] = ("sequence",),
    learnable: bool,
    paper: str,
    family: str = "",
    extrapolates: bool = True,
    aliases: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Class decorator: add an encoding to the registry under ``name``.

    Raises:
        ValueError: if ``hook`` is not one of :data:`HOOKS` or ``name`` is taken.
    """
    if hook not in HOOKS:
        raise ValueError(f"register({name!r}): hook must be one of {HOOKS}, got {hook!r}")

    def decorator(cls: Callable[..., Any]) -> Callable[..., Any]:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"register: the name {key!r} is already registered")
        entry = Entry(
            name=name, cls=cls, hook=hook, coords=tuple(coords), learnable=learnable,
            paper=paper, family=family or hook, extrapolates=extrapolates, aliases=tuple(aliases),
        )
        _REGISTRY[name] = entry
        for alias in aliases:
            _ALIASES[alias] = name
        cls.registry_name = name  # type: ignore[attr-defined]
        # One source of truth: the coordinate check at run time reads the registry metadata.
        cls.supported_coords = tuple(coords)  # type: ignore[attr-defined]
        return cls

    return decorator


def _ensure_loaded() -> None:
    # Importing the package registers every built-in encoding (each module decorates its class).
    import mmpe.encodings  # noqa: F401


def get(name: str) -> Entry:
    """The registry entry for ``name`` (or an alias).

    Raises:
        KeyError: for an unknown name; the message lists every known name.
    """
    _ensure_loaded()
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown encoding {name!r}; known encodings: {known}")
    return _REGISTRY[key]


def build(
    name_or_config: str | Mapping[str, Any],
    *,
    context: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Build an encoding from its registry name or a config dict ``{"name": ..., **options}``.

    Keyword ``options`` override those in the config. ``context`` holds model-wide defaults
    (``d_model``, ``num_heads``, ``head_dim``, ``max_len`` …) passed only to encodings whose
    constructor takes them, so one model can build any encoding by name. Options an encoding
    does not take raise ``TypeError`` naming the option and the encoding.
    """
    if isinstance(name_or_config, Mapping):
        config = dict(name_or_config)
        if "name" not in config:
            raise KeyError(f"build: a config dict needs a 'name' key, got keys {sorted(config)}")
        name = config.pop("name")
        options = {**config, **options}
    elif isinstance(name_or_config, str):
        name = name_or_config
    else:
        raise TypeError(
            f"build: name_or_config must be a str or a mapping, got {type(name_or_config).__name__}"
        )
    entry = get(name)
    if context:
        accepted = _accepted_kwargs(entry.cls)
        for key, value in context.items():
            if key not in options and key in accepted:
                options[key] = value
    try:
        return entry.cls(**options)
    except TypeError as err:
        raise TypeError(f"build({entry.name!r}): {err}") from err


def _accepted_kwargs(cls: Callable[..., Any]) -> set[str]:
    """Keyword names the constructor names explicitly (context never goes into ``**kwargs``)."""
    params = inspect.signature(cls).parameters.values()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def available(
    hook: str | None = None, coords: str | None = None, family: str | None = None
) -> list[Entry]:
    """Registered encodings, sorted by name, optionally filtered by hook, coordinate type and family."""
    _ensure_loaded()
    if hook is not None and hook not in HOOKS:
        raise ValueError(f"available: hook must be one of {HOOKS}, got {hook!r}")
    entries = sorted(_REGISTRY.values(), key=lambda e: e.name)
    return [
        e for e in entries
        if (hook is None or e.hook == hook)
        and (coords is None or coords in e.coords)
        and (family is None or e.family == family)
    ]
