"""Point sets in Euclidean space R^d: atoms in 3D, point clouds, sensor positions.

A batch of point sets of different sizes is padded to `[b, n_max, d]` with a boolean mask
(True = a real point). Position is geometry only: the pairwise distance between two points is
all a distance-based score encoding (ALiBi, T5, FIRE, KERPLE, DA-Transformer) reads, so those
are invariant to rotations, reflections and translations of the set and equivariant to
permutations of its points. An absolute encoding of the coordinates (`Positioned`) is not.

    >>> pts = Points(torch.tensor([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]]), units="Å")
    >>> float(pts.distance(torch.tensor(0), torch.tensor(1)))
    5.0
    >>> float(pts.extent(torch.tensor(0)))
    5.0
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from mmpe._scratch import block_empty
from mmpe.coords.base import MaskMod, StoredPositions, safe_sqrt

__all__ = ["Points"]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class Points(StoredPositions):
    """Tokens at points of R^d, batched and padded (units: the caller's, e.g. `"Å"`, `"m"`).

    Args:
        positions: coordinates `[n, d]` (one set) or `[b, n, d]` (a batch padded to `n`
            points), a float tensor (or an array / nested sequence of numbers). Integer
            positions are converted to float32, float16/bfloat16 to float32; float32 and
            float64 are kept. The rows of padded points may hold anything (NaN included):
            they are stored as 0.
        mask: which points are real, bool `[n]` for `[n, d]` positions or `[b, n]` for
            `[b, n, d]`; None = every point is real.
        units: the unit of the coordinates, a free string shown in `repr` (`"Å"`, `"m"`,
            `"px"`); distances are in this unit.
        device: where the tensors live (default: `positions`' device).

    Positions: `query_positions` = `key_positions` = the stored positions `[n, d]` or
    `[b, n, d]` (padded rows 0); `num_axes = d`.

    Pairs: `distance(q, k, b)` is the Euclidean distance `‖x_q − x_k‖₂` in `units`,
    computed in the positions' dtype from the gathered coordinates of the two points (one axis
    at a time, elementwise ops only, so scalar FlexAttention indices and broadcast index grids
    both work) and returned as float32. A pair that involves a padded point has distance 0
    (padded keys are masked by [`mask_mod`][mmpe.coords.points.Points.mask_mod] anyway; 0 keeps every bias finite and bounded
    by the extent). `extent(q, b)` is the diameter of the query's example — the largest
    distance between two of its real points (0 for a single point) — computed once at
    construction in float64 (`O(b·n²)` memory, once) and stored as float32 (FIRE's
    normaliser). Both are differentiable in the positions (the gradient of a zero distance is
    0), so forces `−∂E/∂x` can be taken by autograd through a distance-based encoding.

    Capabilities: `Metric` and `Positioned` (`d` axes). A point set has no direction, so
    it is not `Directed`. [`mask_mod`][mmpe.coords.points.Points.mask_mod] masks padded keys (None when no point is padded).

    Raises:
        TypeError: `positions` not numeric (bool, complex, object), `mask` not a bool
            tensor, `units` not a str.
        ValueError: `positions` not of rank 2 or 3, with no points or no axes, or with a
            non-finite coordinate at a real point; `mask` of a shape other than
            `positions.shape[:-1]`; an example without a real point.
    """

    kind = "points"

    def __init__(
        self,
        positions: Tensor | np.ndarray | Seq,
        mask: Tensor | None = None,
        units: str = "",
        *,
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(units, str):
            raise TypeError(f"Points: units must be a str (e.g. 'Å', 'm'), "
                            f"got {type(units).__name__}")
        pos = _as_positions(positions, device)
        valid = _check_mask(mask, pos)
        if valid is not None:
            pos = torch.where(valid.unsqueeze(-1), pos, torch.zeros_like(pos))
        real = pos if valid is None else pos[valid]
        if not bool(torch.isfinite(real).all()):
            raise ValueError("Points: positions must be finite at every real point (NaN or inf "
                             "given); mark padded points with mask=False instead")
        self.units = units
        _warn_if_implausible_scale(real, units)
        self._pos = pos
        # Key padding for mask_mod; None when no point is padded.
        self._valid = None if valid is None or bool(valid.all()) else valid
        self._axis_pos = [pos[..., a].contiguous() for a in range(pos.shape[-1])]
        self._diameter: Tensor | None = None  # pairwise: computed when first asked

    def to(self, device: torch.device | str) -> Points:
        """These points on `device` (a shallow copy; the tensors are moved)."""
        new = object.__new__(Points)
        new.__dict__.update(self.__dict__)
        new._pos = self._pos.to(device)
        new._valid = None if self._valid is None else self._valid.to(device)
        new._axis_pos = [a.to(device) for a in self._axis_pos]
        new._diameter = None if self._diameter is None else self._diameter.to(device)
        return new

    # -- protocol -----------------------------------------------------------------------
    @property
    def num_keys(self) -> int:
        return self._pos.shape[-2]

    @property
    def num_axes(self) -> int:
        """Dimension `d` of the space."""
        return self._pos.shape[-1]

    @property
    def device(self) -> torch.device:
        return self._pos.device

    @property
    def batch_size(self) -> int | None:
        """`b` for `[b, n, d]` positions, None for one set `[n, d]`."""
        return self._pos.shape[0] if self._pos.dim() == 3 else None

    @property
    def padding_mask(self) -> Tensor:
        """`[n]` or `[b, n]` bool, True at real points."""
        if self._valid is not None:
            return self._valid
        return torch.ones(self._pos.shape[:-1], dtype=torch.bool, device=self._pos.device)

    @property
    def key_mask(self) -> Tensor | None:
        """`[n]` or `[b, n]` bool, True at real points; None when nothing is padded."""
        return self._valid

    @property
    def num_points(self) -> Tensor:
        """Real points per example, `[b]` int64 (a 0-d tensor for one set)."""
        return self.padding_mask.sum(-1)

    @property
    def diameter(self) -> Tensor:
        """Largest distance between two real points per example, `[b]` (or 0-d) float32.

        Computed when first asked (or by `prepare`), in O(n) memory: over the convex hull's
        vertices in 2 and 3 dimensions, otherwise in blocks of rows."""
        if self._diameter is None:
            self._diameter = _diameters(self._pos, self._valid)
        return self._diameter

    def prepare(self) -> None:
        """The diameter, before FlexAttention traces a score mod that reads `extent`."""
        _ = self.diameter

    def _gather(self, values: Tensor, idx: Tensor, b: Tensor | None) -> Tensor:
        if values.dim() == 1:
            return values[idx]
        if b is None:
            raise ValueError("Points: batched positions [b, n, d] need the batch index b")
        return values[b, idx]

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Euclidean distance `‖x_q − x_k‖₂` (`units`, float32); 0 if either is padding."""
        acc = None
        for axis in self._axis_pos:
            diff = self._gather(axis, q_idx, b) - self._gather(axis, kv_idx, b)
            acc = diff * diff if acc is None else acc + diff * diff
        # d(i, i) = 0 gets gradient 0, not NaN (forces by autograd)
        dist = safe_sqrt(acc).to(torch.float32)
        if self._valid is not None:
            real = self._gather(self._valid, q_idx, b) & self._gather(self._valid, kv_idx, b)
            dist = torch.where(real, dist, torch.zeros_like(dist))
        return dist

    def distance_rows(self, start: int, stop: int) -> Tensor:
        """The `distance` of queries `start … stop−1` to every point.

        [`distance`][mmpe.coords.points.Points.distance] of queries `start … stop−1` to every
        point, `[b or 1, 1, stop−start, n]` float32: bit for bit the numbers `distance` gives on
        those pairs' index grid (the same operations in the same order), in fewer passes over
        the block (one broadcast difference per axis, squared and summed in place; no gathers).

        Under `no_grad`, or with positions that need no gradient, the square root is taken in
        place (`√0 = 0` as the guarded form gives); otherwise the guarded form of `distance`
        keeps the gradient of a zero distance 0, not NaN. A pair with a padded point is 0."""
        grad = torch.is_grad_enabled() and any(a.requires_grad for a in self._axis_pos)
        acc = buf = None
        for axis in self._axis_pos:
            a = axis if axis.dim() == 2 else axis[None]  # [b or 1, n]
            if grad:
                diff = a[:, start:stop, None] - a[:, None, :]  # [b or 1, rows, n]
                acc = diff * diff if acc is None else acc + diff * diff
            else:  # in place, in scratch blocks (a fresh block costs its page faults)
                shape = (a.shape[0], stop - start, a.shape[1])
                rows, cols = a[:, start:stop, None], a[:, None, :]
                if acc is None:
                    acc = torch.sub(rows, cols, out=block_empty(self, "acc", shape, a.dtype,
                                                                 a.device))
                    acc.mul_(acc)
                else:
                    if buf is None:
                        buf = block_empty(self, "diff", shape, a.dtype, a.device)
                    torch.sub(rows, cols, out=buf)
                    acc.add_(buf.mul_(buf))
        if grad:
            dist = safe_sqrt(acc).to(torch.float32)
        else:
            dist = acc.sqrt_().to(torch.float32)
        if self._valid is not None:
            valid = self._valid if self._valid.dim() == 2 else self._valid[None]
            real = valid[:, start:stop, None] & valid[:, None, :]
            dist = torch.where(real, dist, torch.zeros_like(dist)) if grad \
                else dist.masked_fill_(~real, 0.0)
        return dist[:, None]

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Diameter of the query's example (`units`, float32), broadcast to the indices' shape."""
        diam = self.diameter
        if diam.dim() == 1:
            if b is None:
                raise ValueError("Points: batched positions [b, n, d] need the batch index b")
            diam = diam[b]
        return diam + torch.zeros_like(q_idx, dtype=torch.float32)

    def mask_mod(self) -> MaskMod | None:
        """Key padding: every query may attend to the real points of its example only."""
        valid = self._valid
        if valid is None:
            return None
        batched = valid.dim() == 2

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return valid[b, kv_idx] if batched else valid[kv_idx]

        return mask

    def __repr__(self) -> str:
        units = f", units={self.units!r}" if self.units else ""
        return (f"Points(n={self.num_queries}, d={self.num_axes}, batch={self.batch_size}, "
                f"padded={self._valid is not None}{units})")


# -- validation --------------------------------------------------------------------------
def _as_positions(value, device) -> Tensor:
    if isinstance(value, Tensor):
        t = value
    else:
        try:
            t = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError("Points: positions must be numeric (a float tensor [n, d] or "
                            f"[b, n, d]), got {type(value).__name__}") from err
    if not (t.dtype.is_floating_point or t.dtype in _INT_DTYPES):
        raise TypeError(f"Points: positions must hold real numbers ([n, d] or [b, n, d]), "
                        f"got dtype {t.dtype}")
    if t.dim() not in (2, 3):
        raise ValueError(f"Points: positions must have shape [n, d] or [b, n, d], "
                         f"got {tuple(t.shape)}")
    if t.shape[-2] == 0 or t.shape[-1] == 0 or (t.dim() == 3 and t.shape[0] == 0):
        raise ValueError(f"Points: positions must hold at least one point with at least one axis "
                         f"([n, d] or [b, n, d] with n, d, b >= 1), got {tuple(t.shape)}")
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    return t.to(device) if device is not None else t


def _check_mask(mask, pos: Tensor) -> Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        what = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"Points: mask must be a bool tensor (True = real point), got {what}")
    expected = tuple(pos.shape[:-1])
    if tuple(mask.shape) != expected:
        form = "[n]" if pos.dim() == 2 else "[b, n]"
        raise ValueError(f"Points: mask must have shape {form} = {expected} to match positions "
                         f"{tuple(pos.shape)}, got {tuple(mask.shape)}")
    mask = mask.to(pos.device)
    counts = mask.reshape(-1, mask.shape[-1]).sum(-1)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        where = "the point set" if pos.dim() == 2 else f"examples {empty}"
        raise ValueError(f"Points: mask leaves no real point in {where}; every example needs one")
    return mask


#: extents (largest bounding-box side of the real points) outside this range get a warning
PLAUSIBLE_EXTENT = (1e-6, 1e8)


def _warn_if_implausible_scale(real: Tensor, units: str) -> None:
    """Distance encodings set their widths and slopes for spans of roughly 0.1 … 1000 units;
    a cloud 1e-10 across (an atom in metres) makes every distance look like 0."""
    flat = real.reshape(-1, real.shape[-1]).detach()
    if flat.shape[0] < 2:
        return
    extent = float((flat.max(0).values - flat.min(0).values).max())
    low, high = PLAUSIBLE_EXTENT
    if 0 < extent < low or extent > high:
        unit = f" {units}" if units else ""
        warnings.warn(f"Points: the points span {extent:.3g}{unit}; distance encodings (their "
                      "widths, slopes, cut-offs) are set for spans near 1 to 1000, so distances "
                      "this small or large read as all 0 or all far: rescale the positions (e.g. "
                      "metres to ångström)", UserWarning, stacklevel=3)


def _diameters(pos: Tensor, valid: Tensor | None) -> Tensor:
    """Largest pairwise distance among the real points of each example, float64 → float32.

    Each pair's distance is `torch.cdist`'s (no matrix-multiply shortcut), so the value is the
    one a full `[n, n]` table would give; only the pairs that can hold the maximum are formed:
    those of the convex hull's vertices (2 and 3 dimensions), or every pair in blocks of rows.
    """
    p = pos.to(torch.float64)
    batched = p.dim() == 3
    if not batched:
        p = p.unsqueeze(0)
        valid = None if valid is None else valid.unsqueeze(0)
    diams = []
    for i in range(p.shape[0]):
        pts = p[i] if valid is None else p[i][valid[i]]
        hull = _hull_vertices(pts)
        diams.append(_largest_distance(pts if hull is None else pts[hull]))
    diam = torch.stack(diams).to(torch.float32)
    return diam if batched else diam[0]


def _hull_vertices(pts: Tensor) -> Tensor | None:
    """Indices of points that include both ends of the diameter: the convex hull's vertices,
    found in the points' own affine span (a flat cloud's hull in its plane, a line's two
    ends), or None above 3 dimensions, for few points or where Qhull fails."""
    n, d = pts.shape
    if d > 3 or n <= 64:
        return None
    from scipy.spatial import ConvexHull, QhullError

    x = pts.detach().cpu().numpy()
    x = x - x.mean(0)
    _, sv, vt = np.linalg.svd(x, full_matrices=False)
    rank = int((sv > 1e-9 * max(float(sv[0]), 1e-300)).sum())
    y = x @ vt[:rank].T
    if rank == 0:
        vertices = np.array([0])
    elif rank == 1:
        vertices = np.array([int(y[:, 0].argmin()), int(y[:, 0].argmax())])
    else:
        try:
            vertices = ConvexHull(y).vertices
        except (QhullError, ValueError):
            return None
    return torch.as_tensor(vertices, dtype=torch.long, device=pts.device)


def _largest_distance(pts: Tensor, pairs_per_block: int = 1 << 22) -> Tensor:
    """Largest distance between rows of `pts` `[n, d]`, in row blocks of at most
    `pairs_per_block` pairs (0 for a single point)."""
    n = pts.shape[0]
    rows = max(1, pairs_per_block // max(n, 1))
    best = pts.new_zeros(())
    for start in range(0, n, rows):
        block = torch.cdist(pts[start:start + rows], pts,
                            compute_mode="donot_use_mm_for_euclid_dist")
        best = torch.maximum(best, block.max())
    return best
