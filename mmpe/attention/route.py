"""Which route an attention call takes.

Which route an attention call takes: a stated rule, a stored cost table that overrides it,
and a way to force one.

Routes (`ROUTES`):

* `"dense"` — one SDPA call with the terms' dense bias (`mmpe.attention.forms.dense_bias`, the
  one dense door) as `attn_mask`, built once per forward and broadcast over the batch where it
  does not depend on the example: what timm's relative-position attention, HF `T5Attention`
  and Graphormer do. SDPA's memory-efficient kernel differentiates the bias densely.
* `"flex"` — FlexAttention with the composed `score_mod` and a `BlockMask`: no `n × n` tensor.
* `"fold"` — a causal ALiBi bias folded exactly into extra channels of `q` and `k`
  ([mmpe.attention.fold][]): plain SDPA with the coordinates' mask alone, no bias tensor.
* `"sdpa"` — SDPA's fused kernels with the terms laid out by one *plan* of
  [sdpa_plan][mmpe.attention.dispatch.sdpa_plan] (relation, grid, tiles, checkpointed, dense),
  on every device; without terms every plan is one unbiased SDPA call (cuDNN or flash on
  CUDA). The rule sends terms to this route on the CPU only.

Words: a *route* is what a layer's `route=` names and the rule chooses; a *plan* is how the
sdpa route lays a call's terms out; a *form* is how a plan reads one term
([mmpe.attention.forms][]).
* `"fla"` — flash-linear-attention's Triton kernels for FoX, stick-breaking and PaTH
  ([mmpe.attention.fla][]; forced only, until a stored device row shows it pays).
* `"math"` — explicit scores: a kernel that replaces the softmax, value-side terms,
  `record_attention`.

The rule on CUDA (``route="auto"``), from the stored GPU runs (`results/gpu/`):

0. terms that fold exactly into `q` and `k` (causal ALiBi on a `Sequence`, within the
   unfolded logits' precision in the call's dtype) → `"fold"`: the unbiased kernel's cost by
   construction (not yet measured on a device);
1. no score term → `"sdpa"` (cuDNN/flash; FlexAttention without a `score_mod` took 1.9× cuDNN
   forward + backward at 4,096 causal tokens, H200, `h200-run4-probe.jsonl`);
2. a term that rescales the scores (not additive) → `"flex"` (SDPA takes additive masks only);
3. a term that holds learned tensors (trainable parameters) or reads the content, whose dense
   bias fits the budget → `"dense"`: FlexAttention's backward adds every pair's gradient
   atomically into a table of a few dozen to a few thousand slots, which cost 23–28× the
   unbiased layer on a 64² grid (Swin 23.4×, SwinV2-CPB 24.0×, T5 26.1×, FIRE 28.2×, H100,
   `h100-run3-cost.jsonl`) and 2.9× (T5) and 2.5× (KERPLE) at 4,096 tokens (H200,
   `h200-run4-cost.jsonl`), where the peers' dense bias costs one gather and a scatter of its
   gradient. Except, until a cost-table row says otherwise, content-free offset and distance
   terms on a causal `Sequence` (T5, KERPLE): FlexAttention skips the masked blocks there and
   the dense route does not, and the dense route is unmeasured on them;
4. otherwise (content-free terms without learned tensors: ALiBi, frozen slopes; or any term
   whose dense bias exceeds the budget, where the peer would run out of memory) → `"flex"`.

The budget holds what the dense route allocates at its peak ([dense_bytes][mmpe.attention.route.dense_bytes]):
the float32 bias (`b_bias · n_h · n_q · n_k · 4`; `b_bias` is the batch where a term or the
coordinates depend on the example, else 1), its copy in q's dtype padded to 8 keys, and with
gradients of a learned or content-dependent term the bias gradient SDPA's memory-efficient
backward writes at the whole batch (a 12-head 64²+cls Swin bias at batch 32, bf16: 12.9 GB) and its
float32 copy; a geometry term's per-pair features one block at a time. The budget is the
layer's `dense_bias_bytes`, else `MMPE_DENSE_BIAS_BYTES`, else `FREE_FRACTION` (a quarter) of
the CUDA device's free memory (`torch.cuda.mem_get_info`), else `DENSE_BIAS_BYTES` (1 GiB).
On the CPU, ``"auto"`` is `"sdpa"` (FlexAttention has no backward
pass there) and `"math"` where the call needs it.

A cost table ([CostTable][mmpe.attention.route.CostTable], JSON lines stored with the GPU
results, `results/gpu/routes.jsonl`, or the file `MMPE_ROUTE_COSTS` names) overrides the rule
where it has a row for the device's name, the torch version, the terms' structures, the size
bucket, the dtype and the grad mode: the fastest measured route that can run the call (the
dense route only within the budget). ``route=`` on the layer, else the environment variable
`MMPE_ATTENTION_ROUTE`, forces a route; [which_route][mmpe.attention.route.which_route] names the route a
call would take without running it, and [log_routes][mmpe.attention.route.log_routes] collects
the route each layer took (stored runs keep it).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mmpe import flex_compile
from mmpe._scratch import positive_env
from mmpe.attention import fold, record
from mmpe.encodings.base import KernelEncoding, ScoreEncoding

#: every route a call can take
ROUTES = ("flex", "dense", "fold", "fla", "sdpa", "math")
#: the routes a layer or `MMPE_ATTENTION_ROUTE` may name ("auto": the rule)
ROUTE_CHOICES = ("auto", *ROUTES)
#: default budget of the dense route's allocation where the device's free memory is not known
#: (bytes); `MMPE_DENSE_BIAS_BYTES` or a layer's `dense_bias_bytes` override it
DENSE_BIAS_BYTES = 1 << 30
#: the share of a CUDA device's free memory the dense route may allocate (the rest: the
#: activations, the optimizer, the other layers' memos)
FREE_FRACTION = 0.25
ENV_ROUTE = "MMPE_ATTENTION_ROUTE"
ENV_BUDGET = "MMPE_DENSE_BIAS_BYTES"
ENV_COSTS = "MMPE_ROUTE_COSTS"
#: where the cost table of a checkout lives (with the GPU results)
DEFAULT_COSTS = Path(__file__).resolve().parents[2] / "results" / "gpu" / "routes.jsonl"


class RouteInputs(NamedTuple):
    """What the route of one call depends on, without its tensors.

    What the route of one call depends on, without its tensors (a named tuple: the
    compiler traces it).

    Attributes:
        device_type: `"cuda"`, `"cpu"`, … (`torch.device.type`).
        device_name: the CUDA device's name (`torch.cuda.get_device_name`; the cost table's
            key), or None.
        dtype: the dtype of `q`, `k`, `v`.
        grad: whether autograd records the call.
        bias_bytes: bytes of the dense float32 bias (`b_bias · n_h · n_q · n_k · 4`).
        dense_bytes: what the dense route allocates for it
            ([dense_bytes][mmpe.attention.route.dense_bytes]), held to `budget`.
        pairs: `n_q · n_k` (the size bucket is `ceil(log2(pairs))`).
        budget: the dense route's budget in bytes (an override, else a fraction of the
            device's free memory where it is known, else `DENSE_BIAS_BYTES`).
        folds: whether the terms fold exactly into `q` and `k` on these coordinates, within
            the unfolded logits' precision in `dtype` ([mmpe.attention.fold][]).
        batch: `b` (a cost-table key: the dense bias's gradient is materialised per example).
        causal: whether the coordinates are causal (a cost-table key: FlexAttention skips the
            masked blocks, the dense route does not).
        causal_1d: a causal `Sequence` with implicit positions (rule 3's exception).
    """

    device_type: str
    device_name: str | None
    dtype: torch.dtype
    grad: bool
    bias_bytes: int
    pairs: int
    budget: int
    folds: bool = False
    dense_bytes: int = 0
    batch: int = 1
    causal: bool = False
    causal_1d: bool = False

    @property
    def bucket(self) -> int:
        """The size bucket: `ceil(log2(n_q · n_k))`."""
        return max(0, (self.pairs - 1).bit_length())


def dense_budget(override: int | None = None) -> int:
    """The dense route's budget in bytes.

    The dense route's budget in bytes: `override`, else `MMPE_DENSE_BIAS_BYTES`, else
    `DENSE_BIAS_BYTES`.

    Raises:
        ValueError: an override or environment value that is not a positive integer.
    """
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override <= 0:
            raise ValueError(f"attention: dense_bias_bytes must be a positive integer (bytes) or "
                             f"None, got {override!r}")
        return override
    return int(positive_env(ENV_BUDGET, DENSE_BIAS_BYTES, int, "a positive integer (bytes)"))


def forced_route(route: str) -> str:
    """The layer's `route`, or `MMPE_ATTENTION_ROUTE` where the layer says `"auto"`.

    Raises:
        ValueError: an unknown route in the argument or the environment variable.
    """
    if route not in ROUTE_CHOICES:
        raise ValueError(f"attention: route must be one of {ROUTE_CHOICES}, got {route!r}")
    if route != "auto":
        return route
    env = os.environ.get(ENV_ROUTE)
    if env is None or env == "":
        return "auto"
    if env not in ROUTE_CHOICES:
        raise ValueError(f"{ENV_ROUTE} must be one of {ROUTE_CHOICES}, got {env!r}")
    return env


def learned(enc: ScoreEncoding) -> bool:
    """Whether a term holds a tensor that training updates (a trainable parameter)."""
    return any(p.requires_grad for p in enc.parameters())


def structure_key(scores: Seq[ScoreEncoding]) -> str:
    """The cost table's structure key of the terms.

    The cost table's structure key: each term's declared structure, `:learned` where it holds
    trainable tensors, `:content` where it reads the content, sorted and joined by `+`
    (`"none"` without terms)."""
    parts = []
    for enc in scores:
        tag = str(enc.structure)
        tag += ":learned" if learned(enc) else ""
        tag += "" if enc.content_free else ":content"
        parts.append(tag)
    return "+".join(sorted(parts)) or "none"


def dense_bytes(scores: Seq[ScoreEncoding], coords: Any, num_heads: int, batch: int,
                dtype: torch.dtype, grad: bool) -> int:
    """Bytes the dense route allocates for the terms' bias, all at once at its peak.

    The float32 bias (`b_bias` examples: the batch where a term or the coordinates depend on
    the example, else 1), its copy in `dtype` with the key axis padded to 8 (what SDPA
    reads), and with gradients the bias gradient SDPA's memory-efficient backward writes at
    the expanded `[b, n_h, n_q, n_k]` in `dtype`, plus its float32 copy for the terms; the
    per-pair features of a geometry term are evaluated a block at a time (one block budget,
    `mmpe.attention.memory.block_bytes`)."""
    from mmpe.attention.memory import block_bytes

    per_example = coords.batch_size is not None or any(not e.content_free for e in scores)
    b_bias = batch if per_example else 1
    pairs, padded = coords.num_queries * coords.num_keys, coords.num_queries * (
        -(-coords.num_keys // 8) * 8)
    item = torch.empty((), dtype=dtype).element_size()
    total = b_bias * num_heads * (pairs * 4 + padded * item)
    if grad and any(learned(e) or not e.content_free for e in scores):
        total += batch * num_heads * padded * item + b_bias * num_heads * pairs * 4
    if any(getattr(e, "feature_width", 1) > 1 for e in scores):
        total += block_bytes()
    return total


def device_budget(device: torch.device, free_bytes: int | None = None) -> int | None:
    """A share of the device's free memory for the dense route.

    `FREE_FRACTION` of the device's free memory (`torch.cuda.mem_get_info`, or `free_bytes`
    for a described device), None where it is not known (the CPU; inside a compiled graph,
    where the budget is `DENSE_BIAS_BYTES`)."""
    if free_bytes is None and device.type == "cuda" and torch.cuda.is_available() \
            and not torch.compiler.is_compiling():  # a driver query the graph cannot hold
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return None if free_bytes is None else int(FREE_FRACTION * free_bytes)


def bias_bytes(scores: Seq[ScoreEncoding], coords: Any, num_heads: int, batch: int) -> int:
    """Bytes of the terms' dense float32 bias.

    Bytes of the terms' dense float32 bias: batch-wide only where a term reads the content
    or the coordinates hold per-example positions."""
    per_example = coords.batch_size is not None or any(not e.content_free for e in scores)
    return (batch if per_example else 1) * num_heads * coords.num_queries * coords.num_keys * 4


def choose_route(route: str, scores: Seq[ScoreEncoding], kernel: KernelEncoding | None,
                 call: RouteInputs, costs: CostTable | None = None) -> str:
    """The route of a call.

    The route of a call (one of `ROUTES`): forced, else the cost table's row, else the rule
    of this module's docstring.

    Raises:
        ValueError: a forced route that cannot run the call (`"flex"` or `"dense"` with a
            kernel that replaces the softmax or value-side terms, `"dense"` with a rescaling
            term), an unknown route.
        FlexUnavailableError: `"flex"` forced on a torch without FlexAttention's backward.
    """
    route = forced_route(route)
    kernel_softmax = kernel is None or kernel.is_softmax
    needs_math = not kernel_softmax or any(s.needs_probs for s in scores)
    additive = all(s.additive for s in scores)
    if record.recording():
        if not kernel_softmax:
            raise ValueError(f"record_attention: {type(kernel).__name__} replaces the softmax; "
                             "it has no softmax weights to record")
        return "math"
    if route == "fla":  # FoX, stick-breaking, PaTH: it names what it refuses as it runs
        return "fla"
    if route == "math" or (needs_math and route in ("auto", "sdpa")):
        return "math"
    if route in ("flex", "dense", "fold") and needs_math:
        raise ValueError(f"attention: route={route!r} cannot run a non-softmax kernel or "
                         "value-side score terms; use 'math' or 'auto'")
    if route == "flex":
        if not flex_compile.available():
            raise flex_compile.FlexUnavailableError(
                f"attention: route='flex' needs torch >= 2.6 (this is {torch.__version__}: "
                "its FlexAttention cannot differentiate learned score terms); use 'auto' "
                "or 'sdpa'")
        return "flex"
    if route == "dense":
        if not additive:
            raise ValueError("attention: route='dense' needs additive score terms (SDPA adds "
                             f"a bias); {[type(s).__name__ for s in scores if not s.additive]} "
                             "rescale the scores; use 'flex', 'math' or 'auto'")
        return "dense"
    if route in ("sdpa", "fold"):  # the fold names what it refuses as it runs
        return route if additive else "math"
    return _auto(scores, call, additive, costs)


def _auto(scores: Seq[ScoreEncoding], call: RouteInputs, additive: bool,
          costs: CostTable | None) -> str:
    """The rule (and the cost table) for ``route="auto"``."""
    if call.device_type != "cuda":
        return "sdpa" if additive else "math"
    flex = flex_compile.available()
    fits = call.dense_bytes <= call.budget
    runnable = {"sdpa": not scores, "dense": bool(scores) and additive and fits,
                "flex": bool(scores) and flex, "fold": call.folds}
    table = default_costs() if costs is None else costs
    measured = table.fastest(scores, call, [r for r, ok in runnable.items() if ok])
    if measured is not None:
        return measured
    if not scores:
        return "sdpa"
    if call.folds:  # the unbiased kernel (cuDNN, flash), no bias and no score_mod
        return "fold"
    if not additive:
        return "flex" if flex else "math"
    dense_pays = any(learned(e) or not e.content_free for e in scores)
    if call.causal_1d and all(e.content_free and e.structure in ("relation", "distance")
                              for e in scores):
        # rule 3's exception, until a cost-table row says otherwise: on a causal sequence
        # FlexAttention skips the masked blocks and the dense route does not (T5 and KERPLE
        # took 2.5-2.9x the unbiased layer on flex, H200; the dense route is unmeasured there)
        dense_pays = False
    if fits and (dense_pays or not flex):
        return "dense"
    return "flex" if flex else "sdpa"


@dataclass
class CostTable:
    """Measured milliseconds per route.

    Measured milliseconds per route, keyed by device name, torch version, structure key
    ([structure_key][mmpe.attention.route.structure_key]), size bucket, dtype, grad mode,
    batch and causality.

    One JSON line per row::

        {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "structure": "offset:learned",
         "bucket": 24, "dtype": "bfloat16", "grad": true, "batch": 8, "causal": false,
         "ms": {"dense": 1.9, "flex": 41.2}}
    """

    rows: dict[tuple, dict[str, float]] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        """Add one row (the JSON line's dict).

        Raises:
            ValueError: a row without the key fields, or `ms` not a dict of route → number.
        """
        need = ("device", "torch", "structure", "bucket", "dtype", "grad", "batch", "causal",
                "ms")
        missing = [k for k in need if k not in row]
        if missing:
            raise ValueError(f"CostTable: a row lacks {missing} (has {sorted(row)})")
        ms = row["ms"]
        if not isinstance(ms, dict) or not all(r in ROUTES and isinstance(v, int | float)
                                               for r, v in ms.items()):
            raise ValueError(f"CostTable: ms must map routes {ROUTES} to milliseconds, got {ms!r}")
        key = (row["device"], row["torch"], row["structure"], int(row["bucket"]),
               str(row["dtype"]).removeprefix("torch."), bool(row["grad"]), int(row["batch"]),
               bool(row["causal"]))
        self.rows[key] = {r: float(v) for r, v in ms.items()}

    def fastest(self, scores: Seq[ScoreEncoding], call: RouteInputs, runnable: list[str]) -> str | None:
        """The fastest measured route among `runnable` for the call, or None.

        The fastest measured route among `runnable` for the call, or None (no row, or no
        runnable route in it)."""
        if not self.rows or call.device_name is None:
            return None
        key = (call.device_name, torch.__version__, structure_key(scores), call.bucket,
               str(call.dtype).removeprefix("torch."), call.grad, call.batch, call.causal)
        ms = self.rows.get(key)
        if not ms:
            return None
        known = [(t, r) for r, t in ms.items() if r in runnable and math.isfinite(t)]
        return min(known)[1] if known else None


def load_costs(path: str | Path) -> CostTable:
    """The cost table in the JSON-lines file `path` (an empty table where it does not exist).

    Raises:
        ValueError: a line that is not JSON or not a row (naming the file and line).
    """
    table = CostTable()
    path = Path(path)
    if not path.exists():
        return table
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            table.add(json.loads(line))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}:{i}: not a cost-table row: {err}") from err
    return table


def default_costs() -> CostTable:
    """The table `MMPE_ROUTE_COSTS` names, else the checkout's `results/gpu/routes.jsonl`."""
    return _costs_at(os.environ.get(ENV_COSTS) or str(DEFAULT_COSTS))


@functools.cache
def _costs_at(path: str) -> CostTable:
    return load_costs(path)


@functools.cache
def device_name(device: torch.device) -> str | None:
    """The CUDA device's name (the cost table's key), None elsewhere."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def route_inputs(scores: Seq[ScoreEncoding], coords: Any, num_heads: int, batch: int,
                 device: torch.device, dtype: torch.dtype, grad: bool, budget: int | None = None,
                 name: str | None = None, free_bytes: int | None = None) -> RouteInputs:
    """The `RouteInputs` of attention over `coords` with these sizes.

    The [RouteInputs][mmpe.attention.route.RouteInputs] of attention over `coords` with these
    sizes; `name` and `free_bytes` describe the device where it is not this machine's
    (tests, planning)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if name is None and device.type == "cuda":
        name = device_name(device)
    # read by the CUDA rule only: no work (and, in float32, no read of the slopes) elsewhere
    folds = (device.type == "cuda" and fold.fold_refusal(scores, coords) is None
             and fold.fold_precise(scores, coords, dtype))
    causal = getattr(coords, "causal", False) is True
    causal_1d = causal and getattr(coords, "toeplitz", False) is True
    limit = dense_budget(budget) if budget is not None or os.environ.get(ENV_BUDGET) else \
        (device_budget(device, free_bytes) or dense_budget())
    return RouteInputs(device.type, name, dtype, grad,
                       bias_bytes(scores, coords, num_heads, batch),
                       coords.num_queries * coords.num_keys, limit, folds,
                       dense_bytes(scores, coords, num_heads, batch, dtype, grad),
                       batch, causal, causal_1d)


def which_route(layer: Any, coords: Any, *, batch: int | None = None,
          device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
          grad: bool = True, device_name: str | None = None,
          costs: CostTable | None = None, free_bytes: int | None = None) -> str:
    """The route a call of `layer` on `coords` would take, without running it.

    The route (one of `ROUTES`) a call of `layer` on `coords` would take on `device` in
    `dtype` with or without gradients, without running it.

    Args:
        layer: a [MultiHeadAttention][mmpe.attention.MultiHeadAttention] or
            [CrossAttention][mmpe.attention.CrossAttention].
        coords: the call's coordinates (`Cross(...)` for cross-attention).
        batch: `b` (default: the coordinates' batch size, else 1).
        device: the device of the call (a CUDA device need not be present).
        dtype: the dtype of `q`, `k`, `v`.
        grad: whether autograd records the call.
        device_name: the device's name for the cost table (default: this machine's, for CUDA).
        costs: a cost table (default: [default_costs][mmpe.attention.route.default_costs]).
        free_bytes: the device's free memory (default: this machine's, for CUDA; the dense
            route's budget is `FREE_FRACTION` of it).

    Raises:
        ValueError: as [choose_route][mmpe.attention.route.choose_route].
    """
    batch = batch or coords.batch_size or 1
    call = route_inputs(layer.scores, coords, layer.num_heads, batch, torch.device(device),
                        dtype, grad, layer.dense_bias_bytes, device_name, free_bytes)
    return choose_route(layer.route, layer.scores, layer.kernel, call, costs)


_LOGS: list[dict[str, list[str]]] = []
_NAMES: dict[int, str] = {}


@contextmanager
def log_routes() -> Iterator[dict[str, list[str]]]:
    """Record the route of every attention call inside the block.

    Inside the block every attention call adds its route to the yielded dict, keyed by the
    layer (`"<i> <class>"`, `i` counting layers in the order they first run): the distinct
    routes of its calls, in order. Stored runs keep it (`routes` in a record)."""
    log: dict[str, list[str]] = {}
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)
        if not _LOGS:
            _NAMES.clear()


def note(layer: Any, taken: str) -> None:
    """Add the route a layer took to the open `log_routes` blocks.

    Add the route a layer took to the open [log_routes][mmpe.attention.route.log_routes]
    blocks (nothing under `torch.compile` or without a block)."""
    if not _LOGS or torch.compiler.is_compiling():
        return
    name = _NAMES.setdefault(id(layer), f"{len(_NAMES)} {type(layer).__name__}")
    for log in _LOGS:
        routes = log.setdefault(name, [])
        if taken not in routes:
            routes.append(taken)
