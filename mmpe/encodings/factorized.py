"""Factorised (separable) learned space-time position embeddings (TimeSformer, ViViT)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout
from mmpe.encodings._grid import as_grid, check_ndim, check_shape, resample_table
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register
from mmpe.validation import check_int


@register(
    "factorized", hook="input", needs=(GridLayout,), learnable=True, family="absolute",
    aliases=("factorised", "separable", "space_time"),
    paper="Bertasius et al. 2021, Is Space-Time Attention All You Need for Video Understanding? "
          "(TimeSformer, ICML) §3; Arnab et al. 2021, ViViT: A Video Vision Transformer (ICCV) §3.3", context=("d_model", "grid_shape", "prefix_tokens"))
class FactorizedPE(SavesSettings, InputEncoding):
    """Sum of learned embeddings over groups of axes: `P[t, h, w] = E_time[t] + E_space[h, w]`.

    TimeSformer adds a spatial embedding per patch and a temporal embedding per frame; ViViT's
    factorised models do the same. `groups` generalises the split: the default for a 3-axis
    grid is `((0,), (1, 2))` (time | space), for a 2-axis grid `((0,), (1,))` (per axis —
    a learned axial embedding, e.g. time | frequency of a spectrogram). Parameters:
    `Σ_g prod(shape_g)` vectors instead of `prod(shape)` — and a clip of `T' > T` frames
    needs only the temporal table resampled.

    On a grid of another shape each group's table is resampled: multi-axis groups as
    [`LearnedGridPE`][mmpe.encodings.learned_grid.LearnedGridPE] (2D bicubic, timm's
    `resample_abs_pos_embed`), one-axis groups with `interpolation_1d` (`"nearest"` as
    TimeSformer's time embedding when the frame count changes, or `"linear"`).

    Args:
        d_model: embedding width.
        grid_shape: the training grid.
        groups: a partition of the axes `0 … A−1` into groups (tuples of axis numbers).
        prefix_tokens: learned prefix embeddings (0: prefix tokens get zeros).
        interpolation_1d: `"nearest"` or `"linear"`.

    Shapes: `forward(coords) -> [n, d_model]`.

    Raises:
        ValueError: `groups` not a partition of the axes, bad sizes, a grid with a different
            number of axes, mismatched prefix counts.
    """

    saved_settings = ("grid_shape", "interpolation_1d")

    def __init__(self, d_model: int, grid_shape: tuple[int, ...],
                 groups: tuple[tuple[int, ...], ...] | None = None, prefix_tokens: int = 0,
                 interpolation_1d: str = "nearest") -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"factorized: d_model must be > 0, got {d_model}")
        self.grid_shape = check_shape("factorized", "grid_shape", grid_shape)
        ndim = len(self.grid_shape)
        if groups is None:
            groups = ((0,), tuple(range(1, ndim))) if ndim >= 2 else ((0,),)
        if (not isinstance(groups, (tuple, list))
                or not all(isinstance(g, (tuple, list)) for g in groups)):
            raise TypeError(f"factorized: groups must be a tuple of tuples of axis numbers, "
                            f"got {groups!r}")
        for g in groups:
            for a in g:
                check_int("factorized", "groups", a, 0, ndim - 1)
        groups = tuple(tuple(int(a) for a in g) for g in groups)
        flat = sorted(a for g in groups for a in g)
        if flat != list(range(ndim)) or any(not g for g in groups):
            raise ValueError(f"factorized: groups must partition the axes 0..{ndim - 1}, got {groups}")
        if interpolation_1d not in ("nearest", "linear"):
            raise ValueError(f"factorized: interpolation_1d must be nearest or linear, got {interpolation_1d!r}")
        if not isinstance(prefix_tokens, int) or prefix_tokens < 0:
            raise ValueError(f"factorized: prefix_tokens must be an int >= 0, got {prefix_tokens!r}")
        self.d_model, self.groups, self.prefix_tokens = d_model, groups, prefix_tokens
        self.interpolation_1d = interpolation_1d
        self.tables = nn.ParameterList(
            nn.Parameter(nn.init.trunc_normal_(
                torch.empty(math.prod(self.grid_shape[a] for a in g), d_model), std=0.02))
            for g in groups
        )
        # No zero-size parameter without prefix tokens: it would never get a gradient (DDP
        # refuses unused parameters).
        self.prefix = (nn.Parameter(nn.init.trunc_normal_(torch.empty(prefix_tokens, d_model), std=0.02))
                       if prefix_tokens else None)

    def _group_table(self, i: int, shape: tuple[int, ...]) -> Tensor:
        g = self.groups[i]
        old = tuple(self.grid_shape[a] for a in g)
        new = tuple(shape[a] for a in g)
        table = self.tables[i]
        if old == new:
            return table
        if len(g) == 1 and self.interpolation_1d == "nearest":
            src = torch.div(torch.arange(new[0], device=table.device) * old[0], new[0],
                            rounding_mode="floor")  # F.interpolate(mode="nearest") indices
            return table[src]
        return resample_table(table, old, new)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        grid = as_grid("factorized", coords)
        check_ndim("factorized", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
        idx = grid.grid_index  # [N, A]
        pe = None
        for i, g in enumerate(self.groups):
            table = self._group_table(i, grid.shape)
            flat = torch.zeros_like(idx[:, 0])
            for a in g:  # row-major index of the cell within the group's sub-grid
                flat = flat * grid.shape[a] + idx[:, a]
            term = table[flat]
            pe = term if pe is None else pe + term
        k = grid.prefix_tokens
        if k == 0:
            return pe
        if self.prefix_tokens == 0:
            return torch.cat((pe.new_zeros(k, self.d_model), pe), dim=0)
        if self.prefix_tokens != k:
            raise ValueError(f"factorized: {self.prefix_tokens} prefix embeddings but the grid has "
                             f"{k} prefix tokens")
        return torch.cat((self.prefix, pe), dim=0)
