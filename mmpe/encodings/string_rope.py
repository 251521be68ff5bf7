"""STRING: separable translationally invariant rotations, Cayley form (Schenck et al. 2025)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Positioned
from mmpe.encodings._learned_rotation import LearnedRotation, axial_frequencies, num_pairs, skew
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.rope import apply_rotary
from mmpe.registry import register


def cayley(s: Tensor) -> Tensor:
    """The Cayley transform of a skew-symmetric `S`.

    `P = (I − S)(I + S)⁻¹` of skew-symmetric `S` `[..., d, d]`: orthogonal with
    determinant 1 (`I + S` is always invertible: `S`'s eigenvalues are imaginary).
    `S = 0` gives `P = I`."""
    eye = torch.eye(s.shape[-1], dtype=s.dtype, device=s.device)
    # X (I + S) = I − S  ⇔  X = (I − S)(I + S)⁻¹
    return torch.linalg.solve(eye + s, eye - s, left=False)


@register(
    "string_rope", hook="rotary", needs=(Positioned,), learnable=True, family="rotary",
    aliases=("string", "cayley_string"),
    paper="Schenck et al. 2025, Learning the RoPEs: Better 2D and 3D Position Encodings with "
          "STRING (ICML 2025, arXiv:2502.02562), Cayley-STRING: R(x) = P RoPE(x) Pᵀ, "
          "P = (I − S)(I + S)⁻¹",
    context=("head_dim", "num_axes", "num_heads"))
class StringRoPE(SavesSettings, LearnedRotation):
    """Cayley-STRING: RoPE conjugated by a learned orthogonal matrix.

    Cayley-STRING (Schenck et al. 2025): `R(x) = P · RoPE(x) · Pᵀ` with a learned orthogonal
    `P = (I − S)(I + S)⁻¹` (`S` learned skew-symmetric, dense over `h_d`) and a RoPE whose
    per-axis frequencies are learned.

    STRING's theorem: every translation-invariant `R(x) = exp(Σ_a x_a L_a)` with commuting
    skew-symmetric `L_a` equals `P · RoPE(x) · Pᵀ` for an orthogonal `P` and a RoPE with
    (general, mixed-axis) frequencies, so `R(x)ᵀR(y) = R(y − x)` exactly for any number of
    axes: scores depend on the offset only. Here `RoPE(x)` turns pair `j` by
    `Σ_a θ_{a,j} x_a` (RoPE-Mixed's form; learned `θ` `[A, H_r, h_d/2]`, initialised to axial
    RoPE's spectrum `mmpe.encodings._learned_rotation.axial_frequencies`,
    `base^(−2j/(h_d/A))` on axis `a`'s block of pairs), and `S` starts at 0 (`init_std=0`),
    so at initialisation `P = I` and STRING *is* `rope_axial` (`rope` with one axis, same
    `interleaved` layout).

    Applied as `R(x) q = P (RoPE(x) (Pᵀ q))`: two `h_d × h_d` products and a pairwise rotation
    per token, `O(n·h_d²)` work and `O(n·h_d)` memory — no per-token matrix is formed (the
    paper notes the outer `P` cancels in `qᵀk`; it is kept so that `R` is the paper's matrix).
    The circulant variant of the paper is not implemented.

    Args:
        head_dim: `h_d`, divisible by `2·num_axes` (the axial start).
        num_axes: `A`.
        num_heads: `n_h` (used with `per_head`).
        per_head: one `S` and one set of frequencies per head (False: shared by all heads).
        base: base of the initial axial RoPE spectrum (10000).
        interleaved: RoPE pairs `(2i, 2i+1)` (True) or `(i, i + h_d/2)` (False, default;
            `rope`'s and `rope_axial`'s default).
        learn_freqs: learn the frequencies `θ` (True, default) or keep the axial spectrum
            fixed (a buffer).
        init_std: standard deviation of `S`'s initial entries (0: `P = I`).

    Parameters: `s` `[H_r, h_d(h_d−1)/2]` (the strict upper triangle of `S`), `freqs`
    `[A, H_r, h_d/2]`; both kept float32 when the module is cast to bf16/fp16.

    Shapes: `forward(q [B, n_h, n_q, h_d], k [B, n_kv, n_k, h_d], coords) -> (q, k)` in the
    inputs' dtype (rotated in float32; float64 in float64).

    Raises:
        ValueError: `head_dim` not divisible by `2·num_axes`, `per_head` without `num_heads`,
            coordinates with another number of axes, q/k with other heads (per head) or head
            dim.
    """

    name = "string_rope"
    keep_dtype = ("s", "freqs")
    saved_settings = ("interleaved", "per_head")

    def __init__(self, head_dim: int, num_axes: int = 2, num_heads: int | None = None,
                 per_head: bool = False, base: float = 10000.0, interleaved: bool = False,
                 learn_freqs: bool = True, init_std: float = 0.0) -> None:
        super().__init__()
        self._init_common(head_dim, num_axes, num_heads, per_head)
        if head_dim % (2 * num_axes):
            raise ValueError(f"string_rope: head_dim={head_dim} must be divisible by "
                             f"2·num_axes = {2 * num_axes}")
        self.interleaved, self.block_size, self.num_blocks = bool(interleaved), head_dim, 1
        hr = self.param_heads
        self.s = nn.Parameter(torch.randn(hr, num_pairs(head_dim)) * init_std)
        freqs = axial_frequencies(head_dim, num_axes, base).float()
        freqs = freqs.unsqueeze(1).expand(num_axes, hr, head_dim // 2).clone()
        if learn_freqs:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs)

    def orthogonal(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """`P` `[H_r, h_d, h_d]` (Cayley transform of `S`)."""
        return cayley(skew(self.s.to(dtype), self.head_dim))

    def transform(self, positions: Tensor, work: torch.dtype) -> object:
        """The orthogonal matrix and the cos/sin tables of positions.

        `(P [1, H_r, h_d, h_d], cos, sin [1 or B, H_r, n, h_d/2])` of positions `[n, A]` or
        `[B, n, A]`."""
        # Phases in float64, reduced modulo 2π, then cos/sin rounded once (as RoPE): a float32
        # phase is off by ~1e-2 rad at position 1e5.
        phase = torch.einsum("...na,ahj->...hnj", positions.to(torch.float64),
                             self.freqs.to(torch.float64))
        phase = torch.remainder(phase, 2 * math.pi)
        if phase.dim() == 3:
            phase = phase.unsqueeze(0)
        return self.orthogonal(work).unsqueeze(0), phase.cos().to(work), phase.sin().to(work)

    def apply(self, x: Tensor, rot: object) -> Tensor:
        """`P · RoPE(x) · Pᵀ` applied to `x` `[B, n_h, n, h_d]`."""
        p, cos, sin = rot  # type: ignore[misc]
        y = torch.matmul(x.to(p.dtype), p)  # rows: (Pᵀ x)ᵀ = xᵀ P
        y = apply_rotary(y, cos, sin, self.interleaved)
        return torch.matmul(y, p.transpose(-1, -2)).to(x.dtype)
