"""One door to every encoding: register by the field's name, build from a name or a config.

    >>> import mmpe
    >>> alibi = mmpe.build("alibi", num_heads=8)
    >>> rope = mmpe.build({"name": "rope", "head_dim": 64})
    >>> [e.name for e in mmpe.available(hook="score")]            # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mmpe.context import CONTEXT_KEYS, validate_context_keys
from mmpe.coords.base import coordinate_types
from mmpe.coords.capabilities import Capability, missing, provides
from mmpe.rebuild import record_arguments, reset_in_place
from mmpe.validation import check_options

HOOKS = ("input", "rotary", "score", "kernel")

@dataclass(frozen=True)
class Entry:
    """Metadata of one registered encoding.

    Attributes:
        name: registry name, the field's own (`"rope"`, `"alibi"`, `"t5"` …).
        cls: the class (or factory) that builds it.
        hook: where position enters attention: `input`, `rotary`, `score` or `kernel`.
        needs: the coordinate capabilities it reads ([`mmpe.coords.capabilities`][mmpe.coords.capabilities]); any
            coordinates providing all of them qualify.
        context: the model-wide context keys ([`mmpe.context`][mmpe.context]) it takes.
        learnable: whether it has trainable parameters.
        paper: citation of the paper whose formula it implements.
        family: a short group name used by `mmpe compare --family`.
        extrapolates: `False` where the method cannot, by construction, encode
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
        """`kind` names of the known coordinate classes that provide `needs`."""
        return tuple(kind for kind, cls in coordinate_types().items() if provides(cls, self.needs))

    def supports(self, coords: Any) -> bool:
        """Whether `coords` (an object, a class, or a known `kind` name) meets `needs`."""
        if isinstance(coords, str):
            cls = coordinate_types().get(coords)
            if cls is None:
                raise ValueError(f"unknown coordinate kind {coords!r}."
                                 f"{did_you_mean(coords, coordinate_types())} known kinds: "
                                 f"{', '.join(sorted(coordinate_types()))}")
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
    """Class decorator: add an encoding to the registry under `name`.

    Args:
        needs: coordinate capabilities the encoding reads (`(Metric,)`, `(Positioned,)` …);
            an empty tuple means it runs on any coordinates.
        context: model-wide keys of `mmpe.context.CONTEXT_KEYS` the constructor takes.

    Raises:
        ValueError: `hook` not one of `HOOKS`, `name` taken, an unknown context key,
            or a context key the constructor does not accept.
        TypeError: an entry of `needs` that is not a capability.
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
        origin = _plugin_origin(cls)
        if origin is not None:
            _name_plugin_errors(cls, name, origin)
        # One source of truth: the coordinate check at run time reads the registry metadata.
        cls.needs = needs  # type: ignore[attr-defined]
        return cls

    return decorator


#: entry-point group through which an installed package registers its own encodings: in its
#: ``pyproject.toml``, ``[project.entry-points."mmpe.encodings"] my_pe = "my_pkg.my_pe"``; the
#: module is imported (its ``@register`` decorators run) the first time the registry is read.
ENTRY_POINT_GROUP = "mmpe.encodings"
_PLUGINS_LOADED: list[bool] = []
_LOADING_ENTRY_POINT: list[str] = []  # the entry point being imported, for plugins' error notes

#: Methods of an encoding that mmpe calls (and the constructor): a plugin's errors in any of
#: them carry a note naming the plugin, since the traceback's frames are mostly mmpe's.
PLUGIN_METHODS = ("__init__", "check_coords", "forward", "combine", "score_mod", "bias",
                  "value_term", "softmax_scale", "attend", "term", "make_cache", "prepare")


def _plugin_origin(cls: Any) -> str | None:
    """Where a registered class comes from, or `None` for mmpe's own encodings."""
    module = getattr(cls, "__module__", "") or "?"
    if module == "mmpe" or module.startswith("mmpe."):
        return None
    return _LOADING_ENTRY_POINT[-1] if _LOADING_ENTRY_POINT else module


def _note(err: BaseException, note: str) -> None:
    # Once: a plugin method calling another (combine → forward) must not repeat the note.
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)


class _NamedScoreMod:
    """A plugin's `score_mod` function whose errors name the plugin.

    `__code__` is the wrapped function's, so `mmpe.flex_compile` keys its compile families
    on the plugin's own code (one wrapper class for every plugin would merge their families).
    """

    def __init__(self, mod: Callable[..., Any], note: str) -> None:
        self.mod, self.note = mod, note
        self.__code__ = getattr(mod, "__code__", None)
        self.__name__ = getattr(mod, "__name__", "score_mod")

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():
            # Traced (FlexAttention traces its score_mod even eagerly): Dynamo cannot trace an
            # except clause that reads the exception's notes; its own error quotes the plugin's
            # source line ("from user code: ...").
            return self.mod(*args)
        try:
            return self.mod(*args)
        except Exception as err:
            _note(err, self.note)
            raise


def note_plugin_errors(err: BaseException, encodings: Any) -> None:
    """Add the plugin note of each plugin among `encodings` to `err` (if it has none).

    For errors raised where mmpe cannot tell which encoding failed: FlexAttention traces the
    composed `score_mod` and re-raises a plugin's exception as a Dynamo error outside it, so
    the call site of `flex_attention` catches and calls this with its score encodings.
    """
    notes = getattr(err, "__notes__", ())
    if any(n.startswith("in plugin encoding ") for n in notes):
        return
    for enc in encodings:
        note = getattr(getattr(type(enc), "score_mod", None), "_mmpe_plugin_note", None)
        if note:
            _note(err, note)


def _name_plugin_errors(cls: type, name: str, origin: str) -> None:
    """Wrap `cls`'s `PLUGIN_METHODS` so an exception gets the note `in plugin encoding
    'name' from origin` (the exception itself, its type and message are unchanged)."""
    note = f"in plugin encoding {name!r} from {origin}"
    for attr in PLUGIN_METHODS:
        definer = next((k for k in cls.__mro__ if attr in k.__dict__), object)
        if definer.__module__.split(".")[0] in ("mmpe", "torch", "builtins"):
            continue  # mmpe's own base methods stay as they are (a score_mod closure is wrapped)
        method = getattr(cls, attr)
        if getattr(method, "_mmpe_plugin_note", None) == note:
            continue

        def wrapper(self: Any, *args: Any, __method: Any = method, __attr: str = attr,
                    **kwargs: Any) -> Any:
            try:
                out = __method(self, *args, **kwargs)
            except Exception as err:
                _note(err, note)
                raise
            if __attr == "score_mod" and callable(out):
                return _NamedScoreMod(out, note)  # its errors surface later, inside attention
            return out

        functools.update_wrapper(wrapper, method)
        wrapper._mmpe_plugin_note = note  # type: ignore[attr-defined]
        setattr(cls, attr, wrapper)


def _ensure_loaded() -> None:
    # Importing the package registers every built-in encoding (each module decorates its class).
    import mmpe.encodings  # noqa: F401

    if not _PLUGINS_LOADED:
        load_plugins()  # raises while a plugin is broken: every call says so, none skips it
        _PLUGINS_LOADED.append(True)


def load_plugins() -> list[str]:
    """Import every module registered under the `mmpe.encodings` entry-point group.

    Returns the entry-point names loaded. Every entry point is tried; if any fails to import,
    an `ImportError` then names each failed entry point and its distribution (never silently
    skipped: the registry calls this again, and raises again, until the plugin is fixed or
    uninstalled), after the others have loaded.
    """
    from importlib.metadata import entry_points

    loaded, failed = [], []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep.dist, "name", "?")
        _LOADING_ENTRY_POINT.append(f"{ep.value} (entry point {ep.name!r} of {dist})")
        try:
            ep.load()
        except Exception as err:  # name the plugin: a bare traceback hides which package broke
            failed.append((f"plugin {ep.name!r} = {ep.value!r} (from {dist}): "
                           f"{type(err).__name__}: {err}", err))
            continue
        finally:
            _LOADING_ENTRY_POINT.pop()
        loaded.append(ep.name)
    if failed:
        what = "; ".join(text for text, _ in failed)
        raise ImportError(f"mmpe: {len(failed)} encoding plugin(s) failed to import (the "
                          f"others loaded; uninstall or fix it): {what}") from failed[0][1]
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


def shipped_coordinate_types() -> dict[str, type]:
    """The coordinate classes of `mmpe.coords`, by `kind`, in definition order.

    The coordinate classes of `mmpe.coords`, by `kind`, in definition order: the columns of
    `mmpe list --matrix` and of the docs' matrix page. Users' classes and the recipes' own (the
    multimodal recipe's `strip`, under `mmpe.recipes`) are left out, so the count is the same
    whatever has been imported."""
    return {kind: cls for kind, cls in coordinate_types().items()
            if cls.__module__.startswith("mmpe.coords.")}


def refusals(entry: Entry, coords: Any) -> list[str]:
    """Why `coords` cannot run `entry`, one reason per missing capability.

    Why `coords` (a class or object) cannot run `entry`: one `"Capability (what is
    missing)"` per capability it lacks; `[]` where it runs."""
    return [f"{cap.__name__} ({', '.join(missing(coords, cap))})"
            for cap in entry.needs if missing(coords, cap)]


def did_you_mean(name: str, known: Any, n: int = 5) -> str:
    """A "Did you mean …?" suffix naming close matches of `name`, or "".

    `" Did you mean 'a', 'b' or 'c'?"` with at most `n` close matches of `name` among
    `known` (difflib), or `""` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=n)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    return " Did you mean " + (", ".join(quoted[:-1]) + " or " if len(quoted) > 1 else "") \
        + quoted[-1] + "?"


def encoding_did_you_mean(name: str, n: int = 5) -> str:
    """A "Did you mean …?" suffix over the registered encodings, each named once.

    `did_you_mean` over the registered encodings, each encoding named once: a close alias
    counts for its encoding (`" Did you mean 'p_rope' (alias prope) or 'rope'?"`)."""
    _ensure_loaded()
    close = difflib.get_close_matches(name, [*_REGISTRY, *_ALIASES], n=len(_REGISTRY)
                                      + len(_ALIASES))
    picked: dict[str, list[str]] = {}  # encoding -> its close aliases, in match order
    for match in close:
        key = _ALIASES.get(match, match)
        picked.setdefault(key, [])
        if match != key:
            picked[key].append(match)
    names = list(picked)[:n]
    if not names:
        return ""
    quoted = [repr(k) + (f" (alias {', '.join(picked[k])})" if picked[k] else "")
              for k in names]
    return " Did you mean " + (", ".join(quoted[:-1]) + " or " if len(quoted) > 1 else "") \
        + quoted[-1] + "?"


def get(name: str) -> Entry:
    """The registry entry for `name` (or an alias).

    Raises:
        KeyError: for an unknown name; the message names at most five close matches.
    """
    _ensure_loaded()
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        if not isinstance(name, str):
            raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
        raise KeyError(f"unknown encoding {name!r}.{encoding_did_you_mean(name)} "
                       f"`mmpe list` shows all {len(_REGISTRY)} encodings")
    return _REGISTRY[key]


def build(
    name_or_config: str | Mapping[str, Any],
    *,
    context: Mapping[str, Any] | None = None,
    coords: Any = None,
    **options: Any,
) -> Any:
    """Build an encoding from its registry name or a config dict `{"name": ..., **options}`.

    Keyword `options` override those in the config. `context` holds model-wide values
    (keys of `mmpe.context.CONTEXT_KEYS`: `d_model`, `num_heads`, `head_dim`,
    `max_len`, `original_max_position_embeddings`, `grid_shape` …); each encoding receives
    the keys it declared in `register(..., context=...)`, so one model builds any encoding
    by name.

    `coords`, a coordinates object, builds the encoding for those coordinates: it must be
    one that `available(coords=coords)` lists (else the capability error, now rather than at
    the first forward), and the context keys it answers (`num_axes`, `grid_shape`,
    `prefix_tokens`: `mmpe.context.coords_context`) fill the context where it does not
    say. What `available` promises for an object, `build(name, coords=obj)` delivers
    (`rope_mixed` on a `Sequence` is built for one axis).

    Raises:
        KeyError: an unknown name (with close matches) or a config without `"name"`.
        ValueError: an unknown context key or an invalid context value.
        TypeError: an option the encoding does not take (naming the option and the encoding);
            `coords` the encoding cannot run on (naming the missing capability).
    """
    context = validate_context_keys(context, "build(context=...)")
    if coords is not None:
        from mmpe.context import coords_context

        context = {**coords_context(coords), **context}  # the model's own values win
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
    if coords is not None and not entry.supports(coords):
        from mmpe.coords.capabilities import missing

        gaps = "; ".join(f"{cap.__name__} needs {', '.join(missing(coords, cap))}"
                         for cap in entry.needs if missing(coords, cap))
        raise TypeError(f"build({entry.name!r}, coords=...): {entry.name} needs coordinates "
                        f"providing {[c.__name__ for c in entry.needs]}; "
                        f"{type(coords).__name__} does not: {gaps}")
    for key in entry.context:
        if key in context and key not in options:
            options[key] = context[key]
    _check_build_options(entry, options, coords)
    try:
        return entry.cls(**options)
    except TypeError as err:
        raise TypeError(f"build({entry.name!r}): {err}") from err


#: Context keys a coordinates object answers (`mmpe.context.coords_context`): an encoding
#: whose constructor requires one gets it from `build(name, coords=...)`.
COORDS_KEYS = ("num_axes", "grid_shape", "prefix_tokens")


def _check_build_options(entry: Entry, options: Mapping[str, Any], coords: Any) -> None:
    """The constructor's options checked by name before it runs, so that the error names the
    cause rather than Python's bare "unexpected keyword argument" / "missing positional
    argument".

    Raises:
        TypeError: an option the constructor does not take (with close matches among the
            options it does take); a required option not given, where one that coordinates
            supply comes first, naming the capabilities that supply it.
    """
    try:
        params = list(inspect.signature(entry.cls).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the constructor says
        return
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in named]
    init = inspect.unwrap(getattr(entry.cls, "__init__", None) or object.__init__)
    inherited = isinstance(entry.cls, type) and init in (torch.nn.Module.__init__,
                                                         object.__init__)
    if inherited or not any(p.kind is p.VAR_KEYWORD for p in params):
        for key in options:
            if key not in names:
                raise TypeError(
                    f"build({entry.name!r}): {entry.name} has no option {key!r}."
                    f"{did_you_mean(key, names)} Its options: {', '.join(names) or 'none'} "
                    f"(`mmpe show {entry.name}`)")
    absent = [p.name for p in named if p.default is p.empty and p.name not in options]
    if not absent:
        return
    derived = [k for k in absent if k in COORDS_KEYS]
    parts = []
    if derived:
        needs = [c.__name__ for c in entry.needs]
        kinds = ", ".join(entry.coords) or "none shipped"
        which = " and ".join(derived)
        parts.append(
            f"{entry.name} needs coordinates providing {needs} (shipped: {kinds}), which give "
            f"its {which}: build it with coords=<such coordinates>, or pass "
            + " and ".join(f"{k}=..." for k in derived)
            + (f" ({type(coords).__name__} does not give it)" if coords is not None else ""))
    rest = [k for k in absent if k not in derived]
    if rest:
        what = [f"{k} ({CONTEXT_KEYS[k].meaning})" if k in CONTEXT_KEYS else k for k in rest]
        parts.append(f"{'it also' if derived else entry.name} needs the option"
                     f"{'s' if len(rest) > 1 else ''} {', '.join(what)}: pass "
                     + ", ".join(f"{k}=..." for k in rest)
                     + (" or the model's context={...}" if any(k in entry.context for k in rest)
                        else ""))
    raise TypeError(f"build({entry.name!r}): " + "; ".join(parts))


def _validate_options(cls: Any, name: str) -> None:
    """Check the constructor's arguments by annotation before it runs (mmpe.validation)."""
    if not isinstance(cls, type) or cls.__init__ is object.__init__:
        return
    init = cls.__init__  # its own or inherited: a registered parent's is already wrapped
    if getattr(init, "_mmpe_validated", False):
        return

    signature = inspect.signature(init)
    own = {p for p in signature.parameters if p in ("device", "dtype")}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        where = getattr(type(self), "registry_name", name)
        # device= and dtype= as torch.nn layers take them (where the constructor has none)
        device = None if "device" in own else kwargs.pop("device", None)
        dtype = None if "dtype" in own else kwargs.pop("dtype", None)
        check_options(where, init, (self, *args), kwargs)
        record_arguments(self, args, kwargs)  # reset_parameters rebuilds from them
        with torch.device(device) if device is not None else contextlib.nullcontext():
            init(self, *args, **kwargs)
        if device is not None or dtype is not None:
            _place(self, where, device, dtype)

    __init__._mmpe_validated = True  # type: ignore[attr-defined]
    __init__.__signature__ = _with_device_dtype(signature, own)  # type: ignore[attr-defined]
    cls.__init__ = __init__
    if not _defines_reset(cls):
        cls.reset_parameters = reset_in_place  # type: ignore[attr-defined]


def _defines_reset(cls: type) -> bool:
    """Whether `cls` (or a base below `nn.Module`) has its own `reset_parameters`."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module:
            return False
        if "reset_parameters" in klass.__dict__:
            return True
    return False


def _with_device_dtype(signature: inspect.Signature, own: set[str]) -> inspect.Signature:
    """The constructor's signature with keyword-only `device=None, dtype=None` appended."""
    params = list(signature.parameters.values())
    var_kw = [p for p in params if p.kind is p.VAR_KEYWORD]
    params = [p for p in params if p.kind is not p.VAR_KEYWORD]
    extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
             for k in ("device", "dtype") if k not in own]
    return signature.replace(parameters=[*params, *extra, *var_kw])


def _place(module: Any, where: str, device: Any, dtype: Any) -> None:
    """`module` moved to `device` and its floating tensors cast to `dtype` (tables an encoding
    keeps in float32 stay so: `KeepDtype`).

    Raises:
        TypeError: `dtype` not a floating-point torch dtype.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{where}: dtype must be a floating-point torch.dtype, got {dtype!r}")
    module.to(device=device, dtype=dtype)


def _accepted_kwargs(cls: Callable[..., Any]) -> set[str]:
    """Keyword names the constructor names explicitly (context never goes into `**kwargs`)."""
    params = inspect.signature(cls).parameters.values()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def available(
    hook: str | None = None, coords: Any = None, family: str | None = None
) -> list[Entry]:
    """Registered encodings, sorted by name, optionally filtered by hook, coordinates and family.

    `coords` may be a coordinate object, a coordinate class, or the `kind` name of a known
    coordinate class (`"grid"`); an encoding is listed when the coordinates provide every
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
