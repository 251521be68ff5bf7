"""Graph maths as pure functions of one graph: shortest paths, random walks, spectra, degrees.

Every function takes one graph as an edge list `edge_index [2, E]` (a numpy array or a torch
tensor of integers; column `e` is the edge `edge_index[0, e] → edge_index[1, e]`) and its
node count `num_nodes` (node ids lie in `[0, num_nodes)`; nodes without edges are isolated),
and returns numpy arrays. Nothing is cached and nothing is padded: [`mmpe.coords.Graph`][mmpe.coords.graph.Graph]
calls these (the `batched_*` ones for a batch of several graphs) and lays the results out as
padded `[b, n_max]` tokens, and the PyG transforms of [`mmpe.integrations.pyg`][mmpe.integrations.pyg] call them
to precompute.

Small graphs take dense kernels on stacks `[G, n, n]` (a vectorised Floyd–Warshall for hops up
to `DENSE_HOPS_MAX` nodes, matrix products for random walks up to 128 nodes, one `eigh`
of the whole Laplacian up to `BATCHED_DENSE_MAX` nodes): the fixed cost of a sparse
library call dominates there. A graph gets the same numbers, bit for bit, alone (a stack of one)
or through the `batched_*` functions (graphs of one size stacked).

Conventions:

* the edge list is **coalesced** (a duplicate edge counts once);
* `undirected=True` symmetrises it (an edge `u → v` is also `v → u`) — the default of
  shortest paths; Laplacians are always built on the symmetrised graph;
* self-loops are ignored by shortest paths and Laplacians; a random walk may take them (as in
  PyG's `AddRandomWalkPE`); degrees count them once (in and out);
* distances are **hops** (edge counts), `inf` between nodes with no path.

Functions (papers where a formula is implemented):

=============================  ===============================================================
[`adjacency`][mmpe.graph_maths.adjacency]              coalesced 0/1 adjacency, `scipy.sparse` CSR `[n, n]`
[`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops]     all-pairs hops (BFS, `scipy.sparse.csgraph`; dense
                               Floyd–Warshall on small graphs), predecessors
[`random_walk_pe`][mmpe.graph_maths.random_walk_pe]         `[(D⁻¹A)^t]_ii`, `t = 1 … k` (RWSE; Dwivedi et al. 2022)
[`laplacian_pe`][mmpe.graph_maths.laplacian_pe]           `k` smallest non-trivial Laplacian eigenvectors (LapPE;
                               Dwivedi & Bresson 2020), from [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]
[`degrees`][mmpe.graph_maths.degrees]                in- and out-degrees (Graphormer centrality; Ying et al. 2021)
[`path_edge_ids`][mmpe.graph_maths.path_edge_ids]          the edges along one shortest path per pair (Graphormer eq. 7)
[`path_edge_features`][mmpe.graph_maths.path_edge_features]     their features `x_{e_1} … x_{e_N}` (Graphormer eq. 7)
=============================  ===============================================================

Spectral helpers (formerly `mmpe.coords.spectral`, still importable from there), for a
symmetric, non-negative weighted adjacency `A` (`n × n`) with degrees `D = diag(A·1)`:

* `normalization=None` — combinatorial Laplacian `L = D − A`;
* `normalization="sym"` — `L = I − D^{-1/2} A D^{-1/2}` (eigenvalues in `[0, 2]`).

Both are built by `scipy.sparse.csgraph.laplacian`, which **ignores the diagonal of**
`A` (self-loops do not enter the Laplacian) and gives an isolated node a zero row (so each
connected component, isolated nodes included, contributes one zero eigenvalue; PyG's
`get_laplacian` instead puts 1 on an isolated node's diagonal).

[`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] returns the `k` smallest **non-trivial** eigenpairs: the
eigenpairs sorted by eigenvalue with the first (the trivial one, eigenvalue 0, vector
`∝ D^{1/2}·1`; `∝ 1` for `D − A`) dropped — the convention of PyG's
`AddLaplacianEigenvectorPE`. On a disconnected graph (isolated nodes are components of their
own) the zero eigenspace has one dimension per component; it is built in closed form (the
per-component vectors `∝ D^{1/2}·1_C`, `e_i` for an isolated node), the graph-wide trivial
vector is dropped from it, and the other `c − 1` zero eigenvalues are kept, with a fixed
orthonormal basis of the rest: they are informative positions (which component a node is in).
The non-zero eigenpairs are those of each component's own Laplacian (the Laplacian is block
diagonal over components), found per component: dense `eigh` below
`DENSE_THRESHOLD` nodes, shift-invert `eigsh` above, whose completeness (every copy of
a repeated eigenvalue: Lanczos from one start vector sees one vector per eigenspace) is checked
by counting the eigenvalues below a point of the spectrum with Sylvester's law of inertia, with
deflation passes where the count says some are missing. Both paths give the same eigenvalues
and eigenspaces (tested). [`laplacian_pe`][mmpe.graph_maths.laplacian_pe] solves graphs of at most
`BATCHED_DENSE_MAX` nodes by one dense `eigh` of the whole Laplacian (same conventions;
within a repeated eigenvalue the basis may differ from the per-component one).

Sign convention (deterministic): every eigenvector is flipped so that its entry of largest
absolute value is positive (ties within `1e-8` go to the lowest node index). Eigenvectors
of a repeated eigenvalue are only defined up to a rotation of their subspace; the solver's
basis is returned as is. Models should not rely on the sign: [`random_sign_flip`][mmpe.graph_maths.random_sign_flip]
multiplies every eigenvector by an independent random ±1 (LapPE training augmentation,
Dwivedi & Bresson 2020).

References:
    Dwivedi & Bresson 2020, "A Generalization of Transformer Networks to Graphs" (AAAI DLG).
    Dwivedi, Luu, Laurent, Bengio & Bresson 2022, "Graph Neural Networks with Learnable
    Structural and Positional Representations" (ICLR).
    Ying et al. 2021, "Do Transformers Really Perform Bad for Graph Representation?" (NeurIPS).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from mmpe.validation import check_positive_int

if TYPE_CHECKING:  # scipy is imported where it is called (issue 52)
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator

__all__ = [
    "BATCHED_DENSE_MAX", "DENSE_HOPS_MAX", "DENSE_THRESHOLD", "adjacency", "batched_degrees",
    "batched_laplacian_eigenvectors", "batched_laplacian_pe", "batched_random_walk_pe",
    "batched_shortest_path_hops", "collate_edges", "canonical_sign", "degrees", "graph_laplacian",
    "laplacian_eigenvectors", "laplacian_pe", "path_edge_features", "path_edge_ids",
    "random_sign_flip", "random_walk_pe", "shortest_path_hops",
]

#: Connected components with fewer nodes than this use the dense ``scipy.linalg.eigh``; larger
#: ones ``eigsh`` (shift-invert Lanczos, `laplacian_eigenvectors`).
DENSE_THRESHOLD = 100

#: Nodes up to which `random_walk_pe` always multiplies dense matrices (stacked by
#: `batched_random_walk_pe`); up to `_DENSE_WALK` it starts with sparse products and
#: turns dense when the powers fill in; above, sparse products only (memory).
_STACK_WALK = 128
_DENSE_WALK = 2000

#: Cost of one output entry of a ``scipy.sparse`` product, and of one entry of the row-wise
#: sums of the long walks, in dense BLAS multiply-adds (measured on random graphs and grids of
#: 256–2000 nodes), for that choice.
_SPARSE_ENTRY, _SPARSE_SUM = 680.0, 240.0

#: Nodes up to which `shortest_path_hops` (without predecessors) and
#: `batched_shortest_path_hops` run a vectorised Floyd–Warshall on the dense hop matrix
#: (``n`` broadcast minimum steps of ``n²`` entries) instead of ``scipy.sparse.csgraph``: on small
#: graphs the fixed cost of a csgraph call (about 0.1 ms) dominates; near 56 nodes the ``n³``
#: work of Floyd–Warshall catches up with BFS (measured: 13 µs vs 0.12 ms at 10 nodes, a tie at
#: 56 on a path graph).
DENSE_HOPS_MAX = 48

#: Nodes up to which `laplacian_pe` and `batched_laplacian_eigenvectors` solve the
#: dense Laplacian with one ``numpy.linalg.eigh`` (stacked over graphs of the same size); larger
#: graphs go through `laplacian_eigenvectors` (per component, shift-invert ``eigsh``
#: above `DENSE_THRESHOLD` nodes). Dense ``eigh`` of 256 nodes takes about 5 ms, the
#: sparse path more on graphs this small.
BATCHED_DENSE_MAX = 256


# ---------------------------------------------------------------------------- input checks
def _num_nodes(num_nodes: Any, fn: str) -> int:
    if isinstance(num_nodes, Tensor) and num_nodes.numel() == 1 and not num_nodes.is_floating_point():
        num_nodes = int(num_nodes)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 0:
        raise ValueError(f"{fn}: num_nodes must be an int >= 0, got {num_nodes!r}")
    return int(num_nodes)


def _positive_int(value: Any, name: str, fn: str) -> int:
    check_positive_int(fn, name, value)
    return int(value)


def _edges(edge_index: Any, num_nodes: int, fn: str) -> np.ndarray:
    """`edge_index` as an int64 numpy `[2, E]` with ids in `[0, num_nodes)`, or an error."""
    if isinstance(edge_index, Tensor):
        edge_index = edge_index.detach().cpu().numpy()
    if not isinstance(edge_index, np.ndarray):
        raise TypeError(f"{fn}: edge_index must be a numpy array or a torch.Tensor [2, E], "
                        f"got {type(edge_index).__name__}")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{fn}: edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if edge_index.size and edge_index.dtype.kind not in "iu":
        raise TypeError(f"{fn}: edge_index must hold integers, got dtype {edge_index.dtype}")
    ei = edge_index.astype(np.int64, copy=False)
    if ei.size and (int(ei.min()) < 0 or int(ei.max()) >= num_nodes):
        raise ValueError(f"{fn}: edge_index holds node ids in [{int(ei.min())}, {int(ei.max())}], "
                         f"outside [0, num_nodes={num_nodes})")
    return ei


def _normalization(normalization: Any, fn: str) -> str | None:
    if normalization not in (None, "sym"):
        raise ValueError(f"{fn}: normalization must be 'sym' or None, got {normalization!r}")
    return normalization


# ---------------------------------------------------------------------------- dense kernels
# Kernels on stacks of dense ``[G, n, n]`` matrices, shared by the one-graph functions (a stack
# of one) and the ``batched_*`` functions (graphs of one node count stacked): numpy runs the
# same BLAS/LAPACK call on every slice of a stack and element-wise operations round each entry
# on its own, so a graph gets the same numbers, bit for bit, alone or in a batch.

#: Eigenvalues of a dense Laplacian (``n <= BATCHED_DENSE_MAX``) below this count as zero when
#: looking for disconnected graphs (only those get a ``connected_components`` call, which then
#: decides). ``eigh`` errs by about ``n·eps·‖L‖ < 1e-10``; a connected graph's smallest
#: non-zero eigenvalue is at least ``1/(diameter·volume) > 1/n³ ≈ 6e-8`` for
#: ``I − D^-½AD^-½`` (Chung 1997, Lemma 1.9) and ``4/(n·diameter) >= 4/n²`` for ``D − A``
#: (Mohar 1991), so the count never misses a zero eigenvalue nor takes a non-zero one.
_ZERO_EIGENVALUE = 1e-9


def _stack_edges(rows: np.ndarray, cols: np.ndarray, slot: np.ndarray, local: np.ndarray,
                 count: int, n: int, fill: float = 0.0) -> np.ndarray:
    """`[count, n, n]` float64 holding `fill`, and 1 at `(slot[u], local[u], local[v])`
    for every edge `u → v` (`rows[e], cols[e]`) with `slot[u] >= 0`."""
    out = np.full((count, n, n), fill)
    keep = slot[rows] >= 0
    r, c = rows[keep], cols[keep]
    out[slot[r], local[r], local[c]] = 1.0
    return out


def _floyd_warshall(hops: np.ndarray) -> np.ndarray:
    """All-pairs hop counts of a stack of small graphs, in place.

    `hops [G, n, n]` float64 holds 1 on edges, 0 on the diagonal and `inf` elsewhere; after
    `n` broadcast steps `hops[g, i, j] = min_k hops[g, i, k] + hops[g, k, j]` it holds the
    shortest-path hop counts (`inf`: no path). Exact: the entries are small integers or inf.
    """
    for k in range(hops.shape[-1]):
        np.minimum(hops, hops[:, :, k, None] + hops[:, None, k, :], out=hops)
    return hops


def _walk_diagonals(walk: np.ndarray, k: int) -> np.ndarray:
    """`diag(W^t)`, `t = 1 … k`, of a stack of transition matrices `walk [G, n, n]`
    (float64) as `[G, n, k]`.

    The diagonal of a product needs no product: `(PQ)_ii = Σ_j P_ij Q_ji`. With
    `s = ⌈√k⌉`, the powers `W … W^s` and `W^{2s}, W^{3s} …` are multiplied out
    (`s − 1 + ⌈k/s⌉ − 1` matrix products, 5 for `k = 16` instead of 15), and
    `diag(W^{qs + r}) = Σ_j (W^{qs})_ij (W^r)_ji`. All terms are non-negative: no cancellation,
    the result equals the power-by-power diagonals to a few ulps.
    """
    count, n, _ = walk.shape
    s = math.isqrt(k - 1) + 1  # ⌈√k⌉
    out = np.empty((count, n, k))
    small = [walk]  # W^1 … W^s
    for _ in range(1, min(s, k)):
        small.append(np.matmul(small[-1], walk))
    for r, power in enumerate(small):
        out[:, :, r] = np.diagonal(power, axis1=1, axis2=2)
    big, t = small[-1], s  # big = W^t
    while t < k:
        for r in range(1, min(s, k - t) + 1):
            out[:, :, t + r - 1] = np.einsum("gij,gji->gi", big, small[r - 1])
        t += s
        if t < k:
            big = np.matmul(big, small[-1])
    return out


def _dense_laplacian_eigenvectors(adj: np.ndarray, k: int, normalization: str | None
                                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] of a stack of small graphs by one stacked dense `eigh`.

    Args:
        adj: `[G, n, n]` symmetric 0/1 float64 adjacencies, zero diagonal, `n >= 2`.
        k: eigenpairs (>= 1).
        normalization: `"sym"` or None.

    Returns:
        `vals [G, k]`, `vecs [G, n, k]`, `mask [G, k]` with the conventions of
            [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]: the `c` zero eigenvalues of a graph with `c`
            components are replaced by the closed-form zero eigenspace ([`_zero_eigenspace`][mmpe.graph_maths._zero_eigenspace],
            trivial vector dropped), the rest are the non-zero eigenpairs in ascending order; signs
            follow [`canonical_sign`][mmpe.graph_maths.canonical_sign].
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    count, n, _ = adj.shape
    m = min(k, n - 1)
    deg = adj.sum(axis=2)
    diag = np.arange(n)
    if normalization == "sym":  # as scipy's laplacian(normed=True): an isolated node's row is 0
        inv = 1.0 / np.sqrt(np.where(deg > 0, deg, 1.0))
        lap = (adj * -inv[:, :, None]) * inv[:, None, :]
        lap[:, diag, diag] = (deg > 0).astype(np.float64)
    else:
        lap = -adj
        lap[:, diag, diag] = deg
    vals, vecs = np.linalg.eigh(lap)
    sel_vals = vals[:, 1:m + 1].copy()
    sel_vecs = vecs[:, :, 1:m + 1].copy()
    for j in np.flatnonzero(np.count_nonzero(vals < _ZERO_EIGENVALUE, axis=1) > 1):
        c, lab = connected_components(sp.csr_matrix(adj[j]), directed=False)
        if c == 1:  # pragma: no cover - excluded by the bound on _ZERO_EIGENVALUE
            continue
        _, zero = _zero_eigenspace(lab, c, np.bincount(lab, minlength=c), deg[j], normalization, m)
        rest = m - zero.shape[1]
        sel_vals[j] = np.concatenate([np.zeros(zero.shape[1]), vals[j, c:c + rest]])
        sel_vecs[j] = np.concatenate([zero, vecs[j, :, c:c + rest]], axis=1)
    sel_vals = np.clip(sel_vals, 0.0, None)
    # canonical_sign per graph: largest |entry| (lowest index within 1e-8) positive
    mag = np.abs(sel_vecs)
    top = mag.max(axis=1, keepdims=True)
    pick = np.argmax(mag >= top - 1e-8, axis=1)  # [G, m]
    signs = np.sign(np.take_along_axis(sel_vecs, pick[:, None, :], axis=1))
    signs[signs == 0] = 1.0
    out_vals, out_vecs = np.zeros((count, k)), np.zeros((count, n, k))
    mask = np.zeros((count, k), dtype=bool)
    out_vals[:, :m], out_vecs[:, :, :m], mask[:, :m] = sel_vals, sel_vecs * signs, True
    return out_vals, out_vecs, mask


# ---------------------------------------------------------------------------- structure
def adjacency(edge_index: np.ndarray | Tensor, num_nodes: int, *, undirected: bool = True,
              self_loops: bool = False) -> sp.csr_matrix:
    """The coalesced 0/1 adjacency of one graph.

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).
        undirected: add every edge's reverse (`A = max(A, Aᵀ)`).
        self_loops: keep edges `u → u` (dropped otherwise).

    Returns:
        `A [n, n]` float64 `scipy.sparse` CSR, `A[u, v] = 1` for an edge `u → v`
            (duplicates count once).

    Raises:
        TypeError: `edge_index` not an integer array/tensor.
        ValueError: `edge_index` not `[2, E]`, node ids out of range, bad `num_nodes`.
    """
    import scipy.sparse as sp

    n = _num_nodes(num_nodes, "adjacency")
    row, col = _edges(edge_index, n, "adjacency")
    if not self_loops:
        keep = row != col
        row, col = row[keep], col[keep]
    if undirected:
        row, col = np.concatenate([row, col]), np.concatenate([col, row])
    a = sp.csr_matrix((np.ones(len(row)), (row, col)), shape=(n, n))
    a.data[:] = 1.0  # coalesce: duplicates count once
    return a


def shortest_path_hops(edge_index: np.ndarray | Tensor, num_nodes: int, undirected: bool = True,
                       return_predecessors: bool = False) -> Any:
    """All-pairs shortest-path hop counts of one graph (unweighted BFS).

    `scipy.sparse.csgraph.shortest_path` on the coalesced adjacency without self-loops
    ([`adjacency`][mmpe.graph_maths.adjacency]); `undirected=False` follows edges `u → v` only. Graphs of at most
    `DENSE_HOPS_MAX` nodes, when no predecessors are asked for, take a vectorised
    Floyd–Warshall on the dense hop matrix instead (the same hop counts, several times faster
    there: a csgraph call has a fixed cost of about 0.1 ms).

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).
        undirected: treat every edge as undirected.
        return_predecessors: also return the predecessor matrix.

    Returns:
        `hops [n, n]` float64 (units: hops; `0` on the diagonal, `inf` where no path
            leads from `i` to `j`), and with `return_predecessors` `pred [n, n]` int32: the
            node before `j` on the chosen shortest path from `i` (−9999 where none).

    Raises:
        TypeError / ValueError: bad `edge_index` or `num_nodes` (see [`adjacency`][mmpe.graph_maths.adjacency]).
    """
    from scipy.sparse.csgraph import shortest_path

    n = _num_nodes(num_nodes, "shortest_path_hops")
    ei = _edges(edge_index, n, "shortest_path_hops")
    if n == 0:
        hops = np.zeros((0, 0))
        return (hops, np.zeros((0, 0), dtype=np.int32)) if return_predecessors else hops
    if n <= DENSE_HOPS_MAX and not return_predecessors:
        return _dense_hops(ei, np.zeros(n, dtype=np.int64), np.arange(n), 1, n, undirected)[0]
    adj = adjacency(ei, n, undirected=undirected, self_loops=False)
    return shortest_path(adj, method="D", directed=not undirected, unweighted=True,
                         return_predecessors=return_predecessors)


def _dense_hops(ei: np.ndarray, slot: np.ndarray, local: np.ndarray, count: int, n: int,
                undirected: bool) -> np.ndarray:
    """Hops `[count, n, n]` of the graphs whose nodes have `slot >= 0` (`ei`: their
    edges, global ids; `slot`/`local`: stack slot and row of each node), by
    [`_floyd_warshall`][mmpe.graph_maths._floyd_warshall]. Padding rows (`n` above a graph's size) stay `inf`."""
    rows, cols = ei
    if undirected:
        rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])
    hops = _stack_edges(rows, cols, slot, local, count, n, fill=np.inf)
    diag = np.arange(n)
    hops[:, diag, diag] = 0.0  # after the edges: self-loops are not paths
    return _floyd_warshall(hops)


def _coalesce(ei: np.ndarray, n: int) -> np.ndarray:
    """The distinct columns of `ei [2, E]` (ids in `[0, n)`), sorted by (source, target)."""
    if not ei.size:
        return ei
    key = np.unique(ei[0] * max(n, 1) + ei[1])  # one int64 sort, not unique(axis=1)'s row sort
    return np.stack([key // max(n, 1), key % max(n, 1)])


def degrees(edge_index: np.ndarray | Tensor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """In- and out-degrees of the coalesced edge list.

    In- and out-degrees of the coalesced edge list (Graphormer's centrality, Ying et al. 2021
    eq. 5, reads them).

    A node's in-degree counts the distinct edges `u → v` into it, its out-degree the distinct
    edges leaving it; a self-loop counts once in each. A PyG undirected graph stores both
    directions of every edge, so there in = out = the number of neighbours.

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).

    Returns:
        `(in_degree [n], out_degree [n])` int64.

    Raises:
        TypeError / ValueError: bad `edge_index` or `num_nodes`.
    """
    n = _num_nodes(num_nodes, "degrees")
    ei = _coalesce(_edges(edge_index, n, "degrees"), n)
    return (np.bincount(ei[1], minlength=n).astype(np.int64),
            np.bincount(ei[0], minlength=n).astype(np.int64))


# ---------------------------------------------------------------------------- random walks
def random_walk_pe(edge_index: np.ndarray | Tensor, num_nodes: int, k: int,
                   undirected: bool = False) -> np.ndarray:
    """Random-walk return probabilities (RWSE/RWPE).

    Random-walk return probabilities `[(D⁻¹A)^t]_ii`, `t = 1 … k` (RWSE/RWPE, Dwivedi et
    al. 2022, eq. 6; as GraphGPS uses it).

    `A` is the coalesced adjacency of `edge_index` (self-loops kept; symmetrised when
    `undirected`), `D` its out-degrees clamped to ≥ 1 (an isolated node never returns: its
    row is 0). This is PyG's `AddRandomWalkPE` on a coalesced edge list.

    Up to 128 nodes the powers are dense float64 matrices, and only about `2√k` of them are
    multiplied out (`_walk_diagonals`: the diagonal of `W^a W^b` is a row-wise sum of
    an element-wise product). Larger graphs take sparse products up to `W^⌈k/2⌉` and the same
    row-wise sums for the longer walks; up to 2000 nodes, when the sparse powers fill in (an
    expander's do within a few steps, a grid's do not), the dense products instead.

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).
        k: walk lengths `1 … k` (>= 1).
        undirected: symmetrise the edge list first.

    Returns:
        `[n, k]` float64 probabilities in `[0, 1]`.

    Raises:
        TypeError / ValueError: bad `edge_index` or `num_nodes`; `k < 1`.
    """
    import scipy.sparse as sp

    n = _num_nodes(num_nodes, "random_walk_pe")
    k = _positive_int(k, "k", "random_walk_pe")
    ei = _edges(edge_index, n, "random_walk_pe")
    if n == 0:
        return np.zeros((0, k))
    if n <= _STACK_WALK:
        return _dense_walk(ei, np.zeros(n, dtype=np.int64), np.arange(n), 1, n, k, undirected)[0]
    adj = adjacency(ei, n, undirected=undirected, self_loops=True)
    deg = np.maximum(np.asarray(adj.sum(axis=1)).ravel(), 1.0)
    walk = sp.csr_matrix(sp.diags(1.0 / deg) @ adj)
    out = np.zeros((n, k))
    half = (k + 1) // 2
    s = math.isqrt(k - 1) + 1
    dense_work = 2.0 * float(n) ** 3 * (s - 1 + -(-k // s) - 1)  # _walk_diagonals' products
    powers = [walk]  # W^1 … W^half
    for t in range(1, half):
        if n <= _DENSE_WALK:
            growth = powers[-1].nnz / (powers[-2].nnz if t > 1 else n)
            if _sparse_walk_work(powers[-1].nnz, growth, half - t, n, k - half) > dense_work:
                return _dense_walk(ei, np.zeros(n, dtype=np.int64), np.arange(n), 1, n, k,
                                   undirected)[0]
        powers.append(sp.csr_matrix(powers[-1] @ walk))
    for t, power in enumerate(powers):
        out[:, t] = power.diagonal()
    for t in range(half, k):  # diag(W^(half + j)) = row sums of W^half ∘ (W^j)ᵀ
        prod = powers[-1].multiply(powers[t - half].T.tocsr())
        out[:, t] = np.asarray(prod.sum(axis=1)).ravel()
    return out


def _sparse_walk_work(nnz: int, growth: float, products: int, n: int, sums: int) -> float:
    """Estimated cost, in dense multiply-adds, of [`random_walk_pe`][mmpe.graph_maths.random_walk_pe]'s sparse path from a
    power with `nnz` entries on: `products` more products whose fill grows by `growth`
    each (capped at `n²`), then `sums` row-wise sums over the last power."""
    work, fill = 0.0, float(nnz)
    for _ in range(products):
        fill = min(fill * max(growth, 1.0), float(n) * n)
        work += _SPARSE_ENTRY * fill
    return work + _SPARSE_SUM * sums * fill


def _dense_walk(ei: np.ndarray, slot: np.ndarray, local: np.ndarray, count: int, n: int, k: int,
                undirected: bool) -> np.ndarray:
    """Return probabilities `[count, n, k]` of the graphs whose nodes have `slot >= 0`
    (see [`_dense_hops`][mmpe.graph_maths._dense_hops]), by `_walk_diagonals` on dense `D⁻¹A` (self-loops kept,
    duplicates once, an isolated node's row 0)."""
    rows, cols = ei
    if undirected:
        rows, cols = np.concatenate([rows, cols]), np.concatenate([cols, rows])
    adj = _stack_edges(rows, cols, slot, local, count, n)
    walk = adj / np.maximum(adj.sum(axis=2, keepdims=True), 1.0)
    return _walk_diagonals(walk, k)


# ---------------------------------------------------------------------------- spectra
def _as_adjacency(adjacency: object) -> sp.csr_matrix | np.ndarray:
    """Validate `adjacency` and return it as float64 CSR (sparse input) or ndarray (dense)."""
    import scipy.sparse as sp

    if isinstance(adjacency, Tensor):
        adjacency = adjacency.detach().cpu().numpy()
    if sp.issparse(adjacency):
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        values = a.data
    elif isinstance(adjacency, np.ndarray):
        if adjacency.dtype == object or adjacency.dtype.kind not in "biuf":
            raise TypeError(f"laplacian_eigenvectors: adjacency must hold real numbers, "
                            f"got dtype {adjacency.dtype}")
        a = np.asarray(adjacency, dtype=np.float64)
        values = a
    else:
        raise TypeError("laplacian_eigenvectors: adjacency must be a scipy.sparse matrix, a numpy "
                        f"array or a torch.Tensor, got {type(adjacency).__name__}")
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"laplacian_eigenvectors: adjacency must be square [n, n], got {a.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("laplacian_eigenvectors: adjacency has NaN or infinite weights")
    if np.any(values < 0):
        raise ValueError("laplacian_eigenvectors: adjacency weights must be non-negative")
    asym = abs(a - a.T)
    asym = asym.max() if asym.size else 0.0
    if asym > 1e-8 * max(1.0, float(abs(a).max()) if a.size else 1.0):
        raise ValueError("laplacian_eigenvectors: adjacency must be symmetric (undirected graph); "
                         f"max |A - A^T| = {asym:.3g}")
    return a


def graph_laplacian(adjacency: object, normalization: str | None = "sym") -> sp.csr_matrix | np.ndarray:
    """The Laplacian of `adjacency` (`None`: `D − A`; `"sym"`: `I − D^-½ A D^-½`).

    Same input rules as [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]; the output is sparse for sparse input.

    Raises:
        TypeError: adjacency of an unsupported type or dtype.
        ValueError: non-square, asymmetric, negative or non-finite adjacency; an unknown
            `normalization`.
    """
    from scipy.sparse.csgraph import laplacian

    if normalization not in (None, "sym"):
        raise ValueError(f"normalization must be 'sym' or None, got {normalization!r}")
    a = _as_adjacency(adjacency)
    return laplacian(a, normed=normalization == "sym")


def canonical_sign(eigvecs: np.ndarray, atol: float = 1e-8) -> np.ndarray:
    """Flip each column so that its largest-|entry| (lowest index among ties) is positive.

    Args:
        eigvecs: `[n, k]`.
        atol: entries within `atol` of a column's largest magnitude count as ties.

    Returns:
        `[n, k]` float64 copy.
    """
    v = np.array(eigvecs, dtype=np.float64, copy=True)
    if v.size == 0:
        return v
    mag = np.abs(v)
    top = mag.max(axis=0, keepdims=True)
    first = np.argmax(mag >= top - atol, axis=0)  # lowest index within atol of the max
    signs = np.sign(v[first, np.arange(v.shape[1])])
    signs[signs == 0] = 1.0
    return v * signs


def laplacian_eigenvectors(
    adjacency: object,
    k: int,
    normalization: str | None = "sym",
    *,
    dense_threshold: int = DENSE_THRESHOLD,
    return_mask: bool = False,
    tol: float = 0.0,
) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `k` smallest non-trivial eigenpairs of the graph Laplacian of `adjacency`.

    The Laplacian is block diagonal over connected components (an isolated node is one), so
    its eigenpairs are those of the components: the zero eigenspace in closed form (one vector
    per component, the graph-wide trivial vector `∝ D^{1/2}·1` — `∝ 1` for `D − A` —
    dropped, see the module docstring), the non-zero eigenpairs per component.

    Args:
        adjacency: symmetric non-negative weights `[n, n]`: a `scipy.sparse` matrix, a
            numpy array or a torch tensor. The diagonal (self-loops) is ignored.
        k: number of eigenpairs (>= 1).
        normalization: `"sym"` (`I − D^-½ A D^-½`) or `None` (`D − A`).
        dense_threshold: components with fewer nodes use dense `scipy.linalg.eigh`, larger
            ones `scipy.sparse.linalg.eigsh` (shift-invert, with deflation passes until no
            eigenvalue below the ones found is missing: repeated eigenvalues are complete).
        return_mask: also return `mask [k]` (bool, True where the eigenpair exists).
        tol: `eigsh` tolerance (0 = machine precision).

    Returns:
        `eigvals [k]` (ascending, float64) and `eigvecs [n, k]` (float64, unit-norm columns,
            sign convention of [`canonical_sign`][mmpe.graph_maths.canonical_sign]). A graph with `n < k + 1` nodes has only
            `n − 1` non-trivial eigenpairs: the missing columns (and eigenvalues) are zeros and
            `mask` is False there. A graph with 0 nodes gives `[k]` zeros and `[0, k]`.

    Raises:
        TypeError: adjacency of an unsupported type or dtype.
        ValueError: non-square, asymmetric, negative or non-finite adjacency; `k < 1`; an
            unknown `normalization`.
    """
    import scipy.sparse as sp

    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"laplacian_eigenvectors: k must be an int >= 1, got {k!r}")
    if normalization not in (None, "sym"):
        raise ValueError(f"normalization must be 'sym' or None, got {normalization!r}")
    a = sp.csr_matrix(_as_adjacency(adjacency))
    a.setdiag(0.0)  # self-loops do not enter the Laplacian
    a.eliminate_zeros()
    return _laplacian_eigenvectors(a, int(k), normalization, dense_threshold, return_mask, tol)


def _laplacian_eigenvectors(a: sp.csr_matrix, k: int, normalization: str | None,
                            dense_threshold: int = DENSE_THRESHOLD, return_mask: bool = False,
                            tol: float = 0.0) -> Any:
    """[`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] of a checked adjacency (symmetric, non-negative, finite,
    zero diagonal, CSR): what [`adjacency`][mmpe.graph_maths.adjacency] builds needs no second check."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import laplacian

    lap = sp.csr_matrix(laplacian(a, normed=normalization == "sym"))
    n = lap.shape[0]
    m = min(k, max(n - 1, 0))  # non-trivial eigenpairs that exist
    vals_out = np.zeros(k, dtype=np.float64)
    vecs_out = np.zeros((n, k), dtype=np.float64)
    mask = np.zeros(k, dtype=bool)
    if m > 0:
        vals, vecs = _smallest_nontrivial(a, lap, m, normalization, dense_threshold, tol)
        vals_out[:m] = np.clip(vals, 0.0, None)
        vecs_out[:, :m] = canonical_sign(vecs)
        mask[:m] = True
    if return_mask:
        return vals_out, vecs_out, mask
    return vals_out, vecs_out


def _smallest_nontrivial(a: sp.csr_matrix, lap: sp.csr_matrix, m: int, normalization: str | None,
                         dense_threshold: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The `m` smallest eigenpairs of `lap` after the trivial one (see the caller)."""
    from scipy.linalg import eigh
    from scipy.sparse.csgraph import connected_components

    n = lap.shape[0]
    count, labels = connected_components(a, directed=False)
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=count)
    members = np.split(order, np.cumsum(sizes)[:-1])
    deg = np.asarray(a.sum(axis=1)).ravel()
    zval, zero_vecs = _zero_eigenspace(labels, count, sizes, deg, normalization, m)
    vals = [np.zeros(zero_vecs.shape[1])]
    vecs = [zero_vecs]
    need = m - (count - 1)
    if need > 0:
        for idx in members:
            q = min(need, len(idx) - 1)
            if q < 1:
                continue
            sub = lap[idx][:, idx]
            if len(idx) < dense_threshold or q + 1 >= len(idx) - 1:
                cv, cvec = eigh(sub.toarray(), subset_by_index=[0, q])
                cv, cvec = cv[1:], cvec[:, 1:]  # a component's own null vector comes first
            else:
                null = zval[idx]
                bound = 2.0 if normalization == "sym" else 2.0 * float(deg[idx].max())
                cv, cvec = _component_eigsh(sub, q, null, bound, tol)
            full = np.zeros((n, len(cv)))
            full[idx] = cvec
            vals.append(cv)
            vecs.append(full)
    all_vals, all_vecs = np.concatenate(vals), np.concatenate(vecs, axis=1)
    order = np.argsort(all_vals, kind="stable")[:m]
    return all_vals[order], all_vecs[:, order]


def _zero_eigenspace(labels: np.ndarray, count: int, sizes: np.ndarray, deg: np.ndarray,
                     normalization: str | None, m: int) -> tuple[np.ndarray, np.ndarray]:
    """`(zval [n], vecs [n, min(m, count − 1)])`: each node's entry of its component's unit
    null vector, and the kept zero eigenvectors (see [`_smallest_nontrivial`][mmpe.graph_maths._smallest_nontrivial])."""
    # Zero eigenspace: one unit vector per component, z_C ∝ D^½·1_C (sym) or 1_C; an isolated
    # node (no degree) gets e_i. The trivial vector t = Σ_C w_C z_C ∝ D^½·1 (∝ 1 for D − A, or
    # when there are no edges); the kept zero eigenvectors are an orthonormal basis of the
    # rest of the eigenspace: columns 2… of the Householder reflection H that maps w to ∓e_1,
    # in the z basis (deterministic; only the columns needed are formed, never n × c).
    if normalization == "sym":
        mass = np.bincount(labels, weights=deg, minlength=count)  # Σ_C d_i
        weight = np.sqrt(mass)
        zval = np.where(mass[labels] > 0, np.sqrt(deg) / np.sqrt(np.where(mass > 0, mass, 1.0))[labels],
                        1.0 / np.sqrt(sizes[labels]))
    else:
        weight = np.sqrt(sizes.astype(np.float64))
        zval = 1.0 / np.sqrt(sizes[labels])
    if not weight.any():
        weight = np.ones(count)
    u = weight / np.linalg.norm(weight)
    u[0] += 1.0  # weights are >= 0: H w = −e_1
    uu = float(u @ u)
    zeros = min(m, count - 1)
    cols = np.arange(1, zeros + 1)
    vecs = (zval[:, None] * ((labels[:, None] == cols[None, :])
                             - 2.0 * u[labels][:, None] * u[cols][None, :] / uu))
    return zval, vecs


def _count_below(sub: sp.spmatrix, tau: float) -> int | None:
    """How many eigenvalues of the symmetric matrix `sub` lie below `tau` (Sylvester's law
    of inertia), or None when the factorisation cannot tell.

    SuperLU in symmetric mode (`MMD_AT_PLUS_A` ordering, diagonal pivots only) factors
    `P (sub − τI) Pᵀ = L U` with a unit lower triangular `L`. When no row was swapped
    (`perm_r == perm_c`) that is `L D Lᵀ` with `D = diag(U)` (the factorisation of a
    symmetric matrix is unique), and `sub − τI` has as many negative eigenvalues as `D` has
    negative entries. Callers put `τ` in a gap of the spectrum, away from every eigenvalue,
    so that no pivot is near zero.
    """
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    size = sub.shape[0]
    try:
        lu = splu(sp.csc_matrix(sub - tau * sp.identity(size, format="csc")),
                  permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                  options={"SymmetricMode": True})
    except RuntimeError:  # pragma: no cover - exactly singular at tau
        return None
    if not np.array_equal(lu.perm_r, lu.perm_c):  # pragma: no cover - a row was swapped
        return None
    return int(np.count_nonzero(lu.U.diagonal() < 0))


def _eigsh_or_nothing(op: LinearOperator, inv: LinearOperator, kk: int, sigma: float, tol: float,
                      room: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One shift-invert `eigsh` pass: the eigenpairs that converged (none: empty arrays).

    ARPACK can also stop with error 3 ("no shifts could be applied", seen on small components
    whose Krylov space is exhausted): it is tried once more with a wider subspace and another
    start vector, then reported as nothing found, so the caller falls back to the dense solver.
    """
    from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, eigsh

    size = op.shape[0]
    for ncv in (min(room, max(2 * kk + 1, kk + 32)), min(room, max(4 * kk + 1, kk + 64))):
        try:
            return eigsh(op, k=kk, sigma=sigma, which="LM", OPinv=inv,
                         v0=rng.standard_normal(size), tol=tol, ncv=ncv)
        except ArpackNoConvergence as err:  # a large exactly repeated eigenvalue at the edge
            return err.eigenvalues, err.eigenvectors
        except ArpackError:
            continue
    return np.zeros(0), np.zeros((size, 0))


def _component_eigsh(sub: sp.csr_matrix, q: int, null: np.ndarray, bound: float,
                     tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The `q` smallest non-zero eigenpairs of one connected component's Laplacian `sub`.

    Shift-invert Lanczos (`eigsh`; the factorisation of `sub − σI` is reused) on `sub`
    with every eigenvector found so far deflated (moved up by `bound + 1`, past the spectrum;
    the known null vector from the start). Each pass asks for `q + 2` eigenpairs. The result
    is complete when the eigenvalues below a point `τ` in the first gap above the `q`-th
    found are as many as the factorisation of `sub − τI` counts ([`_count_below`][mmpe.graph_maths._count_below]).
    Lanczos from one start vector finds one vector of an exactly repeated eigenvalue: when the
    count says some are missing (or cannot tell), passes are repeated, each with the
    eigenvectors found deflated, until the count agrees or a pass finds nothing below the
    `q`-th eigenvalue kept. A pass that does not converge contributes the eigenpairs that did
    (the next pass deflates them); one where none did falls back to the dense solver.
    """
    import scipy.sparse as sp
    from scipy.linalg import eigh
    from scipy.sparse.linalg import LinearOperator, splu

    size = sub.shape[0]
    # σ just below 0: shift-invert Lanczos separates the wanted eigenvalues by their relative
    # gaps (λ_{q+1} − λ_q)/(λ_q − σ), so σ should not be far below them. A connected graph's
    # smallest non-zero eigenvalues shrink with its size (like 1/size² on a path, 1/size on a
    # grid's long side), so |σ| does too; λ = 0 is deflated, so a σ close to it costs nothing.
    # (A fixed σ = −0.01 needed twice the solves on a 20,000-node grid.)
    sigma = -bound * min(5e-3, 0.5 / size)
    shift = bound + 1.0
    # sub − σI is positive definite: a symmetric-mode factorisation (diagonal pivots, a
    # symmetric ordering) is stable, with less fill than the default, and its solves are most
    # of the work.
    lu = splu(sp.csc_matrix(sub - sigma * sp.identity(size, format="csc")),
              permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    found_vals, found_vecs = np.zeros(1), null[:, None]
    rng = np.random.default_rng(0)
    while True:
        room = size - found_vecs.shape[1]
        kk = min(q + 2, room - 1)
        if kk < 1:
            break
        lam, basis = found_vals, found_vecs
        damp = 1.0 / (lam - sigma) - 1.0 / (lam + shift - sigma)

        def opinv(x: np.ndarray, lu=lu, basis=basis, damp=damp) -> np.ndarray:
            x = np.asarray(x).reshape(size, -1)
            return (lu.solve(x) - basis @ (damp[:, None] * (basis.T @ x))).reshape(-1)

        def matvec(x: np.ndarray, basis=basis) -> np.ndarray:
            x = np.asarray(x).reshape(size, -1)
            return (sub @ x + shift * basis @ (basis.T @ x)).reshape(-1)

        op = LinearOperator((size, size), matvec=matvec, dtype=np.float64)
        inv = LinearOperator((size, size), matvec=opinv, dtype=np.float64)
        new_vals, new_vecs = _eigsh_or_nothing(op, inv, kk, sigma, tol, room, rng)
        if not len(new_vals):
            vals, vecs = eigh(sub.toarray(), subset_by_index=[0, q])
            return vals[1:], vecs[:, 1:]
        kept = np.sort(found_vals[1:])
        cutoff = kept[q - 1] if len(kept) >= q else np.inf
        real = new_vals <= bound * (1 + 1e-9)  # not a deflated (shifted) one
        if not (real & (new_vals < cutoff - 1e-9 * max(1.0, bound))).any():
            break  # nothing new below the q-th eigenvalue kept
        new_vals, new_vecs = new_vals[real], new_vecs[:, real]
        # Eigenvectors of the deflated operator below the shift are orthogonal to the found
        # ones; remove what Lanczos' accuracy leaves and renormalise (no mixing of columns).
        add = new_vecs - found_vecs @ (found_vecs.T @ new_vecs)
        add /= np.linalg.norm(add, axis=0, keepdims=True)
        found_vecs = np.concatenate([found_vecs, add], axis=1)
        found_vals = np.concatenate([found_vals, new_vals])
        kept = np.sort(found_vals[1:])
        gaps = np.flatnonzero(np.diff(kept[q - 1:]) > 1e-8 * bound) if len(kept) > q else []
        if len(gaps):
            j = q - 1 + int(gaps[0])  # kept[: j + 1] lie below tau, with the null vector
            if _count_below(sub, 0.5 * (kept[j] + kept[j + 1])) == j + 2:
                break
    order = np.argsort(found_vals[1:], kind="stable")[:q] + 1
    return found_vals[order], found_vecs[:, order]


def laplacian_pe(edge_index: np.ndarray | Tensor, num_nodes: int, k: int,
                 normalization: str | None = "sym") -> tuple[np.ndarray, np.ndarray]:
    """Laplacian eigenvector positions of one graph (LapPE, Dwivedi & Bresson 2020 §3.1).

    The `k` smallest non-trivial eigenvectors ([`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors], deterministic
    signs) of the Laplacian of the coalesced, symmetrised adjacency without self-loops
    ([`adjacency`][mmpe.graph_maths.adjacency]). Equal, up to sign and to rotations within repeated eigenvalues, to
    PyG's `AddLaplacianEigenvectorPE(k, is_undirected=True)` on a coalesced, loop-free
    undirected graph without isolated nodes (PyG gives an isolated node eigenvalue 1, this
    function 0).

    Graphs of at most `BATCHED_DENSE_MAX` nodes are solved by one dense `eigh` of the
    whole Laplacian (the kernel of [`batched_laplacian_eigenvectors`][mmpe.graph_maths.batched_laplacian_eigenvectors], so a graph gets the
    same vectors alone or in a batch); larger ones by [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]. The two
    agree up to rotations within repeated eigenvalues.

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).
        k: eigenvectors (>= 1).
        normalization: `"sym"` (`I − D^-½ A D^-½`) or `None` (`D − A`).

    Returns:
        `eigvecs [n, k]` float64 (unit-norm columns; zero columns past the `n − 1`
            non-trivial eigenvectors a graph of `n` nodes has) and `mask [k]` bool (True where
            the column exists).

    Raises:
        TypeError / ValueError: bad `edge_index` or `num_nodes`; `k < 1`; an unknown
            `normalization`.
    """
    n = _num_nodes(num_nodes, "laplacian_pe")
    k = _positive_int(k, "k", "laplacian_pe")
    _normalization(normalization, "laplacian_pe")
    ei = _edges(edge_index, n, "laplacian_pe")
    _, vecs, mask = _one_laplacian(ei, n, k, normalization)
    return vecs, mask


def _one_laplacian(ei: np.ndarray, n: int, k: int, normalization: str | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(eigvals [k], eigvecs [n, k], mask [k])` of one graph's Laplacian (validated local
    edges `ei`), as [`laplacian_pe`][mmpe.graph_maths.laplacian_pe] computes it."""
    if n <= 1:
        return np.zeros(k), np.zeros((n, k)), np.zeros(k, dtype=bool)
    if n <= BATCHED_DENSE_MAX:
        vals, vecs, mask = _dense_laplacian_eigenvectors(
            _laplacian_stack(ei, np.zeros(n, dtype=np.int64), np.arange(n), 1, n), k, normalization)
        return vals[0], vecs[0], mask[0]
    return _laplacian_eigenvectors(adjacency(ei, n, undirected=True, self_loops=False), k,
                                   normalization, return_mask=True)


def _laplacian_stack(ei: np.ndarray, slot: np.ndarray, local: np.ndarray, count: int,
                     n: int) -> np.ndarray:
    """Symmetrised, loop-free dense 0/1 adjacencies `[count, n, n]` (see [`_dense_hops`][mmpe.graph_maths._dense_hops])."""
    keep = ei[0] != ei[1]
    rows, cols = ei[0][keep], ei[1][keep]
    return _stack_edges(np.concatenate([rows, cols]), np.concatenate([cols, rows]), slot, local,
                        count, n)


def random_sign_flip(eigvecs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Multiply every eigenvector by an independent random sign.

    Multiply every eigenvector by an independent random sign (LapPE training augmentation,
    Dwivedi & Bresson 2020).

    Args:
        eigvecs: `[n, k]` (one graph; one sign per column) or `[b, n, k]` (one sign per
            graph and column).
        generator: optional `torch.Generator` for reproducible flips.

    Returns:
        Tensor of the same shape and dtype.

    Raises:
        TypeError: `eigvecs` not a tensor.
        ValueError: `eigvecs` not of rank 2 or 3.
    """
    if not isinstance(eigvecs, Tensor):
        raise TypeError(f"random_sign_flip: eigvecs must be a torch.Tensor, got {type(eigvecs).__name__}")
    if eigvecs.dim() not in (2, 3):
        raise ValueError(f"random_sign_flip: eigvecs must be [n, k] or [b, n, k], got {tuple(eigvecs.shape)}")
    shape = (eigvecs.shape[-1],) if eigvecs.dim() == 2 else (eigvecs.shape[0], 1, eigvecs.shape[-1])
    bits = torch.randint(0, 2, shape, generator=generator, device="cpu").to(eigvecs.device)
    return eigvecs * (2 * bits - 1).to(eigvecs.dtype)


# ---------------------------------------------------------------------------- paths' edges
def path_edge_ids(edge_index: np.ndarray | Tensor, num_nodes: int, max_hops: int, *,
                  undirected: bool = True,
                  paths: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first `max_hops` edges along one shortest path per pair.

    The first `max_hops` edges along one shortest path per pair (Graphormer's edge
    encoding, Ying et al. 2021 eq. 7: `SP_ij = (e_1, …, e_N)`).

    The path `i → j` is the one scipy's predecessor matrix chooses ([`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops]).
    Edge `e_n` (`n = 1 … N`, counted from `i`) is named by its column in `edge_index`;
    when several columns join the same two nodes, the last one is used, and with
    `undirected=True` a step `v → u` along an edge stored only as `u → v` uses that column.

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        num_nodes: `n` (>= 0).
        max_hops: `N_max` edges kept per path (>= 1).
        undirected: treat every edge as undirected.
        paths: `(hops, predecessors)` already computed by
            `shortest_path_hops(edge_index, num_nodes, undirected, return_predecessors=True)`.

    Returns:
        `ids [n, n, max_hops]` int64 (column of `edge_index`; −1 where no edge: past the
            path's end, on the diagonal, between unreachable nodes) and `valid = ids >= 0`.

    Raises:
        TypeError / ValueError: bad `edge_index`, `num_nodes` or `paths`; `max_hops < 1`.
    """
    n = _num_nodes(num_nodes, "path_edge_ids")
    max_hops = _positive_int(max_hops, "max_hops", "path_edge_ids")
    edges = _edges(edge_index, n, "path_edge_ids")
    if paths is None:
        dist, pred = shortest_path_hops(edges, n, undirected, return_predecessors=True)
    else:
        dist, pred = (np.asarray(p) for p in paths)
        if dist.shape != (n, n) or pred.shape != (n, n):
            raise ValueError(f"path_edge_ids: paths must be (hops [n, n], predecessors [n, n]) with "
                             f"n={n}, got {dist.shape} and {pred.shape}")
    out = -np.ones((n, n, max_hops), dtype=np.int64)
    if n == 0 or edges.shape[1] == 0:
        return out, out >= 0
    edge_ids = np.arange(edges.shape[1])
    eid = -np.ones((n, n), dtype=np.int64)
    # Later duplicates overwrite earlier ones: any edge between u and v is "the" edge.
    eid[edges[0], edges[1]] = edge_ids
    if undirected:
        absent = eid[edges[1], edges[0]] < 0
        eid[edges[1][absent], edges[0][absent]] = edge_ids[absent]
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


def path_edge_features(edge_index: np.ndarray | Tensor, edge_attr: np.ndarray | Tensor,
                       num_nodes: int, max_hops: int, *, undirected: bool = True,
                       paths: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[Any, Any]:
    """Edge features along one shortest path per pair.

    Edge features along one shortest path per pair: `x_{e_1} … x_{e_N}` of Graphormer's
    edge encoding (Ying et al. 2021 eq. 7), for the edges of [`path_edge_ids`][mmpe.graph_maths.path_edge_ids].

    Args:
        edge_index: `[2, E]` integer node ids in `[0, num_nodes)`.
        edge_attr: `[E, F]` (or `[E]`, read as `F = 1`) features of the edges, numpy or
            torch, integer or float.
        num_nodes, max_hops, undirected, paths: as [`path_edge_ids`][mmpe.graph_maths.path_edge_ids].

    Returns:
        `attr [n, n, max_hops, F]` (`edge_attr`'s dtype; zeros where no edge) and
            `valid [n, n, max_hops]` bool — torch tensors (on `edge_attr`'s device) when
            `edge_attr` is a tensor, numpy arrays otherwise.

    Raises:
        TypeError: `edge_attr` neither a numpy array nor a tensor.
        ValueError: `edge_attr` not `[E, F]`; the errors of [`path_edge_ids`][mmpe.graph_maths.path_edge_ids].
    """
    is_tensor = isinstance(edge_attr, Tensor)
    if not is_tensor and not isinstance(edge_attr, np.ndarray):
        raise TypeError("path_edge_features: edge_attr must be a numpy array or a torch.Tensor "
                        f"[E, F], got {type(edge_attr).__name__}")
    n = _num_nodes(num_nodes, "path_edge_features")
    edges = _edges(edge_index, n, "path_edge_features")
    feat = edge_attr.detach().cpu() if is_tensor else torch.from_numpy(np.ascontiguousarray(edge_attr))
    if feat.dim() == 1:
        feat = feat.unsqueeze(-1)
    if feat.dim() != 2 or feat.shape[0] != edges.shape[1]:
        raise ValueError(f"path_edge_features: edge_attr must be [E={edges.shape[1]}, F], "
                         f"got {tuple(edge_attr.shape)}")
    ids, valid = path_edge_ids(edges, n, max_hops, undirected=undirected, paths=paths)
    ids_t, valid_t = torch.from_numpy(ids), torch.from_numpy(valid)
    if feat.shape[0]:
        gathered = feat[ids_t.clamp(min=0)]
        attr = torch.where(valid_t[..., None], gathered, torch.zeros_like(gathered))
    else:
        attr = feat.new_zeros((n, n, ids.shape[-1], feat.shape[1]))
    if is_tensor:
        return attr.to(edge_attr.device), valid_t.to(edge_attr.device)
    return attr.numpy(), valid


# ---------------------------------------------------------------------------- many graphs at once
#: Most float64 entries one stacked dense ``[G, n, n]`` block may hold (chunks of a size group).
_STACK_ENTRIES = 1 << 21


def _layout(edge_index: Any, batch: Any, num_graphs: Any, fn: str
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(edges [2, E] int64, batch [N] int64, sizes [G], ptr [G + 1])` of a batch of graphs,
    or an error: `batch` sorted (PyG's layout: graph `g`'s nodes are `ptr[g] … ptr[g+1]−1`),
    every edge inside one graph."""
    if isinstance(batch, Tensor):
        batch = batch.detach().cpu().numpy()
    batch = np.asarray(batch)
    if batch.ndim != 1 or (batch.size and batch.dtype.kind not in "iu"):
        raise ValueError(f"{fn}: batch must be a 1-D integer array [N], got shape {batch.shape}, "
                         f"dtype {batch.dtype}")
    batch = batch.astype(np.int64, copy=False)
    if batch.size and (int(batch.min()) < 0 or np.any(np.diff(batch) < 0)):
        raise ValueError(f"{fn}: batch must be sorted graph ids >= 0 (PyG's layout)")
    top = int(batch[-1]) + 1 if batch.size else 0
    g = top if num_graphs is None else _num_nodes(num_graphs, fn)
    if g < top:
        raise ValueError(f"{fn}: batch names graph {top - 1}, num_graphs={g}")
    ei = _edges(edge_index, len(batch), fn)
    if ei.size and np.any(batch[ei[0]] != batch[ei[1]]):
        raise ValueError(f"{fn}: an edge joins two graphs of the batch")
    sizes = np.bincount(batch, minlength=g).astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return ei, batch, sizes, ptr


def collate_edges(edge_indices: Sequence[Any], num_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """One batch of edges from per-graph edge lists.

    One batch `(edge_index [2, ΣE], batch [Σn])` from per-graph edge lists (node ids offset
    by the nodes before), the input of the `batched_*` functions."""
    sizes = np.asarray([int(n) for n in num_nodes], dtype=np.int64)
    if len(sizes) != len(edge_indices):
        raise ValueError("collate_edges: one num_nodes per edge_index needed")
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    parts = [np.asarray(e.detach().cpu().numpy() if isinstance(e, Tensor) else e, dtype=np.int64)
             .reshape(2, -1) + o for e, o in zip(edge_indices, offsets, strict=True)]
    ei = np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), dtype=np.int64)
    return ei, np.repeat(np.arange(len(sizes)), sizes)


def _size_groups(sizes: np.ndarray, lo: int, hi: int) -> list[tuple[int, np.ndarray]]:
    """`(n, graph ids)` for every node count `lo <= n <= hi`, chunked so that one stacked
    `[G, n, n]` block stays under [`_STACK_ENTRIES`][mmpe.graph_maths._STACK_ENTRIES] entries."""
    out = []
    for n in np.unique(sizes):
        n = int(n)
        if n < lo or n > hi:
            continue
        ids = np.flatnonzero(sizes == n)
        step = max(1, _STACK_ENTRIES // (n * n))
        out += [(n, ids[s:s + step]) for s in range(0, len(ids), step)]
    return out


def _grouped(ei: np.ndarray, batch: np.ndarray, sizes: np.ndarray, ptr: np.ndarray, lo: int,
             hi: int) -> Any:
    """Yield `(n, ids, edges, slot, local)` for every chunk of [`_size_groups`][mmpe.graph_maths._size_groups]: its graphs
    `ids` (all of `n` nodes), the columns of `ei` inside them, and for every node of the
    batch its slot in the chunk's stack (−1 outside the chunk) and its row within its graph."""
    groups = _size_groups(sizes, lo, hi)
    if not groups:
        return
    local = np.arange(int(ptr[-1])) - ptr[batch]
    chunk_of = np.full(len(sizes), -1, dtype=np.int64)
    slot_of = np.full(len(sizes), -1, dtype=np.int64)
    for c, (_, ids) in enumerate(groups):
        chunk_of[ids] = c
        slot_of[ids] = np.arange(len(ids))
    # one sort of the edges by chunk, instead of a mask over all edges per chunk
    edge_chunk = chunk_of[batch[ei[0]]]
    order = np.argsort(edge_chunk, kind="stable")
    bounds = np.searchsorted(edge_chunk[order], np.arange(len(groups) + 1))
    node_chunk, node_slot = chunk_of[batch], slot_of[batch]
    for c, (n, ids) in enumerate(groups):
        slot = np.where(node_chunk == c, node_slot, -1)
        yield n, ids, ei[:, order[bounds[c]:bounds[c + 1]]], slot, local


def _graph_edges(ei: np.ndarray, batch: np.ndarray, ptr: np.ndarray, g: int) -> np.ndarray:
    """Graph `g`'s columns of `ei` with local node ids."""
    return ei[:, batch[ei[0]] == g] - ptr[g]


def batched_shortest_path_hops(edge_index: np.ndarray | Tensor, batch: np.ndarray | Tensor,
                               undirected: bool = True, *, num_graphs: int | None = None,
                               bucket_nodes: int = 512) -> list[np.ndarray]:
    """[`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops] of every graph of a batch, at once.

    Graphs of at most `DENSE_HOPS_MAX` nodes are stacked by node count as dense
    `[G, n, n]` hop matrices and solved by one vectorised Floyd–Warshall per stack (the
    kernel [`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops] uses for one such graph). Larger graphs are cut into
    buckets of about `bucket_nodes` nodes; each bucket's block-diagonal adjacency goes through
    `scipy.sparse.csgraph.shortest_path` once (BFS never leaves a graph's block, so a block of
    the result is that graph's hops).

    Args:
        edge_index: `[2, E]` node ids of the whole batch (PyG `Batch.edge_index`).
        batch: `[N]` sorted graph id of every node (PyG `Batch.batch`).
        undirected: treat every edge as undirected.
        num_graphs: `G` (default `batch.max() + 1`; more for trailing empty graphs).
        bucket_nodes: nodes per `shortest_path` call (a larger graph is a bucket of its own).

    Returns:
        `G` arrays `hops [n_g, n_g]` float64 (hops, `inf`: no path), equal to
            `shortest_path_hops` per graph.

    Raises:
        ValueError / TypeError: bad `edge_index`, unsorted `batch`, an edge between graphs.
    """
    from scipy.sparse.csgraph import shortest_path

    ei, batch_v, sizes, ptr = _layout(edge_index, batch, num_graphs, "batched_shortest_path_hops")
    out: list[np.ndarray] = [np.zeros((0, 0))] * len(sizes)
    for n, ids, edges, slot, local in _grouped(ei, batch_v, sizes, ptr, 1, DENSE_HOPS_MAX):
        hops = _dense_hops(edges, slot, local, len(ids), n, undirected)
        for j, g in enumerate(ids):
            out[g] = hops[j]
    big = np.flatnonzero(sizes > DENSE_HOPS_MAX)
    if big.size:
        adj = adjacency(ei, int(ptr[-1]), undirected=undirected, self_loops=False)
        i = 0
        while i < len(big):
            end, nodes = i + 1, int(sizes[big[i]])
            while end < len(big) and nodes + sizes[big[end]] <= bucket_nodes:
                nodes += int(sizes[big[end]])
                end += 1
            members = np.concatenate([np.arange(ptr[g], ptr[g + 1]) for g in big[i:end]])
            dist = shortest_path(adj[members][:, members], method="D", directed=not undirected,
                                 unweighted=True)
            at = 0
            for g in big[i:end]:
                n = int(sizes[g])
                out[g] = dist[at:at + n, at:at + n].copy()
                at += n
            i = end
    return out


def batched_degrees(edge_index: np.ndarray | Tensor, batch: np.ndarray | Tensor, *,
                    num_graphs: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """[`degrees`][mmpe.graph_maths.degrees] of every graph of a batch (one `unique` and two `bincount`).

    Returns:
        `G` pairs `(in_degree [n_g], out_degree [n_g])` int64.
    """
    ei, _, sizes, ptr = _layout(edge_index, batch, num_graphs, "batched_degrees")
    total = int(ptr[-1])
    ei = _coalesce(ei, total)
    ins = np.bincount(ei[1], minlength=total).astype(np.int64)
    outs = np.bincount(ei[0], minlength=total).astype(np.int64)
    return [(ins[ptr[g]:ptr[g + 1]], outs[ptr[g]:ptr[g + 1]]) for g in range(len(sizes))]


def batched_random_walk_pe(edge_index: np.ndarray | Tensor, batch: np.ndarray | Tensor, k: int,
                           undirected: bool = False, *,
                           num_graphs: int | None = None) -> list[np.ndarray]:
    """[`random_walk_pe`][mmpe.graph_maths.random_walk_pe] of every graph of a batch, at once.

    Graphs with the same node count `n` (up to 128) are stacked as dense `[G, n, n]`
    transition matrices `D⁻¹A`, and the stack goes through the kernel [`random_walk_pe`][mmpe.graph_maths.random_walk_pe]
    uses for one graph (`_walk_diagonals`: about `2√k` stacked float64 products; numpy's
    `matmul` beats `torch.bmm` in float64 on the CPU). Larger graphs go through
    [`random_walk_pe`][mmpe.graph_maths.random_walk_pe] (sparse or dense products) one by one.

    Args:
        edge_index, batch, num_graphs: as [`batched_shortest_path_hops`][mmpe.graph_maths.batched_shortest_path_hops].
        k: walk lengths `1 … k` (>= 1).
        undirected: symmetrise the edge list first.

    Returns:
        `G` arrays `[n_g, k]` float64, equal to `random_walk_pe` per graph (bit for bit).
    """
    k = _positive_int(k, "k", "batched_random_walk_pe")
    ei, batch_v, sizes, ptr = _layout(edge_index, batch, num_graphs, "batched_random_walk_pe")
    out: list[np.ndarray] = [np.zeros((0, k))] * len(sizes)
    for n, ids, edges, slot, local in _grouped(ei, batch_v, sizes, ptr, 1, _STACK_WALK):
        diag = _dense_walk(edges, slot, local, len(ids), n, k, undirected)
        for j, g in enumerate(ids):
            out[g] = diag[j]
    for g in np.flatnonzero(sizes > _STACK_WALK):
        out[g] = random_walk_pe(_graph_edges(ei, batch_v, ptr, g), int(sizes[g]), k, undirected)
    return out


def batched_laplacian_eigenvectors(
    edge_index: np.ndarray | Tensor, batch: np.ndarray | Tensor, k: int,
    normalization: str | None = "sym", *, num_graphs: int | None = None,
    dense_max: int = BATCHED_DENSE_MAX,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Laplacian eigenvectors of every graph of a batch, at once.

    [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] (with `return_mask`) of the Laplacian of every graph of
    a batch (coalesced, symmetrised, loop-free adjacency, as [`laplacian_pe`][mmpe.graph_maths.laplacian_pe]), at once.

    Graphs with the same node count `n <= dense_max` are stacked as dense `[G, n, n]`
    Laplacians and solved by one `numpy.linalg.eigh` (`_dense_laplacian_eigenvectors`,
    the kernel [`laplacian_pe`][mmpe.graph_maths.laplacian_pe] uses for one such graph): the spectrum of a graph with `c`
    components starts with `c` zero eigenvalues, whose columns are replaced by the closed-form
    zero eigenspace of [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] (trivial vector dropped, the same
    deterministic basis); the rest are the non-zero eigenpairs in ascending order; signs follow
    [`canonical_sign`][mmpe.graph_maths.canonical_sign]. Larger graphs go through [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] one by one.
    With the default `dense_max` every graph gets exactly what [`laplacian_pe`][mmpe.graph_maths.laplacian_pe] gives it;
    against [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] (solved per connected component) eigenvalues agree to
    rounding, eigenvectors up to sign for simple eigenvalues and up to a rotation within a
    repeated eigenvalue's subspace.

    Args:
        edge_index, batch, num_graphs: as [`batched_shortest_path_hops`][mmpe.graph_maths.batched_shortest_path_hops].
        k: eigenpairs (>= 1).
        normalization: `"sym"` or `None`.
        dense_max: largest node count solved by the stacked dense `eigh`.

    Returns:
        `G` triples `(eigvals [k], eigvecs [n_g, k], mask [k])` as
            `laplacian_eigenvectors(..., return_mask=True)`.
    """
    fn = "batched_laplacian_eigenvectors"
    k = _positive_int(k, "k", fn)
    _normalization(normalization, fn)
    ei, batch_v, sizes, ptr = _layout(edge_index, batch, num_graphs, fn)
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
        (np.zeros(k), np.zeros((int(n), k)), np.zeros(k, dtype=bool)) for n in sizes]
    for n, ids, edges, slot, local in _grouped(ei, batch_v, sizes, ptr, 2, dense_max):
        vals, vecs, mask = _dense_laplacian_eigenvectors(
            _laplacian_stack(edges, slot, local, len(ids), n), k, normalization)
        for j, g in enumerate(ids):
            out[g] = (vals[j], vecs[j], mask[j])
    for g in np.flatnonzero(sizes > max(dense_max, 1)):
        n = int(sizes[g])
        adj = adjacency(_graph_edges(ei, batch_v, ptr, g), n, undirected=True, self_loops=False)
        out[g] = _laplacian_eigenvectors(adj, k, normalization, return_mask=True)
    return out


def batched_laplacian_pe(edge_index: np.ndarray | Tensor, batch: np.ndarray | Tensor, k: int,
                         normalization: str | None = "sym", *,
                         num_graphs: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Laplacian positional encodings of every graph of a batch, at once.

    [`laplacian_pe`][mmpe.graph_maths.laplacian_pe] of every graph of a batch, at once
    ([`batched_laplacian_eigenvectors`][mmpe.graph_maths.batched_laplacian_eigenvectors]; same numbers up to eigenvector sign and rotations
    within repeated eigenvalues).

    Returns:
        `G` pairs `(eigvecs [n_g, k] float64, mask [k] bool)`.
    """
    return [(vecs, mask) for _, vecs, mask in
            batched_laplacian_eigenvectors(edge_index, batch, k, normalization, num_graphs=num_graphs)]
