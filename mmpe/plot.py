"""Figures of positional encodings: look at an encoding instead of reading its formula.

One function per kind of figure; each takes built encodings (or registry names) and
coordinates, returns a :class:`matplotlib.figure.Figure` and, given ``path``, writes a PNG there.
Figures are drawn with matplotlib's object API (no ``pyplot``, no global backend: PNGs are
rendered by Agg), and matplotlib is imported inside the functions, so ``import mmpe`` does not
need it.

=========================  =====================================  ==================================
function                   figure                                 encodings
=========================  =====================================  ==================================
:func:`plot_input_matrix`  ``P`` as a heatmap, positions × dims   input
:func:`plot_similarity`    cosine similarity of position vectors  input; on a 2D grid one small
                           (on a grid: one map per patch, ViT     map per patch
                           Fig. 7)
:func:`plot_bias_vs_distance`  the bias against distance, a line  score (ALiBi, T5, KERPLE, FIRE …)
                           per head
:func:`plot_bias_row`      the bias of one query against every    score, e.g. read from a trained
                           key (FIRE's figure of learned biases)  checkpoint (:func:`load_encoding`)
:func:`plot_rotary_decay`  rotated ``q·k`` against relative       rotary, several overlaid
                           distance (RoPE's long-range decay)
:func:`plot_sphere`        components on a world map              input on the sphere
:func:`plot_graph_eigenvectors`  a molecule coloured by its       graphs (LapPE)
                           Laplacian eigenvectors
=========================  =====================================  ==================================

:func:`plot_command` is ``mmpe plot NAME``: it picks the figures from the encoding's hook and
the capabilities it needs, builds coordinates, and writes the PNGs.

    >>> import mmpe
    >>> from mmpe import plot
    >>> fig = plot.plot_similarity(mmpe.build("sinusoidal", d_model=128), mmpe.Sequence(128),
    ...                            path="sinusoidal_similarity.png")           # doctest: +SKIP
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import sys
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from mmpe import registry
from mmpe.context import CONTEXT_KEYS, check_context
from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.capabilities import Directed, GraphLayout, GridLayout, VirtualNode
from mmpe.coords.graph import Graph
from mmpe.coords.grid import Grid
from mmpe.coords.sequence import Sequence
from mmpe.coords.sphere import Sphere
from mmpe.encodings._state import SETTINGS_PREFIX, decode_setting
from mmpe.encodings.base import (
    Encoding,
    InputEncoding,
    RotaryEncoding,
    ScoreEncoding,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = [
    "KINDS", "load_encoding", "molecule_graph", "parse_option", "plot_bias_row",
    "plot_bias_vs_distance", "plot_command", "plot_graph_eigenvectors", "plot_input_matrix",
    "plot_rotary_decay", "plot_similarity", "plot_sphere", "show",
]

#: figure kinds of ``mmpe plot --kind``.
KINDS = ("auto", "matrix", "similarity", "bias", "row", "decay", "sphere", "graph")
#: the molecule ``mmpe plot`` draws for graph encodings (caffeine).
DEFAULT_SMILES = "Cn1cnc2c1c(=O)n(C)c(=O)n2C"
DPI = 100
_DIVERGING = "RdBu_r"


# -- shared helpers ---------------------------------------------------------------------
def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _finish(fig: Figure, path: str | os.PathLike | None) -> Figure:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI)
    return fig


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _name(enc: Any) -> str:
    return getattr(enc, "registry_name", type(enc).__name__)


def _build(fn: str, enc: Any, base: type[Encoding], context: Mapping[str, Any] | None) -> Any:
    """``enc`` itself, or built from a registry name / config with ``context``; check its hook."""
    if isinstance(enc, (str, Mapping)):
        entry = registry.get(enc if isinstance(enc, str) else enc.get("name", ""))
        ctx = check_context(context, f"{fn}(context=...)")
        enc = registry.build(enc, context={k: v for k, v in ctx.items() if k in entry.context})
    if not isinstance(enc, base):
        hook = getattr(enc, "hook", None)
        what = f"{_a(hook)} encoding" if hook else _a(type(enc).__name__)
        raise ValueError(f"{fn}: {_name(enc)} is {what}; {fn} needs {_a(base.hook)} encoding")
    return enc


@contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no LapPE sign flips, no dropout) and no grad, restoring the mode after."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was)


def _positions(enc: InputEncoding, coords: Coordinates) -> Tensor:
    """``P`` of an input encoding on ``coords`` as float32 ``[n, d]`` (first batch element)."""
    enc.check_coords(coords)
    with _evaluating(enc):
        pe = enc(coords)
    if pe.dim() == 3:
        pe = pe[0]
    return pe.detach().float().cpu()


def _cosine(pe: Tensor) -> Tensor:
    unit = pe / pe.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return unit @ unit.T


def _symmetric(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def _head_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1) * 0.9) for i in range(n)]


# -- input encodings ---------------------------------------------------------------------
def plot_input_matrix(enc: InputEncoding | str, coords: Coordinates | None = None, *,
                      length: int = 128, context: Mapping[str, Any] | None = None,
                      path: str | os.PathLike | None = None) -> Figure:
    """The encoding matrix ``P`` as a heatmap: positions (rows) × dimensions (columns).

    Args:
        enc: a built input encoding, or a registry name built with ``context``
            (``{"d_model": 64}`` by default).
        coords: the tokens; default ``Sequence(length)``. Batched encodings show batch 0.
        path: write a PNG here.

    Raises:
        ValueError: ``enc`` is not an input encoding. TypeError: ``coords`` it cannot read.
    """
    enc = _build("plot_input_matrix", enc, InputEncoding, {"d_model": 64, **(context or {})})
    coords = Sequence(length) if coords is None else coords
    pe = _positions(enc, coords).numpy()
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    lim = _symmetric(pe)
    im = ax.imshow(pe, aspect="auto", cmap=_DIVERGING, vmin=-lim, vmax=lim,
                   interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel(f"position ({type(coords).__name__} token)")
    ax.set_title(f"{_name(enc)}: P [{pe.shape[0]} × {pe.shape[1]}]")
    fig.colorbar(im, ax=ax, shrink=0.9)
    return _finish(fig, path)


def plot_similarity(enc: InputEncoding | str, coords: Coordinates | None = None, *,
                    length: int = 128, context: Mapping[str, Any] | None = None,
                    path: str | os.PathLike | None = None) -> Figure:
    """Cosine similarity of the position vectors of an input encoding.

    On a 1D sequence (or any coordinates other than a 2D grid): the ``[n, n]`` matrix
    ``cos(P_i, P_j)`` — for sinusoidal encodings high near the diagonal, with periodic bands.
    On a 2D :class:`~mmpe.Grid` ``(H, W)``: the figure of Dosovitskiy et al. 2021 (ViT, Fig. 7):
    an ``H × W`` array of small maps, the map at row ``i``, column ``j`` showing the similarity of
    patch ``(i, j)`` to every patch (prefix tokens are left out).

    Args:
        enc: a built input encoding, or a registry name built with ``context``
            (``{"d_model": 64}`` by default; add ``grid_shape`` for ``learned_grid``).
        coords: default ``Sequence(length)``.
        path: write a PNG here.

    Raises:
        ValueError: ``enc`` is not an input encoding.
    """
    enc = _build("plot_similarity", enc, InputEncoding, {"d_model": 64, **(context or {})})
    coords = Sequence(length) if coords is None else coords
    pe = _positions(enc, coords)
    name = _name(enc)
    if isinstance(coords, GridLayout) and len(coords.shape) == 2:
        h, w = coords.shape
        sim = _cosine(pe[coords.prefix_tokens:]).numpy().reshape(h, w, h, w)
        # One (h × w) map per patch, laid out on the grid with a one-cell gap between maps.
        mosaic = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
        for i in range(h):
            for j in range(w):
                mosaic[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w] = sim[i, j]
        fig = _figure(6.4, 5.6)
        ax = fig.add_subplot()
        im = ax.imshow(mosaic, cmap="viridis", vmin=float(np.nanmin(mosaic)), vmax=1,
                       interpolation="nearest")
        ax.set_xticks([j * (w + 1) + (w - 1) / 2 for j in range(w)], [str(j + 1) for j in range(w)])
        ax.set_yticks([i * (h + 1) + (h - 1) / 2 for i in range(h)], [str(i + 1) for i in range(h)])
        ax.tick_params(length=0, labelsize=7)
        ax.set_xlabel("input patch column")
        ax.set_ylabel("input patch row")
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"{name}: position embedding similarity on a {h}×{w} grid")
        fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
        return _finish(fig, path)
    sim = _cosine(pe).numpy()
    fig = _figure(5.6, 4.8)
    ax = fig.add_subplot()
    im = ax.imshow(sim, cmap="viridis", vmin=float(sim.min()), vmax=1,
                   interpolation="nearest")
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    ax.set_title(f"{name}: cos(P_i, P_j), {sim.shape[0]} positions")
    fig.colorbar(im, ax=ax, shrink=0.9, label="cosine similarity")
    return _finish(fig, path)


# -- score encodings ---------------------------------------------------------------------
def _score_terms(fn: str, enc: ScoreEncoding, coords: Coordinates,
                 num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bias [n_h, n_q, n_k], allowed [n_q, n_k])`` of a position-only additive encoding."""
    from mmpe.functional import score_mod

    if not enc.additive:
        raise ValueError(f"{fn}: {_name(enc)} rescales the attention scores instead of adding a "
                         "bias; there is no bias to plot")
    with _evaluating(enc):
        try:
            mod = score_mod(enc, coords, num_heads=num_heads)
        except ValueError as err:
            raise ValueError(f"{fn}: no position-only bias of {_name(enc)} on "
                             f"{type(coords).__name__}: {err}") from err
        b, h, q, k = index_grid(1, num_heads, coords.num_queries, coords.num_keys, coords.device)
        bias = mod(torch.zeros(()), b, h, q, k)
    bias = bias.expand(1, num_heads, coords.num_queries, coords.num_keys)[0].float().cpu().numpy()
    mask = coords.dense_mask()
    allowed = (np.ones(bias.shape[1:], dtype=bool) if mask is None
               else mask[0, 0].cpu().numpy().astype(bool))
    return bias, allowed


def _heads(fn: str, enc: ScoreEncoding, num_heads: int | None) -> int:
    built = getattr(enc, "num_heads", None)
    if num_heads is None:
        return built if isinstance(built, int) else 8
    if isinstance(built, int) and built != num_heads:
        raise ValueError(f"{fn}: {_name(enc)} was built for num_heads={built}, got "
                         f"num_heads={num_heads}")
    return num_heads


def _legend(ax, n: int) -> None:
    if n <= 16:
        ax.legend(fontsize=7, ncols=2 if n > 8 else 1, loc="best", frameon=False)


def plot_bias_vs_distance(enc: ScoreEncoding | str, coords: Coordinates | int | None = None,
                          num_heads: int | None = None, *, max_distance: int = 128,
                          context: Mapping[str, Any] | None = None,
                          path: str | os.PathLike | None = None) -> Figure:
    """A score encoding's bias against distance, one line per head (ALiBi's slopes, T5's
    buckets, KERPLE's logarithm, FIRE's learned curve).

    Args:
        enc: a built score encoding, or a registry name built with ``num_heads``.
        coords: an int ``max_distance``, or coordinates. Default (and with an int): a causal
            ``Sequence(max_distance + 1)``, the last query against every key, so the distance is
            ``0 … max_distance`` tokens. On ``Directed`` coordinates the last query's row is
            shown; on others (grids, graphs, the sphere) the bias is averaged over all allowed
            pairs at each distance.
        num_heads: heads (default: the encoding's, else 8).
        path: write a PNG here.

    Raises:
        ValueError: not a score encoding; a rescaling or content-dependent one (Shaw, DeBERTa
            … need queries and keys); ``num_heads`` unlike the encoding's.
    """
    fn = "plot_bias_vs_distance"
    if isinstance(coords, int) and not isinstance(coords, bool):
        coords, max_distance = None, coords
    if coords is None:
        coords = Sequence(max_distance + 1, causal=True)
    ctx = {"num_heads": num_heads or 8, **(context or {})}
    enc = _build(fn, enc, ScoreEncoding, ctx)
    num_heads = _heads(fn, enc, num_heads)
    bias, allowed = _score_terms(fn, enc, coords, num_heads)
    b, _, q, k = index_grid(1, 1, coords.num_queries, coords.num_keys, coords.device)
    dist = coords.distance(q, k, b).expand(1, 1, coords.num_queries, coords.num_keys)
    dist = dist[0, 0].float().cpu().numpy()
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    colors = _head_colors(num_heads)
    slopes = getattr(enc, "slopes", None)
    labels = [f"head {h}" + (f", m = {float(slopes[h]):.3g}" if isinstance(slopes, Tensor)
                             and slopes.numel() == num_heads else "") for h in range(num_heads)]
    if isinstance(coords, Directed):
        row = coords.num_queries - 1
        keep = allowed[row]
        order = np.argsort(dist[row][keep], kind="stable")
        x = dist[row][keep][order]
        for h in range(num_heads):
            ax.plot(x, bias[h, row][keep][order], color=colors[h], lw=1.4, label=labels[h])
        ax.set_xlabel(f"distance from query {row} (tokens)")
    else:
        keys = np.round(dist[allowed], 6)
        x, inverse = np.unique(keys, return_inverse=True)
        counts = np.bincount(inverse, minlength=len(x))
        for h in range(num_heads):
            mean = np.bincount(inverse, weights=bias[h][allowed], minlength=len(x)) / counts
            ax.plot(x, mean, color=colors[h], lw=1.4, marker="." if len(x) < 40 else None,
                    label=labels[h])
        ax.set_xlabel(f"distance ({type(coords).__name__}; bias averaged over pairs)")
    ax.set_ylabel("bias added to the logit")
    ax.set_title(f"{_name(enc)}: bias against distance")
    ax.grid(alpha=0.3)
    _legend(ax, num_heads)
    return _finish(fig, path)


def load_encoding(enc: str | Mapping[str, Any] | Encoding, checkpoint: str | os.PathLike,
                  prefix: str | None = None, *, context: Mapping[str, Any] | None = None,
                  defaults: Mapping[str, Any] | None = None, **options: Any) -> Encoding:
    """An encoding with its parameters read from a training checkpoint.

    Reads ``torch.load(checkpoint)["state_dict"]`` (a Lightning checkpoint; a plain state dict
    works too) and loads the tensors under ``prefix`` (e.g.
    ``"transformer.blocks.0.attn.scores.0"``) into the encoding. Without ``prefix`` the first
    module of the state dict holding every parameter name of the encoding is used. A Lightning
    checkpoint's ``hyper_parameters`` fill the context keys it holds (``num_heads``,
    ``d_model`` …; ``head_dim = d_model // num_heads``; ``grid_shape`` from ``image_size`` /
    ``patch_size`` as in ``recipes/vision.py``) and, when its ``encoding`` is this one, the
    ``encoding_options``; ``context`` and ``options`` given here win, and ``defaults`` fill
    the context keys neither gives.

    The file is loaded with ``weights_only=True`` first; a checkpoint that needs more (pickled
    objects in its hyperparameters) is loaded fully, so only read checkpoints you trust.

    Raises:
        FileNotFoundError: no such file. KeyError: an unknown encoding name.
        ValueError: nothing under ``prefix``, no module holding the encoding's parameters, or
            tensors whose names or shapes differ from the encoding's (build options such as
            ``num_heads`` that do not match the checkpoint).
    """
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"load_encoding: no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # pickled hyperparameters: Lightning itself loads these fully
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, Mapping):
        raise ValueError(f"load_encoding: {path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    state = ckpt.get("state_dict", ckpt)
    hparams = ckpt.get("hyper_parameters") or {}
    if isinstance(enc, Encoding):
        built, rebuild = enc, None
    else:
        name = enc if isinstance(enc, str) else enc.get("name", "")
        entry = registry.get(name)
        known = {k: v for k, v in hparams.items()
                 if k in CONTEXT_KEYS and CONTEXT_KEYS[k].valid(v)}
        if "head_dim" not in known and "d_model" in known and "num_heads" in known:
            known["head_dim"] = known["d_model"] // known["num_heads"]
        size, patch = hparams.get("image_size"), hparams.get("patch_size")
        if "grid_shape" not in known and isinstance(size, int) and isinstance(patch, int) \
                and 0 < patch <= size:
            known["grid_shape"] = (size // patch, size // patch)
        explicit = check_context(context, "load_encoding(context=...)")
        ctx = {**check_context(defaults, "load_encoding(defaults=...)"), **known, **explicit}
        saved = hparams.get("encoding_options") if hparams.get("encoding") == entry.name else None
        opts = {**(dict(saved) if isinstance(saved, Mapping) else {}), **options}

        def rebuild(extra: Mapping[str, Any]) -> Encoding:
            try:
                return registry.build(enc, context={k: v for k, v in ctx.items()
                                                    if k in entry.context}, **{**extra, **opts})
            except TypeError as err:
                raise ValueError(f"load_encoding: {err}") from err

        built = rebuild({})
    wanted = [k for k in built.state_dict() if not _is_setting(k)]
    if prefix is None:
        prefix = _find_prefix(state, wanted)
        if prefix is None:
            modules = sorted({k.rsplit(".", 1)[0] for k in state if "." in k})[:12]
            raise ValueError(f"load_encoding: no module in {path} holds the parameters of "
                             f"{_name(built)} ({wanted}); pass prefix=... (modules: {modules} …)")
    prefix = prefix.rstrip(".")
    sub = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
    if not sub and wanted:
        raise ValueError(f"load_encoding: {path} has no tensors under {prefix!r}")
    if rebuild is not None:
        # Settings saved with the tensors (T5's max_distance, a RoPE scaling's training length
        # …) that the constructor takes and nobody gave here: build with the saved values.
        accepted = set(inspect.signature(registry.get(_name(built)).cls).parameters)
        extra = {k[len(SETTINGS_PREFIX):]: decode_setting(v) for k, v in sub.items()
                 if k.startswith(SETTINGS_PREFIX)}
        extra = {k: v for k, v in extra.items()
                 if k in accepted and k not in options and k not in explicit}
        current = getattr(built, "function_settings", dict)()
        if any(k not in current or current[k] != v for k, v in extra.items()):
            built = rebuild(extra)
    try:
        # strict=False: settings a checkpoint saved before they existed are absent; every
        # tensor must still be there, and saved settings that differ still fail the load.
        result = built.load_state_dict(sub, strict=False)
    except RuntimeError as err:
        raise ValueError(f"load_encoding: the tensors under {prefix!r} do not fit "
                         f"{_name(built)} as built (pass its options, e.g. num_heads): {err}") from err
    missing = [k for k in result.missing_keys if not _is_setting(k)]
    if missing or result.unexpected_keys:
        raise ValueError(f"load_encoding: the tensors under {prefix!r} do not fit {_name(built)}: "
                         f"missing {missing}, unexpected {list(result.unexpected_keys)}")
    return built


def _is_setting(key: str) -> bool:
    return key.startswith(SETTINGS_PREFIX) or f".{SETTINGS_PREFIX}" in key


def _find_prefix(state: Mapping[str, Any], wanted: list[str]) -> str | None:
    if not wanted:
        return None
    first = wanted[0]
    for key in state:
        if key.endswith("." + first):
            prefix = key[: -len(first) - 1]
            if all(f"{prefix}.{w}" in state for w in wanted):
                return prefix
    return None


def plot_bias_row(enc: ScoreEncoding | str, coords: Coordinates | None = None,
                  query: int | None = None, *, num_heads: int | None = None,
                  checkpoint: str | os.PathLike | None = None, prefix: str | None = None,
                  context: Mapping[str, Any] | None = None,
                  path: str | os.PathLike | None = None) -> Figure:
    """The bias one query puts on every key, one line per head (Li et al. 2024, FIRE, the
    figure of learned biases at query 128).

    Args:
        enc: a score encoding or registry name; with ``checkpoint``, its parameters are read
            from there (:func:`load_encoding`, ``prefix`` as there).
        coords: default a causal ``Sequence(query + 1)``. On a 2D grid the row is drawn as a map
            per head, the query's cell marked.
        query: the query token (default 128 on the default sequence, else the last query; on a
            grid the centre cell).
        num_heads: heads (default: the encoding's, else 8).
        path: write a PNG here.

    Raises:
        ValueError: ``query`` outside the coordinates; not a score encoding; see
            :func:`plot_bias_vs_distance` and :func:`load_encoding`.
    """
    fn = "plot_bias_row"
    if checkpoint is not None:
        ctx = {} if num_heads is None else {"num_heads": num_heads}
        enc = load_encoding(enc, checkpoint, prefix, context={**ctx, **(context or {})})
    enc = _build(fn, enc, ScoreEncoding, {"num_heads": num_heads or 8, **(context or {})})
    num_heads = _heads(fn, enc, num_heads)
    if coords is None:
        query = 128 if query is None else query
        if isinstance(query, bool) or not isinstance(query, int) or query < 0:
            raise ValueError(f"{fn}: query must be an int >= 0, got {query!r}")
        coords = Sequence(query + 1, causal=True)
    grid2d = isinstance(coords, GridLayout) and len(coords.shape) == 2
    if query is None:
        if grid2d:
            h_, w_ = coords.shape
            query = coords.prefix_tokens + (h_ // 2) * w_ + w_ // 2
        else:
            query = coords.num_queries - 1
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < coords.num_queries:
        raise ValueError(f"{fn}: query must be an int in [0, {coords.num_queries}), got {query!r}")
    bias, allowed = _score_terms(fn, enc, coords, num_heads)
    row = np.where(allowed[query], bias[:, query], np.nan)  # [n_h, n_k]
    name = _name(enc)
    source = f" ({Path(checkpoint).name})" if checkpoint is not None else ""
    if grid2d:
        h_, w_ = coords.shape
        k = coords.prefix_tokens
        cols = min(num_heads, 4)
        rows = math.ceil(num_heads / cols)
        fig = _figure(2.7 * cols, 2.2 * rows + 0.6)
        for h in range(num_heads):
            ax = fig.add_subplot(rows, cols, h + 1)
            im = ax.imshow(row[h, k:].reshape(h_, w_), cmap="viridis", interpolation="nearest")
            fig.colorbar(im, ax=ax, shrink=0.75)
            if query >= k:
                qi, qj = divmod(query - k, w_)
                ax.plot(qj, qi, "r+", ms=8)
            ax.set_title(f"head {h}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.suptitle(f"{name}{source}: bias of query {query} against every patch "
                     "(own colour scale per head)")
        return _finish(fig, path)
    keys = coords.key_positions[..., 0] if hasattr(coords, "key_positions") else None
    x = (keys[0] if keys is not None and keys.dim() == 2 else keys)
    x = np.arange(coords.num_keys) if x is None else x.float().cpu().numpy()
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    colors = _head_colors(num_heads)
    for h in range(num_heads):
        ax.plot(x, row[h], color=colors[h], lw=1.4, label=f"head {h}")
    ax.axvline(float(x[query]) if query < len(x) else query, color="grey", ls=":", lw=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("bias added to the logit")
    ax.set_title(f"{name}{source}: bias at query {query}")
    ax.grid(alpha=0.3)
    _legend(ax, num_heads)
    return _finish(fig, path)


# -- rotary encodings --------------------------------------------------------------------
def plot_rotary_decay(encs: Any, max_distance: int = 1024, *, head_dim: int = 128,
                      qk: str = "ones", samples: int = 64, seed: int = 0,
                      context: Mapping[str, Any] | None = None, log_x: bool = False,
                      path: str | os.PathLike | None = None) -> Figure:
    """Rotated ``q·k`` against relative distance: the long-range decay of Su et al. 2021
    (RoFormer §3.4.3, Fig. 2), for the base RoPE and each of its scalings overlaid.

    A query at position ``max_distance`` and keys at ``0 … max_distance`` all carry the same
    vector ``x`` before rotation; the curve is ``⟨R_m x, R_n x⟩ / h_d`` against ``m − n``
    (``1`` at distance 0 for plain RoPE; YaRN's temperature and xPos's decay show as scale).

    Args:
        encs: a rotary encoding or registry name, a list of them, or a mapping label → encoding.
            Names are built with ``context`` (``head_dim`` from ``head_dim``).
        max_distance: the largest distance (tokens).
        head_dim: ``h_d`` of encodings built from names.
        qk: ``"ones"`` (``x = 1``) or ``"random"`` (the mean over ``samples`` Gaussian ``x``).
        log_x: logarithmic distance axis.
        path: write a PNG here.

    Raises:
        ValueError: an encoding that is not rotary or does not run on 1D positions, ``qk`` not
            ``"ones"``/``"random"``, ``max_distance < 1``.
    """
    fn = "plot_rotary_decay"
    if qk not in ("ones", "random"):
        raise ValueError(f"{fn}: qk must be 'ones' or 'random', got {qk!r}")
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
        raise ValueError(f"{fn}: max_distance must be an int >= 1, got {max_distance!r}")
    if isinstance(encs, Mapping) and "name" not in encs:
        items = list(encs.items())
    else:
        items = [(None, e) for e in (encs if isinstance(encs, (list, tuple)) else [encs])]
    if not items:
        raise ValueError(f"{fn}: give at least one rotary encoding")
    ctx = {"head_dim": head_dim, **(context or {})}
    length = max_distance + 1
    coords = Sequence(length)
    gen = torch.Generator().manual_seed(seed)
    fig = _figure(6.8, 4.2)
    ax = fig.add_subplot()
    trained: set[int] = set()
    dist = np.arange(length)
    for label, enc in items:
        enc = _build(fn, enc, RotaryEncoding, ctx)
        try:
            enc.check_coords(coords)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{fn}: {_name(enc)} does not rotate 1D positions: {err}") from err
        d = int(getattr(enc, "head_dim", head_dim))
        n_h = getattr(enc, "num_heads", None)
        n_h = n_h if isinstance(n_h, int) else 1  # per-head frequencies (RoPE-Mixed): every head
        if qk == "ones":
            x = torch.ones(1, 1, 1, d)
        else:
            x = torch.randn(samples, 1, 1, d, generator=gen)
        x = x.expand(-1, n_h, length, d).contiguous()
        with _evaluating(enc):
            try:
                q, k = enc(x, x.clone(), coords)
            except ValueError as err:
                raise ValueError(f"{fn}: {err}") from err
        # [L]: mean over the vectors x and the heads
        score = (q[:, :, -1:, :].double() * k.double()).sum(-1).mean(dim=(0, 1)) / d
        curve = score.flip(0).numpy()  # distance m − n = 0 … max_distance
        ax.plot(dist[1:] if log_x else dist, curve[1:] if log_x else curve, lw=1.1,
                label=label or _label(enc))
        orig = getattr(enc, "original_max_position_embeddings", None)
        if isinstance(orig, int) and orig <= max_distance:
            trained.add(orig)
    for orig in sorted(trained):
        ax.axvline(orig, color="grey", ls=":", lw=1)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("relative distance m − n (tokens)")
    ax.set_ylabel("⟨R_m x, R_n x⟩ / h_d")
    what = "x = 1" if qk == "ones" else f"mean over {samples} Gaussian x"
    ax.set_title(f"rotated q·k against distance ({what})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    return _finish(fig, path)


def _label(enc: RotaryEncoding) -> str:
    parts = []
    factor = getattr(enc, "factor", None)
    if factor is not None:
        parts.append(f"s={factor:g}")
    orig = getattr(enc, "original_max_position_embeddings", None)
    if orig is not None:
        parts.append(f"L={orig}")
    return _name(enc) + (f" ({', '.join(parts)})" if parts else "")


# -- the sphere --------------------------------------------------------------------------
def _coastlines() -> Any:
    """cartopy's ``PlateCarree`` when cartopy and its Natural Earth coastlines are here
    offline (cartopy would otherwise try to download them while drawing), else None."""
    try:
        import cartopy
        import cartopy.crs as ccrs
    except Exception:
        return None
    try:
        fmt = {"category": "physical", "name": "coastline", "resolution": "110m",
               "config": cartopy.config}
        loader = cartopy.config["downloaders"][("shapefiles", "natural_earth")]
        local = [loader.target_path(fmt), loader.pre_downloaded_path(fmt)]
        if not any(p is not None and Path(p).is_file() for p in local):
            return None
    except Exception:
        return None
    return ccrs.PlateCarree()


def plot_sphere(enc: InputEncoding | str, coords: Sphere | None = None, *, n_lat: int = 90,
                n_lon: int = 180, components: int | Seq[int] = 4, features: bool = False,
                context: Mapping[str, Any] | None = None,
                path: str | os.PathLike | None = None) -> Figure:
    """Components of a sphere encoding on a world map (equirectangular: longitude × latitude).

    Coastlines come from cartopy when it and its Natural Earth data are installed; otherwise
    the maps are plain longitude/latitude axes.

    Args:
        enc: an input encoding on :class:`~mmpe.Sphere` coordinates, or a registry name
            (``d_model`` 64 by default).
        coords: a ``Sphere.grid(n_lat, n_lon)`` (default built from ``n_lat``, ``n_lon``).
        components: how many (the first ``k``) or which output channels to map.
        features: map the encoding's raw features (``enc.features(coords)``, e.g. the spherical
            harmonics ``Y_l^m``) instead of its output.
        path: write a PNG here.

    Raises:
        ValueError: not an input encoding; ``coords`` not a 2D ``Sphere.grid``; a component
            out of range; ``features`` for an encoding without ``features``.
    """
    fn = "plot_sphere"
    enc = _build(fn, enc, InputEncoding, {"d_model": 64, **(context or {})})
    if coords is None:
        coords = Sphere.grid(n_lat, n_lon)
    shape = getattr(coords, "grid_shape", None)
    if not isinstance(coords, Sphere) or shape is None or len(shape) != 2:
        raise ValueError(f"{fn}: coords must be a Sphere.grid(n_lat, n_lon) without times, "
                         f"got {type(coords).__name__} with grid_shape {shape}")
    n_lat, n_lon = shape
    if features:
        if not hasattr(enc, "features"):
            raise ValueError(f"{fn}: {_name(enc)} has no raw features to map; use features=False")
        enc.check_coords(coords)
        with _evaluating(enc):
            vals = enc.features(coords)
        vals = vals[0] if vals.dim() == 3 else vals
        vals = vals.detach().float().cpu()
    else:
        vals = _positions(enc, coords)
    vals = vals.numpy().reshape(n_lat, n_lon, -1)
    dim = vals.shape[-1]
    picks = list(range(min(components, dim))) if isinstance(components, int) else list(components)
    if not picks or any(not 0 <= c < dim for c in picks):
        raise ValueError(f"{fn}: components must lie in [0, {dim}), got {components!r}")
    proj = _coastlines()
    cols = 1 if len(picks) == 1 else 2
    rows = math.ceil(len(picks) / cols)
    fig = _figure(5.0 * cols, 2.7 * rows + 0.5)
    dlon = 360.0 / n_lon
    extent = (-180.0 - dlon / 2, 180.0 - dlon / 2, -90.0, 90.0)
    for i, c in enumerate(picks):
        kw = {"projection": proj} if proj is not None else {}
        ax = fig.add_subplot(rows, cols, i + 1, **kw)
        lim = _symmetric(vals[..., c])
        img_kw = {"transform": proj} if proj is not None else {}
        im = ax.imshow(vals[..., c], origin="lower", extent=extent, cmap=_DIVERGING,
                       vmin=-lim, vmax=lim, interpolation="nearest", **img_kw)
        if proj is not None:
            ax.coastlines(linewidth=0.5)
            ax.set_global()
        else:
            ax.set_xticks(range(-180, 181, 60))
            ax.set_yticks(range(-90, 91, 30))
            ax.tick_params(labelsize=7)
            ax.set_xlabel("longitude (°)", fontsize=8)
            ax.set_ylabel("latitude (°)", fontsize=8)
        if features and getattr(enc, "registry_name", "") == "spherical_harmonics":
            deg = math.isqrt(c)
            ax.set_title(f"Y_{deg}^{c - deg * deg - deg}", fontsize=9)
        else:
            ax.set_title(f"{'feature' if features else 'component'} {c}", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{_name(enc)} on the sphere ({n_lat}×{n_lon} grid)")
    return _finish(fig, path)


# -- graphs ------------------------------------------------------------------------------
def _molecule(smiles: str) -> tuple[Tensor, int, np.ndarray, list[str], list[float]]:
    """``(edge_index [2, 2E], n, xy [n, 2], atom symbols, bond orders [E])`` from RDKit."""
    try:
        from rdkit import Chem
        from rdkit.Chem import rdDepictor
    except ImportError as err:
        raise ImportError("drawing a molecule from SMILES needs RDKit: pip install rdkit") from err
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        raise ValueError(f"plot_graph_eigenvectors: {smiles!r} is not a valid SMILES string")
    rdDepictor.Compute2DCoords(mol)
    xy = np.asarray(mol.GetConformer().GetPositions())[:, :2]
    pairs, orders = [], []
    for bond in mol.GetBonds():
        pairs.append((bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()))
        orders.append(bond.GetBondTypeAsDouble())
    src = [a for a, _ in pairs] + [b for _, b in pairs]
    dst = [b for _, b in pairs] + [a for a, _ in pairs]
    edge_index = torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)
    labels = [a.GetSymbol() for a in mol.GetAtoms()]
    return edge_index, mol.GetNumAtoms(), xy, labels, orders


def molecule_graph(smiles: str, *, virtual_token: bool = False) -> Graph:
    """:class:`~mmpe.Graph` coordinates of a molecule given as SMILES (RDKit; atoms = nodes),
    with the bond type as an integer edge feature (0 single, 1 double, 2 triple, 3 aromatic)."""
    edge_index, n, _, _, orders = _molecule(smiles)
    codes = {1.0: 0, 2.0: 1, 3.0: 2, 1.5: 3}
    kind = torch.tensor([codes.get(o, 0) for o in orders] * 2, dtype=torch.long)
    return Graph(edge_index, num_nodes=n, edge_attr=kind.reshape(-1, 1),
                 virtual_token=virtual_token)


def plot_graph_eigenvectors(graph: str | Graph, k: int | None = None, *, encoding: Any = None,
                            normalization: str | None = "sym",
                            path: str | os.PathLike | None = None) -> Figure:
    """A graph drawn with its nodes coloured by the first Laplacian eigenvectors (LapPE's
    positions, Dwivedi & Bresson 2020), one panel per eigenvector, eigenvalue in the title.

    Args:
        graph: a SMILES string (drawn with RDKit's 2D depiction, atoms labelled) or a
            :class:`~mmpe.Graph` (its first graph, laid out with networkx).
        k: eigenvectors (default: the encoding's ``k``, else 4; at most 8 are drawn).
        encoding: optional ``lappe`` encoding (or name) whose ``k`` and ``normalization`` to use.
        normalization: ``"sym"`` or ``None`` (``D − A``), unless ``encoding`` sets it.
        path: write a PNG here.

    Raises:
        ValueError: an invalid SMILES string, ``k < 1``. TypeError: ``graph`` of another type.
        ImportError: RDKit (SMILES) or networkx (a ``Graph``) not installed.
    """
    from mmpe.graph_maths import adjacency, laplacian_eigenvectors

    fn = "plot_graph_eigenvectors"
    if encoding is not None:
        encoding = _build(fn, encoding, InputEncoding, {"d_model": 64})
        k = getattr(encoding, "k", None) if k is None else k
        normalization = getattr(encoding, "normalization", normalization)
    k = 4 if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{fn}: k must be an int >= 1, got {k!r}")
    orders: list[float] | None = None
    if isinstance(graph, str):
        edge_index, n, xy, labels, orders = _molecule(graph)
        title = graph
    elif isinstance(graph, Graph):
        n = int(graph.sizes[0])
        ei = graph.edge_index
        ei = ei[:, graph.batch_vector[ei[0]] == 0] if ei.numel() else ei
        edge_index = ei
        try:
            import networkx as nx
        except ImportError as err:
            raise ImportError(f"{fn}: laying out a Graph needs networkx: pip install networkx") from err
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(ei.T.tolist())
        layout = nx.kamada_kawai_layout(g) if n > 1 else {0: (0.0, 0.0)}
        xy = np.array([layout[i] for i in range(n)])
        labels = [str(i) for i in range(n)]
        title = f"graph 0 of {graph.num_graphs} ({n} nodes)"
    else:
        raise TypeError(f"{fn}: graph must be a SMILES string or an mmpe.Graph, "
                        f"got {type(graph).__name__}")
    vals, vecs, mask = laplacian_eigenvectors(adjacency(edge_index, n), k, normalization,
                                              return_mask=True)
    shown = min(k, 8)
    cols = min(shown, 4)
    rows = math.ceil(shown / cols)
    fig = _figure(3.0 * cols + 0.6, 3.0 * rows + 0.5)
    lim = _symmetric(vecs[:, :shown])
    ei = edge_index.numpy()
    half = ei.shape[1] // 2 if orders is not None else ei.shape[1]
    sc = None
    for i in range(shown):
        ax = fig.add_subplot(rows, cols, i + 1)
        for e in range(half):
            a, b = ei[0, e], ei[1, e]
            width = 1.0 + 1.2 * ((orders[e] if orders is not None else 1.0) - 1.0)
            ax.plot(xy[[a, b], 0], xy[[a, b], 1], color="0.55", lw=width, zorder=1)
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=vecs[:, i], cmap="coolwarm", vmin=-lim, vmax=lim,
                        s=260 if n <= 40 else 60, edgecolors="0.3", linewidths=0.6, zorder=2)
        if n <= 40:
            for j, lab in enumerate(labels):
                ax.text(xy[j, 0], xy[j, 1], lab, ha="center", va="center", fontsize=7, zorder=3)
        ax.set_title(f"u{i + 1}, λ = {vals[i]:.3f}" if mask[i] else f"u{i + 1}: absent", fontsize=9)
        ax.set_aspect("equal")
        ax.margins(0.12)
        ax.axis("off")
    fig.colorbar(sc, ax=fig.axes, shrink=0.7, label="eigenvector entry")
    norm = "I − D^-½AD^-½" if normalization == "sym" else "D − A"
    fig.suptitle(f"Laplacian eigenvectors ({norm}) of {title}", fontsize=10)
    return _finish(fig, path)


# -- mmpe plot ---------------------------------------------------------------------------
def parse_option(text: str) -> tuple[str, Any]:
    """``"key=value"`` → ``(key, value)``; the value read as a Python literal (``4``, ``0.5``,
    ``(14, 14)``, ``'x'``), ``true``/``false``/``none``/``null``, else kept as a string.

    Raises:
        ValueError: no ``=`` or an empty key.
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
    """The coordinates ``mmpe plot`` draws an encoding on, from what it needs."""
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
    """``mmpe plot NAME``: build the encoding, draw the figures, return the PNG paths.

    ``kind="auto"`` picks from the hook and the capabilities the encoding needs: input on a
    sequence → matrix + similarity; input on a grid (``--grid`` or a grid-only encoding) →
    the ViT similarity maps; on the sphere → a world map; on graphs → a molecule coloured by its
    Laplacian eigenvectors (+ matrix); score → bias against distance (from a checkpoint: the
    bias row at one query too); rotary → the decay curve. ``name`` may list several rotary
    encodings, comma-separated, to overlay; a single scaled RoPE is drawn over plain ``rope``.

    ``options`` (``key=value`` strings or a mapping) are encoding options; keys of
    :data:`mmpe.context.CONTEXT_KEYS` (``original_max_position_embeddings``, ``grid_shape`` …)
    go into the context instead, so every encoding of an overlay gets those it takes. Defaults:
    ``d_model`` 64, 8 heads, ``head_dim = d_model // heads`` (rotary: 128), ``max_len`` 1024.
    With ``checkpoint`` the encoding NAME is read from it (:func:`load_encoding`): its saved
    hyperparameters replace those defaults, values given here replace both. Files are
    ``OUT/<stem>_<kind>.png``, the stem by default the names joined by ``+``.

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
                         f"{entry.name} is {_a(entry.hook)} encoding")
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
    given = check_context(given, "mmpe plot")
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
            overlay = ["rope", entry.name] if len(names) == 1 and entry.name != "rope" else names
            plot_rotary_decay([build(n) for n in overlay], length or 1024, path=path)
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


def _only(context: Mapping[str, Any], entry: registry.Entry) -> dict[str, Any]:
    return {k: v for k, v in context.items() if k in entry.context}


def show(paths: Seq[str | os.PathLike]) -> bool:
    """Open the PNGs in windows when a display exists (``mmpe plot --show``); False without."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        return False
    import matplotlib.pyplot as plt

    for p in paths:
        fig = plt.figure(figsize=(8, 6))
        ax = fig.add_subplot()
        ax.imshow(plt.imread(p))
        ax.set_axis_off()
        if fig.canvas.manager is not None:
            fig.canvas.manager.set_window_title(Path(p).name)
    plt.show()
    return True
