"""PyG integration: transforms as a pre_transform, batching, and the graph-transformer layer."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import torch
from torch.utils.data import IterDataPipe
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE, Compose
from torch_geometric.utils import from_smiles

from mmpe.coords import Graph
from mmpe.integrations.pyg import (
    AddDegree,
    AddLaplacianPE,
    AddRWSE,
    AddShortestPaths,
    GraphTransformer,
    graph_kwargs,
)

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "[Na+].[Cl-]", "C"]
PRE = Compose([AddShortestPaths(edge_hops=4), AddLaplacianPE(5), AddRWSE(6), AddDegree()])


def test_functional_names_registered() -> None:
    assert {"mmpe_shortest_paths", "mmpe_laplacian_pe", "mmpe_rwse", "mmpe_degree"} <= set(IterDataPipe.functions)


def test_transform_attributes_match_references() -> None:
    data = PRE(from_smiles("CC(=O)Nc1ccc(O)cc1"))
    n = data.num_nodes
    assert data.spd.shape == (n * n,) and data.spd_index.shape == (2, n * n)
    g = nx.Graph(data.edge_index.t().tolist())
    lengths = dict(nx.all_pairs_shortest_path_length(g))
    for (i, j), d in zip(data.spd_index.t().tolist(), data.spd.tolist(), strict=True):
        assert lengths[i][j] == d
    ref = AddRandomWalkPE(6)(from_smiles("CC(=O)Nc1ccc(O)cc1")).random_walk_pe
    assert torch.allclose(data.random_walk_pe, ref, atol=1e-6)
    assert data.laplacian_eigenvector_pe.shape == (n, 5)
    assert data.in_degree.tolist() == [g.degree[i] for i in range(n)]
    assert data.spd_edge_attr.shape == (n * n, 4, 3) and data.spd_edge_mask.shape == (n * n, 4)


def test_batched_precomputed_equals_computed() -> None:
    graphs = [PRE(from_smiles(s)) for s in SMILES]
    raw = [from_smiles(s) for s in SMILES]
    batch = next(iter(DataLoader(graphs, batch_size=len(graphs))))
    ref_batch = next(iter(DataLoader(raw, batch_size=len(raw))))
    pre = Graph.from_pyg(batch, **graph_kwargs(PRE), max_distance=6)
    ref = Graph(ref_batch, max_distance=6)
    assert set(pre.precomputed) == {"spd", "spd_index", "path_edge_attr", "path_edge_mask",
                                    "laplacian_pe", "rwse", "in_degree", "out_degree"}
    assert not ref.precomputed
    assert torch.equal(pre.spd, ref.spd)
    assert torch.allclose(pre.rwse(6), ref.rwse(6))
    assert torch.allclose(pre.laplacian_pe(5)[0], ref.laplacian_pe(5)[0])
    assert torch.equal(pre.laplacian_pe(5)[1], ref.laplacian_pe(5)[1])
    assert torch.equal(pre.in_degree, ref.in_degree) and torch.equal(pre.out_degree, ref.out_degree)
    for a, b in zip(pre.path_edge_attr(4), ref.path_edge_attr(4), strict=True):
        assert torch.equal(a, b)


def test_transform_rejects_batch() -> None:
    batch = next(iter(DataLoader([from_smiles("CCO")] * 2, batch_size=2)))
    with pytest.raises(ValueError, match="one graph"):
        AddRWSE(3)(batch)


def test_graph_transformer_layer() -> None:
    graphs = [PRE(from_smiles(s)) for s in SMILES[:4]]
    batch = next(iter(DataLoader(graphs, batch_size=4)))
    layer = GraphTransformer(16, 4, depth=2, encodings=["rwse", "graphormer", "graphormer_centrality"])
    layer.eval()
    x = torch.randn(batch.num_nodes, 16)
    out = layer(x, batch.edge_index, batch.batch, batch.edge_attr)
    assert out.shape == (batch.num_nodes, 16) and torch.isfinite(out).all()
    assert torch.allclose(out, layer(x, batch.edge_index, batch.batch, data=batch), atol=1e-6)
    # equals the mmpe Transformer run on the padded batch
    coords = Graph(batch)
    manual = coords.unpad_nodes(layer.transformer(coords.pad_nodes(x), coords))
    assert torch.allclose(out, manual, atol=1e-6)
    out.sum().backward()
    tables = [p for name, p in layer.named_parameters() if name.endswith("spatial.table")]
    assert tables and all(t.grad is not None and t.grad.abs().sum() > 0 for t in tables)
    with pytest.raises(ValueError, match="num_nodes, d_model"):
        layer(torch.randn(3), batch.edge_index)


def test_layer_inside_a_pyg_model() -> None:
    """A PyG-style model (GCN layer + mmpe attention) trains a step on a real molecule batch."""
    from torch_geometric.nn import GCNConv, global_mean_pool

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(9, 16)
            self.gcn = GCNConv(16, 16)
            self.attn = GraphTransformer(16, 2, encodings=["lappe", "alibi"])
            self.out = torch.nn.Linear(16, 1)

        def forward(self, data: Data) -> torch.Tensor:
            h = self.gcn(self.inp(data.x.float()), data.edge_index).relu()
            h = self.attn(h, data.edge_index, data.batch)
            return self.out(global_mean_pool(h, data.batch)).squeeze(-1)

    batch = next(iter(DataLoader([from_smiles(s) for s in SMILES], batch_size=6)))
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.arange(6, dtype=torch.float)
    losses = []
    for _ in range(3):
        loss = ((model(batch) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


# ---------------------------------------------------------------- attr_name end to end
CUSTOM = Compose([AddShortestPaths(edge_hops=3, attr_name="hops"), AddLaplacianPE(4, attr_name="lap"),
                  AddRWSE(5, attr_name="rw"), AddDegree("deg_in", "deg_out")])


def custom_batch():
    graphs = [CUSTOM(from_smiles(s)) for s in SMILES]
    return next(iter(DataLoader(graphs, batch_size=len(graphs))))


def test_transforms_copy_the_input() -> None:
    data = from_smiles("CC(=O)Nc1ccc(O)cc1")
    keys, edges = set(data.keys()), data.edge_index.clone()
    out = CUSTOM(data)
    assert set(data.keys()) == keys and torch.equal(data.edge_index, edges)
    assert {"hops", "hops_index", "hops_edge_attr", "hops_edge_mask", "lap", "rw", "deg_in",
            "deg_out"} <= set(out.keys())
    assert not {"spd", "random_walk_pe", "laplacian_eigenvector_pe", "in_degree"} & set(out.keys())


def test_custom_attr_names_are_read_end_to_end(monkeypatch) -> None:
    """Graph.from_pyg told the custom names uses the stored values and recomputes nothing."""
    batch = custom_batch()
    ref = Graph(next(iter(DataLoader([from_smiles(s) for s in SMILES], batch_size=len(SMILES)))))
    kwargs = graph_kwargs(CUSTOM)
    assert kwargs == {"spd": "hops", "spd_index": "hops_index", "path_edge_attr": "hops_edge_attr",
                      "path_edge_mask": "hops_edge_mask", "laplacian_pe": "lap",
                      "laplacian_normalization": "sym", "rwse": "rw", "in_degree": "deg_in",
                      "out_degree": "deg_out"}
    want = {"spd": ref.spd, "rwse5": ref.rwse(5), "rwse2": ref.rwse(2), "lap": ref.laplacian_pe(4),
            "in": ref.in_degree, "out": ref.out_degree, "path": ref.path_edge_attr(3)}
    import mmpe.coords.graph as graph_module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed a precomputed value")

    for name in ("shortest_path_hops", "laplacian_pe", "random_walk_pe", "degrees", "path_edge_ids"):
        monkeypatch.setattr(graph_module, name, fail)
    coords = Graph.from_pyg(batch, **kwargs)
    assert torch.equal(coords.spd, want["spd"])
    assert torch.allclose(coords.rwse(5), want["rwse5"]) and torch.allclose(coords.rwse(2), want["rwse2"])
    assert torch.allclose(coords.laplacian_pe(4)[0], want["lap"][0])
    assert torch.equal(coords.laplacian_pe(4)[1], want["lap"][1])
    assert torch.equal(coords.in_degree, want["in"]) and torch.equal(coords.out_degree, want["out"])
    for a, b in zip(coords.path_edge_attr(3), want["path"], strict=True):
        assert torch.equal(a, b)
    # the values come from the named attribute: change it and the coordinates follow
    batch.rw = torch.full_like(batch.rw, 0.25)
    tampered = Graph.from_pyg(batch, **kwargs).rwse(5)
    assert torch.all(tampered[tampered != 0] == 0.25)
    # a model reads them the same way
    layer = GraphTransformer(16, 2, encodings=[{"name": "rwse", "k": 5}, {"name": "lappe", "k": 4},
                                              {"name": "graphormer", "max_hops": 3},
                                              "graphormer_centrality"], precomputed=kwargs).eval()
    x = torch.randn(batch.num_nodes, 16)
    assert layer(x, batch.edge_index, batch.batch, data=batch).shape == (batch.num_nodes, 16)


def test_wrong_or_missing_attr_name_raises_naming_it() -> None:
    batch = custom_batch()
    with pytest.raises(ValueError, match=r"rwse='random_walk_pe' names no attribute.*'rw'"):
        Graph.from_pyg(batch, rwse="random_walk_pe")  # the transform stored it as "rw"
    with pytest.raises(ValueError, match=r"spd_index='spd_index'"):
        Graph.from_pyg(batch, spd="hops", spd_index="spd_index")
    with pytest.raises(ValueError, match=r"spd='spd'"):
        Graph.from_pyg(batch, spd="spd")
    with pytest.raises(ValueError, match=r"in_degree='in_degree'"):
        Graph.from_pyg(batch, in_degree="in_degree")
    with pytest.raises(ValueError, match=r"edge_attr='bond_attr'"):
        Graph.from_pyg(batch, edge_attr="bond_attr")
    with pytest.raises(TypeError, match="rwse must be an attribute name"):
        Graph.from_pyg(batch, rwse=5)
    with pytest.raises(ValueError, match="path_edge_attr and path_edge_mask"):
        Graph.from_pyg(batch, spd="hops", path_edge_attr="hops_edge_attr")
    # asking for more than was precomputed is an error, not a silent recomputation
    coords = Graph.from_pyg(batch, **graph_kwargs(CUSTOM))
    with pytest.raises(ValueError, match=r"rwse was precomputed with 5 columns.*AddRWSE\(8\)"):
        coords.rwse(8)
    with pytest.raises(ValueError, match=r"laplacian_pe was precomputed with normalization='sym'"):
        coords.laplacian_pe(4, normalization=None)
    with pytest.raises(ValueError, match=r"precomputed for 3 hops"):
        coords.path_edge_attr(4)
    # the default edge_attr name may be absent; structure-only Graph(data) reads no attributes
    plain = Data(edge_index=batch.edge_index, num_nodes=batch.num_nodes)
    assert Graph.from_pyg(plain).edge_attr is None
    assert not Graph(batch).precomputed


def test_transform_attr_name_validation() -> None:
    with pytest.raises(ValueError, match="contains 'index'"):
        AddRWSE(3, attr_name="rw_index")
    with pytest.raises(ValueError, match="contains 'batch'"):
        AddShortestPaths(attr_name="batch_spd")
    with pytest.raises(ValueError, match="identifier"):
        AddLaplacianPE(3, attr_name="my pe")
    with pytest.raises(ValueError, match="edge_hops"):
        AddShortestPaths(edge_hops=-1)
    with pytest.raises(ValueError, match="k must be"):
        AddRWSE(0)
    with pytest.raises(ValueError, match="needs edge_attr"):
        AddShortestPaths(edge_hops=2)(Data(edge_index=torch.tensor([[0], [1]]), num_nodes=2))


def test_pyg_own_transforms_are_read_through_their_attr_name() -> None:
    pre = Compose([AddRandomWalkPE(6, attr_name="pyg_rw"), AddLaplacianEigenvectorPE(2, attr_name="pyg_lap")])
    graphs = [pre(Data(edge_index=g.edge_index, num_nodes=g.num_nodes))
              for g in (from_smiles(s) for s in SMILES[:4])]
    batch = next(iter(DataLoader(graphs, batch_size=4)))
    kwargs = graph_kwargs(pre)
    assert kwargs == {"rwse": "pyg_rw", "laplacian_pe": "pyg_lap", "laplacian_normalization": "sym"}
    coords = Graph.from_pyg(batch, **kwargs)
    assert torch.allclose(coords.rwse(6), Graph(batch).rwse(6), atol=1e-6)
    lap = coords.laplacian_pe(2)[0]
    assert torch.allclose(lap.abs(), Graph(batch).laplacian_pe(2)[0].abs(), atol=1e-5)


def test_layer_precomputed_needs_data() -> None:
    layer = GraphTransformer(8, 2, encodings=["rwse"], precomputed={"rwse": "random_walk_pe"})
    with pytest.raises(ValueError, match="pass data="):
        layer(torch.randn(3, 8), torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match="unknown keys"):
        GraphTransformer(8, 2, precomputed={"random_walk": "rw"})


# ---------------------------------------------------------------- GPS: mmpe biases in PyG's layer
def gps_batch():
    graphs = [from_smiles(s) for s in SMILES]
    return next(iter(DataLoader(graphs, batch_size=len(graphs))))


def pyg_gps(seed: int = 0):
    from torch_geometric.nn import GINConv, GPSConv

    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    return GPSConv(16, GINConv(mlp), heads=4)


def test_pyg_gpsconv_has_no_custom_attention_hook() -> None:
    """Why MMPEGPSConv exists: GPSConv builds nn.MultiheadAttention or a Performer by name."""
    from torch_geometric.nn import GPSConv

    with pytest.raises(ValueError, match="not supported"):
        GPSConv(16, None, heads=4, attn_type="mmpe")


def test_mmpe_gpsconv_without_encodings_equals_pyg_gpsconv() -> None:
    from torch_geometric.nn import GPSConv

    from mmpe.integrations.pyg import MMPEGPSConv

    batch = gps_batch()
    x = torch.randn(batch.num_nodes, 16)
    gps = pyg_gps()
    gps.train()
    gps(x, batch.edge_index, batch.batch)  # batch-norm running statistics, then eval
    gps.eval()
    ours = MMPEGPSConv.from_gpsconv(gps)
    assert isinstance(ours, GPSConv) and not ours.training
    theirs_keys = {k for k in gps.state_dict() if not k.startswith("attn.")}
    assert theirs_keys == {k for k in ours.state_dict() if not k.startswith("attn.")}
    with torch.no_grad():
        ref = gps(x, batch.edge_index, batch.batch)
        out = ours(x, batch.edge_index, batch.batch)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("name", ["graphormer_spatial", "alibi", "t5", "fire"])
def test_mmpe_gpsconv_biases_change_the_output_and_train(name: str) -> None:
    from mmpe.integrations.pyg import MMPEGPSConv

    batch = gps_batch()
    x = torch.randn(batch.num_nodes, 16, requires_grad=True)
    gps = pyg_gps().eval()
    ours = MMPEGPSConv.from_gpsconv(gps, [name]).eval()
    with torch.no_grad():
        for p in ours.attn.attn.scores.parameters():
            p.normal_()  # T5's table starts at 0
        assert not torch.allclose(ours(x, batch.edge_index, batch.batch),
                                  gps(x, batch.edge_index, batch.batch), atol=1e-4)
    coords = Graph.from_pyg(batch)  # hops once, shared by a stack of layers
    second = MMPEGPSConv(16, None, heads=4, encodings=[name], norm="layer_norm")
    out = second(ours(x, batch.edge_index, batch.batch, coords=coords), batch.edge_index, batch.batch,
                 coords=coords)
    assert out.shape == (batch.num_nodes, 16) and torch.isfinite(out).all()
    out.square().sum().backward()
    grads = [p.grad for p in ours.attn.attn.scores.parameters()]  # none for ALiBi (fixed slopes)
    assert name == "alibi" or any(g is not None and g.abs().sum() > 0 for g in grads)
    assert x.grad.abs().sum() > 0


def test_graph_attention_pads_inside_and_reads_precomputed_data() -> None:
    from mmpe.integrations.pyg import GraphAttention

    graphs = [PRE(from_smiles(s)) for s in SMILES]
    batch = next(iter(DataLoader(graphs, batch_size=len(graphs))))
    layer = GraphAttention(16, 4, ["graphormer_spatial", "alibi"],
                           precomputed=graph_kwargs(PRE)).eval()
    x = torch.randn(batch.num_nodes, 16)
    with torch.no_grad():
        out = layer(x, batch.batch, edge_index=batch.edge_index)
        coords = Graph(batch)
        manual = coords.unpad_nodes(layer.attn(coords.pad_nodes(x), coords))
        assert torch.allclose(out, manual, atol=1e-6)
        assert torch.allclose(layer(x, data=batch), out, atol=1e-6)  # spd read from the batch
        assert torch.allclose(layer(x, coords=coords), out, atol=1e-6)
    with pytest.raises(ValueError, match="input encodings"):
        GraphAttention(16, 4, ["rwse"])
    with pytest.raises(ValueError, match="num_nodes, channels"):
        layer(torch.randn(3))
    with pytest.raises(ValueError, match="nodes"):
        layer(torch.randn(4, 16), coords=coords)
