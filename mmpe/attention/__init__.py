"""Multi-head attention that composes any list of positional encodings.

Rotary encodings rotate `q` and `k`; score encodings are merged into one FlexAttention
`score_mod`; a kernel encoding replaces the softmax. Three execution paths give the same
numbers:

* `"flex"` — `torch.nn.attention.flex_attention` with the composed `score_mod` and a
  `BlockMask` from the coordinates' `mask_mod`: no `n×n` bias tensor, memory O(n) on a GPU.
  Compiled with `torch.compile` on CUDA, one copy per score-mod family, static shapes for its
  first two shapes and dynamic after them
  ([mmpe.flex_compile][]).
* `"sdpa"` — `scaled_dot_product_attention` with the additive score terms evaluated on all
  pairs (the same functions, called on broadcast index grids) as `attn_mask`, block by block
  over queries. On the CPU, content-free terms on `toeplitz` sequences (implicit positions,
  packed documents) take the relation path instead: tables over the `n_q + n_k − 1` offsets,
  read by the fused kernel as strided views, with a backward pass that sums the gradient of the
  scores along the diagonals. On a `Grid` of two or more axes, terms that depend only on the
  cell offset (ALiBi, T5, KERPLE, FIRE, Swin/BEiT, SwinV2-CPB) take the grid path: one table
  over the `Π (2 s_a − 1)` offsets read block by block (block-Toeplitz), its gradient reduced
  onto the table, prefix tokens with their own terms.
* `"math"` — explicit `q·kᵀ`, score mods, mask, kernel; needed by non-additive score mods with
  a non-softmax kernel, or value-side terms that need the probabilities.

`backend="auto"` picks per device: on CUDA, flex when there are score terms or a mask (else
SDPA, whose flash kernels are fastest without a bias); on CPU, SDPA — measured on torch
2.13/2.15, FlexAttention has no backward pass on the CPU, its CPU kernel is 4–5× slower than
SDPA, and without a BlockMask its CPU scratch memory is O(n²).

[MultiHeadAttention][mmpe.attention.MultiHeadAttention] is self-attention with grouped-query
heads and an optional [KVCache][mmpe.cache.KVCache];
[CrossAttention][mmpe.attention.CrossAttention] attends from one token set to another, each
with its own coordinates (see [Cross][mmpe.coords.cross.Cross]).

The package, one idea per file:

| file | what |
| --- | --- |
| `modules.py` | the modules: hooks, projections, rotation, checks |
| `dispatch.py` | which path runs a call; the SDPA and math paths |
| `flex.py` | FlexAttention glue: composed `score_mod`s, per-offset tables, `BlockMask` |
| `relation.py` | the relation path on `toeplitz` sequences (CPU), its backward pass |
| `grid.py` | the relation path on grids: block-Toeplitz offset tables (CPU), the forward pass |
| `grid_backward.py` | its backward pass: fused for a constant bias, by hand onto a learned table |
| `blocked.py` | content-free biases on points, graphs, explicit positions (CPU), per block |
| `flash.py` | the one door to SDPA's private CPU kernel that returns the log-sum-exp |
| `masks.py` | dense masks, SDPA's causal triangle, bias casting |
| `memory.py` | block budget, memory guard |
| `record.py` | `record_attention`: every call's softmax weights, for heatmaps |
"""

from __future__ import annotations

# Every name of the single module this package replaced is re-exported, private ones included
# (other modules and tests import them from here). A test that monkeypatches one must patch the
# module that reads it: `mmpe.attention.flash._FLASH_CPU`, not `mmpe.attention._FLASH_CPU`.
from mmpe.attention.dispatch import (  # noqa: F401
    _bias,
    _sdpa_blocks,
    _sdpa_rows,
    _softmax_scale,
    choose_path,
    run_flex,
    run_math,
    run_sdpa,
)
from mmpe.attention.flash import _FLASH_CPU, _attend_block, _flash_cpu  # noqa: F401
from mmpe.attention.flex import _block_mask, _flex_mods, _relation_mod, compose_score_mods  # noqa: F401
from mmpe.attention.masks import _cast_bias, _dense_mask, _large_mask, _only_causal, _plain_causal  # noqa: F401
from mmpe.attention.memory import (  # noqa: F401
    BLOCK_BYTES,
    _bias_bytes,
    _check_memory,
    _physical_memory,
    block_bytes,
)
from mmpe.attention.modules import (  # noqa: F401
    BACKENDS,
    CrossAttention,
    MultiHeadAttention,
    _Attention,
    _autocast,
    _check_positive,
    _head_dim,
    _split_by_hook,
)
from mmpe.attention.record import record_attention
from mmpe.attention.relation import RELATION_BLOCK_ROWS, _RelationAttention, _RelationPlan  # noqa: F401

__all__ = [
    "BACKENDS",
    "BLOCK_BYTES",
    "RELATION_BLOCK_ROWS",
    "CrossAttention",
    "MultiHeadAttention",
    "block_bytes",
    "choose_path",
    "compose_score_mods",
    "record_attention",
    "run_flex",
    "run_math",
    "run_sdpa",
]
