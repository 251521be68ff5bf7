"""SwinV2 log-spaced continuous position bias (CPB): an MLP over log-scaled grid offsets."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import GridLayout
from mmpe.encodings._cpb_mlp import cpb_mlp
from mmpe.encodings._grid import as_grid, check_ndim, check_shape
from mmpe.encodings._precision import full_precision, term_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.encodings.swin import offset_table_mod
from mmpe.registry import register


def log_relative_coords(shape: tuple[int, ...], ref_shape: tuple[int, ...]) -> Tensor:
    """SwinV2's log-spaced offsets `[Π (2 s_a − 1), A]` for a grid of `shape`.

    Offsets `Δ_a ∈ {−(s_a−1) … s_a−1}` are normalised by the training grid,
    `Δ̂ = 8 Δ / (r_a − 1)` (`r = ref_shape`), then `sign(Δ̂)·log2(1 + |Δ̂|)/log2(8)` (SwinV2 eq. 4
    and its code), so training offsets fill `[−1, 1]` and larger grids extrapolate gently.
    Row-major over the offset grid, matching [`relative_position_index`][mmpe.encodings.swin.relative_position_index].
    """
    axes = [torch.arange(-(s - 1), s, dtype=torch.float32) for s in shape]
    rel = torch.cartesian_prod(*axes).reshape(-1, len(shape))
    denom = torch.tensor([max(r - 1, 1) for r in ref_shape], dtype=torch.float32)
    rel = rel / denom * 8
    return torch.sign(rel) * torch.log2(1.0 + rel.abs()) / math.log2(8)


@register(
    "swinv2_cpb", hook="score", needs=(GridLayout,), learnable=True, family="bias",
    aliases=("cpb", "swinv2"),
    paper="Liu et al. 2022, Swin Transformer V2: Scaling Up Capacity and Resolution (CVPR), "
          "§3.3 log-spaced continuous position bias, eqs. 3-4", context=("num_heads", "grid_shape"))


class SwinV2CPB(SavesSettings, ScoreEncoding):
    """`score + 16·σ(G(Δ̂))[h]`: a small MLP `G` on log-spaced per-axis offsets (SwinV2 §3.3).

    `G` is `A → hidden → n_h` with ReLU (bias on the first layer only, as the official
    code); its output passes `16·sigmoid` (SwinV2's code). Offsets are normalised by the
    training grid ([`log_relative_coords`][mmpe.encodings.swinv2_cpb.log_relative_coords]), so the same MLP gives a bias for any grid shape
    without table interpolation. The MLP runs once per call on the `Π (2 s_a − 1)` offsets;
    pairs gather from that table. Pairs involving prefix tokens get 0 (as timm's `RelPosMlp`).

    Args:
        num_heads: `n_h`.
        grid_shape: the training grid (window), which sets the offset normalisation.
        hidden: MLP width (512 in SwinV2).

    Equals timm's `RelPosMlp(window_size, mode="swin", pretrained_window_size=grid_shape)`
    in eval mode (timm adds dropout 0.125 inside the MLP when training; mmpe has none).

    Raises:
        ValueError: bad `num_heads` / `grid_shape` / `hidden`; a grid with another number of axes.
    """

    saved_settings = ("grid_shape",)  # the offset normalisation
    #: a table over the cell offsets (and prefix kinds) of a grid
    structure = "offset"

    def __init__(self, num_heads: int, grid_shape: tuple[int, ...], hidden: int = 512) -> None:
        super().__init__()
        if num_heads < 1 or hidden < 1:
            raise ValueError(f"swinv2_cpb: num_heads and hidden must be >= 1, got {num_heads}, {hidden}")
        self.grid_shape = check_shape("swinv2_cpb", "grid_shape", grid_shape)
        self.num_heads = num_heads
        self.mlp = nn.Sequential(nn.Linear(len(self.grid_shape), hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_heads, bias=False))
        self._coords_cache: dict[tuple[int, ...], Tensor] = {}

    def table_for(self, shape: tuple[int, ...]) -> Tensor:
        """`[Π (2 s_a − 1), n_h]` biases `16·σ(G(Δ̂))` for every offset of a grid of `shape`."""
        shape = tuple(shape)
        if torch.compiler.is_compiling():  # no side effect in a compiled graph
            coords = log_relative_coords(shape, self.grid_shape)
        else:
            if shape not in self._coords_cache:
                # Built as a normal tensor even under inference_mode: an inference tensor kept
                # in the cache would break the next training forward.
                with torch.inference_mode(False):
                    self._coords_cache[shape] = log_relative_coords(shape, self.grid_shape)
            coords = self._coords_cache[shape]
        coords = coords.to(self.mlp[0].weight.device)
        # A table of Π (2 s_a − 1) rows: computed in float32 (float64 in a float64 module)
        # whatever the autocast dtype (16·σ turns a bf16 rounding of the logit into ±0.03).
        lin1, lin2, t = self.mlp[0], self.mlp[2], term_dtype(self)
        with full_precision(coords.device):
            logits = cpb_mlp(coords.to(t), lin1.weight.to(t), lin1.bias.to(t), lin2.weight.to(t))
            return 16 * torch.sigmoid(logits)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        grid = as_grid("swinv2_cpb", ctx.coords)
        check_ndim("swinv2_cpb", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
        return offset_table_mod(grid, self.table_for(grid.shape), prefix_entries=False)
