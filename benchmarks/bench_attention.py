"""Attention with a position bias against attention without, on the CPU: time of a layer's
forward + backward at n = 2048 and peak memory up to n = 16,384 (one process per case, so the
peak resident memory is the case's own). Ratio = time with the bias / time without.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CASE = textwrap.dedent("""
    import resource, sys, time, torch, mmpe
    torch.set_num_threads(1)
    name, n, grad = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
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
    times = []
    for _ in range(2):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    print(min(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
""")


def run(name: str, n: int, grad: bool) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CASE, name, str(n), "1" if grad else "0"],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    names = ["none", "alibi", "t5", "fire", "kerple_log"]
    print("## Biased attention on the CPU (d_model 512, 8 heads, causal, one thread)\n")
    print("| encoding | fwd+bwd n=2048 (s) | time ratio | peak GiB n=2048 | "
          "fwd n=16384 (s) | peak GiB n=16384 |")
    print("|---|---|---|---|---|---|")
    base = None
    for name in names:
        t, mem = run(name, 2048, True)
        base = base or t
        t16, mem16 = run(name, 16384, False)
        print(f"| {name} | {t:.2f} | {t / base:.2f} | {mem:.2f} | {t16:.1f} | {mem16:.2f} |")


if __name__ == "__main__":
    main()
