"""ALiBi's CPU forms.

ALiBi's CPU forms: its rows without a graph into a reused scratch block, and head by head
as one product per head of the distance rows shared by the heads (`−m_h · d`, the numbers of
[ALiBi.distance_term][mmpe.encodings.alibi.ALiBi.distance_term]: `(−m)·d` exactly)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe._scratch import block_empty
from mmpe.attention.fast_forms.by_class import register
from mmpe.attention.term_layouts import distance_rows
from mmpe.encodings.alibi import ALiBi
from mmpe.encodings.base import AttentionCall


def _distances(enc: ALiBi, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    dist = distance_rows(ctx, start, stop)  # [b or 1, 1, rows, n_k]
    return dist if enc.distance_unit == 1.0 else dist / enc.distance_unit


def rows(enc: ALiBi, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """ALiBi's term `−m_h · d` of queries `start … stop−1`.

    `−m_h · d` of queries `start … stop−1`, `[b or 1, n_h, R, n_k]`; without a graph
    written into the encoding's scratch block (reused across the blocks of a pass)."""
    dist = _distances(enc, ctx, start, stop)
    slopes = -enc.slopes.float()[:, None, None]
    if torch.compiler.is_compiling() or (
            torch.is_grad_enabled() and (dist.requires_grad or slopes.requires_grad)):
        return dist * slopes
    shape = (dist.shape[0], slopes.shape[0], *dist.shape[2:])
    out = block_empty(enc, "rows", shape, torch.result_type(dist, slopes), dist.device)
    return torch.mul(dist, slopes, out=out)


register(ALiBi, rows=rows)
