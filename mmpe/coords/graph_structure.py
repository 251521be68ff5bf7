"""Per-graph structure behind RRWP, SPE and the magnetic Laplacian.

Per-graph structure behind RRWP, SPE and the magnetic Laplacian: random-walk powers,
Laplacian eigenpairs with their eigenvalues, and magnetic-Laplacian eigenvectors, padded to a
[`Graph`][mmpe.coords.graph.Graph]'s `[b, n_max]` token slots.

The encodings that read these need the edge list of every graph, which the `GraphLayout`
protocol does not give; they declare the extra capability
[`GraphAdjacency`][mmpe.coords.graph_structure.GraphAdjacency] (member `graph_edges(g)`, the
local `edge_index [2, E_g]` of graph `g`). Node `i` of graph `g` sits in token slot
`(g, i + v)`, `v = 1` with a virtual token (slot 0) and 0 without, as in `Graph`; the number
of nodes of graph `g` is `node_mask[g].sum()` (`node_mask` is False at the virtual token). Padding and the virtual token get zeros.

Every value is computed once per coordinates object and cached (the coordinates are rebuilt
per batch; an entry vanishes with them). Maths: dense float64 per graph, eigenpairs by
`torch.linalg.eigh` (real symmetric or complex Hermitian; it keeps to `torch`'s thread count,
where numpy's BLAS would oversubscribe a loaded machine's cores), adjacencies as
[`mmpe.graph_maths.adjacency`][mmpe.graph_maths.adjacency] builds them (coalesced: duplicates
count once), dense.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
import torch
from torch import Tensor

from mmpe.coords.capabilities import Capability
from mmpe.graph_maths import _edges as _valid_edges
from mmpe.graph_maths import _num_nodes, canonical_sign

__all__ = ["GraphAdjacency", "dense_adjacency", "laplacian_eigenpairs", "magnetic_laplacian",
           "magnetic_laplacian_pe", "random_walk_powers", "rrwp"]


class GraphAdjacency(Capability):
    """The edge list of each graph of a batch.

    The edge list of each graph of a batch: `graph_edges(g) -> [2, E_g]` local node ids
    (numpy or tensor) of graph `g` (with `GraphLayout`'s `node_mask` and `virtual_token`
    for the slots). [`mmpe.coords.Graph`][mmpe.coords.graph.Graph] provides it."""

    members = ("graph_edges",)


_CACHE: WeakKeyDictionary[Any, dict[Any, Any]] = WeakKeyDictionary()


def _cached(coords: Any, key: Any, compute: Callable[[], Any]) -> Any:
    try:
        per = _CACHE.setdefault(coords, {})
    except TypeError:  # coordinates that cannot be weakly referenced or hashed
        return compute()
    if key not in per:
        with torch.inference_mode(False):  # normal tensors: a later training step reuses them
            per[key] = compute()
    return per[key]


def _layout(coords: Any) -> tuple[int, int, list[int]]:
    """`(b, offset, sizes)`: graphs, the first node slot, nodes per graph."""
    offset = 1 if getattr(coords, "virtual_token", False) else 0
    mask = coords.node_mask.detach().cpu()
    return int(mask.shape[0]), offset, mask.sum(1).tolist()


def _edges(coords: Any, g: int) -> np.ndarray:
    e = coords.graph_edges(g)
    return e.detach().cpu().numpy() if isinstance(e, Tensor) else np.asarray(e)


def _dense(edge_index: np.ndarray, n: int, self_loops: bool) -> np.ndarray:
    """The coalesced 0/1 adjacency `[n, n]` float64 of local edges, dense: the matrix of
    [`mmpe.graph_maths.adjacency`][mmpe.graph_maths.adjacency] (`undirected=False`) without its
    sparse detour (per batch, that construction cost more than the eigensolver)."""
    a = np.zeros((n, n))
    if edge_index.size:
        a[edge_index[0], edge_index[1]] = 1.0
    if not self_loops:
        np.fill_diagonal(a, 0.0)
    return a


# ---------------------------------------------------------------------------- random walks
def random_walk_powers(edge_index: np.ndarray | Tensor, num_nodes: int, k: int) -> np.ndarray:
    """`[I, M, M², …, M^{k−1}]` of one graph, `M = D⁻¹A`, as `[n, n, k]` float64.

    `A` is the coalesced adjacency of the edge list as given (directed; self-loops kept), `D`
    its out-degrees clamped to ≥ 1 (an isolated node's row of `M` is 0) — the walk of
    [`mmpe.graph_maths.random_walk_pe`][mmpe.graph_maths.random_walk_pe], whose return
    probabilities are the diagonals of `M¹ … M^{k−1}`.

    Raises:
        ValueError: `k < 1`; bad `edge_index` or `num_nodes` (from `adjacency`).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"random_walk_powers: k must be an int >= 1, got {k!r}")
    num_nodes = _num_nodes(num_nodes, "random_walk_powers")
    ei = _valid_edges(edge_index, num_nodes, "random_walk_powers")
    a = torch.from_numpy(_dense(ei, num_nodes, self_loops=True))
    m = a / a.sum(dim=1, keepdim=True).clamp(min=1.0)
    powers = [torch.eye(num_nodes, dtype=torch.float64)]
    for _ in range(k - 1):
        powers.append(powers[-1] @ m)
    return torch.stack(powers, dim=-1).numpy()


def rrwp(coords: Any, k: int) -> Tensor:
    """Relative random-walk probabilities (GRIT) of every graph.

    Relative random-walk probabilities (GRIT) of every graph: `P [b, n_max, n_max, k]`
    float32, `P[g, i, j, t] = [M^t]_ij` for `t = 0 … k−1`
    ([`random_walk_powers`][mmpe.coords.graph_structure.random_walk_powers]); zero on every pair
    involving padding or the virtual token (graphs never share a pair: each has its own block).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"rrwp: k must be an int >= 1, got {k!r}")

    def compute() -> Tensor:
        b, off, sizes = _layout(coords)
        n_max = int(coords.node_mask.shape[1])
        out = torch.zeros(b, n_max, n_max, k)
        for g, n in enumerate(sizes):
            if n:
                p = random_walk_powers(_edges(coords, g), n, k)
                out[g, off:off + n, off:off + n] = torch.from_numpy(p).float()
        return out.to(coords.node_mask.device)

    return _cached(coords, ("rrwp", k), compute)


# ---------------------------------------------------------------------------- spectra
def _phase_canonical(vecs: np.ndarray, atol: float = 1e-8) -> np.ndarray:
    """Multiply each column by the unit phase that makes its largest-|entry| (lowest index
    within `atol`) real and positive (for real input: [`canonical_sign`][mmpe.graph_maths.canonical_sign])."""
    if not np.iscomplexobj(vecs):
        return canonical_sign(vecs, atol)
    if vecs.size == 0:
        return vecs.copy()
    mag = np.abs(vecs)
    pick = np.argmax(mag >= mag.max(axis=0, keepdims=True) - atol, axis=0)
    top = vecs[pick, np.arange(vecs.shape[1])]
    phase = np.where(np.abs(top) > 0, np.conj(top) / np.maximum(np.abs(top), 1e-300), 1.0)
    return vecs * phase


def magnetic_laplacian(edge_index: np.ndarray | Tensor, num_nodes: int, q: float,
                       normalization: str | None = "sym") -> np.ndarray:
    """The magnetic Laplacian of one directed graph.

    The magnetic Laplacian of one directed graph (Geisler et al. 2023, eq. 2), `[n, n]`
    complex128 Hermitian.

    `L_q = D_s − A_s ⊙ exp(iΘ)` (`normalization=None`) or
    `L_q = I − D_s^{-½} (A_s ⊙ exp(iΘ)) D_s^{-½}` (`"sym"`), with `A` the coalesced 0/1
    adjacency without self-loops (`A_uv = 1` for an edge `u → v`), `A_s = max(A, Aᵀ)` its
    symmetrisation, `D_s` the degrees of `A_s` and `Θ_uv = 2π q (A_uv − A_vu)`. At `q = 0` it is
    the Laplacian of the symmetrised graph ([`mmpe.graph_maths.graph_laplacian`][mmpe.graph_maths.graph_laplacian];
    an isolated node's row is 0 in the `"sym"` form, as scipy's). Edges in both directions
    get `Θ = 0`. Where `Θ = 0` everywhere (`q = 0`, or every edge has its reverse) the matrix is
    returned real (float64), so its eigenvectors are real as LapPE's.

    Raises:
        ValueError: `q` negative or not finite; an unknown `normalization`.
    """
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q < 0:
        raise ValueError(f"magnetic_laplacian: q must be a finite float >= 0, got {q!r}")
    if normalization not in ("sym", None):
        raise ValueError(f"magnetic_laplacian: normalization must be 'sym' or None, got {normalization!r}")
    num_nodes = _num_nodes(num_nodes, "magnetic_laplacian")
    a = _dense(_valid_edges(edge_index, num_nodes, "magnetic_laplacian"), num_nodes, self_loops=False)
    a_s = np.maximum(a, a.T)
    theta = 2 * np.pi * q * (a - a.T)  # Θ
    h = a_s * np.exp(1j * theta) if theta.any() else a_s
    deg = a_s.sum(axis=1)
    if normalization == "sym":
        inv = np.where(deg > 0, 1.0 / np.sqrt(np.where(deg > 0, deg, 1.0)), 0.0)
        return np.diag((deg > 0).astype(np.float64)) - inv[:, None] * h * inv[None, :]
    return np.diag(deg) - h


def magnetic_laplacian_pe(coords: Any, k: int, q: float,
                          normalization: str | None = "sym") -> tuple[Tensor, Tensor, Tensor]:
    """Eigenvectors of every graph's magnetic Laplacian.

    Eigenvectors of the `k` smallest eigenvalues of every graph's magnetic Laplacian
    ([`magnetic_laplacian`][mmpe.coords.graph_structure.magnetic_laplacian]; the first one
    included: at `q > 0` it carries direction), by `torch.linalg.eigh` on the Hermitian
    matrix, each column's phase fixed so that its largest-|entry| is real and positive.

    Returns:
        `vecs [b, n_max, k]` complex64 (unit-norm columns), `vals [b, k]` float32 and a mask
            `[b, k]` (False past the `n_g` eigenvectors of a graph of `n_g` nodes, whose
            columns are zero).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"magnetic_laplacian_pe: k must be an int >= 1, got {k!r}")

    def compute() -> tuple[Tensor, Tensor, Tensor]:
        b, off, sizes = _layout(coords)
        n_max = int(coords.node_mask.shape[1])
        vecs = torch.zeros(b, n_max, k, dtype=torch.complex64)
        vals, mask = torch.zeros(b, k), torch.zeros(b, k, dtype=torch.bool)
        for g, n in enumerate(sizes):
            if not n:
                continue
            lap = torch.from_numpy(magnetic_laplacian(_edges(coords, g), n, q, normalization))
            lam, u = (t.numpy() for t in torch.linalg.eigh(lap))
            m = min(k, n)
            u = _phase_canonical(u[:, :m])
            vecs[g, off:off + n, :m] = torch.from_numpy(u.astype(np.complex64))
            vals[g, :m] = torch.from_numpy(np.clip(lam[:m], 0.0, None)).float()
            mask[g, :m] = True
        dev = coords.node_mask.device
        return vecs.to(dev), vals.to(dev), mask.to(dev)

    return _cached(coords, ("maglap", k, float(q), normalization), compute)


def laplacian_eigenpairs(coords: Any, k: int, normalization: str | None = "sym"
                         ) -> tuple[Tensor, Tensor, Tensor]:
    """The `k` smallest non-trivial eigenpairs of every graph's Laplacian.

    The `k` smallest non-trivial eigenpairs of every graph's Laplacian (of the symmetrised
    graph; `"sym"`: `I − D^-½ A D^-½`, None: `D − A`): the magnetic Laplacian at `q = 0` with
    its first eigenvector dropped.

    Returns:
        `vecs [b, n_max, k]` float32, `vals [b, k]` float32, `mask [b, k]` bool (a graph of
            `n_g` nodes has `n_g − 1` columns).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"laplacian_eigenpairs: k must be an int >= 1, got {k!r}")
    vecs, vals, mask = magnetic_laplacian_pe(coords, k + 1, 0.0, normalization)
    return vecs[..., 1:].real.contiguous(), vals[:, 1:].contiguous(), mask[:, 1:].contiguous()


def dense_adjacency(coords: Any) -> Tensor:
    """Symmetrised 0/1 adjacency without self-loops of every graph, padded.

    Symmetrised 0/1 adjacency without self-loops of every graph, padded: `[b, n_max, n_max]`
    float32 (zero rows and columns at padding and the virtual token)."""

    def compute() -> Tensor:
        b, off, sizes = _layout(coords)
        n_max = int(coords.node_mask.shape[1])
        out = torch.zeros(b, n_max, n_max)
        for g, n in enumerate(sizes):
            if n:
                a = _dense(_edges(coords, g), n, self_loops=False)
                out[g, off:off + n, off:off + n] = torch.from_numpy(np.maximum(a, a.T)).float()
        return out.to(coords.node_mask.device)

    return _cached(coords, "adjacency", compute)
