"""Shared machinery for content-dependent score encodings (Shaw, Transformer-XL, DeBERTa, CoPE …).

A content-dependent term depends on the layer's queries/keys, so it carries the true batch
axis `b`. The attention module evaluates score mods on index grids whose batch axis is 1 when
positions are shared by the batch ([`mmpe.coords.index_grid`][mmpe.coords.base.index_grid]); [`batch_index`][mmpe.encodings._content.batch_index]
widens that axis to the content's batch, and the attention paths' generic form (`mmpe.attention.generic.pair_rows`) evaluates the
mod on a full `[b, n_h, n_q, n_k]` grid. Inside FlexAttention `b` is a scalar and is used
as is, so the same mod serves every path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.capabilities import Directed
from mmpe.encodings.base import AttentionCall, ScoreEncoding
from mmpe.validation import check_positive_int  # noqa: F401  (re-exported: the one copy)


def batch_index(b: Tensor, batch: int) -> Tensor:
    """`b` as an index into tensors with `batch` examples (scalar in flex, grid when eager)."""
    if b.dim() == 0 or b.shape[0] == batch:
        return b
    return torch.arange(batch, device=b.device).view(batch, *([1] * (b.dim() - 1)))


def require_qk(name: str, ctx: AttentionCall, *, x: bool = False) -> None:
    """Raise `ValueError` unless `ctx` carries q, k (and x when asked) of matching sizes."""
    if ctx.q is None or ctx.k is None:
        raise ValueError(f"{name}: needs the layer's q and k in the AttentionCall")
    if ctx.q.shape[-2] != ctx.coords.num_queries or ctx.k.shape[-2] != ctx.coords.num_keys:
        raise ValueError(
            f"{name}: q/k hold {ctx.q.shape[-2]}/{ctx.k.shape[-2]} tokens but the coordinates "
            f"have {ctx.coords.num_queries}/{ctx.coords.num_keys}"
        )
    if x:
        if ctx.x is None:
            raise ValueError(f"{name}: needs the layer input x in the AttentionCall")
        if ctx.x.shape[1] != ctx.coords.num_keys:
            raise ValueError(
                f"{name}: gates are computed from x for every key, but x has {ctx.x.shape[1]} "
                f"tokens and there are {ctx.coords.num_keys} keys (a key/value cache is not supported)"
            )


def require_causal(name: str, ctx: AttentionCall) -> None:
    """Raise `ValueError` unless the coordinates are `Directed` and causal."""
    if not (isinstance(ctx.coords, Directed) and ctx.coords.causal):
        raise ValueError(f"{name}: is defined for causal attention; build the coordinates "
                         "with causal=True (e.g. Sequence(n, causal=True))")


class ContentScoreEncoding(ScoreEncoding):
    """A score encoding whose additive term depends on the batch's content (q, k or x)."""

    content_free = False
