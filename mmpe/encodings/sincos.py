"""2D / 3D sine-cosine position embeddings for grids (MAE, DETR, timm conventions)."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout, Positioned
from mmpe.encodings._grid import zero_prefix
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register

LAYOUTS = ("mae", "timm", "detr")


def sincos_grid_embed(
    positions: Tensor, d_model: int, temperature: float = 10000.0, layout: str = "mae"
) -> Tensor:
    """Sine-cosine embedding of ``positions`` ``[n, A]`` (grid units), ``[n, d_model]`` float32.

    Every axis gets ``d_model / A`` channels: ``F = d_model / (2A)`` frequencies
    ``ω_k = temperature^(−k/F)``, ``k = 0 … F−1``, and ``sin(p·ω_k)``, ``cos(p·ω_k)`` of the
    axis' position ``p``. Layouts (the order of those channels):

    * ``"mae"`` — axes last-to-first (``w, h`` in 2D, as MAE's ``get_2d_sincos_pos_embed``),
      each ``[sin(pω_0 … pω_{F−1}), cos(…)]``. Equals timm
      ``build_sincos2d_pos_embed(reverse_coord=True, interleave_sin_cos=True)`` once its tokens
      (which ``reverse_coord`` orders w-major) are transposed back to row-major.
    * ``"timm"`` — ``[sin(axis 0), sin(axis 1), …, cos(axis 0), cos(axis 1), …]``: timm's
      ``build_sincos2d_pos_embed`` default (used by its ``vit_*_reg`` / Simple-ViT models).
    * ``"detr"`` — axes first-to-last (``y, x``), each ``[sin pω_0, cos pω_0, sin pω_1, …]``
      (DETR's ``PositionEmbeddingSine``; the caller gives DETR's 1-based positions).

    Raises:
        ValueError: ``d_model`` not divisible by ``2·A``, an unknown ``layout``, ``temperature <= 0``.
    """
    if positions.dim() != 2:
        raise ValueError(f"sincos: positions must be [n, A], got {tuple(positions.shape)}")
    axes = positions.shape[-1]
    if d_model <= 0 or d_model % (2 * axes):
        raise ValueError(
            f"sincos: d_model must be divisible by 2·axes = {2 * axes} for a {axes}-axis grid, "
            f"got {d_model}"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"sincos: layout must be one of {LAYOUTS}, got {layout!r}")
    if not temperature > 0:
        raise ValueError(f"sincos: temperature must be > 0, got {temperature}")
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


@register(
    "sincos", hook="input", needs=(Positioned,), learnable=False, family="absolute",
    aliases=("sincos2d", "sincos_grid"),
    paper="He et al. 2022, Masked Autoencoders Are Scalable Vision Learners (CVPR) — 2D sin-cos; "
          "Carion et al. 2020, End-to-End Object Detection with Transformers (DETR)", context=("d_model",))
class SinCosGrid(SavesSettings, InputEncoding):
    """Fixed 2D/3D sine-cosine embedding added to the patch embeddings (MAE; DETR; Simple ViT).

    Each axis' coordinate gets a 1D sinusoid (Vaswani et al. 2017) over ``d_model / A``
    channels (see :func:`sincos_grid_embed`). On a grid, positions are cell index × scale and
    prefix tokens (cls, registers) get the zero vector, as MAE's cls token; on any other
    ``Positioned`` coordinates (points in R^d, lat/lon) the tokens' positions are used as they
    are (an absolute encoding: not invariant to rotations or translations).

    Args:
        d_model: embedding width, divisible by ``2·A`` (4 in 2D, 6 in 3D).
        temperature: frequency base (10000).
        layout: ``"mae"`` (default), ``"timm"`` or ``"detr"`` (channel order, see above).
        normalize: DETR's option: positions ``(i+1)·scale`` divided by the last one (+1e-6) and
            multiplied by ``2π`` (so any grid size spans ``(0, 2π]``). With ``layout="detr"``
            positions are 1-based as in DETR.

    Shapes: ``forward(coords) -> [n, d_model]`` (``n = prefix + prod(shape)`` on a grid) or
    ``[b, n, d_model]`` for batched positions.

    Raises:
        ValueError: ``d_model`` not divisible by ``2·A`` at forward, unknown layout.
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

    def positions(self, coords: Coordinates) -> Tensor:
        """Positions used for the embedding: ``[prod(shape), A]`` grid tokens on a grid (prefix
        tokens excluded), else every token's ``[n, A]`` or ``[b, n, A]``."""
        if isinstance(coords, GridLayout):
            pos = coords.query_positions[coords.prefix_tokens:]
            if self.layout == "detr" or self.normalize:  # DETR's cumsum: 1-based
                pos = pos + torch.tensor(coords.scale, device=pos.device)
        else:
            pos = coords.query_positions.float()
        if self.normalize:
            pos = pos / (pos.amax(dim=-2, keepdim=True) + 1e-6) * (2 * torch.pi)
        return pos

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        pos = self.positions(coords)
        flat = sincos_grid_embed(pos.reshape(-1, pos.shape[-1]), self.d_model, self.temperature,
                                 self.layout)
        pe = flat.reshape(*pos.shape[:-1], self.d_model)
        if isinstance(coords, GridLayout):
            pe = zero_prefix(pe, coords.prefix_tokens)
        return pe
