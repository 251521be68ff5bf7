"""Scientific geometry: 3D point sets, lat × lon × time, meshes and fields, speech frames.

Invariances are checked numerically on random inputs (float32 points, as models use them):
the distance biases (``gaussian_distance``, ``radial_gaussian``, ``radial_bessel``) and the
frame-averaged RoPE are unchanged under random rotations, reflections and translations
(1e-5; the frame-averaged RoPE with float64 positions, 1e-5 relative with float32 ones) and
equivariant under permutations; axial RoPE and MeshGraphNets' displacement bias are
translation- but not rotation-invariant. The bases are checked against their defining
properties (Bessel orthonormality, envelope and cutoff derivatives, kernel normalisation), the
random Fourier kernel against its stationary closed form, the wav2vec 2.0 convolution against
fairseq's formula and HF transformers' module. ``MEASURED`` holds the largest invariance
error seen per check; ``pytest -s`` prints it.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.attention import dense_bias
from mmpe.coords import Grid, Points, Sequence, Sphere
from mmpe.coords.spacetime import TimeLine
from mmpe.earth import area_weights, weighted_mean, weighted_rmse
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.conv_pe import FrameAxis, fairseq_conv_pe
from mmpe.encodings.fourier_features import nerf_encoding, random_fourier_features
from mmpe.encodings.gaussian_distance import gaussian_basis
from mmpe.encodings.latlon_grid import latlon_cells
from mmpe.encodings.radial_basis import bessel_rbf, cosine_cutoff, polynomial_envelope
from mmpe.encodings.rope_frame_averaged import pca_frames

HEADS, HEAD_DIM, N = 4, 12, 9
SEEDS = settings(max_examples=20, deadline=None)
DISTANCE_BIASES = ["gaussian_distance", "radial_gaussian", "radial_bessel"]

#: the largest error seen per check (``pytest -s`` prints it at the end of the module)
MEASURED: dict[str, float] = {}


def _record(check: str, err: float) -> float:
    MEASURED[check] = max(MEASURED.get(check, 0.0), err)
    return err


def teardown_module() -> None:
    for check, err in sorted(MEASURED.items()):
        print(f"\n{check}: max {err:.2e}", end="")


# -- random Euclidean transformations --------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rotation(gen: torch.Generator, reflect: bool = False) -> torch.Tensor:
    """A Haar-random rotation (QR of a Gaussian matrix), optionally times a reflection."""
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    if reflect:
        q = q @ torch.diag(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    return q


def _cloud(gen: torch.Generator, n: int = N, batch: int = 2) -> torch.Tensor:
    """Atoms-like points (Å): spread ~1.5 Å, distinct PCA eigenvalues (anisotropic)."""
    scale = torch.tensor([2.0, 1.3, 0.8], dtype=torch.float64)
    return torch.randn(batch, n, 3, generator=gen, dtype=torch.float64) * scale


def _transforms(x: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``x`` rotated, reflected (an improper rotation) and translated, as float32."""
    t = torch.randn(3, generator=gen, dtype=torch.float64) * 5.0
    return {"rotation": x @ _rotation(gen).T, "reflection": x @ _rotation(gen, reflect=True).T,
            "translation": x + t, "rotation+translation": x @ _rotation(gen).T + t}


def _ctx(coords, batch: int = 2, q=None, k=None) -> AttentionCall:
    return AttentionCall(coords, HEADS, HEAD_DIM, batch, q=q, k=k)


def _seeded(name: str, **options):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return mmpe.build(name, context={"num_heads": HEADS, "head_dim": HEAD_DIM, "num_axes": 3},
                          **options)


ENCODERS = {name: _seeded(name) for name in DISTANCE_BIASES}
MASK = torch.ones(2, N, dtype=torch.bool)
MASK[1, -3:] = False  # the second example is padded


def _bias(name: str, x: torch.Tensor) -> torch.Tensor:
    points = Points(x.float(), mask=MASK, units="Å")
    with torch.no_grad():
        return dense_bias([ENCODERS[name]], _ctx(points))


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    diff = (a - b).abs()
    if mask is not None:
        diff = diff * mask
    return float(diff.max())


PAIRS = (MASK[:, None, :, None] & MASK[:, None, None, :]).float()  # real pairs only


# -- 1. distance biases: E(3) invariance, permutation equivariance ---------------------------
@SEEDS
@given(st.integers(0, 2**31 - 1))
def test_distance_biases_are_e3_invariant(seed: int) -> None:
    gen = _gen(seed)
    x = _cloud(gen)
    for name in DISTANCE_BIASES:
        ref = _bias(name, x)
        assert ref.abs().max() > 1e-3, name  # not trivially zero
        for what, moved in _transforms(x, gen).items():
            err = _record(f"{name} {what}", _max_diff(_bias(name, moved), ref, PAIRS))
            assert err < 1e-5, (name, what, err)


@SEEDS
@given(st.integers(0, 2**31 - 1))
def test_distance_biases_are_permutation_equivariant(seed: int) -> None:
    gen = _gen(seed)
    x = _cloud(gen, batch=1)[0]
    perm = torch.randperm(N, generator=gen)
    for name in DISTANCE_BIASES:
        points, permuted = Points(x.float()), Points(x[perm].float())
        with torch.no_grad():
            ref, out = dense_bias([ENCODERS[name]], _ctx(points)), dense_bias([ENCODERS[name]], _ctx(permuted))
        err = _record(f"{name} permutation", _max_diff(out, ref[:, :, perm][:, :, :, perm]))
        assert err < 1e-6, (name, err)


def test_attention_with_distance_biases_is_invariant_end_to_end() -> None:
    """A whole Transformer over atoms: rotating and translating the molecule leaves it alone."""
    gen = _gen(3)
    x = _cloud(gen)
    torch.manual_seed(0)
    model = mmpe.Transformer(24, 4, 2, ["gaussian_distance", "radial_bessel",
                                        "rope_frame_averaged"]).eval()
    h = torch.randn(2, N, 24, generator=gen)
    with torch.no_grad():
        ref = model(h, Points(x.float(), mask=MASK))
        for what, moved in _transforms(x, gen).items():
            out = model(h, Points(moved.float(), mask=MASK))
            err = _record(f"transformer {what}", _max_diff(out[0], ref[0]))
            assert err < 1e-5, (what, err)


# -- 2. frame-averaged RoPE ----------------------------------------------------------------
def _fa_scores(enc, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    with torch.no_grad():
        return enc.scores(q, k, Points(x.to(dtype), mask=MASK))


@SEEDS
@given(st.integers(0, 2**31 - 1))
def test_frame_averaged_rope_is_e3_invariant(seed: int) -> None:
    """Invariant to 1e-5 with float64 positions; with float32 positions the rounding of the
    moved coordinates themselves (ε·|x + t| ≈ 1e-6 Å) enters the phases: 1e-5 relative."""
    gen = _gen(seed)
    x = _cloud(gen)
    q, k = (torch.randn(2, HEADS, N, HEAD_DIM, generator=gen) for _ in range(2))
    enc = mmpe.build("rope_frame_averaged", head_dim=HEAD_DIM, base=10.0)
    for dtype, label in ((torch.float64, ""), (torch.float32, " (float32 positions, relative)")):
        ref = _fa_scores(enc, x, q, k, dtype)
        size = float(ref.abs().max()) if dtype == torch.float32 else 1.0
        for what, moved in _transforms(x, gen).items():
            diff = _max_diff(_fa_scores(enc, moved, q, k, dtype), ref, PAIRS) / size
            err = _record(f"rope_frame_averaged {what}{label}", diff)
            assert err < 1e-5, (what, label, err)
    perm = torch.randperm(N, generator=gen)
    with torch.no_grad():
        base_scores = enc.scores(q[:1], k[:1], Points(x[0:1]))
        permuted = enc.scores(q[:1, :, perm], k[:1, :, perm], Points(x[0:1, perm]))
    err = _record("rope_frame_averaged permutation",
                  _max_diff(permuted, base_scores[:, :, perm][:, :, :, perm]))
    assert err < 1e-5


def _explicit_frame_average(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            reflections: bool = True) -> torch.Tensor:
    """``(1/|F|) Σ_O (R(y_q^O) q)·(R(y_k^O) k)`` with rope_axial's rotation, frame by frame."""
    axial = mmpe.build("rope_axial", head_dim=HEAD_DIM, base=10.0)
    centroid, frames = pca_frames(x, reflections=reflections)
    expected = torch.zeros(q.shape[0], HEADS, x.shape[0], x.shape[0])
    for frame in frames:
        qr, kr = axial(q, k, Points(((x.double() - centroid) @ frame).float()))
        expected += qr @ kr.transpose(-1, -2) / len(frames)
    return expected


def test_frame_averaged_rope_equals_the_paper_average_over_all_frames() -> None:
    """The 2-frame computation is the average over the 8 E(3) frames (and the 4 SE(3) ones)."""
    gen = _gen(11)
    x = _cloud(gen, batch=1)[0].float()
    q, k = (torch.randn(1, HEADS, N, HEAD_DIM, generator=gen) for _ in range(2))
    enc = mmpe.build("rope_frame_averaged", head_dim=HEAD_DIM, base=10.0)
    with torch.no_grad():
        got = enc.scores(q, k, Points(x))
    e3 = _explicit_frame_average(x, q, k)
    se3 = _explicit_frame_average(x, q, k, reflections=False)
    err = _record("rope_frame_averaged vs explicit 8-frame average", float((got - e3).abs().max()))
    assert err < 2e-5
    torch.testing.assert_close(se3, e3, atol=2e-5, rtol=1e-5)
    # the frames are orthonormal; the SE(3) set keeps the 4 with det = +1
    _, frames = pca_frames(x)
    assert frames.shape == (8, 3, 3)
    eye = torch.eye(3, dtype=torch.float64).expand(8, 3, 3)
    torch.testing.assert_close(frames.transpose(-1, -2) @ frames, eye)
    _, proper = pca_frames(x, reflections=False)
    assert proper.shape == (4, 3, 3) and bool((torch.linalg.det(proper) > 0).all())


def test_frame_averaged_rope_attention_paths_agree() -> None:
    gen = _gen(5)
    points = Points(_cloud(gen).float(), mask=MASK)
    torch.manual_seed(0)
    mha = mmpe.MultiHeadAttention(HEADS * HEAD_DIM, HEADS, [mmpe.build(
        "rope_frame_averaged", head_dim=HEAD_DIM)])
    x = torch.randn(2, N, HEADS * HEAD_DIM, generator=gen)
    with torch.no_grad():
        outs = {}
        for route in ("sdpa", "math"):
            mha.route = route
            outs[route] = mha(x, points)
    torch.testing.assert_close(outs["sdpa"], outs["math"], atol=1e-5, rtol=1e-5)


# -- 3. axial RoPE and MeshGraphNets: translation- but not rotation-invariant ----------------
def _axial_scores(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    rope = mmpe.build("rope_axial", head_dim=HEAD_DIM, base=10.0)
    qr, kr = rope(q, k, Points(x.float()))
    return qr @ kr.transpose(-1, -2)


def test_axial_rope_is_translation_but_not_rotation_invariant() -> None:
    gen = _gen(13)
    x = _cloud(gen, batch=1)
    q, k = (torch.randn(1, HEADS, N, HEAD_DIM, generator=gen) for _ in range(2))
    ref = _axial_scores(x, q, k)
    moved = _transforms(x, gen)
    err = _record("rope_axial translation", _max_diff(_axial_scores(moved["translation"], q, k), ref))
    assert err < 1e-4  # phases of |x + t| ≈ 10 rad in float32: ~1e-6 relative
    changed = _max_diff(_axial_scores(moved["rotation"], q, k), ref)
    _record("rope_axial rotation (changes)", changed)
    assert changed > 0.1


def test_mesh_displacement_is_translation_but_not_rotation_invariant() -> None:
    gen = _gen(17)
    x = _cloud(gen)
    torch.manual_seed(0)
    enc = mmpe.build("mesh_displacement", num_heads=HEADS, num_axes=3)

    def bias(pos):
        with torch.no_grad():
            return dense_bias([enc], _ctx(Points(pos.float(), mask=MASK)))

    ref = bias(x)
    moved = _transforms(x, gen)
    err = _record("mesh_displacement translation", _max_diff(bias(moved["translation"]), ref, PAIRS))
    assert err < 1e-5
    assert _max_diff(bias(moved["rotation"]), ref, PAIRS) > 1e-3
    # the features are MeshGraphNets' [x_i − x_j, |x_i − x_j|]
    feats = enc.features(Points(x[0].float()))
    diff = (x[0, :, None] - x[0, None]).float()
    torch.testing.assert_close(feats, torch.cat((diff, diff.norm(dim=-1, keepdim=True)), -1))


def test_mesh_displacement_embeds_lower_dimensional_positions() -> None:
    """A 2D mesh in a 3-axis encoding is the plane z = 0; more axes than built is an error."""
    torch.manual_seed(0)
    enc = mmpe.build("mesh_displacement", num_heads=HEADS, num_axes=3)
    xy = torch.randn(5, 2)
    flat, lifted = Points(xy), Points(torch.cat((xy, torch.zeros(5, 1)), -1))
    torch.testing.assert_close(dense_bias([enc], _ctx(flat, 1)), dense_bias([enc], _ctx(lifted, 1)))
    with pytest.raises(ValueError, match="num_axes=2"):
        dense_bias([mmpe.build("mesh_displacement", num_heads=HEADS, num_axes=2)], _ctx(lifted, 1))


# -- 4. properties of the bases ----------------------------------------------------------
def test_bessel_basis_is_orthonormal_on_the_cutoff_ball() -> None:
    """``∫_0^c e_n(d) e_m(d) d² dd = δ_nm`` (DimeNet eq. 7: j_0 with zeros at c)."""
    c, n = 5.0, 8
    d = torch.linspace(0.0, c, 200_001, dtype=torch.float64)
    e = bessel_rbf(d, c, n)  # [D, n]
    gram = torch.trapezoid(e[:, :, None] * e[:, None, :] * (d * d)[:, None, None], d, dim=0)
    err = _record("bessel orthonormality", float((gram - torch.eye(n, dtype=torch.float64)).abs().max()))
    assert err < 1e-8
    # the d → 0 limit √(2/c)·nπ/c, finite with a finite gradient
    zero = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    at0 = bessel_rbf(zero, c, n)
    expected = math.sqrt(2 / c) * torch.arange(1, n + 1, dtype=torch.float64) * math.pi / c
    torch.testing.assert_close(at0[0], expected)
    at0.sum().backward()
    assert torch.isfinite(zero.grad).all()


@pytest.mark.parametrize("p", [1, 3, 6, 9])
def test_envelope_and_its_derivatives_vanish_at_the_cutoff(p: int) -> None:
    x = torch.tensor([0.0, 1.0 - 1e-12, 1.0], dtype=torch.float64, requires_grad=True)
    u = polynomial_envelope(x, p)
    (du,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    (d2u,) = torch.autograd.grad(du.sum(), x)
    u, du = u.detach(), du.detach()
    assert float(u[0]) == 1.0 and abs(float(u[1])) < 1e-9 and float(u[2]) == 0.0
    assert abs(float(du[1])) < 1e-8 and abs(float(d2u[1])) < 1e-6
    beyond = polynomial_envelope(torch.tensor([1.0, 1.5, 7.0], dtype=torch.float64), p)
    assert torch.equal(beyond, torch.zeros(3, dtype=torch.float64))
    # eq. 8 with p = 6: u = 1 − 28x⁶ + 48x⁷ − 21x⁸
    if p == 6:
        xs = torch.linspace(0, 0.99, 7, dtype=torch.float64)
        torch.testing.assert_close(polynomial_envelope(xs, 6), 1 - 28 * xs**6 + 48 * xs**7 - 21 * xs**8)


def test_cosine_cutoff_and_radial_biases_reach_zero_smoothly() -> None:
    c = 5.0
    d = torch.tensor([c - 1e-9], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(cosine_cutoff(d, c).sum(), d)
    assert abs(float(cosine_cutoff(d.detach(), c))) < 1e-12 and abs(float(grad)) < 1e-8
    # pairs beyond the cutoff get exactly 0; just inside, almost 0
    x = torch.tensor([[0.0, 0.0, 0.0], [5.5, 0.0, 0.0], [4.999, 0.0, 0.0], [1.0, 0.0, 0.0]])
    for name in ("radial_gaussian", "radial_bessel"):
        bias = dense_bias([ENCODERS[name]], _ctx(Points(x), 1)).detach()
        assert torch.equal(bias[0, :, 0, 1], torch.zeros(HEADS)), name
        assert float(bias[0, :, 0, 2].abs().max()) < 1e-6, name
        assert float(bias[0, :, 0, 3].abs().max()) > 1e-3, name


def test_schnet_gaussians_on_their_grid() -> None:
    enc = ENCODERS["radial_gaussian"]
    centers = enc.centers()
    assert centers.shape == (50,) and float(centers[0]) == 0.0 and float(centers[-1]) == 5.0
    feats = enc.basis(centers[10:11])  # at a centre: exp(0)·C(μ)
    assert float(feats[0, 10]) == pytest.approx(float(cosine_cutoff(centers[10], 5.0)), rel=1e-6)
    d = torch.tensor([1.234])
    expected = torch.exp(-10.0 * (d[:, None] - centers) ** 2) * cosine_cutoff(d, 5.0)[:, None]
    torch.testing.assert_close(enc.basis(d), expected)


def test_gaussian_kernels_are_normal_densities() -> None:
    """Each ψ_k integrates to 1 over γd + β (Transformer-M eq. 5), so to 1/|γ| over d."""
    enc = ENCODERS["gaussian_distance"]
    d = torch.linspace(-40.0, 40.0, 100_001, dtype=torch.float64)
    means, stds = enc.means.detach().double(), enc.stds.detach().double()
    for gamma, beta in ((1.0, 0.0), (1.7, -0.4)):
        psi = gaussian_basis(d, means, stds, gamma, beta, eps=1e-5)
        mass = torch.trapezoid(psi, d, dim=0) * gamma
        err = _record("gaussian kernel mass", float((mass - 1).abs().max()))
        assert err < 1e-6
    # the module's features are the formula with its learned γ (1), β (0)
    x = torch.tensor([0.3, 2.0])
    sigma = enc.stds.detach().abs() + 1e-5
    expected = torch.exp(-0.5 * ((x[:, None] - enc.means.detach()) / sigma) ** 2) / (
        math.sqrt(2 * math.pi) * sigma)
    torch.testing.assert_close(enc.features(x).detach(), expected)


def test_gaussian_distance_bias_is_the_mlp_of_the_kernels() -> None:
    enc = ENCODERS["gaussian_distance"]
    x = torch.randn(6, 3, generator=_gen(2))
    points = Points(x)
    with torch.no_grad():
        bias = dense_bias([enc], _ctx(points, 1))
        d = torch.cdist(x, x)
        expected = enc.mlp(enc.features(d)).permute(2, 0, 1)
    torch.testing.assert_close(bias[0], expected, atol=1e-5, rtol=1e-5)


# -- 5. Fourier features and NeRF --------------------------------------------------------------
@SEEDS
@given(st.integers(0, 2**31 - 1))
def test_random_fourier_kernel_is_stationary(seed: int) -> None:
    """``γ(x)·γ(y) = Σ_i cos(2π b_i·(x − y))``: it depends on ``x − y`` only."""
    gen = _gen(seed)
    B = torch.randn(64, 3, generator=gen) * 0.7
    x, y = (torch.randn(5, 3, generator=gen, dtype=torch.float64) * 3 for _ in range(2))
    t = torch.randn(3, generator=gen, dtype=torch.float64) * 10
    kernel = random_fourier_features(x, B) @ random_fourier_features(y, B).T
    closed = torch.cos(2 * math.pi * (x[:, None] - y[None]) @ B.double().T).sum(-1)
    shifted = random_fourier_features(x + t, B) @ random_fourier_features(y + t, B).T
    err = _record("fourier kernel stationarity", max(float((kernel - closed).abs().max()),
                                                     float((shifted - kernel).abs().max())))
    assert err < 1e-4  # 64 float32 terms of size 1


def test_fourier_features_module_on_any_positioned_coordinates() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("fourier_features", d_model=16, num_axes=3, num_frequencies=8, sigma=0.5)
    for coords in (Points(torch.randn(2, 5, 3)), Grid((2, 3), prefix_tokens=1),
                   Sphere(torch.tensor([10.0, 20.0]), torch.tensor([0.0, 90.0])), Sequence(4)):
        out = enc(coords)
        assert out.shape[-2:] == (coords.num_queries, 16) and torch.isfinite(out).all()
    pts = Points(torch.randn(4, 3))
    torch.testing.assert_close(enc.features(pts), random_fourier_features(pts.query_positions, enc.B))
    assert enc.B.std().item() == pytest.approx(0.5, rel=0.5)
    assert mmpe.build("fourier_features", d_model=16).to(torch.bfloat16).B.dtype == torch.float32
    with pytest.raises(ValueError, match="num_axes"):
        mmpe.build("fourier_features", d_model=16, num_axes=2)(pts)


def test_nerf_encoding_is_the_paper_formula() -> None:
    p = torch.tensor([[0.25, -0.5, 0.9]])
    feats = nerf_encoding(p, 4)  # [1, 2·4·3]
    for k in range(4):
        torch.testing.assert_close(feats[0, 6 * k: 6 * k + 3], torch.sin(2**k * math.pi * p[0]))
        torch.testing.assert_close(feats[0, 6 * k + 3: 6 * k + 6], torch.cos(2**k * math.pi * p[0]))
    torch.manual_seed(0)
    enc = mmpe.build("nerf", d_model=16, num_axes=3, num_frequencies=4, scale=0.5,
                     include_input=True)
    pts = Points(p * 2)
    torch.testing.assert_close(enc.features(pts), torch.cat((p, feats), -1))
    assert enc(pts).shape == (1, 16)


# -- 6. lat × lon × time -----------------------------------------------------------------------
def test_latlon_grid_is_fourcastnets_table_on_its_grid() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("latlon_grid", d_model=8, grid_shape=(6, 12))
    grid = Sphere.grid(6, 12)
    torch.testing.assert_close(enc(grid), enc.table.reshape(72, 8), rtol=0, atol=0)
    timed = Sphere.grid(6, 12, times=[0.0, 6.0, 12.0])  # time-major: the table per step
    torch.testing.assert_close(enc(timed), enc.table.reshape(72, 8).repeat(3, 1), rtol=0, atol=0)
    # scattered points get the cell that contains them; the date line wraps to column 0
    lat = torch.deg2rad(torch.tensor([-89.9, 89.9, 0.1, 10.0]))
    lon = torch.deg2rad(torch.tensor([179.9, -180.0, 14.9, 15.1]))
    i, j = latlon_cells(lat, lon, 6, 12)
    assert i.tolist() == [0, 5, 3, 3] and j.tolist() == [0, 0, 6, 7]
    with pytest.raises(ValueError, match="grid_shape=\\(4, 8\\)"):
        enc(Sphere.grid(4, 8))
    with pytest.raises(TypeError, match="Spherical"):
        enc(Grid((6, 12)))


def test_area_weights_and_weighted_rmse() -> None:
    lat = torch.tensor([-60.0, 0.0, 60.0])
    torch.testing.assert_close(area_weights(lat), torch.tensor([0.75, 1.5, 0.75]))
    grid = Sphere.grid(8, 16)
    lat_rows = torch.rad2deg(grid.lat.reshape(8, 16)[:, 0]).double()
    gen = _gen(1)
    pred, target = (torch.randn(3, 8, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    # WeatherBench eq. 2: √(1/(N_lat N_lon) Σ L(φ_j) (f − t)²), L = cos φ / mean cos φ
    L = area_weights(lat_rows)
    expected = ((L[:, None] * (pred - target) ** 2).mean(dim=(-2, -1))).sqrt()
    torch.testing.assert_close(weighted_rmse(pred, target, lat_rows[:, None]), expected)
    # per-token latitudes give the same number
    tokens = weighted_rmse(pred.reshape(3, -1), target.reshape(3, -1),
                           torch.rad2deg(grid.lat).double(), dim=-1)
    torch.testing.assert_close(tokens, expected)
    # a constant error is its own RMSE; the mean of a constant is the constant
    torch.testing.assert_close(weighted_rmse(target + 2.0, target, lat_rows[:, None]),
                               torch.full((3,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(weighted_mean(torch.ones(8, 16), lat_rows[:, None].float()),
                               torch.tensor(1.0))
    with pytest.raises(ValueError, match="lat"):
        weighted_rmse(pred, target, lat_rows)  # [n_lat] for a 2D grid: ambiguous, refused
    with pytest.raises(ValueError, match="lat"):
        area_weights(torch.tensor([95.0]))
    with pytest.raises(ValueError, match="units"):
        area_weights(lat, units="grad")


def test_spacetime_adds_or_concatenates_space_and_time() -> None:
    torch.manual_seed(0)
    coords = Sphere.grid(4, 8, times=[0.0, 6.0, 12.0])
    add = mmpe.build("spacetime", d_model=16, spatial="latlon_sincos", temporal="sinusoidal")
    space = mmpe.build("latlon_sincos", d_model=16)(coords)
    time = mmpe.build("sinusoidal", d_model=16)(TimeLine(coords.time))
    torch.testing.assert_close(add(coords), space + time)
    # EarthFormer/FourCastNet style: a learned grid table plus sinusoids of the hour
    cat = mmpe.build("spacetime", d_model=16, spatial={"name": "latlon_grid", "grid_shape": (4, 8)},
                     concat=True, time_dim=4)
    out = cat(coords)
    assert out.shape == (96, 16)
    torch.testing.assert_close(out[:, :12], cat.spatial.table.reshape(32, 12).repeat(3, 1))
    torch.testing.assert_close(out[:, 12:], mmpe.build("sinusoidal", d_model=4)(TimeLine(coords.time)))
    # without time stamps: one snapshot at t = 0
    snapshot = Sphere.grid(4, 8)
    torch.testing.assert_close(add(snapshot), mmpe.build("latlon_sincos", d_model=16)(snapshot)
                               + mmpe.build("sinusoidal", d_model=16)(Sequence(1))[0])
    model = mmpe.Transformer(16, 2, 1, ["spacetime"])
    assert model(torch.randn(2, 96, 16), coords).shape == (2, 96, 16)
    for bad, match in (({"spatial": "rope"}, "input encoding"), ({"spatial": "sincos"}, "lat/lon"),
                       ({"temporal": "spherical_harmonics"}, "1D"), ({"spatial": {"grid": 1}}, "name"),
                       ({"concat": True, "time_dim": 16}, "time_dim")):
        with pytest.raises(ValueError, match=match):
            mmpe.build("spacetime", d_model=16, **bad)


# -- 7. wav2vec 2.0 convolutional position embedding --------------------------------------------
def _weight(enc) -> torch.Tensor:
    """``W = g · v / ‖v‖`` with the norm over every dim but the kernel axis (dim=2)."""
    g = enc.conv.parametrizations.weight.original0
    v = enc.conv.parametrizations.weight.original1
    return g * v / v.norm(dim=(0, 1), keepdim=True)


def test_conv_pe_is_fairseqs_pos_conv() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("conv_pe", d_model=32)  # kernel 128, 16 groups
    x = torch.randn(2, 50, 32)
    with torch.no_grad():
        out = enc.combine(x, Sequence(50))
        conv = F.conv1d(x.transpose(1, 2), _weight(enc), enc.conv.bias, padding=64, groups=16)
        expected = x + F.gelu(conv[..., :-1]).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        fairseq_conv_pe(x.transpose(1, 2), _weight(enc).detach(), enc.conv.bias.detach(), 16),
        (expected - x).transpose(1, 2), atol=1e-5, rtol=1e-5)
    assert enc.conv.weight.shape == (32, 2, 128)
    with pytest.raises(TypeError, match="combine"):
        enc(Sequence(50))


def test_conv_pe_equals_hf_wav2vec2() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2PositionalConvEmbedding

    config = transformers.Wav2Vec2Config(hidden_size=32, num_conv_pos_embeddings=128,
                                         num_conv_pos_embedding_groups=16,
                                         feat_extract_activation="gelu")
    hf = Wav2Vec2PositionalConvEmbedding(config).eval()
    torch.manual_seed(1)
    enc = mmpe.build("conv_pe", d_model=32)
    hf.load_state_dict(enc.state_dict())
    x = torch.randn(2, 37, 32)
    with torch.no_grad():
        torch.testing.assert_close(enc.combine(x, Sequence(37)), x + hf(x), atol=1e-5, rtol=1e-5)


def test_conv_pe_is_translation_equivariant_in_time() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("conv_pe", d_model=32, kernel_size=16, groups=4)
    x = torch.zeros(1, 60, 32)
    x[:, 10:30] = torch.randn(1, 20, 32)  # support inside, so a shift loses nothing
    with torch.no_grad():
        y = enc.term(x, Sequence(60))
        for shift in (1, 7, 25):
            ys = enc.term(torch.roll(x, shift, dims=1), Sequence(60))
            err = _record("conv_pe time shift", float((ys[:, shift:] - y[:, :60 - shift]).abs().max()))
            assert err < 1e-6


def test_conv_pe_on_a_time_frequency_grid_convolves_each_row_over_time() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("conv_pe", d_model=32, kernel_size=8, groups=4)
    T, Fq = 6, 5
    x = torch.randn(2, 1 + T * Fq, 32)
    with torch.no_grad():
        for axes, t_first in ((("t", "f"), True), (("f", "t"), False)):
            shape = (T, Fq) if t_first else (Fq, T)
            grid = Grid(shape, prefix_tokens=1, axes=axes)
            out = enc.combine(x, grid)
            assert torch.equal(out[:, 0], x[:, 0])  # the cls token is left alone
            cells = x[:, 1:].reshape(2, *shape, 32)
            rows = cells if not t_first else cells.transpose(1, 2)  # [2, F, T, d]
            for f in range(Fq):
                ref = enc.term(rows[:, f], Sequence(T))
                got = (out[:, 1:] - x[:, 1:]).reshape(2, *shape, 32)
                got = got[:, :, f] if t_first else got[:, f]
                torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_conv_pe_coordinates_and_input_checks() -> None:
    torch.manual_seed(0)
    enc = mmpe.build("conv_pe", d_model=32, kernel_size=8, groups=4)
    assert isinstance(Sequence(4), FrameAxis) and isinstance(Grid((2, 3)), FrameAxis)
    # numbers and v2pe: Sequences (a V2PESequence's frames are its tokens in order)
    assert {"grid", "sequence", "numbers", "v2pe"} == set(mmpe.get("conv_pe").coords)
    with pytest.raises(ValueError, match="causal"):
        enc.combine(torch.randn(1, 4, 32), Sequence(4, causal=True))
    with pytest.raises((TypeError, ValueError), match="FrameAxis"):
        enc.combine(torch.randn(1, 4, 32), Points(torch.randn(4, 3)))
    with pytest.raises(ValueError, match="x must be"):
        enc.combine(torch.randn(1, 5, 32), Sequence(4))
    # padded frames are zeroed before the convolution (fairseq)
    pad = torch.tensor([[True, True, True, False]])
    x = torch.randn(1, 4, 32)
    with torch.no_grad():
        masked = enc.term(x, Sequence(4, padding_mask=pad))
        zeroed = enc.term(x * pad[..., None], Sequence(4))
    torch.testing.assert_close(masked, zeroed)
    with pytest.raises(ValueError, match="groups"):
        mmpe.build("conv_pe", d_model=30)


# -- 8. registry metadata and bad options ----------------------------------------------------
def test_registry_entries() -> None:
    expected = {
        "gaussian_distance": ("score", "Metric"), "radial_gaussian": ("score", "Metric"),
        "radial_bessel": ("score", "Metric"), "mesh_displacement": ("score", "Positioned"),
        "rope_frame_averaged": ("score", "Positioned"), "fourier_features": ("input", "Positioned"),
        "nerf": ("input", "Positioned"), "latlon_grid": ("input", "Spherical"),
        "spacetime": ("input", "Spherical"), "conv_pe": ("input", "FrameAxis"),
    }
    for name, (hook, need) in expected.items():
        entry = mmpe.get(name)
        assert entry.hook == hook and [c.__name__ for c in entry.needs] == [need], name
        assert entry.paper
    assert {"gaussian_distance", "radial_bessel", "rope_frame_averaged", "nerf"} <= {
        e.name for e in mmpe.available(coords="points")}


@pytest.mark.parametrize(("name", "options", "arg"), [
    ("gaussian_distance", {"num_kernels": 0}, "num_kernels"),
    ("gaussian_distance", {"eps": -1.0}, "eps"),
    ("radial_gaussian", {"cutoff": 0.0}, "cutoff"),
    ("radial_gaussian", {"gamma": float("nan")}, "gamma"),
    ("radial_bessel", {"envelope_p": 0}, "envelope_p"),
    ("mesh_displacement", {"length_scale": -2.0}, "length_scale"),
    ("rope_frame_averaged", {"head_dim": 10, "num_axes": 3}, "num_axes"),
    ("rope_frame_averaged", {"head_dim": 7}, "head_dim"),
    ("rope_frame_averaged", {"base": 1.0}, "base"),
    ("fourier_features", {"sigma": 0.0}, "sigma"),
    ("nerf", {"include_input": "yes"}, "include_input"),
    ("latlon_grid", {"grid_shape": (4, 8, 2)}, "grid_shape"),
    ("conv_pe", {"kernel_size": 0}, "kernel_size"),
])
def test_bad_options_name_the_argument(name: str, options: dict, arg: str) -> None:
    context = {"num_heads": HEADS, "head_dim": HEAD_DIM, "d_model": 32}
    with pytest.raises((ValueError, TypeError), match=arg):
        mmpe.build(name, context=context, **options)
