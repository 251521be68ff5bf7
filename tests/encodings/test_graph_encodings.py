"""Graph encodings: Graphormer, LapPE, RWSE, and the 1D score methods on shortest-path hops."""

from __future__ import annotations

import pytest

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import torch
from helpers import generic_bias
from torch_geometric.data import Batch
from torch_geometric.utils import from_smiles

import mmpe
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.coords import Graph, Sequence
from mmpe.encodings.alibi import alibi_slopes
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.graphormer import spatial_buckets
from mmpe.transformer import Transformer

SMILES = ["CCO", "CC(=O)Oc1ccccc1C(=O)O", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "[Na+].[Cl-]"]
HEADS = 4


@pytest.fixture
def batch() -> Batch:
    return Batch.from_data_list([from_smiles(s) for s in SMILES])


def ctx(coords: Graph, heads: int = HEADS) -> AttentionCall:
    return AttentionCall(coords=coords, num_heads=heads, head_dim=8, batch=coords.batch_size)


def test_registry_metadata() -> None:
    for name, hook in [("graphormer", "score"), ("graphormer_spatial", "score"),
                       ("graphormer_edge", "score"), ("graphormer_centrality", "input"),
                       ("graphormer_virtual", "input"), ("lappe", "input"), ("rwse", "input")]:
        entry = mmpe.registry.get(name)
        assert entry.hook == hook and "graph" in entry.coords and entry.paper
    graph_names = {e.name for e in mmpe.registry.available(coords="graph")}
    assert {"alibi", "t5", "fire", "lappe", "rwse", "graphormer"} <= graph_names


def test_spatial_bias_is_table_lookup(batch: Batch) -> None:
    coords = Graph(batch, max_distance=20, virtual_token=True)
    enc = mmpe.build("graphormer_spatial", num_heads=HEADS, max_distance=3)
    bias = dense_bias([enc], ctx(coords))
    spd = coords.spd
    for b, i, j in [(1, 1, 5), (2, 3, 3), (3, 1, 2), (0, 0, 2), (1, 2, 9)]:
        code = int(spd[b, i, j])
        row = 4 if code == -1 else 5 if code == -2 else min(code, 3)
        assert torch.allclose(bias[b, :, i, j], enc.table[row])
    # the score_mod (FlexAttention form) equals the eager bias
    generic = generic_bias(enc, ctx(coords))
    assert torch.allclose(generic, bias)
    assert spatial_buckets(torch.tensor([-1, -2, 0, 7]), 5).tolist() == [6, 7, 0, 5]


def test_edge_bias_matches_formula(batch: Batch) -> None:
    """c_ij[h] = (1/N) Σ_n Σ_h' x_{e_n}[h'] W_n[h', h], x_e = mean of per-column embeddings."""
    coords = Graph(batch)
    enc = mmpe.build("graphormer_edge", num_heads=HEADS, max_hops=3)
    with torch.no_grad():
        enc.hop_weight.normal_()
    fast = dense_bias([enc], ctx(coords))
    attr, valid = coords.path_edge_attr(3)
    emb = enc.embed.weight
    for b, i, j in [(1, 0, 12), (1, 4, 5), (2, 13, 0), (0, 0, 2), (3, 0, 1), (1, 6, 6)]:
        ref = torch.zeros(HEADS)
        n = int(valid[b, i, j].sum())
        for p in range(n):
            x = torch.stack([emb[int(attr[b, i, j, p, f]) + f * enc.num_edge_types]
                             for f in range(attr.shape[-1])]).mean(0)
            ref += x @ enc.hop_weight[p]
        ref = ref / max(n, 1)
        assert torch.allclose(fast[b, :, i, j], ref, atol=1e-6)
    assert torch.allclose(generic_bias(enc, ctx(coords)), fast)  # mod == bias
    bad = Graph(batch.edge_index, batch.num_nodes, batch.batch, edge_attr=batch.edge_attr + 40)
    with pytest.raises(ValueError, match="num_edge_types"):
        dense_bias([enc], ctx(bad))
    with pytest.raises(ValueError, match="edge_attr|has_edge_features"):
        dense_bias([enc], ctx(Graph(batch.edge_index, batch.num_nodes, batch.batch)))


def test_graphormer_combined_and_centrality(batch: Batch) -> None:
    coords = Graph(batch)
    enc = mmpe.build("graphormer", num_heads=HEADS)
    total = dense_bias([enc], ctx(coords))
    assert torch.allclose(total, dense_bias([enc.spatial], ctx(coords)) + dense_bias([enc.edge], ctx(coords)))
    cen = mmpe.build("graphormer_centrality", d_model=16)
    p = cen(coords)
    deg = coords.in_degree
    assert torch.allclose(p[1, 4], cen.z_in.weight[deg[1, 4]] + cen.z_out.weight[deg[1, 4]])
    assert torch.all(p[0, 3:] == 0)  # padding of ethanol
    with pytest.raises(TypeError, match="graph"):
        cen(Sequence(5))


def test_virtual_token_encoding(batch: Batch) -> None:
    enc = mmpe.build("graphormer_virtual", d_model=8)
    coords = Graph(batch, virtual_token=True)
    p = enc(coords)
    assert torch.equal(p[:, 0], enc.token.expand(4, 8)) and torch.all(p[:, 1:] == 0)
    with pytest.raises(ValueError, match="virtual_token"):
        enc(Graph(batch))


def test_lappe_projection_and_sign_flip(batch: Batch) -> None:
    coords = Graph(batch)
    enc = mmpe.build("lappe", d_model=16, k=4)
    enc.eval()
    u, _ = coords.laplacian_pe(4)
    expected = enc.proj(u) * coords.node_mask[..., None]
    assert torch.allclose(enc(coords), expected)
    enc.train()
    torch.manual_seed(1)
    flipped = enc(coords)
    w, b0 = enc.proj.weight, enc.proj.bias
    # undo the bias: flipped − b = (s ⊙ u) Wᵀ, so |(flipped − b) solved| = |u|
    s_u = torch.linalg.lstsq(w, (flipped - b0).reshape(-1, 16).T).solution.T.reshape(u.shape)
    mask = coords.node_mask
    assert torch.allclose(s_u.abs()[mask], u.abs()[mask], atol=1e-4)
    assert not torch.allclose(s_u[mask], u[mask], atol=1e-4)  # some signs flipped
    mlp = mmpe.build("lappe", d_model=16, k=4, projection="mlp")
    assert mlp(coords).shape == (4, coords.n_max, 16)
    with pytest.raises(ValueError, match="projection"):
        mmpe.build("lappe", d_model=16, projection="cnn")


def test_rwse_projection(batch: Batch) -> None:
    coords = Graph(batch)
    enc = mmpe.build("rwse", d_model=12, k=6)
    assert torch.allclose(enc(coords), enc.proj(coords.rwse(6)) * coords.node_mask[..., None])


def test_1d_methods_on_hops(batch: Batch) -> None:
    coords = Graph(batch, max_distance=20)
    dist = coords.distances
    alibi = mmpe.build("alibi", num_heads=HEADS)
    bias = dense_bias([alibi], ctx(coords))
    assert torch.allclose(bias, -alibi_slopes(HEADS).view(1, -1, 1, 1) * dist[:, None])
    t5 = mmpe.build("t5", num_heads=HEADS)
    with torch.no_grad():
        t5.table.copy_(torch.arange(32 * HEADS, dtype=torch.float).view(32, HEADS))
    tb = dense_bias([t5], ctx(coords))
    # hops < 16 are exact buckets (unidirectional on an undirected distance)
    assert torch.allclose(tb[:, 0], (dist * HEADS).clamp(max=15 * HEADS).where(dist < 16, tb[:, 0]))
    fire = mmpe.build("fire", num_heads=HEADS)
    fb = dense_bias([fire], ctx(coords))
    same = dist[1] == dist[1, 0, 5]
    assert torch.allclose(fb[1, :, same], fb[1, :, 0, 5, None].expand(-1, int(same.sum())))
    generic = generic_bias(fire, ctx(coords))
    assert torch.allclose(generic, fb, atol=1e-5)


@pytest.mark.parametrize("encodings", [["alibi"], ["graphormer", "graphormer_centrality"],
                                       ["rwse", "fire"], ["lappe", "t5"]])
def test_padding_does_not_change_a_graph(encodings: list[str]) -> None:
    """A graph's outputs are the same alone and in a padded batch with larger graphs."""
    torch.manual_seed(0)
    model = Transformer(16, HEADS, 2, encodings).eval()
    mols = [from_smiles(s) for s in SMILES]
    big = Batch.from_data_list(mols)
    x = torch.randn(big.num_nodes, 16)
    out = Graph(big).unpad_nodes(model(Graph(big).pad_nodes(x), Graph(big)))
    start = int(big.ptr[0]), int(big.ptr[1])
    alone = Graph(Batch.from_data_list(mols[:1]))
    out_alone = alone.unpad_nodes(model(alone.pad_nodes(x[start[0]:start[1]]), alone))
    assert torch.allclose(out[start[0]:start[1]], out_alone, atol=1e-5)


def test_attention_paths_agree(batch: Batch) -> None:
    coords = Graph(batch, virtual_token=True)
    encs = [mmpe.build("graphormer", num_heads=HEADS)]
    x = torch.randn(4, coords.n_max, 16)
    out_sdpa = MultiHeadAttention(16, HEADS, encs, route="sdpa")
    out_math = MultiHeadAttention(16, HEADS, encs, route="math")
    out_math.load_state_dict(out_sdpa.state_dict())
    a, b = out_sdpa(x, coords), out_math(x, coords)
    mask = coords.padding_mask
    assert torch.allclose(a[mask], b[mask], atol=1e-5)


def test_permutation_equivariance() -> None:
    """Relabelling a molecule's atoms permutes the outputs (SPD/degree/edge/RWSE are invariant)."""
    data = from_smiles("CC(=O)Nc1ccc(O)cc1")
    n = data.num_nodes
    perm = torch.randperm(n)
    inv = torch.argsort(perm)
    permuted = data.clone()
    permuted.x = data.x[perm]
    permuted.edge_index = inv[data.edge_index]
    model = Transformer(16, HEADS, 2, ["rwse", "graphormer", "graphormer_centrality", "alibi"]).eval()
    x = torch.randn(n, 16)
    g1, g2 = Graph(data), Graph(permuted)
    out1 = g1.unpad_nodes(model(g1.pad_nodes(x), g1))
    out2 = g2.unpad_nodes(model(g2.pad_nodes(x[perm]), g2))
    assert torch.allclose(out1[perm], out2, atol=1e-5)


def test_graph_encodings_reject_other_coords() -> None:
    for name in ("lappe", "rwse", "graphormer_centrality"):
        with pytest.raises(TypeError):
            mmpe.build(name, d_model=8)(Sequence(4))
    enc = mmpe.build("graphormer_spatial", num_heads=2)
    with pytest.raises(TypeError):
        enc.score_mod(AttentionCall(coords=Sequence(4), num_heads=2, head_dim=4, batch=1))
    with pytest.raises(ValueError, match="num_heads"):
        enc.score_mod(ctx(Graph(torch.tensor([[0], [1]]), 2), heads=3))


class ProtocolOnlyGraph(mmpe.coords.Coordinates):
    """A graph class written outside mmpe: only the GraphLayout/GraphEdges members, no Graph."""

    def __init__(self, graph: Graph, edges: bool = True) -> None:
        self._g = graph
        self.virtual_token = graph.virtual_token
        if edges:
            self.path_edge_attr = graph.path_edge_attr

    num_queries = property(lambda self: self._g.n_max)
    batch_size = property(lambda self: self._g.num_graphs)
    spd = property(lambda self: self._g.spd)
    node_mask = property(lambda self: self._g.node_mask)
    in_degree = property(lambda self: self._g.in_degree)
    out_degree = property(lambda self: self._g.out_degree)

    def laplacian_pe(self, k: int, normalization: str | None = "sym"):
        return self._g.laplacian_pe(k, normalization)

    def rwse(self, k: int):
        return self._g.rwse(k)


def test_graph_encodings_read_only_the_protocol(batch: Batch) -> None:
    from mmpe.coords.capabilities import GraphEdges, GraphLayout

    graph = Graph(batch, virtual_token=True)
    toy = ProtocolOnlyGraph(graph)
    assert isinstance(toy, GraphLayout) and isinstance(toy, GraphEdges) and not isinstance(toy, Graph)
    torch.manual_seed(0)
    for name in ("lappe", "rwse", "graphormer_centrality", "graphormer_virtual"):
        enc = mmpe.build(name, d_model=8).eval()
        assert torch.equal(enc(toy), enc(graph)), name
    for name in ("graphormer_spatial", "graphormer_edge", "graphormer"):
        enc = mmpe.build(name, num_heads=HEADS)
        assert torch.equal(dense_bias([enc], ctx(toy)), dense_bias([enc], ctx(graph))), name
    no_edges = ProtocolOnlyGraph(graph, edges=False)
    with pytest.raises(TypeError, match="GraphEdges"):
        dense_bias([mmpe.build("graphormer_edge", num_heads=HEADS)], ctx(no_edges))
    assert dense_bias([mmpe.build("graphormer_spatial", num_heads=HEADS)], ctx(no_edges)).shape[1] == HEADS
