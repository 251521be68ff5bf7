"""``rope_axial``'s axis order (``grid_indexing``) against timm's axial RoPE, unit level.

timm's RoPE-ViT (``vit_*_patch16_rope_224``, Heo et al. 2024) builds its rotary table with
``RotaryEmbeddingCat(head_dim, in_pixels=False, temperature=100, grid_indexing="xy")`` and
rotates interleaved pairs (``apply_rot_embed_cat(..., half=False)``): the first ``h_d/4`` pairs
turn with the column. mmpe's default ``grid_indexing="ij"`` turns them with the row, so on a
non-square grid the two differ — the controls below must see that difference. Whole models:
``tests/integrations/test_timm_integration.py::test_rope_vit_rope_axial_equals_timm_where_attention_matters``.
"""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords import Grid
from mmpe.encodings.rope_axial import axial_phase


def _timm_rotated(q, shape, head_dim, base, grid_indexing, interleaved, prefix):
    """timm's own path: ``RotaryEmbeddingCat.get_embed`` + ``apply_rot_embed_cat`` after the
    prefix tokens (Eva's ``AttentionRope``)."""
    layers = pytest.importorskip("timm.layers")
    rope = layers.RotaryEmbeddingCat(head_dim, in_pixels=False, temperature=base,
                                     grid_indexing=grid_indexing, rotate_half=not interleaved)
    emb = rope.get_embed(list(shape))
    rotated = layers.apply_rot_embed_cat(q[:, :, prefix:], emb, half=not interleaved)
    return torch.cat((q[:, :, :prefix], rotated), dim=2)


def _mmpe_rotated(q, shape, head_dim, base, grid_indexing, interleaved, prefix):
    enc = mmpe.build("rope_axial", head_dim=head_dim, base=base, interleaved=interleaved,
                     grid_indexing=grid_indexing)
    return enc(q, q.clone(), Grid(shape, prefix_tokens=prefix))[0]


def test_rope_vit_on_a_3x5_grid_is_xy_and_not_ij():
    pytest.importorskip("timm")
    torch.manual_seed(0)
    shape, head_dim, prefix = (3, 5), 16, 1
    q = torch.randn(2, 2, prefix + 15, head_dim)
    theirs = _timm_rotated(q, shape, head_dim, 100.0, "xy", True, prefix)  # RoPE-ViT
    ours = _mmpe_rotated(q, shape, head_dim, 100.0, "xy", True, prefix)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    assert (ours - theirs).abs().max() < 1e-5
    # controls: mmpe's default axis order (and its whole default convention) are not RoPE-ViT
    ij = _mmpe_rotated(q, shape, head_dim, 100.0, "ij", True, prefix)
    default = mmpe.build("rope_axial", head_dim=head_dim)(q, q.clone(), Grid(shape, prefix_tokens=1))[0]
    assert (ij - theirs).abs().max() > 0.5
    assert (default - theirs).abs().max() > 0.5
    # the patch at row 0, column 1 turns its first pair by θ_0·1 in xy (column first), not in ij
    first = theirs[..., 1 + 1, :2]  # token (0, 1), interleaved pair 0
    c, s = torch.cos(torch.tensor(1.0)), torch.sin(torch.tensor(1.0))
    x0, x1 = q[..., 2, 0], q[..., 2, 1]
    torch.testing.assert_close(first, torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), -1))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(h=st.integers(1, 6), w=st.integers(1, 6), quarter=st.integers(1, 8),
       base=st.sampled_from([100.0, 10000.0, 37.5]), interleaved=st.booleans(),
       timm_indexing=st.sampled_from(["ij", "xy"]), prefix=st.integers(0, 2))
def test_rope_axial_equals_timm_for_either_indexing(h, w, quarter, base, interleaved,
                                                    timm_indexing, prefix):
    pytest.importorskip("timm")
    head_dim = 4 * quarter
    q = torch.randn(1, 2, prefix + h * w, head_dim, generator=torch.Generator().manual_seed(h * w))
    theirs = _timm_rotated(q, (h, w), head_dim, base, timm_indexing, interleaved, prefix)
    ours = _mmpe_rotated(q, (h, w), head_dim, base, timm_indexing, interleaved, prefix)
    torch.testing.assert_close(ours, theirs, atol=5e-6, rtol=1e-5)
    other = "ij" if timm_indexing == "xy" else "xy"
    swapped = _mmpe_rotated(q, (h, w), head_dim, base, other, interleaved, prefix)
    if h * w > 1:  # control: the other axis order moves some token by ≥ 1 rad on pair 0
        assert (swapped - theirs).abs().max() > 1e-2
    else:
        torch.testing.assert_close(swapped, theirs, atol=5e-6, rtol=1e-5)


def test_xy_swaps_the_first_two_axes_of_any_grid():
    pos = Grid((2, 3, 4)).query_positions
    torch.testing.assert_close(axial_phase(pos, 24, 100.0, "xy"),
                               axial_phase(pos[:, [1, 0, 2]], 24, 100.0, "ij"))
    one = Grid((5,)).query_positions  # one axis: nothing to swap (as torch.meshgrid)
    torch.testing.assert_close(axial_phase(one, 8, grid_indexing="xy"), axial_phase(one, 8))
    assert not torch.equal(axial_phase(pos, 24, grid_indexing="xy"), axial_phase(pos, 24))


def test_default_is_unchanged_and_the_table_cache_keys_on_grid_indexing():
    grid = Grid((3, 5), prefix_tokens=1)
    q = torch.randn(1, 2, grid.num_tokens, 16, generator=torch.Generator().manual_seed(0))
    default = mmpe.build("rope_axial", head_dim=16)
    assert default.grid_indexing == "ij"
    torch.testing.assert_close(default(q, q, grid)[0],
                               mmpe.build("rope_axial", head_dim=16, grid_indexing="ij")(q, q, grid)[0],
                               atol=0, rtol=0)
    cos_ij = default.cos_sin(grid)[0]
    default.grid_indexing = "xy"  # the cached "ij" table must not be served for "xy"
    fresh = mmpe.build("rope_axial", head_dim=16, grid_indexing="xy")
    assert not torch.equal(default.cos_sin(grid)[0], cos_ij)
    torch.testing.assert_close(default(q, q, grid)[0], fresh(q, q, grid)[0], atol=0, rtol=0)


@pytest.mark.parametrize("bad", ["yx", "XY", "", 1, None, ("x", "y")])
def test_a_bad_grid_indexing_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="grid_indexing"):
        mmpe.build("rope_axial", head_dim=16, grid_indexing=bad)
    with pytest.raises(ValueError, match="grid_indexing"):
        axial_phase(Grid((2, 2)).query_positions, 8, grid_indexing=bad)


def _reload(source, target, strict=True):
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    return target.load_state_dict(torch.load(buffer), strict=strict)


def test_grid_indexing_travels_with_the_state_dict():
    ij = mmpe.build("rope_axial", head_dim=16)
    xy = mmpe.build("rope_axial", head_dim=16, grid_indexing="xy", base=100.0, interleaved=True)
    # the default is not written, so state_dicts saved before the option are the same
    assert set(ij.state_dict()) == {"settings.base", "settings.interleaved"}
    assert set(xy.state_dict()) == {"settings.base", "settings.interleaved", "settings.grid_indexing"}
    _reload(ij, mmpe.build("rope_axial", head_dim=16))
    _reload(xy, mmpe.build("rope_axial", head_dim=16, grid_indexing="xy", base=100.0,
                           interleaved=True))
    only_xy = mmpe.build("rope_axial", head_dim=16, grid_indexing="xy")
    with pytest.raises(RuntimeError, match="grid_indexing='xy' but this module was built with "
                                           "grid_indexing='ij'"):
        _reload(only_xy, mmpe.build("rope_axial", head_dim=16))
    with pytest.raises(RuntimeError, match="grid_indexing='xy' but this module was built with "
                                           "grid_indexing='ij'"):
        _reload(only_xy, mmpe.build("rope_axial", head_dim=16), strict=False)
    with pytest.raises(RuntimeError, match="Missing key.*settings.grid_indexing"):
        _reload(ij, mmpe.build("rope_axial", head_dim=16, grid_indexing="xy"))
    attn = mmpe.MultiHeadAttention(32, 2, [mmpe.build("rope_axial", head_dim=16, grid_indexing="xy")])
    assert "rotary.0.settings.grid_indexing" in attn.state_dict()
