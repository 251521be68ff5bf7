"""Every registered encoding's output follows its weights and its saved settings.

Driven by the registry (a new encoding adds its rows with no edit here), on the first shipped
coordinate sample it supports and, for grid encodings, a grid of another size (Swin's resized
table):

- **weights**: after a call that may fill a cache, every parameter is changed — through
  ``.data`` (an EMA / DINO / BYOL teacher with ``requires_grad=False``, inside or outside
  ``no_grad``; a trainable module updated under ``no_grad``) or by an optimizer step in
  training mode — and the next output must equal a freshly built module's loaded with the same
  state_dict. A cache keyed on anything but the weights' values fails here.
- **settings**: each int/float/bool constructor option set to another valid value; if the
  module built with it loads the default module's state_dict, the two must give the same
  output. A setting that changes the output must travel with the state_dict
  (`SavesSettings`) or change a tensor's shape, so the load is refused.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from helpers import D_MODEL, HEADS, SAMPLE_COORDS, model_context

import mmpe
from mmpe.coords import Grid
from mmpe.encodings.base import InputEncoding
from mmpe.validation import _kind

#: a grid larger than the one grid encodings are built for (tables interpolated, rotations of
#: new positions)
RESIZED = "grid_resized"


class Wrapped(torch.nn.Module):
    """An encoding as a model sees it: an input encoding's `combine`, or an attention layer."""

    def __init__(self, enc) -> None:
        super().__init__()
        self.input = isinstance(enc, InputEncoding)
        self.enc = enc if self.input else mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])

    def forward(self, x, coords):
        return self.enc.combine(x, coords) if self.input else self.enc(x, coords)


def _sample(cname: str):
    if cname == RESIZED:
        return SAMPLE_COORDS["grid"](), Grid((3, 4), prefix_tokens=1)
    coords = SAMPLE_COORDS[cname]()
    return coords, coords


def _cases() -> list:
    out = []
    for entry in mmpe.available():
        names = [c for c, make in SAMPLE_COORDS.items() if entry.supports(make())]
        if not names:
            continue
        chosen = [names[0]] + ([RESIZED] if "grid" in names and names[0] != "grid" else [])
        if names[0] == "grid":
            chosen.append(RESIZED)
        out += [pytest.param(entry.name, c, id=f"{entry.name}-{c}") for c in chosen]
    return out


def _build(name: str, cname: str, seed: int = 0, **options):
    built_for, run_on = _sample(cname)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = Wrapped(mmpe.build(name, context=model_context(built_for), **options))
    return module, run_on


def _x(coords, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL, generator=g)
    return x


def _input_width(module, x):
    enc = module.enc
    if module.input and getattr(enc, "width", None) and not getattr(enc, "project", True):
        return x[..., : D_MODEL - enc.width]  # Tab-PET concatenates its width-channel code
    return x


def _run(module, coords, x):
    try:
        return module(_input_width(module, x), coords)
    except (TypeError, ValueError) as err:  # e.g. a table that cannot be resized: refused
        pytest.skip(f"refused on these coordinates: {err}")


def _fresh_equal(name, cname, module, coords, x, out) -> None:
    fresh, _ = _build(name, cname, seed=123)
    fresh.load_state_dict(module.state_dict())
    fresh.eval()
    with torch.no_grad():
        want = fresh(_input_width(fresh, x), coords)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5,
                               msg="output differs from a fresh module with the same weights")


def _perturb(module) -> None:
    g = torch.Generator().manual_seed(7)
    for p in module.parameters():
        if p.is_floating_point():
            p.data.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))


SCENARIOS = ("teacher_no_grad", "teacher_grad_enabled", "trainable_no_grad", "optimizer_step")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize(("name", "cname"), _cases())
def test_output_follows_the_weights(name: str, cname: str, scenario: str) -> None:
    module, coords = _build(name, cname)
    if not any(True for _ in module.parameters()):
        pytest.skip("no parameters")
    x = _x(coords)
    module.eval()
    if scenario.startswith("teacher"):
        module.requires_grad_(False)
    with torch.no_grad():
        before = _run(module, coords, x)
        _run(module, coords, x)  # a second call: served from any cache
    if scenario == "optimizer_step":
        module.train()
        opt = torch.optim.SGD(module.parameters(), lr=1.0)
        out = _run(module, coords, x)
        (out.float().pow(2).mean() + sum(p.sum() * 0 for p in module.parameters())).backward()
        for p in module.parameters():  # a step that moves every parameter, used or not
            p.grad = torch.ones_like(p) * 0.3 if p.grad is None else p.grad.sign() * 0.3
        opt.step()
        module.eval()
        with torch.no_grad():
            after = module(_input_width(module, x), coords)
    elif scenario == "teacher_grad_enabled":
        _perturb(module)
        after = module(_input_width(module, x), coords)
    else:
        _perturb(module)
        with torch.no_grad():
            after = module(_input_width(module, x), coords)
    _fresh_equal(name, cname, module, coords, x, after.detach())
    if torch.allclose(before, after, atol=1e-6):
        pytest.skip("the update does not move this encoding's output here")


def _alternatives(kind: str, value):
    if kind == "bool":
        return [not value]
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        # small values too: a sample graph of 4 nodes has 4 eigenpairs, so k = 4 … 8 agree
        return sorted({1, 2, value // 2, value + 1, value * 2 + 1} - {value})
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value * 1.5 + 0.25, value * 0.5 + 0.125]
    return []


def _setting_cases() -> list:
    out = []
    for case in _cases():
        name, cname = case.values
        if cname == RESIZED:
            continue
        entry = next(e for e in mmpe.available() if e.name == name)
        for p in inspect.signature(entry.cls).parameters.values():
            kind, _ = _kind(p.annotation)
            if kind in ("int", "float", "bool") and p.default is not inspect.Parameter.empty:
                out.append(pytest.param(name, cname, p.name, kind, id=f"{name}-{p.name}"))
    return out


SETTINGS_CHECKED: list[str] = []


@pytest.mark.parametrize(("name", "cname", "option", "kind"), _setting_cases())
def test_settings_that_change_the_output_refuse_other_state(name, cname, option, kind) -> None:
    base, coords = _build(name, cname)
    ctx = model_context(_sample(cname)[0])
    entry = next(e for e in mmpe.available() if e.name == name)
    default = ctx.get(option, inspect.signature(entry.cls).parameters[option].default)
    x = _x(coords)
    base.eval()
    with torch.no_grad():
        want = _run(base, coords, x)
    tried = 0
    for value in _alternatives(kind, default):
        try:
            other, _ = _build(name, cname, seed=5, **{option: value})
        except (TypeError, ValueError):
            continue  # not a valid value for this option
        try:
            other.load_state_dict(base.state_dict())
        except RuntimeError:
            tried += 1
            continue  # refused: the setting is saved or shapes a tensor
        other.eval()
        with torch.no_grad():
            try:
                got = other(_input_width(other, x), coords)
            except (TypeError, ValueError):
                continue
        tried += 1
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5), (
            f"{name}: built with {option}={value!r} it loads a state_dict saved with "
            f"{option}={default!r} and gives other numbers; save {option} (SavesSettings)")
    SETTINGS_CHECKED.append(f"{name}.{option}" if tried else "")
