"""Whole attention layers at the shapes models train, forward + backward, against the peer's own
module and against mmpe's own math route, on the CPU.

Each row times one layer a user would train (`MultiHeadAttention` with one encoding), its
default route (`route="auto"`, the route the dispatcher chooses) and its math route
(`route="math"`: explicit scores, the plain reference), its dense plan (the whole bias into
one SDPA call, `force_plan("dense")`), the same layer with no encoding
(`none`), and where a peer module exists, the peer: timm's BEiT `Attention` (the Swin/BEiT
relative-position table gathered into a dense bias for SDPA), HF's `T5Attention` (its
position bias added to the scores), x-transformers' `Attention` with `AlibiPositionalBias`.
Rounds are interleaved (each round times every variant once, in turn) and each ratio is the
median of the per-round ratios, so that load drift on a shared machine cancels.

    python benchmarks/bench_layers.py                 # every row
    python benchmarks/bench_layers.py --only vit224   # one shape
    python benchmarks/bench_layers.py --store results/bench

Columns: milliseconds per step of the default route; ratios to the unbiased layer (default and
math route), and peer time / default time (above 1: mmpe faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from _store import Table, write

import mmpe
from mmpe.attention.dispatch import force_plan

#: shape name -> (coordinates, batch, d_model, heads, encodings, peer)
SHAPES: dict[str, dict] = {
    "vit224": dict(label="ViT-B/16 224 px: 14×14 + cls, b 8", batch=8, d=768, heads=12,
                   coords=lambda: mmpe.Grid((14, 14), prefix_tokens=1),
                   encodings=["swin", "alibi", "t5", "fire", "swinv2_cpb", "rope_axial"]),
    "vit384": dict(label="ViT-B/16 384 px: 24×24 + cls, b 8", batch=8, d=768, heads=12,
                   coords=lambda: mmpe.Grid((24, 24), prefix_tokens=1),
                   encodings=["swin", "t5"]),
    "causal128": dict(label="causal 128 tokens, b 32", batch=32, d=512, heads=8,
                      coords=lambda: mmpe.Sequence(128, causal=True),
                      encodings=["alibi", "t5", "fire", "kerple_log", "rope"]),
    "causal512": dict(label="causal 512 tokens, b 8", batch=8, d=512, heads=8,
                      coords=lambda: mmpe.Sequence(512, causal=True),
                      encodings=["alibi", "t5", "fire", "kerple_log", "rope"]),
    "t5_1k": dict(label="bidirectional 1,024 tokens, b 4", batch=4, d=512, heads=8,
                  coords=lambda: mmpe.Sequence(1024), encodings=["t5"]),
}


def _mmpe_layer(name: str, spec: dict, coords, route: str,
                plan: str | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    heads, d = spec["heads"], spec["d"]
    context = {"num_heads": heads, "head_dim": d // heads, "d_model": d}
    if isinstance(coords, mmpe.Grid):
        context["grid_shape"] = coords.shape
    encs = [] if name == "none" else [mmpe.build(name, context=context)]
    torch.manual_seed(0)
    attn = mmpe.MultiHeadAttention(d, heads, encs, route=route)

    def layer(x: torch.Tensor) -> torch.Tensor:
        with force_plan(plan):
            return attn(x, coords)

    return layer


def _peer_layer(name: str, spec: dict, coords) -> tuple[str, Callable] | None:
    heads, d = spec["heads"], spec["d"]
    if name == "swin" and isinstance(coords, mmpe.Grid):
        from timm.models.beit import Attention

        attn = Attention(d, heads, qkv_bias=True, window_size=coords.shape)
        return "timm BEiT Attention", attn
    if name == "t5":
        from transformers import T5Config
        from transformers.models.t5.modeling_t5 import T5Attention

        config = T5Config(d_model=d, d_kv=d // heads, num_heads=heads, dropout_rate=0.0)
        attn = T5Attention(config, has_relative_attention_bias=True)
        causal = getattr(coords, "causal", False)
        n = coords.num_queries
        mask = None
        if causal:
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        return "HF T5Attention", lambda x: attn(x, mask=mask)[0]
    if name == "alibi" and not isinstance(coords, mmpe.Grid):
        from x_transformers.x_transformers import AlibiPositionalBias, Attention

        attn = Attention(dim=d, heads=heads, dim_head=d // heads, causal=True)
        rel = AlibiPositionalBias(heads=heads, total_heads=heads)
        return "x-transformers ALiBi", lambda x: attn(x, rel_pos=rel)
    return None


def _step(layer: Callable, x: torch.Tensor) -> float:
    start = time.perf_counter()
    layer(x).square().mean().backward()
    return time.perf_counter() - start


def run(shape: str, rounds: int) -> list[list]:
    spec = SHAPES[shape]
    coords = spec["coords"]()
    x = torch.randn(spec["batch"], coords.num_queries, spec["d"], requires_grad=True)
    rows = []
    plain = _mmpe_layer("none", spec, coords, "auto")
    for name in spec["encodings"]:
        variants = {"default": _mmpe_layer(name, spec, coords, "auto"),
                    "math": _mmpe_layer(name, spec, coords, "math"),
                    "dense": _mmpe_layer(name, spec, coords, "sdpa", "dense"), "none": plain}
        peer = _peer_layer(name, spec, coords)
        if peer is not None:
            variants["peer"] = peer[1]
        for layer in variants.values():  # warm-up: tables, caches, first allocations
            _step(layer, x)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(rounds):
            for key, layer in variants.items():
                times[key].append(_step(layer, x))

        def ratio(a: str, b: str, times=times) -> float:
            return statistics.median(s / t for s, t in zip(times[a], times[b], strict=True))

        row = [spec["label"], name, peer[0] if peer else None,
               1e3 * statistics.median(times["default"]), ratio("default", "none"),
               ratio("math", "none"), ratio("dense", "none"), ratio("default", "math"),
               ratio("peer", "default") if peer else None]
        print(" | ".join("" if c is None else (f"{c:.2f}" if isinstance(c, float) else str(c))
                         for c in row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SHAPES), action="append")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = Table("layers", "Attention layers at model shapes, fwd+bwd (CPU)",
                  ["shape", "encoding", "peer", "default ms", "default / none", "math / none",
                   "dense / none", "default / math", "peer / default"],
                  [None, None, None, "{:.1f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}"])
    for shape in args.only or list(SHAPES):
        for row in run(shape, args.rounds):
            table.add(*row)
    if args.store:
        write(args.store, "bench_layers", [table], config={"rounds": args.rounds},
              threads=args.threads)


if __name__ == "__main__":
    main()
