"""Scaled sinusoidal absolute positions: a learned scalar gain (Hua et al. 2022, FLASH)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.registry import register


@register(
    "scaled_sinusoidal", hook="input", needs=(Positioned1D,), learnable=True, family="absolute",
    paper="Hua, Dai, Liu & Le 2022, Transformer Quality in Linear Time (ICML), App. A "
          "(ScaledSinuEmbedding); x-transformers' ScaledSinusoidalEmbedding", context=("d_model",))
class ScaledSinusoidalPE(SavesSettings, InputEncoding):
    """`P(p) = α · PE(p)`: the fixed sinusoid of Vaswani et al. times one learned scalar `α`.

    `PE(p, 2i) = sin(p/10000^{2i/d})`, `PE(p, 2i+1) = cos(…)` (interleaved; x-transformers
    concatenates the halves, the same channels permuted). `α` starts at `d^{-1/2}`
    (x-transformers), so the positional signal enters at the scale of small-initialised token
    embeddings and the model learns how much of it to keep.

    Args:
        d_model: embedding width (even).
        base: wavelength base (10000).
        init_scale: initial `α`; default `d_model^{-1/2}`.

    Raises:
        ValueError: odd or non-positive `d_model`, `base ≤ 0`.
    """

    saved_settings = ("base",)

    def __init__(self, d_model: int, base: float = 10000.0, init_scale: float | None = None) -> None:
        super().__init__()
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"scaled_sinusoidal: d_model must be a positive even int, got {d_model}")
        if base <= 0:
            raise ValueError(f"scaled_sinusoidal: base must be > 0, got {base}")
        self.d_model, self.base = d_model, float(base)
        self.scale = nn.Parameter(torch.tensor(d_model ** -0.5 if init_scale is None else float(init_scale)))

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        return self.scale * sinusoidal_table(coords.query_positions[..., 0], self.d_model, self.base)
