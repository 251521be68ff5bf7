"""SwinV2's CPB MLP chunk by chunk with its backward by hand equals autograd on the plain
expression: values and the gradients of W₁, b₁, W₂, across chunk boundaries and offset
counts (hypothesis); a control with another activation fails the comparison."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpe.encodings import _cpb_mlp
from mmpe.encodings._cpb_mlp import cpb_mlp


def _plain(coords, w1, b1, w2, act=torch.relu):
    return act(coords @ w1.t() + b1) @ w2.t()


def _weights(axes: int, hidden: int, heads: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
            for shape in ((hidden, axes), (hidden,), (heads, hidden))]


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 700), axes=st.sampled_from([2, 3]), hidden=st.integers(1, 64),
       heads=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_chunked_cpb_equals_autograd_on_the_plain_mlp(m, axes, hidden, heads, seed) -> None:
    coords = torch.randn(m, axes, generator=torch.Generator().manual_seed(seed + 1),
                         dtype=torch.float64)
    weights = _weights(axes, hidden, heads, seed)
    cotangent = torch.randn(m, heads, generator=torch.Generator().manual_seed(seed + 2),
                            dtype=torch.float64)
    got = cpb_mlp(coords, *weights)
    want = _plain(coords, *weights)
    torch.testing.assert_close(got, want)
    for g, w in zip(torch.autograd.grad((got * cotangent).sum(), weights),
                    torch.autograd.grad((want * cotangent).sum(), weights), strict=True):
        torch.testing.assert_close(g, w)


def test_small_chunks_cross_many_boundaries(monkeypatch) -> None:
    monkeypatch.setattr(_cpb_mlp, "CHUNK", 7)
    coords = torch.randn(50, 2, dtype=torch.float64)
    weights = _weights(2, 16, 3, 0)
    got = torch.autograd.grad(cpb_mlp(coords, *weights).square().sum(), weights)
    want = torch.autograd.grad(_plain(coords, *weights).square().sum(), weights)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_a_control_with_another_activation_fails() -> None:
    coords = torch.randn(40, 2, dtype=torch.float64)
    weights = _weights(2, 16, 3, 1)
    assert not torch.allclose(cpb_mlp(coords, *weights),
                              _plain(coords, *weights, act=torch.nn.functional.gelu))


def test_offsets_that_require_grad_are_refused() -> None:
    with pytest.raises(ValueError, match="cpb_mlp: coords must not require grad"):
        cpb_mlp(torch.randn(4, 2, requires_grad=True), *_weights(2, 4, 2, 0))
