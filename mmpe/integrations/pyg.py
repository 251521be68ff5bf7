"""PyTorch Geometric integration: transforms that attach graph positions, and a layer.

Transforms (``torch_geometric.transforms.BaseTransform`` subclasses, with functional names as
PyG registers its own) compute per graph with the functions of :mod:`mmpe.graph_maths` and
store the result on a copy of the ``Data`` object (``BaseTransform.__call__`` copies it first;
the input is left unchanged), so they run once as a dataset ``pre_transform`` and batch with
PyG's ``DataLoader``. :class:`mmpe.coords.Graph` reads them only when told where they are:
``Graph.from_pyg(batch, **graph_kwargs(pre))`` (or the same keywords written out, e.g.
``Graph.from_pyg(batch, rwse="random_walk_pe")``). Every transform takes the attribute name it
writes (``attr_name``), and :func:`graph_kwargs` passes those names on:

==========================  ==============================  ===================================
transform                   functional name                 attributes (default ``attr_name``)
==========================  ==============================  ===================================
:class:`AddShortestPaths`   ``mmpe_shortest_paths``         ``spd [n²]``, ``spd_index [2, n²]``
                                                            (+ ``spd_edge_attr [n², P, F]``,
                                                            ``spd_edge_mask [n², P]``)
:class:`AddLaplacianPE`     ``mmpe_laplacian_pe``           ``laplacian_eigenvector_pe [n, k]``
:class:`AddRWSE`            ``mmpe_rwse``                   ``random_walk_pe [n, k]``
:class:`AddDegree`          ``mmpe_degree``                 ``in_degree [n]``, ``out_degree [n]``
==========================  ==============================  ===================================

``spd`` holds hop counts, −1 for unreachable pairs; ``spd_index`` names the pairs (its name
contains "index", so PyG offsets it by the node count when batching; for the same reason an
``attr_name`` may not contain "index", "batch" or "face"). The default names of LapPE and RWSE
are PyG's own, so the output of PyG's ``AddLaplacianEigenvectorPE``/``AddRandomWalkPE`` can be
read too: ``Graph.from_pyg(batch, rwse="random_walk_pe")`` (mmpe's LapPE has deterministic
signs; PyG's are random).

    from torch_geometric.transforms import Compose
    from torch_geometric.loader import DataLoader
    pre = Compose([AddShortestPaths(edge_hops=5), AddLaplacianPE(8), AddRWSE(16), AddDegree()])
    graphs = [pre(from_smiles(s)) for s in smiles]
    layer = GraphTransformer(64, 4, depth=2, encodings=["rwse", "graphormer"],
                             precomputed=graph_kwargs(pre))
    for batch in DataLoader(graphs, batch_size=32):
        h = layer(x_embed(batch.x), batch.edge_index, batch.batch, data=batch)   # [N, 64]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from mmpe.coords.graph import PRECOMPUTED, Graph
from mmpe.graph_maths import (
    degrees,
    laplacian_pe,
    path_edge_features,
    random_walk_pe,
    shortest_path_hops,
)
from mmpe.transformer import EncodingSpec, Transformer

__all__ = ["AddDegree", "AddLaplacianPE", "AddRWSE", "AddShortestPaths", "GraphTransformer",
           "graph_kwargs"]

#: Substrings that make PyG's batching offset or re-concatenate an attribute (``Data.__inc__``,
#: ``Data.__cat_dim__``): an ``attr_name`` must avoid them.
_RESERVED = ("index", "batch", "face")


def _check_name(owner: str, arg: str, name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{owner}: {arg} must be a Python identifier (an attribute name), got {name!r}")
    bad = [r for r in _RESERVED if r in name]
    if bad:
        raise ValueError(f"{owner}: {arg}={name!r} contains {bad[0]!r}, which makes PyG offset or "
                         "re-concatenate the attribute when batching; choose another name")
    return name


def _one_graph(data: Data, owner: str) -> tuple[np.ndarray, int]:
    """``(edge_index [2, E] numpy, num_nodes)`` of one graph, or an error."""
    if getattr(data, "batch", None) is not None:
        raise ValueError(f"{owner}: mmpe transforms work on one graph (a Data object), not on a Batch")
    if getattr(data, "edge_index", None) is None or data.num_nodes is None:
        raise ValueError(f"{owner}: data needs edge_index and num_nodes")
    return data.edge_index.detach().cpu().numpy(), int(data.num_nodes)


class _GraphTransform(BaseTransform):
    """Base of the mmpe transforms: :attr:`graph_kwargs` says where the results are stored."""

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        """The :meth:`mmpe.coords.Graph.from_pyg` keywords that read this transform's output."""
        raise NotImplementedError


@functional_transform("mmpe_shortest_paths")
class AddShortestPaths(_GraphTransform):
    """Attach all-pairs shortest-path hops and, with ``edge_hops > 0``, the edge features along
    each path (Graphormer's spatial and edge encodings, Ying et al. 2021 eqs. 6-7, read them).

    Writes ``{attr_name} [n²]`` (hops, unclipped, −1: unreachable; int64; from
    :func:`mmpe.graph_maths.shortest_path_hops`), ``{attr_name}_index [2, n²]`` (the pairs),
    and with ``edge_hops``: ``{attr_name}_edge_attr [n², edge_hops, F]`` and
    ``{attr_name}_edge_mask [n², edge_hops]`` (:func:`mmpe.graph_maths.path_edge_features`).

    Args:
        edge_hops: path edges stored per pair (0: none).
        attr_name: base name of the attributes (``"spd"``).
        undirected: treat edges as undirected.

    Raises:
        ValueError: ``edge_hops < 0``; a bad ``attr_name``; at call, a Batch, or
            ``edge_hops > 0`` on a graph without ``edge_attr``.
    """

    def __init__(self, edge_hops: int = 0, attr_name: str = "spd", undirected: bool = True) -> None:
        if isinstance(edge_hops, bool) or not isinstance(edge_hops, int) or edge_hops < 0:
            raise ValueError(f"AddShortestPaths: edge_hops must be an int >= 0, got {edge_hops!r}")
        self.edge_hops, self.undirected = edge_hops, bool(undirected)
        self.attr_name = _check_name("AddShortestPaths", "attr_name", attr_name)

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        out = {"spd": self.attr_name, "spd_index": f"{self.attr_name}_index"}
        if self.edge_hops:
            out.update(path_edge_attr=f"{self.attr_name}_edge_attr",
                       path_edge_mask=f"{self.attr_name}_edge_mask")
        return out

    def forward(self, data: Data) -> Data:
        ei, n = _one_graph(data, "AddShortestPaths")
        paths = shortest_path_hops(ei, n, self.undirected, return_predecessors=True)
        hops = paths[0]
        ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        data[self.attr_name] = torch.from_numpy(np.where(np.isinf(hops), -1, hops)).long().flatten()
        data[f"{self.attr_name}_index"] = torch.stack([ii.flatten(), jj.flatten()])
        if self.edge_hops:
            edge_attr = getattr(data, "edge_attr", None)
            if edge_attr is None:
                raise ValueError("AddShortestPaths: edge_hops > 0 needs edge_attr on the graph")
            attr, valid = path_edge_features(ei, edge_attr, n, self.edge_hops,
                                             undirected=self.undirected, paths=paths)
            data[f"{self.attr_name}_edge_attr"] = attr.reshape(n * n, self.edge_hops, -1).cpu()
            data[f"{self.attr_name}_edge_mask"] = valid.reshape(n * n, self.edge_hops).cpu()
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(edge_hops={self.edge_hops}, attr_name={self.attr_name!r})"


@functional_transform("mmpe_laplacian_pe")
class AddLaplacianPE(_GraphTransform):
    """Attach ``k`` Laplacian eigenvectors ``[n, k]`` float32 as ``attr_name``
    (:func:`mmpe.graph_maths.laplacian_pe`: LapPE, Dwivedi & Bresson 2020; deterministic
    signs, zero columns when the graph has fewer than ``k + 1`` nodes).

    Raises:
        ValueError: ``k < 1``, an unknown ``normalization``, a bad ``attr_name``.
    """

    def __init__(self, k: int, normalization: str | None = "sym",
                 attr_name: str = "laplacian_eigenvector_pe") -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"AddLaplacianPE: k must be an int >= 1, got {k!r}")
        if normalization not in ("sym", None):
            raise ValueError(f"AddLaplacianPE: normalization must be 'sym' or None, got {normalization!r}")
        self.k, self.normalization = k, normalization
        self.attr_name = _check_name("AddLaplacianPE", "attr_name", attr_name)

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        return {"laplacian_pe": self.attr_name, "laplacian_normalization": self.normalization}

    def forward(self, data: Data) -> Data:
        ei, n = _one_graph(data, "AddLaplacianPE")
        vecs, _ = laplacian_pe(ei, n, self.k, self.normalization)
        data[self.attr_name] = torch.from_numpy(vecs).float()
        return data

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(k={self.k}, normalization={self.normalization!r}, "
                f"attr_name={self.attr_name!r})")


@functional_transform("mmpe_rwse")
class AddRWSE(_GraphTransform):
    """Attach random-walk return probabilities ``[n, k]`` float32 as ``attr_name``
    (:func:`mmpe.graph_maths.random_walk_pe`: RWSE, Dwivedi et al. 2022).

    Raises:
        ValueError: ``k < 1``, a bad ``attr_name``.
    """

    def __init__(self, k: int, attr_name: str = "random_walk_pe") -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"AddRWSE: k must be an int >= 1, got {k!r}")
        self.k = k
        self.attr_name = _check_name("AddRWSE", "attr_name", attr_name)

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        return {"rwse": self.attr_name}

    def forward(self, data: Data) -> Data:
        ei, n = _one_graph(data, "AddRWSE")
        data[self.attr_name] = torch.from_numpy(random_walk_pe(ei, n, self.k)).float()
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, attr_name={self.attr_name!r})"


@functional_transform("mmpe_degree")
class AddDegree(_GraphTransform):
    """Attach in- and out-degrees ``[n]`` (int64, duplicate edges counted once;
    :func:`mmpe.graph_maths.degrees`) as ``in_attr_name`` and ``out_attr_name``.

    Raises:
        ValueError: a bad attribute name.
    """

    def __init__(self, in_attr_name: str = "in_degree", out_attr_name: str = "out_degree") -> None:
        self.in_attr_name = _check_name("AddDegree", "in_attr_name", in_attr_name)
        self.out_attr_name = _check_name("AddDegree", "out_attr_name", out_attr_name)

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        return {"in_degree": self.in_attr_name, "out_degree": self.out_attr_name}

    def forward(self, data: Data) -> Data:
        ei, n = _one_graph(data, "AddDegree")
        in_deg, out_deg = degrees(ei, n)
        data[self.in_attr_name] = torch.from_numpy(in_deg)
        data[self.out_attr_name] = torch.from_numpy(out_deg)
        return data

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(in_attr_name={self.in_attr_name!r}, "
                f"out_attr_name={self.out_attr_name!r})")


def graph_kwargs(*transforms: Any) -> dict[str, Any]:
    """The :meth:`mmpe.coords.Graph.from_pyg` keywords that read what ``transforms`` attached.

    Args:
        *transforms: mmpe transforms, PyG's ``AddRandomWalkPE``/``AddLaplacianEigenvectorPE``
            (with an ``attr_name``), ``Compose`` objects of them, or lists of either (other
            transforms are skipped).

    Returns:
        e.g. ``{"spd": "spd", "spd_index": "spd_index", "rwse": "random_walk_pe", …}``.

    Raises:
        ValueError: two transforms writing the same member.
        TypeError: an argument that is not a transform.
    """
    out: dict[str, Any] = {}

    from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE

    def add(items: Mapping[str, Any]) -> None:
        for key, value in items.items():
            if key in out and key != "laplacian_normalization":
                raise ValueError(f"graph_kwargs: two transforms write {key} "
                                 f"({out[key]!r} and {value!r})")
            out[key] = value

    def walk(t: Any) -> None:
        if isinstance(t, _GraphTransform):
            add(t.graph_kwargs)
        elif isinstance(t, AddRandomWalkPE) and t.attr_name is not None:
            add({"rwse": t.attr_name})
        elif isinstance(t, AddLaplacianEigenvectorPE) and t.attr_name is not None:
            add({"laplacian_pe": t.attr_name, "laplacian_normalization": "sym"})
        elif isinstance(t, (list, tuple)):
            for inner in t:
                walk(inner)
        elif isinstance(getattr(t, "transforms", None), Iterable):  # Compose, ComposeFilters
            for inner in t.transforms:
                walk(inner)
        elif not callable(t):
            raise TypeError(f"graph_kwargs: expected transforms, got {type(t).__name__}")

    for t in transforms:
        walk(t)
    return out


class GraphTransformer(nn.Module):
    """A stack of mmpe transformer blocks on PyG-style inputs: ``(x, edge_index, batch)``.

    Builds :class:`mmpe.coords.Graph` coordinates (with ``data``: by
    :meth:`~mmpe.coords.Graph.from_pyg`, reading the precomputed attributes ``precomputed``
    names), pads the nodes to ``[b, n_max, d]``, runs
    :class:`mmpe.transformer.Transformer` with the given encodings (any registry names that
    support ``"graph"``: ``lappe``, ``rwse``, ``graphormer``, ``graphormer_centrality``,
    ``alibi``, ``t5``, ``fire`` …) and returns node features in PyG order.

    Args:
        d_model, num_heads, depth: transformer size.
        encodings: registry names / config dicts / built encodings.
        max_distance: hop clip of the coordinates.
        precomputed: :meth:`~mmpe.coords.Graph.from_pyg` keywords naming the attributes of
            ``data`` that hold precomputed values (:func:`graph_kwargs` of the transforms that
            attached them); None computes everything. Used only with ``data``.
        **kwargs: passed to :class:`~mmpe.transformer.Transformer` (``mlp_ratio``, ``dropout`` …).

    Shapes: ``forward(x [N, d_model], edge_index [2, E], batch [N] | None, edge_attr [E, F] |
    None, data=None) -> [N, d_model]``.

    Raises:
        ValueError: ``x`` not ``[N, d_model]``; ``precomputed`` names without ``data``; the
            errors of :meth:`~mmpe.coords.Graph.from_pyg` (a name ``data`` lacks).
    """

    def __init__(self, d_model: int, num_heads: int, depth: int = 1,
                 encodings: Sequence[EncodingSpec] = (), max_distance: int = 20,
                 precomputed: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.precomputed = dict(precomputed or {})
        unknown = set(self.precomputed) - {*PRECOMPUTED, "laplacian_normalization", "edge_attr"}
        if unknown:
            raise ValueError(f"GraphTransformer: precomputed has unknown keys {sorted(unknown)}")
        self.transformer = Transformer(d_model, num_heads, depth, encodings, **kwargs)

    def coords(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None,
               edge_attr: Tensor | None = None, data: Data | None = None) -> Graph:
        """The :class:`~mmpe.coords.Graph` the layer attends over."""
        if data is not None:
            return Graph.from_pyg(data, **self.precomputed, max_distance=self.max_distance,
                                  device=x.device)
        if set(self.precomputed) - {"laplacian_normalization"}:
            raise ValueError("GraphTransformer: the layer reads precomputed values "
                             f"({sorted(self.precomputed)}) from data; pass data=")
        return Graph(edge_index, x.shape[0], batch, edge_attr=edge_attr,
                     max_distance=self.max_distance, device=x.device)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None,
                edge_attr: Tensor | None = None, data: Data | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"GraphTransformer: x must be [num_nodes, d_model], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        coords = self.coords(x, edge_index, batch, edge_attr, data)
        return coords.unpad_nodes(self.transformer(coords.pad_nodes(x), coords))
