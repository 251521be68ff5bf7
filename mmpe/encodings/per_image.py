"""One input encoding per packed image (NaViT / NaFlex): a grid encoding on images of many shapes.

[`PackedGrids`][mmpe.coords.packed_grid.PackedGrids] packs images of different grid shapes into
one sequence; it has no single `GridLayout`, so an input encoding that reads one grid shape
(`learned_grid`, `factorized`, `sincos`, `conv_pe` …) runs through
[`PerImage`][mmpe.encodings.per_image.PerImage] on every image's own
[`Grid`][mmpe.coords.grid.Grid]. Not registered: it wraps a built encoding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.packed_grid import PackedGrids
from mmpe.encodings.base import InputEncoding

__all__ = ["PerImage"]


class PerImage(InputEncoding):
    """An input encoding evaluated on every packed image's own grid (NaFlex's per-image table).

    On [`PackedGrids`][mmpe.coords.packed_grid.PackedGrids] the wrapped encoding runs once per
    distinct image shape on `Grid(shape, prefix_tokens=…)` (as timm's NaFlex groups samples by
    grid size), giving `T_s` `[prefix_tokens + prod(s), d]`, and each token takes its row of its
    image's table: `P[t] = T_{shape(t)}[local index of t]`; padding gets zeros. A learned table
    is thus resampled to each image's grid (`learned_grid`: bicubic with antialiasing, timm's
    `_apply_learned_naflex_pos_embed`; `factorized` with `interpolation_1d="linear"`: timm's
    `_apply_factorized_naflex_pos_embed`), and `sincos` zeroes prefix tokens per image. On any
    other coordinates (a plain `Grid` at evaluation) it is the wrapped encoding.

    Args:
        encoding: a built input encoding (e.g. `mmpe.build("learned_grid", ...)`).

    Shapes: `forward(packed) -> [n, d]` (one pack) or `[b, n, d]` (a batch of packs).

    Raises:
        TypeError: `encoding` is not an input encoding.
        ValueError: the wrapped encoding returns a batched table on a grid.
    """

    def __init__(self, encoding: InputEncoding) -> None:
        super().__init__()
        if not isinstance(encoding, InputEncoding):
            raise TypeError(f"PerImage: encoding must be an input encoding (an InputEncoding "
                            f"module), got {type(encoding).__name__}")
        self.encoding = encoding
        self.registry_name = f"PerImage({getattr(encoding, 'registry_name', type(encoding).__name__)})"

    @property
    def d_model(self) -> int | None:  # type: ignore[override]
        """The wrapped encoding's width (read by `Transformer(input_combine="concat")`)."""
        return getattr(self.encoding, "width", None) or getattr(self.encoding, "d_model", None)

    def forward(self, coords: Coordinates) -> Tensor:
        if not isinstance(coords, PackedGrids):
            return self.encoding(coords)
        tables = []
        for s in coords.distinct_shapes:
            t = self.encoding(coords.grid(s))
            if t.dim() != 2:
                raise ValueError(f"PerImage: {self.registry_name} returned {tuple(t.shape)} on the "
                                 f"grid {s}; per-image tables must be [n, d]")
            tables.append(t)
        flat = torch.cat(tables + [tables[0].new_zeros(1, tables[0].shape[-1])], dim=0)
        return flat[coords.table_rows.to(flat.device)]
