"""Graphs: nodes are tokens, position is topology (shortest-path hops, spectra, random walks).

A batch of graphs of different sizes becomes a padded token set `[b, n_max]` (graph `g`'s
node `i` sits in slot `(g, i)`; slots past the graph's size are padding, masked as keys by
[`Graph.mask_mod`][mmpe.coords.graph.Graph.mask_mod]). With `virtual_token=True` every graph gets one extra token in slot 0
(Graphormer's virtual graph node, Ying et al. 2021 §3.1): its nodes then sit in slots
`1 … n`.

[`Graph`][mmpe.coords.graph.Graph] holds that layout and answers the coordinate protocol (`Metric`:
`distance`/`extent`; `GraphLayout`: `spd`, `node_mask`, degrees, `laplacian_pe`,
`rwse`, `virtual_token`; `GraphEdges`: `path_edge_attr`). The maths lives in
[`mmpe.graph_maths`][mmpe.graph_maths]; the members compute on first use and cache the padded result on the
object — for a batch of several graphs with the `batched_*` functions (all graphs at once:
stacked dense kernels for graphs of one size, block-diagonal BFS for large ones), for one
graph with the per-graph functions; both give the same numbers:

* `spd` — all-pairs shortest-path hop counts ([`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops]),
  clipped at `max_distance`; an unreachable pair has its own code `UNREACHABLE` (−1),
  a pair with the virtual token `VIRTUAL` (−2);
* `laplacian_pe(k)` — `k` smallest non-trivial Laplacian eigenvectors
  ([`laplacian_pe`][mmpe.graph_maths.laplacian_pe]), zero-padded and masked for graphs with
  `n < k + 1`;
* `rwse(k)` — random-walk return probabilities ([`random_walk_pe`][mmpe.graph_maths.random_walk_pe]);
* `in_degree` / `out_degree` ([`degrees`][mmpe.graph_maths.degrees]);
* `path_edge_attr(max_hops)` — the edge features along one shortest path per pair
  (Graphormer's edge encoding; [`path_edge_ids`][mmpe.graph_maths.path_edge_ids]).

**Precomputed values** are passed explicitly, never looked up under guessed names: as tensors
to the constructor (`Graph(edge_index, n, batch, rwse=pe, spd=hops, spd_index=pairs, …)`,
each keyword naming the member it supplies), or as attribute names of a PyG `Data`/`Batch`
to [`Graph.from_pyg`][mmpe.coords.graph.Graph.from_pyg] (`Graph.from_pyg(batch, rwse="random_walk_pe", …)`;
[`mmpe.integrations.pyg.graph_kwargs`][mmpe.integrations.pyg.graph_kwargs] writes these keywords for the transforms that
attached the attributes).

Conventions (those of [`mmpe.graph_maths`][mmpe.graph_maths]): the edge list is coalesced (duplicate edges
count once) and, with `undirected=True` (default), symmetrised for shortest paths;
Laplacians are built on the symmetrised graph, random walks on the edge list as given.
Self-loops are ignored by shortest paths and Laplacians; a random walk may take them (as in
PyG's `AddRandomWalkPE`). Degrees count the coalesced edge list as given (in: edges into the
node, out: edges leaving it; a PyG undirected graph stores both directions, so in = out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod
from mmpe.graph_maths import (
    adjacency,
    batched_laplacian_pe,
    batched_random_walk_pe,
    batched_shortest_path_hops,
    degrees,
    laplacian_pe,
    path_edge_ids,
    random_walk_pe,
    shortest_path_hops,
)

if TYPE_CHECKING:  # scipy is imported where it is called (issue 52)
    import scipy.sparse as sp

__all__ = ["UNREACHABLE", "VIRTUAL", "Graph", "random_walk_pe", "shortest_path_hops"]

#: ``spd`` code of a pair with no path between them (and of pairs involving padding).
UNREACHABLE = -1
#: ``spd`` code of a pair that involves the virtual graph token.
VIRTUAL = -2

#: The precomputed values `Graph` accepts, by keyword (see `Graph.from_pyg`).
PRECOMPUTED = ("spd", "spd_index", "path_edge_attr", "path_edge_mask", "laplacian_pe", "rwse",
               "in_degree", "out_degree")


def _np_adjacency(edge_index: np.ndarray, n: int, undirected: bool, self_loops: bool) -> sp.csr_matrix:
    """Older name of [`mmpe.graph_maths.adjacency`][mmpe.graph_maths.adjacency] (positional flags)."""
    return adjacency(edge_index, n, undirected=undirected, self_loops=self_loops)


def _int_tensor(value: Any, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"Graph: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"Graph: {name} must hold integers, got {value.dtype}")
    if value.dtype.is_floating_point:
        if not bool(torch.isfinite(value).all()) or not bool((value == value.round()).all()):
            raise ValueError(f"Graph: {name} must hold whole numbers, got non-integral values")
    return value.detach().long().cpu()



class _NormalTensorCache(dict):
    """The per-coordinates cache; values computed under `torch.inference_mode` (Lightning's
    validation) are stored as normal tensors, so a later training forward on the same
    coordinates can save them for backward."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if any(isinstance(t, Tensor) and t.is_inference() for t in pytree.tree_leaves(value)):
            with torch.inference_mode(False):
                value = pytree.tree_map(
                    lambda t: t.clone() if isinstance(t, Tensor) and t.is_inference() else t, value)
        super().__setitem__(key, value)

class Graph(Coordinates):
    """Coordinates of a batch of graphs (units: hops).

    Args:
        graph: an `edge_index` `[2, E]` integer tensor, or a PyG `Data`/`Batch` (only its
            structure is read: `edge_index`, `num_nodes`, `batch`, `edge_attr`; use
            [`from_pyg`][mmpe.coords.graph.Graph.from_pyg] to read precomputed attributes).
        num_nodes: total node count (required with an `edge_index`).
        batch: graph id of every node `[num_nodes]` (sorted, as PyG builds it); None = one graph.
        edge_attr: edge features `[E, F]` (integer categories or floats), for Graphormer's
            edge encoding.
        max_distance: hop counts above it are clipped to it (`distance` of an unreachable pair
            is `max_distance + 1`).
        undirected: treat edges as undirected for shortest paths and path edges.
        virtual_token: add a virtual graph token in slot 0 of every graph.
        device: where the tensors live (default: `edge_index`'s device).

    Precomputed values (optional; each replaces the computation of the member it names; node
    ids are global, i.e. rows in PyG's batched order):
        spd: hop counts `[P]` (integers; −1 or any negative value: unreachable; unclipped) of
            the node pairs `spd_index`. Pairs not listed are unreachable.
        spd_index: the pairs `[2, P]` (source, target node ids; both in the same graph) of
            `spd` and of `path_edge_attr`/`path_edge_mask`.
        path_edge_attr: `[P, H, F]` edge features along each pair's shortest path (`H` hops
            stored; `path_edge_attr(max_hops)` may ask for `max_hops <= H`).
        path_edge_mask: `[P, H]` bool, True where `path_edge_attr` holds an edge.
        laplacian_pe: `[num_nodes, K]` Laplacian eigenvectors; `laplacian_pe(k)` reads the
            first `k <= K` columns.
        laplacian_normalization: the Laplacian `laplacian_pe` was computed with (`"sym"`
            or None); asking for another raises.
        rwse: `[num_nodes, K]` random-walk return probabilities, `t = 1 … K`; `rwse(k)`
            reads the first `k <= K` columns.
        in_degree, out_degree: `[num_nodes]` integers.

    Per-pair `distance(q, k, b)`: hop count (float) — 0 on the diagonal, `max_distance + 1`
    for unreachable pairs and padding, 1 between the virtual token and any node (it is
    adjacent to all of them; node–node distances never pass through it). `extent(q, b)`:
    how far query `q`'s keys lie — the diameter of its graph (largest finite clipped hop
    count; 0 for one node), or `max_distance + 1` where it also sees unreachable nodes — so
    `extent ≥ distance` on every pair the mask allows (FIRE's normaliser).

    Raises:
        TypeError: `graph` is neither a PyG data object nor a tensor; non-integer
            `edge_index`, `batch`, `spd`, `spd_index` or degrees; a precomputed value
            that is not a tensor.
        ValueError: `edge_index` not `[2, E]`; node ids outside `[0, num_nodes)`;
            `num_nodes` missing or < 1; `batch` of the wrong length, unsorted, or edges
            joining two graphs; `edge_attr` with a row count other than `E`;
            `max_distance < 1`; a precomputed value of the wrong shape (the message names
            the keyword); `spd`/`path_edge_attr` without `spd_index`; pairs joining two
            graphs.
    """

    kind = "graph"
    virtual_token: bool

    def __init__(
        self,
        graph: Any,
        num_nodes: int | None = None,
        batch: Tensor | None = None,
        *,
        edge_attr: Tensor | None = None,
        max_distance: int = 20,
        undirected: bool = True,
        virtual_token: bool = False,
        device: torch.device | str | None = None,
        spd: Tensor | None = None,
        spd_index: Tensor | None = None,
        path_edge_attr: Tensor | None = None,
        path_edge_mask: Tensor | None = None,
        laplacian_pe: Tensor | None = None,
        laplacian_normalization: str | None = "sym",
        rwse: Tensor | None = None,
        in_degree: Tensor | None = None,
        out_degree: Tensor | None = None,
    ) -> None:
        if hasattr(graph, "edge_index") and not isinstance(graph, Tensor):
            edge_index = graph.edge_index
            num_nodes = graph.num_nodes if num_nodes is None else num_nodes
            batch = getattr(graph, "batch", None) if batch is None else batch
            if edge_attr is None:
                edge_attr = getattr(graph, "edge_attr", None)
        elif isinstance(graph, Tensor):
            edge_index = graph
        else:
            raise TypeError("Graph: graph must be a PyG Data/Batch or an edge_index tensor [2, E], "
                            f"got {type(graph).__name__}")
        if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
            raise ValueError(f"Graph: max_distance must be an int >= 1, got {max_distance!r}")
        if isinstance(num_nodes, Tensor):
            num_nodes = int(num_nodes)
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 1:
            raise ValueError(f"Graph: num_nodes must be an int >= 1, got {num_nodes!r}")
        num_nodes = int(num_nodes)
        if not isinstance(edge_index, Tensor):
            raise TypeError(f"Graph: edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
        if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool or edge_index.is_complex():
            raise TypeError(f"Graph: edge_index must hold integers (torch.long), got {edge_index.dtype}")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"Graph: edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
            raise ValueError(f"Graph: edge_index holds node ids in [{int(edge_index.min())}, "
                             f"{int(edge_index.max())}], outside [0, num_nodes={num_nodes})")
        if edge_attr is not None:
            if not isinstance(edge_attr, Tensor):
                raise TypeError(f"Graph: edge_attr must be a torch.Tensor, got {type(edge_attr).__name__}")
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.unsqueeze(-1)
            if edge_attr.dim() != 2 or edge_attr.shape[0] != edge_index.shape[1]:
                raise ValueError(f"Graph: edge_attr must be [E={edge_index.shape[1]}, F], "
                                 f"got {tuple(edge_attr.shape)}")
        self.device_ = torch.device(device) if device is not None else edge_index.device
        if batch is None:
            batch = torch.zeros(num_nodes, dtype=torch.long)
        if not isinstance(batch, Tensor) or batch.dtype.is_floating_point or batch.dtype == torch.bool:
            raise TypeError("Graph: batch must be an integer tensor [num_nodes]")
        if batch.shape != (num_nodes,):
            raise ValueError(f"Graph: batch must have shape [num_nodes={num_nodes}], got {tuple(batch.shape)}")
        batch = batch.long().cpu()
        if num_nodes > 1 and bool((batch[1:] < batch[:-1]).any()):
            raise ValueError("Graph: batch must be sorted (nodes of each graph contiguous, as in PyG)")
        if int(batch.min()) < 0:
            raise ValueError("Graph: batch ids must be >= 0")
        gap = num_nodes > 1 and bool((batch[1:] - batch[:-1] > 1).any())
        if batch.numel() and (int(batch[0]) != 0 or gap):
            raise ValueError("Graph: batch ids must run 0, 1, … with no gap (every graph id "
                             f"from 0 to {int(batch.max())} needs a node), got ids "
                             f"{torch.unique(batch).tolist()[:16]}")
        ei = edge_index.long().cpu()
        if ei.numel() and bool((batch[ei[0]] != batch[ei[1]]).any()):
            raise ValueError("Graph: edge_index has edges joining nodes of different graphs")

        self.edge_index, self.batch_vector, self.edge_attr = ei, batch, edge_attr
        self.num_graphs = int(batch.max()) + 1
        self.sizes = torch.bincount(batch, minlength=self.num_graphs)  # [b]
        self.ptr = torch.cat([torch.zeros(1, dtype=torch.long), self.sizes.cumsum(0)])
        self.offset = 1 if virtual_token else 0
        self.virtual_token = bool(virtual_token)
        self.n_max = int(self.sizes.max()) + self.offset
        self.max_distance, self.undirected = max_distance, bool(undirected)
        local = torch.arange(num_nodes) - self.ptr[batch]
        self.node_slot = (batch, local + self.offset)  # where node v sits in [b, n_max]
        edge_graph = batch[ei[0]] if ei.numel() else torch.zeros(0, dtype=torch.long)
        self._edge_graph = edge_graph
        self._cache: dict[Any, Any] = _NormalTensorCache()
        valid = torch.zeros(self.num_graphs, self.n_max, dtype=torch.bool)
        valid[self.node_slot] = True
        if virtual_token:
            valid[:, 0] = True
        self.valid = valid.to(self.device_)
        if laplacian_normalization not in ("sym", None):
            raise ValueError(f"Graph: laplacian_normalization must be 'sym' or None, "
                             f"got {laplacian_normalization!r}")
        self.laplacian_normalization = laplacian_normalization
        self.precomputed: dict[str, Tensor] = self._check_precomputed(
            num_nodes, spd=spd, spd_index=spd_index, path_edge_attr=path_edge_attr,
            path_edge_mask=path_edge_mask, laplacian_pe=laplacian_pe, rwse=rwse,
            in_degree=in_degree, out_degree=out_degree)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pyg(
        cls,
        data: Any,
        *,
        spd: str | Tensor | None = None,
        spd_index: str | Tensor | None = None,
        path_edge_attr: str | Tensor | None = None,
        path_edge_mask: str | Tensor | None = None,
        laplacian_pe: str | Tensor | None = None,
        laplacian_normalization: str | None = "sym",
        rwse: str | Tensor | None = None,
        in_degree: str | Tensor | None = None,
        out_degree: str | Tensor | None = None,
        edge_attr: str | Tensor | None = "edge_attr",
        **options: Any,
    ) -> Graph:
        """Coordinates of a PyG `Data`/`Batch`, reading the precomputed values it is told to.

        Each keyword names the attribute of `data` that holds the value of the member of the
        same name (or gives the tensor itself; None: compute it). Nothing else is read besides
        PyG's own `edge_index`, `num_nodes` and `batch`. The keywords for the mmpe
        transforms that attached the attributes come from
        [`mmpe.integrations.pyg.graph_kwargs`][mmpe.integrations.pyg.graph_kwargs]::

            pre = Compose([AddShortestPaths(edge_hops=5), AddRWSE(16, attr_name="rw")])
            coords = Graph.from_pyg(batch, **graph_kwargs(pre))   # rwse="rw", spd="spd", …

        Args:
            data: a PyG `Data` or `Batch`.
            spd, spd_index, path_edge_attr, path_edge_mask, laplacian_pe, rwse, in_degree, out_degree: attribute names (or tensors) of the precomputed values, with the
                layout of the [`Graph`][mmpe.coords.graph.Graph] keywords. `spd_index` defaults to
                `spd + "_index"` when `spd` is a name (the layout of `AddShortestPaths`).
            laplacian_normalization: the Laplacian the `laplacian_pe` attribute was computed
                with.
            edge_attr: name (or tensor) of the edge features; the default `"edge_attr"` (PyG's
                own field) may be absent, any other name must exist. None: no edge features.
            **options: the other [`Graph`][mmpe.coords.graph.Graph] arguments (`max_distance`, `undirected`,
                `virtual_token`, `device`).

        Raises:
            ValueError: a name that is not an attribute of `data` (or is None there); the
                message names the keyword, the attribute, and the attributes `data` has.
            TypeError: a keyword that is neither a string, a tensor nor None; an attribute
                that is not a tensor.
        """
        if not hasattr(data, "edge_index") or isinstance(data, Tensor):
            raise TypeError(f"Graph.from_pyg: data must be a PyG Data/Batch, got {type(data).__name__}")
        if isinstance(spd, str) and spd_index is None:
            spd_index = f"{spd}_index"

        def read(keyword: str, value: Any, optional: bool = False) -> Tensor | None:
            if value is None or isinstance(value, Tensor):
                return value
            if not isinstance(value, str):
                raise TypeError(f"Graph.from_pyg: {keyword} must be an attribute name (str), a "
                                f"tensor or None, got {type(value).__name__}")
            try:
                found = getattr(data, value, None)
            except (AttributeError, KeyError):  # pragma: no cover - PyG storage quirks
                found = None
            if found is None:
                if optional:
                    return None
                keys = sorted(data.keys()) if callable(getattr(data, "keys", None)) else []
                raise ValueError(f"Graph.from_pyg: {keyword}={value!r} names no attribute of the "
                                 f"{type(data).__name__} (it has {keys}); attach it with the "
                                 f"matching transform or pass the attribute name it was stored under")
            if not isinstance(found, Tensor):
                raise TypeError(f"Graph.from_pyg: attribute {value!r} ({keyword}) must be a tensor, "
                                f"got {type(found).__name__}")
            return found

        given = {
            "spd": read("spd", spd), "spd_index": read("spd_index", spd_index),
            "path_edge_attr": read("path_edge_attr", path_edge_attr),
            "path_edge_mask": read("path_edge_mask", path_edge_mask),
            "laplacian_pe": read("laplacian_pe", laplacian_pe), "rwse": read("rwse", rwse),
            "in_degree": read("in_degree", in_degree), "out_degree": read("out_degree", out_degree),
        }
        attr = read("edge_attr", edge_attr, optional=isinstance(edge_attr, str) and edge_attr == "edge_attr")
        return cls(data.edge_index, int(data.num_nodes), getattr(data, "batch", None),
                   edge_attr=attr, laplacian_normalization=laplacian_normalization, **given,
                   **options)

    def _check_precomputed(self, num_nodes: int, **given: Tensor | None) -> dict[str, Tensor]:
        """Validate the precomputed values (shapes, dtypes, pairs) and keep them on the CPU."""
        out: dict[str, Tensor] = {}
        for name in ("laplacian_pe", "rwse"):
            value = given[name]
            if value is None:
                continue
            if not isinstance(value, Tensor):
                raise TypeError(f"Graph: {name} must be a torch.Tensor [num_nodes, k], "
                                f"got {type(value).__name__}")
            if value.dim() != 2 or value.shape[0] != num_nodes or value.shape[1] < 1:
                raise ValueError(f"Graph: {name} must be [num_nodes={num_nodes}, k >= 1], "
                                 f"got {tuple(value.shape)}")
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"Graph: {name} has NaN or inf entries (nodes "
                                 f"{(~torch.isfinite(value)).any(dim=1).nonzero().flatten()[:5].tolist()}"
                                 " …); recompute it, or leave it out and let Graph compute it")
            out[name] = value.detach().float().cpu()
        for name in ("in_degree", "out_degree"):
            if given[name] is None:
                continue
            value = _int_tensor(given[name], name)
            if value.shape != (num_nodes,) or (value.numel() and int(value.min()) < 0):
                raise ValueError(f"Graph: {name} must be [num_nodes={num_nodes}] non-negative "
                                 f"integers, got shape {tuple(value.shape)}")
            out[name] = value
        spd, index = given["spd"], given["spd_index"]
        attr, mask = given["path_edge_attr"], given["path_edge_mask"]
        if (attr is None) != (mask is None):
            raise ValueError("Graph: path_edge_attr and path_edge_mask come together "
                             f"(got only {'path_edge_attr' if mask is None else 'path_edge_mask'})")
        if index is None:
            if spd is not None or attr is not None:
                raise ValueError("Graph: spd and path_edge_attr need spd_index [2, P], the node "
                                 "pairs they describe")
            return out
        if spd is None and attr is None:
            raise ValueError("Graph: spd_index was given without spd or path_edge_attr")
        index = _int_tensor(index, "spd_index")
        if index.dim() != 2 or index.shape[0] != 2:
            raise ValueError(f"Graph: spd_index must be [2, P], got {tuple(index.shape)}")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
            raise ValueError(f"Graph: spd_index holds node ids outside [0, num_nodes={num_nodes})")
        if index.numel() and bool((self.batch_vector[index[0]] != self.batch_vector[index[1]]).any()):
            raise ValueError("Graph: spd_index has pairs joining nodes of different graphs")
        p = index.shape[1]
        out["spd_index"] = index
        if spd is not None:
            spd = _int_tensor(spd, "spd")
            if spd.shape != (p,):
                raise ValueError(f"Graph: spd must be [P={p}] (one hop count per spd_index pair), "
                                 f"got {tuple(spd.shape)}")
            out["spd"] = spd
        if attr is not None:
            if not isinstance(attr, Tensor) or not isinstance(mask, Tensor):
                raise TypeError("Graph: path_edge_attr and path_edge_mask must be torch.Tensors")
            if attr.dim() == 2:
                attr = attr.unsqueeze(-1)
            if attr.dim() != 3 or attr.shape[0] != p:
                raise ValueError(f"Graph: path_edge_attr must be [P={p}, H, F], got {tuple(attr.shape)}")
            if tuple(mask.shape) != tuple(attr.shape[:2]):
                raise ValueError(f"Graph: path_edge_mask must be [P={p}, H={attr.shape[1]}], "
                                 f"got {tuple(mask.shape)}")
            out["path_edge_attr"], out["path_edge_mask"] = attr.detach().cpu(), mask.detach().bool().cpu()
        return out

    def cached(self, key: Any, compute: Any) -> Any:
        """`compute()` once per coordinates object and `key`.

        `compute()` once per coordinates object and `key` (for parameter-free data that
        encodings derive from these coordinates)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # ------------------------------------------------------------------ per-graph views
    def graph_edges(self, g: int) -> np.ndarray:
        """Local `edge_index` `[2, E_g]` (numpy) of graph `g`."""
        sel = self._edge_graph == g
        return (self.edge_index[:, sel] - self.ptr[g]).numpy()

    def _graph_edge_ids(self, g: int) -> np.ndarray:
        return torch.nonzero(self._edge_graph == g).flatten().numpy()

    def _paths(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """`(hops, predecessors)` of graph `g` (cached: `spd` and `path_edge_attr` share it)."""
        return self.cached(("paths", g), lambda: shortest_path_hops(
            self.graph_edges(g), int(self.sizes[g]), self.undirected, return_predecessors=True))

    def _hops(self) -> list[np.ndarray]:
        """Hops `[n_g, n_g]` (float64, `inf`: no path) of every graph: the cached
        `(hops, predecessors)` where [`path_edge_attr`][mmpe.coords.graph.Graph.path_edge_attr] computed them, else one graph by
        [`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops] and several at once by
        [`batched_shortest_path_hops`][mmpe.graph_maths.batched_shortest_path_hops] (no predecessors: the dense
        small-graph path)."""
        if all(("paths", g) in self._cache for g in range(self.num_graphs)):
            return [self._cache[("paths", g)][0] for g in range(self.num_graphs)]
        if self.num_graphs == 1:
            return [shortest_path_hops(self.graph_edges(0), int(self.sizes[0]), self.undirected)]
        return batched_shortest_path_hops(self.edge_index, self.batch_vector, self.undirected,
                                          num_graphs=self.num_graphs)

    def _node_rows(self, rows: list[np.ndarray]) -> Tensor:
        """Per-graph rows `[n_g, k]` (graph order) → padded `[b, n_max, k]` float32."""
        return self.scatter_nodes(torch.from_numpy(np.concatenate(rows)).float())

    # ------------------------------------------------------------------ protocol
    @property
    def num_queries(self) -> int:
        return self.n_max

    @property
    def batch_size(self) -> int:
        return self.num_graphs

    @property
    def device(self) -> torch.device:
        return self.device_

    @property
    def padding_mask(self) -> Tensor:
        """`[b, n_max]` bool, True at real tokens (nodes and the virtual token)."""
        return self.valid

    @property
    def node_mask(self) -> Tensor:
        """`[b, n_max]` bool, True at graph nodes only (not the virtual token, not padding)."""
        mask = self.valid.clone()
        if self.virtual_token:
            mask[:, 0] = False
        return mask

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hop count between tokens (float32); unreachable/padding: `max_distance + 1`."""
        return self.distances[self._b(b), q_idx, kv_idx]

    def distance_rows(self, start: int, stop: int) -> Tensor:
        """The `distance` of queries `start … stop−1` to every token.

        [`distance`][mmpe.coords.graph.Graph.distance] of queries `start … stop−1` to every
        token, `[b, 1, stop−start, n_max]` float32: a view of the hop table (no gather)."""
        return self.distances[:, None, start:stop]

    def hops(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The `spd` code of each pair (int64): hops, or `UNREACHABLE` / `VIRTUAL`."""
        return self.spd[self._b(b), q_idx, kv_idx]

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """How far the query's keys lie, in hops.

        How far the query's keys lie (hops, float32): the diameter of its graph, or more for
        a query that also sees unreachable nodes (another component: `max_distance + 1`) —
        so `extent ≥ distance` on every pair the mask allows."""
        return self._extent[self._b(b), q_idx]

    @property
    def _extent(self) -> Tensor:
        if "extent" not in self._cache:
            seen = self.distances.masked_fill(~self.valid[:, None, :], 0.0).amax(dim=-1)
            self._cache["extent"] = torch.maximum(seen, self.diameter[:, None])
        return self._cache["extent"]

    @property
    def has_edge_features(self) -> bool:
        """Whether [`path_edge_attr`][mmpe.coords.graph.Graph.path_edge_attr] can answer: edge features given or precomputed."""
        return self.edge_attr is not None or "path_edge_attr" in self.precomputed

    def prepare(self) -> None:
        """Build the hop tables (scipy, on the host) before FlexAttention traces a score mod."""
        _ = self.distances, self._extent

    @property
    def key_mask(self) -> Tensor:
        """`[b, n_max]` bool, True at real tokens (nodes and the virtual token)."""
        return self.valid

    def mask_mod(self) -> MaskMod | None:
        """Key padding: a query may attend to every real token of its graph, never to padding."""
        if bool(self.valid.all()):
            return None
        valid = self.valid

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return valid[b, kv_idx]

        return mask

    def _b(self, b: Tensor | None) -> Tensor | int:
        if b is None:
            if self.num_graphs != 1:
                raise ValueError("Graph: a batch of graphs needs the batch index b")
            return 0
        return b

    # ------------------------------------------------------------------ pairwise data
    def _pair_slots(self) -> tuple[Tensor, Tensor, Tensor]:
        """Where the precomputed pairs `spd_index` sit: `(graph, query slot, key slot)`."""
        idx = self.precomputed["spd_index"]
        return self.batch_vector[idx[0]], self.node_slot[1][idx[0]], self.node_slot[1][idx[1]]

    @property
    def spd(self) -> Tensor:
        """Hop codes of every pair.

        Hop codes `[b, n_max, n_max]` int64 (clipped at `max_distance`; −1 unreachable or
        padding; −2 pairs with the virtual token; 0 virtual–virtual)."""
        if "spd" not in self._cache:
            out = torch.full((self.num_graphs, self.n_max, self.n_max), UNREACHABLE, dtype=torch.long)
            if "spd" in self.precomputed:
                vals = self.precomputed["spd"]
                out[self._pair_slots()] = torch.where(vals < 0, UNREACHABLE, vals)
            else:
                o = self.offset
                codes = np.full(tuple(out.shape), UNREACHABLE, dtype=np.int64)
                for g, hops in enumerate(self._hops()):
                    n = hops.shape[0]
                    codes[g, o:o + n, o:o + n] = np.where(np.isinf(hops), UNREACHABLE, hops)
                out = torch.from_numpy(codes)
            finite = out >= 0
            out = torch.where(finite, out.clamp(max=self.max_distance), out)
            if self.virtual_token:
                out[:, 0, :] = VIRTUAL
                out[:, :, 0] = VIRTUAL
                out[:, 0, 0] = 0
                out = torch.where(self.valid.cpu()[:, None, :] & self.valid.cpu()[:, :, None], out,
                                  torch.full_like(out, UNREACHABLE))
            self._cache["spd"] = out.to(self.device_)
        return self._cache["spd"]

    @property
    def distances(self) -> Tensor:
        """[`distance`][mmpe.coords.graph.Graph.distance] on all pairs, `[b, n_max, n_max]` float32."""
        if "dist" not in self._cache:
            spd = self.spd
            d = spd.float()
            d = torch.where(spd == UNREACHABLE, float(self.max_distance + 1), d)
            d = torch.where(spd == VIRTUAL, 1.0, d)
            self._cache["dist"] = d
        return self._cache["dist"]

    @property
    def diameter(self) -> Tensor:
        """Per-graph diameter `[b]` (float32, hops, clipped at `max_distance`)."""
        if "diam" not in self._cache:
            spd = self.spd
            self._cache["diam"] = spd.clamp(min=0).flatten(1).max(dim=1).values.float()
        return self._cache["diam"]

    # ------------------------------------------------------------------ per-node data
    def scatter_nodes(self, values: Tensor, fill: float = 0.0) -> Tensor:
        """Per-node values `[num_nodes, ...]` → padded `[b, n_max, ...]` (`fill` elsewhere)."""
        if values.shape[0] != self.node_slot[0].numel():
            raise ValueError(f"Graph: values must have {self.node_slot[0].numel()} rows (one per "
                             f"node), got {tuple(values.shape)}")
        out = values.new_full((self.num_graphs, self.n_max, *values.shape[1:]), fill)
        out[self.node_slot[0].to(values.device), self.node_slot[1].to(values.device)] = values
        return out

    def pad_nodes(self, x: Tensor) -> Tensor:
        """Node features padded to token features.

        Node features `[num_nodes, d]` → token features `[b, n_max, d]` (zeros at padding
        and at the virtual token's slot)."""
        if not isinstance(x, Tensor) or x.dim() < 1:
            raise ValueError("Graph.pad_nodes: x must be a tensor [num_nodes, ...]")
        return self.scatter_nodes(x)

    def unpad_nodes(self, tokens: Tensor) -> Tensor:
        """Token features `[b, n_max, d]` → node features `[num_nodes, d]` (PyG order)."""
        if tokens.dim() < 2 or tuple(tokens.shape[:2]) != (self.num_graphs, self.n_max):
            raise ValueError(f"Graph.unpad_nodes: tokens must be [b={self.num_graphs}, "
                             f"n_max={self.n_max}, ...], got {tuple(tokens.shape)}")
        return tokens[self.node_slot[0].to(tokens.device), self.node_slot[1].to(tokens.device)]

    def _precomputed_columns(self, name: str, k: int, hint: str) -> Tensor | None:
        """The first `k` columns of a precomputed per-node value, padded; None if not given."""
        given = self.precomputed.get(name)
        if given is None:
            return None
        if k > given.shape[1]:
            raise ValueError(f"Graph: {name} was precomputed with {given.shape[1]} columns but "
                             f"{k} were asked; precompute at least {k} ({hint}) or leave {name} "
                             "out to compute it")
        return self.scatter_nodes(given[:, :k])

    def laplacian_pe(self, k: int, normalization: str | None = "sym") -> tuple[Tensor, Tensor]:
        """Laplacian eigenvectors per node, `([b, n_max, k] float32, mask [b, k] bool)`.

        From [`mmpe.graph_maths.laplacian_pe`][mmpe.graph_maths.laplacian_pe] (deterministic signs), or the first `k`
        columns of the precomputed `laplacian_pe` (then a column exists where it is not all
        zero over the graph's nodes). Zeros at padding, virtual token and missing eigenvectors.

        Raises:
            ValueError: `k < 1`; an unknown `normalization`; with a precomputed value, more
                than its columns or another normalization than it was computed with.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"Graph.laplacian_pe: k must be an int >= 1, got {k!r}")
        if normalization not in ("sym", None):
            raise ValueError(f"Graph.laplacian_pe: normalization must be 'sym' or None, got {normalization!r}")
        key = ("lap", k, normalization)
        if key not in self._cache:
            if "laplacian_pe" in self.precomputed and normalization != self.laplacian_normalization:
                raise ValueError(f"Graph: laplacian_pe was precomputed with normalization="
                                 f"{self.laplacian_normalization!r}, {normalization!r} was asked")
            pe = self._precomputed_columns("laplacian_pe", k, f"AddLaplacianPE({k})")
            if pe is not None:
                mask = pe.abs().sum(1) > 0
            elif self.num_graphs == 1:
                vecs, m = laplacian_pe(self.graph_edges(0), int(self.sizes[0]), k, normalization)
                pe, mask = self._node_rows([vecs]), torch.from_numpy(m)[None]
            else:  # all graphs at once (stacked dense eigh for graphs of one size)
                pairs = batched_laplacian_pe(self.edge_index, self.batch_vector, k, normalization,
                                             num_graphs=self.num_graphs)
                pe = self._node_rows([vecs for vecs, _ in pairs])
                mask = torch.from_numpy(np.stack([m for _, m in pairs]))
            self._cache[key] = (pe.to(self.device_), mask.to(self.device_))
        return self._cache[key]

    def rwse(self, k: int) -> Tensor:
        """Random-walk return probabilities of every node.

        Random-walk return probabilities `[b, n_max, k]` float32, `t = 1 … k`
        ([`mmpe.graph_maths.random_walk_pe`][mmpe.graph_maths.random_walk_pe], or the first `k` precomputed columns).

        Raises:
            ValueError: `k < 1`; more columns than a precomputed `rwse` has.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"Graph.rwse: k must be an int >= 1, got {k!r}")
        key = ("rwse", k)
        if key not in self._cache:
            pe = self._precomputed_columns("rwse", k, f"AddRWSE({k})")
            if pe is None and self.num_graphs == 1:
                pe = self._node_rows([random_walk_pe(self.graph_edges(0), int(self.sizes[0]), k,
                                                     undirected=False)])
            elif pe is None:  # all graphs at once (stacked dense products)
                pe = self._node_rows(batched_random_walk_pe(
                    self.edge_index, self.batch_vector, k, undirected=False,
                    num_graphs=self.num_graphs))
            self._cache[key] = pe.to(self.device_)
        return self._cache[key]

    def _degree(self, name: str) -> Tensor:
        if name not in self._cache:
            value = self.precomputed.get(name)
            if value is None:
                in_deg, out_deg = degrees(self.edge_index, self.node_slot[0].numel())
                value = torch.from_numpy(in_deg if name == "in_degree" else out_deg)
            self._cache[name] = self.scatter_nodes(value).to(self.device_)
        return self._cache[name]

    @property
    def in_degree(self) -> Tensor:
        """Edges into each node, `[b, n_max]` int64 (0 at padding and the virtual token)."""
        return self._degree("in_degree")

    @property
    def out_degree(self) -> Tensor:
        """Edges out of each node, `[b, n_max]` int64."""
        return self._degree("out_degree")

    def path_edge_attr(self, max_hops: int) -> tuple[Tensor, Tensor]:
        """Edge features along one shortest path per pair.

        Edge features along one shortest path per pair (Graphormer edge encoding, Ying et al.
        2021 eq. 7).

        For each token pair `(i, j)` of a graph, the first `max_hops` edges `e_1 … e_N`
        of the shortest path from `i` to `j` ([`mmpe.graph_maths.path_edge_ids`][mmpe.graph_maths.path_edge_ids]), or
        the precomputed `path_edge_attr`/`path_edge_mask`.

        Returns:
            `attr [b, n_max, n_max, max_hops, F]` (`edge_attr`'s dtype; zeros where no
                edge) and `valid [b, n_max, n_max, max_hops]` bool.

        Raises:
            ValueError: `max_hops < 1`; the graph has no `edge_attr` (and nothing was
                precomputed); more hops than the precomputed value holds.
        """
        if isinstance(max_hops, bool) or not isinstance(max_hops, int) or max_hops < 1:
            raise ValueError(f"Graph.path_edge_attr: max_hops must be an int >= 1, got {max_hops!r}")
        key = ("path", max_hops)
        if key in self._cache:
            return self._cache[key]
        shape = (self.num_graphs, self.n_max, self.n_max, max_hops)
        if "path_edge_attr" in self.precomputed:
            pre, pre_mask = self.precomputed["path_edge_attr"], self.precomputed["path_edge_mask"]
            if max_hops > pre.shape[1]:
                raise ValueError(f"Graph: path_edge_attr was precomputed for {pre.shape[1]} hops but "
                                 f"max_hops={max_hops} was asked; precompute more "
                                 f"(AddShortestPaths(edge_hops={max_hops})) or leave it out")
            attr = torch.zeros(*shape, pre.shape[2], dtype=pre.dtype)
            valid = torch.zeros(shape, dtype=torch.bool)
            slots = self._pair_slots()
            attr[slots] = pre[:, :max_hops]
            valid[slots] = pre_mask[:, :max_hops]
        else:
            if self.edge_attr is None:
                raise ValueError("Graph: path_edge_attr needs edge_attr (give edge_attr=, a Data "
                                 "with it, or precomputed path_edge_attr=)")
            feat = self.edge_attr.cpu()
            attr = torch.zeros(*shape, feat.shape[1], dtype=feat.dtype)
            valid = torch.zeros(shape, dtype=torch.bool)
            for g in range(self.num_graphs):
                n, o = int(self.sizes[g]), self.offset
                ids, v = path_edge_ids(self.graph_edges(g), n, max_hops, undirected=self.undirected,
                                       paths=self._paths(g))
                if not v.any():
                    continue
                v_t = torch.from_numpy(v)
                rows = torch.from_numpy(self._graph_edge_ids(g)[np.maximum(ids, 0)])
                attr[g, o:o + n, o:o + n] = torch.where(v_t[..., None], feat[rows],
                                                        torch.zeros((), dtype=feat.dtype))
                valid[g, o:o + n, o:o + n] = v_t
        self._cache[key] = (attr.to(self.device_), valid.to(self.device_))
        return self._cache[key]

    def __repr__(self) -> str:
        given = f", precomputed={sorted(self.precomputed)}" if self.precomputed else ""
        return (f"Graph(num_graphs={self.num_graphs}, n_max={self.n_max}, "
                f"max_distance={self.max_distance}, virtual_token={self.virtual_token}{given})")
