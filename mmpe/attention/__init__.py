"""Multi-head attention that composes any list of positional encodings.

Rotary encodings rotate `q` and `k`; score encodings are merged into one FlexAttention
`score_mod`; a kernel encoding replaces the softmax. Six routes (a layer's `route=`) give the
same numbers:

* `"flex"` — `torch.nn.attention.flex_attention` with the composed `score_mod` and a
  `BlockMask` from the coordinates' `mask_mod`: no `n×n` bias tensor, memory O(n) on a GPU.
  Compiled with `torch.compile` on CUDA, one copy per score-mod family, static shapes for its
  first two shapes and dynamic after them
  ([mmpe.flex_compile][]).
* `"sdpa"` — `scaled_dot_product_attention` with the additive terms laid out by one *plan*
  ([sdpa_plan][mmpe.attention.dispatch.sdpa_plan], on every device; without terms, one
  unbiased call): `relation` on `toeplitz` sequences (tables over the `n_q + n_k − 1` offsets,
  read by the fused kernel as strided views, a backward pass that sums the gradient along the
  diagonals); `grid` on a `Grid` of two or more axes for terms of the cell offset (ALiBi, T5,
  KERPLE, FIRE, Swin/BEiT, SwinV2-CPB: one table over the `Π (2 s_a − 1)` offsets, read block
  by block, its gradient reduced onto the table); `tiles` for content-free terms on points and
  graphs (bias tiles with a hand-written backward); `checkpointed` blocks of query rows; or
  `dense`, the dense route's one call.
* `"fold"` — a causal ALiBi bias folded exactly into extra channels of `q` and `k`
  ([mmpe.attention.fold][]): one plain SDPA call with the coordinates' mask alone.
* `"fla"` — flash-linear-attention's Triton kernels for FoX, stick-breaking and PaTH
  ([mmpe.attention.fla][]; forced, CUDA only, `pip install ".[fla]"`).
* `"math"` — explicit `q·kᵀ`, score mods, mask, kernel; needed by non-additive score mods with
  a non-softmax kernel, or value-side terms that need the probabilities.

* `"dense"` — one SDPA call with the terms' dense bias ([dense_bias][mmpe.attention.dense_bias],
  the one dense door) as `attn_mask`: the peers' way (timm, HF T5, Graphormer), on any device.

`route="auto"` follows the rule of [mmpe.attention.route][]: on CUDA the dense route for
learned or content-dependent terms whose dense bias fits a budget, flex for content-free terms
without learned tensors and past the budget, SDPA without terms, a stored cost table over the
rule where it has a row; on the CPU, SDPA — FlexAttention has no
backward pass on the CPU, its CPU kernel is 4–5× slower than SDPA, and without a BlockMask its
CPU scratch memory is O(n²). [which_route][mmpe.attention.which_route] names the route of a call without
running it.

[MultiHeadAttention][mmpe.attention.MultiHeadAttention] is self-attention with grouped-query
heads and an optional [KVCache][mmpe.cache.KVCache];
[CrossAttention][mmpe.attention.CrossAttention] attends from one token set to another, each
with its own coordinates (see [Cross][mmpe.coords.cross.Cross]).

The package, one idea per file:

| file | what |
| --- | --- |
| `modules.py` | the modules: hooks, projections, rotation, checks |
| `route.py` | which route a call takes: the rule, the cost table, forcing, the route log |
| `dispatch.py` | the flex, dense, SDPA and math routes |
| `fla.py` | the fla route: FoX, stick-breaking and PaTH on flash-linear-attention's kernels |
| `fold.py` | the fold route: causal ALiBi as two extra channels of `q` and `k` |
| `forms.py` | how a route's plan reads a score term: by its declared structure, or a fast form; the one dense-bias door |
| `generic.py` | the generic form of every term (`score_mod` on index grids), which the others are held to |
| `fast_forms/` | hand-written fast forms of single encoding classes, keyed by exact class |
| `flex.py` | FlexAttention glue: composed `score_mod`s, per-offset tables, `BlockMask` |
| `plans/` | the sdpa route's plans: relation (sequences), grid, tiles (points, graphs), their kernels |
| `masks.py` | dense masks, SDPA's causal triangle, bias casting |
| `memory.py` | block budget, memory guard |
| `record.py` | `record_attention`: every call's softmax weights, for heatmaps |
"""

from __future__ import annotations

from mmpe.attention.dispatch import run_dense, run_flex, run_math, run_sdpa
from mmpe.attention.fla import run_fla
from mmpe.attention.flex import compose_score_mods
from mmpe.attention.fold import run_fold
from mmpe.attention.forms import dense_bias
from mmpe.attention.memory import BLOCK_BYTES, block_bytes
from mmpe.attention.modules import ROUTE_CHOICES, CrossAttention, MultiHeadAttention
from mmpe.attention.plans.relation import RELATION_BLOCK_ROWS  # noqa: I001  (after the modules)
from mmpe.attention.record import record_attention
from mmpe.attention.route import ROUTES, choose_route, log_routes, which_route

__all__ = [
    "ROUTE_CHOICES",
    "BLOCK_BYTES",
    "RELATION_BLOCK_ROWS",
    "ROUTES",
    "CrossAttention",
    "MultiHeadAttention",
    "block_bytes",
    "choose_route",
    "compose_score_mods",
    "dense_bias",
    "log_routes",
    "record_attention",
    "run_dense",
    "run_fla",
    "run_flex",
    "run_fold",
    "run_math",
    "run_sdpa",
    "which_route",
]
