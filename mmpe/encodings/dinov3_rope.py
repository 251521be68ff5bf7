"""DINOv3 RoPE: axial rotary embedding on normalised patch coordinates.

DINOv3 RoPE: axial rotary embedding on patch coordinates normalised to [-1, 1], with
training-time coordinate augmentation (shift, jitter, rescale)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout
from mmpe.encodings._positions import check_qk
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import apply_rotary, rotation_dtype
from mmpe.registry import register

NORMALIZE = ("separate", "min", "max")


class GridLayout2D(GridLayout):
    """`GridLayout` with two axes (an image's `(H, W)` patches).
    A class qualifies when it provides the members (the shape is set per object); an object when
    `len(shape) == 2`."""

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        if isinstance(coords, type):
            return []
        return [] if len(tuple(getattr(coords, "shape", ()))) == 2 else ["len(shape) == 2"]


def dinov3_periods(head_dim: int, base: float = 100.0) -> Tensor:
    """The `h_d/4` periods (float64, in normalised-coordinate units) of each axis:
    `base^(2j/(h_d/2))` for `j = 0 … h_d/4 − 1` (DINOv3's `base` = 100)."""
    n = head_dim // 4
    return float(base) ** (2.0 * torch.arange(n, dtype=torch.float64) / (head_dim // 2))


def dinov3_coords(shape: tuple[int, int], normalize_coords: str = "separate") -> Tensor:
    """Patch centres `[H·W, 2]` (row-major, `(y, x)`), float64 in `[-1, 1]`:
    `c_a = 2·(i_a + 0.5)/D_a − 1` with `D_a` the axis' own size (`"separate"`) or
    `min(H, W)` / `max(H, W)` for every axis."""
    h, w = shape
    denom = {"separate": (h, w), "min": (min(h, w),) * 2, "max": (max(h, w),) * 2}[normalize_coords]
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) / denom[0]
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) / denom[1]
    grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)
    return 2.0 * grid - 1.0


@register(
    "rope_dinov3", hook="rotary", needs=(GridLayout2D,), learnable=False, family="rotary",
    aliases=("dinov3_rope",),
    paper="Siméoni et al. 2025, DINOv3 (arXiv:2508.10104), RoPE with normalised patch "
          "coordinates and box jittering; reference: facebookresearch/dinov3 "
          "RopePositionEmbedding, timm RotaryEmbeddingDinoV3", context=("head_dim",))
class DINOv3RoPE(SavesSettings, RotaryEncoding):
    """Axial RoPE on patch centres normalised to `[-1, 1]`, augmented in training (DINOv3).

    Patch `(i_y, i_x)` of an `H × W` grid sits at `c_a = 2·(i_a + 0.5)/D_a − 1`
    ([`dinov3_coords`][mmpe.encodings.dinov3_rope.dinov3_coords]): the same image covers
    `[-1, 1]²` at every resolution, so a model trained at 16 × 16 patches reads 32 × 32 as a
    finer sampling of the same square rather than positions it never saw. With the periods
    `P_j = base^(2j/(h_d/2))`, `j < h_d/4`
    ([`dinov3_periods`][mmpe.encodings.dinov3_rope.dinov3_periods]), pair `j` rotates by
    `2π·c_y/P_j` and pair `h_d/4 + j` by `2π·c_x/P_j`; pairs are `(k, k + h_d/2)`
    (`rotate_half`). Prefix tokens (cls, registers) are not rotated.

    In training mode (`module.train()`) with any augmentation set, each forward draws one
    transform of the coordinates, applied to every patch and shared by q and k, in this
    order (DINOv3's and timm's): a shift `c ← c + s`, `s_a ~ U(−shift, shift)` per axis;
    a jitter `c_a ← c_a · e^{u_a}`, `u_a ~ U(−ln J, ln J)` per axis; a rescale
    `c ← c · e^{u}`, `u ~ U(−ln R, ln R)` shared. Coordinates then stay within
    `(1 + shift)·J·R` in absolute value. Draws come from `generator` (else torch's global
    generator, so `torch.manual_seed` reproduces timm's draws) as float32 on the CPU. In
    evaluation mode nothing is drawn and the output equals timm's `RotaryEmbeddingDinoV3`
    applied with `apply_rot_embed_cat(..., half=True)` to the patch tokens
    (`tests/encodings/test_dinov3_rope.py`). A module shared by several layers draws once per call, so
    once per layer (DINOv3 draws once per forward of the whole network).

    Args:
        head_dim: `h_d`, divisible by 4.
        base: period base (DINOv3 and timm: 100). The reference's alternative log-spaced
            `min_period`/`max_period` schedule is not offered.
        normalize_coords: `"separate"` (each axis by its size, default), `"min"` or
            `"max"` (both axes by `min(H, W)` / `max(H, W)`: non-square grids keep their
            aspect ratio).
        shift_coords: `shift > 0`, or None (off; DINOv3's default).
        jitter_coords: factor `J ≥ 1`, or None.
        rescale_coords: factor `R ≥ 1` (the DINOv3 models train with 2), or None.
        generator: a `torch.Generator` for the augmentation draws (not saved).

    Shapes: `forward(q [b, n_h, n, h_d], k [b, n_kv, n, h_d], grid) -> (q, k)` on a 2-axis
    [`Grid`][mmpe.coords.grid.Grid] (any `GridLayout` with `len(shape) == 2`:
    [`GridLayout2D`][mmpe.encodings.dinov3_rope.GridLayout2D]) of `prefix_tokens + H·W` tokens.

    Raises:
        ValueError: `head_dim` not a positive multiple of 4, `base <= 1`, an unknown
            `normalize_coords`, `shift_coords <= 0`, `jitter_coords`/`rescale_coords` < 1
            (or non-finite), a grid of other than 2 axes (the capability check), bad q/k
            shapes.
    """

    saved_settings = ("base", "normalize_coords", "shift_coords", "jitter_coords",
                      "rescale_coords")

    def __init__(
        self,
        head_dim: int,
        base: float = 100.0,
        normalize_coords: str = "separate",
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 \
                or head_dim % 4:
            raise ValueError(f"rope_dinov3: head_dim must be a positive multiple of 4 (two axes "
                             f"of channel pairs), got {head_dim!r}")
        if not (isinstance(base, int | float) and 1 < base < math.inf):
            raise ValueError(f"rope_dinov3: base must be a finite number > 1, got {base!r}")
        if normalize_coords not in NORMALIZE:
            raise ValueError(f"rope_dinov3: normalize_coords must be one of {NORMALIZE}, got "
                             f"{normalize_coords!r}")
        for arg, value, low, rel in (("shift_coords", shift_coords, 0.0, ">"),
                                     ("jitter_coords", jitter_coords, 1.0, ">="),
                                     ("rescale_coords", rescale_coords, 1.0, ">=")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not low <= value < math.inf
                                      or (rel == ">" and value == low)):
                raise ValueError(f"rope_dinov3: {arg} must be None (off) or a finite number "
                                 f"{rel} {low}, got {value!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"rope_dinov3: generator must be a torch.Generator or None, got "
                             f"{type(generator).__name__}")
        self.head_dim, self.base = head_dim, float(base)
        self.normalize_coords = normalize_coords
        self.shift_coords = None if shift_coords is None else float(shift_coords)
        self.jitter_coords = None if jitter_coords is None else float(jitter_coords)
        self.rescale_coords = None if rescale_coords is None else float(rescale_coords)
        self.generator = generator

    @property
    def augments(self) -> bool:
        """Whether a forward now draws a transform (training mode and an augmentation set)."""
        return self.training and any(v is not None for v in (
            self.shift_coords, self.jitter_coords, self.rescale_coords))

    def patch_coords(self, shape: tuple[int, int]) -> Tensor:
        """The coordinates of the patches, augmented in training.

        `[H·W, 2]` float64 coordinates of the patches, augmented when
        [`augments`][mmpe.encodings.dinov3_rope.DINOv3RoPE.augments] (one draw per call)."""
        c = dinov3_coords(shape, self.normalize_coords)
        if not self.augments:
            return c
        g = self.generator
        if self.shift_coords is not None:
            s = self.shift_coords
            c = c + torch.empty(2, dtype=torch.float32).uniform_(-s, s, generator=g).double()
        if self.jitter_coords is not None:
            m = math.log(self.jitter_coords)
            c = c * torch.empty(2, dtype=torch.float32).uniform_(-m, m, generator=g).exp().double()
        if self.rescale_coords is not None:
            m = math.log(self.rescale_coords)
            c = c * torch.empty(1, dtype=torch.float32).uniform_(-m, m, generator=g).exp().double()
        return c

    def phase(self, coords: Coordinates) -> Tensor:
        """Rotation angles of the grid's tokens.

        `[n, h_d/2]` rotation angles (float64, radians) of the grid's tokens, prefix
        tokens at 0."""
        shape = tuple(coords.shape)
        if len(shape) != 2:
            raise ValueError(f"rope_dinov3: needs a 2-axis grid (H, W) of patches, got shape "
                             f"{shape}")
        periods = dinov3_periods(self.head_dim, self.base)
        c = self.patch_coords(shape)  # [HW, 2]
        angles = (2 * math.pi * c.unsqueeze(-1) / periods).flatten(-2)  # [HW, h_d/2]: y then x
        pad = angles.new_zeros(coords.prefix_tokens, angles.shape[-1])
        return torch.cat((pad, angles)).to(coords.device)

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope_dinov3", q, k, self.head_dim, coords)
        phase = self.phase(coords)
        phase = torch.remainder(phase, 2 * math.pi)
        kphase = phase[phase.shape[0] - k.shape[-2]:]
        dq, dk = rotation_dtype(q.dtype), rotation_dtype(k.dtype)
        return (apply_rotary(q, phase.cos().to(dq), phase.sin().to(dq)),
                apply_rotary(k, kphase.cos().to(dk), kphase.sin().to(dk)))
