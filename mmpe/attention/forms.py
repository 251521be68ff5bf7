"""How the attention routes and plans read a score term.

How the attention routes and plans read a score term: one door per form, decided from the term's
declared structure (`mmpe.encodings.base.STRUCTURES`) or a hand-written fast
form of its exact class ([mmpe.attention.fast_forms][]).

Every function here gives the numbers of the encoding's `score_mod` (the generic forms evaluate
it, or the structure's term function it is derived from); a fast form is held to the same
numbers by `mmpe.testing.assert_encoding_paths`. An encoding never needs to know which route
runs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from mmpe._scratch import block_bytes
from mmpe.attention import fast_forms
from mmpe.attention.generic import pair_rows
from mmpe.attention.term_layouts import BiasTiles, CompactBias, distance_rows
from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Directed
from mmpe.coords.grid import Grid
from mmpe.encodings.base import AttentionCall, ScoreEncoding
from mmpe.prepare import memoized
from mmpe.validation import check_memory

#: structures whose term depends on a pair of grid cells only through their offset (a Grid's
#: distance is a function of the offset; so is a relation)
_OFFSET_ON_GRIDS = ("relation", "distance", "offset")


def rows(enc: ScoreEncoding, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The term of queries `start … stop−1`.

    The term of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`: the class's fast
    form, else the distance rows once for all heads (structure `"distance"`), else
    [pair_rows][mmpe.attention.generic.pair_rows]."""
    fast = fast_forms.get(enc, "rows")
    if fast is not None:
        return fast(enc, ctx, start, stop)
    if enc.structure == "distance":
        return _distance_rows(enc, ctx, start, stop)
    if enc.structure == "relation" and _few_offsets(ctx.coords):
        return _relation_rows(enc, ctx, start, stop)
    return pair_rows(enc, ctx, start, stop)


def _distance_rows(enc: ScoreEncoding, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The distance rows once for all heads, the term on them; a chunk of rows at a time where
    the term's per-pair features (`feature_width` channels: kernels, hidden units) would
    outgrow the block budget."""
    coords = ctx.coords
    heads = torch.arange(ctx.num_heads, device=coords.device)[:, None, None]
    term = enc.distance_term(ctx)
    width = max(getattr(enc, "feature_width", 1), ctx.num_heads)
    step = max(1, block_bytes() // max(1, (coords.batch_size or 1) * coords.num_keys * width * 4))
    chunks = [term(distance_rows(ctx, lo, min(stop, lo + step)), heads)
              for lo in range(start, stop, step)]
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=2)


def _few_offsets(coords) -> bool:
    """Directed coordinates whose positions lie in `0 … max_position` (a host int), with
    fewer distinct offsets `2·max_position + 1` than pairs."""
    top = getattr(coords, "max_position", None)
    return (isinstance(coords, Directed) and isinstance(top, int)
            and 2 * top + 1 <= coords.num_queries * coords.num_keys)


def _relation_rows(enc: ScoreEncoding, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The term on each distinct offset once, then gathered by the rows' relations (T5's
    log-bucketing runs on `2·max_position + 1` offsets instead of every pair)."""
    coords = ctx.coords
    top = coords.max_position
    b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                            coords.device)
    rel = coords.relation(q[:, :, start:stop], k, b)  # [b or 1, 1, R, n_k] within ±top
    offsets = torch.arange(-top, top + 1, device=rel.device)
    heads = torch.arange(ctx.num_heads, device=rel.device)[:, None]
    table = enc.relation_term(ctx)(offsets[None], heads)  # [n_h, n_offsets]
    # gathered head-major, [b or 1, n_h, R, n_k] contiguous (not `table.T[rel]` permuted,
    # channel-last): the layout SDPA's fused kernels take as a mask
    return table[heads.view(1, -1, 1, 1), rel + top]


def dense(enc: ScoreEncoding, ctx: AttentionCall) -> Tensor:
    """The term of one encoding on every pair.

    The term of one encoding on every pair, `[b or 1, n_h, n_q, n_k]` (float32 for the
    built-in terms): the class's fast form, else [rows][mmpe.attention.forms.rows] on every
    query. A content-free term is computed once per forward
    (`mmpe.prepare.forward_scope`) and shared by the layers that hold it.

    Raises:
        TypeError: a rescaling (non-additive) term: it has no additive bias.
    """
    if not enc.additive:
        raise TypeError(f"{type(enc).__name__} rescales scores; it has no additive bias")
    if not enc.content_free:
        return _dense(enc, ctx)
    key = ("bias", id(enc), ctx.num_heads, ctx.coords.num_queries, ctx.coords.num_keys)
    return memoized(ctx.coords, key, lambda: _dense(enc, ctx))


def _dense(enc: ScoreEncoding, ctx: AttentionCall) -> Tensor:
    fast = fast_forms.get(enc, "dense")
    if fast is not None:
        return fast(enc, ctx)
    return rows(enc, ctx, 0, ctx.coords.num_queries)


def dense_bias(scores: Sequence[ScoreEncoding], ctx: AttentionCall) -> Tensor | None:
    """The dense bias: the sum of the additive terms on every pair.

    The one door to the dense bias: the sum of the additive terms `scores` on every pair,
    `[b or 1, n_h, n_q, n_k]` (`b` only where a term or the coordinates depend on the example),
    float32, differentiable in the terms' parameters; `None` without terms. Each term comes from
    [dense][mmpe.attention.forms.dense] (its fast form, else its structure's form), so the dense
    SDPA route, the timm and Hugging Face integrations and the benchmarks read the same numbers
    the same way. The coordinates' mask is not applied (see `mmpe.attention.masks`).

    Raises:
        TypeError: `scores` not a sequence of score encodings, or a rescaling term.
        ValueError: coordinates or a head count a term does not support (`check_call`).
        MemoryError: a bias (and the term being added to it) this process cannot hold now,
            refused before anything is allocated (`mmpe.validation.check_memory`).
    """
    if isinstance(scores, ScoreEncoding) or not all(isinstance(e, ScoreEncoding) for e in scores):
        raise TypeError("dense_bias: scores must be a sequence of score encodings, got "
                        f"{type(scores).__name__}")
    for enc in scores:
        enc.check_call(ctx)
    return summed_bias(scores, replace(ctx, checked=True))


def summed_bias(scores: Sequence[ScoreEncoding], ctx: AttentionCall) -> Tensor | None:
    """The dense bias on a call whose terms are checked.

    [dense_bias][mmpe.attention.forms.dense_bias] on a call whose terms are checked
    (`ctx.checked`: the attention layers' dense route): the memory check, then the sum."""
    _check_dense_memory(scores, ctx)
    bias = None
    for enc in scores:
        term = dense(enc, ctx)
        bias = term if bias is None else bias + term
    return bias


def _check_dense_memory(scores: Sequence[ScoreEncoding], ctx: AttentionCall) -> None:
    """The dense bias at its peak: the sum so far and the next term, float32 (not while
    compiling: traced code is not checked, and its message could not be traced)."""
    if not scores or torch.compiler.is_compiling():
        return
    coords = ctx.coords
    batch = coords.batch_size or 1
    if not all(enc.content_free for enc in scores):
        batch = max(batch, ctx.batch or 1)
    shape = (batch, ctx.num_heads, coords.num_queries, coords.num_keys)
    copies = 2 if len(scores) > 1 else 1
    check_memory("dense_bias", copies * math.prod(shape) * 4,
                 f"the bias [b, n_h, n_q, n_k] = {list(shape)} float32"
                 + (" and the term added to it" if copies == 2 else ""), coords.device,
                 "let the attention layers compute it (they run block by block over the "
                 "queries: MultiHeadAttention with route='sdpa'), take the rows of a few "
                 "queries (mmpe.attention.forms.rows(encoding, ctx, start, stop)), or use fewer "
                 "tokens")


def offers(enc: ScoreEncoding, form: str) -> bool:
    """Whether the door of `form` gives something for `enc`, so a plan can decide before it asks.

    `form` is one of `"tiles"`, `"compact"` (a hand-written fast
    form of the exact class, [mmpe.attention.fast_forms][]) or `"relation_table"` (the
    structure: a function of the relation or the distance).

    Raises:
        ValueError: another `form`.
    """
    if form == "relation_table":
        return enc.structure in ("relation", "distance")
    if form not in _FAST_ONLY:
        raise ValueError(f"offers: form must be one of {[*_FAST_ONLY, 'relation_table']}, "
                         f"got {form!r}")
    return fast_forms.get(enc, form) is not None


#: the doors that give None unless the class has its own fast form
_FAST_ONLY = ("tiles", "compact")


def tiles(enc: ScoreEncoding, ctx: AttentionCall, start: int, stop: int,
          width: int) -> BiasTiles | None:
    """The term tile by tile with its own backward pass (a hand-written fast form), or None."""
    fast = fast_forms.get(enc, "tiles")
    return None if fast is None else fast(enc, ctx, start, stop, width)


def relation_table(enc: ScoreEncoding, ctx: AttentionCall, relation: Tensor) -> Tensor | None:
    """The term over the offsets `relation` of `toeplitz` coordinates, or None.

    The term over the offsets `relation` `[m]` (int64, `pos_q − pos_k`) of `toeplitz`
    coordinates, `[n_h, m]` float32, or None where it is not a function of the relation."""
    heads = torch.arange(ctx.num_heads, device=relation.device)[:, None]
    if enc.structure == "relation":
        return enc.relation_term(ctx)(relation[None], heads).float()
    if enc.structure == "distance":  # on toeplitz coordinates the distance is |relation|
        return enc.distance_term(ctx)(relation.abs().float()[None], heads).float()
    return None


def compact(enc: ScoreEncoding, ctx: AttentionCall) -> CompactBias | None:
    """A term of more than the relation in `O(n)` tensors, or None.

    A term of more than the relation on `toeplitz` coordinates in `O(n)` tensors (a fast
    form: FIRE), or None."""
    fast = fast_forms.get(enc, "compact")
    return None if fast is None else fast(enc, ctx)


def offset_only_on_grids(enc: ScoreEncoding) -> bool:
    """Whether the term depends on a pair of grid cells only through their offset."""
    return enc.structure in _OFFSET_ON_GRIDS or bool(fast_forms.get(enc, "offset_on_grids"))


def pair_term(enc: ScoreEncoding, ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor,
              b: Tensor) -> Tensor:
    """The term on the broadcast pairs `(b, q_idx, kv_idx)` only, `[n_h, *pairs]` float32:
    `score_mod` with every head, or the structure's term on the pairs' distances, or a fast
    form (a term whose `score_mod` reads a table over every pair must not build it here)."""
    fast = fast_forms.get(enc, "pair_term")
    if fast is not None:
        return fast(enc, ctx, q_idx, kv_idx, b)
    h = torch.arange(ctx.num_heads, device=q_idx.device).view(-1, *([1] * q_idx.dim()))
    if enc.structure == "distance":
        d = ctx.coords.distance(q_idx, kv_idx, b).float()
        return enc.distance_term(ctx)(d[None], h).float()
    zero = torch.zeros((), device=q_idx.device)
    term = enc.score_mod(ctx)(zero, b[None], h, q_idx[None], kv_idx[None]).float()
    return term.expand(ctx.num_heads, *torch.broadcast_shapes(q_idx.shape, kv_idx.shape))


def offset_pairs(grid: Grid) -> tuple[Tensor, Tensor]:
    """Token indices of one pair per cell offset of a grid.

    Token indices `(q_idx, kv_idx)` `[Π (2 s_a − 1) + 3]` of one pair per cell offset, in the
    order of the offset table (row-major over `kv − q + s_a − 1` per axis), then a
    prefix→cell, a cell→prefix and a prefix→prefix pair (token 0 stands in for a prefix token
    where the grid has none; those three entries are then unused)."""
    axes = [torch.arange(-(s - 1), s) for s in grid.shape]  # kv − q per axis
    delta = torch.cartesian_prod(*axes).reshape(-1, grid.ndim)
    strides = torch.tensor([math.prod(grid.shape[a + 1:]) for a in range(grid.ndim)])
    p = grid.prefix_tokens
    q_idx = p + ((-delta).clamp(min=0) * strides).sum(-1)
    kv_idx = p + (delta.clamp(min=0) * strides).sum(-1)
    cell = torch.tensor([p])
    first = torch.tensor([0])
    q_idx = torch.cat((q_idx, first, cell, first))
    kv_idx = torch.cat((kv_idx, cell, first, first))
    return q_idx.to(grid.device), kv_idx.to(grid.device)


def offset_table(enc: ScoreEncoding, ctx: AttentionCall) -> Tensor:
    """The encoding's term on every cell offset and prefix kind of a grid.

    The encoding's term on every cell offset and prefix kind, `[n_h, Π (2 s_a − 1) + 3]`
    float32 (see [offset_pairs][mmpe.attention.forms.offset_pairs]), from [pair_term][mmpe.attention.forms.pair_term]:
    differentiable in its parameters."""
    grid = ctx.coords
    q_idx, kv_idx = offset_pairs(grid)
    b = torch.zeros(1, 1, dtype=torch.long, device=q_idx.device)
    return pair_term(enc, ctx, q_idx, kv_idx, b[0])
