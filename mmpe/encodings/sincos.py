"""2D / 3D sine-cosine position embeddings for grids (MAE, DETR, timm conventions)."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout, Positioned
from mmpe.coords.grid import Grid
from mmpe.encodings._grid import zero_prefix
from mmpe.encodings._precision import float32
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register

LAYOUTS = ("mae", "timm", "detr")



def _check_settings(d_model: int, axes: int, layout: str, temperature: float) -> None:
    """The argument checks shared by both table builders (errors as [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed])."""
    if d_model <= 0 or d_model % (2 * axes):
        raise ValueError(
            f"sincos: d_model must be divisible by 2·axes = {2 * axes} for a {axes}-axis grid, "
            f"got {d_model}"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"sincos: layout must be one of {LAYOUTS}, got {layout!r}")
    if not temperature > 0:
        raise ValueError(f"sincos: temperature must be > 0, got {temperature}")

def sincos_grid_embed(
    positions: Tensor, d_model: int, temperature: float = 10000.0, layout: str = "mae"
) -> Tensor:
    """Sine-cosine embedding of `positions` `[n, A]` (grid units), `[n, d_model]` float32.

    Every axis gets `d_model / A` channels: `F = d_model / (2A)` frequencies
    `ω_k = temperature^(−k/F)`, `k = 0 … F−1`, and `sin(p·ω_k)`, `cos(p·ω_k)` of the
    axis' position `p`. Layouts (the order of those channels):

    * `"mae"` — axes last-to-first (`w, h` in 2D, as MAE's `get_2d_sincos_pos_embed`),
      each `[sin(pω_0 … pω_{F−1}), cos(…)]`. Equals timm
      `build_sincos2d_pos_embed(reverse_coord=True, interleave_sin_cos=True)` once its tokens
      (which `reverse_coord` orders w-major) are transposed back to row-major.
    * `"timm"` — `[sin(axis 0), sin(axis 1), …, cos(axis 0), cos(axis 1), …]`: timm's
      `build_sincos2d_pos_embed` default (used by its `vit_*_reg` / Simple-ViT models).
    * `"detr"` — axes first-to-last (`y, x`), each `[sin pω_0, cos pω_0, sin pω_1, …]`
      (DETR's `PositionEmbeddingSine`; the caller gives DETR's 1-based positions).

    Raises:
        ValueError: `d_model` not divisible by `2·A`, an unknown `layout`, `temperature <= 0`.
    """
    if positions.dim() != 2:
        raise ValueError(f"sincos: positions must be [n, A], got {tuple(positions.shape)}")
    axes = positions.shape[-1]
    _check_settings(d_model, axes, layout, temperature)
    nf = d_model // (2 * axes)
    omega = 1.0 / temperature ** (torch.arange(nf, dtype=torch.float64, device=positions.device) / nf)
    phase = positions.to(torch.float64).unsqueeze(-1) * omega  # [n, A, F]
    sin, cos = phase.sin(), phase.cos()
    if layout == "mae":
        out = torch.cat((sin, cos), dim=-1).flip(1)  # [n, A(reversed), 2F]
        out = rearrange(out, "n a f -> n (a f)")
    elif layout == "timm":
        out = rearrange(torch.stack((sin, cos), dim=1), "n s a f -> n (s a f)")
    else:
        out = rearrange(torch.stack((sin, cos), dim=-1), "n a f s -> n (a f s)")
    return out.to(torch.float32)


def _sincos_blocks(axis_positions: list[Tensor], d_model: int, temperature: float,
                   layout: str) -> list[tuple[int, int, Tensor]]:
    """`(axis, first channel, table [s_a, w] float32)` blocks of [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed]'s
    channel layout, one table per axis value (not per token)."""
    axes = len(axis_positions)
    nf = d_model // (2 * axes)
    device = axis_positions[0].device
    omega = 1.0 / temperature ** (torch.arange(nf, dtype=torch.float64, device=device) / nf)
    blocks = []
    for a, values in enumerate(axis_positions):
        phase = values.to(torch.float64).unsqueeze(-1) * omega  # [s_a, F]
        sin, cos = phase.sin().to(torch.float32), phase.cos().to(torch.float32)
        if layout == "mae":  # axes reversed, each [sin, cos]
            blocks.append((a, (axes - 1 - a) * 2 * nf, torch.cat((sin, cos), dim=-1)))
        elif layout == "timm":  # [sin of every axis, cos of every axis]
            blocks += [(a, a * nf, sin), (a, (axes + a) * nf, cos)]
        else:  # detr: axes in order, sin/cos interleaved per frequency
            blocks.append((a, a * 2 * nf, torch.stack((sin, cos), dim=-1).flatten(-2)))
    return blocks


def sincos_separable(axis_positions: list[Tensor], d_model: int, temperature: float = 10000.0,
                     layout: str = "mae") -> Tensor:
    """[`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed] of every cell of a grid with per-axis positions, row-major.

    `axis_positions[a]` `[s_a]` are the positions along axis `a` (grid units); the result
    `[Π s_a, d_model]` float32 equals `sincos_grid_embed` of the cartesian product of the
    axes bit for bit. The sines and cosines are still taken of float64 phases, but only of the
    `Σ s_a` distinct values per frequency instead of `A·Π s_a` (28 instead of 392 rows on a
    14×14 grid); the float32 blocks are then broadcast into place.

    Raises:
        ValueError: as [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed].
    """
    axes = len(axis_positions)
    _check_settings(d_model, axes, layout, temperature)
    shape = [int(p.shape[0]) for p in axis_positions]
    out = torch.empty(*shape, d_model, dtype=torch.float32, device=axis_positions[0].device)
    for a, start, table in _sincos_blocks(axis_positions, d_model, temperature, layout):
        view = [1] * axes + [table.shape[-1]]
        view[a] = shape[a]
        out[..., start:start + table.shape[-1]] = table.view(view)
    return out.reshape(-1, d_model)


@register(
    "sincos", hook="input", needs=(Positioned,), learnable=False, family="absolute",
    aliases=("sincos2d", "sincos_grid"),
    paper="He et al. 2022, Masked Autoencoders Are Scalable Vision Learners (CVPR) — 2D sin-cos; "
          "Carion et al. 2020, End-to-End Object Detection with Transformers (DETR)", context=("d_model",))
class SinCosGrid(SavesSettings, InputEncoding):
    """Fixed 2D/3D sine-cosine embedding added to the patch embeddings (MAE; DETR; Simple ViT).

    Each axis' coordinate gets a 1D sinusoid (Vaswani et al. 2017) over `d_model / A`
    channels (see [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed]). On a grid, positions are cell index × scale and
    prefix tokens (cls, registers) get the zero vector, as MAE's cls token; on any other
    `Positioned` coordinates (points in R^d, lat/lon) the tokens' positions are used as they
    are (an absolute encoding: not invariant to rotations or translations).

    Args:
        d_model: embedding width, divisible by `2·A` (4 in 2D, 6 in 3D).
        temperature: frequency base (10000).
        layout: `"mae"` (default), `"timm"` or `"detr"` (channel order, see above).
        normalize: DETR's option: positions `(i+1)·scale` divided by the last one (+1e-6) and
            multiplied by `2π` (so any grid size spans `(0, 2π]`). With `layout="detr"`
            positions are 1-based as in DETR.

    Shapes: `forward(coords) -> [n, d_model]` (`n = prefix + prod(shape)` on a grid) or
    `[b, n, d_model]` for batched positions.

    Raises:
        ValueError: `d_model` not divisible by `2·A` at forward, unknown layout.
        TypeError: coordinates without positions.
    """

    saved_settings = ("temperature", "layout", "normalize")

    def __init__(self, d_model: int, temperature: float = 10000.0, layout: str = "mae",
                 normalize: bool = False) -> None:
        super().__init__()
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"sincos: d_model must be a positive even int, got {d_model}")
        if layout not in LAYOUTS:
            raise ValueError(f"sincos: layout must be one of {LAYOUTS}, got {layout!r}")
        if not temperature > 0:
            raise ValueError(f"sincos: temperature must be > 0, got {temperature}")
        self.d_model, self.temperature, self.layout = d_model, float(temperature), layout
        self.normalize = bool(normalize)
        # (grid, settings) -> (table, its _version when stored): see forward.
        self._cache: dict[tuple, tuple[Tensor, int]] = {}

    #: distinct grids whose tables are kept; the cache is emptied when it is full.
    cache_size = 8

    def positions(self, coords: Coordinates) -> Tensor:
        """Positions used for the embedding.

        Positions used for the embedding: `[prod(shape), A]` grid tokens on a grid (prefix
        tokens excluded), else every token's `[n, A]` or `[b, n, A]`."""
        if isinstance(coords, GridLayout):
            pos = coords.query_positions[coords.prefix_tokens:]
            if self.layout == "detr" or self.normalize:  # DETR's cumsum: 1-based
                pos = pos + torch.tensor(coords.scale, device=pos.device)
        else:
            # float64 stays float64: absolute time stamps (Unix seconds) lose seconds in float32
            pos = float32(coords.query_positions)
        if self.normalize:
            pos = pos / (pos.amax(dim=-2, keepdim=True) + 1e-6) * (2 * torch.pi)
        return pos

    def axis_positions(self, grid: Grid) -> list[Tensor]:
        """The positions of an mmpe `Grid` as one vector per axis.

        [`positions`][mmpe.encodings.sincos.SinCosGrid.positions] of an mmpe `Grid` as one `[s_a]` vector per axis (its
        positions are the cartesian product of these), with the same float32 arithmetic."""
        cells = grid.query_positions[grid.prefix_tokens:].reshape(*grid.shape, len(grid.shape))
        out = []
        for a in range(len(grid.shape)):
            pos = cells[(0,) * a + (slice(None),) + (0,) * (len(grid.shape) - 1 - a) + (a,)]
            if self.layout == "detr" or self.normalize:
                pos = pos + torch.tensor(grid.scale, device=pos.device)[a]
            if self.normalize:
                pos = pos / (pos.amax() + 1e-6) * (2 * torch.pi)
            out.append(pos)
        return out

    def table(self, coords: Coordinates) -> Tensor:
        """The embedding, computed on every call.

        The embedding, `[n, d_model]` (`[b, n, d_model]` for batched positions) float32,
        computed on every call (float64 phases; no cache)."""
        if type(coords) is Grid:  # separable positions: per-axis tables, same numbers
            pe = sincos_separable(self.axis_positions(coords), self.d_model, self.temperature,
                                  self.layout)
            return zero_prefix(pe, coords.prefix_tokens)
        pos = self.positions(coords)
        flat = sincos_grid_embed(pos.reshape(-1, pos.shape[-1]), self.d_model, self.temperature,
                                 self.layout)
        pe = flat.reshape(*pos.shape[:-1], self.d_model)
        if isinstance(coords, GridLayout):
            pe = zero_prefix(pe, coords.prefix_tokens)
        return pe

    def forward(self, coords: Coordinates) -> Tensor:
        """`[n, d_model]` (`[b, n, d_model]` for batched positions) float32.

        On an mmpe `Grid` the table is cached per (shape, scale, prefix tokens, device,
        `d_model`, `temperature`, `layout`, `normalize`) — everything it is a function
        of — and the same tensor is returned while its version counter is unchanged (an
        in-place edit of a returned table makes the next call rebuild it). Other coordinates
        and compiled graphs (no side effects there) compute it each call.
        """
        self.check_coords(coords)
        # Inference tensors have no version counter, so a table built under inference_mode is
        # neither stored nor checked; cached tables from normal mode are reused there.
        if type(coords) is not Grid or torch.compiler.is_compiling():
            return self.table(coords)
        key = (coords.shape, coords.scale, coords.prefix_tokens, coords.device, self.d_model,
               self.temperature, self.layout, self.normalize)
        hit = self._cache.get(key)
        if hit is not None and hit[0]._version == hit[1]:
            return hit[0]
        pe = self.table(coords)
        if pe.is_inference():
            return pe
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[key] = (pe, pe._version)
        return pe
