"""One door to every encoding: register by the field's name, build from a name or a config.

    >>> import mmpe
    >>> alibi = mmpe.build("alibi", num_heads=8)
    >>> rope = mmpe.build({"name": "rope", "head_dim": 64})
    >>> [e.name for e in mmpe.available(hook="score")]            # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmpe.context import CONTEXT_KEYS, check_context
from mmpe.coords.base import coordinate_types
from mmpe.coords.capabilities import Capability, provides
from mmpe.validation import check_options

HOOKS = ("input", "rotary", "score", "kernel")


@dataclass(frozen=True)
class Entry:
    """Metadata of one registered encoding.

    Attributes:
        name: registry name, the field's own (``"rope"``, ``"alibi"``, ``"t5"`` …).
        cls: the class (or factory) that builds it.
        hook: where position enters attention: ``input``, ``rotary``, ``score`` or ``kernel``.
        needs: the coordinate capabilities it reads (:mod:`mmpe.coords.capabilities`); any
            coordinates providing all of them qualify.
        context: the model-wide context keys (:mod:`mmpe.context`) it takes.
        learnable: whether it has trainable parameters.
        paper: citation of the paper whose formula it implements.
        family: a short group name used by ``mmpe compare --family``.
        extrapolates: ``False`` where the method cannot, by construction, encode
            positions beyond those it was built for (a learned table).
    """

    name: str
    cls: Callable[..., Any]
    hook: str
    needs: tuple[type[Capability], ...]
    learnable: bool
    paper: str
    family: str = ""
    extrapolates: bool = True
    aliases: tuple[str, ...] = field(default=())
    context: tuple[str, ...] = field(default=())

    @property
    def coords(self) -> tuple[str, ...]:
        """``kind`` names of the known coordinate classes that provide :attr:`needs`."""
        return tuple(kind for kind, cls in coordinate_types().items() if provides(cls, self.needs))

    def supports(self, coords: Any) -> bool:
        """Whether ``coords`` (an object, a class, or a known ``kind`` name) meets :attr:`needs`."""
        if isinstance(coords, str):
            cls = coordinate_types().get(coords)
            if cls is None:
                raise ValueError(f"unknown coordinate kind {coords!r}; known kinds: "
                                 f"{sorted(coordinate_types())}")
            coords = cls
        return provides(coords, self.needs)


_REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str,
    *,
    hook: str,
    needs: tuple[type[Capability], ...] | list[type[Capability]] = (),
    context: tuple[str, ...] | list[str] = (),
    learnable: bool,
    paper: str,
    family: str = "",
    extrapolates: bool = True,
    aliases: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Class decorator: add an encoding to the registry under ``name``.

    Args:
        needs: coordinate capabilities the encoding reads (``(Metric,)``, ``(Positioned,)`` …);
            an empty tuple means it runs on any coordinates.
        context: model-wide keys of :data:`mmpe.context.CONTEXT_KEYS` the constructor takes.

    Raises:
        ValueError: ``hook`` not one of :data:`HOOKS`, ``name`` taken, an unknown context key,
            or a context key the constructor does not accept.
        TypeError: an entry of ``needs`` that is not a capability.
    """
    if hook not in HOOKS:
        raise ValueError(f"register({name!r}): hook must be one of {HOOKS}, got {hook!r}")
    needs = tuple(needs)
    for cap in needs:
        if not (isinstance(cap, type) and issubclass(type(cap), type(Capability))):
            raise TypeError(f"register({name!r}): needs must hold capabilities from "
                            f"mmpe.coords.capabilities, got {cap!r}")
    for key in context:
        if key not in CONTEXT_KEYS:
            raise ValueError(f"register({name!r}): unknown context key {key!r}; "
                             f"known: {sorted(CONTEXT_KEYS)}")

    def decorator(cls: Callable[..., Any]) -> Callable[..., Any]:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"register: the name {key!r} is already registered")
        absent = [k for k in context if k not in _accepted_kwargs(cls)]
        if absent:
            raise ValueError(f"register({name!r}): context keys {absent} are not constructor "
                             "arguments")
        entry = Entry(
            name=name, cls=cls, hook=hook, needs=needs, learnable=learnable, paper=paper,
            family=family or hook, extrapolates=extrapolates, aliases=tuple(aliases),
            context=tuple(context),
        )
        _REGISTRY[name] = entry
        for alias in aliases:
            _ALIASES[alias] = name
        cls.registry_name = name  # type: ignore[attr-defined]
        _validate_options(cls, name)
        # One source of truth: the coordinate check at run time reads the registry metadata.
        cls.needs = needs  # type: ignore[attr-defined]
        return cls

    return decorator


#: entry-point group through which an installed package registers its own encodings: in its
#: ``pyproject.toml``, ``[project.entry-points."mmpe.encodings"] my_pe = "my_pkg.my_pe"``; the
#: module is imported (its ``@register`` decorators run) the first time the registry is read.
ENTRY_POINT_GROUP = "mmpe.encodings"
_PLUGINS_LOADED: list[bool] = []


def _ensure_loaded() -> None:
    # Importing the package registers every built-in encoding (each module decorates its class).
    import mmpe.encodings  # noqa: F401

    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED.append(True)
        load_plugins()


def load_plugins() -> list[str]:
    """Import every module registered under the ``mmpe.encodings`` entry-point group.

    Returns the entry-point names loaded. A plugin that fails to import raises an
    ``ImportError`` naming the entry point and its distribution (never silently skipped).
    """
    from importlib.metadata import entry_points

    loaded = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # name the plugin: a bare traceback hides which package broke
            dist = getattr(ep.dist, "name", "?")
            raise ImportError(f"mmpe: the encoding plugin {ep.name!r} = {ep.value!r} (from "
                              f"{dist}) failed to import: {err}") from err
        loaded.append(ep.name)
    return loaded


def describe(name: str) -> str:
    """A readable card of one encoding: hook, paper, capabilities, context keys, options."""
    entry = get(name)
    params = inspect.signature(entry.cls).parameters.values()
    options = [f"  {p.name}" + ("" if p.default is p.empty else f" = {p.default!r}")
               + ("  (from the model's context)" if p.name in entry.context else "")
               for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    doc = inspect.getdoc(entry.cls) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ")
    needs = ", ".join(f"{c.__name__} ({', '.join(c.members)})" for c in entry.needs) or "none"
    lines = [
        f"{entry.name}: {summary}",
        f"hook:          {entry.hook}  ({'learnable' if entry.learnable else 'fixed'}"
        f"{'' if entry.extrapolates else ', does not extrapolate'}; family {entry.family})",
        f"paper:         {entry.paper}",
        f"needs:         {needs}",
        f"coordinates:   {', '.join(entry.coords) or '(none shipped)'}",
        f"context keys:  {', '.join(entry.context) or 'none'}",
        f"aliases:       {', '.join(entry.aliases) or 'none'}",
        f"class:         {entry.cls.__module__}.{entry.cls.__qualname__}",
        "options:",
        *options,
    ]
    return "\n".join(lines)


def get(name: str) -> Entry:
    """The registry entry for ``name`` (or an alias).

    Raises:
        KeyError: for an unknown name; the message lists every known name.
    """
    _ensure_loaded()
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        if not isinstance(name, str):
            raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
        known = ", ".join(sorted(_REGISTRY))
        close = difflib.get_close_matches(name, [*_REGISTRY, *_ALIASES], n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"unknown encoding {name!r}.{hint} known encodings: {known}")
    return _REGISTRY[key]


def build(
    name_or_config: str | Mapping[str, Any],
    *,
    context: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Build an encoding from its registry name or a config dict ``{"name": ..., **options}``.

    Keyword ``options`` override those in the config. ``context`` holds model-wide values
    (keys of :data:`mmpe.context.CONTEXT_KEYS`: ``d_model``, ``num_heads``, ``head_dim``,
    ``max_len``, ``original_max_position_embeddings``, ``grid_shape`` …); each encoding receives
    the keys it declared in ``register(..., context=...)``, so one model builds any encoding
    by name.

    Raises:
        KeyError: an unknown name (with close matches) or a config without ``"name"``.
        ValueError: an unknown context key or an invalid context value.
        TypeError: an option the encoding does not take (naming the option and the encoding).
    """
    context = check_context(context, "build(context=...)")
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
    for key in entry.context:
        if key in context and key not in options:
            options[key] = context[key]
    try:
        return entry.cls(**options)
    except TypeError as err:
        raise TypeError(f"build({entry.name!r}): {err}") from err


def _validate_options(cls: Any, name: str) -> None:
    """Check the constructor's arguments by annotation before it runs (mmpe.validation)."""
    if not isinstance(cls, type) or cls.__init__ is object.__init__:
        return
    init = cls.__init__  # its own or inherited: a registered parent's is already wrapped
    if getattr(init, "_mmpe_validated", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        check_options(getattr(type(self), "registry_name", name), init, (self, *args), kwargs)
        init(self, *args, **kwargs)

    __init__._mmpe_validated = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _accepted_kwargs(cls: Callable[..., Any]) -> set[str]:
    """Keyword names the constructor names explicitly (context never goes into ``**kwargs``)."""
    params = inspect.signature(cls).parameters.values()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def available(
    hook: str | None = None, coords: Any = None, family: str | None = None
) -> list[Entry]:
    """Registered encodings, sorted by name, optionally filtered by hook, coordinates and family.

    ``coords`` may be a coordinate object, a coordinate class, or the ``kind`` name of a known
    coordinate class (``"grid"``); an encoding is listed when the coordinates provide every
    capability it needs.
    """
    _ensure_loaded()
    if hook is not None and hook not in HOOKS:
        raise ValueError(f"available: hook must be one of {HOOKS}, got {hook!r}")
    entries = sorted(_REGISTRY.values(), key=lambda e: e.name)
    return [
        e for e in entries
        if (hook is None or e.hook == hook)
        and (coords is None or e.supports(coords))
        and (family is None or e.family == family)
    ]
