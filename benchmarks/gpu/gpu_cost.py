"""What an encoding costs on a CUDA device, as a ratio to the same attention layer without one.

`python benchmarks/gpu/gpu_cost.py --store results` measures, for each encoding, forward + backward time
and peak memory of [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention] (bf16, d_model 768, batch 1) on causal
sequences of 4k, 16k and 32k tokens, 64 × 64 and 128 × 128 grids, a 16 × 32 × 32 video grid
and 4,096 points, each divided by the same layer with no encoding (SDPA/FlashAttention; the
causal mask for sequences) measured in the same round. A "seed" is one measurement round
(weights drawn from it; rounds are separate, so the table's ± is the rounds' spread). The
device is stored with every record, one JSON line per (encoding, round) in the results store
(`results/gpu_cost.jsonl`, written by `mmpe.results.store`; rounds already stored are skipped),
so `mmpe report` renders the table as a recipe's. It is not a training recipe: nothing here
uses Lightning (until 0.2 it was `mmpe compare gpu_cost`, which still runs it, with a warning).
Without CUDA it says so and exits 0.

Targets (issue: the GPU path): score encodings ≤ 1.3× on sequences, ≤ 1.5× on grids, video and
points; RoPE ≤ 1.15×; peak memory ≤ 1.1×.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from mmpe.recipes.compare import CompareSpec

import mmpe
from mmpe.attention import log_routes
from mmpe.context import coords_context
from mmpe.results import store
from mmpe.results.report import render_table

SEQUENCE = ["seq 4k", "seq 16k", "seq 32k"]
GRIDS = ["grid 64²", "grid 128²", "video 16×32²", "points 4k"]
TIME = SEQUENCE + GRIDS
MEMORY = [f"mem {c}" for c in TIME]


def _coords(column: str, device: str) -> tuple[Any, int]:
    """The coordinates of a column and its number of heads (video and points: 8 heads of 96
    channels, so that 3-axis rotary has 2·3 | head_dim)."""
    if column.startswith("seq"):
        n = {"seq 4k": 4096, "seq 16k": 16384, "seq 32k": 32768}[column]
        return mmpe.Sequence(n, causal=True, device=device), 12
    if column == "grid 64²":
        return mmpe.Grid((64, 64)).to(device), 12
    if column == "grid 128²":
        return mmpe.Grid((128, 128)).to(device), 12
    if column == "video 16×32²":
        return mmpe.Grid((16, 32, 32)).to(device), 8
    pos = torch.randn(1, 4096, 3, generator=torch.Generator().manual_seed(0)) * 10
    return mmpe.Points(pos).to(device), 8


D_MODEL = 768


def _context(coords: Any, heads: int) -> dict[str, Any]:
    ctx = {"d_model": D_MODEL, "num_heads": heads, "head_dim": D_MODEL // heads,
           "max_len": coords.num_queries, "original_max_position_embeddings": 4096}
    return {**ctx, **coords_context(coords)}


def _step(layer: torch.nn.Module, x: torch.Tensor, coords: Any) -> Callable[[], None]:
    def run() -> None:
        layer(x, coords).float().square().mean().backward()
        x.grad = None
        for p in layer.parameters():
            p.grad = None
    return run


def _time(fn: Callable[[], None], repeat: int) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _peak(fn: Callable[[], None]) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure(encoding: str, column: str, seed: int, repeat: int = 5) -> tuple[float, float] | None:
    """`(time ratio, peak-memory ratio)` of `encoding` on a column's coordinates, or None
    where the encoding does not support them."""
    coords, heads = _coords(column, "cuda")
    entry = mmpe.get(encoding)
    if not entry.supports(coords):
        return None
    torch.manual_seed(seed)
    try:
        enc = mmpe.build(encoding, context=_context(coords, heads))
    except ValueError:  # e.g. a head_dim the encoding cannot split over the axes
        return None
    layer = mmpe.MultiHeadAttention(D_MODEL, heads, [enc]).cuda().to(torch.bfloat16)
    base = mmpe.MultiHeadAttention(D_MODEL, heads, []).cuda().to(torch.bfloat16)
    base.load_state_dict({k: v for k, v in layer.state_dict().items() if k in base.state_dict()})
    x = torch.randn(1, coords.num_queries, D_MODEL, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    run, run_base = _step(layer, x, coords), _step(base, x, coords)
    ratios = []
    for _ in range(3):  # interleaved: the card's clock drifts between runs
        ratios.append(_time(run, repeat) / _time(run_base, repeat))
    memory = _peak(run) / max(1, _peak(run_base))
    return statistics.median(ratios), memory


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Every column's time and memory ratio for `encoding` (round `seed`).

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_cost measures on a CUDA device; none is available here")
    out: dict[str, float | None] = {}
    for column in TIME:
        got = measure(encoding, column, seed)
        out[column] = None if got is None else round(got[0], 4)
        out[f"mem {column}"] = None if got is None else round(got[1], 4)
    return out


COMPARE = CompareSpec(
    metric="× the unbiased layer",
    columns=TIME + MEMORY,
    xlabel="coordinates",
    lower_is_better=True,
    default_encodings=["alibi", "t5", "kerple_log", "fire", "swin", "swinv2_cpb",
                       "gaussian_distance", "radial_gaussian", "rope", "rope_axial"],
    coords="sequence",
    title="Attention cost on a GPU (fwd+bwd, bf16, × no encoding)",
    fmt="{:.2f}",
    seeds=3,
    command="python benchmarks/gpu/gpu_cost.py --store results",
)

#: The recipe name its rounds are stored under (`<store>/gpu_cost.jsonl`).
RECIPE = "gpu_cost"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encodings", default=",".join(COMPARE.default_encodings),
                        help="comma-separated registry names")
    parser.add_argument("--seeds", type=int, default=COMPARE.seeds,
                        help="measurement rounds per encoding (default 3)")
    parser.add_argument("--store", default="runs/results",
                        help="results store: one JSON line per round in STORE/gpu_cost.jsonl")
    parser.add_argument("--rerun", action="store_true", help="measure stored rounds again")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_cost: no CUDA device here; nothing measured")
        return 0
    names = [n.strip() for n in args.encodings.split(",") if n.strip()]
    setting = store.setting_name([])
    stored = set() if args.rerun else store.done(args.store, RECIPE, setting)
    for seed in range(args.seeds):
        for name in names:
            if (name, seed) in stored:
                continue
            env = store.environment()
            start = time.perf_counter()
            with log_routes() as routes:  # stored: which route each column's layers took
                metrics = run_one(name, seed=seed, out_dir=Path("."), cli_args=[])
            with tempfile.TemporaryDirectory() as empty:  # no LightningCLI config to store
                store.append(args.store, store.make_record(
                    RECIPE, setting, name, seed, metrics, wall_s=time.perf_counter() - start,
                    cli_args=[], out_dir=empty, env=env, routes=routes))
            print(f"gpu_cost: {name} round {seed}: {metrics}", flush=True)
    records = [r for r in store.read(args.store, RECIPE)
               if r["setting"] == setting and r["encoding"] in names]
    print(render_table(COMPARE, records, settings=[setting], rows=names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
