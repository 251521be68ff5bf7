"""Native resolution: grids of different shapes packed into one sequence (NaViT / NaFlex).

Patch n' Pack (NaViT; Dehghani et al. 2023, "Patch n' Pack: NaViT, a Vision Transformer for any
Aspect Ratio and Resolution", NeurIPS, §2.1 "Architectural changes") keeps every image at its
own resolution and aspect ratio: each image is cut into its own `h_i × w_i` patch grid, the
patch sequences of several images are concatenated into one row of a fixed token budget
(padding fills the rest), and attention is masked so that a token attends only to tokens of
its own image ("masked self attention"). Positions are per image: patch `(r, c)` of every image
sits at `(r, c)`, and a learned table is factorised or resampled per image size ("factorized &
fractional positional embeddings"; timm's NaFlex ViT resamples its 2D table to each image's
grid, `NaFlexEmbeds._apply_learned_naflex_pos_embed`).

[`PackedGrids`][mmpe.coords.packed_grid.PackedGrids] is the grid counterpart of a
[`Sequence`][mmpe.coords.sequence.Sequence] with `document_ids`: per-token grid positions, image
ids and a block-diagonal mask (`mask_mod` for FlexAttention's BlockMask, `dense_mask` for SDPA).
[`PerImage`][mmpe.encodings.per_image.PerImage] (in `mmpe.encodings`) runs an input encoding
that needs one grid shape (`learned_grid`, `factorized`, `sincos` …) on every image's own
[`Grid`][mmpe.coords.grid.Grid].

    >>> p = PackedGrids([(2, 3), (1, 2)], prefix_tokens=1, max_tokens=12)
    >>> p.num_queries, p.image_ids.tolist()
    (12, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1])
    >>> p.query_positions[7:10].tolist()
    [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.grid import METRICS, Grid

__all__ = ["PackedGrids"]

Shape = tuple[int, ...]


class PackedGrids(Coordinates):
    """Images of different grid shapes packed into one token sequence per row (NaViT, NaFlex).

    Token order in a row: image 0's `prefix_tokens` prefix tokens (a cls token per image, or
    none), then its cells in row-major order, then image 1's, …, then padding up to
    `max_tokens`. Patch `(i_0, …, i_{A−1})` of every image sits at `(i_0, …, i_{A−1})`
    (units: cells, as [`Grid`][mmpe.coords.grid.Grid] with scale 1): positions restart in every
    image, as NaViT's and timm NaFlex's `patch_coord`.

    Args:
        shapes: one pack, a list of image grid shapes (`[(h_0, w_0), (h_1, w_1), …]`, positive
            ints, all with the same number of axes `A`), or a batch of packs, a list of such
            lists (one per row; rows may hold different numbers of images).
        prefix_tokens: coordinate-free tokens before each image's cells (`>= 0`).
        max_tokens: the token budget of a row (NaFlex's `max_seq_len`); rows are padded to it.
            Default: the longest row.
        metric: how per-axis offsets combine into [`distance`][mmpe.coords.packed_grid.PackedGrids.distance]:
            `"euclidean"` (default), `"manhattan"` or `"chebyshev"` (as `Grid`).
        prefix_distance: the distance reported for any pair that involves a prefix or padding
            token (default 0, as `Grid`).
        device: where the tensors live.

    Pairs (the same numbers as each image's own `Grid(shape, prefix_tokens=…)`): `distance`
    is the grid distance of the two tokens' positions (float32 cells); `extent(q)` the
    diagonal of the query's image (padding: `prefix_distance`). Pairs of two images get their
    positions' distance too, but the mask never allows them.

    Mask ([`mask_mod`][mmpe.coords.packed_grid.PackedGrids.mask_mod]): block-diagonal — a query
    attends to the keys of its own image; a padding query attends only to itself (its row stays
    finite); no real query attends to padding.

    Capabilities: `Positioned` (`A` axes; `query_positions` `[n, A]`, or `[b, n, A]` for a
    batch of packs; prefix and padding tokens at 0), `Metric`, and `prefix_tokens`
    (`Prefixed`). Not `GridLayout` (a pack has no single shape: wrap `learned_grid`,
    `factorized`, `sincos`, `conv_pe` … in [`PerImage`][mmpe.encodings.per_image.PerImage])
    and not `Directed` (a grid has no direction), so Toeplitz-only and 1D sequence methods
    (T5's signed buckets, Shaw, CoPE …) raise the capability `TypeError`.

    Raises:
        ValueError: `shapes` empty, a pack empty, a shape not a tuple of positive ints or with
            another number of axes than the first, negative `prefix_tokens`, a row longer than
            `max_tokens` (naming the row and both counts), an unknown `metric`, a negative
            `prefix_distance`.
    """

    kind = "packed_grids"
    capability_note = ("PackedGrids holds several grid shapes: wrap input encodings that read one "
                       "GridLayout in mmpe.PerImage; it has no direction (Directed)")
    prefix_tokens: int
    num_axes: int

    def __init__(
        self,
        shapes: Seq[Seq[int]] | Seq[Seq[Seq[int]]],
        *,
        prefix_tokens: int = 0,
        max_tokens: int | None = None,
        metric: str = "euclidean",
        prefix_distance: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        packs, self.batched = _check_packs(shapes)
        if not _is_int(prefix_tokens) or prefix_tokens < 0:
            raise ValueError(f"PackedGrids: prefix_tokens must be an int >= 0, got {prefix_tokens!r}")
        prefix_tokens = int(prefix_tokens)
        if metric not in METRICS:
            raise ValueError(f"PackedGrids: metric must be one of {METRICS}, got {metric!r}")
        if not (isinstance(prefix_distance, (int, float)) and 0 <= prefix_distance < math.inf):
            raise ValueError(f"PackedGrids: prefix_distance must be a finite float >= 0, got "
                             f"{prefix_distance!r}")
        self.image_shapes: list[list[Shape]] = packs
        self.prefix_tokens, self.metric = prefix_tokens, metric
        self.prefix_distance = float(prefix_distance)
        self.num_axes = len(packs[0][0])
        lengths = [sum(prefix_tokens + math.prod(s) for s in pack) for pack in packs]
        longest = max(lengths)
        if max_tokens is None:
            max_tokens = longest
        if not _is_int(max_tokens) or max_tokens < 1:
            raise ValueError(f"PackedGrids: max_tokens must be a positive int, got {max_tokens!r}")
        max_tokens = int(max_tokens)
        for r, length in enumerate(lengths):
            if length > max_tokens:
                raise ValueError(f"PackedGrids: row {r} holds {length} tokens ({prefix_tokens} "
                                 f"prefix + cells per image of {packs[r]}) but max_tokens is "
                                 f"{max_tokens}")
        self.max_tokens = max_tokens
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._build(lengths)

    # -- construction -------------------------------------------------------------------
    def _build(self, lengths: list[int]) -> None:
        rows, n, a, p = len(self.image_shapes), self.max_tokens, self.num_axes, self.prefix_tokens
        distinct: dict[Shape, int] = {}
        for pack in self.image_shapes:
            for s in pack:
                distinct.setdefault(s, len(distinct))
        self.distinct_shapes: list[Shape] = list(distinct)
        # Rows of the concatenated per-shape tables (PerImage): shape k starts at starts[k].
        sizes = [p + math.prod(s) for s in self.distinct_shapes]
        starts = [0]
        for size in sizes:
            starts.append(starts[-1] + size)
        pos = torch.zeros(rows, n, a, dtype=torch.float32)
        image = torch.full((rows, n), -1, dtype=torch.long)
        flat_image = torch.full((rows, n), -1, dtype=torch.long)
        prefix = torch.zeros(rows, n, dtype=torch.bool)
        extent = torch.full((rows, n), self.prefix_distance, dtype=torch.float32)
        table_row = torch.full((rows, n), starts[-1], dtype=torch.long)  # padding: a zero row
        slots: list[Tensor] = []  # per image, flat: its token slots in the [rows·n] layout
        count = 0
        for r, pack in enumerate(self.image_shapes):
            t = 0
            for i, s in enumerate(pack):
                size = p + math.prod(s)
                grid = Grid(s, prefix_tokens=p, metric=self.metric)
                pos[r, t:t + size] = grid.query_positions
                image[r, t:t + size] = i
                flat_image[r, t:t + size] = count
                prefix[r, t:t + p] = True
                extent[r, t:t + size] = grid.diagonal
                table_row[r, t:t + size] = starts[distinct[s]] + torch.arange(size)
                slots.append(torch.arange(r * n + t, r * n + t + size))
                t, count = t + size, count + 1
        dev = self._device
        self._pos = pos.to(dev)
        self._image = image.to(dev)
        self._flat_image = flat_image.to(dev)
        self._real = (image >= 0).to(dev)
        self._coordless = (prefix | (image < 0)).to(dev)
        self._prefix = prefix.to(dev)
        self._extent = extent.to(dev)
        self._table_row = table_row.to(dev)
        self._slots = [s.to(dev) for s in slots]
        self.num_images = count
        self._padded = any(length < n for length in lengths)
        # What the pairwise members gather from: [rows, n] for a batch, [n] for one pack.
        pick = (lambda x: x) if self.batched else (lambda x: x[0])
        self._axis_pos = [pick(self._pos[..., k]).contiguous() for k in range(a)]
        self._ids = pick(self._image).contiguous()
        self._cl = pick(self._coordless).contiguous()
        self._ext = pick(self._extent).contiguous()

    @classmethod
    def from_images(cls, sizes: Seq[Seq[int]], patch_size: int | Seq[int], **kwargs) -> PackedGrids:
        """One pack of images of `sizes` `[(H_0, W_0), …]` pixels cut into `patch_size` patches.

        Raises:
            ValueError: a size not divisible by the patch size (as `Grid.from_image`).
        """
        shapes = [Grid.from_image(int(h), int(w), patch_size).shape for h, w in sizes]
        return cls(shapes, **kwargs)

    @classmethod
    def first_fit(cls, shapes: Seq[Seq[int]], max_tokens: int, **kwargs) -> PackedGrids:
        """Pack images into as few rows of `max_tokens` tokens as first-fit finds.

        Pack images into as few rows of `max_tokens` tokens as first-fit finds (NaViT §2.1:
        greedy packing), in the given order; `source` maps the packed images back.

        Args:
            shapes: image grid shapes, in data order.
            max_tokens: the row budget.
            **kwargs: as the constructor (`prefix_tokens`, `metric` …).

        Returns:
            A batched `PackedGrids`; its `source` `[num_images]` maps packed images to `shapes`.

        Raises:
            ValueError: an image longer than `max_tokens` on its own, or as the constructor.
        """
        packs, _ = _check_packs(shapes)
        if len(packs) != 1:
            raise ValueError("PackedGrids.first_fit: shapes must be one list of image shapes")
        p = kwargs.get("prefix_tokens", 0)
        rows: list[list[int]] = []
        free: list[int] = []
        for i, s in enumerate(packs[0]):
            size = (int(p) if _is_int(p) else 0) + math.prod(s)
            if size > max_tokens:
                raise ValueError(f"PackedGrids.first_fit: image {i} of shape {s} needs {size} "
                                 f"tokens, more than max_tokens={max_tokens}")
            r = next((r for r, f in enumerate(free) if f >= size), None)
            if r is None:
                rows.append([])
                free.append(max_tokens)
                r = len(rows) - 1
            rows[r].append(i)
            free[r] -= size
        out = cls([[packs[0][i] for i in row] for row in rows], max_tokens=max_tokens, **kwargs)
        out._source = torch.tensor([i for row in rows for i in row], device=out._device)
        return out

    def to(self, device: torch.device | str) -> PackedGrids:
        """These packs on another device."""
        out = PackedGrids(self.image_shapes if self.batched else self.image_shapes[0],
                          prefix_tokens=self.prefix_tokens, max_tokens=self.max_tokens,
                          metric=self.metric, prefix_distance=self.prefix_distance, device=device)
        if hasattr(self, "_source"):
            out._source = self._source.to(device)
        return out

    def grid(self, shape: Seq[int]) -> Grid:
        """The `Grid` one image of `shape` would have alone.

        The [`Grid`][mmpe.coords.grid.Grid] one image of `shape` would have alone (same
        prefix tokens, metric, prefix distance, device)."""
        return Grid(tuple(shape), prefix_tokens=self.prefix_tokens, metric=self.metric,
                    prefix_distance=self.prefix_distance, device=self._device)

    def grids(self) -> list[Grid]:
        """Every image's own `Grid`, in packed order (row by row)."""
        return [self.grid(s) for pack in self.image_shapes for s in pack]

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_queries(self) -> int:
        return self.max_tokens

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def source(self) -> Tensor:
        """Each packed image's index in the input order.

        `[num_images]` int64: each packed image's index in the input order (identity unless
        built by [`first_fit`][mmpe.coords.packed_grid.PackedGrids.first_fit])."""
        if hasattr(self, "_source"):
            return self._source
        return torch.arange(self.num_images, device=self._device)

    def image_tokens(self) -> list[int]:
        """Tokens of each image (`prefix_tokens + prod(shape)`), in packed order."""
        return [self.prefix_tokens + math.prod(s) for pack in self.image_shapes for s in pack]

    # -- positions ---------------------------------------------------------------------------
    @property
    def query_positions(self) -> Tensor:
        """Each token's cell in its own image.

        `[n, A]` (one pack) or `[b, n, A]` float32: each token's cell in its own image
        (cells); prefix and padding tokens at 0."""
        return self._pos if self.batched else self._pos[0]

    @property
    def key_positions(self) -> Tensor:
        """The same tokens as the queries (self-attention)."""
        return self.query_positions

    @property
    def image_ids(self) -> Tensor:
        """The image of each token.

        `[n]` or `[b, n]` int64: the image of each token, numbered from 0 in each row;
        −1 at padding."""
        return self._image if self.batched else self._image[0]

    @property
    def prefix_mask(self) -> Tensor:
        """`[n]` or `[b, n]` bool, True at prefix tokens."""
        return self._prefix if self.batched else self._prefix[0]

    @property
    def key_mask(self) -> Tensor | None:
        """`[n]` or `[b, n]` bool, True at real (image) tokens; None without padding."""
        if not self._padded:
            return None
        return self._real if self.batched else self._real[0]

    @property
    def table_rows(self) -> Tensor:
        """The row of each token in the tables of the distinct shapes.

        `[n]` or `[b, n]` int64: the row of each token in the tables of
        [`distinct_shapes`][mmpe.coords.packed_grid.PackedGrids] concatenated in order (each
        `prefix_tokens + prod(shape)` rows); padding points one past the last row."""
        return self._table_row if self.batched else self._table_row[0]

    # -- pairs -------------------------------------------------------------------------------
    def _at(self, t: Tensor, idx: Tensor, b: Tensor | None) -> Tensor:
        if not self.batched:
            return t[idx]
        if b is None:
            raise ValueError("PackedGrids: a batch of packs needs the batch index b")
        return t[b, idx]

    def is_prefix(self, idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Whether token `idx` is a prefix or padding token (no coordinate), bool."""
        return self._at(self._cl, idx, b)

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Grid distance of the two tokens' positions.

        Grid distance of the two tokens' positions (float32 cells, the pack's `metric`);
        `prefix_distance` where either is a prefix or padding token."""
        acc = None
        for pos in self._axis_pos:
            d = self._at(pos, q_idx, b) - self._at(pos, kv_idx, b)
            d = d * d if self.metric == "euclidean" else d.abs()
            if acc is None:
                acc = d
            else:
                acc = torch.maximum(acc, d) if self.metric == "chebyshev" else acc + d
        dist = torch.sqrt(acc) if self.metric == "euclidean" else acc
        coordless = self._at(self._cl, q_idx, b) | self._at(self._cl, kv_idx, b)
        return torch.where(coordless, torch.full_like(dist, self.prefix_distance), dist)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The diagonal of the query's image.

        The diagonal of the query's image (float32 cells; `Grid.diagonal`);
        `prefix_distance` at padding."""
        return self._at(self._ext, q_idx, b)

    def mask_mod(self) -> MaskMod | None:
        """Block-diagonal `mask_mod`: same image, or the token itself.

        Block-diagonal `mask_mod(b, h, q_idx, kv_idx)`: same image, or the token itself
        (a padding query sees only itself). None when every row is one unpadded image."""
        if not self._padded and all(len(pack) == 1 for pack in self.image_shapes):
            return None
        ids, at = self._ids, self._at

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            iq, ik = at(ids, q_idx, b), at(ids, kv_idx, b)
            return ((iq == ik) & (ik >= 0)) | (q_idx == kv_idx)

        return mask

    # -- tokens ------------------------------------------------------------------------------
    def pack(self, tokens: Seq[Tensor], prefix: Tensor | None = None) -> Tensor:
        """Place per-image tokens into the packed layout.

        Place per-image tokens into the packed layout, `[b, n, d]` (b = 1 for one pack),
        zeros at padding.

        Args:
            tokens: one tensor per image, in packed order: `[prod(shape_i), d]` when `prefix`
                is given, else `[prefix_tokens + prod(shape_i), d]`.
            prefix: `[prefix_tokens, d]`, put before every image's cells (a learned cls).

        Raises:
            ValueError: a wrong number of tensors, or one of the wrong shape (naming it).
        """
        if len(tokens) != self.num_images:
            raise ValueError(f"PackedGrids.pack: tokens must hold {self.num_images} tensors (one "
                             f"per image), got {len(tokens)}")
        p = self.prefix_tokens
        if prefix is not None and (prefix.dim() != 2 or prefix.shape[0] != p):
            raise ValueError(f"PackedGrids.pack: prefix must be [{p}, d], got {tuple(prefix.shape)}")
        parts = []
        for i, (t, want) in enumerate(zip(tokens, self.image_tokens(), strict=True)):
            cells = want - p if prefix is not None else want
            if t.dim() != 2 or t.shape[0] != cells or (parts and t.shape[1] != parts[-1].shape[1]):
                raise ValueError(f"PackedGrids.pack: tokens[{i}] must be [{cells}, d] (image of "
                                 f"{want - p} cells{'' if prefix is not None else f' + {p} prefix'}"
                                 f"), got {tuple(t.shape)}")
            if prefix is not None and p:
                t = torch.cat((prefix.to(t.dtype), t), dim=0)
            parts.append(t)
        flat = torch.cat(parts, dim=0)
        rows = len(self.image_shapes)
        out = flat.new_zeros(rows * self.max_tokens, flat.shape[-1])
        out = out.index_copy(0, torch.cat(self._slots).to(flat.device), flat)
        return out.view(rows, self.max_tokens, -1)

    def _check_packed(self, x: Tensor, name: str) -> Tensor:
        rows = len(self.image_shapes)
        if x.dim() != 3 or x.shape[0] != rows or x.shape[1] != self.max_tokens:
            raise ValueError(f"PackedGrids.{name}: x must be [{rows}, {self.max_tokens}, d] (rows, "
                             f"max_tokens, channels), got {tuple(x.shape)}")
        return x.reshape(rows * self.max_tokens, -1)

    def unpack(self, x: Tensor) -> list[Tensor]:
        """Per-image tokens `[prefix_tokens + prod(shape_i), d]` of packed `x` `[b, n, d]`."""
        flat = self._check_packed(x, "unpack")
        return [flat[s.to(flat.device)] for s in self._slots]

    def pool(self, x: Tensor, mode: str = "mean") -> Tensor:
        """One vector per image.

        One vector per image, `[num_images, d]`: the mean of its cell tokens (`"mean"`,
        NaViT's pooling of a packed row, padding and prefix excluded) or its first prefix
        token (`"first"`, a per-image cls token).

        Raises:
            ValueError: `x` not `[b, n, d]`, an unknown `mode`, `"first"` without prefix tokens.
        """
        flat = self._check_packed(x, "pool")
        if mode == "first":
            if not self.prefix_tokens:
                raise ValueError("PackedGrids.pool: mode='first' needs prefix_tokens >= 1")
            return flat[torch.stack([s[0] for s in self._slots]).to(flat.device)]
        if mode != "mean":
            raise ValueError(f"PackedGrids.pool: mode must be 'mean' or 'first', got {mode!r}")
        ids = self._flat_image.reshape(-1).to(flat.device)
        keep = (ids >= 0) & ~self._prefix.reshape(-1).to(flat.device)
        sums = flat.new_zeros(self.num_images, flat.shape[-1]).index_add(0, ids[keep], flat[keep])
        counts = torch.tensor([math.prod(s) for pack in self.image_shapes for s in pack],
                              dtype=flat.dtype, device=flat.device)
        return sums / counts[:, None]

    def __repr__(self) -> str:
        return (f"PackedGrids(shapes={self.image_shapes if self.batched else self.image_shapes[0]}, "
                f"prefix_tokens={self.prefix_tokens}, max_tokens={self.max_tokens})")


def _is_shape(x: object) -> bool:
    if isinstance(x, Tensor):
        x = x.tolist()
    return (isinstance(x, (tuple, list, torch.Size)) and len(x) > 0
            and all(_is_int(v) for v in x))


def _is_int(v: object) -> bool:
    """An integer, Python's or numpy's (not a bool)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_)


def _check_packs(shapes: object) -> tuple[list[list[Shape]], bool]:
    """`(packs, batched)`: one list of shapes per row, and whether a batch of packs was given."""
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise ValueError(f"PackedGrids: shapes must be a non-empty list of image grid shapes (or a "
                         f"list of such lists, one per row), got {shapes!r}")
    batched = not _is_shape(shapes[0])
    packs = list(shapes) if batched else [shapes]
    out: list[list[Shape]] = []
    ndim = None
    for r, pack in enumerate(packs):
        where = f"shapes[{r}]" if batched else "shapes"
        if not isinstance(pack, (list, tuple)) or not pack:
            raise ValueError(f"PackedGrids: {where} must be a non-empty list of image grid shapes, "
                             f"got {pack!r}")
        row = []
        for i, s in enumerate(pack):
            if not _is_shape(s) or any(v <= 0 for v in (s.tolist() if isinstance(s, Tensor) else s)):
                raise ValueError(f"PackedGrids: {where}[{i}] must be a tuple of positive ints (cells "
                                 f"per axis), got {s!r}")
            s = tuple(int(v) for v in (s.tolist() if isinstance(s, Tensor) else s))
            if ndim is None:
                ndim = len(s)
            if len(s) != ndim:
                raise ValueError(f"PackedGrids: {where}[{i}] = {s} has {len(s)} axes but the first "
                                 f"image has {ndim}; every image needs the same number of axes")
            row.append(s)
        out.append(row)
    return out, batched

