"""The `score_mod` of a bias computed on all pairs at once (not a registered module: the name
starts with `_`)."""

from __future__ import annotations

from torch import Tensor

from mmpe.encodings.base import ScoreMod


def dense_bias_mod(bias: Tensor) -> ScoreMod:
    """The `score_mod` adding `bias[b, h, q_idx, kv_idx]`: a bias `[b, n_h, n_q, n_k]` computed
    once per call (the graph tables of GraphormerEdge, RRWP, SPE), read by index."""

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + bias[b, h, q_idx, kv_idx]

    return mod
