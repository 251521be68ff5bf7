"""Attention with a position bias against attention without, on the CPU: time of a layer's
forward + backward at n = 2048 and of its forward at n = 16,384, and peak memory (one process
per case, so the peak resident memory is the case's own). Ratio = time with the bias / time
without (the same layer with no encoding, which runs SDPA's fused causal kernel).

Times are the minimum over ``--repeat`` calls after a warm-up, as wall time and as the process's
CPU time: on a shared machine the CPU time is what other processes do not inflate, so the ratios
use it (``--rounds`` > 1 repeats the n = 2048 cases, interleaved, and prints the range).

    python benchmarks/bench_attention.py            # the table of the README
    python benchmarks/bench_attention.py --quick    # n = 2048 fwd+bwd only, no n = 16,384
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

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
    args = parser.parse_args()
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

    def ratios(case: dict, name: str, col: int) -> str:
        values = [r[col] / b[col] for r, b in zip(case[name], case["none"], strict=True)]
        lo, hi = min(values), max(values)
        return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}–{hi:.2f}"

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
        if long:
            _, cpu16, mem16 = long[name]
            row += f" {cpu16:.1f} | {cpu16 / long['none'][1]:.2f} | {mem16:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
