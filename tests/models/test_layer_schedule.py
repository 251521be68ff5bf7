"""Per-layer schedules (mmpe/schedule.py): Llama 4 iRoPE, Gemma 3/2, Cohere 2, SmolLM3.

The HF comparisons run the HF model itself with each attention layer's core — rotary, local
window, temperature, cache, softmax — replaced by the mmpe layer of a scheduled
`mmpe.Transformer` (`MultiHeadAttention.forward_heads`), fed with HF's own q/k/v projections and
q/k norms; embeddings, norms, MLPs and the output projection stay HF's. Only the position and
attention scheme is therefore under test. Logits must equal HF's `Llama4ForCausalLM`,
`Gemma3ForCausalLM`, `SmolLM3ForCausalLM`, `Gemma2ForCausalLM` and `Cohere2ForCausalLM` (tiny random configs, weights drawn with std 0.2 so
positions change the output) to `ATOL`, uncached and decoded incrementally with the mmpe cache;
each comparison has a control (the schedule disabled) that must differ by more than `CONTROL`.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.attention.masks import LocalWindow
from mmpe.cache import ModelCache
from mmpe.integrations.transformers import layer_schedule_from_hf
from mmpe.lm import CausalLM
from mmpe.schedule import PRESETS, AttentionTemperature, LayerSchedule, LayerSpec

#: max |logit difference| allowed against HF (float32; logits are O(1–5); measured ≤ 2.7e-6).
ATOL = 3e-5
#: a control (schedule off) must differ from HF by more than this (measured ≥ 7.4e-3).
CONTROL = 3e-3

H, NH, NKV, HD = 32, 4, 2, 8
STEPS = [6, 7, 9, 10, 14]  # cached decoding: a prompt of 6, then 1, 2, 1 and 4 tokens


# ---------------------------------------------------------------------------- masks
def _hf_masks():
    mu = pytest.importorskip("transformers.masking_utils")
    return mu


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), offset=st.integers(0, 9), size=st.integers(1, 8),
       kind=st.sampled_from(["sliding", "chunked"]))
def test_window_masks_equal_hf_overlays(n, offset, size, kind):
    """The windowed causal mask (with a cache offset) is HF's causal ∧ sliding/chunked overlay
    evaluated at cache positions."""
    mu = _hf_masks()
    coords = LocalWindow(kind, size).apply(mmpe.Sequence(n, offset=offset, causal=True))
    ours = coords.dense_mask()[0, 0]
    overlay = (mu.sliding_window_overlay(size) if kind == "sliding"
               else mu.chunked_overlay(size, torch.zeros(1, dtype=torch.long)))
    fn = mu.and_masks(mu.causal_mask_function, overlay)
    b = torch.zeros((), dtype=torch.long)
    ref = torch.tensor([[bool(fn(b, b, torch.tensor(offset + q), torch.tensor(k)))
                         for k in range(offset + n)] for q in range(n)])
    assert torch.equal(ours, ref)


def test_window_left_padding_matches_hf_chunks():
    """A left-padded batch: chunks count from each example's first real token (HF subtracts the
    left padding); padded keys stay masked."""
    mu = _hf_masks()
    pad = torch.tensor([[False, False, True, True, True, True, True],
                        [True, True, True, True, True, True, True]])
    coords = LocalWindow("chunked", 3).apply(mmpe.Sequence(padding_mask=pad, causal=True))
    ours = coords.dense_mask()[:, 0]
    left = (~pad).sum(-1)
    fn = mu.and_masks(mu.causal_mask_function, mu.chunked_overlay(3, left),
                      mu.padding_mask_function(pad))
    for b in range(2):
        ref = torch.tensor([[bool(fn(torch.tensor(b), 0, torch.tensor(q), torch.tensor(k)))
                             for k in range(7)] for q in range(7)])
        real = pad[b]  # HF leaves a padded query's row empty; mmpe lets it see itself
        assert torch.equal(ours[b][real], ref[real])


def test_bidirectional_sliding_window_is_distance():
    coords = LocalWindow("sliding", 2).apply(mmpe.Sequence(6))
    q, k = torch.arange(6)[:, None], torch.arange(6)[None]
    assert torch.equal(coords.dense_mask()[0, 0], (q - k).abs() <= 2)


def test_window_errors_name_the_argument():
    with pytest.raises(ValueError, match="kind must be one of"):
        LocalWindow("dilated", 4)
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        LocalWindow("sliding", 0)
    with pytest.raises(ValueError, match="one integer position per token"):
        LocalWindow("chunked", 2).apply(mmpe.Grid((2, 3)))
    view = LocalWindow("sliding", 2).apply(mmpe.Sequence(4, causal=True))
    with pytest.raises(ValueError, match="already carry the window"):
        LocalWindow("chunked", 2).apply(view)
    with pytest.raises(TypeError, match="window must be a LocalWindow"):
        mmpe.MultiHeadAttention(16, 2, window=4)


def test_window_state_dict_round_trip():
    a = mmpe.MultiHeadAttention(16, 2, window=LocalWindow("sliding", 4))
    b = mmpe.MultiHeadAttention(16, 2, window=LocalWindow("sliding", 5))
    with pytest.raises(RuntimeError, match="size=4"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        mmpe.MultiHeadAttention(16, 2).load_state_dict(a.state_dict())


# ---------------------------------------------------------------------- temperature
@settings(max_examples=50, deadline=None)
@given(floor=st.floats(0.5, 10_000), scale=st.floats(-1, 1), pos=st.integers(0, 200_000))
def test_temperature_formula(floor, scale, pos):
    """`1 + a·log(1 + ⌊(p + 1)/f⌋)` (HF Llama4TextAttention), to float32 rounding."""
    got = AttentionTemperature(floor, scale).scales(torch.tensor([pos]))[0].item()
    # float32 rounding of (p + 1)/f can move the floor by one step where it lands on an integer
    refs = [1.0 + scale * math.log1p(math.floor((pos + 1) / floor * (1 + eps)))
            for eps in (-1e-6, 0.0, 1e-6)]
    assert min(abs(got - ref) for ref in refs) <= 1e-5 * max(1.0, abs(refs[1]))


def test_temperature_scales_queries_only_and_rejects_bad_settings():
    enc = AttentionTemperature(floor_scale=2, attn_scale=0.5)
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    coords = mmpe.Sequence(5, offset=3, causal=True)
    q2, k2 = enc(q, k, coords)
    s = 1 + 0.5 * torch.log1p(torch.floor((torch.arange(3, 8) + 1.0) / 2))
    torch.testing.assert_close(q2, q * s[None, None, :, None])
    assert k2 is k
    for bad in ({"floor_scale": 0}, {"floor_scale": float("inf")}, {"attn_scale": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AttentionTemperature(**bad)
    with pytest.raises(ValueError, match="Positioned1D needs num_axes == 1"):
        enc(q, k, mmpe.Grid((1, 5)))


# ---------------------------------------------------------------------- schedules
def test_presets_follow_hf_layer_types():
    """The presets' layer types equal the HF configs' own defaults."""
    tf = pytest.importorskip("transformers")
    depth = 12
    llama = tf.Llama4TextConfig(num_hidden_layers=depth)
    sched = LayerSchedule.parse("llama4", depth)
    assert [int(s.encodings != ()) for s in sched] == llama.no_rope_layers
    assert [("chunked_attention" if s.chunk else "full_attention") for s in sched] == llama.layer_types
    assert {s.chunk for s in sched if s.chunk} == {llama.attention_chunk_size}
    gemma = tf.Gemma3TextConfig(num_hidden_layers=depth)
    sched = LayerSchedule.parse("gemma3", depth)
    assert [("sliding_attention" if s.window else "full_attention") for s in sched] == gemma.layer_types
    for s, kind in zip(sched, gemma.layer_types, strict=True):
        assert s.encodings[0]["base"] == gemma.rope_parameters[kind]["rope_theta"]
        assert s.window in (None, gemma.sliding_window)
    g2 = tf.Gemma2Config(num_hidden_layers=depth)
    assert [("sliding_attention" if s.window else "full_attention")
            for s in LayerSchedule.parse("gemma2", depth)] == g2.layer_types
    c2 = tf.Cohere2Config(num_hidden_layers=depth)
    sched = LayerSchedule.parse("cohere2", depth)
    assert [("sliding_attention" if s.window else "full_attention") for s in sched] == c2.layer_types
    assert all((s.encodings != ()) == bool(s.window) for s in sched)  # RoPE on sliding layers only
    smol = tf.SmolLM3Config(num_hidden_layers=depth)
    assert [int(s.encodings != ()) for s in LayerSchedule.parse("smollm3", depth)] == smol.no_rope_layers


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_cached_decoding_equals_full_forward(preset):
    """Every preset with small windows: incremental decoding equals the full forward."""
    torch.manual_seed(0)
    options = {"llama4": {"chunk_size": 3, "floor_scale": 2}, "smollm3": {}}.get(
        preset, {"sliding_window": 3})
    model = mmpe.Transformer(32, 4, 4, layer_schedule={"preset": preset, **options}).eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        full = model(x, mmpe.Sequence(12, causal=True))
        cache, outs, start = model.make_cache(), [], 0
        for stop in (5, 6, 8, 12):
            outs.append(model(x[:, start:stop], mmpe.Sequence(stop - start, offset=start, causal=True),
                              cache=cache))
            start = stop
    err = (torch.cat(outs, 1) - full).abs().max().item()
    assert err < 1e-5, err
    # control: the windows matter (same weights, schedule without windows / temperature)
    plain = [LayerSpec(encodings=s.encodings) for s in model.layer_schedule]
    if preset != "smollm3":
        other = mmpe.Transformer(32, 4, 4, layer_schedule=plain)
        weights = {k: v for k, v in model.state_dict().items() if "settings." not in k}
        other.load_state_dict(weights, strict=False)
        with torch.no_grad():
            assert (other(x, mmpe.Sequence(12, causal=True)) - full).abs().max() > 1e-3


@pytest.mark.parametrize("route", ["sdpa", "math", "flex"])
def test_paths_agree_with_windows_and_score_terms(route):
    """Windows over shared RoPE + ALiBi: SDPA (the relation plan with the window's dense mask),
    math and FlexAttention give the math route's numbers, cached too."""
    torch.manual_seed(0)
    sched = [{"window": 3}, {"chunk": 4}, {}, {"encodings": ["t5"], "window": 2}]
    model = mmpe.Transformer(32, 4, 4, ["rope", "alibi"], layer_schedule=sched).eval()
    x = torch.randn(2, 11, 32)
    coords = mmpe.Sequence(11, causal=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.route = "math"
        ref = model(x, coords)
        for block in model.blocks:
            block.attn.route = route
        out = model(x, coords)
        cache = model.make_cache()
        a = model(x[:, :7], mmpe.Sequence(7, causal=True), cache=cache)
        b = model(x[:, 7:], mmpe.Sequence(4, offset=7, causal=True), cache=cache)
    assert (out - ref).abs().max() < 1e-5
    assert (torch.cat((a, b), 1) - ref).abs().max() < 1e-5


@pytest.mark.parametrize("encodings", [[], ["rope", "alibi"]])
def test_blockwise_sdpa_applies_the_window(monkeypatch, encodings):
    """A mask too large for one SDPA call runs block by block over queries (`_sdpa_rows`, 26
    blocks here), RoPE + ALiBi on the relation plan, each block with its rows of the windowed
    mask: the math route's numbers."""
    torch.manual_seed(0)
    sched = [{"window": 3}, {"chunk": 4}]
    model = mmpe.Transformer(16, 2, 2, encodings, layer_schedule=sched).eval()
    x, coords = torch.randn(2, 13, 16), mmpe.Sequence(13, causal=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.route = "math"
        ref = model(x, coords)
        for block in model.blocks:
            block.attn.route = "sdpa"
        monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "100")  # one query row a block
        out = model(x, coords)
    assert (out - ref).abs().max() < 1e-5


def test_layers_share_encodings_by_spec_and_schedule_round_trips(tmp_path):
    model = mmpe.Transformer(32, 4, 6, layer_schedule={"preset": "gemma3", "sliding_window": 3})
    rot = [b.attn.rotary[0] for b in model.blocks]
    assert all(r is rot[0] for r in rot[:5]) and rot[5] is not rot[0]
    assert [r.base for r in (rot[0], rot[5])] == [1e4, 1e6]
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    state = torch.load(path, weights_only=True)
    sched = LayerSchedule.from_state_dict(state)
    assert sched.to_config() == model.layer_schedule.to_config()
    again = mmpe.Transformer(32, 4, 6, layer_schedule=sched)
    again.load_state_dict(state)  # strict: every key, settings included
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        assert torch.equal(again(x, mmpe.Sequence(9, causal=True)), model(x, mmpe.Sequence(9, causal=True)))
    other = mmpe.Transformer(32, 4, 6, layer_schedule={"preset": "gemma3", "sliding_window": 5})
    with pytest.raises(RuntimeError, match="sliding_window|window|config"):
        other.load_state_dict(state)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        mmpe.Transformer(32, 4, 6, ["rope"]).load_state_dict(state)
    # mmpe show reads it back
    out = subprocess.run([sys.executable, "-m", "mmpe.cli", "show", str(path)], capture_output=True,
                         text=True, check=True).stdout
    assert "layer 5: rope(base=1e+06), global" in out and "sliding window 3" in out


def test_from_hf_reads_presets_defaults_and_scaled_rope():
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    configs = {"llama4": tf.Llama4TextConfig(num_hidden_layers=8),
               "gemma3": tf.Gemma3TextConfig(num_hidden_layers=12),
               "gemma2": tf.Gemma2Config(num_hidden_layers=6),
               "cohere2": tf.Cohere2Config(num_hidden_layers=8),
               "smollm3": tf.SmolLM3Config(num_hidden_layers=8, pad_token_id=0)}
    for preset, cfg in configs.items():
        got = layer_schedule_from_hf(cfg)
        assert got.to_config() == LayerSchedule.parse(preset, cfg.num_hidden_layers).to_config()
    llama = tf.LlamaConfig(num_hidden_layers=2, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 1e4})
    spec = layer_schedule_from_hf(llama)[1].encodings[0]
    assert (spec["name"], spec["factor"], spec["base"]) == ("rope_pi", 2.0, 1e4)
    with pytest.raises(ValueError, match="needs 'factor'"):
        layer_schedule_from_hf({"num_hidden_layers": 1, "head_dim": 8,
                                "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}})
    partial = layer_schedule_from_hf({"num_hidden_layers": 1, "hidden_size": 64,
                                      "num_attention_heads": 4,
                                      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                          "partial_rotary_factor": 0.5}})
    assert partial[0].encodings[0]["rotary_dim"] == 8


def test_cli_show_prints_a_preset(capsys):
    from mmpe.cli import main

    assert main(["show", "llama4", "--depth", "4", "--option", "chunk_size=16"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "layer schedule 'llama4': 4 layers"
    assert out[1] == "  layer 0: rope(base=500000, interleaved=True), chunks of 16"
    assert out[4] == "  layer 3: NoPE, global, temperature(floor_scale=8192, attn_scale=0.1)"
    assert main(["show", "gemma3", "--option", "window=3"]) == 2
    assert "preset 'gemma3'" in capsys.readouterr().err


def test_forms_of_layer_schedule_agree():
    by_preset = LayerSchedule.parse({"preset": "smollm3", "nope_every": 2}, 4)
    by_pattern = LayerSchedule.parse({"every": 2, "then": {"encodings": []},
                                      "otherwise": {"encodings": [{"name": "rope", "base": 2e6}]}}, 4)
    by_list = LayerSchedule.parse(by_pattern.to_config(), 4)
    assert by_preset.to_config() == by_pattern.to_config() == by_list.to_config()
    assert [s.encodings == () for s in by_preset] == [False, True, False, True]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"layer_schedule": "gemma9"}, "unknown preset 'gemma9'"),
    ({"layer_schedule": [{}] * 3}, "3 layer specs for depth=4"),
    ({"layer_schedule": {"every": 0, "then": {}}}, "every must be an int >= 1"),
    ({"layer_schedule": {"every": 2}}, "pattern"),
    ({"layer_schedule": [{"window": 0}] * 4}, "window must be an int >= 1"),
    ({"layer_schedule": [{"window": 2, "chunk": 2}] * 4}, "window or chunk, not both"),
    ({"layer_schedule": [{"windows": 2}] * 4}, "unknown layer spec keys \\['windows'\\]"),
    ({"layer_schedule": [{"encodings": "rope"}] * 4}, "encodings must be a list"),
    ({"layer_schedule": [{"temperature": {"floor": 2}}] * 4}, "temperature must be a dict"),
    ({"layer_schedule": {"preset": "gemma3", "window": 4}}, "preset 'gemma3'.*window"),
    ({"layer_schedule": [{"encodings": ["sinusoidal"]}] * 4}, "input encoding"),
    ({"layer_schedule": "gemma3", "encodings": ["alibi"]}, "used by no layer"),
    ({"layer_schedule": 3}, "layer_schedule must be"),
])
def test_bad_schedules_raise_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mmpe.Transformer(32, 4, 4, **kwargs)


def test_forward_heads_checks_shapes():
    attn = mmpe.MultiHeadAttention(32, 4, num_kv_heads=2)
    coords = mmpe.Sequence(5, causal=True)
    q, kv = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    assert attn.forward_heads(q, kv, kv, coords).shape == (1, 4, 5, 8)
    with pytest.raises(ValueError, match=r"k must be \[b, 2, 5, 8\]"):
        attn.forward_heads(q, q, kv, coords)
    with pytest.raises(ValueError, match="offset=0"):
        attn.forward_heads(q, kv, kv, mmpe.Sequence(5, offset=2, causal=True))


def test_causal_lm_with_schedule_decodes_like_full_forward():
    torch.manual_seed(0)
    lm = CausalLM(50, 32, 4, 4, layer_schedule={"preset": "llama4", "chunk_size": 3,
                                                "floor_scale": 2}).eval()
    ids = torch.randint(0, 50, (1, 10))
    with torch.no_grad():
        full = lm(ids)
        cache = lm.make_cache()
        steps = [lm(ids[:, :4], cache=cache)] + [lm(ids[:, t:t + 1], cache=cache) for t in range(4, 10)]
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-5


# --------------------------------------------------------------------------- HF models
class HFBridge:
    """An HF causal LM whose attention layers run mmpe's scheduled attention core.

    Layer `i` keeps HF's q/k/v projections, its q/k `norm(attn, q, k)` and `o_proj`; between
    them `mm.blocks[i].attn.forward_heads` applies the schedule's rotary encodings, window,
    temperature and the mmpe key/value cache.
    """

    def __init__(self, hf, mm: mmpe.Transformer, norm) -> None:
        self.hf, self.mm = copy.deepcopy(hf), mm
        self.coords: mmpe.Sequence | None = None
        self.cache: ModelCache | None = None
        for i, layer in enumerate(self.hf.model.layers):
            self._patch(layer.self_attn, mm.blocks[i].attn, i, norm)

    def _patch(self, attn, core, i, norm) -> None:
        bridge = self

        def forward(hidden_states, *args, **kwargs):
            b, s, _ = hidden_states.shape
            q = attn.q_proj(hidden_states).view(b, s, -1, core.head_dim)
            k = attn.k_proj(hidden_states).view(b, s, -1, core.head_dim)
            v = attn.v_proj(hidden_states).view(b, s, -1, core.head_dim).transpose(1, 2)
            q, k = norm(attn, q, k)
            out = core.forward_heads(q.transpose(1, 2), k.transpose(1, 2), v, bridge.coords,
                                     None if bridge.cache is None else bridge.cache[i])
            return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1)), None

        attn.forward = forward

    def __call__(self, ids: torch.Tensor, steps: list[int] | None = None) -> torch.Tensor:
        if steps is None:
            self.cache, self.coords = None, mmpe.Sequence(ids.shape[1], causal=True)
            return self.hf(ids, use_cache=False).logits
        self.cache, outs, start = ModelCache(len(self.mm.blocks)), [], 0
        for stop in steps:
            self.coords = mmpe.Sequence(stop - start, offset=start, causal=True)
            outs.append(self.hf(ids[:, start:stop], use_cache=False).logits)
            start = stop
        return torch.cat(outs, 1)


def _randomize(model, std: float = 0.2):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def _check_against_hf(hf, depth, norm, schedule, controls):
    # the schedule read from the HF config itself is the one under test
    expected = LayerSchedule.parse(schedule, depth).to_config()
    assert layer_schedule_from_hf(hf.config).to_config() == expected
    ids = torch.randint(0, 50, (2, STEPS[-1]), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        mm = mmpe.Transformer(H, NH, depth, layer_schedule=schedule, num_kv_heads=NKV)
        bridge = HFBridge(hf, mm, norm)
        full, cached = bridge(ids), bridge(ids, STEPS)
        assert (full - ref).abs().max().item() < ATOL
        assert (cached - ref).abs().max().item() < ATOL
        for name, control in controls.items():
            other = HFBridge(hf, mmpe.Transformer(H, NH, depth, layer_schedule=control,
                                                  num_kv_heads=NKV), norm)
            err = (other(ids) - ref).abs().max().item()
            assert err > CONTROL, f"control {name!r} matches HF too (max error {err:.2e})"


def _no_norm(attn, q, k):
    return q, k


@pytest.fixture(autouse=False)
def quiet_hf():
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield tf


def test_llama4_irope_equals_hf(quiet_hf):
    """iRoPE: interleaved RoPE + chunked attention on layers 0–2, NoPE + temperature on layer 3
    (L2 q/k norm on the RoPE layers; it commutes with the rotation, so it runs before it)."""
    tf = quiet_hf
    cfg = tf.Llama4TextConfig(
        vocab_size=50, hidden_size=H, intermediate_size=64, intermediate_size_mlp=64,
        num_hidden_layers=4, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
        attention_chunk_size=4, floor_scale=3, attn_scale=0.5, num_local_experts=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, use_qk_norm=True,
        attn_implementation="eager", pad_token_id=0)
    assert cfg.no_rope_layers == [1, 1, 1, 0]
    hf = _randomize(tf.Llama4ForCausalLM(cfg))

    def l2(attn, q, k):
        return (attn.qk_norm(q), attn.qk_norm(k)) if hasattr(attn, "qk_norm") else (q, k)

    preset = {"preset": "llama4", "chunk_size": 4, "floor_scale": 3, "attn_scale": 0.5}
    _check_against_hf(hf, 4, l2, preset, {
        "all RoPE, global": [{"encodings": [{"name": "rope", "base": 5e5, "interleaved": True}]}] * 4,
        "no chunks": {**preset, "chunk_size": None},
        "no temperature": {**preset, "temperature": False},
        "half-split RoPE": [{"encodings": [{"name": "rope", "base": 5e5}], "chunk": 4}] * 3
        + [{"encodings": [], "temperature": {"floor_scale": 3.0, "attn_scale": 0.5}}],
    })


def test_gemma3_local_global_equals_hf(quiet_hf):
    """5 sliding-window layers (RoPE 10⁴) + 1 global layer (RoPE 10⁶); q/k RMSNorms before RoPE;
    `query_pre_attn_scalar = head_dim` so the softmax scale is mmpe's 1/√h_d."""
    tf = quiet_hf
    cfg = tf.Gemma3TextConfig(
        vocab_size=50, hidden_size=H, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, query_pre_attn_scalar=HD,
        sliding_window=4, attn_implementation="eager", pad_token_id=0)
    hf = _randomize(tf.Gemma3ForCausalLM(cfg))

    def qk_norms(attn, q, k):
        return attn.q_norm(q), attn.k_norm(k)

    preset = {"preset": "gemma3", "sliding_window": 4}
    _check_against_hf(hf, 6, qk_norms, preset, {
        "global RoPE 10⁴ everywhere": [{"encodings": ["rope"]}] * 6,
        "one base": {**preset, "local_base": 1e6},
        "window off by one": {**preset, "sliding_window": 3},
    })


@pytest.mark.parametrize("sliding", [False, True])
def test_smollm3_nope_layers_equal_hf(quiet_hf, sliding):
    """Every 4th layer NoPE (HF `no_rope_layers`); with `use_sliding_window`, HF's sliding
    window sits on the NoPE layers: a list schedule says so."""
    tf = quiet_hf
    cfg = tf.SmolLM3Config(
        vocab_size=50, hidden_size=H, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=NH, num_key_value_heads=NKV, attn_implementation="eager",
        use_sliding_window=sliding, sliding_window=3 if sliding else None,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hf = _randomize(tf.SmolLM3ForCausalLM(cfg))
    rope = {"encodings": [{"name": "rope", "base": 2e6}]}
    if sliding:
        assert cfg.layer_types == ["full_attention"] * 3 + ["sliding_attention"]
        schedule = [rope] * 3 + [{"encodings": [], "window": 3}]
        controls = {"no window": "smollm3"}
    else:
        schedule = "smollm3"
        controls = {"all RoPE": [rope] * 4}
    _check_against_hf(hf, 4, _no_norm, schedule, controls)


def test_gemma2_alternating_equals_hf(quiet_hf):
    """Sliding-window and global layers alternate, one RoPE base (attention logit soft-capping
    off: it is not a position scheme; `query_pre_attn_scalar = head_dim`)."""
    tf = quiet_hf
    cfg = tf.Gemma2Config(
        vocab_size=50, hidden_size=H, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, query_pre_attn_scalar=HD,
        sliding_window=3, attn_logit_softcapping=None, final_logit_softcapping=None,
        attn_implementation="eager", pad_token_id=0)
    hf = _randomize(tf.Gemma2ForCausalLM(cfg))
    preset = {"preset": "gemma2", "sliding_window": 3}
    _check_against_hf(hf, 4, _no_norm, preset, {
        "no windows": [{"encodings": ["rope"]}] * 4,
        "windows on the other layers": {"every": 2, "then": {"encodings": ["rope"], "window": 3},
                                        "otherwise": {"encodings": ["rope"]}},
    })


def test_cohere2_equals_hf(quiet_hf):
    """3 sliding-window layers with interleaved RoPE, then a global NoPE layer."""
    tf = quiet_hf
    cfg = tf.Cohere2Config(
        vocab_size=50, hidden_size=H, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=NH, num_key_value_heads=NKV, sliding_window=3, logit_scale=1.0,
        attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hf = _randomize(tf.Cohere2ForCausalLM(cfg))
    preset = {"preset": "cohere2", "sliding_window": 3}
    rope = {"name": "rope", "interleaved": True}
    _check_against_hf(hf, 4, _no_norm, preset, {
        "RoPE on every layer": [{"encodings": [rope], "window": 3}] * 3 + [{"encodings": [rope]}],
        "half-split RoPE": [{"encodings": ["rope"], "window": 3}] * 3 + [{"encodings": []}],
    })


@settings(max_examples=15, deadline=None)
@given(window=st.integers(1, 6), chunk=st.integers(1, 6), n=st.integers(2, 12),
       data=st.data())
def test_property_cached_equals_full(window, chunk, n, data):
    """Any window and chunk sizes, any split of the tokens into cached steps."""
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=3))))
    torch.manual_seed(window * 31 + chunk)
    model = mmpe.Transformer(16, 2, 3, ["rope"], layer_schedule=[
        {"window": window}, {"chunk": chunk, "temperature": {"floor_scale": 2.0, "attn_scale": 0.3}},
        {"encodings": []}]).eval()
    x = torch.randn(1, n, 16)
    with torch.no_grad():
        full = model(x, mmpe.Sequence(n, causal=True))
        cache, outs, start = model.make_cache(), [], 0
        for stop in [*cuts, n]:
            outs.append(model(x[:, start:stop], mmpe.Sequence(stop - start, offset=start, causal=True),
                              cache=cache))
            start = stop
    assert (torch.cat(outs, 1) - full).abs().max() < 1e-5


def test_generate_left_padded_with_schedule():
    """Greedy generation of a left-padded batch: cached equals uncached under windows/chunks."""
    torch.manual_seed(0)
    lm = CausalLM(40, 32, 4, 4, layer_schedule={"preset": "llama4", "chunk_size": 3,
                                                "floor_scale": 2}).eval()
    prompts = torch.tensor([[5, 7, 9, 11, 3], [0, 0, 3, 4, 8]])
    mask = torch.tensor([[True] * 5, [False, False, True, True, True]])
    cached = mmpe.generate(lm, prompts, 6, padding_mask=mask)
    plain = mmpe.generate(lm, prompts, 6, padding_mask=mask, use_cache=False)
    assert torch.equal(cached, plain)
    # the padded example decodes as it does alone, unpadded (chunks count from its first token)
    alone = mmpe.generate(lm, prompts[1:, 2:], 6)
    assert torch.equal(cached[1, 5:], alone[0, 3:])


def test_sliding_window_on_a_grid_is_distance():
    grid = mmpe.Grid((3, 3))
    view = LocalWindow("sliding", 1).apply(grid)
    b, h, q, k = mmpe.coords.base.index_grid(1, 1, 9, 9)
    assert torch.equal(view.dense_mask()[0, 0], (grid.distance(q, k, b) <= 1)[0, 0])
    attn = mmpe.MultiHeadAttention(16, 2, [mmpe.build("alibi", num_heads=2)],
                                   window=LocalWindow("sliding", 1))
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        outs = []
        for route in ("sdpa", "math"):
            attn.route = route
            outs.append(attn(x, grid))
    assert (outs[0] - outs[1]).abs().max() < 1e-5


@pytest.mark.skipif(not mmpe.flex_compile.available(),
                    reason="torch.compile of mmpe models needs torch >= 2.6")
def test_scheduled_model_compiles_to_one_graph():
    """Windows (views built by a traceable __init__), chunks and the temperature trace with
    `fullgraph=True`, compiled first, and give the eager numbers."""
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 4, 4, ["alibi"], route="sdpa", layer_schedule=[
        {"window": 3}, {"chunk": 4, "temperature": {"floor_scale": 2.0, "attn_scale": 0.2}},
        {"encodings": ["rope"]}, {}]).eval()
    x, coords = torch.randn(2, 10, 32), mmpe.Sequence(10, causal=True)
    with torch.no_grad():
        compiled = torch.compile(model, backend="eager", fullgraph=True)(x, coords)
        eager = model(x, coords)
    assert (compiled - eager).abs().max() < 1e-5


def test_llama4_with_llama3_scaled_rope_from_hf_equals_hf(quiet_hf):
    """Llama 4's released configs scale RoPE (`rope_type="llama3"`): `layer_schedule_from_hf`
    reads it into a `rope_llama3` config dict (interleaved), and the model equals HF; unscaled
    RoPE does not."""
    tf = quiet_hf
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 500000.0}
    cfg = tf.Llama4TextConfig(
        vocab_size=50, hidden_size=H, intermediate_size=64, intermediate_size_mlp=64,
        num_hidden_layers=4, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
        attention_chunk_size=4, floor_scale=3, attn_scale=0.5, num_local_experts=2,
        rope_parameters=rope, use_qk_norm=False, attn_implementation="eager", pad_token_id=0)
    hf = _randomize(tf.Llama4ForCausalLM(cfg))
    schedule = layer_schedule_from_hf(cfg)
    assert schedule[0].encodings[0]["name"] == "rope_llama3"
    assert schedule[0].encodings[0]["interleaved"] is True
    plain = {"preset": "llama4", "chunk_size": 4, "floor_scale": 3, "attn_scale": 0.5}
    _check_against_hf(hf, 4, _no_norm, schedule, {"unscaled RoPE": plain})
