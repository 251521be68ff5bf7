"""Per-forward preparation: a 12-layer model with shared encodings, with the sharing of
position-derived tensors (RoPE tables, eager biases, masks) on and off, in the same run.

"off" recomputes every table and bias in every layer, as mmpe did before attention v2 (minus
the per-layer device reads that are gone either way). Ratio = off / on (above 1: sharing
helps). CPU, one thread, forward without gradients, median of repeated calls.

    python benchmarks/bench_prepare.py [--store results/bench]

``--store DIR`` also appends the table (``sharing``) to ``DIR/bench_prepare.jsonl``
(``benchmarks/_store.py``).
"""

from __future__ import annotations

import argparse

import torch
from _store import Table, write
from _timing import timeit

import mmpe
from mmpe.prepare import sharing

CASES = [["rope"], ["alibi"], ["t5"], ["fire"], ["kerple_log"], ["rope", "alibi"]]


def main(n: int = 1024, depth: int = 12, d_model: int = 256, heads: int = 8,
         store: str | None = None) -> None:
    torch.set_num_threads(1)
    table = Table("sharing", f"Per-forward preparation: {depth}-layer forward, d_model {d_model}, "
                  f"{heads} heads, n = {n}, causal, CPU, one thread (ratio = shared off / on)",
                  ["encodings", "shared (ms)", "per layer (ms)", "ratio"],
                  [None, "{:.1f}", "{:.1f}", "{:.2f}"])
    print(f"## Per-forward preparation: {depth}-layer forward, d_model {d_model}, {heads} heads, "
          f"n = {n}, causal, CPU (ms; ratio = shared off / on)\n")
    print("| encodings | shared (ms) | per layer (ms) | ratio |")
    print("|---|---|---|---|")
    x = torch.randn(1, n, d_model)
    for names in CASES:
        model = mmpe.Transformer(d_model, heads, depth, names).eval()

        def run(model: mmpe.Transformer = model) -> None:
            with torch.no_grad():
                model(x, mmpe.Sequence(n, causal=True))

        on = timeit(run, 3)
        with sharing(False):
            off = timeit(run, 3)
        table.add("+".join(names), on * 1e3, off * 1e3, off / on)
        print(f"| {'+'.join(names)} | {on * 1e3:.1f} | {off * 1e3:.1f} | {off / on:.2f} |")
    write(store, __file__, [table], threads=1,
          config={"n": n, "depth": depth, "d_model": d_model, "heads": heads, "repeat": 3})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", metavar="DIR",
                        help="also append the table to DIR/bench_prepare.jsonl")
    main(store=parser.parse_args().store)
