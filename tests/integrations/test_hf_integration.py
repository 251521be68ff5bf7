"""HF transformers bridge: RoPE configs both ways, float64 rotary module, score encodings in HF models."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import mmpe  # noqa: E402
from mmpe.integrations.transformers import (  # noqa: E402
    HFRotary,
    apply_score_encodings,
    from_hf_rope,
    mmpe_attention_forward,
    register_attention,
    replace_rotary,
    to_hf_rope,
)

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

HEAD = 16  # tiny models: hidden 64, 4 heads, 2 kv heads
HALF = HEAD // 2
ROPE = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "yarn": {"factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0, "beta_slow": 2.0},
    "longrope": {"factor": 4.0, "original_max_position_embeddings": 64,
                 "short_factor": [1.0 + 0.05 * i for i in range(HALF)],
                 "long_factor": [1.0 + 0.5 * i for i in range(HALF)]},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def llama_config(rope_type="default", init=0.02, **kw):
    return LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       initializer_range=init, pad_token_id=0,
                       rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **ROPE[rope_type]},
                       **kw)


def tiny(arch="llama", seed=0, **kw):
    torch.manual_seed(seed)
    if arch == "llama":
        return LlamaForCausalLM(llama_config(**kw)).eval()
    config = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=0, **kw)
    return Qwen2ForCausalLM(config).eval()


def bert(seed=0):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, pad_token_id=0,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertModel(config).eval()


def hf_inv_freq(config, seq_len=None):
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        d = config.head_dim
        base = config.rope_parameters["rope_theta"]
        return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float) / d), 1.0
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv.double(), scaling


# ----------------------------------------------------------------------------- RoPE configs
@pytest.mark.parametrize("rope_type", list(ROPE))
def test_rope_config_round_trip_and_frequencies_equal_hf(rope_type):
    config = llama_config(rope_type)
    enc = from_hf_rope(config)
    assert enc.registry_name == {"default": "rope", "linear": "rope_pi", "dynamic": "rope_dynamic_ntk",
                                 "yarn": "rope_yarn", "longrope": "rope_longrope",
                                 "llama3": "rope_llama3"}[rope_type]
    lengths = [None, 64, 65, 300, 5000] if rope_type in ("dynamic", "longrope") else [None]
    for seq_len in lengths:
        theirs, scaling = hf_inv_freq(config, seq_len)
        ours = enc.inv_freq(seq_len or 1)
        assert torch.allclose(ours, theirs.double(), rtol=2e-7 * 4, atol=0), (seq_len, (ours - theirs).abs().max())
        assert math.isclose(enc.attention_scaling, scaling, rel_tol=1e-12)
    # mmpe -> HF dict -> mmpe: the same rotations, and HF reads the dict to the same frequencies
    params = to_hf_rope(enc)
    assert params["rope_type"] == rope_type
    back = from_hf_rope(params, head_dim=HEAD, max_position_embeddings=256)
    assert type(back) is type(enc) and back.attention_scaling == enc.attention_scaling
    for seq_len in (10, 300):
        assert torch.equal(back.inv_freq(seq_len), enc.inv_freq(seq_len))
    again = llama_config()
    again.rope_parameters = params
    assert torch.allclose(hf_inv_freq(again, 300)[0], hf_inv_freq(config, 300)[0])
    assert to_hf_rope(back) == params


def test_from_hf_rope_reads_v4_dicts_partial_rotary_and_phi3_lengths():
    # a v4 config.json: rope_scaling with "type", rope_theta at the top level
    enc = from_hf_rope({"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 500000.0,
                        "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert enc.registry_name == "rope_pi" and enc.base == 500000.0 and enc.head_dim == 64
    assert to_hf_rope(enc) == {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}
    # partial rotary: 64 × 0.5 channels rotated, and written back
    enc = from_hf_rope({"rope_type": "default", "partial_rotary_factor": 0.5}, head_dim=64)
    assert enc.rotary_dim == 32 and to_hf_rope(enc)["partial_rotary_factor"] == 0.5
    # yarn without factor: HF uses max / original; a config-level original length wins (Phi-3)
    enc = from_hf_rope({"rope_type": "yarn", "original_max_position_embeddings": 1024}, head_dim=32,
                       max_position_embeddings=4096)
    assert enc.factor == 4.0 and enc.original_max_position_embeddings == 1024
    enc = from_hf_rope({"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 8192,
                        "original_max_position_embeddings": 2048,
                        "rope_scaling": {"type": "su", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
                                         "original_max_position_embeddings": 999}})
    assert enc.registry_name == "rope_longrope" and enc.original_max_position_embeddings == 2048
    assert enc.factor == 4.0 and math.isclose(enc.attention_scaling, math.sqrt(1 + math.log(4) / math.log(2048)))
    # yarn's mscale form becomes an explicit attention_factor
    enc = from_hf_rope({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                        "mscale": 1.0, "mscale_all_dim": 0.707}, head_dim=64)
    assert math.isclose(to_hf_rope(enc)["attention_factor"], enc.attention_scaling)
    nested = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "linear", "factor": 8.0}}
    assert from_hf_rope(nested, head_dim=16, layer_type="full_attention").base == 1e6
    with pytest.raises(ValueError, match="layer_type"):
        from_hf_rope(nested, head_dim=16)


def test_from_hf_rope_and_to_hf_rope_errors():
    with pytest.raises(ValueError, match="not supported.*default"):
        from_hf_rope({"rope_type": "proportional", "factor": 2.0}, head_dim=16)
    with pytest.raises(ValueError, match="head_dim"):
        from_hf_rope({"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        from_hf_rope({"rope_type": "dynamic", "factor": 2.0}, head_dim=16)
    with pytest.raises(ValueError, match="'factor'"):
        from_hf_rope({"rope_type": "linear"}, head_dim=16)
    with pytest.raises(ValueError, match="even"):
        from_hf_rope({"rope_type": "default", "partial_rotary_factor": 0.3}, head_dim=10)
    with pytest.raises(TypeError, match="no HF rope_type"):
        to_hf_rope(mmpe.build("rope_ntk", head_dim=16))
    with pytest.raises(ValueError, match="interleaved"):
        to_hf_rope(mmpe.build("rope", head_dim=16, interleaved=True))
    with pytest.raises(TypeError, match="mmpe RoPE"):
        HFRotary(mmpe.build("alibi", num_heads=4))


# ----------------------------------------------------------------------------- rotary module
@pytest.mark.parametrize("rope_type", list(ROPE))
def test_rotary_module_gives_hf_logits(rope_type):
    hf = tiny(rope_type=rope_type)
    ours = copy.deepcopy(hf)
    rotary = replace_rotary(ours)
    assert ours.model.rotary_emb is rotary and set(ours.state_dict()) == set(hf.state_dict())
    ids = torch.randint(1, 100, (2, 40))
    x = torch.zeros(1, dtype=torch.float32)
    for start in (0, 160):  # 160 + 40 > 64: LongRoPE's long factors, YaRN/Llama3 past training
        pos = torch.arange(start, start + 40)[None].expand(2, -1)
        cos, sin = rotary(x, pos)
        hcos, hsin = hf.model.rotary_emb(x, pos)
        assert cos.shape == hcos.shape == (2, 40, HEAD) and cos.dtype == torch.float32
        assert (cos - hcos).abs().max() < 1e-5 and (sin - hsin).abs().max() < 1e-5
        with torch.no_grad():
            theirs, mine = hf(ids, position_ids=pos).logits, ours(ids, position_ids=pos).logits
        assert (theirs - mine).abs().max() < 1e-5
    assert rotary(torch.zeros(1, dtype=torch.bfloat16), pos)[0].dtype == torch.bfloat16


@pytest.mark.parametrize("rope_type", list(ROPE))
def test_far_positions_stay_exact_where_hf_float32_phases_drift(rope_type):
    """Around position 10⁶ HF's float32 phase m·θ is off by ~1e-2 rad; the float64 one is not.

    Reference: the same model in float64 with float64 cos/sin. Weights of std 0.2 make the
    attention depend on position enough for the logits to show it."""
    hf = tiny(rope_type=rope_type, init=0.2)
    ours = copy.deepcopy(hf)
    replace_rotary(ours)
    ref = copy.deepcopy(ours).double()
    ids = torch.randint(1, 100, (2, 40))
    pos = 10**6 + torch.arange(40)[None].expand(2, -1)
    with torch.no_grad():
        r = ref(ids, position_ids=pos).logits
        hf_err = (hf(ids, position_ids=pos).logits.double() - r).abs().max().item()
        our_err = (ours(ids, position_ids=pos).logits.double() - r).abs().max().item()
    assert our_err < 1e-4 < 1e-2 < hf_err, (our_err, hf_err)
    # the phases themselves: cos/sin in float64 from m·θ (θ equal to HF's to float32 rounding)
    enc = from_hf_rope(hf.config)
    theta = enc.inv_freq(10**6 + 40)
    exact = torch.remainder(pos[0].double()[:, None] * theta, 2 * math.pi)
    cos, _ = HFRotary(enc)(torch.zeros(1, dtype=torch.float64), pos)
    assert (cos[0, :, :HALF] - exact.cos() * enc.attention_scaling).abs().max() < 1e-12
    hcos, _ = hf.model.rotary_emb(torch.zeros(1), pos)
    assert (hcos[0, :, :HALF].double() - exact.cos() * enc.attention_scaling).abs().max() > 1e-3


# ----------------------------------------------------------------------------- score encodings
def alibi_reference(model, ids, mask):
    """HF's own eager attention with ALiBi and the causal/padding mask as one 4D float mask."""
    b, n = ids.shape
    slopes = mmpe.functional.alibi_slopes(4)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    dist = (pos[:, :, None] - pos[:, None, :]).abs().float()
    bias = -slopes.view(1, 4, 1, 1) * dist[:, None]
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)) & mask[:, None, :]
    full = bias.masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    model.set_attn_implementation("eager")
    return model(ids, attention_mask=full).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_alibi_equals_hf_eager_with_an_explicit_bias(arch):
    ref = tiny(arch)
    model = apply_score_encodings(copy.deepcopy(ref), "alibi")
    ids = torch.randint(1, 100, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    with torch.no_grad():
        ours = model(ids, attention_mask=mask.long()).logits
        theirs = alibi_reference(ref, ids, mask)
    real = mask[:, :, None].expand_as(ours)
    assert torch.allclose(ours[real], theirs[real], atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_no_encodings_equals_eager_and_sdpa(arch):
    ref = tiny(arch)
    model = apply_score_encodings(copy.deepcopy(ref), [])
    ids = torch.randint(1, 100, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).logits
        outs = []
        for impl in ("eager", "sdpa"):
            ref.set_attn_implementation(impl)
            outs.append(ref(ids, attention_mask=mask).logits)
    real = mask.bool()
    for theirs in outs:
        assert torch.allclose(ours[real], theirs[real], atol=1e-5)


ENCODINGS = ["alibi", "t5", "fire", "kerple_log"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", ENCODINGS)
def test_generate_cached_equals_uncached_and_left_padding_equals_single_prompts(arch, name):
    model = randomize(apply_score_encodings(tiny(arch), name, drop_rope=name == "alibi"))
    prompts = [[5, 7, 9, 11, 13], [21, 22, 23]]
    ids = torch.tensor([prompts[0], [0, 0] + prompts[1]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, attention_mask=mask, use_cache=True, **kw)
    plain = model.generate(ids, attention_mask=mask, use_cache=False, **kw)
    assert torch.equal(cached, plain)
    for row, prompt in enumerate(prompts):
        single = model.generate(torch.tensor([prompt]), use_cache=True, **kw)
        assert cached[row, -6:].tolist() == single[0, -6:].tolist()
    # the logits of a left-padded example equal those of the prompt alone
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        alone = model(torch.tensor([prompts[1]])).logits
    assert torch.allclose(batched[1, 2:], alone[0], atol=1e-5)


def randomize(model):
    """T5's table starts at 0 and FIRE's bias is small at init: give them values that show."""
    with torch.no_grad():
        for p in model.mmpe_encodings.parameters():
            p.normal_()
    return model


@pytest.mark.parametrize("name", ["t5", "fire"])
def test_static_cache_equals_dynamic_cache(name):
    """A static cache allocates more key slots than tokens: the unfilled ones are dropped, so
    the queries keep their positions (FIRE reads the query's absolute position)."""
    model = randomize(apply_score_encodings(tiny(), name))
    ids = torch.tensor([[5, 7, 9, 11], [0, 3, 4, 6]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, attention_mask=mask,
              output_scores=True, return_dict_in_generate=True)
    dynamic = model.generate(ids, **kw)
    static = model.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(dynamic.sequences, static.sequences)
    for a, b in zip(dynamic.scores, static.scores, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", ENCODINGS)
def test_sdpa_and_math_paths_agree(name):
    ids = torch.randint(1, 100, (2, 8))
    mask = torch.tensor([[1] * 8, [0, 0, 0] + [1] * 5])
    outs = []
    for route in ("auto", "math"):
        model = apply_score_encodings(tiny("qwen2"), name, route=route)
        with torch.no_grad():
            outs.append(model(ids, attention_mask=mask).logits)
    assert torch.isfinite(outs[0]).all()
    assert torch.allclose(outs[0][mask.bool()], outs[1][mask.bool()], atol=1e-5)


@pytest.mark.parametrize("share", [True, False])
def test_encodings_train_and_round_trip_through_the_state_dict(share):
    model = apply_score_encodings(tiny(), ["t5", "fire"], share_encodings=share)
    keys = [k for k in model.state_dict() if "mmpe_encodings" in k]
    if share:
        assert keys and all(k.startswith("mmpe_encodings.") for k in keys)
    else:
        assert any(k.startswith("model.layers.1.self_attn.mmpe_encodings.") for k in keys)
    model.train()
    ids = torch.randint(1, 100, (2, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(ids, labels=ids).loss.backward()
    opt.step()
    assert any(not torch.equal(model.state_dict()[k], before[k]) for k in keys)
    model.eval()
    fresh = apply_score_encodings(tiny(seed=1), ["t5", "fire"], share_encodings=share)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    dup = copy.deepcopy(model)  # a copy has its own encodings and state
    with torch.no_grad():
        for p in (dup.mmpe_encodings if share else dup.model.layers[0].self_attn.mmpe_encodings).parameters():
            p.add_(1.0)
        assert not torch.allclose(dup(ids).logits, model(ids).logits)


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_bert_encoder_with_bidirectional_bias(name):
    ref = bert()
    model = apply_score_encodings(copy.deepcopy(ref), name)
    assert model.encoder.layer[0].attention.self._mmpe_link.scores[0] is model.mmpe_encodings[0]
    with torch.no_grad():  # T5's table starts at 0: give it values so that it shows
        for p in model.mmpe_encodings.parameters():
            p.normal_()
    ids = torch.randint(1, 100, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])  # right padding
    with torch.no_grad():
        out = model(ids, attention_mask=mask).last_hidden_state
        alone = model(ids[1:, :4]).last_hidden_state
        plain = ref(ids, attention_mask=mask).last_hidden_state  # the bias changes the output
    assert torch.isfinite(out).all()
    assert torch.allclose(out[1, :4], alone[0], atol=1e-5)
    assert not torch.allclose(out, plain, atol=1e-3)
    math_model = apply_score_encodings(copy.deepcopy(ref), name, route="math")
    math_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.allclose(math_model(ids, attention_mask=mask).last_hidden_state[mask.bool()],
                              out[mask.bool()], atol=1e-5)
    fresh = apply_score_encodings(bert(seed=3), name)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(ids, attention_mask=mask).last_hidden_state, out)


def test_registered_function_without_encodings_is_plain_attention():
    name = register_attention()
    ref = tiny()
    model = copy.deepcopy(ref)
    model.set_attn_implementation(name)  # registered by hand: no encodings, HF's own numbers
    ids = torch.randint(1, 100, (1, 6))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ref(ids).logits, atol=1e-6)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    out, _ = mmpe_attention_forward(torch.nn.Module(), q, k, v, None, scaling=8 ** -0.5)
    assert out.shape == (1, 3, 4, 8)


def test_apply_score_encodings_errors():
    with pytest.raises(TypeError, match="not a score or kernel"):
        apply_score_encodings(tiny(), "rope")
    with pytest.raises(ValueError, match="layer input x"):
        apply_score_encodings(tiny(), "fox")
    with pytest.raises(TypeError, match="swin cannot run"):
        apply_score_encodings(tiny(), "swin", grid_shape=(2, 2))
    with pytest.raises(ValueError, match="causal"):
        apply_score_encodings(bert(), "cope")
    model = apply_score_encodings(tiny(), "alibi")
    with pytest.raises(ValueError, match="already has mmpe encodings"):
        apply_score_encodings(model, "t5")
    with pytest.raises(ValueError, match="route"):
        apply_score_encodings(tiny(), "t5", route="flex")


def test_docstring_example_runs():
    import doctest

    import mmpe.integrations.transformers as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_save_pretrained_keeps_the_encodings(tmp_path):
    from safetensors.torch import load_file

    model = randomize(apply_score_encodings(tiny(), "t5"))
    replace_rotary(model)
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    apply_score_encodings(loaded, "t5")  # the bridge is code: apply it again, then load its tensors
    replace_rotary(loaded)
    state = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("mmpe_encodings.") for k in state)
    loaded.load_state_dict(state, strict=False)
    ids = torch.randint(1, 100, (1, 8))
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)


def _accepted_encodings() -> list[str]:
    """Every registered score/kernel encoding the bridge accepts on a causal LM."""
    names = []
    for entry in mmpe.available(coords=mmpe.Sequence(4, causal=True)):
        if entry.hook not in ("score", "kernel"):
            continue
        try:
            apply_score_encodings(tiny(), entry.name)
        except ValueError:  # refused with a reason (e.g. FoX reads the layer input)
            continue
        names.append(entry.name)
    return names


#: The cache implementations HF offers that run on a CPU-only machine without extra packages
#: (offloaded ones need CUDA; quantized needs optimum-quanto).
CPU_CACHES = ["dynamic", "static", "sliding_window", "hybrid", "hybrid_chunked"]


@pytest.mark.parametrize("name", _accepted_encodings())
def test_every_cache_equals_no_cache_padded_or_not(name):
    """Every accepted encoding x every cache HF offers here x padded / unpadded batch: the
    step scores equal `use_cache=False`. (An unpadded batch gets no attention mask from HF; a
    static cache then has unfilled slots that only `position_ids` tell apart.)"""
    model = randomize(apply_score_encodings(tiny(), name, drop_rope=name == "alibi"))
    ids = torch.tensor([[5, 7, 9, 11], [2, 3, 4, 6]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True,
              return_dict_in_generate=True)
    for extra in ({}, {"attention_mask": mask}):
        plain = model.generate(ids, use_cache=False, **kw, **extra)
        for impl in CPU_CACHES:
            out = model.generate(ids, cache_implementation=impl, **kw, **extra)
            for a, b in zip(plain.scores, out.scores, strict=True):
                assert torch.allclose(a, b, atol=1e-4), (impl, bool(extra), (a - b).abs().max())


@pytest.mark.parametrize("name", ["fire", "t5", "alibi"])
def test_sliding_window_cache_keeps_absolute_positions(name):
    """Mistral-style sliding window (4 keys), generating past it: the cached keys keep their
    absolute positions, so FIRE's query-position normaliser does not restart at the window."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=256, pad_token_id=0, sliding_window=4)
    model = randomize(apply_score_encodings(MistralForCausalLM(config).eval(), name))
    ids = torch.tensor([[5, 7, 9, 11, 13, 15], [2, 3, 4, 6, 8, 10]])
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_scores=True,
              return_dict_in_generate=True)
    plain = model.generate(ids, use_cache=False, **kw)
    for impl in ("dynamic", "sliding_window"):
        out = model.generate(ids, cache_implementation=impl, **kw)
        for a, b in zip(plain.scores, out.scores, strict=True):
            assert torch.allclose(a, b, atol=1e-4), (impl, (a - b).abs().max())


def test_dynamic_ntk_keeps_hf_state_across_calls():
    """HF's dynamic NTK module keeps the longest length seen and resets only when a call falls
    back within the original context; `replace_rotary` follows the same calls to the same
    frequencies. `stateful=False` is the per-call variant, which differs after a longer call."""
    hf = tiny(rope_type="dynamic")  # original context 256
    ours = copy.deepcopy(hf)
    rotary = replace_rotary(ours)
    per_call = HFRotary(rotary.encoding, stateful=False)
    x = torch.zeros(1, dtype=torch.float32)
    differs = False
    for length in (300, 270, 260, 100, 270, 400, 257):
        pos = torch.arange(length)[None]
        hcos, _ = hf.model.rotary_emb(x, pos)
        cos, _ = rotary(x, pos)
        assert (cos - hcos).abs().max() < 5e-5, length  # HF: float32 phases, up to 400
        differs |= bool((per_call(x, pos)[0] - hcos).abs().max() > 1e-3)
    assert differs  # the control: per call is not HF's rule
    rotary.reset()
    torch.testing.assert_close(rotary(x, torch.arange(270)[None])[0],
                               per_call(x, torch.arange(270)[None])[0])
