"""Spherical-harmonics location encoding with a SIREN on top (Rußwurm et al. 2024)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.encodings._precision import module_dtype
from mmpe.encodings._sphere import check_positive_int, sphere_angles
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register

NETWORKS = ("siren", "mlp", "linear")


def real_spherical_harmonics(lat: Tensor, lon: Tensor, max_degree: int) -> Tensor:
    """Real orthonormal spherical harmonics `Y_l^m(φ, λ)` for `l = 0 … L`, `|m| ≤ l`.

    With colatitude `θ = π/2 − φ` (so `cos θ = sin φ`) and `P̄_l^m` the fully normalised
    associated Legendre functions (no Condon–Shortley phase),

    * `Y_l^0 = P̄_l^0(cos θ)`,
    * `Y_l^m = √2 · P̄_l^m(cos θ) · cos(mλ)` for `m > 0`,
    * `Y_l^{−m} = √2 · P̄_l^m(cos θ) · sin(mλ)` for `m > 0`,

    so that `∫_{S²} Y_a Y_b dΩ = δ_ab` (the real harmonics of e.g. Wikipedia's table; with
    SciPy's complex `Y_l^m`: `Y_l^m = √2 (−1)^m Re Y_l^m`, `Y_l^{−m} = √2 (−1)^m Im Y_l^m`).

    `P̄` comes from the standard stable three-term recurrences, never from symbolic expansion:
    `P̄_0^0 = 1/√(4π)`; `P̄_m^m = √((2m+1)/(2m)) · sin θ · P̄_{m−1}^{m−1}`;
    `P̄_{m+1}^m = √(2m+3) · cos θ · P̄_m^m`;
    `P̄_l^m = a_lm (cos θ · P̄_{l−1}^m − b_lm · P̄_{l−2}^m)` with
    `a_lm = √((4l²−1)/(l²−m²))`, `b_lm = √(((l−1)²−m²)/(4(l−1)²−1))`.

    At the poles `sin θ = 0` exactly (clamped at 0), so every `m ≠ 0` term vanishes and the
    encoding is the same for every longitude.

    Args:
        lat, lon: radians, any broadcastable shapes.
        max_degree: `L` ≥ 0; `(L+1)²` functions. (Rußwurm et al.'s "L Legendre polynomials"
            is `max_degree = L − 1`.)

    Returns:
        `[..., (L+1)²]` in the inputs' floating dtype (computed in float64), ordered by degree
            then order: index `l² + l + m`.
    """
    if isinstance(max_degree, bool) or not isinstance(max_degree, int) or max_degree < 0:
        raise ValueError(f"spherical_harmonics: max_degree must be an int >= 0, got {max_degree!r}")
    out_dtype = torch.promote_types(torch.promote_types(lat.dtype, lon.dtype), torch.float32)
    lat, lon = torch.broadcast_tensors(lat.to(torch.float64), lon.to(torch.float64))
    x = torch.sin(lat)                      # cos θ
    s = torch.cos(lat).clamp(min=0.0)       # sin θ ≥ 0
    L = max_degree
    P: dict[tuple[int, int], Tensor] = {}
    pmm = torch.full_like(x, 1.0 / math.sqrt(4 * math.pi))
    for m in range(L + 1):
        if m > 0:
            pmm = math.sqrt((2 * m + 1) / (2 * m)) * s * pmm
        P[m, m] = pmm
        if m + 1 <= L:
            P[m + 1, m] = math.sqrt(2 * m + 3) * x * pmm
        for l in range(m + 2, L + 1):  # noqa: E741 - the field's name for the degree
            a = math.sqrt((4 * l * l - 1) / (l * l - m * m))
            b = math.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
            P[l, m] = a * (x * P[l - 1, m] - b * P[l - 2, m])
    cos_m = [torch.cos(m * lon) for m in range(L + 1)]
    sin_m = [torch.sin(m * lon) for m in range(L + 1)]
    cols: list[Tensor] = []
    root2 = math.sqrt(2.0)
    for l in range(L + 1):  # noqa: E741
        for m in range(-l, l + 1):
            if m < 0:
                cols.append(root2 * P[l, -m] * sin_m[-m])
            elif m == 0:
                cols.append(P[l, 0])
            else:
                cols.append(root2 * P[l, m] * cos_m[m])
    return torch.stack(cols, dim=-1).to(out_dtype)


class Sine(SavesSettings, nn.Module):
    """`sin(w0 · x)` (`w0` saved in the state_dict and checked on load)."""

    saved_settings = ("w0",)

    def __init__(self, w0: float) -> None:
        super().__init__()
        self.w0 = float(w0)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.w0 * x)


class SirenNet(nn.Module):
    """Sinusoidal representation network (Sitzmann et al. 2020), as used by Rußwurm et al.

    `num_layers` hidden layers `h ← sin(w0 · (W h + b))` (`w0_initial` in the first), then a
    linear output layer. Initialisation (Sitzmann et al. §3.2): first layer
    `U(−1/in, 1/in)`, later layers `U(−√(6/in)/w0, √(6/in)/w0)`.

    Shapes: `[..., dim_in] -> [..., dim_out]`.
    """

    def __init__(self, dim_in: int, dim_hidden: int, dim_out: int, num_layers: int = 2,
                 w0: float = 1.0, w0_initial: float = 30.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        fan_in = dim_in
        for i in range(num_layers):
            lin = nn.Linear(fan_in, dim_hidden)
            w = w0_initial if i == 0 else w0
            bound = 1.0 / fan_in if i == 0 else math.sqrt(6.0 / fan_in) / w
            nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.uniform_(lin.bias, -bound, bound)
            layers += [lin, Sine(w)]
            fan_in = dim_hidden
        last = nn.Linear(fan_in, dim_out)
        bound = math.sqrt(6.0 / fan_in) / w0
        nn.init.uniform_(last.weight, -bound, bound)
        nn.init.zeros_(last.bias)
        layers.append(last)
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


@register(
    "spherical_harmonics", hook="input", needs=(Spherical,), learnable=True, family="sphere",
    aliases=("sh",),
    paper="Rußwurm et al. 2024, Geographic Location Encoding with Spherical Harmonics and "
          "Sinusoidal Representation Networks (ICLR)", context=("d_model",))
class SphericalHarmonicsPE(InputEncoding):
    """`P = NN(Y(φ, λ))`: real spherical harmonics up to degree `L` through a small network.

    Rußwurm et al. 2024 encode a location by the `(L+1)²` real spherical harmonics
    ([`real_spherical_harmonics`][mmpe.encodings.spherical_harmonics.real_spherical_harmonics]) — a basis native to the sphere, so the encoding is smooth
    across the date line and the same at a pole for every longitude — and learn a SirenNet
    ([`SirenNet`][mmpe.encodings.spherical_harmonics.SirenNet]) on top, which they found best among the networks they tried.

    Args:
        d_model: output width.
        max_degree: `L` (10 Legendre polynomials in the paper's default = `max_degree=9`).
        network: `"siren"` (default), `"mlp"` (ReLU) or `"linear"`.
        hidden_dim: width of the hidden layers.
        num_layers: hidden layers of the network (ignored for `"linear"`).
        w0, w0_initial: SIREN frequencies (Sitzmann et al.: 1 and 30).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`; uses `coords.lat` and
    `coords.lon` (radians) of [`mmpe.coords.Sphere`][mmpe.coords.sphere.Sphere]; a time axis is ignored.

    Raises:
        ValueError: non-positive `d_model` / `hidden_dim` / `num_layers`, negative
            `max_degree`, unknown `network`.
        TypeError: coordinates that are not on the sphere.
    """

    def __init__(self, d_model: int, max_degree: int = 9, network: str = "siren",
                 hidden_dim: int = 64, num_layers: int = 1, w0: float = 1.0,
                 w0_initial: float = 30.0) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("hidden_dim", hidden_dim), ("num_layers", num_layers)):
            check_positive_int("spherical_harmonics", arg, val)
        if isinstance(max_degree, bool) or not isinstance(max_degree, int) or max_degree < 0:
            raise ValueError(f"spherical_harmonics: max_degree must be an int >= 0, got {max_degree!r}")
        if network not in NETWORKS:
            raise ValueError(f"spherical_harmonics: network must be one of {NETWORKS}, got {network!r}")
        self.max_degree = max_degree
        n_feat = (max_degree + 1) ** 2
        if network == "siren":
            self.net = SirenNet(n_feat, hidden_dim, d_model, num_layers, w0, w0_initial)
        elif network == "mlp":
            layers: list[nn.Module] = []
            fan_in = n_feat
            for _ in range(num_layers):
                layers += [nn.Linear(fan_in, hidden_dim), nn.ReLU()]
                fan_in = hidden_dim
            self.net = nn.Sequential(*layers, nn.Linear(fan_in, d_model))
        else:
            self.net = nn.Linear(n_feat, d_model)

    def features(self, coords: Coordinates) -> Tensor:
        """The harmonics `[s or b, s, (L+1)²]` (float32) before the network."""
        lat, lon = sphere_angles(self, coords)
        return real_spherical_harmonics(lat, lon, self.max_degree).float()

    def forward(self, coords: Coordinates) -> Tensor:
        return self.net(self.features(coords).to(module_dtype(self.net)))
