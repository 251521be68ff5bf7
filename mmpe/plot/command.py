"""`mmpe plot NAME`: the command's options, the figures it picks, the coordinates it draws on.

[`plot_command`][mmpe.plot.command.plot_command] is the command without its argument parser (`mmpe.cli` parses the
arguments and calls it): it reads the `--option key=value` strings ([`parse_option`][mmpe.plot.command.parse_option]),
picks the figure kinds (`KINDS`) from the encoding's hook and the capabilities it needs,
builds the coordinates and the encodings (from a checkpoint with `--checkpoint`), and writes
a PNG per kind with the functions of [`mmpe.plot`][mmpe.plot].
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

from mmpe import registry
from mmpe.checkpoints import load_encoding
from mmpe.context import CONTEXT_KEYS, validate_context_keys
from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphLayout, GridLayout, VirtualNode
from mmpe.coords.grid import Grid
from mmpe.coords.sequence import Sequence
from mmpe.coords.sphere import Sphere
from mmpe.molecules import DEFAULT_SMILES, molecule_graph
from mmpe.plot._common import article
from mmpe.plot.figures import (
    plot_bias_row,
    plot_bias_vs_distance,
    plot_input_matrix,
    plot_rotary_decay,
    plot_similarity,
)
from mmpe.plot.graph import plot_graph_eigenvectors
from mmpe.plot.sphere import plot_sphere

__all__ = ["KINDS", "parse_option", "plot_command"]

#: figure kinds of ``mmpe plot --kind``.
KINDS = ("auto", "matrix", "similarity", "bias", "row", "decay", "sphere", "graph")


def parse_option(text: str) -> tuple[str, Any]:
    """Parse `"key=value"` into `(key, value)`.

    `"key=value"` → `(key, value)`; the value read as a Python literal (`4`, `0.5`,
    `(14, 14)`, `'x'`), `true`/`false`/`none`/`null`, else kept as a string.

    Raises:
        ValueError: no `=` or an empty key.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--option must be key=value, got {text!r}")
    raw = raw.strip()
    words = {"true": True, "false": False, "none": None, "null": None}
    if raw.lower() in words:
        return key, words[raw.lower()]
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def _coords_for(entry: registry.Entry, *, length: int, grid: Seq[int] | None,
                smiles: str) -> Coordinates:
    """The coordinates `mmpe plot` draws an encoding on, from what it needs."""
    if grid is not None:
        if not entry.supports("grid"):
            raise ValueError(f"mmpe plot: {entry.name} does not run on a grid (--grid); it "
                             f"needs {[c.__name__ for c in entry.needs]}")
        return Grid(tuple(grid))
    if entry.supports("sequence"):
        return Sequence(length, causal=entry.hook == "score")
    if entry.supports("grid"):
        return Grid((14, 14))
    if entry.supports("sphere"):
        return Sphere.grid(90, 180)
    if entry.supports("graph"):
        return molecule_graph(smiles, virtual_token=VirtualNode in entry.needs)
    raise ValueError(f"mmpe plot: no figure for {entry.name}: it needs "
                     f"{[c.__name__ for c in entry.needs]}, which none of sequence, grid, "
                     "sphere or graph coordinates provide")


def _auto_kinds(entry: registry.Entry, coords: Coordinates, checkpoint: Any) -> list[str]:
    if entry.hook == "input":
        if isinstance(coords, Sphere):
            return ["sphere"]
        if isinstance(coords, GraphLayout):
            return ["graph", "matrix"]
        if isinstance(coords, GridLayout) and len(coords.shape) == 2:
            return ["similarity"]
        return ["matrix", "similarity"]
    if entry.hook == "rotary":
        return ["decay"]
    if entry.hook == "score":
        if checkpoint is not None:
            return ["row", "bias"]
        if isinstance(coords, GridLayout) and len(coords.shape) == 2:
            return ["bias", "row"]
        return ["bias"]
    raise ValueError(f"mmpe plot: {entry.name} is a kernel encoding (it replaces the softmax); "
                     "it has no positional term to plot")


_HOOK_OF_KIND = {"matrix": "input", "similarity": "input", "sphere": "input", "graph": "input",
                 "bias": "score", "row": "score", "decay": "rotary"}


def plot_command(name: str, kind: str = "auto", *, length: int | None = None,
                 grid: Seq[int] | None = None, d_model: int | None = None,
                 heads: int | None = None, head_dim: int | None = None,
                 options: Seq[str] | Mapping[str, Any] = (),
                 checkpoint: str | os.PathLike | None = None, prefix: str | None = None,
                 query: int | None = None, smiles: str = DEFAULT_SMILES,
                 features: bool = False, out: str | os.PathLike = "plots",
                 stem: str | None = None) -> list[Path]:
    """`mmpe plot NAME`: build the encoding, draw the figures, return the PNG paths.

    `kind="auto"` picks from the hook and the capabilities the encoding needs: input on a
    sequence → matrix + similarity; input on a grid (`--grid` or a grid-only encoding) →
    the ViT similarity maps; on the sphere → a world map; on graphs → a molecule coloured by its
    Laplacian eigenvectors (+ matrix); score → bias against distance (from a checkpoint: the
    bias row at one query too); rotary → the decay curve. `name` may list several rotary
    encodings, comma-separated, to overlay; a single scaled RoPE is drawn over plain `rope`.

    `options` (`key=value` strings or a mapping) are encoding options; keys of
    `mmpe.context.CONTEXT_KEYS` (`original_max_position_embeddings`, `grid_shape` …)
    go into the context instead, so every encoding of an overlay gets those it takes. Defaults:
    `d_model` 64, 8 heads, `head_dim = d_model // heads` (rotary: 128), `max_len` 1024.
    With `checkpoint` the encoding NAME is read from it ([`load_encoding`][mmpe.checkpoints.load_encoding]): its saved
    hyperparameters replace those defaults, values given here replace both. Files are
    `OUT/<stem>_<kind>.png`, the stem by default the names joined by `+`.

    Raises:
        KeyError: an unknown encoding name (with close matches).
        ValueError: a kind the encoding cannot draw (naming both), a kernel encoding, bad
            options, coordinates it does not run on.
    """
    if kind not in KINDS:
        raise ValueError(f"mmpe plot: kind must be one of {KINDS}, got {kind!r}")
    names = [n.strip() for n in name.split(",") if n.strip()]
    if not names:
        raise ValueError("mmpe plot: give an encoding name")
    entries = [registry.get(n) for n in names]
    entry = entries[0]
    if len(entries) > 1 and any(e.hook != "rotary" for e in entries):
        raise ValueError("mmpe plot: several names (a,b,...) overlay rotary encodings only; got "
                         + ", ".join(f"{e.name} ({e.hook})" for e in entries))
    if kind != "auto" and entry.hook != _HOOK_OF_KIND[kind]:
        raise ValueError(f"mmpe plot: --kind {kind} draws {_HOOK_OF_KIND[kind]} encodings; "
                         f"{entry.name} is {article(entry.hook)} encoding")
    if entry.hook == "kernel":
        _auto_kinds(entry, Sequence(1), None)  # raises: nothing to plot
    stem = stem or "+".join(e.name for e in entries)
    if "/" in stem or os.sep in stem:
        raise ValueError(f"mmpe plot: --stem is a file name stem, not a path; got {stem!r}")
    opts = dict(options) if isinstance(options, Mapping) else dict(map(parse_option, options))
    given = {k: opts.pop(k) for k in list(opts) if k in CONTEXT_KEYS}
    for key, value in (("d_model", d_model), ("num_heads", heads), ("head_dim", head_dim),
                       ("grid_shape", None if grid is None else tuple(grid))):
        if value is not None:
            given.setdefault(key, value)
    given = validate_context_keys(given, "mmpe plot")
    defaults: dict[str, Any] = {"d_model": 64, "num_heads": 8, "max_len": max(1024, length or 0)}
    coords: Coordinates | None = None
    if entry.hook == "rotary":
        kinds = ["decay"]
        defaults["head_dim"] = 128
    else:
        defaults["head_dim"] = max(1, given.get("d_model", 64) // given.get("num_heads", 8))
        row = kind == "row" or (checkpoint is not None and kind == "auto")
        default_len = (129 if query is None else query + 1) if row else 128
        coords = _coords_for(entry, length=length or default_len, grid=grid, smiles=smiles)
        kinds = _auto_kinds(entry, coords, checkpoint) if kind == "auto" else [kind]
        if isinstance(coords, Grid):
            defaults["grid_shape"] = coords.shape
    context = {**defaults, **given}
    # a single scaled RoPE is drawn over plain `rope`
    drawn = (["rope", entry.name] if entry.hook == "rotary" and len(names) == 1
             and entry.name != "rope" else names)
    _refuse_unread_context(given, names, [registry.get(n) for n in drawn])
    _refuse_unread(entry.name, kinds, coords, {
        "--grid": grid is not None, "--length": length is not None, "--query": query is not None,
        "--smiles": smiles != DEFAULT_SMILES, "--features": features,
        "--prefix": prefix is not None and checkpoint is None})

    def build(n: str) -> Any:
        e = registry.get(n)
        if checkpoint is not None and e.name == entry.name:
            return load_encoding(n, checkpoint, prefix, context=_only(given, e),
                                 defaults=_only(defaults, e), **opts)
        try:
            return registry.build(n, context=_only(context, e),
                                  **(opts if e.name == entry.name else {}))
        except TypeError as err:
            raise ValueError(f"mmpe plot: {err}") from err

    out = Path(out)
    written: list[Path] = []
    for k in kinds:
        path = out / f"{stem}_{k}.png"
        if k == "decay":
            plot_rotary_decay([build(n) for n in drawn], length or 1024, path=path)
        elif k in ("matrix", "similarity"):
            draw = plot_input_matrix if k == "matrix" else plot_similarity
            draw(build(entry.name), coords, path=path)
        elif k == "sphere":
            if not isinstance(coords, Sphere):
                raise ValueError(f"mmpe plot: --kind sphere needs an encoding on the sphere; "
                                 f"{entry.name} runs on {type(coords).__name__}")
            plot_sphere(build(entry.name), coords, features=features, path=path)
        elif k == "graph":
            if not isinstance(coords, GraphLayout):
                raise ValueError(f"mmpe plot: --kind graph needs a graph encoding; {entry.name} "
                                 f"runs on {type(coords).__name__}")
            plot_graph_eigenvectors(smiles, encoding=build(entry.name), path=path)
        elif k == "bias":
            plot_bias_vs_distance(build(entry.name), coords, path=path)
        else:  # row
            q = query
            if isinstance(coords, Sequence):
                q = coords.num_queries - 1 if q is None else q
                if q >= coords.num_queries:
                    coords = Sequence(q + 1, causal=coords.causal)
            plot_bias_row(build(entry.name), coords, q, checkpoint=checkpoint, prefix=prefix,
                          path=path)
        written.append(path)
    return written


def _refuse_unread(name: str, kinds: list[str], coords: Coordinates | None,
                   asked: Mapping[str, bool]) -> None:
    """Every figure option given must change a figure drawn: one that none of `kinds` reads
    is refused, naming it (before anything is drawn), never ignored.

    Raises:
        ValueError: an option in `asked` (flag -> given) that the figures do not read.
    """
    on = "a 1-D distance axis" if coords is None else f"{type(coords).__name__} coordinates"
    unread = {
        "--grid": (not isinstance(coords, Grid), f"it is drawn on {on}"),
        "--length": (not isinstance(coords, Sequence) and "decay" not in kinds,
                     f"it is drawn on {on}"),
        "--query": ("row" not in kinds, "only the bias row figure (--kind row) has a query"),
        "--smiles": (not isinstance(coords, GraphLayout), "only graph encodings draw a molecule"),
        "--features": ("sphere" not in kinds, "only the world map (--kind sphere) reads it"),
        "--prefix": (True, "it names a module of --checkpoint, which is not given"),
    }
    for flag, given in asked.items():
        ignored, why = unread[flag]
        if given and ignored:
            raise ValueError(f"mmpe plot: {flag} does not change the {'/'.join(kinds)} figure of "
                             f"{name} ({why}); leave it out")


_FLAG_OF_KEY = {"d_model": "--d-model", "num_heads": "--heads", "head_dim": "--head-dim"}


def _refuse_unread_context(given: Mapping[str, Any], names: Seq[str],
                           drawn: Seq[registry.Entry]) -> None:
    """A size given (`--d-model`, `--heads`, `--head-dim`, or a context key as `--option`) that no
    drawn encoding takes (the encodings `names`, and `rope` under a single scaled one) is refused,
    naming it and what they take, never dropped (`--grid` is read by the coordinates, and
    checked with the figure options).

    Raises:
        ValueError: a key of `given` outside every drawn encoding's context.
    """
    takes = set().union(*(e.context for e in drawn))
    for key in given:
        if key != "grid_shape" and key not in takes:
            flag = _FLAG_OF_KEY.get(key, f"--option {key}=")
            raise ValueError(f"mmpe plot: {flag} does not change {', '.join(names)} (the "
                             f"figure's encodings take {', '.join(sorted(takes)) or 'no size'}); "
                             "leave it out")


def _only(context: Mapping[str, Any], entry: registry.Entry) -> dict[str, Any]:
    return {k: v for k, v in context.items() if k in entry.context}
