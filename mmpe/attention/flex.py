"""FlexAttention glue: score mods, per-offset tables and the block mask.

FlexAttention glue: composed ``score_mod``s, per-offset tables for learned relation terms on
a GPU, and the ``BlockMask`` of the coordinates (built once per forward)."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe import flex_compile
from mmpe.attention import forms
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.prepare import _MEMO, memoized


def compose_score_mods(mods: Seq[ScoreMod]) -> ScoreMod | None:
    """One ``score_mod`` applying ``mods`` in order, or None for an empty list."""
    if not mods:
        return None

    def composed(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    return composed


def flex_mods(scores: Seq[ScoreEncoding], ctx: AttentionCall,
               tables: bool | None = None) -> list[ScoreMod]:
    """The `score_mod` terms for FlexAttention.

    The ``score_mod`` terms for FlexAttention. On a GPU, learned terms that are a function of
    the relation alone on ``toeplitz`` coordinates (T5, KERPLE, learnable ALiBi slopes) are
    summed into one per-offset table ``[n_h, n_q + n_k − 1]`` built outside the kernel with
    ordinary autograd, and the kernel reads it once per pair. The kernel's gradient for a
    captured tensor is an atomic add per (query, key) pair into the slot it read: into T5's
    32 buckets × heads, every pair contends for a handful of addresses (90× the unbiased
    layer at n = 4,096); into ``2n − 1`` offsets per head the adds spread out.

    On a self-attention [Grid][mmpe.coords.grid.Grid] of two axes or more, learned terms that
    depend only on the cell offset (`forms.offset_only_on_grids`: T5, KERPLE, FIRE, Swin, …)
    are summed into the block-Toeplitz table `[n_h, Π (2 s_a − 1) + 3]` of
    [offset_table][mmpe.attention.forms.offset_table] in the same way (Swin's 16,129 offsets
    at 64 × 64 instead of its per-head bias table read through an index map).

    ``tables``: use the per-offset table (default: on CUDA only)."""
    coords = ctx.coords
    if tables is None:
        tables = ctx.q.device.type == "cuda"
    if tables and _grid_table_applies(coords):
        return _grid_mods(scores, ctx)
    table, mods = None, []
    use_table = tables and getattr(coords, "toeplitz", False) is True
    if use_table:
        n_q, n_k = coords.num_queries, coords.num_keys
        relation = torch.arange(n_k - 1, -n_q, -1, device=ctx.q.device)
    for enc in scores:
        learned = any(p.requires_grad for p in enc.parameters())
        term = None
        if use_table and learned and enc.content_free and enc.additive:
            term = memoized(coords, ("relation_table", id(enc), ctx.num_heads, n_q, n_k),
                            lambda enc=enc: forms.relation_table(enc, ctx, relation))
        if term is None:
            mods.append(enc.score_mod(ctx))
        else:
            table = term if table is None else table + term
    if table is not None:
        last_query = torch.full((), coords.num_queries - 1, device=ctx.q.device)
        mods.insert(0, _relation_mod(table.float().contiguous(), last_query))
    return mods


def _relation_mod(table: Tensor, last_query: Tensor) -> ScoreMod:
    """``score + table[h, kv_idx − q_idx + n_q − 1]``: entry ``s`` of the table is relation
    ``n_k − 1 − s``, and pair ``(q, k)`` has relation ``q + n_k − n_q − k``. ``n_q − 1`` is a
    0-d tensor, not an int, so that a new length is not a new compile."""

    def relation_table(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                       kv_idx: Tensor) -> Tensor:
        return score + table[h, kv_idx - q_idx + last_query]

    return relation_table


def _grid_table_applies(coords: Coordinates) -> bool:
    from mmpe.coords.grid import Grid

    return (isinstance(coords, Grid) and coords.ndim >= 2
            and coords.num_queries == coords.num_keys == coords.num_tokens)


def _grid_mods(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> list[ScoreMod]:
    """`flex_mods` on a grid: learned offset-only terms in one block-Toeplitz table."""
    table, mods = None, []
    for enc in scores:
        learned = any(p.requires_grad for p in enc.parameters())
        if learned and enc.content_free and enc.additive and forms.offset_only_on_grids(enc):
            term = memoized(ctx.coords, ("grid_offset_table", id(enc), ctx.num_heads),
                            lambda enc=enc: forms.offset_table(enc, ctx))
            table = term if table is None else table + term
        else:
            mods.append(enc.score_mod(ctx))
    if table is not None:
        mods.insert(0, _grid_offset_mod(table.contiguous(), ctx.coords))
    return mods


def _grid_offset_mod(table: Tensor, grid) -> ScoreMod:
    """`score + table[h, offset(q_idx, kv_idx)]` with the layout of
    [offset_pairs][mmpe.attention.plans.grid.offset_pairs]: cell offsets row-major over
    `kv_a − q_a + s_a − 1`, then prefix→cell, cell→prefix, prefix→prefix. The grid's sizes and
    strides are captured tensors, not ints, so that a new grid shape is not a new compile; the
    table is indexed once per pair (a captured tensor that requires grad may be read only once
    in a compiled `score_mod`)."""
    shape = list(grid.shape)
    device = table.device
    sizes = torch.tensor(shape, device=device)
    strides = torch.tensor([math.prod(shape[a + 1:]) for a in range(len(shape))], device=device)
    spans = torch.tensor([math.prod(2 * s - 1 for s in shape[a + 1:]) for a in range(len(shape))],
                         device=device)
    prefix = torch.tensor(grid.prefix_tokens, device=device)
    cells = torch.tensor(math.prod(2 * s - 1 for s in shape), device=device)
    axes = len(shape)

    def grid_offset_table(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                          kv_idx: Tensor) -> Tensor:
        q_cell, k_cell = (q_idx - prefix).clamp(min=0), (kv_idx - prefix).clamp(min=0)
        flat = torch.zeros_like(q_cell)
        for a in range(axes):  # unrolled: the number of axes is fixed per grid kind
            qa = (q_cell // strides[a]) % sizes[a]
            ka = (k_cell // strides[a]) % sizes[a]
            flat = flat + (ka - qa + sizes[a] - 1) * spans[a]
        q_pre, k_pre = q_idx < prefix, kv_idx < prefix
        index = torch.where(q_pre, torch.where(k_pre, cells + 2, cells),
                            torch.where(k_pre, cells + 1, flat))
        return score + table[h, index]

    return grid_offset_table


#: BlockMasks of coordinates whose mask is a function of their sizes (`Coordinates.mask_key`),
#: kept across forwards: building one costs a kernel per forward (157 µs at 4,096 causal tokens
#: on an H100, 60 % of the unbiased layer's fwd+bwd). Bounded: the least recent is dropped.
_STATIC_MASKS: OrderedDict = OrderedDict()
STATIC_MASKS_MAX = 32


def _twin(coords: Coordinates) -> Coordinates:
    """A shallow copy of `coords` with its own copies of the tensors it holds and no memo of
    the forward (which can hold tensors of the autograd graph: not copyable)."""
    twin = copy.copy(coords)
    for name, value in vars(coords).items():
        if isinstance(value, Tensor):
            twin.__dict__[name] = value.detach().clone()
    twin.__dict__.pop(_MEMO, None)
    return twin


def block_mask_of(coords: Coordinates, device: torch.device):
    """The `BlockMask` of the coordinates' `mask_mod`.

    The ``BlockMask`` of the coordinates' ``mask_mod``, built once per forward, or once per
    process where the mask is determined by the sizes (`mask_key`)."""
    mask_mod = coords.mask_mod()
    if mask_mod is None:
        return None
    key = coords.mask_key()
    if key is not None and not torch.compiler.is_compiling():
        key = (key, str(device))
        if key not in _STATIC_MASKS:
            # Built from a copy: a mask_mod that shared the caller's tensors with its
            # score_mod would alias them in the first forward only, and torch recompiles the
            # kernel when that aliasing goes away in the next (one compile more per family).
            mask_mod = _twin(coords).mask_mod()
            _STATIC_MASKS[key] = flex_compile.block_mask(mask_mod, coords.batch_size,
                                                         coords.num_queries, coords.num_keys,
                                                         device)
            while len(_STATIC_MASKS) > STATIC_MASKS_MAX:
                _STATIC_MASKS.popitem(last=False)
        _STATIC_MASKS.move_to_end(key)
        return _STATIC_MASKS[key]

    def build():
        if torch.compiler.is_compiling():
            from torch.nn.attention.flex_attention import create_block_mask

            return create_block_mask(mask_mod, coords.batch_size, None, coords.num_queries,
                                     coords.num_keys, device=device)
        return flex_compile.block_mask(mask_mod, coords.batch_size, coords.num_queries,
                                       coords.num_keys, device)

    return memoized(coords, ("block_mask", str(device)), build)
