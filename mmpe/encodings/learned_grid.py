"""Learned absolute position embeddings on a grid, resampled to new grids (ViT)."""

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


@register(
    "learned_grid", hook="input", needs=(GridLayout,), learnable=True, family="absolute",
    aliases=("learned_2d", "vit_pos_embed"),
    paper="Dosovitskiy et al. 2021, An Image is Worth 16x16 Words (ICLR), §3.1 and §3.2 "
          "(2D interpolation of the pre-trained position embeddings for fine-tuning at higher resolution)", context=("d_model", "grid_shape", "prefix_tokens"))
class LearnedGridPE(SavesSettings, InputEncoding):
    """A trainable vector per grid cell (and per prefix token), added to the patch embeddings (ViT).

    The table `E` `[prod(grid_shape), d_model]` (init N(0, 0.02²), timm's truncated normal)
    belongs to the training grid. On a grid of another shape (higher resolution, longer clip)
    the table is resampled as a `grid_shape` image of `d_model` channels: 2D bicubic with
    antialiasing, `align_corners=False` — exactly timm's `resample_abs_pos_embed` — 3D
    trilinear, 1D linear. Prefix embeddings are kept as they are.

    Args:
        d_model: embedding width.
        grid_shape: the training grid, e.g. `(14, 14)` patches or `(8, 14, 14)` tubelets.
        prefix_tokens: learned embeddings for this many prefix tokens (ViT's cls token: 1).
            With 0, prefix tokens of the coordinates get the zero vector (timm's
            `no_embed_class`).
        interpolation: 2D mode, `"bicubic"` (ViT/timm), `"bilinear"` or `"nearest"`.
        antialias: antialias when downsampling in 2D (timm's default True).

    Shapes: `forward(coords) -> [n, d_model]`.

    Raises:
        ValueError: bad `d_model`/`grid_shape`/`prefix_tokens`; at forward, a grid with a
            different number of axes than `grid_shape`, or prefix counts that differ (the
            coordinates have `k > 0` prefix tokens and the table holds `j > 0`, `j != k`).
    """

    saved_settings = ("grid_shape", "interpolation", "antialias")

    def __init__(self, d_model: int, grid_shape: tuple[int, ...], prefix_tokens: int = 0,
                 interpolation: str = "bicubic", antialias: bool = True) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"learned_grid: d_model must be > 0, got {d_model}")
        self.grid_shape = check_shape("learned_grid", "grid_shape", grid_shape)
        if not isinstance(prefix_tokens, int) or prefix_tokens < 0:
            raise ValueError(f"learned_grid: prefix_tokens must be an int >= 0, got {prefix_tokens!r}")
        if interpolation not in ("bicubic", "bilinear", "nearest"):
            raise ValueError(f"learned_grid: interpolation must be bicubic, bilinear or nearest, "
                             f"got {interpolation!r}")
        self.d_model, self.prefix_tokens = d_model, prefix_tokens
        self.interpolation, self.antialias = interpolation, antialias
        self.table = nn.Parameter(nn.init.trunc_normal_(torch.empty(math.prod(self.grid_shape), d_model), std=0.02))
        # No zero-size parameter without prefix tokens: it would never get a gradient (DDP
        # refuses unused parameters).
        self.prefix = (nn.Parameter(nn.init.trunc_normal_(torch.empty(prefix_tokens, d_model), std=0.02))
                       if prefix_tokens else None)

    def grid_table(self, shape: tuple[int, ...]) -> Tensor:
        """The cell table for a grid of `shape`, `[prod(shape), d_model]` (resampled if needed)."""
        return resample_table(self.table, self.grid_shape, tuple(shape), self.interpolation,
                              self.antialias)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        grid = as_grid("learned_grid", coords)
        check_ndim("learned_grid", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
        cells = self.grid_table(grid.shape)
        k = grid.prefix_tokens
        if k == 0:
            return cells
        if self.prefix_tokens == 0:
            return torch.cat((cells.new_zeros(k, self.d_model), cells), dim=0)
        if self.prefix_tokens != k:
            raise ValueError(
                f"learned_grid: the table holds {self.prefix_tokens} prefix embeddings but the "
                f"grid has {k} prefix tokens"
            )
        return torch.cat((self.prefix.to(cells.dtype), cells), dim=0)

    @torch.no_grad()
    def resample_(self, grid_shape: tuple[int, ...]) -> None:
        """Replace the table by its resampling to `grid_shape` (fine-tuning at a new resolution)."""
        grid_shape = check_shape("learned_grid", "grid_shape", grid_shape)
        if len(grid_shape) != len(self.grid_shape):
            raise ValueError(f"learned_grid: grid_shape must have {len(self.grid_shape)} axes, "
                             f"got {grid_shape}")
        self.table = nn.Parameter(self.grid_table(grid_shape).clone())
        self.grid_shape = grid_shape
