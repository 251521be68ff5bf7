"""mmpe's attention layer against the peers' way of computing the same encoding, in one process:
forward + backward time and peak memory, bf16 on a GPU (issue 49).

Rows (shape × encoding × peer), each layer with its own `qkv` and output projections:

| shape | mmpe | peer |
|---|---|---|
| ViT-B/16 14² + cls, batch 32; grids 32², 64² (+ cls) | `swin` (BEiT's table) | timm `beit.Attention` (relative-position table gathered into `[H, N, N]`, SDPA) |
| sequences 4k, 16k | `t5` | HF `T5Attention` (position bias computed per call, added to the scores) |
| sequences 4k, 16k | `t5`, `alibi` | x-transformers `RelativePositionBias`, `AlibiPositionalBias` (dense bias into SDPA) |
| sequences 4k, 16k | `rope` | HF Llama's `apply_rotary_pos_emb` (cos/sin per call) |
| video 16 × 32² | `alibi` | the dense distance bias into SDPA |
| points 4k | `alibi` | the dense distance bias into SDPA |
| 64 molecules | `graphormer_spatial` | Graphormer's spatial table gathered into `[B, H, n, n]`, SDPA |

Two floors per shape, in the same process: the layer without encoding (SDPA: cuDNN/flash on a
GPU; the causal kernel on sequences) and FlexAttention without a `score_mod` (on the CPU only
forward, so not timed there). Every row stores the route mmpe's layer took
(`mmpe.attention.log_routes`). `--tiny` runs every row at small sizes on the CPU (a test does);
`benchmarks/gpu/run.sh` runs the full sizes on one GPU and stores the table in
`results/bench/bench_peers.jsonl` (device, torch version, commit), which `make report`
renders into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (the store)
import _store  # noqa: E402

import mmpe  # noqa: E402
from mmpe.attention import log_routes  # noqa: E402

D_MODEL, HEADS = 768, 12


@dataclass
class Shape:
    """One column of the issue: coordinates, batch, and how the peers see them."""

    name: str
    coords: Any
    batch: int
    grid: tuple[int, ...] | None = None  # grid side(s) for the table peers (cls prepended)


def shapes(tiny: bool, device: str) -> list[Shape]:
    """The issue's shapes (`tiny`: each cut down to run in a second on the CPU)."""
    s = (lambda full, small: small if tiny else full)  # noqa: E731
    out = [Shape("ViT-B/16 14²+cls", mmpe.Grid((s(14, 3), s(14, 3)), prefix_tokens=1), s(32, 2),
                 (s(14, 3), s(14, 3))),
           Shape("grid 32²+cls", mmpe.Grid((s(32, 4), s(32, 4)), prefix_tokens=1), 1,
                 (s(32, 4), s(32, 4))),
           Shape("grid 64²+cls", mmpe.Grid((s(64, 5), s(64, 5)), prefix_tokens=1), 1,
                 (s(64, 5), s(64, 5))),
           Shape("seq 4k", mmpe.Sequence(s(4096, 24)), 1),
           Shape("seq 16k", mmpe.Sequence(s(16384, 40)), 1),
           Shape("video 16×32²", mmpe.Grid((s(16, 2), s(32, 3), s(32, 3))), 1),
           Shape("points 4k", mmpe.Points(torch.randn(1, s(4096, 30), 3,
                                                      generator=torch.Generator().manual_seed(0))), 1),
           Shape("64 molecules", _molecules(s(64, 3), s(30, 6)), s(64, 3))]
    for sh in out:
        if hasattr(sh.coords, "to"):  # a Sequence holds no tensors
            sh.coords = sh.coords.to(device)
    return out


def _molecules(count: int, atoms: int) -> mmpe.Graph:
    """`count` random trees of about `atoms` atoms with a ring closure each (a molecule's
    sparsity), as one batch."""
    gen = torch.Generator().manual_seed(0)
    edges, batch, start = [], [], 0
    for g in range(count):
        n = atoms + int(torch.randint(-atoms // 3, atoms // 3 + 1, (), generator=gen))
        parent = [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
        pairs = [(start + p, start + i + 1) for i, p in enumerate(parent)] + [(start, start + n - 1)]
        edges += pairs + [(b, a) for a, b in pairs]
        batch += [g] * n
        start += n
    return mmpe.Graph(torch.tensor(edges).T, start, torch.tensor(batch))


class QKVLayer(nn.Module):
    """The peers' layer around a dense bias: `qkv`, SDPA with `bias()` as `attn_mask`, `proj`."""

    def __init__(self, bias: Callable[[], Tensor | None], causal: bool = False) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.bias, self.causal = bias, causal

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = rearrange(self.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
        bias = self.bias()
        # contiguous in q's dtype: a strided bias (x-transformers' relative positions come out
        # with stride(-1) = heads) sends CUDA SDPA to its math kernel, which would flatter mmpe
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if bias is None else bias.to(q.dtype).contiguous(),
            is_causal=self.causal and bias is None)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))


def _flex_layer() -> nn.Module:
    """The layer with FlexAttention and no `score_mod` (the floor of every flex route)."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    class Flex(QKVLayer):
        def forward(self, x: Tensor) -> Tensor:
            q, k, v = rearrange(self.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
            return self.proj(rearrange(compiled(q, k, v), "b h s d -> b s (h d)"))

    return Flex(lambda: None)


def peers(shape: Shape) -> list[tuple[str, Callable[[], nn.Module], str]]:
    """(mmpe encoding, peer layer factory, peer name) for a shape."""
    coords, out = shape.coords, []
    if shape.grid is not None:
        from timm.models.beit import Attention

        out.append(("swin", lambda: Attention(D_MODEL, HEADS, qkv_bias=True,
                                              window_size=shape.grid), "timm beit.Attention"))
    elif isinstance(coords, mmpe.Sequence):
        from transformers import T5Config
        from transformers.models.t5.modeling_t5 import T5Attention
        from x_transformers.x_transformers import AlibiPositionalBias, RelativePositionBias

        n = coords.num_queries
        cfg = T5Config(d_model=D_MODEL, d_kv=D_MODEL // HEADS, num_heads=HEADS,
                       relative_attention_num_buckets=32, relative_attention_max_distance=128)
        cfg._attn_implementation = "sdpa"
        out.append(("t5", lambda: _HFT5(T5Attention(cfg, has_relative_attention_bias=True)),
                    "HF T5Attention"))
        rel = RelativePositionBias(scale=1.0, causal=False, num_buckets=32, max_distance=128,
                                   heads=HEADS)
        out.append(("t5", lambda: _with(QKVLayer(lambda: rel(n, n)), rel),
                    "x-transformers RelativePositionBias"))
        alibi = AlibiPositionalBias(heads=HEADS, total_heads=HEADS)
        # registered with the layer, so its slopes move to the device with it
        out.append(("alibi", lambda: _with(QKVLayer(lambda: alibi(n, n)), alibi),
                    "x-transformers ALiBi"))
        out.append(("rope", lambda: HFRotaryLayer(n), "HF Llama rotary"))
    elif isinstance(coords, mmpe.Graph):
        table = nn.Embedding(32, HEADS)
        spd = coords.spd.clamp(min=0, max=31)  # [B, n, n]; padding and unreachable to 0 / 31
        out.append(("graphormer_spatial",
                    lambda: _with(QKVLayer(lambda: table(spd).permute(0, 3, 1, 2)), table),
                    "Graphormer dense bias"))
    else:  # video grid, points: ALiBi's distance as a dense bias
        slopes = torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)],
                              device=_device(coords))
        def distance_bias() -> Tensor:
            b, _, q, k = mmpe.coords.base.index_grid(coords.batch_size or 1, 1, coords.num_queries,
                                                     coords.num_keys, _device(coords))
            return -slopes[:, None, None] * coords.distance(q, k, b).float()
        out.append(("alibi", lambda: QKVLayer(distance_bias), "dense distance bias"))
    return out


class HFRotaryLayer(QKVLayer):
    """The layer with HF Llama's rotary embedding (cos/sin built per call in the input's
    dtype from float32 frequencies, `apply_rotary_pos_emb` on q and k), no bias."""

    def __init__(self, n: int) -> None:
        super().__init__(lambda: None)
        d = D_MODEL // HEADS
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
        self.n = n

    def forward(self, x: Tensor) -> Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        q, k, v = rearrange(self.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
        pos = torch.arange(self.n, device=x.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        q, k = apply_rotary_pos_emb(q, k, emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))


def _device(coords: Any) -> torch.device:
    return getattr(coords, "device", None) or torch.device("cpu")


def _with(layer: nn.Module, extra: nn.Module) -> nn.Module:
    layer.extra = extra  # its parameters move and train with the layer
    return layer


class _HFT5(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: Tensor) -> Tensor:
        return self.attn(x)[0]


def _mmpe_layer(name: str, shape: Shape) -> nn.Module:
    context = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL}
    options = {"grid_shape": shape.grid} if name == "swin" else {}
    enc = mmpe.build(name, context=context, **options)
    return mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])


def measure(layer: nn.Module, x: Tensor, call: Callable[[nn.Module, Tensor], Tensor],
            repeat: int, forward_only: bool = False) -> tuple[float, float | None]:
    """Median fwd+bwd ms over `repeat` steps after two warm-ups, and peak MiB on CUDA."""
    cuda = x.device.type == "cuda"

    def step() -> None:
        xs = x.detach().requires_grad_(not forward_only)
        with torch.set_grad_enabled(not forward_only):
            out = call(layer, xs)
            if not forward_only:
                out.float().square().mean().backward()
        if cuda:
            torch.cuda.synchronize()

    step(), step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    return statistics.median(times) * 1e3, peak


def run(tiny: bool, repeat: int, device: str, dtype: torch.dtype, only: str | None = None,
        table: _store.Table | None = None) -> _store.Table:
    """Measure every row into `table` (filled in place, so a caller keeps the rows of a run
    stopped part-way)."""
    fresh = _store.Table(
        "peers", "Attention layer forward + backward against the peers' way, same process "
        "(ms; peak MiB above the inputs on a GPU)",
        ["shape", "encoding", "peer", "route", "mmpe ms", "peer ms", "peer / mmpe", "mmpe MiB",
         "peer MiB", "SDPA ms", "flex ms"],
        [None, None, None, None, "{:.2f}", "{:.2f}", "{:.2f}", "{:.0f}", "{:.0f}", "{:.2f}",
         "{:.2f}"])
    if table is None:
        table = fresh
    else:
        table.__dict__.update({k: v for k, v in vars(fresh).items() if k != "rows"})
    flex_ok = device == "cuda" and mmpe.flex_compile.available()
    for shape in shapes(tiny, device):
        if only and only not in shape.name:
            continue
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape.batch, shape.coords.num_queries, D_MODEL, generator=gen)
        x = x.to(device=device, dtype=dtype)
        torch.manual_seed(0)
        causal = isinstance(shape.coords, mmpe.Sequence) and shape.coords.causal
        sdpa = QKVLayer(lambda: None, causal).to(device, dtype)
        sdpa_ms, _ = measure(sdpa, x, lambda m, t: m(t), repeat)
        flex_ms = (measure(_flex_layer().to(device, dtype), x, lambda m, t: m(t), repeat)[0]
                   if flex_ok and shape.coords.mask_mod() is None else None)
        for name, make_peer, peer_name in peers(shape):
            try:
                row = _row(shape, name, make_peer, x, repeat, device, dtype)
            except (RuntimeError, ValueError, TypeError, torch.OutOfMemoryError) as err:
                # stored with its error: one failing case keeps the others' rows
                print(f"{shape.name} {name} {peer_name}: {type(err).__name__}: {err}"[:300],
                      flush=True)
                table.add(shape.name, name, peer_name, f"error: {type(err).__name__}", None,
                          None, None, None, None, sdpa_ms, flex_ms)
                continue
            route, ours_ms, peer_ms, ours_mb, peer_mb = row
            table.add(shape.name, name, peer_name, route, ours_ms, peer_ms, peer_ms / ours_ms,
                      ours_mb, peer_mb, sdpa_ms, flex_ms)
            print(f"{shape.name:18} {name:18} {peer_name:36} {route:6} mmpe {ours_ms:8.2f} ms  "
                  f"peer {peer_ms:8.2f} ms  ×{peer_ms / ours_ms:5.2f}  sdpa {sdpa_ms:.2f}"
                  + (f"  flex {flex_ms:.2f}" if flex_ms is not None else ""), flush=True)
    return table


def _row(shape: Shape, name: str, make_peer: Callable[[], nn.Module], x: Tensor, repeat: int,
         device: str, dtype: torch.dtype) -> tuple:
    """(route, mmpe ms, peer ms, mmpe MiB, peer MiB) of one case."""
    torch.manual_seed(0)
    ours = _mmpe_layer(name, shape).to(device, dtype)
    peer = make_peer().to(device, dtype)
    with log_routes() as routes:
        ours_ms, ours_mb = measure(ours, x, lambda m, t, c=shape.coords: m(t, c), repeat)
    peer_ms, peer_mb = measure(peer, x, lambda m, t: m(t), repeat)
    return "/".join(r for rs in routes.values() for r in rs), ours_ms, peer_ms, ours_mb, peer_mb


def main(argv: list[str] | None = None) -> _store.Table:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small sizes (the CPU; a test)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--only", help="only the shapes whose name contains this")
    parser.add_argument("--store", metavar="DIR", help="append the table to DIR/bench_peers.jsonl")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    table = _store.Table("peers", "", [], [])
    signal.signal(signal.SIGTERM, _stop)  # `timeout` stops a run: store the rows it measured
    try:
        table = run(args.tiny, args.repeat, args.device, dtype, args.only, table)
    except KeyboardInterrupt:
        print(f"stopped after {len(table.rows)} rows; storing them", flush=True)
    _store.write(args.store, "bench_peers", [table], cuda=args.device == "cuda",
                 config={"tiny": args.tiny, "repeat": args.repeat, "dtype": str(dtype),
                         "d_model": D_MODEL, "heads": HEADS})
    return table


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
