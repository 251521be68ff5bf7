"""The fast paths of the graph precompute give the reference paths' numbers.

* shortest paths: dense Floyd–Warshall (``n <= DENSE_HOPS_MAX``) = scipy csgraph BFS =
  networkx, exactly;
* RWSE: dense stacked products on the ``√k`` schedule, sparse products up to ``W^⌈k/2⌉``, and
  the switch between them = power-by-power products (float64, to 1e-12) = PyG
  ``AddRandomWalkPE`` (float32);
* LapPE: one dense ``eigh`` of the whole Laplacian (``n <= BATCHED_DENSE_MAX``) = per-component
  :func:`~mmpe.graph_maths.laplacian_eigenvectors` (eigenvalues to 1e-8; per cluster of equal
  eigenvalues the same eigenspace; the zero eigenspace's closed-form basis and the sign of
  simple eigenvalues the same) and PyG (connected graphs, up to sign); shift-invert ``eigsh``
  with the inertia check = dense ``eigh``; the inertia count = ``eigvalsh``;
* batches: ``batched_*`` = the per-graph functions and ``Graph`` of a batch = ``Graph`` of each
  graph, bit for bit (the same kernels); the transforms' ``forward_many`` = ``forward``.
"""

from __future__ import annotations

import contextlib

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) gives the reference transforms")

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import from_smiles

from mmpe import graph_maths as gm
from mmpe.coords import Graph
from mmpe.coords.graph import UNREACHABLE
from mmpe.integrations.pyg import AddLaplacianPE, AddRWSE, AddShortestPaths

FAST = settings(max_examples=25, deadline=None)

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "[Na+].[Cl-]",
          "C", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "C1CCCCC1", "c1ccc2ccccc2c1", "OCC(O)CO",
          "C1CC2CCC1CC2", "CC(=O)OCC.O"]


def one_blas_thread():
    """A multi-threaded BLAS on a busy 2-core machine is many times slower."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(1)


# ---------------------------------------------------------------------------- graphs
@st.composite
def graphs(draw: st.DrawFn, max_nodes: int = 60) -> tuple[np.ndarray, int]:
    """One graph of 1–``max_nodes`` nodes: random edges (duplicates, self-loops, one direction
    only; isolated nodes and several components are common), sometimes over a path backbone
    (long shortest paths)."""
    n = draw(st.integers(1, max_nodes))
    e = draw(st.integers(0, 2 * n))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          min_size=e, max_size=e))
    if draw(st.booleans()):
        length = draw(st.integers(1, n))
        pairs += [(i, i + 1) for i in range(length - 1)]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2).T, n


@st.composite
def batches(draw: st.DrawFn, max_nodes: int = 60) -> tuple[list[np.ndarray], list[int]]:
    """1–5 graphs of :func:`graphs` (sizes repeat often, so stacks of several form)."""
    count = draw(st.integers(1, 5))
    same = draw(st.booleans())
    first = draw(graphs(max_nodes))
    items = [first] + [draw(graphs(first[1] if same else max_nodes)) for _ in range(count - 1)]
    return [e for e, _ in items], [n for _, n in items]


def grid_edges(rows: int, cols: int) -> np.ndarray:
    a = nx.to_scipy_sparse_array(nx.grid_2d_graph(rows, cols), format="coo")
    return np.stack([a.row, a.col]).astype(np.int64)


def random_edges(n: int, m: int, seed: int) -> np.ndarray:
    e = np.random.default_rng(seed).integers(0, n, (2, m))
    return np.concatenate([e, e[::-1]], axis=1)


# ---------------------------------------------------------------------------- references
def ref_hops(edges: np.ndarray, n: int, undirected: bool = True) -> np.ndarray:
    """scipy csgraph BFS (the path taken with predecessors, and above DENSE_HOPS_MAX)."""
    return gm.shortest_path_hops(edges, n, undirected, return_predecessors=True)[0]


def ref_walk(edges: np.ndarray, n: int, k: int, undirected: bool = False) -> np.ndarray:
    """``diag((D⁻¹A)^t)`` power by power (sparse products: fine for any n)."""
    adj = gm.adjacency(edges, n, undirected=undirected, self_loops=True)
    deg = np.maximum(np.asarray(adj.sum(axis=1)).ravel(), 1.0)
    walk = sp.csr_matrix(sp.diags(1.0 / deg) @ adj)
    out, power = np.zeros((n, k)), walk
    for t in range(k):
        out[:, t] = power.diagonal()
        power = sp.csr_matrix(power @ walk)
    return out


def check_eigenspaces(got: tuple, edges: np.ndarray, n: int, k: int, norm: str | None,
                      atol: float = 1e-6) -> None:
    """``got = (vals, vecs, mask)`` against the per-component reference
    ``laplacian_eigenvectors`` (see the module docstring)."""
    adj = gm.adjacency(edges, n)
    vals, vecs, mask = gm.laplacian_eigenvectors(adj, k, norm, return_mask=True)
    gvals, gvecs, gmask = (np.asarray(x) for x in got)
    np.testing.assert_array_equal(gmask, mask)
    np.testing.assert_allclose(gvals, vals, atol=1e-8)
    m = int(mask.sum())
    np.testing.assert_array_equal(gvecs[:, m:], 0.0)
    if m == 0:
        return
    lap = gm.graph_laplacian(adj, norm).toarray()
    spectrum = np.linalg.eigvalsh(lap)
    np.testing.assert_allclose(gvecs[:, :m].T @ gvecs[:, :m], np.eye(m), atol=10 * atol)
    i = 0
    while i < m:  # clusters of equal eigenvalues
        j = i
        while j + 1 < m and abs(vals[j + 1] - vals[i]) < 1e-6:
            j += 1
        block = slice(i, j + 1)
        np.testing.assert_allclose(lap @ gvecs[:, block], gvecs[:, block] * gvals[block],
                                   atol=10 * atol)
        whole = np.sum(np.abs(spectrum - vals[i]) < 1e-6) == (j - i + 1)
        if whole:  # the whole eigenspace: the projectors agree
            np.testing.assert_allclose(gvecs[:, block] @ gvecs[:, block].T,
                                       vecs[:, block] @ vecs[:, block].T, atol=atol)
        if vals[i] < 1e-9:  # the closed-form zero eigenspace: the same basis
            np.testing.assert_allclose(gvecs[:, block], vecs[:, block], atol=atol)
        if j == i and whole:  # a simple eigenvalue: the same sign convention
            np.testing.assert_allclose(gvecs[:, i], vecs[:, i], atol=atol)
        i = j + 1


# ---------------------------------------------------------------------------- shortest paths
@FAST
@given(graphs(max_nodes=gm.DENSE_HOPS_MAX + 12), st.booleans())
def test_dense_hops_equal_csgraph_and_networkx(graph: tuple, undirected: bool) -> None:
    edges, n = graph
    got = gm.shortest_path_hops(edges, n, undirected)
    np.testing.assert_array_equal(got, ref_hops(edges, n, undirected))
    g = (nx.Graph if undirected else nx.DiGraph)()
    g.add_nodes_from(range(n))
    g.add_edges_from((int(u), int(v)) for u, v in edges.T if u != v)
    want = np.full((n, n), np.inf)
    for i, row in nx.all_pairs_shortest_path_length(g):
        for j, d in row.items():
            want[i, j] = d
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------- random walks
@FAST
@given(graphs(), st.integers(1, 24), st.booleans())
def test_dense_walk_equals_power_by_power(graph: tuple, k: int, undirected: bool) -> None:
    edges, n = graph
    got = gm.random_walk_pe(edges, n, k, undirected)
    np.testing.assert_allclose(got, ref_walk(edges, n, k, undirected), atol=1e-12, rtol=0)


@pytest.mark.parametrize(("name", "edges", "n", "dense"), [
    ("grid 30x30 (sparse powers stay sparse)", grid_edges(30, 30), 900, False),
    ("random 300 nodes (powers fill in: dense)", random_edges(300, 1200, 0), 300, True),
    ("path 200 nodes", np.array([np.arange(199), np.arange(1, 200)]), 200, False),
    ("grid 50x50 (above 2000 nodes: sparse)", grid_edges(50, 50), 2500, False),
])
@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_walk_paths_above_the_stack_limit(monkeypatch, name: str, edges: np.ndarray, n: int,
                                          dense: bool, k: int) -> None:
    """Above 128 nodes: sparse products up to W^⌈k/2⌉, or the dense kernel when the powers
    fill in; both equal power-by-power products."""
    calls = []
    real = gm._dense_walk
    monkeypatch.setattr(gm, "_dense_walk", lambda *a: calls.append(1) or real(*a))
    with one_blas_thread():
        got = gm.random_walk_pe(edges, n, k)
    np.testing.assert_allclose(got, ref_walk(edges, n, k), atol=1e-12, rtol=0)
    if k == 16:  # with few steps there are few products to choose for
        assert bool(calls) == dense, name


def test_walk_equals_pyg() -> None:
    graphs_ = [from_smiles(s) for s in SMILES]
    graphs_.append(Data(edge_index=torch.from_numpy(grid_edges(30, 30)), num_nodes=900))
    graphs_.append(Data(edge_index=torch.from_numpy(random_edges(300, 1200, 1)), num_nodes=300))
    for data in graphs_:
        data = Data(edge_index=data.edge_index, num_nodes=data.num_nodes).coalesce()
        want = AddRandomWalkPE(16)(data.clone()).random_walk_pe.double().numpy()
        got = gm.random_walk_pe(data.edge_index.numpy(), data.num_nodes, 16)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- spectra
@FAST
@given(graphs(), st.integers(1, 10), st.sampled_from(["sym", None]))
def test_dense_laplacian_equals_per_component_reference(graph: tuple, k: int, norm) -> None:
    edges, n = graph
    vecs, mask = gm.laplacian_pe(edges, n, k, norm)
    ei = gm._edges(edges, n, "test")
    vals, vecs2, mask2 = gm._one_laplacian(ei, n, k, norm)
    np.testing.assert_array_equal(vecs, vecs2)
    np.testing.assert_array_equal(mask, mask2)
    check_eigenspaces((vals, vecs, mask), edges, n, k, norm)


def assert_same_up_to_sign(full: np.ndarray, ours: np.ndarray, ref: np.ndarray, k: int) -> None:
    """Per cluster of equal eigenvalues (columns 1..k of the spectrum ``full``, a cluster cut
    at k skipped) the same eigenspace; a simple eigenvalue's vector equal up to sign."""
    vals, start = full[1:k + 1], 0
    while start < k:
        end = start + 1
        while end < k and abs(vals[end] - vals[start]) < 1e-6:
            end += 1
        cut = end == k and k + 1 < len(full) and abs(full[k + 1] - vals[start]) < 1e-6
        if not cut:
            np.testing.assert_allclose(ours[:, start:end] @ ours[:, start:end].T,
                                       ref[:, start:end] @ ref[:, start:end].T, atol=1e-5)
        start = end


@pytest.mark.parametrize("name", [*SMILES[:4], SMILES[6], SMILES[8], "grid 30x30"])
def test_laplacian_pe_equals_pyg(name: str) -> None:
    """Connected graphs: the dense path (molecules) and the eigsh path (900 nodes)."""
    if name == "grid 30x30":
        data = Data(edge_index=torch.from_numpy(grid_edges(30, 30)), num_nodes=900)
    else:
        data = from_smiles(name)
    data = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
    n, k = data.num_nodes, min(8, data.num_nodes - 1)
    ref = AddLaplacianEigenvectorPE(k, is_undirected=True)(data.clone()).laplacian_eigenvector_pe
    with one_blas_thread():
        vecs, mask = gm.laplacian_pe(data.edge_index.numpy(), n, k)
        full = np.linalg.eigvalsh(gm.graph_laplacian(gm.adjacency(data.edge_index, n)).toarray())
    assert mask.all()
    assert_same_up_to_sign(full, vecs, ref.double().numpy(), k)


@pytest.mark.parametrize(("name", "edges", "n", "norm"), [
    ("grid 20x20 (repeated eigenvalues)", grid_edges(20, 20), 400, "sym"),
    ("grid 12x25", grid_edges(12, 25), 300, None),
    ("random 300 nodes, several components", random_edges(300, 330, 2), 300, "sym"),
    ("hypercube 2^9 (eigenvalue 2 nine times)", None, 512, None),
])
def test_sparse_path_with_inertia_check(name: str, edges, n: int, norm) -> None:
    """Above BATCHED_DENSE_MAX: shift-invert eigsh, completeness by the inertia count; the
    answer is the dense eigh's (eigenvalues, eigenspaces)."""
    if edges is None:
        edges = np.array([(i, i ^ (1 << b)) for i in range(n) for b in range(9)]).T
    with one_blas_thread():
        vecs, mask = gm.laplacian_pe(edges, n, 12, norm)
        vals, _, _ = gm._one_laplacian(gm._edges(edges, n, "test"), n, 12, norm)
        check_eigenspaces((vals, vecs, mask), edges, n, 12, norm)
        spectrum = np.linalg.eigvalsh(gm.graph_laplacian(gm.adjacency(edges, n), norm).toarray())
    np.testing.assert_allclose(vals, spectrum[1:13], atol=1e-8)


@FAST
@given(graphs(max_nodes=40), st.sampled_from(["sym", None]), st.floats(0.0, 1.0))
def test_inertia_count_equals_eigvalsh(graph: tuple, norm, where: float) -> None:
    edges, n = graph
    lap = gm.graph_laplacian(gm.adjacency(edges, n), norm)
    spectrum = np.linalg.eigvalsh(lap.toarray())
    gaps = np.flatnonzero(np.diff(spectrum) > 1e-6)
    if not len(gaps):
        return
    i = gaps[int(where * (len(gaps) - 1))]
    count = gm._count_below(sp.csr_matrix(lap), 0.5 * (spectrum[i] + spectrum[i + 1]))
    assert count in (None, i + 1)


# ---------------------------------------------------------------------------- batches
@FAST
@given(batches(), st.integers(1, 9), st.sampled_from(["sym", None]), st.booleans())
def test_batched_equal_per_graph_bit_for_bit(batch: tuple, k: int, norm, undirected: bool) -> None:
    edges, sizes = batch
    ei, b = gm.collate_edges(edges, sizes)
    hops = gm.batched_shortest_path_hops(ei, b, undirected, bucket_nodes=64)
    walks = gm.batched_random_walk_pe(ei, b, k, undirected)
    laps = gm.batched_laplacian_eigenvectors(ei, b, k, norm)
    pes = gm.batched_laplacian_pe(ei, b, k, norm)
    for g, (e, n) in enumerate(zip(edges, sizes, strict=True)):
        np.testing.assert_array_equal(hops[g], gm.shortest_path_hops(e, n, undirected))
        np.testing.assert_array_equal(walks[g], gm.random_walk_pe(e, n, k, undirected))
        vecs, mask = gm.laplacian_pe(e, n, k, norm)
        np.testing.assert_array_equal(laps[g][1], vecs)
        np.testing.assert_array_equal(laps[g][2], mask)
        np.testing.assert_array_equal(pes[g][0], vecs)
        check_eigenspaces(laps[g], e, n, k, norm)


def test_batched_large_graphs_equal_per_graph() -> None:
    """Graphs above the stacking limits (hops 48, walks 128, spectra 256 nodes) between small
    ones go through the per-graph functions: the same numbers."""
    edges = [grid_edges(3, 4), grid_edges(15, 20), random_edges(200, 900, 3), grid_edges(2, 2),
             np.array([[0, 1], [1, 2]]), grid_edges(8, 9)]
    sizes = [12, 300, 200, 4, 60, 72]
    ei, b = gm.collate_edges(edges, sizes)
    with one_blas_thread():
        hops = gm.batched_shortest_path_hops(ei, b, bucket_nodes=100)
        walks = gm.batched_random_walk_pe(ei, b, 16)
        laps = gm.batched_laplacian_eigenvectors(ei, b, 6)
        for g, (e, n) in enumerate(zip(edges, sizes, strict=True)):
            np.testing.assert_array_equal(hops[g], gm.shortest_path_hops(e, n))
            np.testing.assert_array_equal(hops[g], ref_hops(e, n))
            np.testing.assert_array_equal(walks[g], gm.random_walk_pe(e, n, 16))
            np.testing.assert_allclose(walks[g], ref_walk(e, n, 16), atol=1e-12, rtol=0)
            vecs, mask = gm.laplacian_pe(e, n, 6)
            np.testing.assert_array_equal(laps[g][1], vecs)
            np.testing.assert_array_equal(laps[g][2], mask)


@FAST
@given(batches(), st.integers(1, 6), st.sampled_from(["sym", None]), st.booleans())
def test_graph_of_a_batch_equals_graph_per_graph(batch: tuple, k: int, norm, virtual: bool) -> None:
    """Graph over several graphs (batched functions) = Graph over each one alone (per-graph
    functions), bit for bit, and the reference values (csgraph hops, power-by-power walks,
    per-component eigenvectors)."""
    edges, sizes = batch
    ei, b = gm.collate_edges(edges, sizes)
    many = Graph(torch.from_numpy(ei), int(sum(sizes)), torch.from_numpy(b), max_distance=6,
                 virtual_token=virtual)
    spd, rwse = many.spd, many.rwse(k)
    lap, lap_mask = many.laplacian_pe(k, norm)
    o = int(virtual)
    for g, (e, n) in enumerate(zip(edges, sizes, strict=True)):
        one = Graph(torch.from_numpy(e.copy()), n, max_distance=6, virtual_token=virtual)
        width = n + o
        assert torch.equal(spd[g, :width, :width], one.spd[0])
        assert torch.equal(rwse[g, :width], one.rwse(k)[0])
        one_lap, one_mask = one.laplacian_pe(k, norm)
        assert torch.equal(lap[g, :width], one_lap[0])
        assert torch.equal(lap_mask[g], one_mask[0])
        assert bool((spd[g, width:] == UNREACHABLE).all()) and bool((rwse[g, width:] == 0).all())
        hops = ref_hops(e, n)
        want = np.where(np.isinf(hops), UNREACHABLE, np.minimum(hops, 6))
        np.testing.assert_array_equal(spd[g, o:width, o:width].numpy(), want)
        np.testing.assert_allclose(rwse[g, o:width].double().numpy(), ref_walk(e, n, k),
                                   atol=1e-6, rtol=0)
        vals = gm.laplacian_eigenvectors(gm.adjacency(e, n), k, norm)[0]
        check_eigenspaces((vals, lap[g, o:width].double().numpy(), lap_mask[g].numpy()), e, n, k,
                          norm, atol=1e-5)


def test_graph_spd_reuses_the_path_tables() -> None:
    """spd after path_edge_attr reads the (hops, predecessors) tables already built."""
    data = [from_smiles(s) for s in SMILES[:4]]
    ei, b = gm.collate_edges([d.edge_index for d in data], [d.num_nodes for d in data])
    attr = torch.cat([d.edge_attr for d in data])
    first = Graph(torch.from_numpy(ei), len(b), torch.from_numpy(b), edge_attr=attr)
    first.path_edge_attr(3)
    fresh = Graph(torch.from_numpy(ei), len(b), torch.from_numpy(b), edge_attr=attr)
    assert torch.equal(first.spd, fresh.spd)


# ---------------------------------------------------------------------------- transforms
def test_transforms_forward_many_equals_forward() -> None:
    data = [Data(edge_index=d.edge_index, num_nodes=d.num_nodes) for d in map(from_smiles, SMILES)]
    data.append(Data(edge_index=torch.from_numpy(grid_edges(12, 12)), num_nodes=144))
    for t in (AddShortestPaths(), AddRWSE(16), AddLaplacianPE(8), AddLaplacianPE(3, None)):
        for one, many in zip((t(d) for d in data), t.forward_many(data), strict=True):
            assert set(one.keys()) == set(many.keys())
            for key in one.keys():
                same = (torch.equal(one[key], many[key]) if isinstance(one[key], torch.Tensor)
                        else one[key] == many[key])
                assert same, (t, key)
    for d in data:  # AddShortestPaths: csgraph hops, −1 unreachable, row-major pairs
        out = AddShortestPaths()(d)
        n = d.num_nodes
        hops = ref_hops(d.edge_index.numpy(), n)
        np.testing.assert_array_equal(out.spd.numpy(), np.where(np.isinf(hops), -1, hops).ravel())
        assert out.spd.dtype == torch.long
        np.testing.assert_array_equal(out.spd_index.numpy(),
                                      np.stack(np.meshgrid(np.arange(n), np.arange(n),
                                                           indexing="ij")).reshape(2, -1))


@FAST
@given(graphs())
def test_degrees_count_distinct_edges(graph: tuple) -> None:
    edges, n = graph
    distinct = np.unique(edges, axis=1) if edges.size else edges
    in_deg, out_deg = gm.degrees(edges, n)
    np.testing.assert_array_equal(in_deg, np.bincount(distinct[1], minlength=n))
    np.testing.assert_array_equal(out_deg, np.bincount(distinct[0], minlength=n))
