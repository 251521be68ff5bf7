"""Graph coordinates and spectral helpers, checked against networkx, PyG and closed forms."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import scipy.sparse as sp
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import from_networkx, from_smiles, remove_self_loops

from mmpe.coords import Graph
from mmpe.coords.base import index_grid
from mmpe.coords.graph import UNREACHABLE, VIRTUAL, random_walk_pe
from mmpe.coords.spectral import (
    canonical_sign,
    graph_laplacian,
    laplacian_eigenvectors,
    random_sign_flip,
)

# Real molecules: ethanol, phenol, paracetamol, aspirin, caffeine, ibuprofen, a disconnected salt.
SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CC(=O)Oc1ccccc1C(=O)O",
          "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "[Na+].[Cl-]"]


def karate() -> tuple[nx.Graph, Data]:
    g = nx.karate_club_graph()
    return g, Data(edge_index=from_networkx(g).edge_index, num_nodes=g.number_of_nodes())


def to_nx(data: Data) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(range(data.num_nodes))
    g.add_edges_from(data.edge_index.t().tolist())
    g.remove_edges_from(nx.selfloop_edges(g))
    return g


def nx_spd(g: nx.Graph) -> np.ndarray:
    n = g.number_of_nodes()
    out = np.full((n, n), UNREACHABLE)
    for i, row in nx.all_pairs_shortest_path_length(g):
        for j, d in row.items():
            out[i, j] = d
    return out


def assert_same_eigenspaces(vals_full: np.ndarray, ours: np.ndarray, ref: np.ndarray, k: int,
                            atol: float = 1e-5) -> None:
    """Columns 1..k of two eigenbases span the same space per eigenvalue cluster (ties = subspaces).

    ``vals_full``: all eigenvalues ascending. A cluster cut by the k boundary is skipped.
    """
    vals = vals_full[1:k + 1]
    start = 0
    while start < k:
        end = start + 1
        while end < k and abs(vals[end] - vals[start]) < 1e-6:
            end += 1
        cut = end == k and k + 1 < len(vals_full) and abs(vals_full[k + 1] - vals[start]) < 1e-6
        if not cut:
            p_ours = ours[:, start:end] @ ours[:, start:end].T
            p_ref = ref[:, start:end] @ ref[:, start:end].T
            np.testing.assert_allclose(p_ours, p_ref, atol=atol)
            if end - start == 1:  # simple eigenvalue: equal up to sign
                np.testing.assert_allclose(np.abs(ours[:, start]), np.abs(ref[:, start]), atol=atol)
        start = end


def dense_sym_eigvals(data: Data) -> np.ndarray:
    a = nx.to_numpy_array(to_nx(data), nodelist=range(data.num_nodes))
    return np.linalg.eigvalsh(graph_laplacian(a, "sym"))


# ---------------------------------------------------------------- spectral.py
@pytest.mark.parametrize("name", ["karate", *SMILES[:6]])
def test_laplacian_eigenvectors_match_pyg(name: str) -> None:
    data = karate()[1] if name == "karate" else from_smiles(name)
    data = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
    k = min(6, data.num_nodes - 1)
    ref = AddLaplacianEigenvectorPE(k, is_undirected=True)(data.clone()).laplacian_eigenvector_pe
    a = sp.csr_matrix((np.ones(data.num_edges), data.edge_index.numpy()),
                      shape=(data.num_nodes,) * 2)
    vals, vecs = laplacian_eigenvectors(a, k)
    full = dense_sym_eigvals(data)
    np.testing.assert_allclose(vals, full[1:k + 1], atol=1e-10)
    assert_same_eigenspaces(full, vecs, ref.double().numpy(), k)


def test_repeated_eigenvalues_cycle_subspace() -> None:
    """C_8: normalised-Laplacian eigenvalues 1 − cos(2πj/8), j = 1, 2 each twice."""
    g = nx.cycle_graph(8)
    data = Data(edge_index=from_networkx(g).edge_index, num_nodes=8)
    vals, vecs = laplacian_eigenvectors(nx.to_numpy_array(g), 4)
    closed = np.sort([1 - math.cos(2 * math.pi * j / 8) for j in range(8)])
    np.testing.assert_allclose(vals, closed[1:5], atol=1e-12)
    ref = AddLaplacianEigenvectorPE(4, is_undirected=True)(data).laplacian_eigenvector_pe.double().numpy()
    for cols in ([0, 1], [2, 3]):
        np.testing.assert_allclose(vecs[:, cols] @ vecs[:, cols].T, ref[:, cols] @ ref[:, cols].T,
                                   atol=1e-6)


def test_combinatorial_path_graph_closed_form() -> None:
    """Path P_n: eigenvalues of D − A are 2 − 2cos(πj/n)."""
    n = 9
    vals, vecs = laplacian_eigenvectors(nx.to_numpy_array(nx.path_graph(n)), 4, normalization=None)
    np.testing.assert_allclose(vals, [2 - 2 * math.cos(math.pi * j / n) for j in range(1, 5)], atol=1e-12)
    lap = graph_laplacian(nx.to_numpy_array(nx.path_graph(n)), None)
    np.testing.assert_allclose(lap @ vecs, vecs * vals, atol=1e-12)


def test_sparse_solver_matches_dense() -> None:
    a = nx.to_scipy_sparse_array(nx.grid_2d_graph(12, 13))  # n = 156 > threshold: eigsh
    v_sparse, u_sparse = laplacian_eigenvectors(a, 5)
    v_dense, u_dense = laplacian_eigenvectors(a, 5, dense_threshold=10**6)
    full = np.linalg.eigvalsh(graph_laplacian(a.toarray(), "sym"))
    np.testing.assert_allclose(v_sparse, v_dense, atol=1e-9)
    assert_same_eigenspaces(full, u_sparse, u_dense, 5, atol=1e-6)


def test_sign_convention_and_determinism() -> None:
    a = nx.to_numpy_array(nx.karate_club_graph(), weight=None)
    _, u = laplacian_eigenvectors(a, 6)
    top = np.abs(u).argmax(axis=0)
    assert np.all(u[top, np.arange(6)] > 0)
    np.testing.assert_array_equal(u, laplacian_eigenvectors(a, 6)[1])
    np.testing.assert_allclose(canonical_sign(-u), u)
    np.testing.assert_allclose(np.linalg.norm(u, axis=0), 1.0, atol=1e-12)


def test_small_graph_padding_and_mask() -> None:
    vals, vecs, mask = laplacian_eigenvectors(np.array([[0.0, 1.0], [1.0, 0.0]]), 4, return_mask=True)
    assert mask.tolist() == [True, False, False, False]
    np.testing.assert_allclose(vals, [2.0, 0, 0, 0])  # K2 normalised: eigenvalues 0, 2
    np.testing.assert_allclose(np.abs(vecs[:, 0]), [2 ** -0.5] * 2)
    assert np.all(vecs[:, 1:] == 0)
    vals, vecs, mask = laplacian_eigenvectors(np.zeros((1, 1)), 3, return_mask=True)
    assert vecs.shape == (1, 3) and not mask.any() and np.all(vecs == 0)


def test_random_sign_flip() -> None:
    u = torch.randn(7, 5)
    gen = torch.Generator().manual_seed(3)
    f = random_sign_flip(u, gen)
    ratio = f / u
    assert torch.allclose(ratio.abs(), torch.ones_like(ratio))
    assert torch.all(ratio == ratio[0])  # one sign per column
    batched = random_sign_flip(torch.ones(64, 3, 4))
    assert batched[:, 0].unique(dim=0).shape[0] > 1  # signs differ between graphs
    with pytest.raises(ValueError, match="eigvecs"):
        random_sign_flip(torch.ones(3))


@pytest.mark.parametrize("bad, err, match", [
    (np.array([[0.0, 1.0], [0.0, 0.0]]), ValueError, "symmetric"),
    (np.array([[0.0, -1.0], [-1.0, 0.0]]), ValueError, "non-negative"),
    (np.array([[0.0, np.nan], [np.nan, 0.0]]), ValueError, "NaN"),
    (np.ones((2, 3)), ValueError, "square"),
    ([[0, 1], [1, 0]], TypeError, "adjacency"),
])
def test_spectral_bad_input(bad, err, match) -> None:
    with pytest.raises(err, match=match):
        laplacian_eigenvectors(bad, 2)


def test_spectral_bad_k_and_normalization() -> None:
    with pytest.raises(ValueError, match="k must"):
        laplacian_eigenvectors(np.ones((3, 3)), 0)
    with pytest.raises(ValueError, match="normalization"):
        laplacian_eigenvectors(np.ones((3, 3)), 1, normalization="rw")


# ---------------------------------------------------------------- Graph: shortest paths
def test_spd_matches_networkx_karate_and_molecules() -> None:
    g, data = karate()
    coords = Graph(data, max_distance=50)
    np.testing.assert_array_equal(coords.spd[0].numpy(), nx_spd(g))
    assert coords.extent(torch.tensor(0)).item() == nx.diameter(g)
    mols = [from_smiles(s) for s in SMILES]
    batch = Batch.from_data_list(mols)
    coords = Graph(batch, max_distance=50)
    for i, m in enumerate(mols):
        n = m.num_nodes
        ref = nx_spd(to_nx(m))
        np.testing.assert_array_equal(coords.spd[i, :n, :n].numpy(), ref)
        assert torch.all(coords.spd[i, n:] == UNREACHABLE) and torch.all(coords.spd[i, :, n:] == UNREACHABLE)
        q, k = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
        dist = coords.distance(q, k, torch.tensor(i))
        np.testing.assert_array_equal(dist.numpy(), np.where(ref < 0, 51, ref))


def test_disconnected_clip_and_unreachable() -> None:
    g = nx.disjoint_union(nx.path_graph(12), nx.cycle_graph(4))
    data = Data(edge_index=from_networkx(g).edge_index, num_nodes=16)
    coords = Graph(data, max_distance=5)
    spd = coords.spd[0]
    assert spd[0, 11] == 5 and spd[0, 4] == 4  # 11 hops clipped to 5
    assert spd[0, 12] == UNREACHABLE and coords.distances[0, 0, 12] == 6  # max_distance + 1
    assert coords.diameter.tolist() == [5.0]


def test_single_node_graph() -> None:
    coords = Graph(torch.zeros(2, 0, dtype=torch.long), 1)
    assert coords.spd.tolist() == [[[0]]]
    pe, mask = coords.laplacian_pe(3)
    assert pe.shape == (1, 1, 3) and not mask.any() and torch.all(pe == 0)
    assert torch.all(coords.rwse(4) == 0)
    assert coords.in_degree.tolist() == [[0]] and coords.extent(torch.tensor(0)).item() == 0


def test_self_loops_and_duplicate_edges() -> None:
    data = from_smiles("CC(=O)Nc1ccc(O)cc1")
    n = data.num_nodes
    loops = torch.arange(n).repeat(2, 1)
    noisy = torch.cat([data.edge_index, data.edge_index[:, :6], loops[:, :3]], dim=1)
    clean = Graph(Data(edge_index=data.edge_index, num_nodes=n))
    dirty = Graph(Data(edge_index=noisy, num_nodes=n))
    assert torch.equal(clean.spd, dirty.spd)
    assert torch.allclose(clean.laplacian_pe(4)[0], dirty.laplacian_pe(4)[0])
    # degrees count each distinct edge once (a self-loop counts once, in and out)
    deg = torch.bincount(data.edge_index[1], minlength=n)
    deg[:3] += 1
    assert dirty.in_degree[0].tolist() == deg.tolist()
    # RWSE with self-loops equals PyG's on the coalesced edge list (loops included)
    coalesced = torch.unique(noisy, dim=1)
    ref = AddRandomWalkPE(5)(Data(edge_index=coalesced, num_nodes=n)).random_walk_pe
    assert torch.allclose(dirty.rwse(5)[0], ref, atol=1e-6)
    # LapPE with self-loops equals PyG's once loops are removed (scipy ignores the diagonal)
    vals = dense_sym_eigvals(Data(edge_index=data.edge_index, num_nodes=n))
    ref_pe = AddLaplacianEigenvectorPE(4, is_undirected=True)(
        Data(edge_index=remove_self_loops(coalesced)[0], num_nodes=n)).laplacian_eigenvector_pe
    assert_same_eigenspaces(vals, dirty.laplacian_pe(4)[0][0].double().numpy(), ref_pe.double().numpy(), 4)


# ---------------------------------------------------------------- Graph: RWSE, degree, batching
@pytest.mark.parametrize("name", ["karate", *SMILES])
def test_rwse_matches_pyg(name: str) -> None:
    data = karate()[1] if name == "karate" else from_smiles(name)
    data = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
    ref = AddRandomWalkPE(8)(data.clone()).random_walk_pe
    ours = Graph(data).rwse(8)[0]
    assert torch.allclose(ours, ref, atol=1e-6)
    np_rw = random_walk_pe(data.edge_index, data.num_nodes, 8)
    assert np.allclose(np_rw, ref.numpy(), atol=1e-6)


def test_batch_padding_mask_and_roundtrip() -> None:
    mols = [from_smiles(s) for s in SMILES[:3]]
    batch = Batch.from_data_list(mols)
    coords = Graph(batch)
    sizes = [m.num_nodes for m in mols]
    assert coords.n_max == max(sizes) and coords.batch_size == 3
    mask = coords.dense_mask()[:, 0]
    for i, n in enumerate(sizes):
        assert mask[i, :, :n].all() and not mask[i, :, n:].any()
    x = torch.randn(batch.num_nodes, 5)
    tokens = coords.pad_nodes(x)
    assert tokens.shape == (3, max(sizes), 5) and torch.equal(coords.unpad_nodes(tokens), x)
    assert torch.all(tokens[0, sizes[0]:] == 0)
    lap, lap_mask = coords.laplacian_pe(4)
    for i, m in enumerate(mols):
        alone = Graph(m).laplacian_pe(4)[0][0]
        assert torch.allclose(lap[i, :m.num_nodes], alone)
    assert lap_mask[0].tolist() == [True, True, False, False]  # ethanol: 3 nodes
    with pytest.raises(ValueError, match="tokens must be"):
        coords.unpad_nodes(torch.zeros(2, 3, 5))


def test_virtual_token() -> None:
    batch = Batch.from_data_list([from_smiles("CCO"), from_smiles("c1ccccc1O")])
    coords = Graph(batch, virtual_token=True)
    assert coords.n_max == 8 and coords.spd[0, 0, 0] == 0
    assert torch.all(coords.spd[0, 0, 1:4] == VIRTUAL) and torch.all(coords.spd[0, 0, 4:] == UNREACHABLE)
    assert torch.all(coords.distances[1, 0, 1:] == 1) and coords.spd[0, 1, 3] == 2
    assert coords.pad_nodes(torch.ones(batch.num_nodes, 2))[:, 0].abs().sum() == 0
    assert coords.node_mask[:, 0].sum() == 0 and coords.padding_mask[:, 0].all()


def test_path_edge_attr_follows_a_shortest_path() -> None:
    """On a path graph with edge feature = its index, the features along i→j are exact."""
    n = 7
    src = torch.arange(n - 1)
    ei = torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])])
    attr = torch.cat([src, src]).unsqueeze(-1)  # edge (u, u+1) has feature u
    coords = Graph(ei, n, edge_attr=attr)
    feats, valid = coords.path_edge_attr(4)
    assert feats[0, 1, 6, :, 0].tolist() == [1, 2, 3, 4] and valid[0, 1, 6].all()
    assert feats[0, 5, 2, :3, 0].tolist() == [4, 3, 2] and valid[0, 5, 2].tolist() == [True] * 3 + [False]
    assert not valid[0, 3, 3].any()
    mols = Batch.from_data_list([from_smiles(s) for s in SMILES])
    c = Graph(mols)
    _, v = c.path_edge_attr(5)
    hops = c.spd.clamp(min=0).clamp(max=5)
    assert torch.equal(v.sum(-1), hops)


@pytest.mark.parametrize("args, err, match", [
    ((torch.tensor([[0, 5]]), 3), ValueError, r"\[2, E\]"),
    ((torch.tensor([[0, 1], [1, 3]]), 3), ValueError, "outside"),
    ((torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 2), TypeError, "integers"),
    ((torch.tensor([[0, 1], [1, 0]]), None), ValueError, "num_nodes"),
    (([[0, 1], [1, 0]], 2), TypeError, "graph must be"),
])
def test_graph_bad_input(args, err, match) -> None:
    with pytest.raises(err, match=match):
        Graph(*args)


def test_graph_bad_batch() -> None:
    ei = torch.tensor([[0, 2], [2, 0]])
    with pytest.raises(ValueError, match="different graphs"):
        Graph(ei, 4, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="sorted"):
        Graph(torch.zeros(2, 0, dtype=torch.long), 3, torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="batch must have shape"):
        Graph(ei, 4, torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="edge_attr"):
        Graph(ei, 4, edge_attr=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="max_distance"):
        Graph(ei, 4, max_distance=0)


# ---------------------------------------------------------------- Graph: precomputed values
def test_precomputed_tensors_replace_the_computation() -> None:
    """Tensors passed to the constructor are used as given (with the padded layout applied)."""
    mols = [from_smiles(s) for s in SMILES[:3]]
    batch = Batch.from_data_list(mols)
    ref = Graph(batch, virtual_token=True)
    n = batch.num_nodes
    rw = torch.rand(n, 6)
    deg = torch.arange(n)
    pairs = torch.tensor([[0, 1], [1, 0]])
    coords = Graph(batch.edge_index, n, batch.batch, virtual_token=True, rwse=rw,
                   in_degree=deg.float(), spd=torch.tensor([7, 7]), spd_index=pairs)
    assert torch.equal(coords.rwse(6), coords.scatter_nodes(rw)) and coords.rwse(6)[:, 0].abs().sum() == 0
    assert torch.equal(coords.rwse(3), coords.scatter_nodes(rw[:, :3]))
    assert torch.equal(coords.in_degree, coords.scatter_nodes(deg))
    assert torch.equal(coords.out_degree, ref.out_degree)  # not given: computed
    spd = coords.spd  # given pairs only; everything else unreachable; virtual token as usual
    assert spd[0, 1, 2] == 7 and spd[0, 2, 1] == 7 and spd[0, 1, 3] == UNREACHABLE
    assert torch.all(spd[0, 0, 1:4] == VIRTUAL) and spd[0, 0, 0] == 0
    assert Graph(batch, max_distance=5, spd=torch.tensor([7, -1]), spd_index=pairs).spd[0, 0, 1] == 5


def test_data_attributes_are_not_guessed() -> None:
    """Graph(data) reads structure only: an attribute under a familiar name changes nothing."""
    data = from_smiles("CC(=O)Nc1ccc(O)cc1")
    computed = Graph(data).rwse(4)
    data.random_walk_pe = torch.full((data.num_nodes, 4), 0.5)
    data.in_degree = torch.zeros(data.num_nodes, dtype=torch.long)
    coords = Graph(data)
    assert torch.equal(coords.rwse(4), computed) and not coords.precomputed
    assert coords.in_degree.sum() > 0
    assert torch.all(Graph.from_pyg(data, rwse="random_walk_pe").rwse(4) == 0.5)


@pytest.mark.parametrize("kwargs, err, match", [
    ({"rwse": torch.zeros(5, 3)}, ValueError, r"rwse must be \[num_nodes=4"),
    ({"laplacian_pe": torch.zeros(4)}, ValueError, "laplacian_pe must be"),
    ({"rwse": [[0.0]] * 4}, TypeError, "rwse must be a torch.Tensor"),
    ({"in_degree": torch.zeros(3)}, ValueError, r"in_degree must be \[num_nodes=4\]"),
    ({"out_degree": torch.full((4,), 0.5)}, ValueError, "out_degree must hold whole numbers"),
    ({"spd": torch.zeros(2)}, ValueError, "need spd_index"),
    ({"spd": torch.zeros(2), "spd_index": torch.zeros(3, 2)}, ValueError, r"spd_index must be \[2, P\]"),
    ({"spd": torch.zeros(3), "spd_index": torch.zeros(2, 2)}, ValueError, r"spd must be \[P=2\]"),
    ({"spd": torch.zeros(1), "spd_index": torch.tensor([[0], [9]])}, ValueError, "spd_index holds node ids"),
    ({"spd_index": torch.zeros(2, 2)}, ValueError, "without spd or path_edge_attr"),
    ({"path_edge_attr": torch.zeros(1, 2, 1), "spd_index": torch.zeros(2, 1)}, ValueError,
     "path_edge_attr and path_edge_mask"),
    ({"path_edge_attr": torch.zeros(1, 2, 1), "path_edge_mask": torch.ones(1, 3),
      "spd_index": torch.zeros(2, 1)}, ValueError, r"path_edge_mask must be \[P=1, H=2\]"),
    ({"laplacian_normalization": "rw"}, ValueError, "laplacian_normalization"),
])
def test_precomputed_bad_input_names_the_keyword(kwargs, err, match) -> None:
    with pytest.raises(err, match=match):
        Graph(torch.tensor([[0, 1, 2], [1, 2, 3]]), 4, **kwargs)


def test_precomputed_pairs_must_stay_in_their_graph() -> None:
    ei = torch.tensor([[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="spd_index has pairs joining"):
        Graph(ei, 4, torch.tensor([0, 0, 1, 1]), spd=torch.ones(1), spd_index=torch.tensor([[0], [3]]))


def test_graph_member_argument_checks() -> None:
    coords = Graph(torch.tensor([[0, 1], [1, 2]]), 3)
    for call, match in [(lambda: coords.rwse(0), "k must be"), (lambda: coords.laplacian_pe(0), "k must be"),
                        (lambda: coords.laplacian_pe(2, "rw"), "normalization"),
                        (lambda: coords.path_edge_attr(0), "max_hops")]:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(ValueError, match="needs edge_attr"):
        coords.path_edge_attr(2)


def test_extent_bounds_every_allowed_distance_as_the_docstring_says() -> None:
    """``extent(q)`` is the farthest key of ``q`` (the diameter, or ``max_distance + 1`` where
    the graph has another component): never below a distance the mask allows."""
    # Graph 0: a path 0-1-2 and an isolated node 3 (unreachable); graph 1: an edge 4-5.
    edges = torch.tensor([[0, 1, 4], [1, 2, 5]])
    coords = Graph(edges, num_nodes=6, batch=torch.tensor([0, 0, 0, 0, 1, 1]), max_distance=5)
    b, _, q, k = index_grid(2, 1, coords.num_queries, coords.num_keys)
    dist = coords.distance(q, k, b)[:, 0]
    allowed = coords.dense_mask()[:, 0]
    extent = coords.extent(q[0, 0, :, 0], b[:, 0, 0])
    farthest = dist.masked_fill(~allowed, 0).amax(dim=-1)
    assert torch.equal(extent, farthest)
    assert extent[0].tolist()[:4] == [6.0, 6.0, 6.0, 6.0]  # unreachable: max_distance + 1
