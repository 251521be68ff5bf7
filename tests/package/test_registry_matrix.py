"""Every registered encoding × every shipped coordinate type that meets its needs × every path.

Driven by the registry: a new encoding (or coordinate sample) adds its rows with no edit here.
For each (encoding, coordinates) pair this checks that the encoding builds from one standard
model-wide context, runs forward, gives the same output on the flex, SDPA and math attention
paths, that its eager ``bias`` equals its ``score_mod`` evaluated one scalar pair at a time (as
FlexAttention does), that gradients reach every parameter, and that a state_dict round trip
reproduces the output. ``conftest.py`` prints how many cases ran.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import D_MODEL, HEADS
from helpers import SAMPLE_COORDS as COORDS
from helpers import model_context as _context

import mmpe
from mmpe.attention import dense_bias
from mmpe.attention.dispatch import SDPA_PLANS, force_plan
from mmpe.coords import Grid
from mmpe.encodings.base import AttentionCall, InputEncoding, ScoreEncoding

MATRIX_CASES: list[tuple[str, str, str]] = []  # (encoding, coordinates, check), read by conftest


#: Encodings whose matrix rows take 7–14 s each (their generic paths run per pair, frame
#: averaging over many frames): `make test-train` runs them (marker `heavy`), `make test` the
#: rest, so that it stays within its 8 minutes.
HEAVY = {"mesh_displacement", "rope_frame_averaged"}


def _pairs(supported: bool) -> list:
    """(encoding, coordinates) pairs the registry says are (or are not) supported."""
    out = []
    for cname, make in COORDS.items():
        coords = make()
        for entry in mmpe.available():
            if entry.supports(coords) == supported:
                marks = [pytest.mark.heavy] if supported and entry.name in HEAVY else []
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}",
                                        marks=marks))
    return out


def _make(name: str, cname: str):
    coords = COORDS[cname]()
    return coords, mmpe.build(name, context=_context(coords))


def _x(coords) -> torch.Tensor:
    return torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL)


def _paths(enc) -> list[str]:
    kernel = getattr(enc, "hook", "") == "kernel"
    math_only = (kernel and not getattr(enc, "is_softmax", False)) or getattr(enc, "needs_probs", False)
    return ["math"] if math_only else ["flex", "sdpa", "math"]


@pytest.mark.parametrize(("name", "cname"), _pairs(supported=True))
def test_encoding_on_coordinates(name: str, cname: str) -> None:
    coords, enc = _make(name, cname)
    MATRIX_CASES.append((name, cname, "build"))
    if isinstance(enc, InputEncoding):
        _check_input(name, cname, enc, coords)
    else:
        _check_attention(name, cname, enc, coords)


def _check_input(name: str, cname: str, enc, coords) -> None:
    x = _x(coords)
    if getattr(enc, "width", None) and not getattr(enc, "project", True):
        x = x[..., : D_MODEL - enc.width]  # Tab-PET concatenates its width-channel code
    _check_inference_mode(name, cname, enc, lambda: enc.combine(x, coords))
    y = enc.combine(x, coords)
    assert y.shape[:-1] == x.shape[:-1] and y.shape[-1] == D_MODEL and torch.isfinite(y).all()
    MATRIX_CASES.append((name, cname, "forward"))
    _check_grads_and_state(name, cname, enc, lambda e: e.combine(x, coords))


def _check_attention(name: str, cname: str, enc, coords) -> None:
    torch.manual_seed(1)
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    x = _x(coords)
    mha.route = _paths(enc)[0]
    _check_inference_mode(name, cname, mha, lambda: mha(x, coords))
    outs = {}
    with torch.no_grad():
        for path in _paths(enc):
            mha.route = path
            outs[path] = mha(x, coords)
            assert torch.isfinite(outs[path]).all(), f"{path} output is not finite"
            MATRIX_CASES.append((name, cname, path))
        if "sdpa" in outs and isinstance(enc, ScoreEncoding):  # every plan that can run it
            mha.route = "sdpa"
            for plan in SDPA_PLANS:
                try:
                    with force_plan(plan):
                        out = mha(x, coords)
                except ValueError as err:
                    if "cannot run this call" not in str(err):
                        raise
                    continue
                outs[f"sdpa:{plan}"] = out
                MATRIX_CASES.append((name, cname, f"sdpa:{plan}"))
    ref = outs["math"]
    for path, out in outs.items():
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4, msg=f"{path} vs math")
    if isinstance(enc, ScoreEncoding) and enc.additive:
        _check_bias_equals_score_mod(name, cname, enc, mha, x, coords)
    mha.route = "math"
    _check_grads_and_state(name, cname, mha, lambda m: m(x, coords))


def _check_inference_mode(name: str, cname: str, module, run) -> None:
    """Evaluation under ``torch.inference_mode`` (Lightning's validate/test) as the very first
    call — caches start empty — gives the numbers of ``no_grad``, again on a second call, and
    leaves nothing behind (inference tensors have no version counter, cannot be saved for
    backward) that breaks the training forward that follows. In eval mode: encodings such as
    LapPE flip signs at random in training."""
    module.eval()
    with torch.inference_mode():
        first = run().clone()
    with torch.no_grad():
        ref = run()
    torch.testing.assert_close(first, ref, atol=2e-5, rtol=1e-4, msg="first call in inference_mode")
    with torch.inference_mode():
        torch.testing.assert_close(run(), ref, atol=2e-5, rtol=1e-4, msg="inference_mode again")
    module.train()
    MATRIX_CASES.append((name, cname, "inference_mode"))


def _check_bias_equals_score_mod(name, cname, enc, mha, x, coords) -> None:
    from einops import rearrange

    with torch.no_grad():
        q, k, v = rearrange(mha.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
        ctx = AttentionCall(coords, HEADS, D_MODEL // HEADS, x.shape[0], x, q, k, v)
        bias = dense_bias([enc], ctx)
        mod = enc.score_mod(ctx)
        zero = torch.zeros(())
        gen = torch.Generator().manual_seed(0)
        for _ in range(12):  # scalar indices, as inside FlexAttention
            b = int(torch.randint(bias.shape[0], (1,), generator=gen))
            h = int(torch.randint(HEADS, (1,), generator=gen))
            qi = int(torch.randint(coords.num_queries, (1,), generator=gen))
            ki = int(torch.randint(coords.num_keys, (1,), generator=gen))
            scalar = mod(zero, torch.tensor(b), torch.tensor(h), torch.tensor(qi), torch.tensor(ki))
            assert math.isclose(float(scalar), float(bias[b, h, qi, ki]), rel_tol=1e-4,
                                abs_tol=1e-5), f"bias[{b},{h},{qi},{ki}] != score_mod"
    MATRIX_CASES.append((name, cname, "bias==score_mod"))


def _check_grads_and_state(name, cname, module, run) -> None:
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if params:
        out = run(module)
        out.float().pow(2).mean().backward()
        no_grad = [n for n, p in params if p.grad is None]
        assert not no_grad, f"no gradient reaches {no_grad}"
        assert all(torch.isfinite(p.grad).all() for _, p in params)
        MATRIX_CASES.append((name, cname, "grad"))
    clone = copy.deepcopy(module)
    for p in clone.parameters():  # scramble, then restore from the state_dict
        p.data.normal_()
    clone.load_state_dict(module.state_dict(), strict=True)
    clone.eval(), module.eval()  # training-time draws (Abacus' offset) differ call to call
    with torch.no_grad():
        torch.testing.assert_close(run(clone), run(module))
    MATRIX_CASES.append((name, cname, "state_dict"))


@pytest.mark.parametrize(("name", "cname"), _pairs(supported=False))
def test_unsupported_coordinates_are_refused(name: str, cname: str) -> None:
    """Where the registry says no, the encoding itself refuses, naming a capability."""
    coords, enc = _make_unsupported(name, cname)
    needs = "|".join(c.__name__ for c in enc.needs)
    with pytest.raises((TypeError, ValueError), match=needs):
        enc.check_coords(coords)


def _make_unsupported(name: str, cname: str):
    coords = COORDS[cname]()
    ctx = _context(coords)
    ctx.setdefault("grid_shape", (2, 3))
    ctx.pop("num_axes", None)
    return coords, mmpe.build(name, context=ctx)


def test_refusal_names_the_missing_capability() -> None:
    class Unplaced(mmpe.Coordinates):
        num_queries = 4

    refused = 0
    for entry in mmpe.available():
        if entry.needs and not entry.supports(Unplaced()):
            enc = mmpe.build(entry.name, context=_context(Grid((2, 3))))
            with pytest.raises(TypeError, match=entry.needs[0].__name__):
                enc.check_coords(Unplaced())
            refused += 1
    assert refused == sum(1 for e in mmpe.available() if e.needs)
