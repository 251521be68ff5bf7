"""Declared model-wide context: one meaning per key, declared per encoding, validated."""

from __future__ import annotations

import inspect

import pytest

import mmpe
from mmpe import registry
from mmpe.context import CONTEXT_KEYS, validate_context_keys


def test_every_declared_key_is_known_and_a_constructor_argument() -> None:
    for entry in mmpe.available():
        params = inspect.signature(entry.cls).parameters
        for key in entry.context:
            assert key in CONTEXT_KEYS, (entry.name, key)
            assert key in params, (entry.name, key)


def test_every_constructor_argument_named_like_a_context_key_is_declared() -> None:
    # One name, one meaning: an argument called `head_dim` must take the model's head_dim.
    for entry in mmpe.available():
        params = inspect.signature(entry.cls).parameters
        undeclared = [p for p in params if p in CONTEXT_KEYS and p not in entry.context]
        assert not undeclared, f"{entry.name} takes {undeclared} but does not declare them"


def test_context_reaches_only_declared_keys_and_options_win() -> None:
    ctx = {"d_model": 64, "num_heads": 4, "head_dim": 16, "max_len": 32,
           "original_max_position_embeddings": 128}
    yarn = mmpe.build("rope_yarn", context=ctx)
    assert yarn.original_max_position_embeddings == 128 and yarn.head_dim == 16
    learned = mmpe.build("learned", context=ctx)
    assert learned.max_len == 32 and learned.table.shape == (32, 64)
    assert mmpe.build("rope_yarn", context=ctx, original_max_position_embeddings=8) \
        .original_max_position_embeddings == 8


@pytest.mark.parametrize(("context", "match"), [
    ({"hidden": 32}, "unknown context key 'hidden'"),
    ({"init_L": 3.0}, "unknown context key"),
    ({"d_model": 0}, "d_model .* must be an int >= 1"),
    ({"num_heads": 2.5}, "num_heads"),
    ({"head_dim": "64"}, "head_dim"),
    ({"grid_shape": (3, 0)}, "grid_shape"),
    ({"grid_shape": 7}, "grid_shape"),
    ({"prefix_tokens": -1}, "prefix_tokens"),
    ({"distance_unit": float("nan")}, "distance_unit"),
    ({"max_len": True}, "max_len"),
])
def test_bad_context_is_refused_before_building(context, match) -> None:
    with pytest.raises(ValueError, match=match):
        mmpe.build("alibi", num_heads=4, context=context)
    with pytest.raises(ValueError, match=match):
        mmpe.Transformer(32, 4, 1, ["alibi"], context=context)


def test_context_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        validate_context_keys([("d_model", 4)])


def test_register_validates_declared_context() -> None:
    class Enc:
        def __init__(self, head_dim: int) -> None:
            self.head_dim = head_dim

    with pytest.raises(ValueError, match="unknown context key 'width'"):
        registry.register("x_ctx_unknown", hook="rotary", learnable=False, paper="-",
                          context=("width",))(Enc)
    with pytest.raises(ValueError, match="not constructor arguments"):
        registry.register("x_ctx_absent", hook="rotary", learnable=False, paper="-",
                          context=("num_heads",))(Enc)
    with pytest.raises(TypeError, match="capabilities"):
        registry.register("x_needs_bad", hook="rotary", learnable=False, paper="-",
                          needs=("sequence",))(Enc)
    assert "x_ctx_unknown" not in {e.name for e in mmpe.available()}


def test_transformer_bare_string_is_an_error() -> None:
    with pytest.raises(TypeError, match="list of encodings"):
        mmpe.Transformer(32, 4, 1, "rope")


def test_coords_context_reads_what_the_coordinates_answer() -> None:
    import torch

    from mmpe.context import coords_context

    assert coords_context(mmpe.Sequence(5)) == {"num_axes": 1}
    assert coords_context(mmpe.Grid((2, 3), prefix_tokens=1)) == {
        "num_axes": 2, "grid_shape": (2, 3), "prefix_tokens": 1}
    assert coords_context(mmpe.Points(torch.randn(1, 4, 3)))["num_axes"] == 3
    assert coords_context(mmpe.Sphere(torch.zeros(3), torch.zeros(3))) == {"num_axes": 2}  # lat, lon
