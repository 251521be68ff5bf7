"""Sinusoidal absolute positional encoding (Vaswani et al. 2017)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """`PE[p, 2i] = sin(p / base^(2i/d))`, `PE[p, 2i+1] = cos(p / base^(2i/d))`.

    Args:
        positions: any-shape tensor of positions (tokens, int or float).
        d_model: even embedding width `d`.
        base: wavelength base (10000 in the paper).

    Returns:
        `[*positions.shape, d_model]` float32. The phase is formed in float64 so that large
            positions keep their precision.
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"sinusoidal: d_model must be a positive even int, got {d_model}")
    i = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    inv_freq = base ** (-i / d_model)
    phase = positions.to(torch.float64).unsqueeze(-1) * inv_freq
    table = torch.stack((phase.sin(), phase.cos()), dim=-1).flatten(-2)
    return table.to(torch.float32)


@register(
    "sinusoidal", hook="input", needs=(Positioned1D,), learnable=False, family="absolute",
    paper="Vaswani et al. 2017, Attention Is All You Need, §3.5", context=("d_model",))
class SinusoidalPE(SavesSettings, InputEncoding):
    """Fixed sinusoidal absolute positions added to token embeddings (Vaswani et al. 2017, §3.5).

    `PE(p, 2i) = sin(p / 10000^(2i/d_model))`, `PE(p, 2i+1) = cos(p / 10000^(2i/d_model))`,
    with `p` the token position. `PE(p + k)` is a fixed linear map (a rotation per
    frequency) of `PE(p)`, which is what the paper offers as a path to relative attention.

    Args:
        d_model: embedding width (even).
        base: wavelength base (default 10000).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]` for batched positions.

    Raises:
        ValueError: odd or non-positive `d_model`; non-positive `base`.
    """

    saved_settings = ("base",)

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"sinusoidal: d_model must be a positive even int, got {d_model}")
        if base <= 0:
            raise ValueError(f"sinusoidal: base must be > 0, got {base}")
        self.d_model, self.base = d_model, float(base)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        return sinusoidal_table(coords.query_positions[..., 0], self.d_model, self.base)
