"""What an encoding does, seen from one token.

What an encoding does, seen from one token: the figures of the docs' modality pages and of
the attention gallery, drawn from closed forms and freshly built encodings (no training).

| function | figure |
| --- | --- |
| [`query_values`][mmpe.plot.gallery.query_values] | (no figure) what one query sees of every key from position alone |
| [`plot_query_maps`][mmpe.plot.gallery.plot_query_maps] | that, over a 2D grid (a panel per encoding) or a `T × H × W` video grid (a row per encoding, a column per frame) |
| [`plot_sphere_maps`][mmpe.plot.gallery.plot_sphere_maps] | that, on a world map, from one point |
| [`plot_bias_gallery`][mmpe.plot.gallery.plot_bias_gallery] | the content-free bias matrix of score encodings on one coordinate type |
| [`plot_molecule_positions`][mmpe.plot.gallery.plot_molecule_positions] | a molecule coloured by LapPE, RWSE and the shortest-path distance from one atom |
| [`plot_feature_graph`][mmpe.plot.gallery.plot_feature_graph] | a table's feature graph coloured by Tab-PET's spectral positions |
| [`plot_distance_kernels`][mmpe.plot.gallery.plot_distance_kernels] | the distance kernels of `gaussian_distance`, `radial_gaussian`, `radial_bessel` |
| [`plot_trained_attention`][mmpe.plot.gallery.plot_trained_attention] | attention maps of trained models: the encodings side by side, a row per layer |

"What one query sees" is, per hook: the bias a score encoding adds to the logit (mean over
heads), the rotated `⟨R_q x, R_k x⟩ / h_d` of a rotary encoding for `x = 1` (RoFormer's
decay, in any number of axes), the cosine similarity of an input encoding's position vectors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.grid import Grid
from mmpe.coords.sphere import Sphere
from mmpe.encodings.base import AttentionCall, InputEncoding, RotaryEncoding, ScoreEncoding
from mmpe.plot._common import evaluating, name_of, positions
from mmpe.plot.figures import _cosine, _score_terms
from mmpe.plot.style import DIVERGING, finish, new_figure, readable_on, symmetric_limit

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_bias_gallery", "plot_distance_kernels", "plot_feature_graph",
           "plot_molecule_positions", "plot_query_maps", "plot_sphere_maps", "query_values"]


def query_values(enc: Any, coords: Coordinates, query: int, *, num_heads: int = 4) -> np.ndarray:
    """What token `query` sees of every key from position alone, `[n_k]` (NaN where masked).

    Args:
        enc: a built score, rotary or input encoding.
        coords: the tokens.
        query: the query's token index.
        num_heads: heads of a score encoding's bias (averaged).

    Raises:
        ValueError: a kernel encoding, or a score encoding without a position-only bias.
    """
    if isinstance(enc, ScoreEncoding):
        return _bias_row(enc, coords, query, num_heads)
    if isinstance(enc, RotaryEncoding):
        n_h = enc.num_heads if isinstance(getattr(enc, "num_heads", None), int) else 1
        x = torch.ones(1, n_h, coords.num_keys, enc.head_dim)
        with evaluating(enc):
            q, k = enc(x, x.clone(), coords)
        return ((q[0, :, query] * k[0]).sum(-1).mean(0) / enc.head_dim).double().numpy()
    if isinstance(enc, InputEncoding):
        return _cosine(positions(enc, coords))[query].double().numpy()
    raise ValueError(f"query_values: {name_of(enc)} replaces the softmax; it adds nothing to "
                     "look at from one query")


def _bias_row(enc: ScoreEncoding, coords: Coordinates, query: int, num_heads: int) -> np.ndarray:
    """One query's row of the position-only bias, mean over heads: the door's rows of that
    query alone (`mmpe.attention.forms.rows`, after the term's check: a 4,050-cell world map
    has 16 M pairs)."""
    from mmpe.attention import forms
    from mmpe.functional import mask_mod

    heads = enc.num_heads if isinstance(getattr(enc, "num_heads", None), int) else num_heads
    if not enc.additive:
        raise ValueError(f"query_values: {name_of(enc)} rescales the scores; no bias to show")
    if not enc.content_free:
        raise ValueError(f"query_values: {name_of(enc)} has no position-only bias to show: it "
                         "is computed from the queries and keys")
    ctx = AttentionCall(coords, heads, int(getattr(enc, "head_dim", None) or 64), 1)
    enc.check_call(ctx)
    ctx = replace(ctx, checked=True)
    b, h, _, k = index_grid(1, heads, 1, coords.num_keys, coords.device)
    q = torch.full((1, 1, 1, 1), query, dtype=torch.long, device=coords.device)
    with evaluating(enc), torch.no_grad():
        row = forms.rows(enc, ctx, query, query + 1).expand(1, heads, 1, coords.num_keys)
        masked = mask_mod(coords)
        allowed = torch.ones(coords.num_keys, dtype=torch.bool) if masked is None \
            else masked(b, h, q, k).expand(1, 1, 1, coords.num_keys).reshape(-1)
    row = row[0, :, 0].double().mean(0).cpu().numpy()
    return np.where(allowed.cpu().numpy(), row, np.nan)


def _what(enc: Any) -> str:
    if isinstance(enc, ScoreEncoding):
        return "bias (mean over heads)"
    return "⟨R_q 1, R_k 1⟩ / h_d" if isinstance(enc, RotaryEncoding) else "cosine similarity"


def _image(ax: Axes, values: np.ndarray, title: str, *, diverging: bool) -> Any:
    """One heatmap panel: diverging colours centred on 0 for signed values, else viridis."""
    if diverging:
        lim = symmetric_limit(values)
        im = ax.imshow(values, cmap=DIVERGING, vmin=-lim, vmax=lim)
    else:
        im = ax.imshow(values, cmap="viridis")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    return im


def plot_query_maps(encodings: Mapping[str, Any], coords: Grid, query: int | None = None, *,
                    path: str | os.PathLike | None = None) -> Figure:
    """One query's values over a grid, a panel per encoding.

    [`query_values`][mmpe.plot.gallery.query_values] of one query over a grid without
    prefix tokens: a panel per encoding on a 2D grid, a row per encoding and a column per frame
    on a `T × H × W` grid. The query (default: the middle cell) is marked with a cross.

    Raises:
        ValueError: a grid of another rank, or one with prefix tokens.
    """
    shape = tuple(coords.shape)
    if len(shape) not in (2, 3) or coords.prefix_tokens:
        raise ValueError(f"plot_query_maps: a 2D or 3D grid without prefix tokens, got {coords}")
    query = coords.num_tokens // 2 + (shape[-1] // 2 if len(shape) == 2 else 0) \
        if query is None else query
    where = np.unravel_index(query, shape)
    frames = shape[0] if len(shape) == 3 else 1
    # 2D: two panels a row, so that each two-line title and colour bar fits a docs column
    rows, cols = (len(encodings), frames) if frames > 1 else \
        (math.ceil(len(encodings) / 2), min(2, len(encodings)))
    fig = new_figure(3.4 * cols + 0.2 if frames == 1 else 2.3 * cols + 0.8,
                     2.9 * rows + 0.2 if frames == 1 else 2.4 * rows + 0.4)
    axes = np.asarray(fig.subplots(rows, cols, squeeze=False))
    for ax in axes.flat[len(encodings):] if frames == 1 else ():
        ax.set_visible(False)  # (an odd count leaves one cell empty)
    for i, (label, enc) in enumerate(encodings.items()):
        values = query_values(enc, coords, query).reshape(shape)
        diverging = bool(np.nanmin(values) < 0)
        for t in range(frames):
            ax = axes[i, t] if frames > 1 else axes.flat[i]
            panel = values[t] if frames > 1 else values
            title = f"{label}, frame {t}" if frames > 1 else f"{label}\n{_what(enc)}"
            im = _image(ax, panel, title, diverging=diverging)
            if frames == 1 or t == where[0]:
                ax.plot(where[-1], where[-2], "x", color="white", ms=8, mew=2)
        fig.colorbar(im, ax=axes[i, :] if frames > 1 else axes.flat[i], shrink=0.8)
    return finish(fig, path)


def plot_sphere_maps(encodings: Mapping[str, Any], lat: float = 48.9, lon: float = 2.4, *,
                     n_lat: int = 45, n_lon: int = 90,
                     path: str | os.PathLike | None = None) -> Figure:
    """One grid cell's values on a world map, a panel per encoding.

    [`query_values`][mmpe.plot.gallery.query_values] of the grid cell nearest to
    `(lat, lon)` (degrees; default Paris) on an `n_lat × n_lon` world map, a panel per
    encoding, with coastlines where cartopy has them."""
    from mmpe.plot.sphere import _coastlines

    coords = Sphere.grid(n_lat, n_lon)
    lats = coords.lat.reshape(-1).rad2deg().numpy()
    lons = coords.lon.reshape(-1).rad2deg().numpy()
    query = int(np.argmin((lats - lat) ** 2 + ((lons - lon + 180) % 360 - 180) ** 2))
    projection = _coastlines()
    cols = min(3, len(encodings))
    rows = math.ceil(len(encodings) / cols)
    fig = new_figure(4.2 * cols, 3.0 * rows + 0.3)
    for i, (label, enc) in enumerate(encodings.items()):
        kw = {"projection": projection} if projection is not None else {}
        ax = fig.add_subplot(rows, cols, i + 1, **kw)
        values = query_values(enc, coords, query).reshape(n_lat, n_lon)
        extent = (-180, 180 - 360 / n_lon, -90, 90)
        lim = symmetric_limit(values) if np.nanmin(values) < 0 else None
        im = ax.imshow(values, origin="lower", extent=extent, cmap=DIVERGING if lim else "viridis",
                       vmin=-lim if lim else None, vmax=lim,
                       **({"transform": projection} if projection is not None else {}))
        if projection is not None:
            ax.coastlines(lw=0.5)
        else:  # degrees, few enough ticks for a small map
            ax.set_xticks([-120, 0, 120])
            ax.set_yticks([-60, 0, 60])
        ax.plot(lons[query], lats[query], "x", color="black", ms=8, mew=2,
                **({"transform": projection} if projection is not None else {}))
        ax.set_title(f"{label}\n{_what(enc)}", fontsize=9)
        # below the map: a title wider than a 2:1 map ran under a colorbar at its side
        bar = fig.colorbar(im, ax=ax, shrink=0.75, location="bottom")
        bar.ax.locator_params(nbins=3)  # a short bar: ticks that do not touch
    return finish(fig, path)


def has_position_bias(enc: Any, coords: Coordinates) -> bool:
    """Whether `enc` has a content-free bias on `coords` to draw.

    Whether `enc` has a content-free bias on `coords` to draw (Shaw, DeBERTa, CoPE … compute
    theirs from the queries and keys: [`plot_bias_gallery`][mmpe.plot.gallery.plot_bias_gallery]
    gives them a panel saying so)."""
    heads = enc.num_heads if isinstance(getattr(enc, "num_heads", None), int) else 4
    try:
        _score_terms("has_position_bias", enc, coords, heads)
    except ValueError:
        return False
    return True


def plot_bias_gallery(encodings: Mapping[str, Any], coords: Coordinates, *, title: str = "",
                      cols: int = 6, path: str | os.PathLike | None = None) -> Figure:
    """The content-free bias of score encodings on `coords`, a panel each.

    The content-free bias `[n_q, n_k]` (mean over heads) of score encodings on `coords`, a
    panel each; masked pairs blank. Encodings with no position-only bias (they need the
    queries and keys: Shaw, DeBERTa, CoPE …) get a panel saying so."""
    cols = max(1, min(cols, len(encodings)))
    rows = math.ceil(len(encodings) / cols)
    fig = new_figure(2.2 * cols, 2.3 * rows + (0.4 if title else 0))
    for i, (label, enc) in enumerate(encodings.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        heads = enc.num_heads if isinstance(getattr(enc, "num_heads", None), int) else 4
        try:
            bias, allowed = _score_terms("plot_bias_gallery", enc, coords, heads)
        except ValueError:
            ax.text(0.5, 0.5, "needs queries\nand keys", ha="center", va="center", fontsize=8)
            ax.set_title(label, fontsize=9)
            ax.set_axis_off()
            continue
        values = np.where(allowed, bias.mean(0), np.nan)
        _image(ax, values, label, diverging=True)
    if title:
        fig.suptitle(title)
    return finish(fig, path)


def plot_trained_attention(maps: Mapping[str, np.ndarray], *, heads: Mapping[str, list] | None = None,
                           title: str = "", path: str | os.PathLike | None = None) -> Figure:
    """Attention weights of trained models, side by side.

    Attention weights of trained models, `maps[name]` `[layers, n_q, n_k]` (one head per
    layer, rows summing to 1): the encodings side by side in columns, a row per layer, query
    down and key across, on a square-root colour scale (weak long-range attention stays
    visible).

    Raises:
        ValueError: no maps, or a map that is not `[layers, n_q, n_k]`.
    """
    if not maps:
        raise ValueError("plot_trained_attention: maps is empty")
    for name, m in maps.items():
        if np.ndim(m) != 3:
            raise ValueError(f"plot_trained_attention: maps[{name!r}] must be [layers, n_q, n_k], "
                             f"got shape {np.shape(m)}")
    from matplotlib.colors import PowerNorm

    layers, cols = max(np.shape(m)[0] for m in maps.values()), len(maps)
    fig = new_figure(2.0 * cols + 0.9, 2.1 * layers + (0.5 if title else 0.2))
    for c, (name, m) in enumerate(maps.items()):
        for layer in range(np.shape(m)[0]):
            ax = fig.add_subplot(layers, cols, layer * cols + c + 1)
            im = ax.imshow(np.asarray(m[layer], dtype=np.float32), cmap="magma",
                           norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), interpolation="nearest")
            head = f" (head {heads[name][layer]})" if heads and name in heads else ""
            ax.set_title(f"{name}: layer {layer + 1}{head}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    # one label per axis for the whole grid (a label per row was drawn past the left edge)
    fig.supylabel("query (down)", fontsize=8)
    fig.supxlabel("key (across)", fontsize=8)
    fig.colorbar(im, ax=fig.axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    return finish(fig, path)


def _draw_molecule(ax: Axes, xy: np.ndarray, edges: np.ndarray, values: np.ndarray,
                   title: str, *, cmap: str = DIVERGING, labels: list[str] | None = None) -> None:
    """Bonds as grey lines, atoms as discs coloured by `values`."""
    for u, v in edges.T:
        ax.plot(xy[[u, v], 0], xy[[u, v], 1], color="0.6", lw=1.5, zorder=1)
    signed = cmap == DIVERGING
    lim = symmetric_limit(values) if signed else None
    sc = ax.scatter(xy[:, 0], xy[:, 1], c=values, cmap=cmap, s=260, zorder=2,
                    vmin=-lim if signed else None, vmax=lim, edgecolors="black", linewidths=0.5)
    discs = sc.to_rgba(np.asarray(values))
    for i, label in enumerate(labels or []):
        if len(label) <= 2:  # fits its disc: in the colour that reads on the disc
            ax.annotate(label, xy[i], ha="center", va="center", fontsize=8, zorder=3,
                        color=readable_on(discs[i]))
        else:  # wider than a disc: beside it, away from the centre, on the page
            away = xy[i] - xy.mean(axis=0)
            away = away / (np.linalg.norm(away) or 1.0)
            ax.annotate(label, xy[i], xytext=(13 * away[0], 13 * away[1]),
                        textcoords="offset points", fontsize=8, zorder=3,
                        ha="left" if away[0] > 0.3 else "right" if away[0] < -0.3 else "center",
                        va="bottom" if away[1] > 0.3 else "top" if away[1] < -0.3 else "center")
    if any(len(label) > 2 for label in labels or []):
        ax.margins(0.3)  # room for the labels beside the outer discs
    ax.set_title(title, fontsize=9)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.figure.colorbar(sc, ax=ax, shrink=0.7)


def plot_molecule_positions(smiles: str, atom: int = 0, *, k: int = 2, walk: int = 4,
                            path: str | os.PathLike | None = None) -> Figure:
    """A molecule coloured by its LapPE, RWSE and spectral positions.

    A molecule (SMILES, RDKit's 2D depiction) coloured by its first `k` LapPE eigenvectors,
    by RWSE's return probability after `walk` steps, and by the shortest-path distance (hops)
    from `atom`, the index of Graphormer's spatial bias for that atom's row."""
    from mmpe.graph_maths import (
        adjacency,
        laplacian_eigenvectors,
        random_walk_pe,
        shortest_path_hops,
    )
    from mmpe.molecules import molecule_layout

    edge_index, n, xy, labels, _ = molecule_layout(smiles, "plot_molecule_positions")
    edges = np.asarray(edge_index)
    _, vecs = laplacian_eigenvectors(adjacency(edges, n), k)
    rwse = random_walk_pe(edges, n, walk)[:, walk - 1]
    hops = shortest_path_hops(edges, n)[atom]
    cols = 2  # two panels a row: readable at a page's text width
    rows = math.ceil((k + 2) / cols)
    fig = new_figure(3.4 * cols, 3.2 * rows + 0.3)
    axes = fig.subplots(rows, cols).ravel()
    for ax in axes[k + 2:]:
        ax.set_axis_off()
    xy = np.asarray(xy)
    for j in range(k):
        _draw_molecule(axes[j], xy, edges, vecs[:, j], f"LapPE eigenvector {j + 1}")
    _draw_molecule(axes[k], xy, edges, rwse, f"RWSE: return probability, {walk} steps",
                   cmap="viridis")
    _draw_molecule(axes[k + 1], xy, edges, hops, f"hops from atom {atom} (Graphormer SPD)",
                   cmap="viridis_r", labels=[str(int(h)) for h in hops])
    fig.suptitle(smiles, fontsize=9)
    return finish(fig, path)


def plot_feature_graph(table: Any, *, path: str | os.PathLike | None = None) -> Figure:
    """A table's feature graph, nodes coloured by their spectral positions.

    A [`Table`][mmpe.coords.table.Table]'s feature graph (features on a circle, edge width
    ∝ weight), nodes coloured by the first two spectral positions Tab-PET concatenates to the
    feature tokens, next to the hop distances between features (`f` where no path joins them,
    as the coordinates store it)."""
    import networkx as nx

    adjacency = table.adjacency.cpu().numpy()
    graph = nx.from_numpy_array(adjacency)
    layout = nx.circular_layout(graph)  # disconnected groups stay apart and readable
    xy = np.array([layout[i] for i in range(table.num_features)])
    names = table.feature_names or [f"x{i}" for i in range(table.num_features)]
    pos = table.spectral_positions[table.cls_token * 1:].cpu().numpy()
    fig = new_figure(11, 3.6)
    axes = fig.subplots(1, 3)
    for j in range(2):
        ax = axes[j]
        nx.draw_networkx_edges(graph, layout, ax=ax, edge_color="0.6",
                               width=[2 * d["weight"] for _, _, d in graph.edges(data=True)])
        _draw_molecule(ax, xy, np.zeros((2, 0), dtype=int), pos[:, j],
                       f"Tab-PET spectral\nposition {j + 1}", labels=names)
    hops = table.hops[int(table.cls_token):, int(table.cls_token):].cpu().numpy()
    _image(axes[2], hops, f"hops between features\n({table.num_features}: no path)",
           diverging=False)
    axes[2].set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    axes[2].set_yticks(range(len(names)), names, fontsize=7)
    fig.colorbar(axes[2].images[0], ax=axes[2], shrink=0.7)
    return finish(fig, path)


def plot_distance_kernels(cutoff: float = 5.0, *, num_kernels: int = 8,
                          path: str | os.PathLike | None = None) -> Figure:
    """The distance features of the 3D score encodings against distance.

    The distance features the 3D score encodings map to a per-head bias, against distance
    (Å): `gaussian_distance`'s kernels at their initialisation (seed 0), `radial_gaussian`'s
    RBFs × cosine cutoff, `radial_bessel`'s Bessel functions × polynomial envelope."""
    from mmpe import registry
    from mmpe.encodings.gaussian_distance import gaussian_basis
    from mmpe.encodings.radial_basis import (
        bessel_rbf,
        cosine_cutoff,
        gaussian_rbf,
        polynomial_envelope,
    )

    torch.manual_seed(0)
    enc = registry.build("gaussian_distance", num_heads=4, num_kernels=num_kernels)
    d = torch.linspace(0.0, cutoff * 1.2, 400)
    centers = torch.linspace(0.0, cutoff, num_kernels)
    panels = {  # (name, then formula: one line each fits a third of a docs column)
        "gaussian_distance\nψ_k(d), learned μ, σ (init)":
            gaussian_basis(d, enc.means.detach(), enc.stds.detach()),
        "radial_gaussian\nRBF × cosine cutoff":
            gaussian_rbf(d, centers, 10.0 / cutoff) * cosine_cutoff(d, cutoff)[:, None],
        "radial_bessel\nsin(kπd/c)/d × envelope":
            bessel_rbf(d, cutoff, num_kernels)
            * polynomial_envelope((d / cutoff).clamp(max=1.0))[:, None],
    }
    fig = new_figure(6.9, 2.9)
    for i, (title, values) in enumerate(panels.items()):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.plot(d.numpy(), values.detach().numpy(), lw=1.2)
        ax.axvline(cutoff, color="grey", ls=":", lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("distance d (Å)")
        ax.grid(alpha=0.3)
    return finish(fig, path)
