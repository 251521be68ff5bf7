"""Regular grids: image patches (H, W), video tubelets (T, H, W), spectrogram patches (time, freq).

Token order is `prefix_tokens` tokens first (cls, registers: no coordinate), then the grid
cells in row-major (C) order — the layout of a timm/ViT token sequence. A grid provides the
`Metric`, `Positioned` and `GridLayout` capabilities ([`mmpe.coords.capabilities`][mmpe.coords.capabilities]).

    >>> g = Grid((2, 3), prefix_tokens=1)
    >>> g.num_queries
    7
    >>> g.query_positions[1:3].tolist()
    [[0.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.coords.base import StoredPositions

METRICS = ("euclidean", "manhattan", "chebyshev")
_DEFAULT_AXES = {1: ("t",), 2: ("h", "w"), 3: ("t", "h", "w")}


class Grid(StoredPositions):
    """Tokens on a regular `A`-dimensional grid, optionally after `prefix_tokens` tokens.

    Args:
        shape: cells per axis, e.g. `(H, W)` patches, `(T, H, W)` tubelets or
            `(time, freq)` spectrogram patches; positive ints.
        prefix_tokens: tokens before the grid (cls, registers, distillation) that carry no
            coordinate (`>= 0`).
        scale: spacing of neighbouring cells per axis (positive floats; default 1 = units of
            cells). E.g. `(2.0, 1.0)` for tubelets two frames long, or a spectrogram's
            seconds/mel bins per patch.
        axes: a name per axis (default `("h", "w")` in 2D, `("t", "h", "w")` in 3D,
            `("a0", …)` otherwise).
        prefix_distance: the distance (and relation) reported for any pair that involves a
            prefix token (default 0: distance-based biases treat them as "everywhere").
        metric: how per-axis offsets combine into [`distance`][mmpe.coords.grid.Grid.distance]: `"euclidean"` (L2,
            default), `"manhattan"` (L1, the sum of per-axis distances) or `"chebyshev"`
            (L∞, the largest per-axis distance).
        device: where the position tensors live.

    Positions: cell `(i_0, …, i_{A-1})` sits at `(i_0·scale_0, …, i_{A-1}·scale_{A-1})`.
    Prefix tokens get the position `0` on every axis (so a rotary encoding leaves them
    unrotated, as timm does), and [`is_prefix`][mmpe.coords.grid.Grid.is_prefix] lets an encoding treat them separately.

    Pairs: [`offset`][mmpe.coords.grid.Grid.offset] is the signed per-axis offset `pos_q − pos_k` (scaled units);
    [`distance`][mmpe.coords.grid.Grid.distance] is the Euclidean distance in scaled units (or L1 / L∞, see `metric`);
    [`extent`][mmpe.coords.grid.Grid.extent] is the grid diagonal. Pairs involving a prefix token get `prefix_distance`
    and offset 0. A grid has no single direction, so it is not `Directed`.

    Capabilities: `Metric`, `Positioned` (`A` axes), `GridLayout`.

    Raises:
        ValueError: empty `shape` or non-positive / non-int entries, negative or non-int
            `prefix_tokens`, `scale`/`axes` of the wrong length, non-positive scale,
            duplicate axis names.
    """

    kind = "grid"
    shape: tuple[int, ...]
    prefix_tokens: int

    def __init__(
        self,
        shape: Seq[int],
        *,
        prefix_tokens: int = 0,
        scale: Seq[float] | None = None,
        axes: Seq[str] | None = None,
        prefix_distance: float = 0.0,
        metric: str = "euclidean",
        device: torch.device | str | None = None,
    ) -> None:
        self.shape = _check_shape(shape)
        ndim = len(self.shape)
        if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
            raise ValueError(f"Grid: prefix_tokens must be an int >= 0, got {prefix_tokens!r}")
        if scale is None:
            scale = (1.0,) * ndim
        if isinstance(scale, int | float) and not isinstance(scale, bool):
            scale = (scale,) * ndim  # one spacing for every axis
        if isinstance(scale, str | bytes) or not isinstance(scale, Iterable) or not all(
                isinstance(s, int | float) and not isinstance(s, bool) for s in scale):
            raise ValueError(f"Grid: scale must be a positive finite float or {ndim} of them "
                             f"(one per axis), got {scale!r}")
        scale = tuple(float(s) for s in scale)
        if len(scale) != ndim or any(not (s > 0 and math.isfinite(s)) for s in scale):
            raise ValueError(
                f"Grid: scale must hold {ndim} positive finite floats (one per axis), got {scale}"
            )
        if axes is None:
            axes = _DEFAULT_AXES.get(ndim, tuple(f"a{i}" for i in range(ndim)))
        axes = tuple(str(a) for a in axes)
        if len(axes) != ndim or len(set(axes)) != ndim:
            raise ValueError(f"Grid: axes must be {ndim} distinct names, got {axes}")
        if not prefix_distance >= 0:
            raise ValueError(f"Grid: prefix_distance must be >= 0, got {prefix_distance}")
        if metric not in METRICS:
            raise ValueError(f"Grid: metric must be one of {METRICS}, got {metric!r}")
        self.metric = metric
        self.prefix_tokens, self.scale, self.axes = prefix_tokens, scale, axes
        self.prefix_distance = float(prefix_distance)
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        # Integer cell index per grid token, [N, A], row-major.
        idx = torch.cartesian_prod(*(torch.arange(s, device=self._device) for s in self.shape))
        idx = idx.reshape(-1, ndim)
        self._grid_index = idx
        pos = idx.to(torch.float32) * torch.tensor(scale, device=self._device)
        pos = torch.cat((torch.zeros(prefix_tokens, ndim, device=self._device), pos), dim=0)
        self._pos = pos  # [n, A] float32
        self._axis_pos = [pos[:, a].contiguous() for a in range(ndim)]  # A × [n] (flex gathers)
        prefix = torch.zeros(self.num_tokens, dtype=torch.bool, device=self._device)
        prefix[:prefix_tokens] = True
        self._prefix = prefix

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_image(
        cls,
        height: int,
        width: int,
        patch_size: int | Seq[int],
        prefix_tokens: int = 0,
        **kwargs,
    ) -> Grid:
        """The patch grid of a `height × width` image cut into `patch_size` patches.

        Raises:
            ValueError: non-positive sizes, or a size not divisible by the patch size (the
                message names both numbers).
        """
        ph, pw = _pair(patch_size, "patch_size")
        for name, val in (("height", height), ("width", width)):
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"Grid.from_image: {name} must be a positive int (pixels), got {val!r}")
        if height % ph or width % pw:
            raise ValueError(
                f"Grid.from_image: image size {height}x{width} is not divisible by patch size "
                f"{ph}x{pw}; resize or pad the image to a multiple of the patch size"
            )
        return cls((height // ph, width // pw), prefix_tokens=prefix_tokens, **kwargs)

    def with_shape(self, new_shape: Seq[int]) -> Grid:
        """The same grid (prefix tokens, scale, axes, device) with a new shape (new resolution).

        Raises:
            ValueError: `new_shape` of a different number of axes, or invalid entries.
        """
        new_shape = _check_shape(new_shape)
        if len(new_shape) != len(self.shape):
            raise ValueError(
                f"Grid.with_shape: new_shape must have {len(self.shape)} axes like {self.shape}, "
                f"got {new_shape}"
            )
        return Grid(new_shape, prefix_tokens=self.prefix_tokens, scale=self.scale, axes=self.axes,
                    prefix_distance=self.prefix_distance, metric=self.metric, device=self._device)

    def to(self, device: torch.device | str) -> Grid:
        """This grid on another device."""
        return Grid(self.shape, prefix_tokens=self.prefix_tokens, scale=self.scale, axes=self.axes,
                    prefix_distance=self.prefix_distance, metric=self.metric, device=device)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of axes `A`."""
        return len(self.shape)

    @property
    def num_cells(self) -> int:
        """Grid tokens `prod(shape)` (excluding prefix tokens)."""
        return math.prod(self.shape)

    @property
    def num_tokens(self) -> int:
        """All tokens: `prefix_tokens + prod(shape)`."""
        return self.prefix_tokens + self.num_cells

    @property
    def num_queries(self) -> int:
        return self.num_tokens




    def check_tokens(self, x: Tensor | int, name: str = "x") -> None:
        """Raise `ValueError` unless `x` (`[b, n, d]`, `[n, d]` or a count) has `n` tokens."""
        n = x if isinstance(x, int) else (x.shape[-2] if isinstance(x, Tensor) and x.dim() >= 2 else None)
        if n is None:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"Grid: {name} must be [b, n, d], [n, d] or a token count, got {shape}")
        if n != self.num_tokens:
            raise ValueError(
                f"Grid: {name} has {n} tokens but the grid {self.shape} with "
                f"{self.prefix_tokens} prefix tokens has {self.num_tokens} "
                f"({self.prefix_tokens} + {'x'.join(map(str, self.shape))})"
            )

    # -- positions -------------------------------------------------------------------------
    @property
    def num_axes(self) -> int:
        """Axes of the positions `A` (same as [`ndim`][mmpe.coords.grid.Grid.ndim])."""
        return len(self.shape)

    @property
    def grid_index(self) -> Tensor:
        """`[prod(shape), A]` int64 cell indices of the grid tokens (no prefix), row-major."""
        return self._grid_index

    @property
    def grid_positions(self) -> Tensor:
        """`[prod(shape), A]` float32 scaled positions of the grid tokens (no prefix)."""
        return self._pos[self.prefix_tokens:]

    @property
    def prefix_mask(self) -> Tensor:
        """`[n]` bool, True for prefix tokens."""
        return self._prefix

    def is_prefix(self, idx: Tensor) -> Tensor:
        """Whether token `idx` is a prefix token (bool, `idx`'s shape)."""
        return idx < self.prefix_tokens

    def cell_index(self, idx: Tensor, axis: int) -> Tensor:
        """Integer cell index along `axis` of token `idx` (0 for prefix tokens), int64."""
        g = (idx - self.prefix_tokens).clamp(min=0)
        stride = math.prod(self.shape[axis + 1:])
        return torch.where(self.is_prefix(idx), torch.zeros_like(g), (g // stride) % self.shape[axis])

    # -- pairs -------------------------------------------------------------------------
    def _axis(self, axis: int | str) -> int:
        if isinstance(axis, str):
            if axis not in self.axes:
                raise ValueError(f"Grid: unknown axis {axis!r}; axes are {self.axes}")
            return self.axes.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise ValueError(f"Grid: axis must be in [0, {self.ndim}), got {axis}")
        return axis % self.ndim

    def offset(self, q_idx: Tensor, kv_idx: Tensor, axis: int | str) -> Tensor:
        """Signed offset `pos_q − pos_k` along `axis` (scaled units, float32); 0 for prefix pairs."""
        pos = self._axis_pos[self._axis(axis)]
        off = pos[q_idx] - pos[kv_idx]
        if self.prefix_tokens:
            prefix = self.is_prefix(q_idx) | self.is_prefix(kv_idx)
            off = torch.where(prefix, torch.zeros_like(off), off)
        return off

    def offsets(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        """All per-axis signed offsets, `[*broadcast, A]` float32."""
        return torch.stack([self.offset(q_idx, kv_idx, a) for a in range(self.ndim)], dim=-1)

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Distance in scaled units (float32, the grid's `metric`); `prefix_distance` for prefix pairs."""
        acc = None
        for pos in self._axis_pos:
            d = pos[q_idx] - pos[kv_idx]
            if self.metric == "euclidean":
                d = d * d
            else:
                d = d.abs()
            if acc is None:
                acc = d
            else:
                acc = torch.maximum(acc, d) if self.metric == "chebyshev" else acc + d
        dist = torch.sqrt(acc) if self.metric == "euclidean" else acc
        if self.prefix_tokens:
            prefix = self.is_prefix(q_idx) | self.is_prefix(kv_idx)
            dist = torch.where(prefix, torch.full_like(dist, self.prefix_distance), dist)
        return dist

    @property
    def diagonal(self) -> float:
        """The largest distance between two cells: the diagonal in the grid's metric (scaled units).

        Euclidean `sqrt(Σ ((s_a − 1)·scale_a)²)`; Manhattan `Σ`; Chebyshev `max`.
        """
        spans = [(s - 1) * c for s, c in zip(self.shape, self.scale, strict=True)]
        if self.metric == "manhattan":
            return float(sum(spans))
        if self.metric == "chebyshev":
            return float(max(spans))
        return math.sqrt(sum(x * x for x in spans))

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The grid diagonal (largest distance between two cells), float32 of `q_idx`'s shape."""
        return torch.full_like(q_idx, self.diagonal, dtype=torch.float32)

    def __repr__(self) -> str:
        return (f"Grid(shape={self.shape}, prefix_tokens={self.prefix_tokens}, scale={self.scale}, "
                f"axes={self.axes})")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Grid) and self.shape == other.shape
                and self.prefix_tokens == other.prefix_tokens and self.scale == other.scale
                and self.axes == other.axes and self.metric == other.metric)

    __hash__ = None  # type: ignore[assignment]


def _check_shape(shape: Seq[int]) -> tuple[int, ...]:
    if isinstance(shape, Tensor):
        shape = shape.tolist()
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValueError(f"Grid: shape must be a tuple of positive ints, got {shape!r}") from None
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in shape):
        raise ValueError(f"Grid: shape must be a non-empty tuple of positive ints, got {shape!r}")
    return shape


def _pair(value: int | Seq[int], name: str) -> tuple[int, int]:
    vals = (value, value) if isinstance(value, int) else tuple(value)
    if len(vals) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in vals):
        raise ValueError(f"Grid.from_image: {name} must be a positive int or a pair of them, got {value!r}")
    return vals  # type: ignore[return-value]
