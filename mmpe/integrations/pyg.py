"""PyTorch Geometric integration: transforms that attach graph positions, and a layer.

Transforms (`torch_geometric.transforms.BaseTransform` subclasses, with functional names as
PyG registers its own) compute per graph with the functions of [`mmpe.graph_maths`][mmpe.graph_maths] and
store the result on a copy of the `Data` object (`BaseTransform.__call__` copies it first;
the input is left unchanged), so they run once as a dataset `pre_transform` and batch with
PyG's `DataLoader`. [`mmpe.coords.Graph`][mmpe.coords.graph.Graph] reads them only when told where they are:
`Graph.from_pyg(batch, **graph_kwargs(pre))` (or the same keywords written out, e.g.
`Graph.from_pyg(batch, rwse="random_walk_pe")`). Every transform takes the attribute name it
writes (`attr_name`), and [`graph_kwargs`][mmpe.integrations.pyg.graph_kwargs] passes those names on:

| transform | functional name | attributes (default `attr_name`) |
| --- | --- | --- |
| [`AddShortestPaths`][mmpe.integrations.pyg.AddShortestPaths] | `mmpe_shortest_paths` | `spd [n²]`, `spd_index [2, n²]` (+ `spd_edge_attr [n², P, F]`, `spd_edge_mask [n², P]`) |
| [`AddLaplacianPE`][mmpe.integrations.pyg.AddLaplacianPE] | `mmpe_laplacian_pe` | `laplacian_eigenvector_pe [n, k]` |
| [`AddRWSE`][mmpe.integrations.pyg.AddRWSE] | `mmpe_rwse` | `random_walk_pe [n, k]` |
| [`AddDegree`][mmpe.integrations.pyg.AddDegree] | `mmpe_degree` | `in_degree [n]`, `out_degree [n]` |

`spd` holds hop counts, −1 for unreachable pairs; `spd_index` names the pairs (its name
contains "index", so PyG offsets it by the node count when batching; for the same reason an
`attr_name` may not contain "index", "batch" or "face"). The default names of LapPE and RWSE
are PyG's own, so the output of PyG's `AddLaplacianEigenvectorPE`/`AddRandomWalkPE` can be
read too: `Graph.from_pyg(batch, rwse="random_walk_pe")` (mmpe's LapPE has deterministic
signs; PyG's are random).

    from torch_geometric.transforms import Compose
    from torch_geometric.loader import DataLoader
    pre = Compose([AddShortestPaths(edge_hops=5), AddLaplacianPE(8), AddRWSE(16), AddDegree()])
    graphs = [pre(from_smiles(s)) for s in smiles]
    layer = GraphTransformer(64, 4, depth=2, encodings=["rwse", "graphormer"],
                             precomputed=graph_kwargs(pre))
    for batch in DataLoader(graphs, batch_size=32):
        h = layer(x_embed(batch.x), batch.edge_index, batch.batch, data=batch)   # [N, 64]

Inside PyG's GPS recipe: [`GraphAttention`][mmpe.integrations.pyg.GraphAttention] is mmpe attention on node-level inputs
(`x [N, d]`, `batch`; padding to `[b, n_max, d]` and back is done inside), and
[`MMPEGPSConv`][mmpe.integrations.pyg.MMPEGPSConv] is PyG's `GPSConv` (same local MPNN, MLP, norms and residuals; a
`GPSConv` subclass) whose global attention is a [`GraphAttention`][mmpe.integrations.pyg.GraphAttention] with mmpe's graph
score biases (`graphormer_spatial`, `alibi`/`t5`/`fire` over hops …). PyG's own
`GPSConv` cannot take such a module: it builds `torch.nn.MultiheadAttention` or a Performer
from `attn_type` and dispatches on those two classes, with no hook for pairwise biases.

    coords = Graph.from_pyg(batch)                    # hops computed once, shared by layers
    layers = [MMPEGPSConv(64, GINEConv(...), heads=4, encodings=["graphormer_spatial"])
              for _ in range(4)]
    for layer in layers:
        h = layer(h, batch.edge_index, batch.batch, coords=coords, edge_attr=e)
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.nn import GPSConv
from torch_geometric.nn.inits import reset
from torch_geometric.transforms import BaseTransform, Compose

from mmpe.attention import MultiHeadAttention
from mmpe.coords.graph import PRECOMPUTED, Graph
from mmpe.encodings.base import Encoding, InputEncoding
from mmpe.graph_maths import (
    batched_degrees,
    batched_laplacian_pe,
    batched_random_walk_pe,
    batched_shortest_path_hops,
    collate_edges,
    degrees,
    laplacian_pe,
    path_edge_features,
    random_walk_pe,
    shortest_path_hops,
)
from mmpe.registry import build
from mmpe.transformer import EncodingSpec, Transformer

__all__ = ["AddDegree", "AddLaplacianPE", "AddRWSE", "AddShortestPaths", "GraphAttention",
           "GraphTransformer", "MMPEGPSConv", "graph_kwargs",
           "precompute_dataset"]

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
    """`(edge_index [2, E] numpy, num_nodes)` of one graph, or an error."""
    if getattr(data, "batch", None) is not None:
        raise ValueError(f"{owner}: mmpe transforms work on one graph (a Data object), not on a Batch")
    if getattr(data, "edge_index", None) is None or data.num_nodes is None:
        raise ValueError(f"{owner}: data needs edge_index and num_nodes")
    return data.edge_index.detach().cpu().numpy(), int(data.num_nodes)


def _collate(data_list: Sequence[Data], owner: str) -> tuple[list[Data], np.ndarray, np.ndarray, int]:
    """Shallow copies of the graphs (as `BaseTransform.__call__` makes) and their batch:
    `(copies, edge_index [2, ΣE], batch [Σn], G)`."""
    graphs = [_one_graph(d, owner) for d in data_list]
    ei, batch = collate_edges([e for e, _ in graphs], [n for _, n in graphs])
    return [copy.copy(d) for d in data_list], ei, batch, len(graphs)


def _pair_index(n: int) -> Tensor:
    """All ordered node pairs `[2, n²]` (row-major), as `AddShortestPaths` stores them: a
    new tensor (a copy of a cached one for small graphs, where building it costs as much as
    the hops)."""
    return _small_pair_index(n).clone() if n <= 256 else _all_pairs(n)


def _all_pairs(n: int) -> Tensor:
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    return torch.stack([ii.flatten(), jj.flatten()])


_small_pair_index = functools.lru_cache(maxsize=None)(_all_pairs)


class _GraphTransform(BaseTransform):
    """Base of the mmpe transforms: [`graph_kwargs`][mmpe.integrations.pyg._GraphTransform.graph_kwargs] says where the results are stored."""

    def forward_many(self, data_list: Sequence[Data]) -> list[Data]:
        """Transformed copies of many graphs, equal to `[self(d) for d in data_list]`; the
        mmpe transforms compute them at once (the `batched_*` functions of
        [`mmpe.graph_maths`][mmpe.graph_maths]). The inputs are left unchanged."""
        return [self(d) for d in data_list]

    @property
    def graph_kwargs(self) -> dict[str, Any]:
        """The [`mmpe.coords.Graph.from_pyg`][mmpe.coords.graph.Graph.from_pyg] keywords that read this transform's output."""
        raise NotImplementedError


@functional_transform("mmpe_shortest_paths")
class AddShortestPaths(_GraphTransform):
    """Attach all-pairs shortest-path hops and path edge features.

    Attach all-pairs shortest-path hops and, with `edge_hops > 0`, the edge features along
    each path (Graphormer's spatial and edge encodings, Ying et al. 2021 eqs. 6-7, read them).

    Writes `{attr_name} [n²]` (hops, unclipped, −1: unreachable; int64; from
    [`mmpe.graph_maths.shortest_path_hops`][mmpe.graph_maths.shortest_path_hops]), `{attr_name}_index [2, n²]` (the pairs),
    and with `edge_hops`: `{attr_name}_edge_attr [n², edge_hops, F]` and
    `{attr_name}_edge_mask [n², edge_hops]` ([`mmpe.graph_maths.path_edge_features`][mmpe.graph_maths.path_edge_features]).

    Args:
        edge_hops: path edges stored per pair (0: none).
        attr_name: base name of the attributes (`"spd"`).
        undirected: treat edges as undirected.

    Raises:
        ValueError: `edge_hops < 0`; a bad `attr_name`; at call, a Batch, or
            `edge_hops > 0` on a graph without `edge_attr`.
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
        # Predecessors only for the path edges: without them small graphs take the dense path.
        paths = shortest_path_hops(ei, n, self.undirected, return_predecessors=bool(self.edge_hops))
        hops = paths[0] if self.edge_hops else paths
        data[self.attr_name] = torch.from_numpy(np.where(np.isinf(hops), -1, hops).astype(np.int64).ravel())
        data[f"{self.attr_name}_index"] = _pair_index(n)
        if self.edge_hops:
            edge_attr = getattr(data, "edge_attr", None)
            if edge_attr is None:
                raise ValueError("AddShortestPaths: edge_hops > 0 needs edge_attr on the graph")
            attr, valid = path_edge_features(ei, edge_attr, n, self.edge_hops,
                                             undirected=self.undirected, paths=paths)
            data[f"{self.attr_name}_edge_attr"] = attr.reshape(n * n, self.edge_hops, -1).cpu()
            data[f"{self.attr_name}_edge_mask"] = valid.reshape(n * n, self.edge_hops).cpu()
        return data

    def forward_many(self, data_list: Sequence[Data]) -> list[Data]:
        if self.edge_hops:  # the path edges need each graph's predecessors: one by one
            return [self(d) for d in data_list]
        out, ei, batch, count = _collate(data_list, "AddShortestPaths")
        hops = batched_shortest_path_hops(ei, batch, self.undirected, num_graphs=count)
        for data, h in zip(out, hops, strict=True):
            data[self.attr_name] = torch.from_numpy(np.where(np.isinf(h), -1, h).astype(np.int64).ravel())
            data[f"{self.attr_name}_index"] = _pair_index(h.shape[0])
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(edge_hops={self.edge_hops}, attr_name={self.attr_name!r})"


@functional_transform("mmpe_laplacian_pe")
class AddLaplacianPE(_GraphTransform):
    """Attach `k` Laplacian eigenvectors as `attr_name`.

    Attach `k` Laplacian eigenvectors `[n, k]` float32 as `attr_name`
    ([`mmpe.graph_maths.laplacian_pe`][mmpe.graph_maths.laplacian_pe]: LapPE, Dwivedi & Bresson 2020; deterministic
    signs, zero columns when the graph has fewer than `k + 1` nodes).

    Raises:
        ValueError: `k < 1`, an unknown `normalization`, a bad `attr_name`.
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

    def forward_many(self, data_list: Sequence[Data]) -> list[Data]:
        """The transform of every graph of `data_list`, at once.

        As `[self(d) for d in data_list]` up to eigenvector rotations within repeated
        eigenvalues ([`mmpe.graph_maths.batched_laplacian_pe`][mmpe.graph_maths.batched_laplacian_pe]: stacked dense `eigh`)."""
        out, ei, batch, count = _collate(data_list, "AddLaplacianPE")
        pes = batched_laplacian_pe(ei, batch, self.k, self.normalization, num_graphs=count)
        for data, (vecs, _) in zip(out, pes, strict=True):
            data[self.attr_name] = torch.from_numpy(vecs).float()
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(k={self.k}, normalization={self.normalization!r}, "
                f"attr_name={self.attr_name!r})")


@functional_transform("mmpe_rwse")
class AddRWSE(_GraphTransform):
    """Attach random-walk return probabilities as `attr_name`.

    Attach random-walk return probabilities `[n, k]` float32 as `attr_name`
    ([`mmpe.graph_maths.random_walk_pe`][mmpe.graph_maths.random_walk_pe]: RWSE, Dwivedi et al. 2022).

    Raises:
        ValueError: `k < 1`, a bad `attr_name`.
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

    def forward_many(self, data_list: Sequence[Data]) -> list[Data]:
        out, ei, batch, count = _collate(data_list, "AddRWSE")
        for data, pe in zip(out, batched_random_walk_pe(ei, batch, self.k, num_graphs=count), strict=True):
            data[self.attr_name] = torch.from_numpy(pe).float()
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, attr_name={self.attr_name!r})"


@functional_transform("mmpe_degree")
class AddDegree(_GraphTransform):
    """Attach in- and out-degrees.

    Attach in- and out-degrees `[n]` (int64, duplicate edges counted once;
    [`mmpe.graph_maths.degrees`][mmpe.graph_maths.degrees]) as `in_attr_name` and `out_attr_name`.

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

    def forward_many(self, data_list: Sequence[Data]) -> list[Data]:
        out, ei, batch, count = _collate(data_list, "AddDegree")
        for data, (in_deg, out_deg) in zip(out, batched_degrees(ei, batch, num_graphs=count), strict=True):
            data[self.in_attr_name] = torch.from_numpy(in_deg.copy())
            data[self.out_attr_name] = torch.from_numpy(out_deg.copy())
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(in_attr_name={self.in_attr_name!r}, "
                f"out_attr_name={self.out_attr_name!r})")


def graph_kwargs(*transforms: Any) -> dict[str, Any]:
    """The [`mmpe.coords.Graph.from_pyg`][mmpe.coords.graph.Graph.from_pyg] keywords that read what `transforms` attached.

    Args:
        *transforms: mmpe transforms, PyG's `AddRandomWalkPE`/`AddLaplacianEigenvectorPE`
            (with an `attr_name`), `Compose` objects of them, or lists of either (other
            transforms are skipped).

    Returns:
        e.g. `{"spd": "spd", "spd_index": "spd_index", "rwse": "random_walk_pe", …}`.

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


def precompute_dataset(data_list: Sequence[Data], transforms: Any) -> list[Data]:
    """Apply `transforms` to every graph of `data_list`, a stage at a time.

    Apply `transforms` to every graph of `data_list`, a stage at a time: each mmpe
    transform computes for all graphs at once (`_GraphTransform.forward_many`), any other
    transform runs graph by graph. Equal to `[transforms(d) for d in data_list]` (LapPE up to
    rotations within repeated eigenvalues), many times faster on datasets of small graphs.

    Args:
        data_list: `Data` objects (one graph each; left unchanged).
        transforms: a transform, a `Compose` of transforms, or a list of either.

    Returns:
        The transformed copies, in order.

    Raises:
        TypeError: a `transforms` that is not callable.
    """
    stages: list[Any] = []

    def walk(t: Any) -> None:
        if isinstance(t, (list, tuple)):
            for inner in t:
                walk(inner)
        elif isinstance(t, Compose):
            for inner in t.transforms:
                walk(inner)
        elif callable(t):
            stages.append(t)
        else:
            raise TypeError(f"precompute_dataset: expected transforms, got {type(t).__name__}")

    walk(transforms)
    out = list(data_list)
    for t in stages:
        out = t.forward_many(out) if isinstance(t, _GraphTransform) else [t(d) for d in out]
    return out


class GraphTransformer(nn.Module):
    """A stack of mmpe transformer blocks on PyG-style inputs: `(x, edge_index, batch)`.

    Builds [`mmpe.coords.Graph`][mmpe.coords.graph.Graph] coordinates (with `data`: by
    [`from_pyg`][mmpe.coords.graph.Graph.from_pyg], reading the precomputed attributes `precomputed`
    names), pads the nodes to `[b, n_max, d]`, runs
    [`mmpe.transformer.Transformer`][mmpe.transformer.Transformer] with the given encodings (any registry names that
    support `"graph"`: `lappe`, `rwse`, `graphormer`, `graphormer_centrality`,
    `alibi`, `t5`, `fire` …) and returns node features in PyG order.

    Args:
        d_model, num_heads, depth: transformer size.
        encodings: registry names / config dicts / built encodings.
        max_distance: hop clip of the coordinates.
        precomputed: [`from_pyg`][mmpe.coords.graph.Graph.from_pyg] keywords naming the attributes of
            `data` that hold precomputed values ([`graph_kwargs`][mmpe.integrations.pyg.graph_kwargs] of the transforms that
            attached them); None computes everything. Used only with `data`.
        **kwargs: passed to [`Transformer`][mmpe.transformer.Transformer] (`mlp_ratio`, `dropout` …).

    Shapes: `forward(x [N, d_model], edge_index [2, E], batch [N] | None, edge_attr [E, F] |
    None, data=None) -> [N, d_model]`.

    Raises:
        ValueError: `x` not `[N, d_model]`; `precomputed` names without `data`; the
            errors of [`from_pyg`][mmpe.coords.graph.Graph.from_pyg] (a name `data` lacks).
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
        """The [`Graph`][mmpe.coords.graph.Graph] the layer attends over."""
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


def _check_nodes(owner: str, x: Any) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{owner}: x must be [num_nodes, channels], got {shape}")


class GraphAttention(nn.Module):
    """mmpe self-attention over the nodes of a PyG batch: `(x [N, d], batch) -> [N, d]`.

    Builds (or takes) [`mmpe.coords.Graph`][mmpe.coords.graph.Graph] coordinates, pads the nodes to
    `[b, n_max, d]` ([`pad_nodes`][mmpe.coords.graph.Graph.pad_nodes]), runs
    [`mmpe.attention.MultiHeadAttention`][mmpe.attention.MultiHeadAttention] with the encodings (padded keys masked) and
    returns the nodes in PyG order — the global-attention half of a GPS layer.

    Args:
        channels: node feature width `d`.
        heads: attention heads (a divisor of `channels`).
        encodings: score or rotary encodings (registry names, configs or built), built with
            `d_model=channels`, `num_heads=heads`, `head_dim=channels // heads`:
            `graphormer_spatial`, `graphormer` (needs edge features), `alibi`, `t5`,
            `fire` … (distances in hops).
        max_distance: hop clip of coordinates built here.
        precomputed: [`from_pyg`][mmpe.coords.graph.Graph.from_pyg] keywords for `data=`
            ([`graph_kwargs`][mmpe.integrations.pyg.graph_kwargs] of the transforms).
        **kwargs: passed to [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention] (`num_kv_heads`,
            `qkv_bias`, `route`).

    Shapes: `forward(x [N, d], batch [N] | None = None, coords: Graph | None = None, *,
    edge_index [2, E] | None = None, edge_attr [E, F] | None = None, data=None) -> [N, d]`.
    Coordinates: `coords` if given (build them once per batch and share them between
    layers), else from `data` ([`from_pyg`][mmpe.coords.graph.Graph.from_pyg]), else from
    `edge_index` (no edges: every pair is "unreachable", for encodings that need no hops).

    Raises:
        ValueError: an input encoding (add those to the node features instead); `x` not
            `[N, channels]`; coordinates for another number of nodes.
    """

    def __init__(self, channels: int, heads: int = 1, encodings: Sequence[EncodingSpec] = (), *,
                 max_distance: int = 20, precomputed: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        if channels % heads:
            raise ValueError(f"GraphAttention: channels={channels} must be divisible by heads={heads}")
        context = {"d_model": channels, "num_heads": heads, "head_dim": channels // heads}
        built = [e if isinstance(e, Encoding) else build(e, context=context)
                 for e in ([encodings] if isinstance(encodings, str | Mapping | Encoding) else encodings)]
        bad = [type(e).__name__ for e in built if isinstance(e, InputEncoding)]
        if bad:
            raise ValueError(f"GraphAttention: input encodings ({bad}) belong to the node features "
                             "(add them before the layer, or use GraphTransformer)")
        self.channels, self.heads, self.max_distance = channels, heads, max_distance
        self.precomputed = dict(precomputed or {})
        self.attn = MultiHeadAttention(channels, heads, built, **kwargs)

    @classmethod
    def from_multihead(cls, mha: nn.MultiheadAttention, encodings: Sequence[EncodingSpec] = (),
                       **kwargs: Any) -> GraphAttention:
        """A `GraphAttention` with the projections of a `torch.nn.MultiheadAttention`.

        A [`GraphAttention`][mmpe.integrations.pyg.GraphAttention] with the projections of a `torch.nn.MultiheadAttention`
        (PyG `GPSConv`'s `attn`): without encodings it computes what that module does.

        Raises:
            ValueError: a module with separate q/k/v widths or without projection biases.
        """
        if not mha._qkv_same_embed_dim or mha.in_proj_bias is None:
            raise ValueError("GraphAttention.from_multihead: needs equal q/k/v widths and biases")
        out = cls(mha.embed_dim, mha.num_heads, encodings, **kwargs)
        with torch.no_grad():
            out.attn.qkv.weight.copy_(mha.in_proj_weight)
            out.attn.qkv.bias.copy_(mha.in_proj_bias)
            out.attn.proj.weight.copy_(mha.out_proj.weight)
            out.attn.proj.bias.copy_(mha.out_proj.bias)
        return out

    def reset_parameters(self) -> None:
        """Re-initialise the projections (what PyG's `reset_parameters` convention expects)."""
        self.attn.qkv.reset_parameters()
        self.attn.proj.reset_parameters()

    def coords(self, x: Tensor, batch: Tensor | None = None, *, edge_index: Tensor | None = None,
               edge_attr: Tensor | None = None, data: Data | None = None) -> Graph:
        """The [`Graph`][mmpe.coords.graph.Graph] the layer attends over (built per call)."""
        if data is not None:
            return Graph.from_pyg(data, **self.precomputed, max_distance=self.max_distance,
                                  device=x.device)
        if edge_index is None:
            edge_index = torch.empty(2, 0, dtype=torch.long, device=x.device)
        return Graph(edge_index, x.shape[0], batch, edge_attr=edge_attr,
                     max_distance=self.max_distance, device=x.device)

    def forward(self, x: Tensor, batch: Tensor | None = None, coords: Graph | None = None, *,
                edge_index: Tensor | None = None, edge_attr: Tensor | None = None,
                data: Data | None = None) -> Tensor:
        _check_nodes("GraphAttention", x)
        if coords is None:
            coords = self.coords(x, batch, edge_index=edge_index, edge_attr=edge_attr, data=data)
        elif not isinstance(coords, Graph):
            raise TypeError(f"GraphAttention: coords must be an mmpe Graph, got {type(coords).__name__}")
        if coords.node_slot[0].numel() != x.shape[0]:
            raise ValueError(f"GraphAttention: the coordinates hold {coords.node_slot[0].numel()} "
                             f"nodes, x has {x.shape[0]}")
        return coords.unpad_nodes(self.attn(coords.pad_nodes(x), coords))


class MMPEGPSConv(GPSConv):
    """PyG's `GPSConv` (Rampášek et al. 2022) with mmpe graph biases in its global attention.

    Same structure and numbers as `torch_geometric.nn.GPSConv` — local MPNN `conv` + residual
    + norm, global attention + residual + norm, their sum, MLP + residual + norm — but `attn`
    is a [`GraphAttention`][mmpe.integrations.pyg.GraphAttention] (`GPSConv` only builds `nn.MultiheadAttention` or a
    Performer and has no hook for pairwise terms). Without encodings it equals a `GPSConv`
    with the same weights ([`from_gpsconv`][mmpe.integrations.pyg.MMPEGPSConv.from_gpsconv]; tested).

    Args:
        channels, conv, heads, dropout, act, act_kwargs, norm, norm_kwargs: as `GPSConv`.
        encodings, max_distance, precomputed, **attn_kwargs: as [`GraphAttention`][mmpe.integrations.pyg.GraphAttention].

    Shapes: ``forward(x [N, d], edge_index, batch [N] | None = None, *, coords: Graph | None =
    None, data=None, **kwargs) -> [N, d]`; `kwargs` go to `conv` (`edge_attr`` …).
    Pass `coords` (`Graph.from_pyg(batch)`) to build the hops once for a stack of layers.
    """

    def __init__(self, channels: int, conv: nn.Module | None, heads: int = 1, dropout: float = 0.0,
                 act: str = "relu", act_kwargs: dict[str, Any] | None = None,
                 norm: str | None = "batch_norm", norm_kwargs: dict[str, Any] | None = None,
                 encodings: Sequence[EncodingSpec] = (), *, max_distance: int = 20,
                 precomputed: Mapping[str, Any] | None = None, **attn_kwargs: Any) -> None:
        super().__init__(channels, conv, heads=heads, dropout=dropout, act=act, act_kwargs=act_kwargs,
                         norm=norm, norm_kwargs=norm_kwargs, attn_type="multihead")
        self.attn_type = "mmpe"
        self.attn = GraphAttention(channels, heads, encodings, max_distance=max_distance,
                                   precomputed=precomputed, **attn_kwargs)

    @classmethod
    def from_gpsconv(cls, gps: GPSConv, encodings: Sequence[EncodingSpec] = (),
                     **kwargs: Any) -> MMPEGPSConv:
        """A copy of a multi-head `GPSConv` with mmpe encodings in the attention.

        A copy of a multi-head `GPSConv` (its conv, MLP, norms and attention weights) with
        mmpe encodings in the attention.

        Raises:
            ValueError: a `GPSConv` whose `attn_type` is not `"multihead"`.
        """
        if not isinstance(gps.attn, nn.MultiheadAttention):
            raise ValueError(f"MMPEGPSConv.from_gpsconv: needs attn_type='multihead', got {gps.attn_type!r}")
        out = cls(gps.channels, None, heads=gps.heads, dropout=gps.dropout, norm=None)
        out.conv, out.mlp = copy.deepcopy(gps.conv), copy.deepcopy(gps.mlp)
        out.norm1, out.norm2, out.norm3 = (copy.deepcopy(n) for n in (gps.norm1, gps.norm2, gps.norm3))
        out.norm_with_batch = gps.norm_with_batch
        out.attn = GraphAttention.from_multihead(gps.attn, encodings, **kwargs)
        return out.train(gps.training)

    def reset_parameters(self) -> None:
        if self.conv is not None:
            self.conv.reset_parameters()
        self.attn.reset_parameters()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()

    def _norm(self, norm: nn.Module | None, h: Tensor, batch: Tensor | None) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, *,
                coords: Graph | None = None, data: Data | None = None, **kwargs: Any) -> Tensor:
        _check_nodes("MMPEGPSConv", x)
        hs = []
        if self.conv is not None:  # local MPNN
            h = self.conv(x, edge_index, **kwargs)
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        h = self.attn(x, batch, coords, edge_index=edge_index, edge_attr=kwargs.get("edge_attr"),
                      data=data)
        h = F.dropout(h, p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)
