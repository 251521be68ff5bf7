"""Figures of encodings on sequences and grids.

Figures of encodings on sequences and grids: the matrix `P`, the similarity of position
vectors, a score encoding's bias (against distance, or one query's row) and RoPE's decay.

Each function takes a built encoding (or a registry name) and coordinates, returns a
`matplotlib.figure.Figure` and, given `path`, writes a PNG there
(through [`mmpe.plot.style`][mmpe.plot.style]).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from mmpe.attention.forms import dense_bias
from mmpe.checkpoints import load_encoding
from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.capabilities import Directed, GridLayout
from mmpe.coords.sequence import Sequence
from mmpe.encodings._content import ContentScoreEncoding
from mmpe.encodings.base import (
    AttentionCall,
    InputEncoding,
    RotaryEncoding,
    ScoreEncoding,
)
from mmpe.plot._common import build, evaluating, name_of, positions
from mmpe.plot.style import (
    DIVERGING,
    finish,
    head_colors,
    legend,
    new_figure,
    symmetric_limit,
)
from mmpe.validation import check_memory

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["plot_bias_row", "plot_bias_vs_distance", "plot_input_matrix", "plot_rotary_decay",
           "plot_similarity"]


def _cosine(pe: Tensor) -> Tensor:
    unit = pe / pe.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return unit @ unit.T


# -- input encodings ---------------------------------------------------------------------
def plot_input_matrix(enc: InputEncoding | str, coords: Coordinates | None = None, *,
                      length: int = 128, context: Mapping[str, Any] | None = None,
                      path: str | os.PathLike | None = None) -> Figure:
    """The encoding matrix `P` as a heatmap: positions (rows) × dimensions (columns).

    Args:
        enc: a built input encoding, or a registry name built with `context`
            (`{"d_model": 64}` by default).
        coords: the tokens; default `Sequence(length)`. Batched encodings show batch 0.
        path: write a PNG here.

    Raises:
        ValueError: `enc` is not an input encoding. TypeError: `coords` it cannot read.
    """
    enc = build("plot_input_matrix", enc, InputEncoding, {"d_model": 64, **(context or {})})
    coords = Sequence(length) if coords is None else coords
    pe = positions(enc, coords).numpy()
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    lim = symmetric_limit(pe)
    im = ax.imshow(pe, aspect="auto", cmap=DIVERGING, vmin=-lim, vmax=lim,
                   interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel(f"position ({type(coords).__name__} token)")
    ax.set_title(f"{name_of(enc)}: P [{pe.shape[0]} × {pe.shape[1]}]")
    fig.colorbar(im, ax=ax, shrink=0.9)
    return finish(fig, path)


def plot_similarity(enc: InputEncoding | str, coords: Coordinates | None = None, *,
                    length: int = 128, context: Mapping[str, Any] | None = None,
                    path: str | os.PathLike | None = None) -> Figure:
    """Cosine similarity of the position vectors of an input encoding.

    On a 1D sequence (or any coordinates other than a 2D grid): the `[n, n]` matrix
    `cos(P_i, P_j)` — for sinusoidal encodings high near the diagonal, with periodic bands.
    On a 2D [`Grid`][mmpe.coords.grid.Grid] `(H, W)`: the figure of Dosovitskiy et al. 2021 (ViT, Fig. 7):
    an `H × W` array of small maps, the map at row `i`, column `j` showing the similarity of
    patch `(i, j)` to every patch (prefix tokens are left out).

    Args:
        enc: a built input encoding, or a registry name built with `context`
            (`{"d_model": 64}` by default; add `grid_shape` for `learned_grid`).
        coords: default `Sequence(length)`.
        path: write a PNG here.

    Raises:
        ValueError: `enc` is not an input encoding.
    """
    enc = build("plot_similarity", enc, InputEncoding, {"d_model": 64, **(context or {})})
    coords = Sequence(length) if coords is None else coords
    pe = positions(enc, coords)
    name = name_of(enc)
    if isinstance(coords, GridLayout) and len(coords.shape) == 2:
        h, w = coords.shape
        sim = _cosine(pe[coords.prefix_tokens:]).numpy().reshape(h, w, h, w)
        # One (h × w) map per patch, laid out on the grid with a one-cell gap between maps.
        mosaic = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
        for i in range(h):
            for j in range(w):
                mosaic[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w] = sim[i, j]
        fig = new_figure(6.4, 5.6)
        ax = fig.add_subplot()
        im = ax.imshow(mosaic, cmap="viridis", vmin=float(np.nanmin(mosaic)), vmax=1,
                       interpolation="nearest")
        ax.set_xticks([j * (w + 1) + (w - 1) / 2 for j in range(w)], [str(j + 1) for j in range(w)])
        ax.set_yticks([i * (h + 1) + (h - 1) / 2 for i in range(h)], [str(i + 1) for i in range(h)])
        ax.tick_params(length=0, labelsize=8)
        ax.set_xlabel("input patch column")
        ax.set_ylabel("input patch row")
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"{name}: position embedding similarity on a {h}×{w} grid")
        fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
        return finish(fig, path)
    sim = _cosine(pe).numpy()
    fig = new_figure(5.6, 4.8)
    ax = fig.add_subplot()
    im = ax.imshow(sim, cmap="viridis", vmin=float(sim.min()), vmax=1,
                   interpolation="nearest")
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    ax.set_title(f"{name}: cos(P_i, P_j), {sim.shape[0]} positions")
    fig.colorbar(im, ax=ax, shrink=0.9, label="cosine similarity")
    return finish(fig, path)


# -- score encodings ---------------------------------------------------------------------
def _score_terms(fn: str, enc: ScoreEncoding, coords: Coordinates,
                 num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """`(bias [n_h, n_q, n_k], allowed [n_q, n_k])` of a position-only additive encoding.

    The bias is read through the one door to it, `mmpe.attention.forms.dense_bias`: the
    numbers the attention layers add, not a second evaluation of the encoding here."""
    name = name_of(enc)
    if not enc.additive:
        raise ValueError(f"{fn}: {name} rescales the attention scores instead of adding a "
                         "bias; there is no bias to plot")
    if isinstance(enc, ContentScoreEncoding):
        raise ValueError(f"{fn}: no position-only bias of {name} on {type(coords).__name__}: "
                         "it is computed from the queries and keys")
    n_q, n_k = coords.num_queries, coords.num_keys
    # the float32 bias, an int64 pair index its term computes on, and the float32 copy drawn
    check_memory(fn, num_heads * n_q * n_k * 16,
                 f"the bias [n_h={num_heads}, n_q={n_q}, n_k={n_k}] float32", coords.device,
                 "draw fewer positions (--length, a smaller grid) or fewer heads")
    # head_dim only sizes the work check: a position-only bias does not read q or k
    ctx = AttentionCall(coords, num_heads, int(getattr(enc, "head_dim", None) or 64), 1)
    with evaluating(enc):
        try:
            bias = dense_bias([enc], ctx)
        except ValueError as err:
            raise ValueError(f"{fn}: no position-only bias of {name} on "
                             f"{type(coords).__name__}: {err}") from err
    bias = bias[:1].expand(1, num_heads, n_q, n_k)[0].float().cpu().numpy()
    mask = coords.dense_mask()
    allowed = (np.ones(bias.shape[1:], dtype=bool) if mask is None
               else mask[0, 0].cpu().numpy().astype(bool))
    return bias, allowed


def _heads(fn: str, enc: ScoreEncoding, num_heads: int | None) -> int:
    built = getattr(enc, "num_heads", None)
    if num_heads is None:
        return built if isinstance(built, int) else 8
    if isinstance(built, int) and built != num_heads:
        raise ValueError(f"{fn}: {name_of(enc)} was built for num_heads={built}, got "
                         f"num_heads={num_heads}")
    return num_heads


def plot_bias_vs_distance(enc: ScoreEncoding | str, coords: Coordinates | int | None = None,
                          num_heads: int | None = None, *, max_distance: int = 128,
                          context: Mapping[str, Any] | None = None,
                          path: str | os.PathLike | None = None) -> Figure:
    """A score encoding's bias against distance, one line per head.

    A score encoding's bias against distance, one line per head (ALiBi's slopes, T5's
    buckets, KERPLE's logarithm, FIRE's learned curve).

    Args:
        enc: a built score encoding, or a registry name built with `num_heads`.
        coords: an int `max_distance`, or coordinates. Default (and with an int): a causal
            `Sequence(max_distance + 1)`, the last query against every key, so the distance is
            `0 … max_distance` tokens. On `Directed` coordinates the last query's row is
            shown; on others (grids, graphs, the sphere) the bias is averaged over all allowed
            pairs at each distance.
        num_heads: heads (default: the encoding's, else 8).
        path: write a PNG here.

    Raises:
        ValueError: not a score encoding; a rescaling or content-dependent one (Shaw, DeBERTa
            … need queries and keys); `num_heads` unlike the encoding's.
    """
    fn = "plot_bias_vs_distance"
    if isinstance(coords, int) and not isinstance(coords, bool):
        coords, max_distance = None, coords
    if coords is None:
        coords = Sequence(max_distance + 1, causal=True)
    ctx = {"num_heads": num_heads or 8, **(context or {})}
    enc = build(fn, enc, ScoreEncoding, ctx)
    num_heads = _heads(fn, enc, num_heads)
    bias, allowed = _score_terms(fn, enc, coords, num_heads)
    b, _, q, k = index_grid(1, 1, coords.num_queries, coords.num_keys, coords.device)
    dist = coords.distance(q, k, b).expand(1, 1, coords.num_queries, coords.num_keys)
    dist = dist[0, 0].float().cpu().numpy()
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    colors = head_colors(num_heads)
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
    ax.set_title(f"{name_of(enc)}: bias against distance")
    ax.grid(alpha=0.3)
    legend(ax, num_heads)
    return finish(fig, path)


def plot_bias_row(enc: ScoreEncoding | str, coords: Coordinates | None = None,
                  query: int | None = None, *, num_heads: int | None = None,
                  checkpoint: str | os.PathLike | None = None, prefix: str | None = None,
                  context: Mapping[str, Any] | None = None,
                  path: str | os.PathLike | None = None) -> Figure:
    """The bias one query puts on every key, one line per head.

    The bias one query puts on every key, one line per head (Li et al. 2024, FIRE, the
    figure of learned biases at query 128).

    Args:
        enc: a score encoding or registry name; with `checkpoint`, its parameters are read
            from there ([`load_encoding`][mmpe.checkpoints.load_encoding], `prefix` as there).
        coords: default a causal `Sequence(query + 1)`. On a 2D grid the row is drawn as a map
            per head, the query's cell marked.
        query: the query token (default 128 on the default sequence, else the last query; on a
            grid the centre cell).
        num_heads: heads (default: the encoding's, else 8).
        path: write a PNG here.

    Raises:
        ValueError: `query` outside the coordinates; not a score encoding; see
            [`plot_bias_vs_distance`][mmpe.plot.figures.plot_bias_vs_distance] and [`load_encoding`][mmpe.checkpoints.load_encoding].
    """
    fn = "plot_bias_row"
    if checkpoint is not None:
        ctx = {} if num_heads is None else {"num_heads": num_heads}
        enc = load_encoding(enc, checkpoint, prefix, context={**ctx, **(context or {})})
    enc = build(fn, enc, ScoreEncoding, {"num_heads": num_heads or 8, **(context or {})})
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
    name = name_of(enc)
    source = f" ({Path(checkpoint).name})" if checkpoint is not None else ""
    if grid2d:
        h_, w_ = coords.shape
        k = coords.prefix_tokens
        cols = min(num_heads, 4)
        rows = math.ceil(num_heads / cols)
        fig = new_figure(2.7 * cols, 2.2 * rows + 0.6)
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
        return finish(fig, path)
    keys = coords.key_positions[..., 0] if hasattr(coords, "key_positions") else None
    x = (keys[0] if keys is not None and keys.dim() == 2 else keys)
    x = np.arange(coords.num_keys) if x is None else x.float().cpu().numpy()
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    colors = head_colors(num_heads)
    for h in range(num_heads):
        ax.plot(x, row[h], color=colors[h], lw=1.4, label=f"head {h}")
    ax.axvline(float(x[query]) if query < len(x) else query, color="grey", ls=":", lw=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("bias added to the logit")
    ax.set_title(f"{name}{source}: bias at query {query}")
    ax.grid(alpha=0.3)
    legend(ax, num_heads)
    return finish(fig, path)


# -- rotary encodings --------------------------------------------------------------------
def plot_rotary_decay(encs: Any, max_distance: int = 1024, *, head_dim: int = 128,
                      qk: str = "ones", samples: int = 64, seed: int = 0,
                      context: Mapping[str, Any] | None = None, log_x: bool = False,
                      path: str | os.PathLike | None = None) -> Figure:
    """Rotated `q·k` against relative distance: RoPE's long-range decay.

    Rotated `q·k` against relative distance: the long-range decay of Su et al. 2021
    (RoFormer §3.4.3, Fig. 2), for the base RoPE and each of its scalings overlaid.

    A query at position `max_distance` and keys at `0 … max_distance` all carry the same
    vector `x` before rotation; the curve is `⟨R_m x, R_n x⟩ / h_d` against `m − n`
    (`1` at distance 0 for plain RoPE; YaRN's temperature and xPos's decay show as scale).

    Args:
        encs: a rotary encoding or registry name, a list of them, or a mapping label → encoding.
            Names are built with `context` (`head_dim` from `head_dim`).
        max_distance: the largest distance (tokens).
        head_dim: `h_d` of encodings built from names.
        qk: `"ones"` (`x = 1`) or `"random"` (the mean over `samples` Gaussian `x`).
        log_x: logarithmic distance axis.
        path: write a PNG here.

    Raises:
        ValueError: an encoding that is not rotary or does not run on 1D positions, `qk` not
            `"ones"`/`"random"`, `max_distance < 1`.
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
    fig = new_figure(6.8, 4.2)
    ax = fig.add_subplot()
    trained: set[int] = set()
    dist = np.arange(length)
    for label, enc in items:
        enc = build(fn, enc, RotaryEncoding, ctx)
        try:
            enc.check_coords(coords)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{fn}: {name_of(enc)} does not rotate 1D positions: {err}") from err
        d = int(getattr(enc, "head_dim", head_dim))
        n_h = getattr(enc, "num_heads", None)
        n_h = n_h if isinstance(n_h, int) else 1  # per-head frequencies (RoPE-Mixed): every head
        if qk == "ones":
            x = torch.ones(1, 1, 1, d)
        else:
            x = torch.randn(samples, 1, 1, d, generator=gen)
        x = x.expand(-1, n_h, length, d).contiguous()
        with evaluating(enc):
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
    return finish(fig, path)


def _label(enc: RotaryEncoding) -> str:
    parts = []
    factor = getattr(enc, "factor", None)
    if factor is not None:
        parts.append(f"s={factor:g}")
    orig = getattr(enc, "original_max_position_embeddings", None)
    if orig is not None:
        parts.append(f"L={orig}")
    return name_of(enc) + (f" ({', '.join(parts)})" if parts else "")
