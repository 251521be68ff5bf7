"""Every registered encoding built on the `meta` device, moved with `to_empty` and reset with
`reset_parameters()` equals a normal build from the same seed, tensor by tensor and output by
output, on every shipped coordinate sample it supports (issue 61: ALiBi's slopes were
uninitialised memory after `to_empty`, and no encoding had `reset_parameters`). Also:
`device=` and `dtype=` in every constructor, and the same for `Transformer` and
`MultiHeadAttention`, and a checkpoint loaded into a meta-built model with `assign=True`.
"""

from __future__ import annotations

import pytest
import torch
from helpers import D_MODEL, HEADS, SAMPLE_COORDS, model_context

import mmpe
from mmpe.encodings.base import InputEncoding


def _cases() -> list[tuple[str, str]]:
    out = []
    for entry in mmpe.available():
        for cname, make in SAMPLE_COORDS.items():
            if entry.supports(make()):
                out.append((entry.name, cname))
    return out


CASES = _cases()


def _output(enc, coords) -> torch.Tensor:
    torch.manual_seed(3)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL)
    if isinstance(enc, InputEncoding):
        return enc.combine(x, coords)
    layer = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    return layer(x, coords)


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {k: v.detach() for k, v in named.items()}


@pytest.mark.parametrize(("name", "cname"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_meta_build_then_reset_equals_a_normal_build(name: str, cname: str) -> None:
    coords = SAMPLE_COORDS[cname]()
    context = model_context(coords)
    torch.manual_seed(0)
    normal = mmpe.build(name, context=context)
    with torch.device("meta"):
        torch.manual_seed(0)
        meta = mmpe.build(name, context=context)
    assert all(t.is_meta for t in _state(meta).values())
    meta.to_empty(device="cpu")
    torch.manual_seed(0)
    meta.reset_parameters()
    want, got = _state(normal), _state(meta)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].dtype == got[key].dtype, key
        assert torch.equal(want[key], got[key]), f"{name}: {key} differs after the reset"
    try:
        want_out = _output(normal, coords)
    except ValueError:  # the sample's width does not suit it (tabpet): the same refusal
        with pytest.raises(ValueError):
            _output(meta, coords)
        return
    torch.testing.assert_close(_output(meta, coords), want_out, rtol=0, atol=0)


def test_reset_rewrites_uninitialised_tensors() -> None:
    # the control: to_empty alone leaves ALiBi's slopes as whatever memory held
    with torch.device("meta"):
        enc = mmpe.build("alibi", num_heads=8)
    enc.to_empty(device="cpu")
    with torch.no_grad():
        for t in enc.buffers():
            t.fill_(float("nan"))
    enc.reset_parameters()
    slopes = [t for t in enc.buffers() if t.is_floating_point()][0]
    assert torch.equal(slopes, 2.0 ** -torch.arange(1, 9, dtype=slopes.dtype))


def test_reset_on_meta_names_to_empty() -> None:
    with torch.device("meta"):
        enc = mmpe.build("alibi", num_heads=4, learnable_slopes=True)
    with pytest.raises(ValueError, match="to_empty"):
        enc.reset_parameters()


@pytest.mark.parametrize("name", [e.name for e in mmpe.available()])
def test_every_constructor_takes_device_and_dtype(name: str) -> None:
    entry = mmpe.registry.get(name)
    coords = next(make() for make in SAMPLE_COORDS.values() if entry.supports(make()))
    enc = mmpe.build(name, context=model_context(coords), device="meta", dtype=torch.float64)
    assert all(t.is_meta for t in _state(enc).values())
    for path, module in enc.named_modules():
        keeps = set(getattr(type(module), "keep_dtype", ()))  # tables kept in float32
        own = {**module._parameters, **module._buffers}
        for key, t in own.items():
            if t is not None and t.is_floating_point() and key not in keeps:
                assert t.dtype == torch.float64, f"{path}.{key}"


def test_a_bad_dtype_is_named() -> None:
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        mmpe.build("alibi", num_heads=4, dtype=torch.int64)


@pytest.mark.parametrize("kind", ["transformer", "attention"])
def test_models_built_on_meta_reset_to_a_normal_build(kind: str) -> None:
    def make():
        if kind == "transformer":
            return mmpe.Transformer(D_MODEL, HEADS, 2, ["rope", "alibi", "t5"])
        return mmpe.MultiHeadAttention(D_MODEL, HEADS, [mmpe.build("alibi", num_heads=HEADS)])

    torch.manual_seed(0)
    normal = make()
    with torch.device("meta"):
        meta = make()
    meta.to_empty(device="cpu")
    torch.manual_seed(0)
    meta.reset_parameters()
    for (key, a), (_, b) in zip(_state(normal).items(), _state(meta).items(), strict=True):
        assert torch.equal(a, b), key
    coords = mmpe.Sequence(8, causal=True)
    x = torch.randn(2, 8, D_MODEL)
    torch.testing.assert_close(meta(x, coords), normal(x, coords), rtol=0, atol=0)


def test_a_checkpoint_loads_into_a_meta_built_model() -> None:
    torch.manual_seed(0)
    trained = mmpe.Transformer(D_MODEL, HEADS, 2, ["rope", "alibi", "t5"])
    with torch.device("meta"):
        model = mmpe.Transformer(D_MODEL, HEADS, 2, ["rope", "alibi", "t5"])
    model.load_state_dict(trained.state_dict(), assign=True)
    coords = mmpe.Sequence(8, causal=True)
    x = torch.randn(2, 8, D_MODEL)
    torch.testing.assert_close(model(x, coords), trained(x, coords), rtol=0, atol=0)
