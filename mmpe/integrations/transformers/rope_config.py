"""HF RoPE configurations as mmpe encodings and back, and HF configs as layer schedules.

[`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope] reads an HF `rope_parameters`
(v5) or `rope_scaling` (v4) dict, or a whole config, into the mmpe rotary encoding of the same
rotations; [`to_hf_rope`][mmpe.integrations.transformers.to_hf_rope] writes one back;
[`layer_schedule_from_hf`][mmpe.integrations.transformers.layer_schedule_from_hf] reads a text
config's per-layer position scheme. Plain dicts in, encodings out: nothing here imports
transformers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mmpe.encodings.rope import RoPE
from mmpe.encodings.rope_scaling import (
    RoPEDynamicNTK,
    RoPELlama3,
    RoPELongRoPE,
    RoPEPositionInterpolation,
    RoPEYaRN,
)
from mmpe.registry import build
from mmpe.schedule import LayerSchedule, LayerSpec, rope_spec

__all__ = ["HONORS_PARTIAL_ROTARY", "ROPE_TYPES", "from_hf_rope", "layer_schedule_from_hf",
           "to_hf_rope"]

#: HF ``rope_type`` → mmpe registry name.
ROPE_TYPES = {"default": "rope", "linear": "rope_pi", "dynamic": "rope_dynamic_ntk",
              "yarn": "rope_yarn", "longrope": "rope_longrope", "llama3": "rope_llama3"}
_ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE (v4 configs)


_CONFIG_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor", "head_dim",
                "hidden_size", "num_attention_heads", "max_position_embeddings",
                "original_max_position_embeddings", "model_type")


def _model_info(config_or_dict: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(rope dict, model-level values)` of an HF config, a config dict or a bare rope dict."""
    if isinstance(config_or_dict, Mapping):
        d = dict(config_or_dict)
        if {"rope_parameters", "rope_scaling", "hidden_size", "num_attention_heads"} & set(d):
            info = {k: d.get(k) for k in _CONFIG_KEYS}
        else:
            return d, {}
    elif hasattr(config_or_dict, "to_dict") or hasattr(config_or_dict, "rope_parameters"):
        info = {k: getattr(config_or_dict, k, None) for k in _CONFIG_KEYS}
    else:
        raise TypeError("from_hf_rope: expected an HF config, a config dict or a rope_parameters "
                        f"dict, got {type(config_or_dict).__name__}")
    rope = info.pop("rope_parameters") or info.pop("rope_scaling", None) or {}
    info.pop("rope_scaling", None)
    return dict(rope), info


def from_hf_rope(config_or_dict: Any, *, head_dim: int | None = None,
                 max_position_embeddings: int | None = None,
                 layer_type: str | None = None) -> RoPE:
    """The mmpe rotary encoding of an HF RoPE configuration.

    Args:
        config_or_dict: an HF `PretrainedConfig` (`rope_parameters`, or v4's `rope_scaling`
            with `rope_theta`), its `config.json` as a dict, or a bare `rope_parameters`
            dict (`{"rope_type": "yarn", "factor": 4.0, ...}`; `"type"` is read too).
        head_dim: channels per head; default: the config's `head_dim` or
            `hidden_size // num_attention_heads`. Required with a bare rope dict.
        max_position_embeddings: the config's value; default: read from the config. Needed by
            `dynamic` (HF's training length for dynamic NTK) and by `yarn`/`longrope`
            without a `factor`.
        layer_type: which entry of a per-layer-type `rope_parameters` (Gemma 3's
            `{"full_attention": {...}, "sliding_attention": {...}}`) to convert.

    Returns:
        `rope`, `rope_pi`, `rope_dynamic_ntk`, `rope_yarn`, `rope_longrope` or
            `rope_llama3` with non-interleaved (HF, GPT-NeoX) channel pairs. A `"default"`
            rope of a config whose `model_type` HF's default rotary does not read
            `partial_rotary_factor` for (`HONORS_PARTIAL_ROTARY`) rotates the whole head.

    Raises:
        ValueError: an unsupported `rope_type` (naming the supported ones); a missing
            `head_dim`, `factor`, `max_position_embeddings` or LongRoPE factor list; an
            odd rotary dimension; a nested dict without `layer_type`.
        TypeError: `config_or_dict` of another type.
    """
    rope, info = _model_info(config_or_dict)
    nested = [k for k, v in rope.items() if isinstance(v, Mapping)]
    if nested:
        if layer_type is None:
            raise ValueError(f"from_hf_rope: rope_parameters is per layer type ({nested}); pass "
                             "layer_type=")
        if layer_type not in rope:
            raise ValueError(f"from_hf_rope: layer_type={layer_type!r} is not in {nested}")
        rope = dict(rope[layer_type])
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    rope_type = _ALIASES.get(rope_type, rope_type)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"from_hf_rope: rope_type {rope_type!r} is not supported; supported: "
                         f"{sorted(ROPE_TYPES)}")
    if head_dim is None:
        head_dim = info.get("head_dim")
        if head_dim is None and info.get("hidden_size") and info.get("num_attention_heads"):
            head_dim = info["hidden_size"] // info["num_attention_heads"]
    if head_dim is None:
        raise ValueError("from_hf_rope: head_dim is unknown; pass head_dim= with a bare "
                         "rope_parameters dict")
    max_pos = max_position_embeddings or info.get("max_position_embeddings")
    _check_rope_numbers(rope, info)
    if rope.get("mrope_section") is not None:
        raise ValueError(f"from_hf_rope: mrope_section {rope['mrope_section']} is Qwen2-VL's "
                         f"multimodal RoPE, which rope_type {rope_type!r} would ignore; build "
                         "mmpe's 'mrope' encoding for it")
    base = float(rope.get("rope_theta") or info.get("rope_theta") or 10000.0)
    prf = rope.get("partial_rotary_factor", info.get("partial_rotary_factor"))
    prf = 1.0 if prf is None else prf
    model_type = info.get("model_type") or ""
    if rope_type == "default" and model_type and \
            model_type.removesuffix("_text") not in HONORS_PARTIAL_ROTARY:
        prf = 1.0  # this model's HF rotary module rotates the whole head (see the set)
    if not 0 < prf <= 1:
        raise ValueError(f"from_hf_rope: partial_rotary_factor must lie in (0, 1], got {prf}")
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2:
        raise ValueError(f"from_hf_rope: head_dim={head_dim} × partial_rotary_factor={prf} = "
                         f"{rotary_dim} rotated channels; must be even")
    common = {"head_dim": int(head_dim), "base": base}
    if rotary_dim != head_dim:
        common["rotary_dim"] = rotary_dim

    def need(key: str) -> Any:
        if rope.get(key) is None:
            raise ValueError(f"from_hf_rope: rope_type {rope_type!r} needs {key!r} in the rope "
                             f"parameters, got keys {sorted(rope)}")
        return rope[key]

    def original() -> int:
        # HF (standardize_rope_params): a config-level original_max_position_embeddings (Phi-3)
        # wins, then the rope dict's, then max_position_embeddings.
        value = info.get("original_max_position_embeddings") or rope.get(
            "original_max_position_embeddings") or max_pos
        if value is None:
            raise ValueError(f"from_hf_rope: rope_type {rope_type!r} needs "
                             "original_max_position_embeddings (or max_position_embeddings=)")
        return int(value)

    def factor_or_ratio() -> float:
        if rope.get("factor") is not None:
            return float(rope["factor"])
        if max_pos is None:
            raise ValueError(f"from_hf_rope: rope_type {rope_type!r} without 'factor' needs "
                             "max_position_embeddings= (HF then uses max / original)")
        return max_pos / original()

    if rope_type == "default":
        return build("rope", **common)
    if rope_type == "linear":
        return build("rope_pi", factor=float(need("factor")), **common)
    if rope_type == "dynamic":
        if max_pos is None:
            raise ValueError("from_hf_rope: rope_type 'dynamic' uses the config's "
                             "max_position_embeddings as its training length; pass "
                             "max_position_embeddings= with a bare rope dict")
        return build("rope_dynamic_ntk", factor=float(need("factor")),
                     original_max_position_embeddings=int(max_pos), **common)
    if rope_type == "yarn":
        opts = {k: rope[k] for k in ("attention_factor", "mscale", "mscale_all_dim")
                if rope.get(k) is not None}
        return build("rope_yarn", factor=factor_or_ratio(), original_max_position_embeddings=original(),
                     beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                     truncate=bool(rope.get("truncate", True)), **opts, **common)
    if rope_type == "longrope":
        opts = {"attention_factor": rope["attention_factor"]} if rope.get("attention_factor") is not None else {}
        return build("rope_longrope", factor=factor_or_ratio(), original_max_position_embeddings=original(),
                     short_factor=list(need("short_factor")), long_factor=list(need("long_factor")),
                     **opts, **common)
    return build("rope_llama3", factor=float(need("factor")), low_freq_factor=float(need("low_freq_factor")),
                 high_freq_factor=float(need("high_freq_factor")),
                 original_max_position_embeddings=original(), **common)


#: HF rope keys that must be numbers when present (a string "4" would be read as something else).
_NUMERIC_ROPE_KEYS = ("factor", "rope_theta", "partial_rotary_factor", "attention_factor",
                      "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "mscale",
                      "mscale_all_dim", "original_max_position_embeddings")


def _check_rope_numbers(rope: Mapping[str, Any], info: Mapping[str, Any]) -> None:
    """Every numeric rope setting is a real number (not a string, not a bool, finite).

    Raises:
        ValueError: names the key and the value given.
    """
    for source in (rope, info):
        for key in _NUMERIC_ROPE_KEYS:
            value = source.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"from_hf_rope: {key} must be a finite number, got {value!r}")


def to_hf_rope(encoding: RoPE) -> dict[str, Any]:
    """The HF `rope_parameters` dict of an mmpe rotary encoding (inverse of [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope]).

    `partial_rotary_factor` is written when `rotary_dim < head_dim`. YaRN's temperature is
    written as `attention_factor` (whatever `mscale`/`mscale_all_dim` produced it). Dynamic
    NTK's training length is not part of HF's dict: it is the config's
    `max_position_embeddings` (`encoding.original_max_position_embeddings`).

    Raises:
        TypeError: not one of the six encodings of `ROPE_TYPES` (`rope_ntk`, xPos …
            have no HF `rope_type`).
        ValueError: interleaved channel pairs (HF's rope types rotate halves).
    """
    kinds = [(RoPEPositionInterpolation, "linear"), (RoPEDynamicNTK, "dynamic"), (RoPEYaRN, "yarn"),
             (RoPELongRoPE, "longrope"), (RoPELlama3, "llama3")]
    rope_type = next((t for cls, t in kinds if isinstance(encoding, cls)), None)
    if rope_type is None and type(encoding) is RoPE:
        rope_type = "default"
    if rope_type is None:
        raise TypeError(f"to_hf_rope: {type(encoding).__name__} has no HF rope_type; supported: "
                        f"{sorted(ROPE_TYPES.values())}")
    if encoding.interleaved:
        raise ValueError("to_hf_rope: HF rope types rotate halves (x_i, x_{i+d/2}); this encoding "
                         "pairs adjacent channels (interleaved=True)")
    out: dict[str, Any] = {"rope_type": rope_type, "rope_theta": encoding.base}
    if encoding.rotary_dim != encoding.head_dim:
        out["partial_rotary_factor"] = encoding.rotary_dim / encoding.head_dim
    if rope_type in ("linear", "dynamic", "yarn", "longrope", "llama3"):
        out["factor"] = encoding.factor
    if rope_type in ("yarn", "longrope", "llama3"):
        out["original_max_position_embeddings"] = encoding.original_max_position_embeddings
    if rope_type == "yarn":
        out.update(beta_fast=encoding.beta_fast, beta_slow=encoding.beta_slow,
                   attention_factor=encoding.attention_scaling, truncate=encoding.truncate)
    elif rope_type == "longrope":
        out.update(short_factor=encoding.short_factor.tolist(), long_factor=encoding.long_factor.tolist(),
                   attention_factor=encoding.attention_scaling)
    elif rope_type == "llama3":
        out.update(low_freq_factor=encoding.low_freq_factor, high_freq_factor=encoding.high_freq_factor)
    return out


# ----------------------------------------------------------------------------- layer schedules
def layer_schedule_from_hf(config: Any) -> LayerSchedule:
    """The `LayerSchedule` of an HF transformers text config.

    The [`LayerSchedule`][mmpe.schedule.LayerSchedule] of an HF transformers text config (v5
    names), layer by layer (a `PretrainedConfig` or its `config.json` as a dict).

    Reads `num_hidden_layers`; `layer_types` (`"sliding_attention"` → `window =
    sliding_window` unless `use_sliding_window` is False; `"chunked_attention"` → `chunk =
    attention_chunk_size`); `no_rope_layers` (Llama 4, SmolLM3: 0 = NoPE), and for
    Cohere 2 RoPE on the sliding layers only; `rope_parameters` (one dict, or one per layer
    type as in Gemma 3): `rope_type` `"default"` with `rope_theta` and
    `partial_rotary_factor`, or a scaled type (`"llama3"`, `"yarn"`, `"linear"` …) read by
    [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope] into a config dict
    of its settings; interleaved channel pairs for Llama 4 and Cohere 2; and
    Llama 4's `attn_temperature_tuning` (`floor_scale`, `attn_scale`) on its NoPE layers.
    What is not a position scheme (q/k norms, soft-capping, `query_pre_attn_scalar`) is not
    read.

    `partial_rotary_factor` is applied to a `"default"` rope as HF applies it: only for the
    model types whose HF rotary module reads it (`HONORS_PARTIAL_ROTARY`, e.g. GPT-NeoX, Phi,
    GLM, StableLM); Llama 4, Gemma 2/3, Cohere 2, SmolLM3 and the rest rotate the whole head.
    Llama 4's temperature tuning uses HF's defaults (on, `floor_scale=8192`,
    `attn_scale=0.1`) where the config leaves them out.

    Raises:
        ValueError: a config without `num_hidden_layers`; `layer_types` or `no_rope_layers`
            of another length than the depth; a layer type that is not full, sliding or
            chunked attention (a linear-attention or state-space layer of a hybrid model has
            no position scheme mmpe schedules); a sliding layer without `sliding_window` or
            a chunked one without `attention_chunk_size`; temperature tuning without
            `floor_scale`/`attn_scale` outside Llama 4; rope parameters `from_hf_rope`
            refuses, or whose encoding's settings do not rebuild it.
    """
    get = (lambda k, d=None: config.get(k, d)) if isinstance(config, Mapping) else \
        (lambda k, d=None: getattr(config, k, d))
    depth = get("num_hidden_layers")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"layer_schedule_from_hf: the config needs num_hidden_layers >= 1, got {depth!r}")
    model_type = get("model_type", "") or ""
    types = _per_layer(get("layer_types"), "layer_types", depth, ["full_attention"] * depth)
    no_rope = _per_layer(get("no_rope_layers"), "no_rope_layers", depth, [1] * depth)
    rope_params = get("rope_parameters") or {"rope_type": "default",
                                              "rope_theta": get("rope_theta", 10000.0)}
    interleaved = model_type in ("llama4_text", "llama4", "cohere2", "cohere")
    head_dim = get("head_dim") or (get("hidden_size") // get("num_attention_heads")
                                   if get("hidden_size") and get("num_attention_heads") else None)
    partial = not model_type or model_type.removesuffix("_text") in HONORS_PARTIAL_ROTARY

    def rope_for(kind: str) -> dict[str, Any]:
        params = rope_params.get(kind, rope_params) if isinstance(rope_params.get(kind), Mapping) \
            else rope_params
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            return _scaled_rope_spec(dict(params), head_dim, get("max_position_embeddings"),
                                     interleaved)
        spec = rope_spec(params.get("rope_theta", get("rope_theta", 10000.0)), interleaved)
        factor = params.get("partial_rotary_factor", get("partial_rotary_factor"))
        if partial and factor not in (None, 1, 1.0) and head_dim:
            spec["rotary_dim"] = int(head_dim * factor)
        return spec

    temperature = _temperature_tuning(get, model_type)
    layers = []
    for i in range(depth):
        kind = types[i]
        window = chunk = None
        if kind not in _LAYER_TYPES:
            raise ValueError(f"layer_schedule_from_hf: layer_types[{i}] = {kind!r} is not an "
                             f"attention layer mmpe schedules (one of {sorted(_LAYER_TYPES)}); "
                             "a hybrid model's linear-attention or state-space layers have no "
                             "position scheme here")
        if kind == "sliding_attention" and get("use_sliding_window", True) is not False:
            window = _required(get, "sliding_window", i, kind)
        elif kind == "chunked_attention":
            chunk = _required(get, "attention_chunk_size", i, kind)
        uses_rope = bool(no_rope[i]) and (model_type != "cohere2" or kind == "sliding_attention")
        layers.append(LayerSpec(encodings=(rope_for(kind),) if uses_rope else (), window=window,
                                chunk=chunk, temperature=None if uses_rope else temperature))
    return LayerSchedule(layers, name=f"hf:{model_type}" if model_type else "hf")


#: HF model types (module names) whose `"default"` rotary module reads
#: `partial_rotary_factor` (transformers 5: the models whose `compute_default_rope_parameters`
#: reads it; tests/integrations checks this set against the installed transformers).
HONORS_PARTIAL_ROTARY = frozenset((
    "bamba", "deepseek_v4", "diffusion_gemma", "dots3_note", "efficientloftr", "glm", "glm4",
    "glm4_moe", "glm4_moe_lite", "glm4v", "glm4v_moe", "glm_image", "glm_ocr", "glmasr",
    "gpt_neox", "gpt_neox_japanese", "laguna", "mellum", "mimo_v2_flash", "minimax_m2",
    "minimax_m3_vl", "moonshine", "moonshine_streaming", "musicflamingo", "nemotron",
    "nemotron3_5_transcribe", "nemotron3_diarization", "neomme", "persimmon", "phi", "phi3",
    "phi4_multimodal", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp", "recurrent_gemma",
    "solar_open", "stablelm", "step3p7", "zaya"))

#: the attention layer types a schedule holds (HF `layer_types`)
_LAYER_TYPES = frozenset(("full_attention", "sliding_attention", "chunked_attention"))

#: HF's Llama4TextConfig defaults
_LLAMA4_TEMPERATURE = {"attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1}


def _per_layer(values: Any, name: str, depth: int, default: list) -> list:
    if values is None:
        return default
    values = list(values)
    if len(values) != depth:
        raise ValueError(f"layer_schedule_from_hf: {name} has {len(values)} entries but "
                         f"num_hidden_layers is {depth}; give one per layer")
    return values


def _required(get: Any, key: str, i: int, kind: str) -> int:
    value = get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"layer_schedule_from_hf: layer {i} is {kind!r} but the config's "
                         f"{key} is {value!r} (an int >= 1 is needed)")
    return value


def _temperature_tuning(get: Any, model_type: str) -> dict[str, float] | None:
    """Llama 4's attention temperature on NoPE layers (`attn_temperature_tuning`), with HF's
    defaults for Llama 4 configs."""
    defaults = _LLAMA4_TEMPERATURE if model_type.startswith("llama4") else {}
    if not get("attn_temperature_tuning", defaults.get("attn_temperature_tuning", False)):
        return None
    out = {}
    for key in ("floor_scale", "attn_scale"):
        value = get(key, defaults.get(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"layer_schedule_from_hf: attn_temperature_tuning needs {key} > 0, "
                             f"got {value!r}")
        out[key] = float(value)
    return out


def _scaled_rope_spec(params: dict[str, Any], head_dim: int | None, max_pos: int | None,
                      interleaved: bool) -> dict[str, Any]:
    """The config dict of HF rope parameters of a scaled type: `from_hf_rope` builds the
    encoding and its saved settings (`SavesSettings`) name it; rebuilt from the dict, it must
    hold the same settings."""
    if head_dim is None:
        raise ValueError("layer_schedule_from_hf: a scaled rope_type needs head_dim (or hidden_size "
                         "and num_attention_heads) in the config")
    enc = from_hf_rope(params, head_dim=head_dim, max_position_embeddings=max_pos)
    settings = enc.function_settings()
    settings["interleaved"] = bool(interleaved)
    spec = {"name": enc.registry_name,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}}
    again = build(spec, context={"head_dim": head_dim}).function_settings()
    if again != {**settings, "interleaved": bool(interleaved)}:
        raise ValueError(f"layer_schedule_from_hf: rope parameters {params} do not round-trip "
                         f"through a config dict ({settings} vs {again}); write the layer specs "
                         "by hand")
    return spec
