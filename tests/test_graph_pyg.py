"""PyG integration: transforms as a pre_transform, batching, and the graph-transformer layer."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
from torch.utils.data import IterDataPipe
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.transforms import AddRandomWalkPE, Compose
from torch_geometric.utils import from_smiles

from mmpe.coords import Graph
from mmpe.integrations.pyg import (
    AddDegree,
    AddLaplacianPE,
    AddRWSE,
    AddShortestPaths,
    GraphTransformer,
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
    pre, ref = Graph(batch, max_distance=6), Graph(ref_batch, max_distance=6)
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
