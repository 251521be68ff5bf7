"""ComRoPE: rotations from trainable commuting angle matrices (Yu et al. 2025)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Positioned
from mmpe.encodings._learned_rotation import LearnedRotation, check_block_size, num_pairs, skew
from mmpe.encodings._state import SavesSettings
from mmpe.registry import register

PAPER = ("Yu et al. 2025, ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized "
         "by Trainable Commuting Angle Matrices (CVPR 2025), §3")
CONTEXT = ("head_dim", "num_axes", "num_heads")


class _ComRoPE(SavesSettings, LearnedRotation):
    """`R(x) = exp(Σ_a x_a A_a)` with block-diagonal angle matrices `A_a` that commute by
    construction: in block `k` every `A_a` is a multiple `c_{a,k} B_k` of one learned
    skew-symmetric `B_k` (`b × b`). Then `Σ_a x_a A_a` is, per block, `s_k(x) B_k` with
    `s_k(x) = Σ_a c_{a,k} x_a` linear in `x`, so

        R(x)ᵀ R(y) = blockdiag_k exp((s_k(y) − s_k(x)) B_k) = R(y − x)

    exactly, for any number of axes (the paper's condition: pairwise commuting angle
    matrices make the rotation a function of the offset).
    Subclasses fix the coefficients `c`.
    """

    keep_dtype = ("blocks", "coefficients")
    saved_settings = ("per_head",)

    def _init_blocks(self, head_dim: int, num_axes: int, num_heads: int | None, per_head: bool,
                     block_size: int, init_std: float) -> None:
        self._init_common(head_dim, num_axes, num_heads, per_head)
        check_block_size(self.name, head_dim, block_size)
        self.block_size, self.num_blocks = block_size, head_dim // block_size
        self.blocks = nn.Parameter(
            torch.randn(self.param_heads, self.num_blocks, num_pairs(block_size)) * init_std)

    def coefficient_matrix(self) -> Tensor:  # pragma: no cover - abstract
        """`c` `[A, H_r or 1, h_d/b]`."""
        raise NotImplementedError

    def generator_matrices(self) -> Tensor:
        """The angle matrices `A_a` as blocks `[A, H_r, h_d/b, b, b]`."""
        base = skew(self.blocks, self.block_size)  # [H_r, nb, b, b]
        return self.coefficient_matrix()[..., None, None] * base

    def rotation_blocks(self, positions: Tensor) -> Tensor:
        """`exp(s_k(x) B_k)` per block: `[H_r, U, h_d/b, b, b]` for positions `[U, A]`."""
        base = skew(self.blocks.to(positions.dtype), self.block_size)  # [H_r, nb, b, b]
        s = torch.einsum("ua,ahk->huk", positions, self.coefficient_matrix().to(positions.dtype))
        # contiguous: matrix_exp views its input, which the product may lay out with any strides
        return torch.linalg.matrix_exp((s[..., None, None] * base.unsqueeze(1)).contiguous())


@register("comrope_ap", hook="rotary", needs=(Positioned,), learnable=True, family="rotary",
          paper=PAPER + " (ComRoPE-AP, axis-partition)", context=CONTEXT)
class ComRoPEAP(_ComRoPE):
    """ComRoPE-AP: the rotation blocks shared out among the axes.

    ComRoPE-AP (axis partition; Yu et al. 2025): the blocks are shared out among the axes
    — block `k` of the `n_b = h_d/b` belongs to axis `a(k) = ⌊k·A/n_b⌋` (contiguous groups
    as even as possible, as axial RoPE's channel blocks; equal when `A` divides `n_b`) — and
    turns by `exp(x_{a(k)} B_k)` with a learned skew-symmetric `B_k`; the angle matrices
    `A_a` have disjoint supports, so they commute.

    With `b = 2` and `B_k` the 2×2 RoPE generators of axial frequencies this is
    `rope_axial(interleaved=True)` (`rope(interleaved=True)` with one axis); larger blocks
    mix more channels per axis.

    Args:
        head_dim: `h_d`, divisible by `b`, with at least `A` blocks.
        num_axes: `A`.
        num_heads: `n_h` (used with `per_head`).
        per_head: one set of blocks per head (False: shared by all heads).
        block_size: `b` ≥ 2 (4 default).
        init_std: standard deviation of the blocks' initial free entries (an assumption: a
            random normal start; scale it to the coordinates' units).

    Parameters: `blocks` `[H_r, h_d/b, b(b−1)/2]` (strict upper triangles), float32 under
    casts.

    Shapes: `forward(q [B, n_h, n_q, h_d], k [B, n_kv, n_k, h_d], coords) -> (q, k)` in the
    inputs' dtype (float32 rotation; float64 in float64). Memory: `[H_r, U, h_d/b, b, b]` for
    `U` distinct positions.

    Raises:
        ValueError: `block_size` < 2 or not dividing `head_dim`, fewer blocks than axes,
            `per_head` without `num_heads`, coordinates with another number of axes, q/k of
            other heads (per head) or head dim.
    """

    name = "comrope_ap"

    def __init__(self, head_dim: int, num_axes: int = 2, num_heads: int | None = None,
                 per_head: bool = False, block_size: int = 4, init_std: float = 1.0) -> None:
        super().__init__()
        if block_size < 2 or head_dim % block_size or head_dim // block_size < num_axes:
            raise ValueError(f"comrope_ap: block_size={block_size} must be >= 2, divide "
                             f"head_dim={head_dim} and leave at least one block per axis "
                             f"(num_axes={num_axes})")
        self._init_blocks(head_dim, num_axes, num_heads, per_head, block_size, init_std)
        owner = torch.arange(self.num_blocks) * num_axes // self.num_blocks  # a(k)
        onehot = (owner.unsqueeze(0) == torch.arange(num_axes).unsqueeze(1)).float()
        self.register_buffer("coefficients", onehot.unsqueeze(1), persistent=False)  # [A, 1, nb]

    def coefficient_matrix(self) -> Tensor:
        """One-hot `c_{a,k} = [a(k) = a]`, `[A, 1, h_d/b]`."""
        return self.coefficients


@register("comrope_ld", hook="rotary", needs=(Positioned,), learnable=True, family="rotary",
          aliases=("comrope",), paper=PAPER + " (ComRoPE-LD, linearly dependent)",
          context=CONTEXT)
class ComRoPELD(_ComRoPE):
    """ComRoPE-LD: every angle matrix a learned multiple of one.

    ComRoPE-LD (linearly dependent; Yu et al. 2025): every angle matrix is, block by block,
    a learned multiple of one learned skew-symmetric matrix, `A_a = blockdiag_k(c_{a,k} B_k)`,
    so all of them commute and block `k` turns by `exp((Σ_a c_{a,k} x_a) B_k)`.

    Assumption (stated since the coefficients' granularity matters): one scaling factor per
    (axis, block), learned. A single factor per axis shared by all blocks would make every
    block a function of the same projection `c·x` (positions orthogonal to `c`
    indistinguishable); per block each block reads its own direction, as RoPE-Mixed's
    frequency vectors do. Both commute, so translation invariance is exact either way.

    Args:
        head_dim: `h_d`, divisible by `b`.
        num_axes: `A`.
        num_heads: `n_h` (used with `per_head`).
        per_head: one set of blocks and factors per head (False: shared by all heads).
        block_size: `b` ≥ 2 (4 default).
        init_std: standard deviation of the blocks' initial free entries; the factors start
            at `N(0, 1)`.

    Parameters: `blocks` `[H_r, h_d/b, b(b−1)/2]`, `coefficients` `[A, H_r, h_d/b]`, float32
    under casts.

    Shapes: as [`ComRoPEAP`][mmpe.encodings.comrope.ComRoPEAP].

    Raises:
        ValueError: `block_size` < 2 or not dividing `head_dim`, `per_head` without
            `num_heads`, coordinates with another number of axes, q/k of other heads (per
            head) or head dim.
    """

    name = "comrope_ld"

    def __init__(self, head_dim: int, num_axes: int = 2, num_heads: int | None = None,
                 per_head: bool = False, block_size: int = 4, init_std: float = 1.0) -> None:
        super().__init__()
        self._init_blocks(head_dim, num_axes, num_heads, per_head, block_size, init_std)
        self.coefficients = nn.Parameter(
            torch.randn(num_axes, self.param_heads, self.num_blocks))

    def coefficient_matrix(self) -> Tensor:
        """Learned `c` `[A, H_r, h_d/b]`."""
        return self.coefficients
