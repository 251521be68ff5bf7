"""Sphere2Vec multi-scale location encoders: SphereC, SphereC+, SphereM, SphereM+ (Mai et al. 2023)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.encodings._precision import KeepDtype
from mmpe.encodings._sphere import check_positive_int, sphere_angles
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register

PAPER = ("Mai et al. 2023, Sphere2Vec: A General-Purpose Location Representation Learning over a "
         "Spherical Surface for Large-Scale Geospatial Predictions (ISPRS J. Photogramm. Remote "
         "Sens.; arXiv:2201.10489), eqs. 7-10")
VARIANTS = ("sphere_c", "sphere_c_plus", "sphere_m", "sphere_m_plus")
#: features per scale of each variant.
FEATURES = {"sphere_c": 3, "sphere_c_plus": 6, "sphere_m": 5, "sphere_m_plus": 8}


def sphere2vec_frequencies(num_scales: int, min_radius: float, max_radius: float) -> Tensor:
    """`ω_s = 1 / r_s` with `r_s = r_min · g^{s/(S−1)}`, `g = r_max / r_min` (float64, `[S]`).

    Largest first-scale frequency `1/r_min`, smallest `1/r_max`; radii in radians.
    """
    if num_scales == 1:
        return torch.tensor([1.0 / max_radius], dtype=torch.float64)
    s = torch.arange(num_scales, dtype=torch.float64) / (num_scales - 1)
    return 1.0 / (min_radius * (max_radius / min_radius) ** s)


def sphere2vec_features(lat: Tensor, lon: Tensor, freqs: Tensor, variant: str) -> Tensor:
    """The Sphere2Vec features of `variant` at every scale, `[..., S · FEATURES[variant]]`.

    With `φ_s = ω_s φ`, `λ_s = ω_s λ` (radians):

    * `sphere_c`:  `[sin φ_s, cos φ_s cos λ_s, cos φ_s sin λ_s]` — at `ω = 1` the unit vector;
    * `sphere_c_plus`: `sphere_c` ∪ `[cos φ_s, sin λ_s, cos λ_s]` (adds the grid terms);
    * `sphere_m`: `[sin φ_s, cos φ_s cos λ, cos φ cos λ_s, cos φ_s sin λ, cos φ sin λ_s]` —
      one angle multi-scale at a time, the other at scale 1;
    * `sphere_m_plus`: `sphere_m` ∪ `[cos φ_s, sin λ_s, cos λ_s]`.
    """
    if variant not in FEATURES:
        raise ValueError(f"sphere2vec: variant must be one of {VARIANTS}, got {variant!r}")
    lat, lon = lat.to(torch.float64)[..., None], lon.to(torch.float64)[..., None]
    phi, lam = lat * freqs, lon * freqs
    sp, cp, sl, cl = phi.sin(), phi.cos(), lam.sin(), lam.cos()
    if variant in ("sphere_c", "sphere_c_plus"):
        feats = [sp, cp * cl, cp * sl]
    else:
        feats = [sp, cp * lon.cos(), lat.cos() * cl, cp * lon.sin(), lat.cos() * sl]
    if variant.endswith("_plus"):
        feats += [cp, sl, cl]
    return torch.cat(feats, dim=-1)


class Sphere2Vec(KeepDtype, SavesSettings, InputEncoding):
    """`P = W · PE_S(φ, λ) + c`: a Sphere2Vec multi-scale encoding and a learned projection.

    Mai et al. 2023 lift Space2Vec's multi-scale sinusoids to the sphere. `S` scales with
    frequencies `ω_s` from `1/r_max` to `1/r_min` ([`sphere2vec_frequencies`][mmpe.encodings.sphere2vec.sphere2vec_frequencies]) enter the
    features of [`sphere2vec_features`][mmpe.encodings.sphere2vec.sphere2vec_features]; a learned linear map `W` takes them to `d_model`
    (the paper puts an FFN on top; here the transformer's own layers follow).

    As in the paper the scaled longitudes `ω_s λ` are not 2π-periodic unless `ω_s` is an
    integer, so the multi-scale terms jump at the date line and, unless `cos(ω_s π/2) = 0`,
    differ at a pole between longitudes. `periodic=True` (not in the paper) rounds every
    `ω_s` to the nearest odd integer: `sphere_c` and `sphere_m` then become continuous
    across the date line and identical at the poles; the `_plus` variants' grid terms
    `sin λ_s`, `cos λ_s` stay longitude-dependent at the poles by construction.

    Args:
        d_model: output width.
        num_scales: `S`.
        min_radius, max_radius: smallest and largest scale (radians); `r_max = 1` makes the
            coarsest `sphere_c` scale exactly the unit vector.
        periodic: round frequencies to odd integers (see above).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: non-positive `d_model`/`num_scales`, or not `0 < min_radius <= max_radius`.
        TypeError: coordinates not on the sphere.
    """

    variant = "sphere_c"
    keep_dtype = ("freqs",)  # float64 scales: the phases ω_s·φ stay exact in bf16 models
    saved_settings = ("freqs",)  # what num_scales, the radii and periodic define

    def __init__(self, d_model: int, num_scales: int = 16, min_radius: float = 0.01,
                 max_radius: float = 1.0, periodic: bool = False) -> None:
        super().__init__()
        check_positive_int(self.variant, "d_model", d_model)
        check_positive_int(self.variant, "num_scales", num_scales)
        if not 0 < min_radius <= max_radius:
            raise ValueError(f"{self.variant}: need 0 < min_radius <= max_radius, got "
                             f"{min_radius}, {max_radius}")
        freqs = sphere2vec_frequencies(num_scales, min_radius, max_radius)
        if periodic:
            freqs = 2 * torch.floor(freqs / 2) + 1  # nearest odd integer (low scales may repeat)
        self.register_buffer("freqs", freqs, persistent=False)
        self.proj = nn.Linear(num_scales * FEATURES[self.variant], d_model)
        self.periodic = bool(periodic)

    def features(self, coords: Coordinates) -> Tensor:
        """`PE_S` before the projection, `[s or b, s, S · features]` float32."""
        lat, lon = sphere_angles(self, coords)
        return sphere2vec_features(lat, lon, self.freqs, self.variant).float()

    def forward(self, coords: Coordinates) -> Tensor:
        return self.proj(self.features(coords).to(self.proj.weight.dtype))


def _variant(name: str, class_name: str) -> type[Sphere2Vec]:
    """The registered [`Sphere2Vec`][mmpe.encodings.sphere2vec.Sphere2Vec] class of one variant
    (`name`, one of `VARIANTS`)."""
    cls = type(class_name, (Sphere2Vec,), {"__doc__": Sphere2Vec.__doc__, "variant": name,
                                           "__module__": __name__, "__qualname__": class_name})
    return register(name, hook="input", needs=(Spherical,), context=("d_model",), learnable=True,
                    family="sphere", paper=PAPER)(cls)


SphereC = _variant("sphere_c", "SphereC")
SphereCPlus = _variant("sphere_c_plus", "SphereCPlus")
SphereM = _variant("sphere_m", "SphereM")
SphereMPlus = _variant("sphere_m_plus", "SphereMPlus")
