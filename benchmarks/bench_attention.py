"""Attention with a position bias against attention without, on the CPU: time of a layer's
forward + backward at n = 2048 and of its forward at n = 16,384, and peak memory (one process
per case, so the peak resident memory is the case's own). Ratio = time with the bias / time
without (the same layer with no encoding, which runs SDPA's fused causal kernel).

Times are the minimum over ``--repeat`` calls after a warm-up, as wall time and as the process's
CPU time: on a shared machine the CPU time is what other processes do not inflate, so the ratios
use it (``--rounds`` > 1 repeats the n = 2048 cases, interleaved, and prints the range).

    python benchmarks/bench_attention.py            # the table of the README
    python benchmarks/bench_attention.py --quick    # n = 2048 fwd+bwd only, no n = 16,384
    python benchmarks/bench_attention.py --coords   # grids, video, points and graphs

``--coords`` times the forward + backward of ``MultiHeadAttention(384, 6)`` (batch 1) on a 2D
grid, a 3D video grid, a point cloud and a graph at several sizes, each encoding against the
same layer with no encoding on the same coordinates, interleaved round by round (on grids also
the peer ``timm_beit``: timm's BEiT attention with its relative position bias, the table
``swin`` reads, which builds the dense bias; ``--names`` picks encodings); ratios are
medians of the per-round ratios of CPU times (after a warm-up step, with the default
allocator). Memory is the step's own peak, from one more process per case: the peak resident
memory minus the resident memory just before the step, with glibc's mmap threshold fixed at
64 kB so that freed blocks leave the resident set at once (with its default, adaptive threshold
the same case's peak varied by ±30 MB from run to run; with the fixed one, every large
allocation faults its pages in afresh, so that run is not timed).

``--store DIR`` also appends the printed table (``sequence``, or ``coords`` with ``--coords``)
to ``DIR/bench_attention.jsonl`` (``benchmarks/_store.py``); runs of ``--coords --only KIND``
each store their own rows of the one ``coords`` table.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import textwrap

from _store import Table, write

CASE = textwrap.dedent("""
    import resource, sys, time, torch, mmpe
    torch.set_num_threads(1)
    name, n, grad, repeat = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
    encs = [] if name == "none" else [mmpe.build(name, context={"num_heads": 8, "head_dim": 64,
                                                                "d_model": 512})]
    attn = mmpe.MultiHeadAttention(512, 8, encs)
    x = torch.randn(1, n, 512, requires_grad=grad)
    coords = mmpe.Sequence(n, causal=True)
    def step():
        if grad:
            attn(x, coords).square().mean().backward()
        else:
            with torch.no_grad():
                attn(x, coords)
    step()
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    print(min(wall), min(cpu), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
""")

NAMES = ["none", "alibi", "t5", "fire", "kerple_log"]


COORDS_CASE = textwrap.dedent("""
    import resource, sys, time, torch, mmpe
    torch.set_num_threads(1)
    kind, size, name, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.manual_seed(0)  # the learned encodings' initial values (FIRE's cuts: its cost)
    dims = tuple(int(s) for s in size.split("x"))
    if kind in ("grid", "video"):
        coords = mmpe.Grid(dims, prefix_tokens=1 if kind == "grid" else 0)
    elif kind == "points":
        coords = mmpe.Points(torch.rand(1, dims[0], 3, generator=torch.Generator().manual_seed(0)) * 10)
    else:  # a 2D lattice graph of dims[0] nodes in rows of 32: hop distances up to ~n/16
        n, w = dims[0], 32
        i = torch.arange(n)
        right = torch.stack((i[(i + 1) % w != 0][:-1], i[(i + 1) % w != 0][:-1] + 1))
        down = torch.stack((i[: n - w], i[: n - w] + w))
        edges = torch.cat((right[:, right[1] < n], down), dim=1)
        coords = mmpe.Graph(edges, num_nodes=n, max_distance=64)
    context = {"num_heads": 6, "head_dim": 64, "d_model": 384, "grid_shape": dims}
    x = torch.randn(1, coords.num_queries, 384, requires_grad=True)
    if name == "timm_beit":  # the peer: BEiT's attention with its relative bias, dense
        from timm.models.beit import Attention
        peer = Attention(384, 6, qkv_bias=True, window_size=dims)
        def step():
            peer(x).square().mean().backward()
    else:
        encs = [] if name == "none" else [mmpe.build(name, context=context)]
        attn = mmpe.MultiHeadAttention(384, 6, encs)
        def step():
            attn(x, coords).square().mean().backward()
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    base = rss()
    step()  # warm-up (and, in the memory run, the step whose peak is read)
    cpu = []
    for _ in range(repeat):
        c = time.process_time()
        step()
        cpu.append(time.process_time() - c)
    print(min(cpu, default=float("nan")), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10 - base)
""")

#: (coordinates, size, encodings): grids with a cls token, video grids, points, graphs.
COORDS = [
    # timm_beit: timm's BEiT attention with its relative position bias (the table swin reads)
    ("grid", "32x32", ["alibi", "t5", "kerple_log", "fire", "swin", "swinv2_cpb", "rope_axial",
                       "timm_beit"]),
    ("grid", "64x64", ["alibi", "t5", "kerple_log", "fire", "swin", "swinv2_cpb", "rope_axial",
                       "timm_beit"]),
    ("video", "8x16x16", ["alibi", "t5", "fire", "swin"]),
    ("video", "16x16x16", ["alibi", "t5", "fire", "swin"]),
    # gaussian_distance builds [b, n, n, K] pair features: 3.4 GB and 69x at 1,024 points
    ("points", "1024", ["alibi", "fire", "kerple_log"]),
    ("points", "4096", ["alibi", "fire", "kerple_log"]),
    ("graph", "1024", ["alibi", "graphormer_spatial"]),
    ("graph", "4096", ["alibi", "graphormer_spatial"]),
]

#: memory only (not timed): the grid whose peak memory the grid plan must keep.
MEMORY = [("grid", "128x128", ["alibi", "t5", "kerple_log", "fire", "swin", "swinv2_cpb"])]


def run_coords(kind: str, size: str, name: str, repeat: int,
               memory: bool = False) -> tuple[float, float]:
    """``(CPU s, step peak MiB)`` of one case in a fresh process (``memory``: the run whose
    peak is read, with a fixed mmap threshold; ``repeat=0`` then times nothing)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if memory else None
    out = subprocess.run([sys.executable, "-c", COORDS_CASE, kind, size, name, str(repeat)],
                         capture_output=True, text=True, check=True, env=env).stdout.split()
    return float(out[0]), float(out[1])


def coords_table(rounds: int, repeat: int, only: str | None, memory: bool,
                 picked: list[str] | None = None) -> Table:
    """Print the ratio table of ``--coords``: time and step memory against no encoding."""
    table = Table("coords", "Position biases beyond sequences (CPU, one thread, d_model 384, "
                  "6 heads, batch 1, fwd+bwd)",
                  ["coordinates", "tokens", "encoding", "CPU (s)", "time ratio", "step MiB",
                   "memory ratio"],
                  [None, "{:,.0f}", None, "{:.2f}", "{:.2f}", "{:.0f}", "{:.2f}"])
    print("## Position biases beyond sequences (CPU, one thread, d_model 384, 6 heads, batch 1, "
          "fwd+bwd)\n")
    print("| coordinates | tokens | encoding | CPU (s) | time ratio | step MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    cases = [c for c in COORDS if only is None or c[0] == only]
    if memory:
        cases += MEMORY
    if picked:  # some encodings only (the reference, none, is always run)
        cases = [(kind, size, [n for n in encs if n in picked]) for kind, size, encs in cases]
        cases = [c for c in cases if c[2]]
    for kind, size, names in cases:
        memory_only = any((kind, size) == m[:2] for m in MEMORY)
        times = {name: [] for name in ["none", *names]}
        mems = {name: [] for name in times}
        for _ in range(1 if memory_only else rounds):
            for name in times:  # interleaved: a slow spell of the machine hits every case
                if memory_only:
                    times[name].append(float("nan"))
                else:
                    times[name].append(run_coords(kind, size, name, repeat)[0])
        for name in times:
            mems[name].append(run_coords(kind, size, name, 0, memory=True)[1])
        tokens = _tokens(kind, size)
        for name in names:
            ratio = statistics.median(a / b for a, b in zip(times[name], times["none"],
                                                            strict=True))
            mem = max(mems[name])
            table.add(f"{kind} {size}", tokens, name, _finite(min(times[name])), _finite(ratio),
                      mem, mem / max(mems["none"]))
            print(f"| {kind} {size} | {tokens:,} | {name} | {min(times[name]):.2f} | "
                  f"{ratio:.2f} | {mem:.0f} | {mem / max(mems['none']):.2f} |", flush=True)
        table.add(f"{kind} {size}", tokens, "none", _finite(min(times["none"])),
                  None if memory_only else 1.0, max(mems["none"]), 1.0)
        print(f"| {kind} {size} | {tokens:,} | none | {min(times['none']):.2f} | 1.00 | "
              f"{max(mems['none']):.0f} | 1.00 |", flush=True)
    return table


def _finite(value: float) -> float | None:
    """``value``, or None where it was not measured (nan: a memory-only row)."""
    return value if math.isfinite(value) else None


def _tokens(kind: str, size: str) -> int:
    cells = math.prod(int(s) for s in size.split("x"))
    return cells + 1 if kind == "grid" else cells


def run(name: str, n: int, grad: bool, repeat: int) -> tuple[float, float, float]:
    """``(wall s, CPU s, peak GiB)`` of one case in a fresh process."""
    out = subprocess.run([sys.executable, "-c", CASE, name, str(n), "1" if grad else "0",
                          str(repeat)], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(NAMES),
                        help="encodings, comma-separated ('none' is the reference)")
    parser.add_argument("--n", type=int, default=2048, help="length of the fwd+bwd cases")
    parser.add_argument("--long", type=int, default=16384, help="length of the forward cases")
    parser.add_argument("--repeat", type=int, default=2, help="timed calls per case")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repetitions of the fwd+bwd cases (ratios then as min–max)")
    parser.add_argument("--quick", action="store_true", help="fwd+bwd only, one round")
    parser.add_argument("--coords", action="store_true",
                        help="grids, video, points and graphs instead of sequences")
    parser.add_argument("--only", choices=["grid", "video", "points", "graph"],
                        help="with --coords: one kind of coordinates")
    parser.add_argument("--no-memory", action="store_true",
                        help="with --coords: skip the 128 x 128 memory rows")
    parser.add_argument("--store", metavar="DIR",
                        help="also append the table to DIR/bench_attention.jsonl")
    args = parser.parse_args()
    if args.coords:
        rounds = max(args.rounds, 3)
        picked = args.names.split(",") if args.names != ",".join(NAMES) else None
        table = coords_table(rounds, args.repeat, args.only, not args.no_memory, picked)
        write(args.store, __file__, [table], threads=1,
              config={"rounds": rounds, "repeat": args.repeat})
        return
    names = args.names.split(",")
    if "none" not in names:
        names.insert(0, "none")
    rounds = 1 if args.quick else args.rounds
    short = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:  # interleaved, so that a slow spell of the machine hits every case
            short[name].append(run(name, args.n, True, args.repeat))
    long = {} if args.quick else {name: run(name, args.long, False, args.repeat)
                                  for name in names}

    def ratio_range(case: dict, name: str, col: int) -> tuple[float, float]:
        values = [r[col] / b[col] for r, b in zip(case[name], case["none"], strict=True)]
        return min(values), max(values)

    def ratios(case: dict, name: str, col: int) -> str:
        lo, hi = ratio_range(case, name, col)
        return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}–{hi:.2f}"

    def stored_ratio(case: dict, name: str, col: int) -> float | list[float]:
        lo, hi = ratio_range(case, name, col)
        return lo if lo == hi else [lo, hi]

    short_cols = [f"fwd+bwd n={args.n}: wall (s)", f"fwd+bwd n={args.n}: CPU (s)",
                  f"fwd+bwd n={args.n}: ratio (CPU)", f"fwd+bwd n={args.n}: ratio (wall)",
                  f"fwd+bwd n={args.n}: peak GiB"]
    long_cols = [f"fwd n={args.long}: CPU (s)", f"fwd n={args.long}: ratio (CPU)",
                 f"fwd n={args.long}: peak GiB"] if long else []
    table = Table("sequence", "Biased attention on the CPU (d_model 512, 8 heads, causal, one "
                  "thread); ratios: time with the bias / time without",
                  ["encoding", *short_cols, *long_cols],
                  [None, "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}",
                   *(["{:.1f}", "{:.2f}", "{:.2f}"] if long else [])])

    print("## Biased attention on the CPU (d_model 512, 8 heads, causal, one thread)\n")
    head = (f"| encoding | fwd+bwd n={args.n}: wall (s) | CPU (s) | ratio (CPU) | ratio (wall) "
            f"| peak GiB |")
    rule = "|---|---|---|---|---|---|"
    if long:
        head += f" fwd n={args.long}: CPU (s) | ratio (CPU) | peak GiB |"
        rule += "---|---|---|"
    print(head)
    print(rule)
    for name in names:
        wall = min(r[0] for r in short[name])
        cpu = min(r[1] for r in short[name])
        mem = max(r[2] for r in short[name])
        row = (f"| {name} | {wall:.2f} | {cpu:.2f} | {ratios(short, name, 1)} | "
               f"{ratios(short, name, 0)} | {mem:.2f} |")
        cells = [name, wall, cpu, stored_ratio(short, name, 1), stored_ratio(short, name, 0), mem]
        if long:
            _, cpu16, mem16 = long[name]
            row += f" {cpu16:.1f} | {cpu16 / long['none'][1]:.2f} | {mem16:.2f} |"
            cells += [cpu16, cpu16 / long["none"][1], mem16]
        table.add(*cells)
        print(row)
    write(args.store, __file__, [table], threads=1,
          config={"names": names, "n": args.n, "long": args.long if long else None,
                  "repeat": args.repeat, "rounds": rounds})


if __name__ == "__main__":
    main()
