"""An empty batch (b = 0) gives an empty output, as every torch.nn layer does (an
`nn.MultiheadAttention` or `nn.Linear` on `[0, s, d]` returns `[0, s, d]`), on every attention
encoding of the registry, in self- and cross-attention, with a backward pass."""

from __future__ import annotations

import pytest
import torch
from helpers import D_MODEL, HEADS, model_context
from helpers import SAMPLE_COORDS as COORDS

import mmpe


def _cases() -> list:
    """Each attention encoding (rotary, score, kernel) on the first unbatched sample
    coordinates it supports."""
    samples = {name: make() for name, make in COORDS.items()}
    out = []
    for entry in mmpe.available():
        if entry.hook == "input":
            continue
        cname = next((c for c, coords in samples.items()
                      if coords.batch_size is None and entry.supports(coords)), None)
        if cname is not None:
            out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


@pytest.mark.parametrize(("name", "cname"), _cases())
def test_empty_batch_gives_an_empty_output(name: str, cname: str) -> None:
    coords = COORDS[cname]()
    enc = mmpe.build(name, context=model_context(coords))
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    x = torch.randn(0, coords.num_queries, D_MODEL, requires_grad=True)
    out = mha(x, coords)
    assert out.shape == (0, coords.num_queries, D_MODEL) and out.dtype == x.dtype
    out.sum().backward()  # in the graph, as torch.nn's outputs are
    assert x.grad.shape == x.shape
    assert mha.qkv.weight.grad is not None and not mha.qkv.weight.grad.any()


def test_empty_batch_through_heads_cross_attention_and_a_model() -> None:
    seq = mmpe.Sequence(5, causal=True)
    mha = mmpe.MultiHeadAttention(16, 2, [mmpe.build("alibi", num_heads=2)])
    q = torch.randn(0, 2, 5, 8)
    assert mha.forward_heads(q, q, q, seq).shape == (0, 2, 5, 8)
    with pytest.raises(ValueError, match=r"empty batch \(b=0\) cannot extend a KV cache"):
        mha(torch.randn(0, 5, 16), mmpe.Sequence(5, causal=True), cache=mmpe.KVCache())
    cross = mmpe.CrossAttention(16, 2, [])
    out = cross(torch.randn(0, 3, 16), mmpe.Sequence(3), torch.randn(0, 4, 16), mmpe.Sequence(4))
    assert out.shape == (0, 3, 16)
    model = mmpe.Transformer(16, 2, 2, ["sinusoidal", "rope", "alibi"])
    assert model(torch.randn(0, 5, 16), seq).shape == (0, 5, 16)
