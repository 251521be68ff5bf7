"""FlexAttention glue: composed ``score_mod``s, per-offset tables for learned relation terms on
a GPU, and the ``BlockMask`` of the coordinates (built once per forward)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe import flex_compile
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import AttentionContext, ScoreEncoding, ScoreMod
from mmpe.prepare import memoized


def compose_score_mods(mods: Seq[ScoreMod]) -> ScoreMod | None:
    """One ``score_mod`` applying ``mods`` in order, or None for an empty list."""
    if not mods:
        return None

    def composed(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    return composed


def _flex_mods(scores: Seq[ScoreEncoding], ctx: AttentionContext,
               tables: bool | None = None) -> list[ScoreMod]:
    """The ``score_mod`` terms for FlexAttention. On a GPU, learned terms that are a function of
    the relation alone on ``toeplitz`` coordinates (T5, KERPLE, learnable ALiBi slopes) are
    summed into one per-offset table ``[n_h, n_q + n_k − 1]`` built outside the kernel with
    ordinary autograd, and the kernel reads it once per pair. The kernel's gradient for a
    captured tensor is an atomic add per (query, key) pair into the slot it read: into T5's
    32 buckets × heads, every pair contends for a handful of addresses (90× the unbiased
    layer at n = 4,096); into ``2n − 1`` offsets per head the adds spread out.

    ``tables``: use the per-offset table (default: on CUDA only)."""
    table, mods = None, []
    coords = ctx.coords
    if tables is None:
        tables = ctx.q.device.type == "cuda"
    use_table = tables and getattr(coords, "toeplitz", False) is True
    if use_table:
        n_q, n_k = coords.num_queries, coords.num_keys
        relation = torch.arange(n_k - 1, -n_q, -1, device=ctx.q.device)
    for enc in scores:
        learned = any(p.requires_grad for p in enc.parameters())
        term = None
        if use_table and learned and enc.content_free and enc.additive:
            term = memoized(coords, ("relation_bias", id(enc), ctx.num_heads, n_q, n_k),
                            lambda enc=enc: enc.relation_bias(ctx, relation))
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


def _block_mask(coords: Coordinates, device: torch.device):
    """The ``BlockMask`` of the coordinates' ``mask_mod``, built once per forward."""
    mask_mod = coords.mask_mod()
    if mask_mod is None:
        return None

    def build():
        if torch.compiler.is_compiling():
            from torch.nn.attention.flex_attention import create_block_mask

            return create_block_mask(mask_mod, coords.batch_size, None, coords.num_queries,
                                     coords.num_keys, device=device)
        return flex_compile.block_mask(mask_mod, coords.batch_size, coords.num_queries,
                                       coords.num_keys, device)

    return memoized(coords, ("block_mask", str(device)), build)
