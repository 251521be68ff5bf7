"""The generic form of every score term: its `score_mod` evaluated on broadcast index grids.

Every other form (a structure's in `mmpe.attention.forms`, a hand-written one in
`mmpe.attention.fast_forms`) is held to these numbers; it sits below both so that each can fall
back on it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall, ScoreEncoding


def pair_rows(enc: ScoreEncoding, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """`score_mod` on the pairs of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`:
    the generic form of every structure (the definition every other form is held to; `b` is
    the content's batch for content-dependent terms)."""
    if not enc.additive:
        raise TypeError(f"{type(enc).__name__} rescales scores; it has no additive bias")
    coords = ctx.coords
    batch = ctx.batch if not enc.content_free else (coords.batch_size or 1)
    b, h, q, k = index_grid(batch, ctx.num_heads, coords.num_queries, coords.num_keys,
                            coords.device)
    zero = torch.zeros((), device=coords.device)
    out = enc.score_mod(ctx)(zero, b, h, q[:, :, start:stop], k)
    return out.expand(batch, ctx.num_heads, stop - start, coords.num_keys)
