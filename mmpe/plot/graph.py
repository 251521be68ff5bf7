"""Graphs coloured by their Laplacian eigenvectors: [`plot_graph_eigenvectors`][mmpe.plot.graph.plot_graph_eigenvectors]."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from mmpe.coords.graph import Graph
from mmpe.encodings.base import InputEncoding
from mmpe.molecules import molecule_layout
from mmpe.plot._common import build
from mmpe.plot.style import finish, new_figure, symmetric_limit

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["plot_graph_eigenvectors"]


def plot_graph_eigenvectors(graph: str | Graph, k: int | None = None, *, encoding: Any = None,
                            normalization: str | None = "sym",
                            path: str | os.PathLike | None = None) -> Figure:
    """A graph drawn with its nodes coloured by the first Laplacian eigenvectors.

    A graph drawn with its nodes coloured by the first Laplacian eigenvectors (LapPE's
    positions, Dwivedi & Bresson 2020), one panel per eigenvector, eigenvalue in the title.

    Args:
        graph: a SMILES string (drawn with RDKit's 2D depiction, atoms labelled) or a
            [`Graph`][mmpe.coords.graph.Graph] (its first graph, laid out with networkx).
        k: eigenvectors (default: the encoding's `k`, else 4; at most 8 are drawn).
        encoding: optional `lappe` encoding (or name) whose `k` and `normalization` to use.
        normalization: `"sym"` or `None` (`D − A`), unless `encoding` sets it.
        path: write a PNG here.

    Raises:
        ValueError: an invalid SMILES string, `k < 1`. TypeError: `graph` of another type.
        ImportError: RDKit (SMILES) or networkx (a `Graph`) not installed.
    """
    from mmpe.graph_maths import adjacency, laplacian_eigenvectors

    fn = "plot_graph_eigenvectors"
    if encoding is not None:
        encoding = build(fn, encoding, InputEncoding, {"d_model": 64})
        k = getattr(encoding, "k", None) if k is None else k
        normalization = getattr(encoding, "normalization", normalization)
    k = 4 if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{fn}: k must be an int >= 1, got {k!r}")
    orders: list[float] | None = None
    if isinstance(graph, str):
        edge_index, n, xy, labels, orders = molecule_layout(graph, fn)
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
    fig = new_figure(3.0 * cols + 0.6, 3.0 * rows + 0.5)
    lim = symmetric_limit(vecs[:, :shown])
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
    return finish(fig, path)
