"""Compiled FlexAttention can differentiate a captured tensor only if the `score_mod` indexes it
once: a tensor that requires grad and is read with two `__getitem__` calls makes inductor's
backward fail to lower ("Using multiple indexing operations on the same tensor that requires
gradients in a score_mod function is not currently supported"). The rule is static, so it is
checked here on the CPU for every score and kernel encoding on every coordinate type it
supports: run the `score_mod` on scalar indices, as FlexAttention does, and count the indexing
of each captured tensor that requires grad."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from einops import rearrange
from test_registry_matrix import COORDS, D_MODEL, HEADS, _context
from torch.overrides import TorchFunctionMode

import mmpe
from mmpe.encodings.base import AttentionContext, ScoreEncoding


class IndexCounter(TorchFunctionMode):
    """Counts `__getitem__` on tensors that require grad and were not made inside the call."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[torch.Tensor] = []  # kept alive so their ids are not reused
        self.made_ids: set[int] = set()
        self.reads: Counter[int] = Counter()
        self.shapes: dict[int, tuple] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__:
            t = args[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in self.made_ids:
                self.reads[id(t)] += 1
                self.shapes[id(t)] = tuple(t.shape)
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.made.append(o)
                self.made_ids.add(id(o))
        return out


def _pairs() -> list:
    out = []
    for cname, make in COORDS.items():
        coords = make()
        for entry in mmpe.available():
            if entry.hook in ("score", "kernel") and entry.supports(coords):
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


@pytest.mark.parametrize(("name", "cname"), _pairs())
def test_each_captured_grad_tensor_is_indexed_once(name: str, cname: str) -> None:
    coords = COORDS[cname]()
    enc = mmpe.build(name, context=_context(coords))
    if not isinstance(enc, ScoreEncoding) or not any(p.requires_grad for p in enc.parameters()):
        pytest.skip(f"{name}: no learned parameter reaches its score_mod")
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL, requires_grad=True)
    q, k, v = rearrange(mha.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
    ctx = AttentionContext(coords, HEADS, D_MODEL // HEADS, x.shape[0], x, q, k, v)
    try:
        mod = enc.score_mod(ctx)
    except (NotImplementedError, ValueError) as err:  # no score_mod on this path (e.g. needs probs)
        pytest.skip(f"{name} on {cname}: {err}")
    counter = IndexCounter()
    with counter:
        mod(torch.zeros(()), torch.tensor(1), torch.tensor(1), torch.tensor(2),
            torch.tensor(coords.num_keys - 1))
    twice = {counter.shapes[i]: n for i, n in counter.reads.items() if n > 1}
    assert not twice, f"{name} on {cname}: captured grad tensors indexed more than once {twice}"
