"""GPU benchmarks (needs CUDA; prints why and exits 0 without it).

1. Attention with each position bias through compiled FlexAttention (mmpe's ``flex`` path,
   ``BlockMask`` built once per forward by the compiled builder) against SDPA/FlashAttention with
   no bias: forward+backward time ratio at n = 4096 and 16,384.
2. Peak memory at n = 8k … 32k for ALiBi/T5/FIRE: O(n) with flex (no n×n bias), against the
   dense-bias SDPA path at the sizes where it still fits.
3. RoPE application (q and k, ``[4, 32, n, 128]`` bf16) against the memory-bandwidth floor
   (bytes read + written / the device's measured copy bandwidth).
4. Recompilations: 12 sequence lengths through one compiled model with dynamic shapes.

    python benchmarks/gpu/bench_flex.py [--quick] [--store results/bench]

``--store DIR`` also appends the tables (``attention``, ``rope``, ``recompile``) to
``DIR/bench_flex.jsonl`` (``benchmarks/_store.py``), with the device's name as the host.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import mmpe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _store import Table, write  # noqa: E402  (benchmarks/_store.py, one folder up)


def cuda_time(fn, repeat: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat / 1e3


def attention_rows(n_values: list[int]) -> Table:
    table = Table("attention", "Biased attention: compiled FlexAttention vs SDPA without a bias "
                  "(fwd+bwd, bf16, d_model 1024, 16 heads, causal)",
                  ["n", "encoding", "ms", "ratio to no bias", "peak GiB"],
                  [None, None, "{:.2f}", "{:.2f}", "{:.2f}"])
    print("## Biased attention: compiled FlexAttention vs SDPA without a bias (fwd+bwd, bf16)\n")
    print("| n | encoding | ms | ratio to no bias | peak GiB |")
    print("|---|---|---|---|---|")
    for n in n_values:
        x = torch.randn(1, n, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        coords = mmpe.Sequence(n, causal=True, device="cuda")
        base = None
        for name in ["none", "alibi", "t5", "fire", "kerple_log"]:
            encs = [] if name == "none" else [mmpe.build(name, context={"num_heads": 16,
                                                                        "head_dim": 64})]
            attn = mmpe.MultiHeadAttention(1024, 16, encs).cuda().to(torch.bfloat16)
            torch.cuda.reset_peak_memory_stats()
            t = cuda_time(lambda attn=attn, x=x, coords=coords:
                          attn(x, coords).float().square().mean().backward())
            base = base or t
            peak = torch.cuda.max_memory_allocated() / 2**30
            table.add(str(n), name, t * 1e3, t / base, peak)
            print(f"| {n} | {name} | {t * 1e3:.2f} | {t / base:.2f} | {peak:.2f} |")
    return table


def rope_row(n: int) -> Table:
    q = torch.randn(4, 32, n, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn_like(q)
    rope = mmpe.build("rope", head_dim=128).cuda()
    coords = mmpe.Sequence(n, device="cuda")
    t = cuda_time(lambda: rope(q, k, coords))
    copy = cuda_time(lambda: q.clone())
    bandwidth = 2 * q.numel() * q.element_size() / copy
    floor = 4 * q.numel() * q.element_size() / bandwidth  # read q, k; write q, k
    print(f"\n## RoPE apply, q and k [4, 32, {n}, 128] bf16: {t * 1e6:.0f} µs; bandwidth floor "
          f"{floor * 1e6:.0f} µs ({floor / t:.2f} of the floor's speed)\n")
    table = Table("rope", "RoPE apply, q and k [4, 32, n, 128] bf16, against the memory-bandwidth "
                  "floor (bytes read + written / measured copy bandwidth)",
                  ["n", "µs", "floor µs", "floor / time"], [None, "{:.0f}", "{:.0f}", "{:.2f}"])
    table.add(str(n), t * 1e6, floor * 1e6, floor / t)
    return table


def recompile_row() -> Table:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = mmpe.Transformer(256, 8, 4, ["alibi"]).cuda()
    compiled = torch.compile(model, dynamic=True)
    for n in range(512, 512 + 12 * 64, 64):
        compiled(torch.randn(2, n, 256, device="cuda"), mmpe.Sequence(n, causal=True,
                                                                       device="cuda"))
    graphs = counters["stats"]["unique_graphs"]
    print(f"## 12 lengths, one compiled model: {graphs} graphs\n")
    table = Table("recompile", "Recompilations: 12 sequence lengths through one compiled model "
                  "(dynamic shapes)", ["model", "graphs"], [None, "{:.0f}"])
    table.add("Transformer(256, 8, 4, alibi)", graphs)
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--store", metavar="DIR",
                        help="also append the tables to DIR/bench_flex.jsonl")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu: no CUDA device here; nothing measured (run on a GPU machine)")
        return 0
    n_values = [4096] if args.quick else [4096, 16384, 32768]
    tables = [attention_rows(n_values), rope_row(4096), recompile_row()]
    write(args.store, __file__, tables, cuda=True, config={"n": n_values})
    return 0


if __name__ == "__main__":
    sys.exit(main())
