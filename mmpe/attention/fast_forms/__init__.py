"""Hand-written fast forms of single encoding classes, in one table keyed by the exact class.

An encoding's module holds its paper; where an attention plan computes one class's term faster
than its structure's generic form (FIRE's linear pieces over a block's range, KERPLE-log's
tiles with the gradient by hand, Graphormer's gather by hop code), that form sits here, beside the plans that
read it, as a function of the encoding. The table is keyed by `type(enc)`, in the style of
HF's table of RoPE initialisers: a subclass gets the generic forms of its structure, never its
parent's fast ones, so it can never compute its parent's numbers. Each form gives the numbers
of the class's `score_mod` (checked for every entry by `mmpe.testing.assert_encoding_paths`)
and stays only while a stored benchmark shows it pays (docs/benchmarks.md).

Forms (each optional; signatures as the doors of [mmpe.attention.forms][] that read them):

| form | signature | read by |
| --- | --- | --- |
| `dense` | `(enc, ctx) -> [b or 1, n_h, n_q, n_k]` | the dense route and plan |
| `rows` | `(enc, ctx, start, stop) -> [b or 1, n_h, R, n_k]` | blocks of the sdpa routes |
| `tiles` | `(enc, ctx, start, stop, width) -> BiasTiles` | the tiles plan's backward pass |
| `compact` | `(enc, ctx) -> CompactBias` | the relation plan on sequences |
| `pair_term` | `(enc, ctx, q_idx, kv_idx, b) -> [n_h, *pairs]` | offset tables on grids |
| `offset_on_grids` | `True` (a declaration) | the grid plans (CPU and flex) |
"""

from __future__ import annotations

# The hand-written forms: each module registers its classes on import.
from mmpe.attention.fast_forms import alibi, dense_tables, fire, geometry, graphormer, kerple  # noqa: E402, F401, I001
from mmpe.attention.fast_forms.by_class import FAST_FORMS, FORMS, get, register

__all__ = ["FAST_FORMS", "FORMS", "get", "register"]
