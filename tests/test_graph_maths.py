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
