"""The FlexAttention BlockMask of a plain causal sequence is built once per process (its mask is
a function of the sizes), and only there: a mask that reads tensors is built per forward."""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe import flex_compile
from mmpe.attention import flex

pytestmark = pytest.mark.skipif(not flex_compile.available(),
                                reason="FlexAttention needs torch >= 2.6")


def test_equal_sizes_share_one_block_mask_and_other_sizes_do_not() -> None:
    flex._STATIC_MASKS.clear()
    a = flex.block_mask_of(mmpe.Sequence(200, causal=True), torch.device("cpu"))
    b = flex.block_mask_of(mmpe.Sequence(200, causal=True), torch.device("cpu"))
    c = flex.block_mask_of(mmpe.Sequence(200, offset=8, causal=True), torch.device("cpu"))
    assert a is b and c is not a
    assert mmpe.Sequence(200, offset=8, causal=True).mask_key() != mmpe.Sequence(
        208, causal=True).mask_key()


@pytest.mark.parametrize("coords", [
    mmpe.Sequence(40, causal=True, document_ids=torch.tensor([0] * 20 + [1] * 20)),
    mmpe.Sequence(40, causal=True, padding_mask=torch.arange(40) < 30),
    mmpe.Sequence(40, causal=True, position_ids=torch.arange(40) * 2),
    mmpe.Sequence(40),
], ids=["documents", "padding", "position_ids", "not_causal"])
def test_masks_that_read_tensors_have_no_key(coords) -> None:
    assert coords.mask_key() is None


def test_the_shared_mask_gives_the_causal_attention() -> None:
    """Flex with the process-wide mask equals SDPA's causal attention, on every forward."""
    flex._STATIC_MASKS.clear()
    torch.manual_seed(0)
    n = 150
    mha = mmpe.MultiHeadAttention(32, 2, [mmpe.build("alibi", num_heads=2)])
    x = torch.randn(2, n, 32)
    with torch.no_grad():  # FlexAttention has no backward on the CPU
        mha.route = "flex"
        got = [mha(x, mmpe.Sequence(n, causal=True)) for _ in range(2)]
        mha.route = "math"
        want = mha(x, mmpe.Sequence(n, causal=True))
    for out in got:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert len(flex._STATIC_MASKS) == 1


@pytest.mark.parametrize(("length", "offset"), [(150, 0), (1, 300), (130, 7)])
def test_the_shared_mask_is_the_coordinates_mask(length: int, offset: int) -> None:
    """Decoding offsets included: the kept mask equals one built from the coordinates now."""
    from torch.nn.attention.flex_attention import create_block_mask

    coords = mmpe.Sequence(length, offset=offset, causal=True)
    kept = flex.block_mask_of(coords, torch.device("cpu"))
    fresh = create_block_mask(coords.mask_mod(), None, None, length, length + offset,
                              device="cpu")
    assert torch.equal(kept.to_dense(), fresh.to_dense())


def test_the_cache_is_bounded() -> None:
    flex._STATIC_MASKS.clear()
    for n in range(1, flex.STATIC_MASKS_MAX + 5):
        flex.block_mask_of(mmpe.Sequence(n, causal=True), torch.device("cpu"))
    assert len(flex._STATIC_MASKS) == flex.STATIC_MASKS_MAX
