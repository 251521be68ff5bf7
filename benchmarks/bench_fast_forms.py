"""Each hand-written fast form against the generic path of its encoding's structure: the whole
attention layer, forward + backward, on the CPU, at the shapes of docs/benchmarks.md.

docs/extending.md keeps a fast form (`mmpe.attention.fast_forms.FAST_FORMS`) only while a stored
row shows it pays: ≥ 1.3× time or ≥ 1.5× peak memory on a shape users run. Each row here runs
one `MultiHeadAttention` layer (`route="auto"`: the route and plan the dispatcher picks) twice, with
the class's forms in the table and with its entry emptied (the forms a subclass gets: its
structure's generic ones, and the plan the dispatcher picks without the fast forms). The two
layers hold the same weights. Rounds interleave the two sides (ABAB…, the order alternating)
so that load drift on a shared machine cancels; the time ratio is the median of the per-round
ratios generic / fast, with their min–max printed. Peak memory is the peak of the bytes torch
allocates during one step (the profiler's memory events), which load does not change. The
`forms read` column names the forms the fast side called (a row whose fast side read none
measures nothing).

    python benchmarks/bench_fast_forms.py                   # every row
    python benchmarks/bench_fast_forms.py --only fire       # one encoding's rows
    python benchmarks/bench_fast_forms.py --store results/bench
    python benchmarks/bench_fast_forms.py --table each_form  # per form only

The `each_form` table holds each form to the rule on its own: the layer with all of the
class's forms against the layer with all but that one (a form that only pays beside another
shows it here), on every shape whose fast side reads it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from _store import Table, write

import mmpe
from mmpe.attention import fast_forms

SEQ512 = dict(label="causal 512 tokens, b 2", batch=2, d=512, heads=8,
              coords=lambda: mmpe.Sequence(512, causal=True))
VIT224 = dict(label="ViT-B/16 224 px: 14×14 + cls, b 2", batch=2, d=768, heads=12,
              coords=lambda: mmpe.Grid((14, 14), prefix_tokens=1))
POINTS = dict(label="points 1024", batch=1, d=384, heads=6,
              coords=lambda: mmpe.Points(torch.rand(1, 1024, 3,
                                                    generator=torch.Generator().manual_seed(0)) * 10))

# frame-averaged RoPE rotates 2·axes = 6 channels at a time: head_dim 48; its generic path
# evaluates the rotated scores pair by pair (23 s a step at 1,024 points): 256 points
POINTS_48 = dict(label="points 256, 8 heads of 48", batch=1, d=384, heads=8,
                 coords=lambda: mmpe.Points(torch.rand(1, 256, 3,
                                                       generator=torch.Generator().manual_seed(0)) * 10))
VIT384 = dict(label="ViT-B/16 384 px: 24×24 + cls, b 1", batch=1, d=768, heads=12,
              coords=lambda: mmpe.Grid((24, 24), prefix_tokens=1))


def _lattice(n: int = 1024, w: int = 32, edge_types: int = 0) -> mmpe.Graph:
    """The stored graph rows' lattice (bench_attention --coords): rows of `w` nodes."""
    i = torch.arange(n)
    right = torch.stack((i[(i + 1) % w != 0][:-1], i[(i + 1) % w != 0][:-1] + 1))
    down = torch.stack((i[: n - w], i[: n - w] + w))
    edges = torch.cat((right[:, right[1] < n], down), dim=1)
    attr = (torch.arange(edges.shape[1]) % edge_types)[:, None] if edge_types else None
    return mmpe.Graph(edges, num_nodes=n, max_distance=64, edge_attr=attr)


# a cloud whose dense bias (6 heads, float32: 1.6 GB) is past the dense route's 1 GiB budget:
# inference runs block by block, where the head-by-head forms are read; inference only (a
# training step on one thread takes minutes)
POINTS_8K = dict(label="points 8192, inference", batch=1, d=384, heads=6, modes=("infer",),
                 coords=lambda: mmpe.Points(torch.rand(1, 8192, 3,
                                                       generator=torch.Generator().manual_seed(0)) * 10))

GRAPH = dict(label="graph 1024", batch=1, d=384, heads=6, coords=_lattice)
GRAPH_EDGES = dict(label="graph 1024, 4 edge types", batch=1, d=384, heads=6,
                   coords=lambda: _lattice(edge_types=4))

#: (shape, encoding name): every class of the fast-form table on the shapes it serves
CASES: list[tuple[dict, str]] = [
    (SEQ512, "fire"),
    (VIT224, "swin"), (VIT224, "swinv2_cpb"), (VIT224, "fire"),
    (VIT384, "swin"), (VIT384, "swinv2_cpb"),
    (POINTS, "alibi"), (POINTS, "fire"), (POINTS, "kerple_log"),
    (POINTS, "mesh_displacement"), (POINTS_48, "rope_frame_averaged"),
    (GRAPH, "alibi"), (GRAPH, "graphormer_spatial"), (GRAPH, "spe"), (GRAPH, "rrwp"),
    (GRAPH_EDGES, "graphormer_edge"), (GRAPH_EDGES, "graphormer"),
    (POINTS_8K, "alibi"), (POINTS_8K, "fire"), (POINTS_8K, "kerple_log"),
]


@contextmanager
def generic(cls: type) -> Iterator[None]:
    """`cls` without its fast forms while inside (its structure's generic forms)."""
    saved = fast_forms.FAST_FORMS.pop(cls, None)
    try:
        yield
    finally:
        if saved is not None:
            fast_forms.FAST_FORMS[cls] = saved


@contextmanager
def without(cls: type, form: str) -> Iterator[None]:
    """`cls`'s fast forms but `form` while inside (the path then takes what it takes without
    that one form: its structure's generic form, or another of the class's)."""
    saved = fast_forms.FAST_FORMS[cls]
    fast_forms.FAST_FORMS[cls] = {k: f for k, f in saved.items() if k != form}
    try:
        yield
    finally:
        fast_forms.FAST_FORMS[cls] = saved


@contextmanager
def counted(cls: type, calls: Counter) -> Iterator[None]:
    """Count the calls of `cls`'s fast forms while inside."""
    saved = dict(fast_forms.FAST_FORMS.get(cls, {}))

    def wrap(name: str, fn):
        if not callable(fn):  # a declared property (offset_on_grids): counted where it is read
            return _Flag(name, fn, calls)

        def form(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return form

    fast_forms.FAST_FORMS[cls] = {k: wrap(k, f) for k, f in saved.items()}
    try:
        yield
    finally:
        fast_forms.FAST_FORMS[cls] = saved


class _Flag:
    """A declared form's value that counts each time a path reads it (`bool(...)`)."""

    def __init__(self, name: str, value: object, calls: Counter) -> None:
        self.name, self.value, self.calls = name, value, calls

    def __bool__(self) -> bool:
        self.calls[self.name] += 1
        return bool(self.value)


def _layers(spec: dict, name: str):
    coords = spec["coords"]()
    heads, d = spec["heads"], spec["d"]
    context = {"num_heads": heads, "head_dim": d // heads, "d_model": d}
    if isinstance(coords, mmpe.Grid):
        context["grid_shape"] = coords.shape
    torch.manual_seed(0)  # the learned encodings' initial values (FIRE's cuts: its cost)
    fast = mmpe.MultiHeadAttention(d, heads, [mmpe.build(name, context=context)])
    slow = copy.deepcopy(fast)
    x = torch.randn(spec["batch"], coords.num_queries, d, requires_grad=True,
                    generator=torch.Generator().manual_seed(1))
    cls = type(fast.scores[0])
    return cls, coords, x, fast, slow


#: "train": forward + backward; "infer": a forward without gradients (where the forms that
#: write rows in place without a graph are read)
MODE = {"mode": "train"}


def _step(layer, coords, x) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        if MODE["mode"] == "infer":
            with torch.no_grad():
                layer(x, coords)
        else:
            layer(x, coords).square().mean().backward()
        return time.perf_counter() - start

    return run


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of the bytes torch holds during `fn()` above what it held before (the profiler's
    CPU allocator events; an op's temporaries freed inside it are not seen)."""
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    # an op's own allocations net of its own frees (`self_cpu_memory_usage`) at its start;
    # `[memory]` events are the frees (and allocations) outside any op
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    held = peak = 0
    for e in events:
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def _compare(fast_run: Callable[[], float], slow_run: Callable[[], float], slow_side,
             rounds: int) -> tuple[list[float], list[float], int, int]:
    """Interleaved rounds of both sides (ABAB…, the order alternating) and each side's peak
    memory; `slow_side()` is the context the slow side runs in."""
    with slow_side():
        slow_run()  # warm-up
    t_fast, t_slow = [], []
    for i in range(rounds):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            if side == 0:
                t_fast.append(fast_run())
            else:
                with slow_side():
                    t_slow.append(slow_run())
    m_fast = peak_bytes(fast_run)
    with slow_side():
        m_slow = peak_bytes(slow_run)
    return t_fast, t_slow, m_fast, m_slow


def _cells(t_fast, t_slow, m_fast, m_slow) -> list:
    ratios = [s / f for s, f in zip(t_slow, t_fast, strict=True)]
    return [1e3 * statistics.median(t_fast), 1e3 * statistics.median(t_slow),
            statistics.median(ratios), [min(ratios), max(ratios)], m_fast / 2**20,
            m_slow / 2**20, m_slow / max(m_fast, 1)]


def run(spec: dict, name: str, rounds: int) -> list:
    """The class's fast forms against none of them (its structure's generic forms)."""
    cls, coords, x, fast, slow = _layers(spec, name)
    calls: Counter = Counter()
    with counted(cls, calls):
        fast_run = _step(fast, coords, x)
        fast_run()  # warm-up: tables, caches, first allocations
    read = ", ".join(sorted(calls)) or "none"
    measured = _compare(fast_run, _step(slow, coords, x), lambda: generic(cls), rounds)
    row = [spec["label"], name, read, *_cells(*measured)]
    print(" | ".join(_cell(c) for c in row), flush=True)
    return row


def run_each_form(spec: dict, name: str, rounds: int) -> list[list]:
    """Per form of the class: all its fast forms against all but that one, where the fast
    side reads it on this shape (a form the shape never reads gets no row)."""
    cls, coords, x, fast, slow = _layers(spec, name)
    calls: Counter = Counter()
    with counted(cls, calls):
        fast_run = _step(fast, coords, x)
        fast_run()
    rows = []
    for form in sorted(calls):
        measured = _compare(fast_run, _step(slow, coords, x), lambda f=form: without(cls, f),
                            rounds)
        row = [spec["label"], name, form, *_cells(*measured)]
        print(" | ".join(_cell(c) for c in row), flush=True)
        rows.append(row)
    return rows


def _cell(c) -> str:
    if isinstance(c, list):
        return "–".join(f"{v:.2f}" for v in c)
    return f"{c:.2f}" if isinstance(c, float) else str(c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="an encoding name (repeatable)")
    parser.add_argument("--shape", default=None, help="only shapes whose label contains this")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--mode", choices=("train", "infer"), default="train",
                        help="forward + backward (train) or a forward without gradients")
    parser.add_argument("--table", choices=("forms", "each_form", "both"), default="both",
                        help="per class (forms), per form (each_form) or both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    MODE["mode"] = args.mode
    table = Table("forms", "Fast forms against the generic path of their structure: the "
                  "attention layer, fwd+bwd (CPU)",
                  ["shape", "encoding", "forms read", "fast ms", "generic ms",
                   "time: generic / fast", "spread", "fast MiB", "generic MiB",
                   "memory: generic / fast"],
                  [None, None, None, "{:.1f}", "{:.1f}", "{:.2f}", "{:.2f}", "{:.1f}",
                   "{:.1f}", "{:.2f}"])
    each = Table("each_form" if args.mode == "train" else "each_form_infer", "Each fast form against the class's other forms without it: the "
                 "attention layer, " + ("fwd+bwd" if args.mode == "train" else "forward, no grad")
                 + " (CPU)",
                 ["shape", "encoding", "form", "with ms", "without ms",
                  "time: without / with", "spread", "with MiB", "without MiB",
                  "memory: without / with"],
                 [None, None, None, "{:.1f}", "{:.1f}", "{:.2f}", "{:.2f}", "{:.1f}",
                  "{:.1f}", "{:.2f}"])
    for spec, name in CASES:
        if args.mode not in spec.get("modes", ("train", "infer")) or (
                args.shape and args.shape not in spec["label"]):
            continue
        if not args.only or name in args.only:
            if args.table in ("forms", "both"):
                table.add(*run(spec, name, args.rounds))
            if args.table in ("each_form", "both"):
                for row in run_each_form(spec, name, args.rounds):
                    each.add(*row)
    if args.store:
        tables = [t for t in (table, each) if t.rows]
        write(args.store, "bench_fast_forms", tables,
              config={"rounds": args.rounds}, threads=args.threads)


if __name__ == "__main__":
    main()
