"""Gaussian basis kernels of pairwise distances as a per-head bias.

Gaussian basis kernels of pairwise distances as a per-head bias (Graphormer-3D, Transformer-M,
Uni-Mol)."""

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

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def gaussian_basis(d: Tensor, means: Tensor, stds: Tensor, mul: Tensor | float = 1.0,
                   bias: Tensor | float = 0.0, eps: float = 1e-5) -> Tensor:
    """`ψ_k(d) = exp(−½((γ·d + β − μ_k)/σ_k)²) / (√(2π)·σ_k)`, `σ_k = |s_k| + eps`.

    Transformer-M eq. 5 (Luo et al. 2023) / Graphormer-3D (Shi et al. 2022): each kernel is a
    normal density in the affinely transformed distance, so it integrates to 1 over `γ·d`.

    Args:
        d: distances, any shape (the coordinates' unit, e.g. Å).
        means: `μ` `[K]`; stds: `s` `[K]` (their absolute value plus `eps` is used,
            as in the reference code).
        mul, bias: `γ` and `β` (scalars; per pair type in the papers).

    Returns:
        `[*d.shape, K]` in the promoted float dtype.
    """
    sigma = stds.abs() + eps
    x = d.unsqueeze(-1) * mul + bias
    return torch.exp(-0.5 * ((x - means) / sigma) ** 2) * (_INV_SQRT_2PI / sigma)


@register(
    "gaussian_distance", hook="score", needs=(Metric,), learnable=True, family="geometry",
    aliases=("gbf", "transformer_m_3d"),
    paper="Luo et al. 2023, One Transformer Can Understand Both 2D & 3D Molecular Data (ICLR; "
          "Transformer-M), eq. 5; Shi et al. 2022, Benchmarking Graphormer on Large-Scale "
          "Molecular Modeling Datasets (Graphormer-3D); Zhou et al. 2023, Uni-Mol (ICLR)",
    context=("num_heads",))
class GaussianDistanceBias(SavesSettings, DistanceFeatureBias):
    """`score + MLP(ψ(d(q, k)))_h`: K learned Gaussian kernels of the distance, an MLP to heads.

    Transformer-M (Luo et al. 2023, eq. 5) and Graphormer-3D (Shi et al. 2022) encode the
    Euclidean distance `d_ij` of two atoms by K Gaussian basis kernels

        `ψ_k(d) = exp(−½((γ d + β − μ_k)/|σ_k|)²) / (√(2π)|σ_k|)`

    ([`gaussian_basis`][mmpe.encodings.gaussian_distance.gaussian_basis]) with learned means `μ_k` and stds `σ_k`, then map the K
    features to one bias per head with a two-layer MLP `Linear(K, W) → GELU → Linear(W, n_h)`
    (`NonLinear` in their code, `W = K`). Uni-Mol (Zhou et al. 2023) uses the same layer.
    The papers' affine `γ, β` is indexed by the pair of atom types; coordinates carry no atom
    types, so here it is a single learned pair `γ` (init 1), `β` (init 0). `μ`, `σ`
    are initialised `U(0, init_range)` (3 in the reference code, for Å).

    The bias depends on the distance only, so on [`mmpe.Points`][mmpe.coords.points.Points] it is invariant to
    rotations, reflections and translations of the point set and equivariant to permutations.
    Written against `Metric`, it runs on any coordinates with a distance.

    Paths: SDPA and the math route evaluate the kernels and the MLP as matrix products on a
    feature axis; FlexAttention gathers from that table (`[b, n_h, n_q, n_k]`, the size of
    one score matrix): unrolled into scalar code, the papers' `K = W = 128` MLP is `≈ 16k`
    operations per score, which FlexAttention takes minutes to trace.

    Args:
        num_heads: `n_h`.
        num_kernels: `K` (128 in Transformer-M / Graphormer-3D / Uni-Mol).
        mlp_width: hidden width `W` of the MLP (`K` in the papers: 128).
        init_range: `μ` and `σ` start `U(0, init_range)` (coordinate units; 3 for Å).
        eps: added to `|σ|` (1e-5 as in the reference code).

    Units: distances and `μ`, `σ` in the coordinates' unit (Å for molecules).

    Raises:
        ValueError: non-positive `num_heads`, `num_kernels`, `mlp_width`, `init_range`
            or `eps`; attention with another head count.
        TypeError: coordinates without a distance (`Metric`).
    """

    saved_settings = ("eps",)

    def __init__(self, num_heads: int, num_kernels: int = 128, mlp_width: int = 128,
                 init_range: float = 3.0, eps: float = 1e-5) -> None:
        super().__init__()
        for arg, val in (("num_heads", num_heads), ("num_kernels", num_kernels),
                         ("mlp_width", mlp_width)):
            check_int("gaussian_distance", arg, val)
        init_range = check_finite_float("gaussian_distance", "init_range", init_range, low=0.0,
                                        low_open=True)
        eps = check_finite_float("gaussian_distance", "eps", eps, low=0.0, low_open=True)
        self.num_heads, self.num_kernels, self.eps = num_heads, num_kernels, float(eps)
        self.feature_width = max(num_kernels, mlp_width)
        self.means = nn.Parameter(torch.empty(num_kernels).uniform_(0.0, float(init_range)))
        self.stds = nn.Parameter(torch.empty(num_kernels).uniform_(0.0, float(init_range)))
        self.mul = nn.Parameter(torch.ones(()))
        self.offset = nn.Parameter(torch.zeros(()))
        self.mlp = nn.Sequential(nn.Linear(num_kernels, mlp_width), nn.GELU(),
                                 nn.Linear(mlp_width, num_heads))

    def features(self, d: Tensor) -> Tensor:
        """The K kernel values `ψ(d)` `[*d.shape, K]` (float32; float64 in a float64 module)."""
        p = self.term_parameters()
        return gaussian_basis(d.to(term_dtype(self)), p["means"], p["stds"], p["mul"],
                              p["offset"], self.eps)

    def term_parameters(self) -> dict[str, Tensor]:
        lin1, lin2 = self.mlp[0], self.mlp[2]
        t = term_dtype(self)
        return {"means": self.means.to(t), "stds": self.stds.to(t), "mul": self.mul.to(t),
                "offset": self.offset.to(t), "w1": lin1.weight.to(t), "b1": lin1.bias.to(t),
                "w2": lin2.weight.to(t), "b2": lin2.bias.to(t)}

    def head_values(self, p: dict[str, Tensor], d: Tensor) -> Tensor:
        psi = gaussian_basis(d, p["means"], p["stds"], p["mul"], p["offset"], self.eps)
        hidden = F.gelu(F.linear(psi, p["w1"], p["b1"]))
        return F.linear(hidden, p["w2"], p["b2"])
