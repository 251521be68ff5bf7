"""DINOv3 RoPE: equal to timm's RotaryEmbeddingDinoV3 (evaluation and seeded training draws);
coordinate augmentation only in training, bounded, reproducible with a generator."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords import Grid

timm_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")


def _timm(q, shape, prefix, **kw):
    """timm's DINOv3 ViT: rotate the patch tokens with the [sin, cos] table, prefix untouched."""
    rope = timm_sincos.RotaryEmbeddingDinoV3(q.shape[-1], **kw)
    emb = rope.get_embed(list(shape))
    patches = timm_sincos.apply_rot_embed_cat(q[..., prefix:, :], emb, half=True)
    return torch.cat((q[..., :prefix, :], patches), dim=-2)


OPTIONS = [({}, {}),
           ({"normalize_coords": "max"}, {"normalize_coords": "max"}),
           ({"normalize_coords": "min"}, {"normalize_coords": "min"}),
           ({"base": 10000.0}, {"temperature": 10000.0})]


@pytest.mark.parametrize("shape,prefix", [((5, 7), 5), ((4, 4), 1), ((3, 9), 0)])
@pytest.mark.parametrize("ours,theirs", OPTIONS)
def test_equals_timm_in_eval(shape, prefix, ours, theirs):
    g = Grid(shape, prefix_tokens=prefix)
    q, k = torch.randn(2, 2, 3, g.num_tokens, 64, generator=torch.Generator().manual_seed(0))
    enc = mmpe.build("rope_dinov3", head_dim=64, rescale_coords=2.0, **ours).eval()
    oq, ok = enc(q, k, g)
    torch.testing.assert_close(oq, _timm(q, shape, prefix, **theirs), atol=5e-6, rtol=1e-5)
    torch.testing.assert_close(ok, _timm(k, shape, prefix, **theirs), atol=5e-6, rtol=1e-5)
    assert torch.equal(oq[..., :prefix, :], q[..., :prefix, :])
    # control: RoPE on integer patch indices (rope_axial, the same base) is not DINOv3's
    axial, _ = mmpe.build("rope_axial", head_dim=64, base=100.0)(q, k, g)
    assert (axial - oq).abs().max() > 0.1


def test_training_draw_equals_timm_with_the_same_seed():
    aug = {"shift_coords": 0.2, "jitter_coords": 1.3, "rescale_coords": 2.0}
    g = Grid((6, 4), prefix_tokens=1)
    q, k = torch.randn(2, 1, 2, g.num_tokens, 32, generator=torch.Generator().manual_seed(1))
    rope = timm_sincos.RotaryEmbeddingDinoV3(32, **aug).train()
    torch.manual_seed(7)
    emb = rope.get_embed([6, 4])
    ref = timm_sincos.apply_rot_embed_cat(q[..., 1:, :], emb, half=True)
    enc = mmpe.build("rope_dinov3", head_dim=32, **aug).train()
    torch.manual_seed(7)
    oq, _ = enc(q, k, g)
    torch.testing.assert_close(oq[..., 1:, :], ref, atol=5e-6, rtol=1e-5)
    # control: the evaluation table is not this draw
    assert (enc.eval()(q, k, g)[0][..., 1:, :] - ref).abs().max() > 1e-2


def test_augmentation_only_in_training():
    g = Grid((4, 5), prefix_tokens=1)
    q, k = torch.randn(2, 1, 2, g.num_tokens, 16, generator=torch.Generator().manual_seed(2))
    enc = mmpe.build("rope_dinov3", head_dim=16, shift_coords=0.1, jitter_coords=1.2,
                     rescale_coords=1.5)
    enc.eval()
    state = torch.random.get_rng_state()
    a, b = enc(q, k, g), enc(q, k, g)
    assert torch.equal(torch.random.get_rng_state(), state)  # nothing drawn in eval
    assert torch.equal(a[0], b[0]) and not enc.augments
    enc.train()
    c, d = enc(q, k, g), enc(q, k, g)
    assert enc.augments and not torch.equal(c[0], d[0])  # a new draw per call
    # q and k share one draw: equal inputs give equal outputs, and the scores of a patch with
    # itself are unchanged
    e = enc(q, q, g)
    assert torch.equal(e[0], e[1])
    torch.testing.assert_close((e[0] * e[1]).sum(-1), (q * q).sum(-1), atol=1e-5, rtol=1e-5)
    # no augmentation configured: training changes nothing
    plain = mmpe.build("rope_dinov3", head_dim=16).train()
    assert not plain.augments and torch.equal(plain(q, k, g)[0], a[0])


@settings(max_examples=50, deadline=None)
@given(shift=st.floats(1e-3, 1), jitter=st.floats(1, 3), rescale=st.floats(1, 3),
       seed=st.integers(0, 2**31), h=st.integers(1, 8), w=st.integers(1, 8))
def test_augmentation_bounded_and_reproducible(shift, jitter, rescale, seed, h, w):
    """|c| <= (1 + shift)·J·R; the transform is one shift, per-axis and shared scales (so the
    grid stays a grid: each axis is an affine map of the evaluation coordinates); a seeded
    generator reproduces it."""
    kw = {"shift_coords": shift, "jitter_coords": jitter, "rescale_coords": rescale}
    enc = mmpe.build("rope_dinov3", head_dim=8, generator=torch.Generator().manual_seed(seed),
                     **kw).train()
    c = enc.patch_coords((h, w))
    base = enc.eval().patch_coords((h, w))
    assert bool((base.abs() < 1).all())
    bound = (1 + shift) * jitter * rescale
    assert bool((c.abs() <= bound * (1 + 1e-6)).all())
    for a in range(2):  # c_a = scale_a · (base_a + shift_a): an affine map, scale within bounds
        if base[:, a].unique().numel() > 1:
            i, j = base[:, a].argmin(), base[:, a].argmax()
            scale = (c[j, a] - c[i, a]) / (base[j, a] - base[i, a])
            assert 1 / (jitter * rescale) - 1e-6 <= scale <= jitter * rescale + 1e-6
            torch.testing.assert_close(c[:, a], scale * base[:, a] + (c[i, a] - scale * base[i, a]))
    again = mmpe.build("rope_dinov3", head_dim=8, generator=torch.Generator().manual_seed(seed),
                       **kw).train()
    assert torch.equal(again.patch_coords((h, w)), c)


def test_resolution_covers_the_same_square():
    """At any resolution the patches cover [-1, 1]²: a 2× finer grid's coordinates interleave
    the coarse grid's (the coarse centres are the averages of fine pairs)."""
    enc = mmpe.build("rope_dinov3", head_dim=8).eval()
    coarse = enc.patch_coords((4, 4)).reshape(4, 4, 2)
    fine = enc.patch_coords((8, 8)).reshape(8, 8, 2)
    pooled = fine.reshape(4, 2, 4, 2, 2).mean(dim=(1, 3))
    torch.testing.assert_close(pooled, coarse)
    assert fine.abs().max() < 1 and math.isclose(fine[..., 0].max().item(), 1 - 1 / 8)


def test_norms_and_periods():
    enc = mmpe.build("rope_dinov3", head_dim=32)
    g = Grid((3, 3), prefix_tokens=2)
    q = torch.randn(1, 2, g.num_tokens, 32, dtype=torch.float64)
    oq, _ = enc(q, q, g)
    torch.testing.assert_close(oq.norm(dim=-1), q.norm(dim=-1), atol=1e-12, rtol=1e-12)
    from mmpe.encodings.dinov3_rope import dinov3_periods

    p = dinov3_periods(32)
    assert p[0] == 1 and math.isclose(p[-1].item(), 100 ** (2 * 7 / 16))


def test_bad_input():
    for kw in ({"head_dim": 6}, {"head_dim": 8, "jitter_coords": 0.5},
               {"head_dim": 8, "rescale_coords": 0.0}, {"head_dim": 8, "shift_coords": -0.1},
               {"head_dim": 8, "normalize_coords": "diag"}, {"head_dim": 8, "base": 1.0}):
        with pytest.raises((ValueError, TypeError), match="rope_dinov3"):
            mmpe.build("rope_dinov3", **kw)
    enc = mmpe.build("rope_dinov3", head_dim=8)
    q = torch.randn(1, 1, 8, 8)
    with pytest.raises(ValueError, match=r"len\(shape\) == 2"):
        enc(q, q, Grid((2, 2, 2)))
    assert "rope_dinov3" not in {e.name for e in mmpe.available(coords=Grid((2, 2, 2)))}
    assert "rope_dinov3" in {e.name for e in mmpe.available(coords=Grid((2, 3)))}
    with pytest.raises(TypeError, match="GridLayout"):
        enc(q, q, mmpe.Sequence(8))
