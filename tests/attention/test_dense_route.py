"""The dense route (one SDPA call with the dense bias, `route="dense"`, runnable on the CPU)
against the math route, for every registered additive score encoding on sequences, grids with
prefix tokens, packed grids, points and graph batches: the output, the input's gradient and
every parameter's gradient, in float32 (`mmpe.testing.TOLERANCES`) and bfloat16 (the relative
error bound of `tests/package/test_precision.py`, 2e-2). Driven by the registry: a new
encoding adds its rows here with no edit. A rescaling term is refused by name."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import D_MODEL, HEADS, SAMPLE_COORDS, model_context

import mmpe
from mmpe.encodings.base import ScoreEncoding
from mmpe.testing import TOLERANCES

#: the coordinate samples of the issue: sequences, a grid with a prefix token, packed grids,
#: points, graph batches (with and without the virtual token)
SAMPLES = ("sequence", "sequence_causal", "grid", "packed_grids", "points", "graph",
           "graph_virtual")
#: relative error `‖dense − math‖ / ‖math‖` allowed in bfloat16 (`test_precision.TOLERANCE`)
BF16 = 2e-2
#: a parameter's bf16 gradient error as a fraction of the norm of all the term's parameter
#: gradients: the dense route hands SDPA the bias in the attention dtype, as the peers do, so
#: each pair's bias gradient is rounded to bf16 before a parameter sums it over every pair;
#: where that sum cancels (FIRE's MLP, KERPLE's exponent) the rounding stays. Measured (torch
#: 2.11, CPU, these seeds): FIRE ≤ 0.17 (graph with a virtual token; the CPU's SDPA path,
#: bias in bf16 too, gives the same 0.17), KERPLE-log 2.7e-2, every other term ≤ 2e-2; a
#: wrong gradient (a lost term or factor) is off by the order of the gradient itself.
BF16_PARAMETERS = 0.25
#: the cases of the default tier (one per kind of term and sample); the rest are `slow`
CORE = {("t5", "sequence_causal"), ("swin", "grid"), ("alibi", "packed_grids"),
        ("kerple_log", "points"), ("fire", "grid"), ("graphormer", "graph"), ("shaw", "sequence")}


def _cases(additive: bool) -> list:
    out = []
    for cname in SAMPLES:
        coords = SAMPLE_COORDS[cname]()
        for entry in mmpe.available():
            if not entry.supports(coords) or not issubclass(entry.cls, ScoreEncoding):
                continue
            enc = mmpe.build(entry.name, context=model_context(coords))
            if enc.additive == additive and not enc.needs_probs:
                marks = () if (entry.name, cname) in CORE or not additive else pytest.mark.slow
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}",
                                        marks=marks))
    return out


def _build(name: str, cname: str):
    coords = SAMPLE_COORDS[cname]()
    torch.manual_seed(0)
    enc = mmpe.build(name, context=model_context(coords))
    with torch.no_grad():  # tables that start at zero would hide a wrong gradient
        for p in enc.parameters():
            if p.is_floating_point() and not p.any():
                p.normal_(0, 0.5)
    torch.manual_seed(1)
    return coords, mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])


def _step(mha, coords, x: torch.Tensor, route: str) -> list[torch.Tensor]:
    mha.route = route
    mha.zero_grad(set_to_none=True)
    xs = x.clone().requires_grad_(True)
    out = mha(xs, coords)
    out.float().square().sum().backward()
    grads = [None if p.grad is None else p.grad.float()
             for p in mha.scores.parameters() if p.requires_grad]
    return [out.detach().float(), xs.grad.float(), *grads]


@pytest.mark.parametrize(("name", "cname"), _cases(additive=True))
def test_dense_route_equals_the_math_path(name: str, cname: str) -> None:
    coords, mha = _build(name, cname)
    x = _x(coords)
    want = _step(mha, coords, x, "math")
    got = _step(copy.deepcopy(mha), coords, x, "dense")
    for label, a, b in zip(_labels(mha), got, want, strict=True):
        assert (a is None) == (b is None), f"{label}: None on one path only"
        if a is not None:
            atol, rtol = TOLERANCES[torch.float32]["output" if label == "output" else "gradient"]
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=label)


@pytest.mark.parametrize(("name", "cname"), _cases(additive=True))
def test_dense_route_in_bf16_is_as_close_as_the_math_path(name: str, cname: str) -> None:
    """bfloat16 against the float32 math route: the output and the input gradient within
    `BF16` relative error, or within twice the math route's own bf16 error; the parameters'
    gradient within `BF16_PARAMETERS` of the norm of all the term's parameter gradients (a
    parameter whose gradient cancels in exact arithmetic, such as a per-head constant's under
    the softmax, sums bf16-rounded bias gradients over every pair: its own norm is no scale
    for it)."""
    coords, mha = _build(name, cname)
    x = _x(coords)
    ref = _step(mha, coords, x, "math")
    low = copy.deepcopy(mha).to(torch.bfloat16)
    math_bf16 = _step(low, coords, x.bfloat16(), "math")
    dense_bf16 = _step(copy.deepcopy(low), coords, x.bfloat16(), "dense")
    for label, d, m, r in zip(("output", "input gradient"), dense_bf16[:2], math_bf16[:2],
                               ref[:2], strict=True):
        err_d, err_m = _relative(d, r), _relative(m, r)
        assert err_d <= max(BF16, 2 * err_m), \
            f"{label}: relative error {err_d:.2e} (math route in bf16: {err_m:.2e})"
    labels = _labels(mha)[2:]
    params = [(lab, d, m, r) for lab, d, m, r in zip(labels, dense_bf16[2:], math_bf16[2:],
                                                     ref[2:], strict=True) if r is not None]
    if not params:
        return
    scale = torch.cat([r.flatten() for _, _, _, r in params]).norm().clamp_min(1e-12)
    for label, d, m, r in params:
        err_d = ((d - r).norm() / scale).item()
        err_m = ((m - r).norm() / scale).item()
        assert err_d <= max(BF16_PARAMETERS, 2 * err_m), \
            f"{label}: error {err_d:.2e} of the gradient's norm (math route in bf16: {err_m:.2e})"


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def _x(coords) -> torch.Tensor:
    return torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL,
                       generator=torch.Generator().manual_seed(2))


def _labels(mha) -> list[str]:
    return ["output", "input gradient",
            *(f"gradient of {n}" for n, p in mha.scores.named_parameters() if p.requires_grad)]


@pytest.mark.parametrize(("name", "cname"), _cases(additive=False)[:4])
def test_dense_route_refuses_a_rescaling_term(name: str, cname: str) -> None:
    coords, mha = _build(name, cname)
    mha.route = "dense"
    with pytest.raises(ValueError, match="needs additive score terms"):
        mha(torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL), coords)


def test_layers_that_share_terms_share_one_mask_and_keep_its_gradient(monkeypatch) -> None:
    """Two blocks sharing T5 on the dense route hand SDPA one mask in q's dtype (SDPA keeps
    each call's mask for its backward: a copy per layer otherwise), and the model's output
    and gradients are the math route's."""
    import torch.nn.functional as F

    masks = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        masks.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    torch.manual_seed(0)
    dense = mmpe.Transformer(32, 4, 2, ["t5"], route="dense")
    math = mmpe.Transformer(32, 4, 2, ["t5"], route="math")
    math.load_state_dict(dense.state_dict())
    x, coords = torch.randn(2, 12, 32), mmpe.Sequence(12)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = dense(x, coords)
    monkeypatch.setattr(F, "scaled_dot_product_attention", real)
    assert len(masks) == 2 and masks[0] is masks[1]
    ref = math(x, coords)
    table = dense.shared_encodings[0].table
    (g,) = torch.autograd.grad(out.square().sum(), [table])
    (g_ref,) = torch.autograd.grad(ref.square().sum(), [math.shared_encodings[0].table])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)
