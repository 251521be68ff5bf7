"""Helpers shared by the grid encodings (not a registered method)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout, missing
from mmpe.encodings.rope import apply_rotary, rotation_dtype


def as_grid(name: str, coords: Coordinates):
    """`coords` after checking it provides `GridLayout`, or `TypeError` naming the encoding."""
    gaps = missing(coords, GridLayout)
    if gaps:
        raise TypeError(f"{name} needs coordinates with the GridLayout capability; "
                        f"{type(coords).__name__} is missing {', '.join(gaps)}")
    return coords


def check_shape(name: str, arg: str, shape) -> tuple[int, ...]:
    """Validate a grid shape argument (non-empty tuple of positive ints)."""
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValueError(f"{name}: {arg} must be a tuple of positive ints, got {shape!r}") from None
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in shape):
        raise ValueError(f"{name}: {arg} must be a non-empty tuple of positive ints, got {shape!r}")
    return shape


def check_ndim(name: str, grid, ndim: int, what: str) -> None:
    if len(grid.shape) != ndim:
        raise ValueError(f"{name}: {what} has {ndim} axes but the grid {grid.shape} has "
                         f"{len(grid.shape)}")


def phase_cos_sin(phase: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`cos`/`sin` of `phase` (radians, any float dtype) rounded once to `dtype`, in the
    shape [`apply_rotary`][mmpe.encodings.rope.apply_rotary] reads: `[s, r/2]` stays, a per-head
    `[n_h, s, r/2]` becomes `[1, n_h, s, r/2]` (rank-4 tables are used as they are)."""
    if phase.dim() == 3:
        phase = phase.unsqueeze(0)
    return phase.cos().to(dtype), phase.sin().to(dtype)


def rotate(x: Tensor, phase: Tensor, interleaved: bool) -> Tensor:
    """Rotate channel pairs of `x` `[b, n_h, s, h_d]` by `phase` (radians).

    `phase`: `[s, h_d/2]` (shared by heads) or `[n_h, s, h_d/2]` (per head). Pairs are
    `(2i, 2i+1)` when `interleaved` (timm's default layout), else `(i, i + h_d/2)`.
    Returns `x`'s shape and dtype; bf16/fp16 are rotated in their own dtype
    ([`rotation_dtype`][mmpe.encodings.rope.rotation_dtype]).
    """
    cos, sin = phase_cos_sin(phase, rotation_dtype(x.dtype))
    return apply_rotary(x, cos, sin, interleaved)


def resample_table(table: Tensor, old: tuple[int, ...], new: tuple[int, ...],
                   mode_2d: str = "bicubic", antialias: bool = True) -> Tensor:
    """Resample a `[prod(old), c]` grid table to `[prod(new), c]` with `F.interpolate`.

    2D uses `mode_2d` (bicubic with antialiasing: timm's `resample_abs_pos_embed`), 1D
    linear, 3D trilinear (`align_corners=False` throughout, as timm).
    """
    if tuple(old) == tuple(new):
        return table
    c = table.shape[-1]
    grid = table.float().reshape(1, *old, c).movedim(-1, 1)
    if len(old) == 1:
        out = F.interpolate(grid, size=new, mode="linear", align_corners=False)
    elif len(old) == 2:
        smooth = mode_2d in ("bilinear", "bicubic")
        # align_corners and antialias exist only for the interpolating modes ("nearest" has
        # neither: torch raises if either is passed).
        extra = {"align_corners": False, "antialias": antialias} if smooth else {}
        out = F.interpolate(grid, size=new, mode=mode_2d, **extra)
    elif len(old) == 3:
        out = F.interpolate(grid, size=new, mode="trilinear", align_corners=False)
    else:
        raise ValueError(f"resample_table: grids of 1-3 axes are supported, got {len(old)}")
    return out.movedim(1, -1).reshape(math.prod(new), c).to(table.dtype)


def zero_prefix(pe: Tensor, prefix_tokens: int) -> Tensor:
    """Prepend `prefix_tokens` zero rows to `pe` `[n, d]`."""
    if not prefix_tokens:
        return pe
    return torch.cat((pe.new_zeros(prefix_tokens, pe.shape[-1]), pe), dim=0)
