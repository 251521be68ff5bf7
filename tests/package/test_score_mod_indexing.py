"""Compiled FlexAttention can differentiate a captured tensor only through one indexing of it:
a tensor that requires grad and is read with two `__getitem__` calls makes inductor's backward
fail to lower ("Using multiple indexing operations on the same tensor that requires gradients
in a score_mod function is not currently supported"), and one used without an index (a 0-d
parameter multiplied in) fails in `process_joint_outputs` (`assert buf.name is not None`; FIRE
and the mesh-displacement MLP did, on an H100). The rule is static, so it is checked here on
the CPU for every score and kernel encoding on every coordinate type it supports, on the terms
the GPU path composes (`flex_mods(tables=True)`: per-offset and grid tables included): run the
`score_mod` on scalar indices, as FlexAttention does, and record every use of each captured
tensor that requires grad."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from helpers import CapturedUses
from test_registry_matrix import COORDS, D_MODEL, HEADS, _context

import mmpe
from mmpe.attention.flex import compose_score_mods, flex_mods
from mmpe.encodings.base import AttentionCall, ScoreEncoding


def _pairs() -> list:
    out = []
    for cname, make in COORDS.items():
        coords = make()
        for entry in mmpe.available():
            if entry.hook in ("score", "kernel") and entry.supports(coords):
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


@pytest.mark.parametrize(("name", "cname"), _pairs())
@pytest.mark.parametrize("gpu_terms", [False, True], ids=["score_mod", "gpu_terms"])
def test_each_captured_grad_tensor_is_indexed_once(name: str, cname: str, gpu_terms: bool) -> None:
    coords = COORDS[cname]()
    enc = mmpe.build(name, context=_context(coords))
    if not isinstance(enc, ScoreEncoding) or not any(p.requires_grad for p in enc.parameters()):
        pytest.skip(f"{name}: no learned parameter reaches its score_mod")
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL, requires_grad=True)
    q, k, v = rearrange(mha.qkv(x), "b s (three h d) -> three b h s d", three=3, h=HEADS)
    ctx = AttentionCall(coords, HEADS, D_MODEL // HEADS, x.shape[0], x, q, k, v)
    try:
        mod = (compose_score_mods(flex_mods([enc], ctx, tables=True)) if gpu_terms
               else enc.score_mod(ctx))
    except (NotImplementedError, ValueError) as err:  # no score_mod on this path (e.g. needs probs)
        pytest.skip(f"{name} on {cname}: {err}")
    uses = CapturedUses()
    with uses:
        mod(torch.zeros(()), torch.tensor(1), torch.tensor(1), torch.tensor(2),
            torch.tensor(coords.num_keys - 1))
    twice = {uses.shapes[i]: n for i, n in uses.reads.items() if n > 1}
    assert not twice, f"{name} on {cname}: captured grad tensors indexed more than once {twice}"
    assert not uses.other, f"{name} on {cname}: captured grad tensors used unindexed {uses.other}"


def test_the_check_sees_an_unindexed_scalar_and_a_double_read() -> None:
    """The control: the two shapes of `score_mod` that fail to lower on a GPU are caught."""
    scale = torch.tensor(0.5, requires_grad=True)
    table = torch.randn(4, requires_grad=True)
    for mod, field in ((lambda s, b, h, q, k: s * scale, "other"),
                       (lambda s, b, h, q, k: s + table[q] + table[k], "reads")):
        uses = CapturedUses()
        with uses:
            mod(torch.zeros(()), torch.tensor(0), torch.tensor(0), torch.tensor(1), torch.tensor(2))
        assert uses.other if field == "other" else max(uses.reads.values()) == 2
