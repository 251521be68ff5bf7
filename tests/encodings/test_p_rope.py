"""p-RoPE (Barbero et al. 2025): RoPE with the lowest frequencies truncated to 0.

Closed forms: the frequencies are RoPE's first ⌊p·h_d/2⌋ and then zeros; the kept pairs equal
`rope`'s, the others are the input. Properties over whole ranges (hypothesis): p = 1 is `rope`
bit for bit, scores are relative, the unrotated pairs' scores do not depend on positions at all.
Each property has a control that fails the same check.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.encodings.p_rope import p_rope_inv_freq
from mmpe.encodings.rope import rope_inv_freq

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)
head_dims = st.integers(1, 32).map(lambda h: 2 * h)
ps = st.floats(0.0, 1.0, exclude_min=True)
bases = st.sampled_from([10.0, 100.0, 10000.0, 500000.0])


def _qk(head_dim: int, n: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, n, head_dim, generator=g, dtype=dtype),
            torch.randn(1, 2, n, head_dim, generator=g, dtype=dtype))


def _seq(positions) -> mmpe.Sequence:
    return mmpe.Sequence(position_ids=torch.as_tensor(positions))


def _rotated_channels(head_dim: int, kept: int, interleaved: bool) -> torch.Tensor:
    """Boolean mask of the channels p-RoPE rotates."""
    mask = torch.zeros(head_dim, dtype=torch.bool)
    if interleaved:
        mask[: 2 * kept] = True
    else:
        mask[:kept] = True
        mask[head_dim // 2: head_dim // 2 + kept] = True
    return mask


@SETTINGS
@given(head_dims, ps, bases)
def test_frequencies_are_ropes_first_floor_p_half_then_zero(head_dim, p, base) -> None:
    kept = math.floor(p * head_dim / 2 + 1e-9)
    if kept == 0:
        with pytest.raises(ValueError, match="p="):
            p_rope_inv_freq(head_dim, p, base)
        return
    inv = p_rope_inv_freq(head_dim, p, base)
    ref = torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)],
                       dtype=torch.float64)
    assert int((inv > 0).sum()) == kept
    torch.testing.assert_close(inv[:kept], ref[:kept], rtol=1e-14, atol=0)
    assert torch.all(inv[kept:] == 0)
    # control: rotary_dim = 2·kept keeps as many pairs but recomputes the spectrum over them
    if 0 < kept < head_dim // 2 and kept > 1:
        assert not torch.allclose(rope_inv_freq(2 * kept, base), inv[:kept])


@SETTINGS
@given(head_dims, bases, st.booleans(), st.lists(st.integers(0, 5000), min_size=1, max_size=7))
def test_p_one_is_rope_exactly(head_dim, base, interleaved, positions) -> None:
    q, k = _qk(head_dim, len(positions), dtype=torch.float32)
    coords = _seq(positions)
    got = mmpe.build("p_rope", head_dim=head_dim, p=1.0, base=base, interleaved=interleaved)
    ref = mmpe.build("rope", head_dim=head_dim, base=base, interleaved=interleaved)
    for a, b in zip(got(q, k, coords), ref(q, k, coords), strict=True):
        assert torch.equal(a, b)


@SETTINGS
@given(st.integers(2, 32).map(lambda h: 2 * h), ps, bases, st.booleans(),
       st.lists(st.integers(0, 5000), min_size=2, max_size=7))
def test_kept_pairs_are_ropes_and_the_rest_unrotated(head_dim, p, base, interleaved,
                                                     positions) -> None:
    kept = math.floor(p * head_dim / 2 + 1e-9)
    if kept == 0:
        return
    q, k = _qk(head_dim, len(positions))
    coords = _seq(positions)
    enc = mmpe.build("p_rope", head_dim=head_dim, p=p, base=base, interleaved=interleaved)
    rope = mmpe.build("rope", head_dim=head_dim, base=base, interleaved=interleaved)
    mask = _rotated_channels(head_dim, kept, interleaved)
    out, ref = enc(q, k, coords)[0], rope(q, k, coords)[0]
    torch.testing.assert_close(out[..., mask], ref[..., mask], rtol=0, atol=1e-12)
    assert torch.equal(out[..., ~mask], q[..., ~mask])
    # control: with p < 1 the unrotated channels are not rope's (some position ≠ 0 moves them)
    if kept < head_dim // 2 and any(x != 0 for x in positions):
        assert not torch.allclose(out, ref, atol=1e-6)


@SETTINGS
@given(st.integers(2, 32).map(lambda h: 2 * h), st.floats(0.05, 0.95), st.booleans(),
       st.lists(st.integers(0, 2000), min_size=3, max_size=6), st.integers(1, 3000))
def test_unrotated_pairs_scores_do_not_depend_on_position(head_dim, p, interleaved, positions,
                                                         shift) -> None:
    kept = math.floor(p * head_dim / 2 + 1e-9)
    if kept == 0 or kept == head_dim // 2:
        return
    enc = mmpe.build("p_rope", head_dim=head_dim, p=p, interleaved=interleaved)
    mask = _rotated_channels(head_dim, kept, interleaved)
    q, k = _qk(head_dim, len(positions))
    qs, ks = q * ~mask, k * ~mask  # only the unrotated pairs
    other = [(x * 7 + shift) % 4001 for x in positions]  # unrelated positions, not a shift

    def scores(qq, kk, pos):
        a, b = enc(qq, kk, _seq(pos))
        return a @ b.transpose(-1, -2)

    torch.testing.assert_close(scores(qs, ks, positions), scores(qs, ks, other), rtol=0,
                               atol=1e-12)
    # control: the rotated pairs' scores move with the positions (where the offsets differ)
    qr, kr = q * mask, k * mask
    offsets = torch.tensor(positions)[:, None] - torch.tensor(positions)[None, :]
    if not torch.equal(offsets, torch.tensor(other)[:, None] - torch.tensor(other)[None, :]):
        assert not torch.allclose(scores(qr, kr, positions), scores(qr, kr, other), atol=1e-6)


@SETTINGS
@given(st.integers(2, 32).map(lambda h: 2 * h), ps, st.booleans(),
       st.lists(st.integers(0, 2000), min_size=2, max_size=6), st.integers(1, 3000))
def test_scores_are_relative(head_dim, p, interleaved, positions, shift) -> None:
    if math.floor(p * head_dim / 2 + 1e-9) == 0:
        return
    enc = mmpe.build("p_rope", head_dim=head_dim, p=p, interleaved=interleaved)
    q, k = _qk(head_dim, len(positions))

    def scores(qpos, kpos):
        a = enc(q, q, _seq(qpos))[0]
        b = enc(k, k, _seq(kpos))[0]
        return a @ b.transpose(-1, -2)

    moved = [x + shift for x in positions]
    base = scores(positions, positions)
    torch.testing.assert_close(scores(moved, moved), base, rtol=1e-9, atol=1e-9)
    # control: shifting the queries only changes the offsets, hence the scores
    assert not torch.allclose(scores(moved, positions), base, atol=1e-6)


def test_rotary_dim_is_a_different_encoding() -> None:
    """`rope(rotary_dim=d/2)` and `p_rope(p=1/2)` leave as many channels unrotated, but not
    the same ones, and the frequencies differ (recomputed over r vs truncated)."""
    d = 16
    q, k = _qk(d, 5)
    coords = _seq([0, 3, 10, 50, 200])
    prope = mmpe.build("p_rope", head_dim=d, p=0.5)(q, k, coords)[0]
    partial = mmpe.build("rope", head_dim=d, rotary_dim=d // 2)(q, k, coords)[0]
    unrot_p = (prope == q).all(dim=(0, 1, 2))
    unrot_r = (partial == q).all(dim=(0, 1, 2))
    assert int(unrot_p.sum()) == int(unrot_r.sum()) == d // 2
    assert not torch.equal(unrot_p, unrot_r)
    assert unrot_r[d // 2:].all() and not unrot_p[d // 2:].all()
    assert (prope - partial).abs().max() > 0.1


def test_bad_p_and_head_dim_raise_naming_p() -> None:
    for p in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="p"):
            mmpe.build("p_rope", head_dim=8, p=p)
    with pytest.raises(ValueError, match="head_dim=8"):
        mmpe.build("p_rope", head_dim=8, p=0.2)  # ⌊0.2·4⌋ = 0 pairs
    with pytest.raises(ValueError, match="h_d=8"):
        q = torch.randn(1, 2, 3, 4)
        mmpe.build("p_rope", head_dim=8)(q, q, mmpe.Sequence(3))


def test_p_is_saved_with_the_state_dict() -> None:
    a = mmpe.Transformer(32, 4, 1, [mmpe.build("p_rope", head_dim=8, p=0.5)])
    b = mmpe.Transformer(32, 4, 1, [mmpe.build("p_rope", head_dim=8, p=1.0)])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="p"):
        b.load_state_dict(torch.load(buf))

