"""T5 relative position bias with log-spaced buckets (Raffel et al. 2020)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Directed, Metric
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, Term
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
    #: a function of the signed offset on sequences (of the rounded distance elsewhere)
    structure = "relation"

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

    def buckets(self, ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor, b: Tensor) -> Tensor:
        """The bucket of each pair.

        Bucket of each pair (int64, broadcast of the indices), from the coordinates'
        relation or, without a direction, their distance."""
        coords = ctx.coords
        pair = coords.relation if isinstance(coords, Directed) else coords.distance
        return self._bucket_of(coords)(pair(q_idx, kv_idx, b))

    def _bucket_of(self, coords) -> Callable[[Tensor], Tensor]:
        """The bucket of a relation `pos_q − pos_k` (directed coordinates: of `key − query`,
        T5's sign) or of a distance (otherwise: of `−round(distance / unit)`)."""
        bidirectional, directed = self._bidirectional(coords), isinstance(coords, Directed)

        def bucket(x: Tensor) -> Tensor:
            rel = -x if directed else -(x.abs() / self.distance_unit).round().long()
            return t5_bucket(rel, bidirectional, self.num_buckets, self.max_distance)

        return bucket

    def _bidirectional(self, coords) -> bool:
        """The option, or inferred: bidirectional on directed, non-causal coordinates."""
        bidirectional = self.bidirectional
        if bidirectional is None:
            bidirectional = isinstance(coords, Directed) and not coords.causal
        if bidirectional and self.num_buckets % 2:
            raise ValueError(f"t5: num_buckets must be even when bidirectional, got {self.num_buckets}")
        return bidirectional

    def relation_term(self, ctx: AttentionCall) -> Term:
        """T5's term of a relation: its bucket's learned bias.

        `term(relation, h) = B[bucket(−relation), h]` (key − query, T5's sign); on undirected
        coordinates, of a distance `d`, `B[bucket(−round(d / unit)), h]`. `score_mod` is
        derived from it."""
        table, bucket = self.table, self._bucket_of(ctx.coords)

        def term(relation: Tensor, h: Tensor) -> Tensor:
            return table[bucket(relation), h]

        return term
