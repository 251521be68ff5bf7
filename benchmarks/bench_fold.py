"""The fold route against today's CPU route and the unbiased layer: causal ALiBi, fwd+bwd.

One `MultiHeadAttention` layer (d_model 512, 8 heads of 64) with ALiBi on a causal `Sequence`,
three ways, rounds interleaved: `route="fold"` (ALiBi folded into two extra channels of q and
k, plain SDPA: `mmpe.attention.fold`), `route="auto"` (today's CPU route: the sdpa route's
relation plan), and the same layer without ALiBi (the unbiased kernel, the floor). Ratios are
medians of per-round ratios. `--contend` runs a busy process (a float32 matmul loop) on the
other core while measuring (a shared machine).

    python benchmarks/bench_fold.py --store results/bench
    python benchmarks/bench_fold.py --contend --store results/bench
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import torch
from _store import Table, write

import mmpe

SHAPES = {"causal 512 tokens, b 8": (8, 512), "causal 4,096 tokens, b 1": (1, 4096)}
D_MODEL, HEADS = 512, 8


def _busy(stop) -> None:
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def _step(layer, x, coords):
    def run() -> None:
        layer(x, coords).sum().backward()

    return run


def measure(label: str, rounds: int) -> list:
    batch, n = SHAPES[label]
    torch.manual_seed(0)
    x = torch.randn(batch, n, D_MODEL, requires_grad=True)
    coords = mmpe.Sequence(n, causal=True)
    alibi = mmpe.build("alibi", num_heads=HEADS)
    layers = {"fold": mmpe.MultiHeadAttention(D_MODEL, HEADS, [alibi], route="fold"),
              "auto": mmpe.MultiHeadAttention(D_MODEL, HEADS, [alibi]),
              "unbiased": mmpe.MultiHeadAttention(D_MODEL, HEADS, [])}
    runs = {k: _step(v, x, coords) for k, v in layers.items()}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(rounds):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]
        for k in order:
            start = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - start)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    auto_over_fold = statistics.median(a / f for a, f in zip(times["auto"], times["fold"],
                                                             strict=True))
    fold_over_unbiased = statistics.median(f / u for f, u in zip(times["fold"],
                                                                 times["unbiased"], strict=True))
    return [label, ms["fold"], ms["auto"], ms["unbiased"], auto_over_fold, fold_over_unbiased]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contend", action="store_true")
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = Table("fold_contended" if args.contend else "fold",
                  "Causal ALiBi, one layer fwd+bwd (CPU): the fold route, today's route "
                  "(auto: the relation plan) and the unbiased layer"
                  + (", a busy process on the other core" if args.contend else ""),
                  ["shape", "fold ms", "auto ms", "unbiased ms", "auto / fold",
                   "fold / unbiased"],
                  [None, "{:.0f}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.2f}"])
    stop, busy = None, None
    if args.contend:
        stop = multiprocessing.Event()
        busy = multiprocessing.Process(target=_busy, args=(stop,), daemon=True)
        busy.start()
    try:
        for label in SHAPES:
            row = measure(label, args.rounds)
            table.add(*row)
            print(" | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row),
                  flush=True)
    finally:
        if busy is not None:
            stop.set()
            busy.join(5)
    if args.store:
        write(args.store, "bench_fold", [table], config={"rounds": args.rounds},
              threads=args.threads)


if __name__ == "__main__":
    main()
