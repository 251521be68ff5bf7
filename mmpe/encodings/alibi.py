"""ALiBi: attention with linear biases (Press et al. 2022)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe._scratch import block_empty
from mmpe.coords.capabilities import Metric
from mmpe.encodings._precision import KeepDtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import (
    AttentionContext,
    HeadRows,
    ScaledRows,
    ScoreEncoding,
    ScoreMod,
    distance_rows,
)
from mmpe.registry import register
from mmpe.validation import check_positive_int


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes of ALiBi (Press et al. 2022, §3 and their reference code).

    For `n` a power of two the slopes are the geometric sequence ``2^(−8/n), 2^(−16/n), …,
    2^(−8)` (8 heads: 1/2 … 1/256). Otherwise, with `m` the largest power of two below `n``,
    take the `m` slopes of `m` heads, then every other slope of `2m` heads for the
    remaining `n − m`.

    Returns:
        `[num_heads]` float32.

    Raises:
        ValueError: `num_heads < 1`.
    """
    check_positive_int("alibi", "num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    m = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(m)
    if m < num_heads:
        slopes += power_of_two(2 * m)[0::2][: num_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


@register(
    "alibi", hook="score", needs=(Metric,),
    learnable=False, family="bias",
    paper="Press et al. 2022, Train Short, Test Long: Attention with Linear Biases Enables "
          "Input Length Extrapolation (ICLR)", context=("num_heads", "distance_unit"))
class ALiBi(KeepDtype, SavesSettings, ScoreEncoding):
    """Linear distance penalty per head: `score + (−m_h · dist(i, j))` (Press et al. 2022).

    `m_h` are the fixed slopes of [`alibi_slopes`][mmpe.encodings.alibi.alibi_slopes]. `dist` is the coordinates'
    distance: `|i − j|` tokens on a sequence (for a causal decoder exactly the paper's
    `−m·(i − j)`), Euclidean patches on a grid, hops on a graph, angles on the sphere.

    The slopes are saved in the state_dict (a float32 buffer that a bf16/fp16 cast leaves in
    float32; with `learnable_slopes` a parameter), and `distance_unit` is saved as a setting
    checked on load.

    Args:
        num_heads: `n_h`.
        slopes: optional explicit slopes `[n_h]` (e.g. per-modality); the initial values when
            `learnable_slopes`.
        distance_unit: the distance that counts as one step (1 token or hop; e.g. the angle
            between neighbouring grid points on the sphere, in radians).
        learnable_slopes: make the slopes an `nn.Parameter` (trained with the model).

    Raises:
        ValueError: `num_heads < 1`, `slopes` not of shape `[num_heads]`, or
            `distance_unit <= 0`.
    """

    saved_settings = ("distance_unit",)
    #: on a Grid the term depends on a pair only through its cell offset (the attention's grid
    #: path reads it from a table over the offsets, mmpe/attention/grid.py)
    grid_offset_only = True
    keep_dtype = ("slopes",)  # a fixed slope is a frequency: float32 in bf16 models too

    def __init__(self, num_heads: int, slopes: Tensor | None = None,
                 distance_unit: float = 1.0, learnable_slopes: bool = False) -> None:
        super().__init__()
        if slopes is None:
            slopes = alibi_slopes(num_heads)
        else:
            try:  # a list or tuple of numbers is a tensor of slopes too
                slopes = torch.as_tensor(slopes, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError) as err:
                raise ValueError(f"alibi: slopes must be [num_heads={num_heads}] numbers, got "
                                 f"{slopes!r}") from err
            if tuple(slopes.shape) != (num_heads,):
                raise ValueError(f"alibi: slopes must be [num_heads={num_heads}], got "
                                 f"{tuple(slopes.shape)}")
            if not bool(torch.isfinite(slopes).all()):
                raise ValueError("alibi: slopes must be finite")
        if distance_unit <= 0:
            raise ValueError(f"alibi: distance_unit must be > 0, got {distance_unit}")
        self.num_heads, self.distance_unit = num_heads, float(distance_unit)
        slopes = torch.as_tensor(slopes, dtype=torch.float32).detach().clone()
        if learnable_slopes:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        coords, slopes, unit = ctx.coords, self.slopes.float(), self.distance_unit

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            dist = coords.distance(q_idx, kv_idx, b)
            return score - slopes[h] * (dist if unit == 1.0 else dist / unit)

        return mod

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """`−m_h · dist` of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]` float32:
        the distance rows once for all heads ([`distance_rows`][mmpe.encodings.base.distance_rows]),
        then one product per head (the numbers of `score_mod`: `0 − m·d = (−m)·d` exactly)."""
        self.check_context(ctx)
        dist = distance_rows(ctx, start, stop)  # [b or 1, 1, rows, n_k]
        unit = self.distance_unit
        if unit != 1.0:
            dist = dist / unit
        slopes = -self.slopes.float()[:, None, None]
        if torch.compiler.is_compiling() or (
                torch.is_grad_enabled() and (dist.requires_grad or slopes.requires_grad)):
            return dist * slopes
        shape = (dist.shape[0], slopes.shape[0], *dist.shape[2:])
        out = block_empty(self, "rows", shape, torch.result_type(dist, slopes), dist.device)
        return torch.mul(dist, slopes, out=out)

    @torch.no_grad()
    def head_rows(self, ctx: AttentionContext, start: int, stop: int) -> HeadRows:
        """The rows of `bias_rows` head by head: the distance rows once, `d · (−m_h)` per head
        (see [HeadRows][mmpe.encodings.base.HeadRows])."""
        self.check_context(ctx)
        dist = distance_rows(ctx, start, stop)
        if self.distance_unit != 1.0:
            dist = dist / self.distance_unit
        return ScaledRows(dist, -self.slopes.float())

    def relation_bias(self, ctx: AttentionContext, relation: Tensor) -> Tensor:
        """`−m_h · |relation|` on `toeplitz` coordinates, `[n_h, m]` float32."""
        self.check_context(ctx)
        dist = relation.abs().to(torch.float32)
        unit = self.distance_unit
        return -self.slopes.float()[:, None] * (dist if unit == 1.0 else dist / unit)
