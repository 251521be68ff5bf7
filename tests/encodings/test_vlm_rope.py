"""Vision-language rotary layouts: Qwen2.5-VL absolute-time ids, Qwen3-VL interleaved M-RoPE,
V2PE variable visual increments — against HF transformers and the papers' definitions."""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords import Composite, Sequence, V2PESequence, qwen2_5_vl_composite, v2pe_position_ids
from mmpe.encodings.mrope_qwen import default_interleaved_section, interleaved_axes
from mmpe.testing import assert_coordinates_contract

MERGE = 2  # HF grids are in vision patches; the LLM sees them merged 2 × 2


def _hf_at_least(version: str) -> None:
    """Skip where the installed transformers predates the version these HF comparisons were
    written against (its Qwen2.5-VL `get_rope_index` and rotation helpers differ before it)."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    if Version(transformers.__version__) < Version(version):
        pytest.skip(f"compared with HF transformers >= {version}'s Qwen2.5-VL; this is "
                    f"{transformers.__version__}")


def _hf_index(model_cls, segments, *, tokens_per_second=2, seconds=None):
    """HF's get_rope_index for a token layout given as mmpe segments (no weights loaded)."""
    cfg = types.SimpleNamespace(vision_config=types.SimpleNamespace(
        spatial_merge_size=MERGE, tokens_per_second=tokens_per_second))
    model = types.SimpleNamespace(config=cfg)
    model.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, model)
    kinds, images, videos = [], [], []
    for seg in segments:
        if isinstance(seg, int):
            kinds += [0] * seg
        elif len(seg) == 2:
            kinds += [1] * math.prod(seg)
            images.append([1, seg[0] * MERGE, seg[1] * MERGE])
        else:
            kinds += [2] * math.prod(seg)
            videos.append([seg[0], seg[1] * MERGE, seg[2] * MERGE])
    kw = {"image_grid_thw": torch.tensor(images) if images else None,
          "video_grid_thw": torch.tensor(videos) if videos else None}
    if seconds is not None:
        kw["second_per_grid_ts"] = torch.tensor(seconds)
    ids = torch.zeros(1, len(kinds), dtype=torch.long)
    pos, _ = model_cls.get_rope_index(model, ids, torch.tensor([kinds]), **kw)
    return pos[:, 0]  # [3, n]


def _hf_rotate(module, cfg_cls, q, k, position_ids, section, base=10000.0):
    cfg = cfg_cls(hidden_size=q.shape[-1] * 2, num_attention_heads=2, head_dim=q.shape[-1],
                  rope_parameters={"rope_type": "default", "rope_theta": base,
                                   "mrope_section": list(section)})
    rotary = getattr(module, [n for n in dir(module) if n.endswith("TextRotaryEmbedding")
                              or n == "Qwen2_5_VLRotaryEmbedding"][0])(cfg)
    cos, sin = rotary(q, position_ids[:, None, :])
    return module.apply_rotary_pos_emb(q, k, cos, sin)


# -- Qwen2.5-VL: absolute-time temporal ids ---------------------------------------------------
SEGMENTS_25 = [3, (2, 3), 2, (3, 4, 5), 2, (3, 6, 6), 4]
SECONDS = [0.75, 1.25]  # tokens_per_second 2: intervals 1.5 and 2.5 ids per temporal patch


def test_qwen25_ids_equal_hf_get_rope_index():
    _hf_at_least("5.24")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    hf = _hf_index(Qwen2_5_VLModel, SEGMENTS_25, seconds=SECONDS)
    c = qwen2_5_vl_composite(SEGMENTS_25, second_per_grid_ts=SECONDS, tokens_per_second=2)
    assert torch.equal(c.position_ids, hf)
    # the temporal ids of the first video are ⌊t·1.5⌋ after its start, the second's ⌊t·2.5⌋
    first = c.position_ids[0, c.segment_ids == 3]
    assert sorted(set((first - first.min()).tolist())) == [0, 1, 3]
    second = c.position_ids[0, c.segment_ids == 5]
    assert sorted(set((second - second.min()).tolist())) == [0, 2, 5]
    # control: Qwen2-VL's unscaled ids (and one scale for both videos) differ from HF's
    assert not torch.equal(Composite(SEGMENTS_25).position_ids, hf)
    assert not torch.equal(Composite(SEGMENTS_25, temporal_scale=1.5).position_ids, hf)


def test_qwen25_rotation_equals_hf():
    _hf_at_least("5.24")
    from transformers.models.qwen2_5_vl import configuration_qwen2_5_vl as cfgs
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf_mod

    c = qwen2_5_vl_composite(SEGMENTS_25, second_per_grid_ts=SECONDS, tokens_per_second=2)
    q, k = torch.randn(2, 1, 2, c.num_queries, 64, generator=torch.Generator().manual_seed(0))
    hq, hk = _hf_rotate(hf_mod, cfgs.Qwen2_5_VLTextConfig, q, k, c.position_ids, (8, 12, 12))
    enc = mmpe.build("mrope", head_dim=64)
    oq, ok = enc(q, k, c)
    torch.testing.assert_close(oq, hq, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ok, hk, atol=2e-6, rtol=1e-5)
    # control: the same rotation at Qwen2-VL's unscaled ids is not HF's
    uq, _ = enc(q, k, Composite(SEGMENTS_25))
    assert (uq - hq).abs().max() > 0.1


def test_qwen25_text_after_a_long_video():
    """Text after a video starts at 1 + max id (Qwen's reference, HF <= 5.2); HF >= 5.3 starts
    it at s + max(H, W), inside the video's time span once (T-1)·interval >= max(H, W)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    segs = [2, (4, 2, 2), 3]  # interval 2·2 = 4: temporal ids 2, 6, 10, 14
    hf = _hf_index(Qwen2_5_VLModel, segs, seconds=[2.0])
    c = qwen2_5_vl_composite(segs, second_per_grid_ts=[2.0], tokens_per_second=2)
    vision = c.is_vision
    assert torch.equal(c.position_ids[:, : 2 + 16], hf[:, : 2 + 16])  # text and video: equal
    assert c.position_ids[0, vision].unique().tolist() == [2, 6, 10, 14]
    assert c.position_ids[0, ~vision].tolist() == [0, 1, 15, 16, 17]
    hf_text = hf[0, ~vision][2:].tolist()
    assert hf_text in ([15, 16, 17], [4, 5, 6])  # HF's rule, whichever this version has


def test_qwen25_composite_bad_input():
    with pytest.raises(ValueError, match="second_per_grid_ts needs one entry per video segment"):
        qwen2_5_vl_composite([2, (2, 2, 2), (3, 2, 2)], second_per_grid_ts=[1.0],
                             tokens_per_second=2)
    with pytest.raises(ValueError, match="tokens_per_second"):
        qwen2_5_vl_composite([(2, 2, 2)], second_per_grid_ts=[1.0], tokens_per_second=0)
    with pytest.raises(ValueError, match="second_per_grid_ts"):
        qwen2_5_vl_composite([(2, 2, 2)], second_per_grid_ts=[float("nan")], tokens_per_second=2)
    with pytest.raises(ValueError, match="temporal_scale"):
        Composite([2, (2, 2, 2)], temporal_scale=[1.0, 2.0])


# -- Qwen3-VL: interleaved M-RoPE -------------------------------------------------------------
# A video of 3 frames: Qwen3-VL puts a timestamp text before each frame (HF splits the video's
# grid into T = 1 frames); mmpe gives each frame as its own segment.
SEGMENTS_3 = [3, (2, 3), 2, (1, 3, 2), 2, (1, 3, 2), 2, (1, 3, 2), 4]


def _qwen3_hf_segments():
    return SEGMENTS_3


def test_qwen3_ids_equal_hf_get_rope_index():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cfg = types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=MERGE))
    model = types.SimpleNamespace(config=cfg)
    model.get_vision_position_ids = types.MethodType(Qwen3VLModel.get_vision_position_ids, model)
    kinds = [0] * 3 + [1] * 6 + ([0] * 2 + [2] * 6) * 3 + [0] * 4
    pos, _ = Qwen3VLModel.get_rope_index(
        model, torch.zeros(1, len(kinds), dtype=torch.long), torch.tensor([kinds]),
        image_grid_thw=torch.tensor([[1, 4, 6]]), video_grid_thw=torch.tensor([[3, 6, 4]]))
    assert torch.equal(Composite(SEGMENTS_3).position_ids, pos[:, 0])


@pytest.mark.parametrize("head_dim,section", [(64, (12, 10, 10)), (128, (24, 20, 20)),
                                               (48, (8, 8, 8))])
def test_qwen3_interleaved_rotation_equals_hf(head_dim, section):
    from transformers.models.qwen3_vl import configuration_qwen3_vl as cfgs
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf_mod

    c = Composite(SEGMENTS_3)
    q, k = torch.randn(2, 1, 2, c.num_queries, head_dim, generator=torch.Generator().manual_seed(1))
    hq, hk = _hf_rotate(hf_mod, cfgs.Qwen3VLTextConfig, q, k, c.position_ids, section, 5e6)
    enc = mmpe.build("mrope_interleaved", head_dim=head_dim, mrope_section=section, base=5e6)
    oq, ok = enc(q, k, c)
    torch.testing.assert_close(oq, hq, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ok, hk, atol=2e-6, rtol=1e-5)
    if section == default_interleaved_section(head_dim):
        assert mmpe.build("mrope_interleaved", head_dim=head_dim).mrope_section == section
    # control: contiguous sections (Qwen2-VL's layout) on the same ids are not Qwen3-VL's
    cq, _ = mmpe.build("mrope", head_dim=head_dim, mrope_section=section, base=5e6)(q, k, c)
    assert (cq - hq).abs().max() > 0.1


def test_interleaved_axes_layout():
    axes = interleaved_axes((24, 20, 20))
    assert axes[:6].tolist() == [0, 1, 2, 0, 1, 2] and axes[60:].tolist() == [0, 0, 0, 0]
    assert [(axes == a).sum().item() for a in range(3)] == [24, 20, 20]
    with pytest.raises(ValueError, match="cannot be interleaved"):
        mmpe.build("mrope_interleaved", head_dim=24, mrope_section=(2, 6, 4))
    with pytest.raises(ValueError, match="summing to head_dim/2"):
        mmpe.build("mrope_interleaved", head_dim=24, mrope_section=(4, 4, 3))


def _scores(enc, q, k, coords):
    oq, ok = enc(q, k, coords)
    return oq @ ok.transpose(-1, -2)


class _Ids(mmpe.Coordinates):
    """Arbitrary (t, h, w) ids, float64."""

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


@settings(max_examples=30, deadline=None)
@given(half=st.integers(3, 40), seed=st.integers(0, 2**16),
       shift=st.tuples(*[st.integers(-50, 50)] * 3), base=st.sampled_from([1e4, 1e6, 5e6]))
def test_interleaved_relative_and_norm(half, seed, shift, base):
    """Scores depend on the ids only through their per-axis differences; norms are kept."""
    g = torch.Generator().manual_seed(seed)
    head_dim = 2 * half
    enc = mmpe.build("mrope_interleaved", head_dim=head_dim, base=base)
    ids = torch.randint(0, 30, (7, 3), generator=g).double()
    q, k = torch.randn(2, 1, 2, 7, head_dim, generator=g, dtype=torch.float64)
    s0 = _scores(enc, q, k, _Ids(ids))
    s1 = _scores(enc, q, k, _Ids(ids + torch.tensor(shift, dtype=torch.float64)))
    torch.testing.assert_close(s0, s1, atol=1e-9, rtol=1e-9)
    oq, _ = enc(q, k, _Ids(ids))
    torch.testing.assert_close(oq.norm(dim=-1), q.norm(dim=-1), atol=1e-12, rtol=1e-12)
    # every axis has one of the three highest frequencies and its pairs 3 apart (contiguous
    # sections give the highest ones all to time)
    assert set(enc.axis[:3].tolist()) == {0, 1, 2}
    for a in (1, 2):
        j = (enc.axis == a).nonzero()[:, 0]
        assert bool((j.diff() == 3).all())


# -- V2PE: variable visual position increments ------------------------------------------------
def test_v2pe_positions_follow_reference():
    """The reference `get_rope_pos_id(..., 'v2pe_fix')`: visual ids are linspace(L, L + δN, N+1)[1:]
    after the last text id L, and the next text id is ⌈last visual id⌉ + 1."""
    delta, n_vis = 0.25, 6
    pos = v2pe_position_ids([3, (2, 3), 2], delta)
    assert pos[:3].tolist() == [0.0, 1.0, 2.0]
    ref = torch.linspace(2.0, 2.0 + delta * n_vis, n_vis + 1, dtype=torch.float64)[1:]
    torch.testing.assert_close(pos[3:9], ref, atol=0, rtol=0)
    assert pos[9:].tolist() == [math.ceil(ref[-1].item()) + 1.0, math.ceil(ref[-1].item()) + 2.0]
    # δ that leaves a fraction: 5 tokens × 0.5 = 2.5 → rounded up before the next text token
    pos = v2pe_position_ids([1, (1, 5), 1], 0.5)
    assert pos.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 4.0]


def test_v2pe_delta_one_is_plain_rope_and_delta_matters():
    segs = [4, (3, 4), 5]
    q, k = torch.randn(2, 1, 2, 21, 32, generator=torch.Generator().manual_seed(2))
    rope = mmpe.build("rope", head_dim=32)
    plain = rope(q, k, Sequence(21))
    v1 = rope(q, k, V2PESequence(segs, delta=1.0))
    torch.testing.assert_close(v1[0], plain[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(v1[1], plain[1], atol=1e-6, rtol=1e-6)
    # control: δ = 1/4 moves the image and the text after it
    vq, _ = rope(q, k, V2PESequence(segs, delta=0.25))
    assert (vq - plain[0]).abs().max() > 0.1
    torch.testing.assert_close(vq[..., :4, :], plain[0][..., :4, :], atol=1e-6, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(segs=st.lists(st.one_of(st.integers(1, 6), st.tuples(st.integers(1, 4), st.integers(1, 4))),
                     min_size=1, max_size=6),
       k=st.integers(0, 8))
def test_v2pe_properties(segs, k):
    """Text tokens advance by 1, visual tokens by δ; a visual segment of N tokens spans N·δ;
    positions increase; with δ < 1 the sequence is shorter than its token count."""
    delta = 2.0 ** -k
    c = V2PESequence(segs, delta=delta, causal=True)
    pos = c.query_positions[:, 0]
    steps = pos[1:] - pos[:-1]
    vis = c.is_vision
    assert bool((steps > 0).all())
    same = c.segment_ids[1:] == c.segment_ids[:-1]
    inside_visual = vis[1:] & same
    torch.testing.assert_close(steps[inside_visual], torch.full_like(steps[inside_visual], delta))
    text_after_text = ~vis[1:] & same
    assert bool((steps[~vis[1:] & vis[:-1]] >= 1).all())  # text after an image: ⌈p⌉ + 1
    assert bool((steps[text_after_text] == 1).all())
    assert pos[-1] <= c.num_queries - 1 + 1e-12
    assert_coordinates_contract(c)


def test_v2pe_bad_input():
    for bad in (0.0, 1.5, -0.5, float("nan"), True):
        with pytest.raises(ValueError, match="delta"):
            V2PESequence([2, (2, 2)], delta=bad)
    with pytest.raises(ValueError, match="segment 1"):
        v2pe_position_ids([2, (2, 0)], 0.5)


def test_every_listed_encoding_runs_on_v2pe_or_refuses_fractional_positions():
    """Functional 1D encodings run on V2PE's fractional positions; learned tables (one row per
    integer position) refuse them with a ValueError that says so."""
    from mmpe.context import coords_context
    from mmpe.encodings.base import InputEncoding

    coords = V2PESequence([2, (2, 2), 2], delta=0.25, causal=True)
    ctx = {"d_model": 48, "num_heads": 2, "head_dim": 24, "max_len": 64,
           "original_max_position_embeddings": 4, **coords_context(coords)}
    x = torch.randn(1, coords.num_queries, 48, generator=torch.Generator().manual_seed(0))
    refused = []
    for entry in mmpe.available(coords=coords):
        enc = mmpe.build(entry.name, context=ctx)
        try:
            with torch.no_grad():
                if isinstance(enc, InputEncoding):
                    out = enc.combine(x, coords)
                else:
                    out = mmpe.MultiHeadAttention(48, 2, [enc], route="math")(x, coords)
        except ValueError as err:
            assert "integer positions" in str(err), (entry.name, err)
            refused.append(entry.name)
            continue
        assert torch.isfinite(out).all(), entry.name
    assert "rope" not in refused and "sinusoidal" not in refused
    assert set(refused) <= {"learned", "axial"}


@settings(max_examples=60, deadline=None)
@given(fps=st.sampled_from([1, 2, 4, 5, 10, 12, 24, 25, 29.97, 30, 50, 60]) | st.floats(0.5, 120),
       tokens_per_second=st.sampled_from([1, 2, 4, 25]),
       temporal_patch=st.sampled_from([1, 2]), frames=st.integers(1, 40))
def test_qwen25_temporal_ids_equal_hf_for_processor_tensors(fps, tokens_per_second,
                                                            temporal_patch, frames):
    """The processor passes `second_per_grid_ts` as float32 (`temporal_patch_size / fps`);
    HF multiplies in float32 (see the rounding case below)."""
    _hf_at_least("5.24")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    seconds = torch.tensor([temporal_patch / fps], dtype=torch.float32)
    interval = tokens_per_second * seconds[0]
    hf = Qwen2_5_VLModel.get_vision_position_ids(None, 0, torch.tensor([frames, 1, 1]),
                                                time_interval=interval)
    c = qwen2_5_vl_composite([(frames, 1, 1)], second_per_grid_ts=seconds,
                             tokens_per_second=tokens_per_second)
    assert torch.equal(c.position_ids, hf)


def test_qwen25_float32_rounding_case():
    """24 fps, one frame a patch, 25 ids a second: patch 24 is one second in; float32 rounds
    the product up to 25 (HF), float64 truncates it to 24."""
    seconds = torch.tensor([1 / 24])
    c = qwen2_5_vl_composite([(25, 1, 1)], second_per_grid_ts=seconds, tokens_per_second=25)
    assert int(c.position_ids[0, 24]) == 25
    assert int((torch.arange(25).double() * (25 * (1 / 24))).long()[24]) == 24  # control
