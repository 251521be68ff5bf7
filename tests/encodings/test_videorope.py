"""VideoRoPE (Wei et al. 2025): low-frequency temporal allocation, diagonal layout, adjustable
temporal spacing — checked against the paper's definitions and its reference code's formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords import Composite, Sequence, VideoRoPEComposite
from mmpe.encodings.rope import rope_inv_freq
from mmpe.encodings.videorope import videorope_axes
from mmpe.testing import assert_coordinates_contract

SEGMENTS = [3, (2, 3, 4), 2, (3, 3), 4]


def _reference(q, ids, head_dim, temporal_pairs, base=10000.0):
    """The paper's LTA written out: pair j < S takes h (even j) or w (odd j), pairs j >= S take
    t; cos/sin over [θ, θ] (HF rotate_half), x·cos + rotate_half(x)·sin, in float64."""
    half = head_dim // 2
    spatial = half - temporal_pairs
    inv = rope_inv_freq(head_dim, base)
    rows = [1 if j % 2 == 0 else 2 for j in range(spatial)] + [0] * temporal_pairs
    phase = torch.stack([ids[:, r].double() * inv[j] for j, r in enumerate(rows)], dim=-1)
    cos, sin = torch.cat((phase.cos(), phase.cos()), -1), torch.cat((phase.sin(), phase.sin()), -1)
    x = q.double()
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("delta", [2, 1, 0.5, 1.5])
def test_videorope_equals_reference_formula(delta):
    c = VideoRoPEComposite(SEGMENTS, delta=delta)
    q, k = torch.randn(2, 1, 2, c.num_queries, 64, generator=torch.Generator().manual_seed(0))
    enc = mmpe.build("videorope", head_dim=64)
    # Qwen2-VL's temporal share: 16 of 64 pairs at h_d = 128 (the paper's), 8 of 32 here
    assert enc.temporal_pairs == 8 and enc.mrope_section == (8, 12, 12)
    oq, ok = enc(q, k, c)
    torch.testing.assert_close(oq.double(), _reference(q, c.query_positions, 64, 8), atol=3e-6,
                               rtol=1e-5)
    torch.testing.assert_close(ok.double(), _reference(k, c.query_positions, 64, 8), atol=3e-6,
                               rtol=1e-5)
    # controls: M-RoPE's contiguous high-frequency temporal band on the same ids, and the
    # Qwen2-VL layout (no diagonal, no spacing), both differ
    mq, _ = mmpe.build("mrope", head_dim=64)(q, k, c)
    assert (mq - oq).abs().max() > 0.1
    lq, _ = enc(q, k, Composite(SEGMENTS))
    assert (lq - oq).abs().max() > 0.1


def test_low_frequency_temporal_allocation():
    assert mmpe.build("videorope", head_dim=128).mrope_section == (16, 24, 24)  # the paper's
    axes = videorope_axes(128, 16)
    assert axes[:48].tolist() == [1, 2] * 24 and axes[48:].tolist() == [0] * 16
    theta = rope_inv_freq(128)
    # every temporal frequency is below every spatial one: the longest periods carry time
    assert theta[axes == 0].max() < theta[axes != 0].min()
    # M-RoPE (Qwen2-VL) gives time the highest frequencies instead
    mrope = mmpe.build("mrope", head_dim=128)
    assert theta[mrope.axis == 0].min() > theta[mrope.axis != 0].max()
    # the longest temporal period exceeds a 1,000-frame video's span at δ = 2 (no wrap-around),
    # while M-RoPE's temporal band wraps within a few frames
    assert 2 * math.pi / theta[axes == 0].min() > 2000
    assert 2 * math.pi / theta[mrope.axis == 0].min() < 2 * math.pi / theta[47]


def test_diagonal_layout_and_spacing():
    c = VideoRoPEComposite([2, (3, 3, 4), 3], delta=2)
    ids = c.query_positions
    video = ids[c.is_vision]
    # frames δ apart from the start s = 2; height/width centred on the frame's temporal id
    assert video[:, 0].unique().tolist() == [2, 4, 6]
    assert (video[:, 1] - video[:, 0]).unique().tolist() == [-1, 0, 1]
    assert (video[:, 2] - video[:, 0]).unique().tolist() == [-1, 0, 1, 2]
    # text after the video continues from the last frame's temporal id + 1
    assert ids[~c.is_vision][:, 0].tolist() == [0, 1, 7, 8, 9]
    assert_coordinates_contract(c)
    assert_coordinates_contract(VideoRoPEComposite([2, (2, 2, 3), 1], delta=0.5, causal=True))


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 4), h=st.integers(1, 5), w=st.integers(1, 5), text=st.integers(0, 4),
       delta=st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]))
def test_diagonal_layout_properties(t, h, w, text, delta):
    """The paper's definitions: temporal ids advance by δ per frame; each frame's centre patch
    sits on the diagonal (t, t, t), where its rotation is 1D RoPE at t; text resumes at 1 + the
    last temporal id."""
    segs = ([text] if text else []) + [(t, h, w), 2]
    c = VideoRoPEComposite(segs, delta=delta)
    ids = c.query_positions.double()
    vis = c.is_vision
    frames = ids[vis, 0].reshape(t, h * w)
    assert bool((frames == frames[:, :1]).all())
    torch.testing.assert_close(frames[1:, 0] - frames[:-1, 0], torch.full((t - 1,), delta,
                                                                          dtype=torch.float64))
    centre = ids[vis].reshape(t, h, w, 3)[:, (h - 1) // 2, (w - 1) // 2]
    assert bool((centre == centre[:, :1]).all())
    assert ids[~vis][-2, 0].item() == frames[-1, 0].item() + 1
    # at the diagonal the three ids agree, so VideoRoPE there is plain RoPE at that position
    enc, rope = mmpe.build("videorope", head_dim=24), mmpe.build("rope", head_dim=24)
    q = torch.randn(1, 1, c.num_queries, 24, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(t * 100 + h * 10 + w))
    oq, _ = enc(q, q, c)
    diag = (ids[:, 0] == ids[:, 1]) & (ids[:, 1] == ids[:, 2])
    pos = ids[diag, 0]
    ref = rope(q[..., diag, :], q[..., diag, :], _Float1D(pos))[0]
    torch.testing.assert_close(oq[..., diag, :], ref, atol=1e-12, rtol=1e-12)


class _Float1D(mmpe.Coordinates):
    num_axes = 1

    def __init__(self, pos):
        self.pos = pos

    @property
    def num_queries(self):
        return self.pos.shape[0]

    @property
    def query_positions(self):
        return self.pos[:, None]

    key_positions = query_positions


@settings(max_examples=30, deadline=None)
@given(half=st.integers(3, 40), seed=st.integers(0, 2**16), shift=st.floats(-100, 100),
       delta=st.sampled_from([0.5, 1.0, 2.0]))
def test_relative_property_and_norms(half, seed, shift, delta):
    """Scores depend on the (t, h, w) ids only through differences: translating a whole
    sequence along the diagonal leaves them unchanged; rotations keep norms."""
    head_dim = 2 * half
    enc = mmpe.build("videorope", head_dim=head_dim, temporal_pairs=max(1, half // 4))
    c = VideoRoPEComposite([2, (2, 2, 3), 3], delta=delta)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 2, c.num_queries, head_dim, dtype=torch.float64, generator=g)
    shifted = _Ids(c.query_positions.double() + shift)
    a, b = enc(q, k, _Ids(c.query_positions.double())), enc(q, k, shifted)
    torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2),
                               atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(a[0].norm(dim=-1), q.norm(dim=-1), atol=1e-12, rtol=1e-12)


class _Ids(mmpe.Coordinates):
    num_axes = 3

    def __init__(self, ids):
        self.ids = ids

    @property
    def num_queries(self):
        return self.ids.shape[0]

    @property
    def query_positions(self):
        return self.ids

    key_positions = query_positions


def test_text_only_is_rope():
    q, k = torch.randn(2, 1, 2, 6, 24, generator=torch.Generator().manual_seed(3))
    a = mmpe.build("videorope", head_dim=24)(q, k, Sequence(6))
    b = mmpe.build("rope", head_dim=24)(q, k, Sequence(6))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_videorope_bad_input():
    for bad in (0, 11, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="temporal_pairs"):
            mmpe.build("videorope", head_dim=24, temporal_pairs=bad)
    with pytest.raises(ValueError, match="head_dim"):
        mmpe.build("videorope", head_dim=7)
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="delta"):
            VideoRoPEComposite([2, (2, 2, 2)], delta=bad)


@pytest.mark.parametrize("delta", [1.5, 2])
def test_every_listed_encoding_runs_on_the_layout(delta):
    """`available` lists what runs: the ids may be fractional, so the layout is Positioned and
    Metric but not Directed (Shaw-style tables index integer offsets)."""
    from mmpe.context import coords_context
    from mmpe.encodings.base import InputEncoding

    coords = VideoRoPEComposite([2, (2, 2, 2), 2], delta=delta, causal=True)
    assert not isinstance(coords, mmpe.Directed) and isinstance(coords, mmpe.Metric)
    ctx = {"d_model": 48, "num_heads": 2, "head_dim": 24, "max_len": 64,
           "original_max_position_embeddings": 4, **coords_context(coords)}
    names = [e.name for e in mmpe.available(coords=coords)]
    assert {"videorope", "mrope", "mrope_interleaved", "alibi"} <= set(names)
    x = torch.randn(1, coords.num_queries, 48, generator=torch.Generator().manual_seed(0))
    for name in names:
        enc = mmpe.build(name, context=ctx)
        with torch.no_grad():
            if isinstance(enc, InputEncoding):
                out = enc.combine(x, coords)
            else:
                out = mmpe.MultiHeadAttention(48, 2, [enc], route="math")(x, coords)
        assert torch.isfinite(out).all(), name
