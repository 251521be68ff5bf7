"""Radial bases with smooth cutoffs as a per-head distance bias.

Radial bases with smooth cutoffs as a per-head distance bias: SchNet's Gaussians, DimeNet's
Bessel functions.

Both expand the distance `d` of two tokens into `K` smooth features that vanish, with their
first derivative, at a cutoff `c` and stay 0 beyond it, and map them to one bias per head by
a learned `W ∈ R^{n_h × K}` (no constant: pairs beyond the cutoff get exactly 0):

    `score + Σ_k W[h, k] · e_k(d(q, k))`

They read only the coordinates' distance, so on [`mmpe.Points`][mmpe.coords.points.Points] they are invariant to
rotations, reflections and translations and equivariant to permutations of the points.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Metric
from mmpe.encodings._geometry import DistanceFeatureBias
from mmpe.encodings._precision import term_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int


def cosine_cutoff(d: Tensor, cutoff: float) -> Tensor:
    """`C(d) = ½(cos(πd/c) + 1)` for `d < c`, 0 beyond (Schütt et al. 2018, SchNet JCP eq. 12).

    `C(c) = C'(c) = 0`: the features reach 0 with a horizontal tangent.
    """
    inside = d < cutoff
    return torch.where(inside, 0.5 * (torch.cos(d * (math.pi / cutoff)) + 1.0), torch.zeros_like(d))


def polynomial_envelope(x: Tensor, p: int = 6) -> Tensor:
    """DimeNet's polynomial envelope.

    DimeNet's envelope `u(x) = 1 − (p+1)(p+2)/2·x^p + p(p+2)·x^{p+1} − p(p+1)/2·x^{p+2}`
    for `x = d/c < 1`, 0 beyond (Gasteiger et al. 2020, eq. 8; `p = 6`).

    `u(0) = 1` and `u(1) = u'(1) = u''(1) = 0` for every `p ≥ 1`.
    """
    a, b, c = -(p + 1) * (p + 2) / 2.0, float(p * (p + 2)), -p * (p + 1) / 2.0
    xp = x ** p
    u = 1.0 + xp * (a + x * (b + x * c))
    return torch.where(x < 1.0, u, torch.zeros_like(x))


def gaussian_rbf(d: Tensor, centers: Tensor, gamma: float) -> Tensor:
    """SchNet's `e_k(d) = exp(−γ (d − μ_k)²)`, `[*d.shape, K]` (Schütt et al. 2017, eq. 5)."""
    return torch.exp(-gamma * (d.unsqueeze(-1) - centers) ** 2)


def bessel_rbf(d: Tensor, cutoff: float, num_radial: int) -> Tensor:
    """DimeNet's `e_n(d) = √(2/c) · sin(nπd/c) / d`, `n = 1 … N`, `[*d.shape, N]`.

    Gasteiger et al. 2020, eq. 7 (without the envelope): the spherical Bessel functions
    `j_0` with zeros at the cutoff, orthonormal on `[0, c]` with weight `d²`. At `d = 0`
    the limit `√(2/c)·nπ/c` (finite, gradient finite).
    """
    n = torch.arange(1, num_radial + 1, dtype=d.dtype, device=d.device) * (math.pi / cutoff)
    x = d.unsqueeze(-1)
    positive = x > 0
    safe = torch.where(positive, x, torch.ones_like(x))
    ratio = torch.where(positive, torch.sin(n * safe) / safe, n)  # sin(nx)/x → n at x = 0
    return math.sqrt(2.0 / cutoff) * ratio


def _check(name: str, num_heads: int, count_arg: str, count: int, cutoff: float) -> None:
    check_int(name, "num_heads", num_heads)
    check_int(name, count_arg, count)
    check_finite_float(name, "cutoff", cutoff, low=0.0, low_open=True)


class _RadialBias(SavesSettings, DistanceFeatureBias):
    """`Σ_k W[h, k] e_k(d)` over a fixed radial basis `e` (subclasses define [`basis`][mmpe.encodings.radial_basis._RadialBias.basis])."""

    def __init__(self, num_heads: int, num_features: int) -> None:
        super().__init__()
        self.num_heads, self.feature_width = num_heads, num_features
        self.weight = nn.Parameter(torch.randn(num_heads, num_features) / math.sqrt(num_features))

    def basis(self, d: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The features `[*d.shape, K]` (cutoff included)."""
        raise NotImplementedError

    def term_parameters(self) -> dict[str, Tensor]:
        return {"weight": self.weight.to(term_dtype(self))}

    def head_values(self, p: dict[str, Tensor], d: Tensor) -> Tensor:
        return F.linear(self.basis(d), p["weight"])


@register(
    "radial_gaussian", hook="score", needs=(Metric,), learnable=True, family="geometry",
    aliases=("schnet_rbf",),
    paper="Schütt et al. 2017, SchNet: A continuous-filter convolutional neural network for "
          "modeling quantum interactions (NeurIPS), eq. 5; Schütt et al. 2018, SchNet – A deep "
          "learning architecture for molecules and materials (J. Chem. Phys.), cosine cutoff",
    context=("num_heads",))
class RadialGaussianBias(_RadialBias):
    """`score + Σ_k W[h, k] · exp(−γ (d − μ_k)²) · C(d)`: SchNet's Gaussian RBF, cosine cutoff.

    SchNet expands interatomic distances in Gaussians on a grid of centres `μ_k` (0.1 Å apart,
    `γ = 10 Å⁻²`; Schütt et al. 2017 eq. 5) and, in SchNet 2018, multiplies by the cosine
    cutoff `C(d) = ½(cos(πd/c) + 1)` (0 beyond `c`; [`cosine_cutoff`][mmpe.encodings.radial_basis.cosine_cutoff]). Here the centres
    are `μ_k = k·c/(K − 1)`, `k = 0 … K−1` (50 centres up to 5 Å: ≈ 0.1 Å apart), and the
    features go to a bias per head through `W` (learned, no constant).

    Args:
        num_heads: `n_h`.
        num_basis: `K` centres.
        cutoff: `c` in the coordinates' unit (5 Å).
        gamma: `γ` in unit⁻² (10 Å⁻²).

    Units: `d`, `μ`, `c` in the coordinates' unit; `γ` in its inverse square.

    Raises:
        ValueError: non-positive `num_heads`, `num_basis`, `cutoff` or `gamma`.
        TypeError: coordinates without a distance (`Metric`).
    """

    saved_settings = ("cutoff", "gamma")

    def __init__(self, num_heads: int, num_basis: int = 50, cutoff: float = 5.0,
                 gamma: float = 10.0) -> None:
        _check("radial_gaussian", num_heads, "num_basis", num_basis, cutoff)
        check_finite_float("radial_gaussian", "gamma", gamma, low=0.0, low_open=True)
        super().__init__(num_heads, num_basis)
        self.num_basis, self.cutoff, self.gamma = num_basis, float(cutoff), float(gamma)

    def centers(self, device: torch.device | None = None) -> Tensor:
        """`μ_k = k·c/(K − 1)` `[K]` float32 (coordinate units)."""
        return torch.linspace(0.0, self.cutoff, self.num_basis, device=device)

    def basis(self, d: Tensor) -> Tensor:
        d = d.to(torch.promote_types(d.dtype, torch.float32))
        feats = gaussian_rbf(d, self.centers(d.device), self.gamma)
        return feats * cosine_cutoff(d, self.cutoff).unsqueeze(-1)


@register(
    "radial_bessel", hook="score", needs=(Metric,), learnable=True, family="geometry",
    aliases=("dimenet_rbf",),
    paper="Gasteiger et al. 2020, Directional Message Passing for Molecular Graphs (ICLR; "
          "DimeNet), eq. 7-8",
    context=("num_heads",))
class RadialBesselBias(_RadialBias):
    """`score + Σ_n W[h, n] · u(d/c) · √(2/c) · sin(nπd/c)/d`: DimeNet's radial Bessel basis.

    DimeNet (Gasteiger et al. 2020) represents a distance by the 0-th order spherical Bessel
    functions with their zeros at the cutoff `c` (eq. 7, [`bessel_rbf`][mmpe.encodings.radial_basis.bessel_rbf]), `n = 1 … N`,
    times the polynomial envelope `u` of eq. 8 ([`polynomial_envelope`][mmpe.encodings.radial_basis.polynomial_envelope], `p = 6`), which
    is 1 at 0 and reaches 0 at `c` with vanishing first and second derivatives: the bias is
    twice continuously differentiable in the positions and 0 beyond the cutoff. The frequencies
    `nπ/c` are fixed here (DimeNet's code also trains them).

    Args:
        num_heads: `n_h`.
        num_radial: `N` (6 in DimeNet).
        cutoff: `c` in the coordinates' unit (5 Å).
        envelope_p: `p` of eq. 8 (6; DimeNet's code passes `envelope_exponent = p − 1`).

    Units: `d` and `c` in the coordinates' unit; `e_n` in unit^(−3/2).

    Raises:
        ValueError: non-positive `num_heads`, `num_radial`, `cutoff` or `envelope_p`.
        TypeError: coordinates without a distance (`Metric`).
    """

    saved_settings = ("cutoff", "envelope_p")

    def __init__(self, num_heads: int, num_radial: int = 6, cutoff: float = 5.0,
                 envelope_p: int = 6) -> None:
        _check("radial_bessel", num_heads, "num_radial", num_radial, cutoff)
        check_int("radial_bessel", "envelope_p", envelope_p)
        super().__init__(num_heads, num_radial)
        self.num_radial, self.cutoff, self.envelope_p = num_radial, float(cutoff), envelope_p

    def basis(self, d: Tensor) -> Tensor:
        d = d.to(torch.promote_types(d.dtype, torch.float32))
        env = polynomial_envelope(d / self.cutoff, self.envelope_p)
        return bessel_rbf(d, self.cutoff, self.num_radial) * env.unsqueeze(-1)
