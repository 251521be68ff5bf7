"""ALiBi: attention with linear biases (Press et al. 2022)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Metric
from mmpe.encodings._precision import KeepDtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, Term
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
    structure = "distance"
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

    def distance_term(self, ctx: AttentionCall) -> Term:
        """`term(d, h) = −m_h · d` (`d` in units of `distance_unit`)."""
        slopes, unit = self.slopes.float(), self.distance_unit  # the buffer itself (float32)

        def term(dist: Tensor, h: Tensor) -> Tensor:
            return -(slopes[h] * (dist if unit == 1.0 else dist / unit))

        return term
