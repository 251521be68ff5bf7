"""Shared machinery of the learned N-D rotations (LieRE, STRING, ComRoPE); not a registered
module (the name starts with `_`).

A learned rotation maps a token's position `x ∈ R^A` to an orthogonal `R(x)` acting on each
head's `h_d` channels; queries and keys are rotated, `q ← R(x_q) q`, `k ← R(x_k) k`, so the
score is `q_iᵀ R(x_i)ᵀ R(x_j) k_j`. The rotations here are block-diagonal: `h_d/b` blocks of
size `b` (a dense rotation is one block, `b = h_d`), channels `[k·b, (k+1)·b)` forming block
`k`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.grid import Grid
from mmpe.encodings._positions import check_qk, rotary_positions
from mmpe.encodings._precision import KeepDtype, full_precision
from mmpe.encodings._weights_cache import WeightsCache
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import rope_inv_freq, same_positions


def skew(upper: Tensor, size: int) -> Tensor:
    """The skew-symmetric `[..., size, size]` matrices whose strict upper triangles are
    `upper` `[..., size·(size−1)/2]` (row-major, as `torch.triu_indices(size, size, 1)`)."""
    rows, cols = torch.triu_indices(size, size, 1, device=upper.device)
    out = upper.new_zeros(*upper.shape[:-1], size, size)
    out[..., rows, cols] = upper
    return out - out.transpose(-1, -2)


def upper_entries(matrix: Tensor) -> Tensor:
    """Inverse of `skew`: the strict upper triangle
    `[..., b(b−1)/2]` of `[..., b, b]` matrices."""
    size = matrix.shape[-1]
    rows, cols = torch.triu_indices(size, size, 1, device=matrix.device)
    return matrix[..., rows, cols]


def axial_frequencies(head_dim: int, num_axes: int, base: float) -> Tensor:
    """`[A, h_d/2]` float64: pair `j` turns by `θ_{a,j}·x_a`, with the axial RoPE spectrum of
    `axial_phase` (`"ij"`): pair `j` belongs to axis
    `a = j // m`, `m = h_d/(2A)`, and `θ_{a,j} = base^(−2(j mod m)/(h_d/A))`; 0 elsewhere.
    With one axis this is RoPE's `base^(−2j/h_d)`.

    Raises:
        ValueError: `head_dim` not divisible by `2·num_axes`.
    """
    if head_dim % (2 * num_axes):
        raise ValueError(f"head_dim={head_dim} must be divisible by 2·num_axes = {2 * num_axes} "
                         "for the axial RoPE spectrum")
    m = head_dim // (2 * num_axes)
    inv = rope_inv_freq(2 * m, base)  # [m]
    out = torch.zeros(num_axes, head_dim // 2, dtype=torch.float64)
    for a in range(num_axes):
        out[a, a * m:(a + 1) * m] = inv
    return out


def rope_generators(head_dim: int, num_axes: int, base: float = 10000.0) -> Tensor:
    """The generators of axial RoPE, `[A, h_d, h_d]` float64 skew-symmetric: `G_a` holds, for
    each pair `j` of axis `a`, the 2×2 block `[[0, −θ_{a,j}], [θ_{a,j}, 0]]` on channels
    `(2j, 2j+1)` (`axial_frequencies`).
    `exp(Σ_a x_a G_a)` is then `rope_axial(interleaved=True)`'s rotation (`rope(
    interleaved=True)` with one axis): pair `j` turns by `Σ_a θ_{a,j} x_a` counter-clockwise,
    `(x₁, x₂) → (x₁ cos − x₂ sin, x₂ cos + x₁ sin)`."""
    freqs = axial_frequencies(head_dim, num_axes, base)
    out = torch.zeros(num_axes, head_dim, head_dim, dtype=torch.float64)
    j = torch.arange(head_dim // 2)
    out[:, 2 * j + 1, 2 * j] = freqs
    out[:, 2 * j, 2 * j + 1] = -freqs
    return out


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype is rotated in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotation_dtype(x: torch.dtype, positions: torch.dtype) -> torch.dtype:
    """The dtype a rotation of `x` at `positions` is formed in: [`work_dtype`][mmpe.encodings._learned_rotation.work_dtype] of `x`, but
    float64 for float64 positions (absolute time stamps on the sphere): `exp(t·A)` in float32
    is NaN at `t ≈ 1e8` and loses the seconds of Unix time long before."""
    return torch.float64 if positions == torch.float64 else work_dtype(x)


class LearnedRotation(KeepDtype, RotaryEncoding):
    """Base of the learned N-D rotations: head checks, positions, deduplication, caching.

    Subclasses set `block_size`, `num_blocks`, `num_axes`, `head_dim`, `num_heads` and
    `per_head`, and implement `rotation_blocks`
    (or override `transform`/`apply`, as STRING does).
    """

    name: ClassVar[str] = "learned_rotation"
    #: distinct grids whose rotations are kept (no-grad forwards only); emptied when full.
    cache_size: ClassVar[int] = 8

    def _init_common(self, head_dim: int, num_axes: int, num_heads: int | None,
                     per_head: bool) -> None:
        if per_head and num_heads is None:
            raise ValueError(f"{self.name}: per_head=True needs num_heads (one set of generators "
                             "per head)")
        self.head_dim, self.num_axes = head_dim, num_axes
        self.per_head, self.num_heads = bool(per_head), num_heads
        self.param_heads = num_heads if per_head else 1  # the `H_r` axis of the parameters
        self._cache = WeightsCache(self.cache_size)

    # -- what subclasses provide ---------------------------------------------------------------

    def rotation_blocks(self, positions: Tensor) -> Tensor:
        """`[H_r, U, h_d/b, b, b]` rotation blocks of `U` positions `[U, A]` (in their dtype)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def transform(self, positions: Tensor, work: torch.dtype) -> object:
        """What `apply` needs for
        tokens at `positions` `[n, A]` or `[B, n, A]`: here the blocks
        `[1 or B, H_r, n, h_d/b, b, b]`, computed once per distinct position."""
        flat = positions.reshape(-1, positions.shape[-1]).to(work)
        # distinct positions once; not for positions that take a gradient (each token's own)
        if flat.shape[0] > 1 and not torch.compiler.is_compiling() and not (
                flat.requires_grad and torch.is_grad_enabled()):
            uniq, inverse = torch.unique(flat, dim=0, return_inverse=True)
            blocks = self.rotation_blocks(uniq)[:, inverse] if uniq.shape[0] < flat.shape[0] \
                else self.rotation_blocks(flat)
        else:
            blocks = self.rotation_blocks(flat)
        blocks = blocks.reshape(blocks.shape[0], *positions.shape[:-1], *blocks.shape[2:])
        return blocks.movedim(0, 1) if positions.dim() == 3 else blocks.unsqueeze(0)

    def apply(self, x: Tensor, rot: object) -> Tensor:
        """`R(x_t) x_t` for every token: `x` `[b, n_h, n, h_d]`, `rot` from `transform`."""
        blocks: Tensor = rot  # type: ignore[assignment]
        b = blocks.shape[-1]
        xb = x.to(blocks.dtype).unflatten(-1, (self.head_dim // b, b))  # [B, H, n, nb, b]
        br, hr = blocks.shape[:2]
        # The axes the rotation is shared over (batch and/or heads) become the columns of one
        # matrix product per (token, block): broadcasting `blocks` against `x` instead would
        # materialise a [B, H, n, nb, b, b] copy of the rotations.
        if br == 1 and hr == 1:
            cols = xb.permute(2, 3, 4, 0, 1).flatten(-2)  # [n, nb, b, B·H]
            out = torch.matmul(blocks[0, 0], cols).unflatten(-1, xb.shape[:2])
            out = out.permute(3, 4, 0, 1, 2)
        elif br == 1:  # per head: [H, n, nb, b, b] against [H, n, nb, b, B]
            out = torch.matmul(blocks[0], xb.permute(1, 2, 3, 4, 0)).permute(4, 0, 1, 2, 3)
        elif hr == 1:  # per example: [B, n, nb, b, b] against [B, n, nb, b, H]
            out = torch.matmul(blocks[:, 0], xb.permute(0, 2, 3, 4, 1)).permute(0, 4, 1, 2, 3)
        else:
            out = torch.matmul(blocks, xb.unsqueeze(-1)).squeeze(-1)
        return out.flatten(-2).to(x.dtype)

    # -- shared -------------------------------------------------------------------------------

    def rotation(self, positions: Tensor) -> Tensor:
        """The full rotation matrices `R(x)`, `[H_r, n, h_d, h_d]` (float32; float64 for float64
        positions), of positions `[n, A]` — for inspection and tests (the forward never builds
        them densely when the rotation is block-diagonal).

        Raises:
            ValueError: positions not `[n, num_axes]`.
        """
        if not isinstance(positions, Tensor) or positions.dim() != 2 \
                or positions.shape[-1] != self.num_axes:
            shape = tuple(positions.shape) if isinstance(positions, Tensor) else positions
            raise ValueError(f"{self.name}: positions must be [n, num_axes={self.num_axes}], "
                             f"got {shape}")
        work = work_dtype(positions.dtype)
        with full_precision(positions.device):
            rot = self.transform(positions, work)
            eye = torch.eye(self.head_dim, dtype=work, device=positions.device)
            basis = eye[:, None, None, :].expand(self.head_dim, self.param_heads,
                                                 positions.shape[0], self.head_dim)
            cols = self.apply(basis, rot)  # [j, H_r, n, i] = R e_j
        return cols.permute(1, 2, 3, 0)

    def _check_heads(self, q: Tensor, k: Tensor) -> None:
        if not self.per_head:
            return
        for arg, t in (("q", q), ("k", k)):
            if t.shape[1] != self.num_heads:
                raise ValueError(f"{self.name}: its generators are per head (per_head=True, "
                                 f"num_heads={self.num_heads}); {arg} has {t.shape[1]} heads "
                                 "(no grouped-query attention with per-head rotations)")

    def _positions(self, pos: Tensor) -> Tensor:
        if pos.shape[-1] != self.num_axes:
            raise ValueError(f"{self.name}: built for num_axes={self.num_axes}, the coordinates "
                             f"have {pos.shape[-1]} axes; build it with num_axes={pos.shape[-1]} "
                             f"(a model: context={{'num_axes': {pos.shape[-1]}}})")
        return pos

    def _cached(self, coords: Coordinates, positions: Tensor, work: torch.dtype) -> object:
        """`transform` of a Grid's positions, cached per (grid, dtype) while the weights keep
        their values, when no gradient is recorded (evaluation: every layer and forward reuses
        it). The weights are compared by value, so an update through `.data` (an EMA teacher)
        is seen. Under autograd the rotation is part of this forward's graph and is recomputed;
        so are other coordinates and compiled graphs."""
        params = list(self.parameters())
        if type(coords) is not Grid or torch.compiler.is_compiling() or (
                torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return self.transform(positions, work)
        key = (coords.shape, coords.scale, coords.prefix_tokens, coords.device, work)
        weights = [*params, *self.buffers()]
        hit = self._cache.get(key, weights)
        if hit is not None:
            return hit
        rot = self.transform(positions, work)
        self._cache.put(key, weights, rot)
        return rot

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk(self.name, q, k, self.head_dim, coords)
        self._check_heads(q, k)
        qpos, kpos = (self._positions(p) for p in rotary_positions(coords, k))
        work, kwork = rotation_dtype(q.dtype, qpos.dtype), rotation_dtype(k.dtype, kpos.dtype)
        with full_precision(q.device):
            qrot = self._cached(coords, qpos.to(q.device), work)
            if same_positions(qpos, kpos) and kwork == work:
                krot = qrot  # a grid's keys are its queries: one rotation for both
            else:
                krot = self.transform(kpos.to(k.device), kwork)
            return self.apply(q, qrot), self.apply(k, krot)


def check_block_size(name: str, head_dim: int, block_size: int) -> None:
    """`block_size` ≥ 2 dividing `head_dim` (ValueError naming both)."""
    if block_size < 2 or head_dim % block_size:
        raise ValueError(f"{name}: block_size must be >= 2 and divide head_dim={head_dim}, got "
                         f"{block_size}")


def num_pairs(size: int) -> int:
    """`size·(size−1)/2`: free entries of a `size × size` skew-symmetric matrix."""
    return size * (size - 1) // 2


__all__ = ["LearnedRotation", "axial_frequencies", "check_block_size", "num_pairs",
           "rope_generators", "skew", "upper_entries", "work_dtype"]
