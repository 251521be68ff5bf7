"""Learned N-D rotations: LieRE (Ostmeier et al. 2024), STRING (Schenck et al. 2025),
ComRoPE-AP/-LD (Yu et al. 2025).

Closed forms and properties over whole ranges (hypothesis: axes 1–3, block sizes, heads,
random parameters and positions), each with a control that fails the same check:

* orthogonality, `‖R(x) q‖ = ‖q‖` — control: a generator with a symmetric part;
* translation invariance `R(x)ᵀR(y) = R(y − x)` and relative scores — STRING and ComRoPE for
  any number of axes, LieRE with one axis; control: LieRE with ≥ 2 non-commuting generators;
* reduction to `rope` / `rope_axial` (RoPE generators, P = I), to float32 rounding of the
  learned frequencies — control: the other pair layout;
* STRING equals `exp(Σ_a x_a P L_a Pᵀ)` computed with `matrix_exp`;
* gradients reach every learned parameter; the no-grad Grid cache is invalidated by updates.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.encodings._learned_rotation import rope_generators, skew, upper_entries
from mmpe.encodings.comrope import ComRoPEAP, ComRoPELD
from mmpe.encodings.liere import LieRE
from mmpe.encodings.string_rope import cayley

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
LEARNED = ["liere", "string_rope", "comrope_ap", "comrope_ld"]
INVARIANT = ["string_rope", "comrope_ap", "comrope_ld"]


def _build(name: str, head_dim: int, num_axes: int, seed: int = 0, **options):
    """An encoding with non-trivial random parameters (so no property holds by accident)."""
    torch.manual_seed(seed)
    if name == "liere":
        options.setdefault("init", "random")
        options.setdefault("init_std", 0.3)
    if name == "string_rope":
        options.setdefault("init_std", 0.3)
    enc = mmpe.build(name, head_dim=head_dim, num_axes=num_axes, **options)
    if name == "string_rope":
        with torch.no_grad():
            enc.freqs.add_(0.2 * torch.randn_like(enc.freqs))  # mixed-axis frequencies
    if name.startswith("comrope"):
        with torch.no_grad():
            enc.blocks.mul_(0.3)
    return enc


def _head_dim(name: str, num_axes: int, block: int) -> int:
    unit = {"liere": block, "string_rope": 2 * num_axes, "comrope_ap": block * num_axes,
            "comrope_ld": block}[name]
    return unit * max(1, 12 // unit)


configs = st.tuples(st.sampled_from(LEARNED), st.integers(1, 3), st.sampled_from([2, 3, 4]),
                    st.integers(0, 10_000))


def _positions(num_axes: int, n: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, num_axes, generator=torch.Generator().manual_seed(seed)) * scale


@SETTINGS
@given(configs)
def test_rotations_are_orthogonal(cfg) -> None:
    name, axes, block, seed = cfg
    if name == "string_rope":
        block = 2
    d = _head_dim(name, axes, block)
    enc = _build(name, d, axes, seed, **({} if name == "string_rope" else {"block_size": block}))
    pos = _positions(axes, 5, seed)
    r = enc.rotation(pos.double())  # [1, n, d, d]
    eye = torch.eye(d, dtype=torch.float64)
    assert (r.transpose(-1, -2) @ r - eye).abs().max() < 1e-6
    q = torch.randn(1, 1, 5, d, dtype=torch.float64)
    coords = mmpe.Points(pos.double())
    out = enc(q, q, coords)[0]
    torch.testing.assert_close(out.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)


def test_orthogonality_control_a_symmetric_part_changes_norms() -> None:
    class NotSkew(LieRE):
        def generator_matrices(self):
            g = super().generator_matrices()
            return g + g.abs().transpose(-1, -2)

        def rotation_blocks(self, positions):
            gens = self.generator_matrices().to(positions.dtype)
            return torch.linalg.matrix_exp(torch.einsum("ua,ahkij->hukij", positions, gens))

    torch.manual_seed(0)
    enc = NotSkew(8, 2, init="random", init_std=0.3)
    q = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    out = enc(q, q, mmpe.Points(_positions(2, 4, 0).double()))[0]
    assert (out.norm(dim=-1) - q.norm(dim=-1)).abs().max() > 1e-2


def _scores(enc, q, k, qpos, kpos) -> torch.Tensor:
    a = enc(q, q, mmpe.Points(qpos))[0]
    b = enc(k, k, mmpe.Points(kpos))[0]
    return a @ b.transpose(-1, -2)


@SETTINGS
@given(st.sampled_from(INVARIANT), st.integers(2, 3), st.sampled_from([2, 4]),
       st.integers(0, 10_000), st.booleans())
def test_translation_invariance_in_2d_and_3d(name, axes, block, seed, per_head) -> None:
    d = _head_dim(name, axes, block)
    extra = {} if name == "string_rope" else {"block_size": block}
    enc = _build(name, d, axes, seed, num_heads=2, per_head=per_head, **extra)
    x, y = _positions(axes, 4, seed).double(), _positions(axes, 4, seed + 1).double()
    t = _positions(axes, 1, seed + 2, scale=5.0).double()
    # matrices: R(x)ᵀ R(y) = R(y − x), every pair of tokens
    rx, ry, rd = enc.rotation(x), enc.rotation(y), enc.rotation(y - x)
    torch.testing.assert_close(rx.transpose(-1, -2) @ ry, rd, rtol=0, atol=1e-10)
    # scores: shifting every query and key by t leaves q_iᵀ k_j unchanged
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 4, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 4, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(_scores(enc, q, k, x + t, y + t), _scores(enc, q, k, x, y),
                               rtol=0, atol=1e-9)


@SETTINGS
@given(st.integers(2, 3), st.sampled_from([3, 4, None]), st.integers(0, 10_000))
def test_translation_control_liere_with_noncommuting_generators(axes, block, seed) -> None:
    d = 12 if block != 4 else 8  # 2×2 blocks always commute (so(2) is abelian): b ≥ 3
    enc = _build("liere", d, axes, seed, block_size=block, init_std=0.5)
    gens = enc.generator_matrices()[:, 0]  # [A, nb, b, b]
    assert (gens[0] @ gens[1] - gens[1] @ gens[0]).abs().max() > 1e-3  # they do not commute
    x, y = _positions(axes, 4, seed).double(), _positions(axes, 4, seed + 1).double()
    rx, ry, rd = enc.rotation(x), enc.rotation(y), enc.rotation(y - x)
    assert (rx.transpose(-1, -2) @ ry - rd).abs().max() > 1e-3
    t = torch.full((1, axes), 2.0, dtype=torch.float64)
    q = torch.randn(1, 1, 4, d, dtype=torch.float64)
    assert (_scores(enc, q, q, x + t, y + t) - _scores(enc, q, q, x, y)).abs().max() > 1e-4


@SETTINGS
@given(st.sampled_from(LEARNED), st.sampled_from([2, 4]), st.integers(0, 10_000))
def test_one_axis_scores_depend_only_on_the_offset(name, block, seed) -> None:
    d = _head_dim(name, 1, block)
    extra = {} if name == "string_rope" else {"block_size": block}
    enc = _build(name, d, 1, seed, **extra)
    pos = torch.randint(0, 50, (5, 1), generator=torch.Generator().manual_seed(seed)).double()
    q = torch.randn(1, 1, 5, d, dtype=torch.float64)
    k = torch.randn(1, 1, 5, d, dtype=torch.float64)
    torch.testing.assert_close(_scores(enc, q, k, pos + 7, pos + 7), _scores(enc, q, k, pos, pos),
                               rtol=0, atol=1e-4)
    # control: shifting the keys only changes the offsets
    assert (_scores(enc, q, k, pos, pos + 7) - _scores(enc, q, k, pos, pos)).abs().max() > 1e-3


def _reference(num_axes: int, head_dim: int, base: float, interleaved: bool):
    if num_axes == 1:
        return mmpe.build("rope", head_dim=head_dim, base=base, interleaved=interleaved)
    return mmpe.build("rope_axial", head_dim=head_dim, base=base, interleaved=interleaved)


def _coords(num_axes: int):
    return {1: mmpe.Sequence(9), 2: mmpe.Grid((3, 4), prefix_tokens=1),
            3: mmpe.Grid((2, 3, 2))}[num_axes]


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([100.0, 10000.0]),
       st.sampled_from([2, 4, None]))
def test_liere_with_rope_generators_is_rope(axes, mult, base, block) -> None:
    d = 4 * axes * mult
    enc = mmpe.build("liere", head_dim=d, num_axes=axes, base=base, block_size=block)
    coords = _coords(axes)
    g = torch.Generator().manual_seed(axes * 10 + mult)
    q = torch.randn(2, 2, coords.num_queries, d, generator=g)
    ref = _reference(axes, d, base, interleaved=True)(q, q, coords)[0]
    torch.testing.assert_close(enc(q, q, coords)[0], ref, rtol=0, atol=3e-5)
    # control: the other pair layout is another rotation
    other = _reference(axes, d, base, interleaved=False)(q, q, coords)[0]
    assert (enc(q, q, coords)[0] - other).abs().max() > 1e-2


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.sampled_from([100.0, 10000.0]))
def test_string_at_p_identity_is_rope(axes, mult, interleaved, base) -> None:
    d = 2 * axes * mult * 2
    enc = mmpe.build("string_rope", head_dim=d, num_axes=axes, base=base, interleaved=interleaved)
    coords = _coords(axes)
    q = torch.randn(2, 2, coords.num_queries, d, generator=torch.Generator().manual_seed(mult))
    out = enc(q, q, coords)[0]
    torch.testing.assert_close(out, _reference(axes, d, base, interleaved)(q, q, coords)[0],
                               rtol=0, atol=3e-5)
    # control: a learned P ≠ I rotates otherwise
    with torch.no_grad():
        enc.s.normal_(0, 0.3)
    assert (enc(q, q, coords)[0] - out).abs().max() > 1e-2


def _pair_generators(freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """[A, d, d] skew generators turning pair j by freqs[a, j] (the pair layout given)."""
    axes, half = freqs.shape
    d = 2 * half
    out = torch.zeros(axes, d, d, dtype=freqs.dtype)
    j = torch.arange(half)
    i1, i2 = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
    out[:, i2, i1] = freqs
    out[:, i1, i2] = -freqs
    return out


@SETTINGS
@given(st.integers(1, 3), st.booleans(), st.integers(0, 10_000))
def test_string_is_the_exponential_of_commuting_generators(axes, interleaved, seed) -> None:
    """Cayley-STRING's R(x) = P RoPE(x) Pᵀ = exp(Σ_a x_a P L_a Pᵀ): the closed form of the
    paper's theorem, checked against torch.linalg.matrix_exp of the conjugated generators."""
    d = 4 * axes
    enc = _build("string_rope", d, axes, seed, interleaved=interleaved)
    p = enc.orthogonal(torch.float64)[0]
    torch.testing.assert_close(p.T @ p, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    assert abs(float(torch.linalg.det(p.detach())) - 1) < 1e-10
    gens = p @ _pair_generators(enc.freqs[:, 0].double(), interleaved) @ p.T
    for a in range(axes):
        for b in range(axes):
            torch.testing.assert_close(gens[a] @ gens[b], gens[b] @ gens[a], rtol=0, atol=1e-10)
    x = _positions(axes, 3, seed).double()
    expected = torch.linalg.matrix_exp(torch.einsum("na,aij->nij", x, gens))
    torch.testing.assert_close(enc.rotation(x)[0], expected, rtol=0, atol=1e-9)


def test_cayley_matches_its_formula() -> None:
    s = skew(torch.randn(3, 10, dtype=torch.float64), 5)
    eye = torch.eye(5, dtype=torch.float64)
    torch.testing.assert_close(cayley(s), (eye - s) @ torch.linalg.inv(eye + s))
    torch.testing.assert_close(upper_entries(s), upper_entries(skew(upper_entries(s), 5)))


@SETTINGS
@given(st.sampled_from(["comrope_ap", "comrope_ld"]), st.integers(1, 3), st.integers(0, 10_000))
def test_comrope_angle_matrices_commute(name, axes, seed) -> None:
    enc = _build(name, _head_dim(name, axes, 4), axes, seed, block_size=4)
    gens = enc.generator_matrices()  # [A, H_r, nb, b, b]
    for a in range(axes):
        for b in range(axes):
            torch.testing.assert_close(gens[a] @ gens[b], gens[b] @ gens[a], rtol=0, atol=1e-5)
    skewness = (gens + gens.transpose(-1, -2)).abs().max()
    assert skewness == 0


@pytest.mark.parametrize("cls", [ComRoPEAP, ComRoPELD])
@pytest.mark.parametrize("axes", [1, 2, 3])
def test_comrope_with_rope_blocks_is_rope(cls, axes) -> None:
    """Block size 2, B_k the 2×2 generator of frequency 1 and coefficients c_{a,k} = the axial
    RoPE frequency of pair k on its axis: exactly rope / rope_axial (interleaved)."""
    d = 4 * axes
    enc = cls(d, axes, block_size=2)
    dense = rope_generators(d, axes)  # [A, d, d]
    freqs = torch.stack([dense[:, 2 * k + 1, 2 * k] for k in range(d // 2)], dim=-1)  # [A, nb]
    with torch.no_grad():
        enc.blocks.fill_(-1.0)  # upper entry −1: [[0, −1], [1, 0]]
        if cls is ComRoPELD:
            enc.coefficients.copy_(freqs.unsqueeze(1))
        else:
            enc.blocks.mul_(freqs.sum(0).view(1, -1, 1).float())
    coords = _coords(axes)
    q = torch.randn(1, 2, coords.num_queries, d, generator=torch.Generator().manual_seed(axes))
    ref = _reference(axes, d, 10000.0, interleaved=True)(q, q, coords)[0]
    torch.testing.assert_close(enc(q, q, coords)[0], ref, rtol=0, atol=3e-5)


@pytest.mark.parametrize("name", LEARNED)
def test_gradients_reach_the_learned_parameters(name) -> None:
    enc = mmpe.build(name, head_dim=12, num_axes=3)  # default initialisation (STRING: P = I)
    coords = mmpe.Points(torch.randn(2, 5, 3))
    q = torch.randn(2, 2, 5, 12)
    k = torch.randn(2, 2, 5, 12)
    a, b = enc(q, k, coords)
    (a @ b.transpose(-1, -2)).pow(2).sum().backward()
    params = dict(enc.named_parameters())
    assert params and all(p.grad is not None and p.grad.abs().max() > 0 for p in params.values())


@pytest.mark.parametrize("name", LEARNED)
def test_models_run_on_sequences_grids_and_points(name) -> None:
    cases = [(mmpe.Sequence(6, causal=True), 1), (mmpe.Grid((2, 2, 3)), 3),
             (mmpe.Points(torch.randn(2, 5, 2)), 2)]
    for coords, axes in cases:
        model = mmpe.Transformer(48, 4, 1, [name], context={"num_axes": axes})
        out = model(torch.randn(2, coords.num_queries, 48), coords)
        assert out.shape == (2, coords.num_queries, 48) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", LEARNED)
def test_per_head_generators_differ_per_head_and_refuse_gqa(name) -> None:
    enc = _build(name, 12, 2, 0, num_heads=2, per_head=True)
    coords = mmpe.Grid((2, 3))
    q = torch.randn(1, 1, 6, 12).expand(1, 2, 6, 12)
    out = enc(q, q, coords)[0]
    assert (out[:, 0] - out[:, 1]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="per head"):
        enc(q, q[:, :1], coords)
    with pytest.raises(ValueError, match="num_heads"):
        mmpe.build(name, head_dim=12, num_axes=2, per_head=True)
    shared = _build(name, 12, 2, 0)
    out = shared(q, q, coords)[0]
    assert torch.equal(out[:, 0], out[:, 1])


@pytest.mark.parametrize("name", LEARNED)
def test_grid_rotations_are_cached_without_grad_and_follow_updates(name) -> None:
    enc = _build(name, 12, 2, 0)
    coords = mmpe.Grid((3, 4), prefix_tokens=1)
    q = torch.randn(1, 2, 13, 12)
    with torch.no_grad():
        first = enc(q, q, coords)[0]
        assert len(enc._cache) == 1
        again = enc(q, q, mmpe.Grid((3, 4), prefix_tokens=1))[0]
        assert torch.equal(first, again) and len(enc._cache) == 1
        next(enc.parameters()).add_(0.1)  # an optimizer step: a new parameter version
        moved = enc(q, q, coords)[0]
    assert (moved - first).abs().max() > 1e-4
    fresh = enc(q, q, coords)[0]  # with grad: computed, not cached
    torch.testing.assert_close(fresh, moved)
    assert fresh.requires_grad


@pytest.mark.parametrize("name", LEARNED)
def test_bad_input_names_the_argument(name) -> None:
    enc = mmpe.build(name, head_dim=12, num_axes=2)
    q = torch.randn(1, 2, 6, 12)
    with pytest.raises(ValueError, match="num_axes=2"):
        enc(q, q, mmpe.Grid((1, 2, 3)))
    with pytest.raises(ValueError, match="h_d=12"):
        enc(q[..., :8], q[..., :8], mmpe.Grid((2, 3)))
    with pytest.raises(ValueError, match="positions"):
        enc.rotation(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="Positioned"):
        enc(q, q, mmpe.Graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=3))


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="block_size"):
        mmpe.build("liere", head_dim=12, block_size=5)
    with pytest.raises(ValueError, match="init"):
        mmpe.build("liere", head_dim=12, init="zeros")
    with pytest.raises(ValueError, match="init='rope'"):
        mmpe.build("liere", head_dim=12, num_axes=2, block_size=3)
    with pytest.raises(ValueError, match="block_size"):
        mmpe.build("comrope_ap", head_dim=12, num_axes=4, block_size=4)  # 3 blocks, 4 axes
    with pytest.raises(ValueError, match="head_dim"):
        mmpe.build("string_rope", head_dim=10, num_axes=3)


def test_bf16_module_keeps_float32_parameters() -> None:
    for name in LEARNED:
        model = mmpe.Transformer(48, 4, 1, [name], context={"num_axes": 2})
        ref = model(torch.randn(1, 6, 48), mmpe.Grid((2, 3)))
        half = model.to(torch.bfloat16)
        enc = half.blocks[0].attn.rotary[0]
        assert enc.registry_name == name
        assert all(p.dtype == torch.float32 for p in enc.parameters())
        out = half(torch.randn(1, 6, 48, dtype=torch.bfloat16), mmpe.Grid((2, 3)))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all() and ref.shape == out.shape


@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize(("per_head", "batched"), [(False, False), (True, False), (False, True),
                                                   (True, True)])
def test_forward_is_the_dense_rotation_times_each_token(name, per_head, batched) -> None:
    """q ← R(x_t) q_t with R from `rotation`, for rotations shared by the batch and heads,
    per head, per example (batched positions) and both — every product layout of `apply`."""
    enc = _build(name, 12, 2, 3, num_heads=3, per_head=per_head)
    pos = _positions(2, 5, 4).double()
    pos = torch.stack((pos, pos.flip(0) + 1.0)) if batched else pos  # [2, 5, 2] or [5, 2]
    coords = mmpe.Points(pos)
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64)
    out = enc(x, x, coords)[0]
    for b in range(2):
        r = enc.rotation(pos[b] if batched else pos)  # [H_r, 5, 12, 12]
        r = r.expand(3, -1, -1, -1) if not per_head else r
        expected = (r @ x[b].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(out[b], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", LEARNED)
def test_shared_rotations_serve_grouped_query_attention(name) -> None:
    """Keys with fewer heads than queries (GQA) get the same rotation as a query head; control:
    another position gives another key."""
    enc = _build(name, 12, 2, 5)
    coords = mmpe.Grid((2, 3))
    q = torch.randn(1, 4, 6, 12, dtype=torch.float64)
    k = q[:, :2]
    qr, kr = enc(q, k, coords)
    torch.testing.assert_close(kr, qr[:, :2], rtol=0, atol=1e-12)
    moved = enc(q, k, mmpe.Points(coords.query_positions.double() + 1.0))[1]
    assert (moved - kr).abs().max() > 1e-3
