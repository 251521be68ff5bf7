"""Memory per rank of one context-parallel attention layer (forward + backward), by length.

``python benchmarks/bench_context_parallel.py [--lengths 2048 4096 8192 16384] [--world 2]
[--store results/bench]``

Each length runs in its own group of ``--world`` spawned gloo processes on the CPU: one
``MultiHeadAttention(128, 2, [RoPE])`` on a causal ``Sequence(n)`` sharded in the ``balanced``
layout (``mmpe.parallel``), batch 1. A rank's memory is its step's own peak: peak resident
memory minus the resident memory just before the step, with glibc's mmap threshold fixed at
64 kB (as ``bench_attention.py``) so that freed blocks leave the resident set at once. Beside it,
what the design predicts: the gathered K and V, ``2·n·d_model`` float32 numbers (∝ n), and the
rank's own activations (``x``, ``q``, the output and their gradients, ∝ n/W). The rank's
CPU seconds are printed too (the attention is `O(n²/W)`).

``--store DIR`` appends the table to ``DIR/bench_context_parallel.jsonl`` (``_store.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from _store import Table, write

D_MODEL, HEADS = 128, 2

_RANK = textwrap.dedent("""
    import json, resource, sys, time, torch, torch.distributed as dist, mmpe
    from mmpe.parallel import shard
    rank, world, port, n = map(int, sys.argv[1:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    layer = mmpe.MultiHeadAttention({d}, {h}, [mmpe.build("rope", head_dim={d} // {h})])
    sharded = shard(mmpe.Sequence(n, causal=True), layout="balanced")
    x = torch.randn(1, n // world, {d}, requires_grad=True)
    dist.barrier()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    layer(x, sharded).square().sum().backward()
    cpu = time.process_time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({{"rank": rank, "mb": (peak - base) / 2**10, "cpu": cpu}}))
    dist.barrier()
    dist.destroy_process_group()
""").format(d=D_MODEL, h=HEADS)


def run(n: int, world: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(world), str(port), str(n)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"n={n}: a rank failed")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    table = Table("memory", f"Context parallelism: memory per rank, one layer fwd+bwd "
                  f"(d_model {D_MODEL}, {args.world} ranks, balanced, causal, RoPE)",
                  ["n", "n per rank", "peak MB (max over ranks)", "gathered K+V MB",
                   "local activations MB", "CPU s (max over ranks)"],
                  [None, None, "{:.1f}", "{:.1f}", "{:.1f}", "{:.2f}"])
    for n in args.lengths:
        ranks = run(n, args.world)
        kv = 2 * n * D_MODEL * 4 / 2**20
        local = 6 * (n // args.world) * D_MODEL * 4 / 2**20  # x, q, out and their gradients
        table.add(str(n), str(n // args.world), max(r["mb"] for r in ranks), kv, local,
                  max(r["cpu"] for r in ranks))
        print(table.rows[-1], flush=True)
    write(args.store, "bench_context_parallel", [table], threads=1,
          config={"world": args.world, "d_model": D_MODEL, "heads": HEADS})
    if args.store:
        print(f"stored in {Path(args.store) / 'bench_context_parallel.jsonl'}")


if __name__ == "__main__":
    main()
