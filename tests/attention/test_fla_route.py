"""The fla route (`mmpe.attention.fla`) on the CPU, where fla's Triton kernels do not run: with
fla's own pure-PyTorch reference functions in the kernels' place, the route gives mmpe's math
route's output and gradients for FoX, stick-breaking, PaTH and PaTH-FoX (so the layout, the
scale, the gates and fla's definitions all agree with mmpe's); a recording stand-in sees the
kernels' documented layout; what the kernels do not take is refused by name; `auto` never
takes the route. The GPU tier runs the kernels themselves (tests/gpu/test_gpu_fla.py)."""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe.attention import fla as fla_route
from mmpe.attention import which_route

fla = pytest.importorskip("fla")
from fla.ops.forgetting_attn.naive import naive_forgetting_attn  # noqa: E402
from fla.ops.path_attn.naive import naive_path_attn  # noqa: E402
from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn  # noqa: E402

D_MODEL, HEADS = 32, 4
#: fla's references in the kernels' place, returning what each kernel returns
REFERENCES = {
    "fox": lambda q, k, v, g, scale=None: naive_forgetting_attn(q, k, v, g, scale),
    "stick_breaking": naive_stickbreaking_attn,
    "path": lambda q, k, v, w, beta, g, scale=None: (
        naive_path_attn(q, k, v, w, beta,
                        torch.zeros(q.shape[:3], dtype=q.dtype) if g is None else g, scale),
        None),
}
SCHEMES = {"fox": "fox", "stick_breaking": "stick_breaking", "path": "path",
           "path_fox": "path"}


def _layers(name: str, seed: int):
    torch.manual_seed(seed)
    enc = mmpe.build(name, context={"d_model": D_MODEL, "num_heads": HEADS,
                                    "head_dim": D_MODEL // HEADS})
    if name in ("fox", "path_fox"):  # gates away from 1: a decay that matters
        gate = enc.gate if name == "fox" else enc.forget.gate
        with torch.no_grad():
            gate.bias.fill_(-1.0)
    layers = [mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route=r) for r in ("fla", "math")]
    layers[1].load_state_dict(layers[0].state_dict())  # one encoding, one set of projections
    return layers


def _run(layer, x, coords):
    x = x.detach().clone().requires_grad_()
    out = layer(x, coords)
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(),
                                [x, *params])
    return out, grads


@pytest.mark.parametrize("n", [5, 70])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_route_with_flas_references_equals_the_math_route(monkeypatch, name, n) -> None:
    scheme = SCHEMES[name]
    monkeypatch.setattr(fla_route, "kernel", lambda s: REFERENCES[s])
    fla_layer, math_layer = _layers(name, seed=n)
    x = torch.randn(2, n, D_MODEL, generator=torch.Generator().manual_seed(1))
    coords = mmpe.Sequence(n, causal=True)
    (a, ga), (b, gb) = _run(fla_layer, x, coords), _run(math_layer, x, coords)
    assert fla_route.scheme_of(fla_layer.scores, fla_layer.kernel) == scheme
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for u, w in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, w, rtol=1e-3, atol=1e-4)


def test_a_wrong_gate_scale_fails_the_same_comparison(monkeypatch) -> None:
    """Control: PaTH-FoX's gates handed to the kernel without the 1/scale (the kernel scales
    its gate sums) differ from the math route."""
    real = REFERENCES["path"]
    monkeypatch.setattr(fla_route, "kernel", lambda s: lambda q, k, v, w, beta, g, scale=None:
                        real(q, k, v, w, beta, g * scale, scale))
    fla_layer, math_layer = _layers("path_fox", seed=0)
    x = torch.randn(2, 20, D_MODEL)
    coords = mmpe.Sequence(20, causal=True)
    with torch.no_grad():
        assert not torch.allclose(fla_layer(x, coords), math_layer(x, coords), atol=1e-4)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_kernels_receive_their_documented_layout(monkeypatch, name) -> None:
    seen = {}

    def recording(scheme):
        def kernel(q, k, v, *rest, scale=None, **options):
            seen.update(scheme=scheme, shapes=[tuple(t.shape) for t in (q, k, v)],
                        contiguous=all(t.is_contiguous() for t in (q, k, v)), scale=scale,
                        rest=[None if t is None else tuple(t.shape) for t in rest],
                        options=options)
            out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
            return out if scheme == "fox" else (out, None)
        return kernel

    monkeypatch.setattr(fla_route, "kernel", recording)
    layer, _ = _layers(name, seed=0)
    layer(torch.randn(3, 9, D_MODEL), mmpe.Sequence(9, causal=True))
    head_dim = D_MODEL // HEADS
    assert seen["shapes"] == [(3, 9, HEADS, head_dim)] * 3  # [B, T, H, K]
    assert seen["contiguous"] and seen["scale"] == pytest.approx(head_dim ** -0.5)
    if name == "fox":
        assert seen["rest"] == [(3, 9, HEADS)]  # g: log f per token and head
    elif name == "stick_breaking":
        assert seen["rest"] == [] and seen["options"] == {"attend_current": False}
    else:  # w [B, T, H, K], beta [B, T, H], g (path_fox only) [B, T, H]
        assert seen["rest"][:2] == [(3, 9, HEADS, head_dim), (3, 9, HEADS)]
        assert seen["rest"][2] == (None if name == "path" else (3, 9, HEADS))


@pytest.mark.parametrize(("name", "coords", "why"), [
    ("fox+alibi", lambda: mmpe.Sequence(6, causal=True), "fla runs fox alone"),
    ("fox", lambda: mmpe.Sequence(6, causal=True, padding_mask=torch.tensor([[0, 1, 1, 1, 1, 1]],
                                                                             dtype=torch.bool)),
     "no position_ids or padding_mask"),
    ("fox", lambda: mmpe.Sequence(6, causal=True, document_ids=torch.tensor([0, 0, 0, 1, 1, 1])),
     "cu_seqlens"),
    ("alibi", lambda: mmpe.Sequence(6, causal=True), "fla runs fox alone"),
])
def test_what_the_kernels_do_not_take_is_refused_by_name(name, coords, why) -> None:
    c = coords()
    encs = [mmpe.build(n, context={"d_model": D_MODEL, "num_heads": HEADS})
            for n in name.split("+")]
    layer = mmpe.MultiHeadAttention(D_MODEL, HEADS, encs, route="fla")
    with pytest.raises(ValueError, match=why):
        layer(torch.randn(c.batch_size or 1, c.num_queries, D_MODEL), c)


def test_auto_never_takes_the_fla_route() -> None:
    for name in SCHEMES:
        layer, _ = _layers(name, seed=0)
        layer.route = "auto"
        for device in ("cuda", "cpu"):
            assert which_route(layer, mmpe.Sequence(512, causal=True), device=device) != "fla"
