"""T5 relative position bias with log-spaced buckets (Raffel et al. 2020)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Directed, Metric
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionContext, ScoreEncoding, ScoreMod
from mmpe.registry import register
from mmpe.validation import check_bool, check_int


def t5_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """Bucket index of `relative_position = key_pos − query_pos` (tokens), as in T5.

    Bidirectional: half the buckets for keys after the query, half for keys before. Within a
    half, the first `num_buckets/4` distances get a bucket each; larger distances share
    log-spaced buckets up to `max_distance`, beyond which all share the last bucket.
    Unidirectional (causal): only keys at or before the query count (later keys fall in
    bucket 0), with all `num_buckets` for the magnitude.

    Returns:
        int64 tensor of `relative_position`'s shape, values in `[0, num_buckets)`.
    """
    if not isinstance(relative_position, Tensor):
        raise TypeError(f"t5_bucket: relative_position must be a torch.Tensor, "
                        f"got {type(relative_position).__name__}")
    check_bool("t5_bucket", "bidirectional", bidirectional)
    # each half needs an exact bucket and a log bucket: 4 buckets bidirectional, 2 causal
    check_int("t5_bucket", "num_buckets", num_buckets, 4 if bidirectional else 2)
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    check_int("t5_bucket", "max_distance", max_distance, exact + 1)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    # clamp(min=1) keeps log finite where the small branch is taken anyway.
    scaled = torch.log(rel.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, rel, large)


@register(
    "t5", hook="score", needs=(Metric,),
    learnable=True, family="bias", aliases=("t5_bias",),
    paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified "
          "Text-to-Text Transformer (JMLR), §2.1", context=("num_heads", "distance_unit"))
class T5RelativeBias(SavesSettings, ScoreEncoding):
    """A learned scalar per head and relative-position bucket, added to the logits (T5, §2.1).

    `score(i, j) += B[bucket(pos_j − pos_i), h]` with [`t5_bucket`][mmpe.encodings.t5.t5_bucket]. Distances past
    `max_distance` share one bucket, so the bias is defined at any length.

    Args:
        num_heads: `n_h`.
        num_buckets: number of buckets (32 in T5; ≥ 2, even when bidirectional).
        max_distance: distance (tokens) where the last bucket starts (128 in T5).
        bidirectional: separate buckets for keys before/after the query. `None` (default)
            follows the coordinates: unidirectional for causal sequences and for undirected
            coordinates (grids, graphs), where the distance is bucketed.
        distance_unit: on undirected coordinates, the distance that counts as one step
            (distances are divided by it and rounded before bucketing).

    Raises:
        ValueError: `num_buckets < 2`, odd `num_buckets` when bidirectional, or
            `max_distance` not larger than the exact range.
    """

    saved_settings = ("max_distance", "bidirectional", "distance_unit")
    #: on a Grid the term depends on a pair only through its cell offset (the attention's grid
    #: path reads it from a table over the offsets, mmpe/attention/grid.py)
    grid_offset_only = True

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool | None = None,
        distance_unit: float = 1.0,
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"t5: num_heads must be >= 1, got {num_heads}")
        if num_buckets < 2:
            raise ValueError(f"t5: num_buckets must be >= 2, got {num_buckets}")
        if bidirectional and num_buckets % 2:
            raise ValueError(f"t5: num_buckets must be even when bidirectional, got {num_buckets}")
        if distance_unit <= 0:
            raise ValueError(f"t5: distance_unit must be > 0, got {distance_unit}")
        self.distance_unit = float(distance_unit)
        half = num_buckets // 2 if bidirectional else num_buckets
        if max_distance <= half // 2:
            raise ValueError(f"t5: max_distance must exceed {half // 2}, got {max_distance}")
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional = bidirectional
        # T5 initialises this table like its other weights; zeros start as NoPE and are learned.
        self.table = nn.Parameter(torch.zeros(num_buckets, num_heads))

    def buckets(self, ctx: AttentionContext, q_idx: Tensor, kv_idx: Tensor, b: Tensor) -> Tensor:
        """Bucket of each pair, from the coordinates' relation or distance."""
        coords = ctx.coords
        if isinstance(coords, Directed):
            rel = -coords.relation(q_idx, kv_idx, b)  # key − query, T5's sign
        else:
            rel = -(coords.distance(q_idx, kv_idx, b) / self.distance_unit).round().long()
        return t5_bucket(rel, self._bidirectional(coords), self.num_buckets, self.max_distance)

    def _bidirectional(self, coords) -> bool:
        """The option, or inferred: bidirectional on directed, non-causal coordinates."""
        bidirectional = self.bidirectional
        if bidirectional is None:
            bidirectional = isinstance(coords, Directed) and not coords.causal
        if bidirectional and self.num_buckets % 2:
            raise ValueError(f"t5: num_buckets must be even when bidirectional, got {self.num_buckets}")
        return bidirectional

    def bias(self, ctx: AttentionContext) -> Tensor:
        """Eager path: bucket each distinct offset once, then gather, `[b or 1, n_h, n_q, n_k]`.

        The offsets of a sequence whose positions lie in `0 … max_position` take at most
        `2·max_position + 1` values, so the log-bucketing runs on those instead of on all
        `n_q·n_k` pairs (with no device read); the result equals `score_mod`.
        """
        self.check_context(ctx)
        coords = ctx.coords
        b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                                coords.device)
        if not isinstance(coords, Directed):
            return super().bias(ctx)
        top = getattr(coords, "max_position", None)  # a host int: no device read
        if not isinstance(top, int) or 2 * top + 1 > coords.num_queries * coords.num_keys:
            return super().bias(ctx)  # sparse or unknown positions: bucket the pairs directly
        rel = -coords.relation(q, k, b)  # key − query, [b, 1, n_q, n_k], within ±top
        lo = -top
        offsets = torch.arange(-top, top + 1, device=rel.device)
        buckets = t5_bucket(offsets, self._bidirectional(coords), self.num_buckets, self.max_distance)
        table = self.table[buckets]  # [n_offsets, n_h]
        return table[rel.squeeze(1) - lo].permute(0, 3, 1, 2)

    def relation_bias(self, ctx: AttentionContext, relation: Tensor) -> Tensor:
        """The bucket's learned value per head on `toeplitz` coordinates, `[n_h, m]`: the
        bucketing runs on the `m` offsets, not on the pairs."""
        self.check_context(ctx)
        coords = ctx.coords
        if isinstance(coords, Directed):
            rel = -relation  # key − query, T5's sign
        else:
            rel = -(relation.abs().to(torch.float32) / self.distance_unit).round().long()
        buckets = t5_bucket(rel, self._bidirectional(coords), self.num_buckets, self.max_distance)
        return self.table[buckets].T.float()

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        table = self.table

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[self.buckets(ctx, q_idx, kv_idx, b), h]

        return mod
