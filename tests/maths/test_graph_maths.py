"""mmpe.graph_maths: the pure graph functions, checked against networkx and PyG on random graphs.

Hypothesis draws graphs of 1-12 nodes with random edge lists (duplicates, self-loops, isolated
nodes and several components included) and compares each function with an independent
reference: networkx shortest paths and degrees, PyG's ``AddRandomWalkPE`` and
``AddLaplacianEigenvectorPE``, and a dense numpy Laplacian.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE

import mmpe.coords.graph
import mmpe.coords.spectral
from mmpe import graph_maths as gm

FAST = settings(max_examples=30, deadline=None)


@st.composite
def graphs(draw, min_nodes: int = 1, max_nodes: int = 12, loops: bool = True,
           connect_isolated: bool = False):
    """``(edge_index [2, E] int64, n)``: random edges, with duplicates and (optionally) loops."""
    n = draw(st.integers(min_nodes, max_nodes))
    node = st.integers(0, n - 1)
    pairs = draw(st.lists(st.tuples(node, node), max_size=3 * n))
    if not loops:
        pairs = [(u, v) for u, v in pairs if u != v]
    if connect_isolated:  # every node gets an edge (PyG's Laplacian differs on isolated nodes)
        touched = {u for p in pairs for u in p if p[0] != p[1]}
        for u in range(n):
            if u not in touched:
                v = draw(st.integers(0, n - 2))
                pairs.append((u, v if v < u else v + 1))
    ei = np.array(pairs, dtype=np.int64).T.reshape(2, -1)
    return ei, n


def coalesced(ei: np.ndarray) -> np.ndarray:
    return np.unique(ei, axis=1) if ei.size else ei


def symmetric(ei: np.ndarray) -> np.ndarray:
    keep = ei[0] != ei[1]
    return coalesced(np.concatenate([ei[:, keep], ei[::-1][:, keep]], axis=1))


def nx_graph(ei: np.ndarray, n: int, directed: bool) -> nx.Graph:
    g = nx.DiGraph() if directed else nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((u, v) for u, v in ei.T.tolist() if u != v)
    return g


# ---------------------------------------------------------------- shortest paths
@FAST
@given(graphs(), st.booleans())
def test_shortest_path_hops_match_networkx(graph, undirected: bool) -> None:
    ei, n = graph
    ref = nx.floyd_warshall_numpy(nx_graph(ei, n, directed=not undirected), nodelist=range(n))
    hops, pred = gm.shortest_path_hops(ei, n, undirected, return_predecessors=True)
    np.testing.assert_array_equal(hops, ref)
    # the predecessor matrix spells out a path of exactly that many edges
    adj = gm.adjacency(ei, n, undirected=undirected).toarray()
    for i in range(n):
        for j in range(n):
            if np.isfinite(hops[i, j]) and i != j:
                cur, steps = j, 0
                while cur != i:
                    prev = pred[i, cur]
                    assert adj[prev, cur] == 1
                    cur, steps = prev, steps + 1
                assert steps == hops[i, j]
    assert np.array_equal(gm.shortest_path_hops(torch.from_numpy(ei), n, undirected), hops)


def test_shortest_path_hops_closed_forms() -> None:
    ring = np.array([[i for i in range(6)], [(i + 1) % 6 for i in range(6)]])
    hops = gm.shortest_path_hops(ring, 6)
    assert hops[0].tolist() == [0, 1, 2, 3, 2, 1]
    assert gm.shortest_path_hops(ring, 6, undirected=False)[0].tolist() == [0, 1, 2, 3, 4, 5]
    isolated = gm.shortest_path_hops(np.zeros((2, 0), dtype=np.int64), 3)
    assert np.isinf(isolated[0, 1]) and isolated[1, 1] == 0
    assert gm.shortest_path_hops(np.zeros((2, 0), dtype=np.int64), 0).shape == (0, 0)


# ---------------------------------------------------------------- random walks
@FAST
@given(graphs(), st.integers(1, 6))
def test_random_walk_pe_matches_pyg(graph, k: int) -> None:
    """Equal to PyG's AddRandomWalkPE on the coalesced edge list (self-loops included)."""
    ei, n = graph
    ours = gm.random_walk_pe(ei, n, k)  # duplicates in ei count once
    ref = AddRandomWalkPE(k)(Data(edge_index=torch.from_numpy(coalesced(ei)), num_nodes=n))
    np.testing.assert_allclose(ours, ref.random_walk_pe.double().numpy(), atol=1e-6)
    assert ours.shape == (n, k) and np.all((ours >= 0) & (ours <= 1 + 1e-12))


@FAST
@given(graphs(loops=False), st.integers(1, 5))
def test_random_walk_pe_undirected_matches_the_symmetrised_graph(graph, k: int) -> None:
    ei, n = graph
    np.testing.assert_allclose(gm.random_walk_pe(ei, n, k, undirected=True),
                               gm.random_walk_pe(symmetric(ei), n, k), atol=1e-12)


def test_random_walk_pe_closed_form_cycle() -> None:
    """On the cycle C_n a walk returns after t steps with probability C(t, t/2) / 2^t (t < n)."""
    n = 9
    ring = np.array([list(range(n)) * 2, [(i + 1) % n for i in range(n)] + [(i - 1) % n for i in range(n)]])
    rw = gm.random_walk_pe(ring, n, 6)
    expected = [0, 0.5, 0, 6 / 16, 0, 20 / 64]
    np.testing.assert_allclose(rw, np.tile(expected, (n, 1)), atol=1e-12)


# ---------------------------------------------------------------- Laplacian eigenvectors
def dense_laplacian(ei: np.ndarray, n: int, normalization: str | None) -> np.ndarray:
    """Independent reference: L = D − A or I − D^-½ A D^-½ with an isolated node's row zero."""
    a = np.zeros((n, n))
    for u, v in ei.T.tolist():
        if u != v:
            a[u, v] = a[v, u] = 1.0
    deg = a.sum(1)
    if normalization is None:
        return np.diag(deg) - a
    inv = np.where(deg > 0, 1 / np.sqrt(np.where(deg > 0, deg, 1)), 0.0)
    return np.diag((deg > 0).astype(float)) - inv[:, None] * a * inv[None, :]


@FAST
@given(graphs(), st.integers(1, 6), st.sampled_from(["sym", None]))
def test_laplacian_pe_are_eigenpairs_on_any_graph(graph, k: int, normalization) -> None:
    """Isolated nodes and components included: columns are orthonormal eigenvectors of the
    k smallest non-trivial eigenvalues, zero (and masked) past n − 1, sign-canonical."""
    ei, n = graph
    vecs, mask = gm.laplacian_pe(ei, n, k, normalization)
    lap = dense_laplacian(ei, n, normalization)
    spectrum = np.linalg.eigvalsh(lap)
    m = min(k, n - 1)
    assert vecs.shape == (n, k) and mask.tolist() == [j < m for j in range(k)]
    assert np.all(vecs[:, m:] == 0)
    v = vecs[:, :m]
    np.testing.assert_allclose(v.T @ v, np.eye(m), atol=1e-8)
    lam = np.einsum("ij,ik,kj->j", v, lap, v)  # Rayleigh quotients
    np.testing.assert_allclose(lap @ v, v * lam, atol=1e-8)
    np.testing.assert_allclose(np.sort(lam), spectrum[1:m + 1], atol=1e-8)
    if m:
        mag = np.abs(v)
        top = np.argmax(mag >= mag.max(axis=0) - 1e-8, axis=0)  # ties: the lowest index
        assert np.all(v[top, np.arange(m)] > 0)


@FAST
@given(graphs(min_nodes=2, connect_isolated=True), st.integers(1, 6))
def test_laplacian_pe_matches_pyg(graph, k: int) -> None:
    """Same eigenvalues and, per eigenvalue cluster away from 0, the same eigenspace as PyG's
    AddLaplacianEigenvectorPE (signs and bases within repeated eigenvalues are arbitrary; the
    zero eigenspace of a disconnected graph has no canonical trivial vector to drop)."""
    ei, n = graph
    und = symmetric(ei)
    m = min(k, n - 1)
    ref = AddLaplacianEigenvectorPE(m, is_undirected=True)(
        Data(edge_index=torch.from_numpy(und), num_nodes=n)).laplacian_eigenvector_pe.double().numpy()
    vecs, _ = gm.laplacian_pe(ei, n, k)
    full = np.linalg.eigvalsh(dense_laplacian(ei, n, "sym"))
    vals = full[1:m + 1]
    start = 0
    while start < m:
        end = start + 1
        while end < m and abs(vals[end] - vals[start]) < 1e-6:
            end += 1
        cut = end == m and m + 1 < n and abs(full[m + 1] - vals[start]) < 1e-6
        if not cut and vals[start] > 1e-6:
            proj = vecs[:, start:end] @ vecs[:, start:end].T
            np.testing.assert_allclose(proj, ref[:, start:end] @ ref[:, start:end].T, atol=1e-6)
        start = end


def test_spectral_module_is_a_re_export() -> None:
    for name in mmpe.coords.spectral.__all__:
        assert getattr(mmpe.coords.spectral, name) is getattr(gm, name)
    assert mmpe.coords.graph.random_walk_pe is gm.random_walk_pe
    assert mmpe.coords.graph.shortest_path_hops is gm.shortest_path_hops


# ---------------------------------------------------------------- degrees
@FAST
@given(graphs())
def test_degrees_match_networkx(graph) -> None:
    ei, n = graph
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(ei.T.tolist())  # a DiGraph coalesces duplicates and keeps loops
    in_deg, out_deg = gm.degrees(ei, n)
    assert in_deg.tolist() == [g.in_degree(i) for i in range(n)]
    assert out_deg.tolist() == [g.out_degree(i) for i in range(n)]
    assert in_deg.dtype == np.int64
    sym_in, sym_out = gm.degrees(symmetric(ei), n)
    assert np.array_equal(sym_in, sym_out)
    assert sym_in.tolist() == [nx_graph(ei, n, directed=False).degree(i) for i in range(n)]


# ---------------------------------------------------------------- path edges (Graphormer eq. 7)
@FAST
@given(graphs(), st.integers(1, 4), st.booleans())
def test_path_edges_walk_a_shortest_path(graph, max_hops: int, undirected: bool) -> None:
    ei, n = graph
    hops = gm.shortest_path_hops(ei, n, undirected)
    ids, valid = gm.path_edge_ids(ei, n, max_hops, undirected=undirected)
    assert ids.shape == (n, n, max_hops) and np.array_equal(valid, ids >= 0)
    count = np.where(np.isfinite(hops), np.minimum(np.nan_to_num(hops, posinf=0), max_hops), 0)
    np.testing.assert_array_equal(valid.sum(-1), count)
    for i in range(n):
        for j in range(n):
            at = i  # consecutive edges chain from i towards j
            for e in ids[i, j][valid[i, j]]:
                u, v = ei[:, e]
                assert u != v
                if u == at:
                    at = v
                else:
                    assert undirected and v == at
                    at = u
            if np.isfinite(hops[i, j]) and hops[i, j] <= max_hops:
                assert at == j
    attr = np.arange(ei.shape[1] * 2).reshape(-1, 2)
    feats, fvalid = gm.path_edge_features(ei, attr, n, max_hops, undirected=undirected)
    np.testing.assert_array_equal(fvalid, valid)
    np.testing.assert_array_equal(feats, np.where(valid[..., None], attr[np.maximum(ids, 0)], 0)
                                  if ei.shape[1] else np.zeros((n, n, max_hops, 2)))
    t_feats, t_valid = gm.path_edge_features(torch.from_numpy(ei), torch.from_numpy(attr), n,
                                             max_hops, undirected=undirected)
    assert torch.equal(t_feats, torch.from_numpy(feats)) and torch.equal(t_valid, torch.from_numpy(valid))


def test_path_edge_features_on_a_path_graph() -> None:
    """Edge (u, u+1) carries feature u: the features along i → j are exact."""
    src = np.arange(6)
    ei = np.stack([src, src + 1])  # stored one way only; undirected walks it both ways
    feats, valid = gm.path_edge_features(ei, src.astype(np.float32), 7, 4)
    assert feats[1, 6, :, 0].tolist() == [1, 2, 3, 4] and valid[1, 6].all()
    assert feats[5, 2, :3, 0].tolist() == [4, 3, 2] and valid[5, 2].tolist() == [True] * 3 + [False]
    assert not gm.path_edge_ids(ei, 7, 4, undirected=False)[1][5, 2].any()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, err, match", [
    (lambda: gm.shortest_path_hops(np.array([[0.0], [1.0]]), 2), TypeError, "edge_index must hold integers"),
    (lambda: gm.shortest_path_hops([[0], [1]], 2), TypeError, "edge_index must be a numpy array"),
    (lambda: gm.random_walk_pe(np.zeros((3, 1), dtype=int), 2, 2), ValueError, r"edge_index must have shape \[2, E\]"),
    (lambda: gm.degrees(np.array([[0], [5]]), 2), ValueError, "outside"),
    (lambda: gm.laplacian_pe(np.array([[0], [1]]), -1, 2), ValueError, "num_nodes must be"),
    (lambda: gm.random_walk_pe(np.array([[0], [1]]), 2, 0), ValueError, "random_walk_pe: k must be"),
    (lambda: gm.laplacian_pe(np.array([[0], [1]]), 2, 1, "rw"), ValueError, "normalization"),
    (lambda: gm.path_edge_ids(np.array([[0], [1]]), 2, 0), ValueError, "max_hops"),
    (lambda: gm.path_edge_ids(np.array([[0], [1]]), 2, 1, paths=(np.zeros((3, 3)), np.zeros((3, 3)))),
     ValueError, "paths must be"),
    (lambda: gm.path_edge_features(np.array([[0], [1]]), np.zeros((2, 1)), 2, 1), ValueError,
     r"edge_attr must be \[E=1, F\]"),
    (lambda: gm.path_edge_features(np.array([[0], [1]]), [[1]], 2, 1), TypeError, "edge_attr must be"),
])
def test_bad_input_names_the_argument(call, err, match) -> None:
    with pytest.raises(err, match=match):
        call()


# ---------------------------------------------------------------- sparse (eigsh) vs dense path
def _component(kind: str, size: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Edges of one connected component on nodes 0 … size−1."""
    if size == 1:
        return []
    if kind == "path":
        return [(i, i + 1) for i in range(size - 1)]
    if kind == "cycle":  # every non-zero eigenvalue twice
        return [(i, (i + 1) % size) for i in range(size)] if size > 2 else [(0, 1)]
    if kind == "star":  # eigenvalue 1 (sym) with multiplicity size − 2
        return [(0, i) for i in range(1, size)]
    if kind == "complete":
        return [(i, j) for i in range(size) for j in range(i + 1, size)]
    if kind == "hypercube":  # on the first 2^d nodes: eigenvalue 2 (D − A) with multiplicity d
        d = size.bit_length() - 1
        cube = [(i, i ^ (1 << b)) for i in range(2 ** d) for b in range(d) if i < i ^ (1 << b)]
        return cube + [(i, 0) for i in range(2 ** d, size)]
    tree = [(i, int(rng.integers(0, i))) for i in range(1, size)]  # random tree + extra edges
    extra = [tuple(int(v) for v in rng.integers(0, size, 2)) for _ in range(size // 3)]
    return tree + [(u, v) for u, v in extra if u != v]


@st.composite
def big_graphs(draw):
    """``(adjacency [n, n] CSR, n)``: 100–300 nodes in several components — random, path, cycle,
    star, complete, repeated copies — isolated nodes, labels shuffled, unit or random weights."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    kinds = st.sampled_from(["random", "random", "path", "cycle", "star", "complete", "hypercube"])
    parts = [(draw(kinds), draw(st.integers(100, 220)))] if draw(st.booleans()) else []
    parts += draw(st.lists(st.tuples(kinds, st.integers(2, 60)), min_size=1, max_size=5))
    if draw(st.booleans()):  # identical copies: eigenvalues repeated across components
        parts.append(parts[-1])
    isolated = draw(st.integers(1, 8))
    n_comp = sum(size if kind != "complete" else min(size, 30) for kind, size in parts)
    n = max(100, min(300, n_comp + isolated))
    edges, start = [], 0
    for kind, size in parts:
        size = min(size if kind != "complete" else min(size, 30), n - start)
        if size < 1:
            break
        edges += [(start + u, start + v) for u, v in _component(kind, size, rng)]
        start += size
    perm = rng.permutation(n)
    ei = perm[np.array(edges, dtype=np.int64).T.reshape(2, -1)]
    adj = gm.adjacency(ei, n)
    if draw(st.booleans()):  # weighted: symmetric positive weights
        upper = sp.triu(adj, 1).tocoo()
        w = rng.choice([0.5, 1.0, 2.0, 3.0], size=upper.nnz)
        half = sp.csr_matrix((w, (upper.row, upper.col)), shape=(n, n))
        adj = half + half.T
    return adj, n


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1)


def _clusters(vals: np.ndarray, atol: float = 1e-7) -> list[tuple[int, int]]:
    out, start = [], 0
    while start < len(vals):
        end = start + 1
        while end < len(vals) and vals[end] - vals[start] < atol:
            end += 1
        out.append((start, end))
        start = end
    return out


@settings(max_examples=60, deadline=None)
@given(big_graphs(), st.integers(1, 12), st.sampled_from(["sym", None]),
       st.sampled_from([2, 20, gm.DENSE_THRESHOLD]))
def test_sparse_path_equals_dense_path(graph, k: int, normalization, threshold: int) -> None:
    """The eigsh path (components of ``threshold`` nodes and more) gives the dense path's
    eigenvalues — the k smallest of the whole spectrum after the trivial 0, isolated nodes'
    and components' zeros included — and the same eigenspaces (projectors; within an eigenvalue
    cut by the k-th, the vectors are eigenvectors of it)."""
    adj, n = graph
    lap = gm.graph_laplacian(adj, normalization).toarray()
    with _one_blas_thread():  # a multi-threaded BLAS on a busy 2-core machine is 30x slower
        full_vals, full_vecs = np.linalg.eigh(lap)
        m = min(k, n - 1)
        sparse_vals, sparse_vecs = gm.laplacian_eigenvectors(adj, k, normalization,
                                                             dense_threshold=threshold)
        dense_vals, dense_vecs = gm.laplacian_eigenvectors(adj, k, normalization,
                                                           dense_threshold=10 ** 9)
    np.testing.assert_allclose(sparse_vals[:m], full_vals[1:m + 1], atol=1e-8)
    np.testing.assert_allclose(dense_vals[:m], full_vals[1:m + 1], atol=1e-8)
    # The trivial vector the zero eigenspace loses: ∝ D^½·1 (sym, with edges) or ∝ 1.
    deg = np.asarray(adj.sum(axis=1)).ravel()
    trivial = np.sqrt(deg) if normalization == "sym" and deg.any() else np.ones(n)
    trivial /= np.linalg.norm(trivial)
    for vals, vecs in ((sparse_vals, sparse_vecs), (dense_vals, dense_vecs)):
        v = vecs[:, :m]
        np.testing.assert_allclose(v.T @ v, np.eye(m), atol=1e-8)
        np.testing.assert_allclose(lap @ v, v * vals[:m], atol=1e-7)
        np.testing.assert_allclose(trivial @ v, 0.0, atol=1e-8)
    for start, end in _clusters(full_vals[1:m + 1]):
        value = full_vals[1 + start]
        complete = end < m or m + 1 >= n or full_vals[m + 1] - value > 1e-7
        if not complete:
            continue  # the k-th eigenvalue's eigenspace is cut: any basis part is right
        proj_sparse = sparse_vecs[:, start:end] @ sparse_vecs[:, start:end].T
        proj_dense = dense_vecs[:, start:end] @ dense_vecs[:, start:end].T
        np.testing.assert_allclose(proj_sparse, proj_dense, atol=1e-6)
        space = np.abs(full_vals - value) < 1e-7
        truth = full_vecs[:, space] @ full_vecs[:, space].T
        if value < 1e-7:
            truth = truth - np.outer(trivial, trivial)
        np.testing.assert_allclose(proj_dense, truth, atol=1e-6)


def test_sparse_path_keeps_the_zeros_of_isolated_nodes() -> None:
    """The reported case: a 150-node component, 5 isolated nodes and a 10-node path (eigsh path):
    six zero eigenvalues come before the component's own."""
    rng = np.random.default_rng(0)
    edges = [(i, int(rng.integers(0, i))) for i in range(1, 150)]
    edges += [(155 + i, 156 + i) for i in range(9)]
    adj = gm.adjacency(np.array(edges).T, 165)
    vals, vecs = gm.laplacian_eigenvectors(adj, 8)
    full = np.linalg.eigvalsh(gm.graph_laplacian(adj).toarray())
    np.testing.assert_allclose(vals, full[1:9], atol=1e-10)
    assert np.count_nonzero(vals < 1e-10) == 6


@pytest.mark.parametrize("d", [8, 9])
def test_sparse_path_finds_every_copy_of_a_repeated_eigenvalue(d: int) -> None:
    """A hypercube (2^d nodes, eigsh path): D − A has eigenvalue 2 with multiplicity d and 4
    with d(d−1)/2; the 12 smallest after 0 are d twos and then fours (ARPACK alone does not
    converge at d = 9: the deflation passes and the larger Krylov space do)."""
    n = 2 ** d
    edges = [(i, i ^ (1 << b)) for i in range(n) for b in range(d) if i < i ^ (1 << b)]
    adj = gm.adjacency(np.array(edges).T, n)
    with _one_blas_thread():
        vals, vecs = gm.laplacian_eigenvectors(adj, 12, None)
    np.testing.assert_allclose(vals, [2.0] * d + [4.0] * (12 - d), atol=1e-8)
    lap = gm.graph_laplacian(adj, None)
    np.testing.assert_allclose(lap @ vecs, vecs * vals, atol=1e-8)
    np.testing.assert_allclose(vecs.T @ vecs, np.eye(12), atol=1e-8)


def test_arpack_error_falls_back_to_the_dense_solver(monkeypatch):
    """ARPACK can stop with error 3 ("no shifts could be applied"; hypothesis found a
    119-node graph): the sparse path then retries and falls back to the dense solver, and
    gives the dense path's eigenvalues instead of raising."""
    from scipy.sparse.linalg import ArpackError

    import mmpe.graph_maths as graph_maths

    calls = []

    def failing(*args, **kwargs):
        calls.append(kwargs.get("ncv"))
        raise ArpackError(3)

    monkeypatch.setattr("scipy.sparse.linalg.eigsh", failing)  # imported where it is called
    graph = nx.grid_2d_graph(9, 9)
    adj = sp.csr_matrix(nx.to_scipy_sparse_array(graph, format="csr"), dtype=np.float64)
    lap = sp.csr_matrix(sp.diags(np.asarray(adj.sum(1)).ravel()) - adj)
    null = np.full((81, 1), 1 / 9.0)
    vals, vecs = graph_maths._component_eigsh(lap, 4, null, 8.0, 0.0)
    want = np.linalg.eigvalsh(lap.toarray())[1:5]
    np.testing.assert_allclose(vals, want, atol=1e-9)
    assert len(calls) == 2 and calls[1] > calls[0]  # one retry with a wider subspace
