"""DeBERTa disentangled attention (He et al. 2021) with DeBERTa-v2 log buckets."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Directed
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_qk,
)
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.registry import register


def log_bucket_position(relative_pos: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa-v2's log-bucketed relative position (same numbers as HF `make_log_bucket_position`).

    With `mid = bucket_size // 2`: offsets with `|δ| ≤ mid` keep their value; larger ones
    map to `sign(δ)·(mid + ⌈log(|δ|/mid)/log((max_position−1)/mid)·(mid−1)⌉)`.

    The arithmetic is HF's, operation for operation, in the default float dtype (float32): both
    logarithms are taken by `torch.log` of float32 values, so at `|δ| = max_position − 1`
    (where `|δ|/mid` and `(max_position−1)/mid` round to the same float32) their ratio is
    exactly 1 and the ceiling lands on `mid − 1`, as in HF. (A float64 `math.log` of the
    constant made the ratio `1 + 1 ulp` there and moved the offset one bucket up.)

    Args:
        relative_pos: integer offsets `i − j` (tokens).
        bucket_size: `position_buckets` (≥ 2).
        max_position: `max_relative_positions` (> `mid + 1`).

    Returns:
        int64 tensor of `relative_pos`'s shape, in `[−(bucket_size−1), bucket_size−1]`
            for offsets up to `max_position`.
    """
    rel = relative_pos if relative_pos.is_floating_point() else relative_pos.long()
    sign = torch.sign(rel)
    mid = bucket_size // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    log_ratio = torch.log(torch.tensor((max_position - 1) / mid))  # as HF: a float32 log
    log_pos = torch.ceil(torch.log(abs_pos / mid) / log_ratio * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).long()


@register(
    "deberta", hook="score", needs=(Directed,), learnable=True, family="relative",
    paper="He, Liu, Gao & Chen 2021, DeBERTa: Decoding-enhanced BERT with Disentangled "
          "Attention (ICLR), eqs. 2-4; log buckets of DeBERTa-v2/v3", context=("d_model", "num_heads", "head_dim"))
class DeBERTaRelative(SavesSettings, ContentScoreEncoding):
    """Disentangled attention: content-to-position and position-to-content terms (He et al. 2021).

    `Ã_ij = Q^c_i·K^c_j + Q^c_i·K^r_{δ(i,j)} + K^c_j·Q^r_{δ(i,j)}`, then scaled by
    `1/√(3·h_d)` (eq. 4; `softmax_scale`). `K^r = P W_{k,r}`, `Q^r = P W_{q,r}` with
    `P` a learned `[2·span, d_model]` table of relative embeddings and `span` =
    `position_buckets`; `δ(i,j) = clamp(bucket(i − j) + span, 0, 2·span − 1)` with the
    log buckets of [`log_bucket_position`][mmpe.encodings.deberta.log_bucket_position] (offsets `i − j` = query minus key position,
    tokens). Both terms use the same index, exactly as the reference implementation (HF
    `DisentangledSelfAttention`) gathers them. Efficient form: `Q^c·K^rᵀ` and
    `K^c·Q^rᵀ` are `[b, n_h, n, 2·span]` tables gathered per pair.

    Args:
        d_model: width of the relative embeddings `P`.
        num_heads: `n_h`.
        head_dim: `h_d`.
        position_buckets: `span` (256 in DeBERTa-v2/v3; ≥ 2).
        max_relative_positions: offset reached by the last log bucket (512).

    Raises:
        ValueError: `position_buckets < 2`, `max_relative_positions ≤ position_buckets/2 + 1`,
            non-positive sizes; q/k missing from the context.
    """

    saved_settings = {"max_relative_positions": "max_position"}

    def __init__(self, d_model: int, num_heads: int, head_dim: int, position_buckets: int = 256,
                 max_relative_positions: int = 512) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int("deberta", arg, val)
        check_positive_int("deberta", "position_buckets (bucket count)", position_buckets, 2)
        if max_relative_positions <= position_buckets // 2 + 1:
            raise ValueError(f"deberta: max_relative_positions must exceed position_buckets/2 + 1 = "
                             f"{position_buckets // 2 + 1}, got {max_relative_positions}")
        self.num_heads, self.head_dim = num_heads, head_dim
        self.span, self.max_position = position_buckets, max_relative_positions
        self.rel_embeddings = nn.Parameter(torch.randn(2 * position_buckets, d_model) * 0.02)
        self.pos_key_proj = nn.Linear(d_model, num_heads * head_dim)
        self.pos_query_proj = nn.Linear(d_model, num_heads * head_dim)

    def softmax_scale(self, head_dim: int) -> float | None:
        return 1.0 / math.sqrt(3 * head_dim)

    def relative_index(self, ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor,
                       b: Tensor) -> Tensor:
        """Row of the `[2·span]` tables for each pair."""
        bucket = log_bucket_position(ctx.coords.relation(q_idx, kv_idx, b), self.span, self.max_position)
        return (bucket + self.span).clamp(0, 2 * self.span - 1)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self.check_coords(ctx.coords)
        require_qk("deberta", ctx)
        if ctx.num_heads != self.num_heads or ctx.head_dim != self.head_dim:
            raise ValueError(f"deberta: built for num_heads={self.num_heads}, head_dim={self.head_dim}; "
                             f"attention has {ctx.num_heads}, {ctx.head_dim}")
        rows = 2 * self.span
        # The [2·span] position tables in float32, as the content the einsums read (a module
        # cast to bf16 has bf16 projections; under autocast the einsums run in bf16).
        kr = self.pos_key_proj(self.rel_embeddings).float().view(rows, self.num_heads, self.head_dim)
        qr = self.pos_query_proj(self.rel_embeddings).float().view(rows, self.num_heads, self.head_dim)
        scale = self.softmax_scale(ctx.head_dim)
        c2p = torch.einsum("bhnd,rhd->bhnr", ctx.q.float(), kr) * scale
        p2c = torch.einsum("bhnd,rhd->bhnr", ctx.k.float(), qr) * scale
        batch = ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            r = self.relative_index(ctx, q_idx, kv_idx, b)
            bb = batch_index(b, batch)
            return score + c2p[bb, h, q_idx, r] + p2c[bb, h, kv_idx, r]

        return mod
