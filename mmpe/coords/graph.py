"""Graphs: nodes are tokens, position is topology (shortest-path hops, spectra, random walks).

A batch of graphs of different sizes becomes a padded token set ``[b, n_max]`` (graph ``g``'s
node ``i`` sits in slot ``(g, i)``; slots past the graph's size are padding, masked as keys by
:meth:`Graph.mask_mod`). With ``virtual_token=True`` every graph gets one extra token in slot 0
(Graphormer's virtual graph node, Ying et al. 2021 §3.1): its nodes then sit in slots
``1 … n``.

Pairwise and per-node data are computed on demand with scipy and cached on the object:

* ``spd`` — all-pairs shortest-path hop counts (``scipy.sparse.csgraph.shortest_path``,
  unweighted BFS), clipped at ``max_distance``; an unreachable pair has its own code
  :data:`UNREACHABLE` (−1), a pair with the virtual token :data:`VIRTUAL` (−2);
* ``laplacian_pe(k)`` — ``k`` smallest non-trivial Laplacian eigenvectors
  (:mod:`mmpe.coords.spectral`), zero-padded and masked for graphs with ``n < k + 1``;
* ``rwse(k)`` — random-walk return probabilities ``[(D⁻¹A)^t]_ii``, ``t = 1 … k``;
* ``in_degree`` / ``out_degree``;
* ``path_edge_attr(max_hops)`` — the edge features along one shortest path per pair
  (Graphormer's edge encoding).

Precomputed attributes on a PyG ``Data``/``Batch`` (attached by the transforms of
:mod:`mmpe.integrations.pyg`, e.g. as a ``pre_transform``) are used instead of recomputing:
``spd``/``spd_index``, ``laplacian_eigenvector_pe``, ``random_walk_pe``, ``in_degree``,
``out_degree``, ``spd_edge_attr``/``spd_edge_mask``.

Conventions: the edge list is coalesced (duplicate edges count once) and, with
``undirected=True`` (default), symmetrised for shortest paths, Laplacians and random walks.
Self-loops are ignored by shortest paths and Laplacians; a random walk may take them (as in
PyG's ``AddRandomWalkPE``). Degrees count the coalesced edge list as given (in: edges into the
node, out: edges leaving it; a PyG undirected graph stores both directions, so in = out).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import shortest_path
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.spectral import laplacian_eigenvectors

__all__ = ["UNREACHABLE", "VIRTUAL", "Graph", "random_walk_pe", "shortest_path_hops"]

#: ``spd`` code of a pair with no path between them (and of pairs involving padding).
UNREACHABLE = -1
#: ``spd`` code of a pair that involves the virtual graph token.
VIRTUAL = -2


def _np_adjacency(edge_index: np.ndarray, n: int, undirected: bool, self_loops: bool) -> sp.csr_matrix:
    row, col = edge_index
    if not self_loops:
        keep = row != col
        row, col = row[keep], col[keep]
    if undirected:
        row, col = np.concatenate([row, col]), np.concatenate([col, row])
    a = sp.csr_matrix((np.ones(len(row)), (row, col)), shape=(n, n))
    a.data[:] = 1.0  # coalesce: duplicates count once
    return a


def shortest_path_hops(edge_index: np.ndarray | Tensor, num_nodes: int, undirected: bool = True,
                       return_predecessors: bool = False):
    """All-pairs hop counts of one graph (BFS via ``scipy.sparse.csgraph.shortest_path``).

    Returns ``float64 [n, n]`` with ``inf`` for unreachable pairs (and predecessors ``[n, n]``
    int, −9999 where none, when asked).
    """
    ei = np.asarray(edge_index.cpu() if isinstance(edge_index, Tensor) else edge_index)
    adj = _np_adjacency(ei.reshape(2, -1), num_nodes, undirected, self_loops=False)
    return shortest_path(adj, method="D", directed=not undirected, unweighted=True,
                         return_predecessors=return_predecessors)


def random_walk_pe(edge_index: np.ndarray | Tensor, num_nodes: int, k: int,
                   undirected: bool = False) -> np.ndarray:
    """Return probabilities ``[(D⁻¹A)^t]_ii`` for ``t = 1 … k`` (RWSE, Dwivedi et al. 2022).

    ``A`` is the coalesced adjacency of ``edge_index`` (self-loops kept; symmetrised when
    ``undirected``), ``D`` its out-degrees clamped to ≥ 1 (an isolated node never returns).
    This is PyG's ``AddRandomWalkPE`` on a coalesced edge list. Returns ``float64 [n, k]``.
    """
    ei = np.asarray(edge_index.cpu() if isinstance(edge_index, Tensor) else edge_index)
    adj = _np_adjacency(ei.reshape(2, -1), num_nodes, undirected, self_loops=True)
    deg = np.maximum(np.asarray(adj.sum(axis=1)).ravel(), 1.0)
    walk = sp.diags(1.0 / deg) @ adj
    out = np.zeros((num_nodes, k))
    if num_nodes <= 2000:
        walk = walk.toarray()
        power = walk
        for t in range(k):
            out[:, t] = np.diag(power)
            if t + 1 < k:
                power = power @ walk
    else:
        power = walk.tocsr()
        for t in range(k):
            out[:, t] = power.diagonal()
            if t + 1 < k:
                power = power @ walk
    return out


class Graph(Coordinates):
    """Coordinates of a batch of graphs (units: hops).

    Args:
        graph: a PyG ``Data``/``Batch`` (its ``edge_index``, ``num_nodes``, ``batch``,
            ``edge_attr`` and any precomputed attributes are read), or an ``edge_index``
            ``[2, E]`` integer tensor.
        num_nodes: total node count (required with an ``edge_index``).
        batch: graph id of every node ``[num_nodes]`` (sorted, as PyG builds it); None = one graph.
        edge_attr: edge features ``[E, F]`` (integer categories or floats), for Graphormer's
            edge encoding.
        max_distance: hop counts above it are clipped to it (``distance`` of an unreachable pair
            is ``max_distance + 1``).
        undirected: treat edges as undirected for paths, Laplacians and walks.
        virtual_token: add a virtual graph token in slot 0 of every graph.
        device: where the tensors live (default: ``edge_index``'s device).

    Per-pair ``distance(q, k, b)``: hop count (float) — 0 on the diagonal, ``max_distance + 1``
    for unreachable pairs and padding, 1 between the virtual token and any node (it is
    adjacent to all of them; node–node distances never pass through it). ``extent(q, b)``:
    the diameter of graph ``b`` (largest finite clipped hop count; 0 for one node).

    Raises:
        TypeError: ``graph`` is neither a PyG data object nor a tensor; non-integer
            ``edge_index`` or ``batch``.
        ValueError: ``edge_index`` not ``[2, E]``; node ids outside ``[0, num_nodes)``;
            ``num_nodes`` missing or < 1; ``batch`` of the wrong length, unsorted, or edges
            joining two graphs; ``edge_attr`` with a row count other than ``E``;
            ``max_distance < 1``.
    """

    kind = "graph"
    directed = False

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
    ) -> None:
        self._data = None
        if hasattr(graph, "edge_index") and not isinstance(graph, Tensor):
            self._data = graph
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
        self._cache: dict[Any, Any] = {}
        valid = torch.zeros(self.num_graphs, self.n_max, dtype=torch.bool)
        valid[self.node_slot] = True
        if virtual_token:
            valid[:, 0] = True
        self.valid = valid.to(self.device_)

    def cached(self, key: Any, compute: Any) -> Any:
        """``compute()`` once per coordinates object and ``key`` (for parameter-free data that
        encodings derive from these coordinates, e.g. Graphormer's path-edge codes)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # ------------------------------------------------------------------ per-graph views
    def graph_edges(self, g: int) -> np.ndarray:
        """Local ``edge_index`` ``[2, E_g]`` (numpy) of graph ``g``."""
        sel = self._edge_graph == g
        return (self.edge_index[:, sel] - self.ptr[g]).numpy()

    def _graph_edge_ids(self, g: int) -> np.ndarray:
        return torch.nonzero(self._edge_graph == g).flatten().numpy()

    # ------------------------------------------------------------------ protocol
    @property
    def num_queries(self) -> int:
        return self.n_max


    @property
    def query_positions(self) -> Tensor:
        """Node index within its graph ``[b, n_max, 1]`` (int64; a label, not a geometry)."""
        idx = torch.arange(self.n_max, device=self.device_) - self.offset
        return idx.clamp(min=0).expand(self.num_graphs, -1).unsqueeze(-1)


    @property
    def batch_size(self) -> int:
        return self.num_graphs

    @property
    def device(self) -> torch.device:
        return self.device_

    @property
    def padding_mask(self) -> Tensor:
        """``[b, n_max]`` bool, True at real tokens (nodes and the virtual token)."""
        return self.valid

    @property
    def node_mask(self) -> Tensor:
        """``[b, n_max]`` bool, True at graph nodes only (not the virtual token, not padding)."""
        mask = self.valid.clone()
        if self.virtual_token:
            mask[:, 0] = False
        return mask

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Undirected: the hop distance (see :meth:`distance`)."""
        return self.distance(q_idx, kv_idx, b)

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hop count between tokens (float32); unreachable/padding: ``max_distance + 1``."""
        return self.distances[self._b(b), q_idx, kv_idx]

    def hops(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The ``spd`` code of each pair (int64): hops, or :data:`UNREACHABLE` / :data:`VIRTUAL`."""
        return self.spd[self._b(b), q_idx, kv_idx]

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Diameter (hops) of the query's graph, broadcast to ``q_idx``'s shape (float32)."""
        diam = self.diameter[self._b(b)]
        return diam + torch.zeros_like(q_idx, dtype=diam.dtype)

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
    @property
    def spd(self) -> Tensor:
        """Hop codes ``[b, n_max, n_max]`` int64 (clipped at ``max_distance``; −1 unreachable or
        padding; −2 pairs with the virtual token; 0 virtual–virtual)."""
        if "spd" not in self._cache:
            out = torch.full((self.num_graphs, self.n_max, self.n_max), UNREACHABLE, dtype=torch.long)
            pre = self._pre("spd")
            if pre is not None and self._pre("spd_index") is not None:
                idx = self._pre("spd_index").long().cpu()
                vals = pre.long().cpu()
                g = self.batch_vector[idx[0]]
                out[g, self.node_slot[1][idx[0]], self.node_slot[1][idx[1]]] = vals
            else:
                for g in range(self.num_graphs):
                    n = int(self.sizes[g])
                    hops, pred = shortest_path_hops(self.graph_edges(g), n, self.undirected,
                                                    return_predecessors=True)
                    self._cache[("paths", g)] = (hops, pred)  # reused by path_edge_attr
                    h = torch.from_numpy(np.where(np.isinf(hops), UNREACHABLE, hops)).long()
                    o = self.offset
                    out[g, o:o + n, o:o + n] = h
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
        """:meth:`distance` on all pairs, ``[b, n_max, n_max]`` float32."""
        if "dist" not in self._cache:
            spd = self.spd
            d = spd.float()
            d = torch.where(spd == UNREACHABLE, float(self.max_distance + 1), d)
            d = torch.where(spd == VIRTUAL, 1.0, d)
            self._cache["dist"] = d
        return self._cache["dist"]

    @property
    def diameter(self) -> Tensor:
        """Per-graph diameter ``[b]`` (float32, hops, clipped at ``max_distance``)."""
        if "diam" not in self._cache:
            spd = self.spd
            self._cache["diam"] = spd.clamp(min=0).flatten(1).max(dim=1).values.float()
        return self._cache["diam"]

    # ------------------------------------------------------------------ per-node data
    def _pre(self, name: str) -> Tensor | None:
        data = self._data
        if data is None:
            return None
        try:
            return getattr(data, name, None)
        except (AttributeError, KeyError):  # pragma: no cover - PyG storage quirks
            return None

    def scatter_nodes(self, values: Tensor, fill: float = 0.0) -> Tensor:
        """Per-node values ``[num_nodes, ...]`` → padded ``[b, n_max, ...]`` (``fill`` elsewhere)."""
        if values.shape[0] != self.node_slot[0].numel():
            raise ValueError(f"Graph: values must have {self.node_slot[0].numel()} rows (one per "
                             f"node), got {tuple(values.shape)}")
        out = values.new_full((self.num_graphs, self.n_max, *values.shape[1:]), fill)
        out[self.node_slot[0].to(values.device), self.node_slot[1].to(values.device)] = values
        return out

    def pad_nodes(self, x: Tensor) -> Tensor:
        """Node features ``[num_nodes, d]`` → token features ``[b, n_max, d]`` (zeros at padding
        and at the virtual token's slot)."""
        if not isinstance(x, Tensor) or x.dim() < 1:
            raise ValueError("Graph.pad_nodes: x must be a tensor [num_nodes, ...]")
        return self.scatter_nodes(x)

    def unpad_nodes(self, tokens: Tensor) -> Tensor:
        """Token features ``[b, n_max, d]`` → node features ``[num_nodes, d]`` (PyG order)."""
        if tokens.dim() < 2 or tuple(tokens.shape[:2]) != (self.num_graphs, self.n_max):
            raise ValueError(f"Graph.unpad_nodes: tokens must be [b={self.num_graphs}, "
                             f"n_max={self.n_max}, ...], got {tuple(tokens.shape)}")
        return tokens[self.node_slot[0].to(tokens.device), self.node_slot[1].to(tokens.device)]

    def laplacian_pe(self, k: int, normalization: str | None = "sym") -> tuple[Tensor, Tensor]:
        """Laplacian eigenvectors per node, ``([b, n_max, k] float32, mask [b, k] bool)``.

        From :func:`mmpe.coords.spectral.laplacian_eigenvectors` (deterministic signs), or a
        precomputed ``laplacian_eigenvector_pe`` attribute (then the mask is all True where the
        columns are not all zero). Zeros at padding, virtual token and missing eigenvectors.
        """
        key = ("lap", k, normalization)
        if key not in self._cache:
            pre = self._pre("laplacian_eigenvector_pe")
            mask = torch.zeros(self.num_graphs, k, dtype=torch.bool)
            if pre is not None and pre.shape[-1] == k and normalization == "sym":
                pe = self.scatter_nodes(pre.float().cpu())
                mask = pe.abs().sum(1) > 0
            else:
                pe = torch.zeros(self.num_graphs, self.n_max, k)
                for g in range(self.num_graphs):
                    n = int(self.sizes[g])
                    adj = _np_adjacency(self.graph_edges(g), n, True, self_loops=False)
                    _, vecs, m = laplacian_eigenvectors(adj, k, normalization, return_mask=True)
                    pe[g, self.offset:self.offset + n] = torch.from_numpy(vecs).float()
                    mask[g] = torch.from_numpy(m)
            self._cache[key] = (pe.to(self.device_), mask.to(self.device_))
        return self._cache[key]

    def rwse(self, k: int) -> Tensor:
        """Random-walk return probabilities ``[b, n_max, k]`` float32, ``t = 1 … k``."""
        key = ("rwse", k)
        if key not in self._cache:
            pre = self._pre("random_walk_pe")
            if pre is not None and pre.shape[-1] == k:
                pe = self.scatter_nodes(pre.float().cpu())
            else:
                pe = torch.zeros(self.num_graphs, self.n_max, k)
                for g in range(self.num_graphs):
                    n = int(self.sizes[g])
                    rw = random_walk_pe(self.graph_edges(g), n, k, undirected=False)
                    pe[g, self.offset:self.offset + n] = torch.from_numpy(rw).float()
            self._cache[key] = pe.to(self.device_)
        return self._cache[key]

    def _degree(self, which: int, name: str) -> Tensor:
        if name not in self._cache:
            pre = self._pre(name)
            if pre is None:
                n_total = self.node_slot[0].numel()
                ei = self.edge_index
                if ei.numel():
                    ei = torch.unique(ei, dim=1)  # coalesce duplicates
                pre = torch.bincount(ei[which], minlength=n_total)
            self._cache[name] = self.scatter_nodes(pre.long().cpu()).to(self.device_)
        return self._cache[name]

    @property
    def in_degree(self) -> Tensor:
        """Edges into each node, ``[b, n_max]`` int64 (0 at padding and the virtual token)."""
        return self._degree(1, "in_degree")

    @property
    def out_degree(self) -> Tensor:
        """Edges out of each node, ``[b, n_max]`` int64."""
        return self._degree(0, "out_degree")

    def path_edge_attr(self, max_hops: int) -> tuple[Tensor, Tensor]:
        """Edge features along one shortest path per pair (Graphormer edge encoding).

        For each token pair ``(i, j)`` of a graph, the first ``max_hops`` edges ``e_1 … e_N``
        of the shortest path from ``i`` to ``j`` chosen by scipy's predecessor matrix.

        Returns:
            ``attr [b, n_max, n_max, max_hops, F]`` (``edge_attr``'s dtype; zeros where no
            edge) and ``valid [b, n_max, n_max, max_hops]`` bool.

        Raises:
            ValueError: the graph has no ``edge_attr``.
        """
        key = ("path", max_hops)
        if key in self._cache:
            return self._cache[key]
        if self.edge_attr is None:
            raise ValueError("Graph: path_edge_attr needs edge_attr (give edge_attr= or a Data with it)")
        feat = self.edge_attr.cpu()
        f = feat.shape[1]
        attr = torch.zeros(self.num_graphs, self.n_max, self.n_max, max_hops, f, dtype=feat.dtype)
        valid = torch.zeros(self.num_graphs, self.n_max, self.n_max, max_hops, dtype=torch.bool)
        pre, pre_mask = self._pre("spd_edge_attr"), self._pre("spd_edge_mask")
        if (pre is not None and pre_mask is not None and self._pre("spd_index") is not None
                and pre.shape[1] >= max_hops):
            idx = self._pre("spd_index").long().cpu()
            g = self.batch_vector[idx[0]]
            qi, ki = self.node_slot[1][idx[0]], self.node_slot[1][idx[1]]
            attr[g, qi, ki] = pre[:, :max_hops].to(feat.dtype).cpu()
            valid[g, qi, ki] = pre_mask[:, :max_hops].bool().cpu()
        else:
            _ = self.spd  # fills the per-graph (hops, predecessors) cache when it computes
            for g in range(self.num_graphs):
                n, o = int(self.sizes[g]), self.offset
                a, v = _path_edges_one(self.graph_edges(g), self._graph_edge_ids(g), n, max_hops,
                                       self.undirected, self._cache.get(("paths", g)))
                if not v.any():
                    continue
                v_t = torch.from_numpy(v)
                attr[g, o:o + n, o:o + n] = feat[torch.from_numpy(a).clamp(min=0)] * v_t[..., None].to(feat.dtype)
                valid[g, o:o + n, o:o + n] = v_t
        self._cache[key] = (attr.to(self.device_), valid.to(self.device_))
        return self._cache[key]

    def __repr__(self) -> str:
        return (f"Graph(num_graphs={self.num_graphs}, n_max={self.n_max}, "
                f"max_distance={self.max_distance}, virtual_token={self.virtual_token})")


def _path_edges_one(edges: np.ndarray, edge_ids: np.ndarray, n: int, max_hops: int,
                    undirected: bool, paths: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Global edge ids ``[n, n, max_hops]`` (−1: none) of the first ``max_hops`` edges along
    scipy's shortest path ``i → j``, and their validity. ``paths``: precomputed
    ``(hops, predecessors)`` of the graph."""
    dist, pred = paths if paths is not None else shortest_path_hops(
        edges, n, undirected, return_predecessors=True)
    eid = -np.ones((n, n), dtype=np.int64)
    # Later duplicates overwrite earlier ones: any edge between u and v is "the" edge.
    eid[edges[0], edges[1]] = edge_ids
    if undirected:
        missing = eid[edges[1], edges[0]] < 0
        eid[edges[1][missing], edges[0][missing]] = edge_ids[missing]
    out = -np.ones((n, n, max_hops), dtype=np.int64)
    finite = np.isfinite(dist)
    d = np.where(finite, dist, 0).astype(np.int64)
    rows = np.repeat(np.arange(n)[:, None], n, axis=1)
    cur = np.repeat(np.arange(n)[None, :], n, axis=0)  # walk back from j towards i
    step = 0
    while True:
        active = finite & (d - step > 0)
        if not active.any():
            break
        prev = np.where(active, pred[rows, cur], 0)
        hop = d - 1 - step  # position of edge (prev → cur) on the path from i
        keep = active & (hop < max_hops)
        ii, jj = np.nonzero(keep)
        out[ii, jj, hop[keep]] = eid[prev[keep], cur[keep]]
        cur = np.where(active, prev, cur)
        step += 1
    return out, out >= 0
