"""A key/value cache carries what its cached tokens' coordinates said: their padding, and
whether the coordinates can describe a cached step at all.

A left-padded prompt fills the cache with pads; a later step must say so again
(`padding_mask` over every key) or it would attend to them and count them as positions — the
step is refused, for every encoding that runs cached on a causal sequence. Coordinates whose
keys are their queries (a grid, a point cloud, a graph …) cannot continue a cache and are
refused at the first step, for every shipped coordinate type.
"""

from __future__ import annotations

import pytest
import torch
from helpers import SAMPLE_COORDS

import mmpe
from mmpe.lm import CausalLM

VOCAB, D, H = 17, 32, 4
CTX = {"max_len": 64, "original_max_position_embeddings": 64, "num_axes": 1}


def _causal_encodings() -> list[str]:
    """The attention-side encodings (rotary, score, kernel) that run on a causal sequence."""
    probe = mmpe.Sequence(4, causal=True)
    return [e.name for e in mmpe.available() if e.supports(probe) and e.hook != "input"]


def _layer(name: str) -> mmpe.MultiHeadAttention:
    torch.manual_seed(0)
    enc = mmpe.build(name, context={"d_model": D, "num_heads": H, "head_dim": D // H, **CTX})
    return mmpe.MultiHeadAttention(D, H, [enc]).eval()


PAD = torch.tensor([[False, False, True, True], [True, True, True, True]])


@pytest.mark.parametrize("name", _causal_encodings())
def test_a_step_after_padded_tokens_needs_their_mask(name: str) -> None:
    attn = _layer(name)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    cache = mmpe.cache.KVCache()
    with torch.no_grad():
        attn(x[:, :4], mmpe.Sequence(4, causal=True, padding_mask=PAD), cache)
        with pytest.raises(ValueError, match="padding_mask"):
            attn(x[:, 4:], mmpe.Sequence(1, offset=4, causal=True), cache)
        other = torch.ones(2, 5, dtype=torch.bool)  # forgets the pads of row 0
        with pytest.raises(ValueError, match="padding_mask"):
            attn(x[:, 4:], mmpe.Sequence(1, offset=4, causal=True, padding_mask=other), cache)
        full = torch.cat((PAD, torch.ones(2, 1, dtype=torch.bool)), dim=1)
        step = attn(x[:, 4:], mmpe.Sequence(1, offset=4, causal=True, padding_mask=full), cache)
        whole = attn(x, mmpe.Sequence(5, causal=True, padding_mask=full))
    torch.testing.assert_close(step, whole[:, 4:], atol=1e-5, rtol=1e-5)
    assert cache.length == 5


def test_padded_generation_matches_each_prompt_alone() -> None:
    torch.manual_seed(0)
    model = CausalLM(VOCAB, D, H, 2, ["rope"], context=CTX).eval()
    batch = torch.tensor([[0, 0, 4, 1], [3, 5, 7, 2]])
    pad = batch != 0
    pad[1] = True
    out = mmpe.generate(model, batch, 3, padding_mask=pad)
    alone = mmpe.generate(model, torch.tensor([[4, 1]]), 3)
    assert torch.equal(out[0, 4:], alone[0, 2:])


def test_an_unpadded_cache_refuses_a_mask_with_pads_in_the_cached_part() -> None:
    attn = _layer("rope")
    x = torch.randn(1, 4, D)
    cache = mmpe.cache.KVCache()
    with torch.no_grad():
        attn(x[:, :3], mmpe.Sequence(3, causal=True), cache)
        late = torch.tensor([[False, True, True, True]])
        with pytest.raises(ValueError, match="disagrees"):
            attn(x[:, 3:], mmpe.Sequence(1, offset=3, causal=True, padding_mask=late), cache)


def _fixed_coordinates() -> list:
    return [pytest.param(name, id=name) for name, make in SAMPLE_COORDS.items()
            if not make().supports_cache]


@pytest.mark.parametrize("cname", _fixed_coordinates())
def test_coordinates_that_cannot_continue_a_cache_refuse_one(cname: str) -> None:
    coords = SAMPLE_COORDS[cname]()
    attn = mmpe.MultiHeadAttention(D, H)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D)
    with pytest.raises(ValueError, match="cache"):
        attn(x, coords, mmpe.cache.KVCache())


def test_every_shipped_coordinate_type_says_whether_it_decodes() -> None:
    from mmpe.coords.base import _COORDINATE_TYPES

    decoding = sorted(k for k, cls in _COORDINATE_TYPES.items() if cls.supports_cache)
    assert "sequence" in decoding and "grid" not in decoding and "points" not in decoding
    assert len(_fixed_coordinates()) >= 7
