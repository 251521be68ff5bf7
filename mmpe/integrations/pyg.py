"""PyTorch Geometric integration: transforms that attach graph positions, and a layer.

Transforms (``torch_geometric.transforms.BaseTransform`` subclasses, with functional names as
PyG registers its own) compute per graph with :class:`mmpe.coords.Graph` and store the result
on the ``Data`` object, so they run once as a dataset ``pre_transform`` and batch with PyG's
``DataLoader``; :class:`mmpe.coords.Graph` built from the ``Batch`` then reads them instead of
recomputing:

==========================  ==============================  ===================================
transform                   functional name                 attributes
==========================  ==============================  ===================================
:class:`AddShortestPaths`   ``mmpe_shortest_paths``         ``spd [n²]``, ``spd_index [2, n²]``
                                                            (+ ``spd_edge_attr [n², P, F]``,
                                                            ``spd_edge_mask [n², P]``)
:class:`AddLaplacianPE`     ``mmpe_laplacian_pe``           ``laplacian_eigenvector_pe [n, k]``
:class:`AddRWSE`            ``mmpe_rwse``                   ``random_walk_pe [n, k]``
:class:`AddDegree`          ``mmpe_degree``                 ``in_degree [n]``, ``out_degree [n]``
==========================  ==============================  ===================================

``spd`` holds hop counts, −1 for unreachable pairs; ``spd_index`` names the pairs (its name
contains "index", so PyG offsets it by the node count when batching). The attribute names of
LapPE and RWSE are PyG's own, so PyG's ``AddLaplacianEigenvectorPE``/``AddRandomWalkPE``
output is read as well (mmpe's LapPE has deterministic signs; PyG's are random).

    from torch_geometric.transforms import Compose
    from torch_geometric.loader import DataLoader
    pre = Compose([AddShortestPaths(edge_hops=5), AddLaplacianPE(8), AddRWSE(16), AddDegree()])
    graphs = [pre(from_smiles(s)) for s in smiles]
    layer = GraphTransformer(64, 4, depth=2, encodings=["rwse", "graphormer"])
    for batch in DataLoader(graphs, batch_size=32):
        h = layer(x_embed(batch.x), batch.edge_index, batch.batch, data=batch)   # [N, 64]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from mmpe.coords.graph import Graph
from mmpe.transformer import EncodingSpec, Transformer

__all__ = ["AddDegree", "AddLaplacianPE", "AddRWSE", "AddShortestPaths", "GraphTransformer"]


def _one_graph(data: Data, **kwargs: Any) -> Graph:
    if getattr(data, "batch", None) is not None:
        raise ValueError("mmpe transforms work on one graph (a Data object), not on a Batch")
    return Graph(data.edge_index, int(data.num_nodes), edge_attr=getattr(data, "edge_attr", None),
                 **kwargs)


@functional_transform("mmpe_shortest_paths")
class AddShortestPaths(BaseTransform):
    """Attach all-pairs shortest-path hops (``spd``, ``spd_index``) and, with ``edge_hops > 0``,
    the edge features along each path (``spd_edge_attr``, ``spd_edge_mask``; Graphormer's edge
    encoding reads them). Hops are stored unclipped (−1: unreachable)."""

    def __init__(self, edge_hops: int = 0) -> None:
        if edge_hops < 0:
            raise ValueError(f"AddShortestPaths: edge_hops must be >= 0, got {edge_hops}")
        self.edge_hops = edge_hops

    def forward(self, data: Data) -> Data:
        n = int(data.num_nodes)
        g = _one_graph(data, max_distance=max(1, n))
        spd = g.spd[0].cpu()
        ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        data.spd = spd.flatten()
        data.spd_index = torch.stack([ii.flatten(), jj.flatten()])
        if self.edge_hops:
            attr, valid = g.path_edge_attr(self.edge_hops)
            data.spd_edge_attr = attr[0].reshape(n * n, self.edge_hops, -1).cpu()
            data.spd_edge_mask = valid[0].reshape(n * n, self.edge_hops).cpu()
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(edge_hops={self.edge_hops})"


@functional_transform("mmpe_laplacian_pe")
class AddLaplacianPE(BaseTransform):
    """Attach ``k`` Laplacian eigenvectors ``[n, k]`` (deterministic signs, zero columns when the
    graph has fewer than ``k + 1`` nodes) as ``laplacian_eigenvector_pe``."""

    def __init__(self, k: int, normalization: str | None = "sym",
                 attr_name: str = "laplacian_eigenvector_pe") -> None:
        self.k, self.normalization, self.attr_name = k, normalization, attr_name

    def forward(self, data: Data) -> Data:
        pe, _ = _one_graph(data).laplacian_pe(self.k, self.normalization)
        data[self.attr_name] = pe[0].cpu()
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k}, normalization={self.normalization!r})"


@functional_transform("mmpe_rwse")
class AddRWSE(BaseTransform):
    """Attach random-walk return probabilities ``[n, k]`` as ``random_walk_pe``."""

    def __init__(self, k: int, attr_name: str = "random_walk_pe") -> None:
        self.k, self.attr_name = k, attr_name

    def forward(self, data: Data) -> Data:
        data[self.attr_name] = _one_graph(data).rwse(self.k)[0].cpu()
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"


@functional_transform("mmpe_degree")
class AddDegree(BaseTransform):
    """Attach ``in_degree`` and ``out_degree`` ``[n]`` (int64, duplicate edges counted once)."""

    def forward(self, data: Data) -> Data:
        g = _one_graph(data)
        data.in_degree = g.in_degree[0].cpu()
        data.out_degree = g.out_degree[0].cpu()
        return data


class GraphTransformer(nn.Module):
    """A stack of mmpe transformer blocks on PyG-style inputs: ``(x, edge_index, batch)``.

    Builds :class:`mmpe.coords.Graph` coordinates (reading precomputed attributes from
    ``data`` when given), pads the nodes to ``[b, n_max, d]``, runs
    :class:`mmpe.transformer.Transformer` with the given encodings (any registry names that
    support ``"graph"``: ``lappe``, ``rwse``, ``graphormer``, ``graphormer_centrality``,
    ``alibi``, ``t5``, ``fire`` …) and returns node features in PyG order.

    Args:
        d_model, num_heads, depth: transformer size.
        encodings: registry names / config dicts / built encodings.
        max_distance: hop clip of the coordinates.
        **kwargs: passed to :class:`~mmpe.transformer.Transformer` (``mlp_ratio``, ``dropout`` …).

    Shapes: ``forward(x [N, d_model], edge_index [2, E], batch [N] | None, edge_attr [E, F] |
    None, data=None) -> [N, d_model]``.
    """

    def __init__(self, d_model: int, num_heads: int, depth: int = 1,
                 encodings: Sequence[EncodingSpec] = (), max_distance: int = 20, **kwargs: Any) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.transformer = Transformer(d_model, num_heads, depth, encodings, **kwargs)

    def coords(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None,
               edge_attr: Tensor | None = None, data: Data | None = None) -> Graph:
        """The :class:`~mmpe.coords.Graph` the layer attends over."""
        if data is not None:
            return Graph(data, max_distance=self.max_distance, device=x.device)
        return Graph(edge_index, x.shape[0], batch, edge_attr=edge_attr,
                     max_distance=self.max_distance, device=x.device)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None,
                edge_attr: Tensor | None = None, data: Data | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"GraphTransformer: x must be [num_nodes, d_model], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        coords = self.coords(x, edge_index, batch, edge_attr, data)
        return coords.unpad_nodes(self.transformer(coords.pad_nodes(x), coords))
