"""The cost table of the route decision (`mmpe.attention.route.CostTable`): forward + backward
milliseconds of one attention layer on each route that can run it, per term structure × size
bucket × dtype × grad mode, on this device and torch version (issue 49).

`python benchmarks/gpu/route_costs.py --store results/gpu/routes.jsonl` appends one JSON line
per (encoding, shape, grad mode), keyed as the decision reads it; where a row exists for the
device and torch version of a call, ``route="auto"`` takes its fastest route (the dense one
only within the budget) instead of the rule. `--tiny` runs on the CPU at small sizes (a test),
`--dry-run` prints the rows without storing them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import D_MODEL, HEADS, measure  # noqa: E402

import mmpe  # noqa: E402
from mmpe.attention.route import route_inputs, structure_key  # noqa: E402
from mmpe.results.store import append_lines  # noqa: E402

#: one encoding per structure (and learned or not): relation, offset, distance (fixed and
#: learned), pair (learned MLP)
ENCODINGS = ("t5", "swin", "alibi", "kerple_log", "fire")


def _shapes(tiny: bool) -> dict[str, tuple[object, int]]:
    """(coordinates, batch) per shape: the rule's own cases (ViT with its cls token at batch
    32, bidirectional T5 at batch 8, causal sequences, large grids)."""
    if tiny:
        return {"seq": (mmpe.Sequence(32, causal=True), 1),
                "grid": (mmpe.Grid((4, 4), prefix_tokens=1), 2)}
    return {"ViT-B/16 14²+cls b32": (mmpe.Grid((14, 14), prefix_tokens=1), 32),
            "seq 1k bidirectional b8": (mmpe.Sequence(1024), 8),
            "seq 4k": (mmpe.Sequence(4096, causal=True), 1),
            "grid 32²+cls": (mmpe.Grid((32, 32), prefix_tokens=1), 1),
            "grid 64²+cls": (mmpe.Grid((64, 64), prefix_tokens=1), 1)}


def rows(tiny: bool, device: str, dtype: torch.dtype, repeat: int,
         store: str | None = None) -> list[dict]:
    """One cost-table row per (encoding, shape, grad mode), each appended to `store` as it is
    measured (a run stopped part-way keeps its rows)."""
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    routes = ("dense", "flex") if device == "cuda" else ("dense", "sdpa")
    out = []
    for label, (coords, batch) in _shapes(tiny).items():
        coords = coords.to(device) if hasattr(coords, "to") else coords
        x = torch.randn(batch, coords.num_queries, D_MODEL, device=device, dtype=dtype)
        for enc_name in ENCODINGS:
            context = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL}
            shape = getattr(coords, "shape", None)
            if enc_name == "swin" and shape is None:
                continue
            options = {"grid_shape": tuple(shape)} if enc_name == "swin" else {}
            layer = mmpe.MultiHeadAttention(
                D_MODEL, HEADS, [mmpe.build(enc_name, context=context, **options)]).to(device, dtype)
            for grad in (True, False):
                ms = {}
                for route in routes:
                    layer.route = route
                    try:
                        ms[route] = measure(layer, x, lambda m, t, c=coords: m(t, c), repeat,
                                            forward_only=not grad)[0]
                    except (RuntimeError, torch.OutOfMemoryError) as err:  # recorded, not hidden
                        print(f"{label} {enc_name} {route}: {type(err).__name__}: {err}"[:200])
                call = route_inputs(layer.scores, coords, HEADS, batch, torch.device(device),
                                    dtype, grad, name=name)
                row = {"device": name, "torch": torch.__version__,
                       "structure": structure_key(layer.scores), "bucket": call.bucket,
                       "dtype": str(dtype).removeprefix("torch."), "grad": grad,
                       "batch": call.batch, "causal": call.causal, "ms": ms,
                       "encoding": enc_name, "shape": label}
                print(row, flush=True)
                out.append(row)
                if store:
                    append_lines(store, [row])
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--store", metavar="FILE", help="append the rows to FILE (JSON lines)")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return rows(args.tiny, args.device, dtype, args.repeat, args.store)


if __name__ == "__main__":
    main()
