"""Bridge to HF transformers: RoPE configs both ways, a float64 rotary module, score encodings.

Three pieces, each usable alone:

* [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope] / [`to_hf_rope`][mmpe.integrations.transformers.to_hf_rope] convert an HF `rope_parameters` (v5) or
  `rope_scaling` (v4) dict — or a whole config — to the mmpe encoding of the same rotations
  and back. The inverse frequencies equal HF's `ROPE_INIT_FUNCTIONS` (to float32 rounding:
  HF forms them in float32, mmpe in float64).

  | HF rope_type | mmpe encoding | settings read |
  | --- | --- | --- |
  | `default` | `rope` | `rope_theta`, `partial_rotary_factor` |
  | `linear` | `rope_pi` | + `factor` |
  | `dynamic` | `rope_dynamic_ntk` | + `factor`; training length = the config's `max_position_embeddings` (HF's convention) |
  | `yarn` | `rope_yarn` | + `factor`, `original_max_position_embeddings`, `beta_fast`/`beta_slow`, `attention_factor`, `mscale`/`mscale_all_dim`, `truncate` |
  | `longrope` | `rope_longrope` | + `short_factor`/`long_factor`, `factor`, `original_max_position_embeddings`, `attention_factor` |
  | `llama3` | `rope_llama3` | + `factor`, `low_freq_factor`/`high_freq_factor`, `original_max_position_embeddings` |

* [`HFRotary`][mmpe.integrations.transformers.HFRotary] replaces a Llama-family model's `model.model.rotary_emb`
  ([`replace_rotary`][mmpe.integrations.transformers.replace_rotary]): it returns what HF's rotary module returns — `(cos, sin)`,
  `[b, s, rotary_dim]` with duplicated halves, in the dtype of `x` — but forms the phases
  `m·θ` in float64 and reduces them modulo 2π before the cosine. HF forms them in float32, so
  its phases drift by ~0.05 rad around position 10⁶; these stay exact there.

* [`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings] adds any mmpe score encodings (ALiBi, T5, FIRE, KERPLE …) to
  an HF model through its attention interface: it registers the attention function
  [`mmpe_attention_forward`][mmpe.integrations.transformers.mmpe_attention_forward] (and a boolean mask function) under the name `"mmpe"`,
  switches the model to it, and keeps the encodings in `model.mmpe_encodings` so they train and
  are saved with the model's `state_dict`. Cached decoding, left padding and grouped-query
  heads are handled; `generate(..., use_cache=True)` equals `use_cache=False`.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from mmpe.integrations.transformers import apply_score_encodings, from_hf_rope
    >>> config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
    ...                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    ...                      rope_parameters={"rope_type": "linear", "factor": 4.0,
    ...                                       "rope_theta": 10000.0})
    >>> type(from_hf_rope(config)).__name__
    'RoPEPositionInterpolation'
    >>> model = apply_score_encodings(LlamaForCausalLM(config), ["alibi"], drop_rope=True)
    >>> model.config._attn_implementation, [k for k in model.state_dict() if "mmpe" in k]
    ('mmpe', ['mmpe_encodings.0.slopes', 'mmpe_encodings.0.settings.distance_unit'])
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe._optional import require
from mmpe.attention.forms import dense_bias
from mmpe.coords.base import index_grid
from mmpe.coords.sequence import Sequence as Seq1D
from mmpe.encodings.base import (
    AttentionContext,
    Encoding,
    KernelEncoding,
    ScoreEncoding,
)
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

__all__ = ["ATTN_IMPLEMENTATION", "HFRotary", "ROPE_TYPES", "apply_score_encodings", "from_hf_rope",
           "layer_schedule_from_hf", "mmpe_attention_forward", "register_attention", "replace_rotary", "to_hf_rope"]

#: HF ``rope_type`` → mmpe registry name.
ROPE_TYPES = {"default": "rope", "linear": "rope_pi", "dynamic": "rope_dynamic_ntk",
              "yarn": "rope_yarn", "longrope": "rope_longrope", "llama3": "rope_llama3"}
_ALIASES = {"su": "longrope"}  # Phi-3's first name for LongRoPE (v4 configs)
#: the name under which `register_attention` registers the attention and mask functions.
ATTN_IMPLEMENTATION = "mmpe"

EncodingSpec = str | Mapping[str, Any] | Encoding


# ----------------------------------------------------------------------------- RoPE configs
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


# ----------------------------------------------------------------------------- rotary module
class HFRotary(nn.Module):
    """Drop-in for HF's `LlamaRotaryEmbedding` from an mmpe rotary encoding.

    Drop-in for HF's `LlamaRotaryEmbedding` (and its copies in Qwen2, Mistral …) from an mmpe
    rotary encoding, with float64 phases.

    `forward(x, position_ids) -> (cos, sin)`, each `[b, s, rotary_dim]` (the two halves
    equal, as HF's `rotate_half` expects) in `x.dtype`: `cos(m·θ_i)·a` and `sin(m·θ_i)·a`
    with `θ` the encoding's [`inv_freq`][mmpe.encodings.rope.RoPE.inv_freq] at a length `L` and
    `a` its `attention_scaling`. LongRoPE (and every static scaling) uses ``L =
    max(position_ids) + 1` of the call. Dynamic NTK keeps HF's state (`stateful=True`): `L``
    is the longest length seen so far, grown when a call is longer, and reset to the original
    context when a call falls back within it while the longest seen is beyond it
    (`transformers.modeling_rope_utils.dynamic_rope_update`); `stateful=False` uses each
    call's own length instead, and [`reset`][mmpe.integrations.transformers.HFRotary.reset] forgets the lengths seen. The phase `m·θ` is formed in float64 and reduced modulo 2π
    before the cosine, so it stays exact at positions where HF's float32 `m·θ` drifts.

    The encoding is held as a plain attribute, not a submodule: the model's `state_dict` is
    unchanged (HF's rotary module holds only non-persistent buffers).

    Raises:
        TypeError: `encoding` not an mmpe [`RoPE`][mmpe.encodings.rope.RoPE].
        ValueError: interleaved pairs; at call, `position_ids` not `[b, s]` integers.
    """

    def __init__(self, encoding: RoPE, stateful: bool = True) -> None:
        super().__init__()
        if not isinstance(encoding, RoPE):
            raise TypeError(f"HFRotary: encoding must be an mmpe RoPE (rope, rope_yarn …), got "
                            f"{type(encoding).__name__}")
        if encoding.interleaved:
            raise ValueError("HFRotary: HF models rotate halves; build the encoding with "
                             "interleaved=False")
        object.__setattr__(self, "encoding", encoding)
        self.rope_type = next((t for t, n in ROPE_TYPES.items()
                               if n == getattr(encoding, "registry_name", "")), "default")
        self.stateful = bool(stateful)
        self.reset()

    def reset(self) -> None:
        """Forget the lengths seen (dynamic NTK starts again from the original context)."""
        self.max_seq_len_cached = getattr(self.encoding, "original_max_position_embeddings", 0)

    def _length(self, seq_len: int) -> int:
        """The length whose frequencies this call uses (HF's dynamic-NTK state rule)."""
        if self.rope_type != "dynamic" or not self.stateful:
            return seq_len
        original = self.encoding.original_max_position_embeddings
        before = self.max_seq_len_cached
        if seq_len > before:  # growth
            self.max_seq_len_cached = seq_len
        if seq_len < original and before > original:  # back within the original context
            self.max_seq_len_cached = original
        return self.max_seq_len_cached

    @property
    def attention_scaling(self) -> float:
        return self.encoding.attention_scaling

    def extra_repr(self) -> str:
        return f"{getattr(self.encoding, 'registry_name', type(self.encoding).__name__)}, float64 phases"

    @torch.no_grad()
    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.is_floating_point():
            shape = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise ValueError(f"HFRotary: position_ids must be integer [b, s], got {shape}")
        enc = self.encoding
        top = self._length(int(position_ids.max()) + 1)
        device = position_ids.device
        work = device if device.type != "mps" else torch.device("cpu")  # no float64 on MPS
        inv_freq = enc.inv_freq(top).to(device=work, dtype=torch.float64)
        phase = position_ids.to(work, torch.float64).unsqueeze(-1) * inv_freq
        phase = torch.remainder(phase, 2 * math.pi)
        emb = torch.cat((phase, phase), dim=-1)
        scale = float(enc.attention_scaling)
        cos, sin = emb.cos() * scale, emb.sin() * scale
        return cos.to(device=device, dtype=x.dtype), sin.to(device=device, dtype=x.dtype)


class _NoRotary(nn.Module):
    """A rotary module that rotates nothing (cos 1, sin 0): NoPE, for score encodings alone."""

    def __init__(self, rotary_dim: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.rope_type = "none"
        self.attention_scaling = 1.0

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        shape = (*position_ids.shape[-2:], self.rotary_dim) if position_ids.dim() >= 2 else \
            (1, position_ids.shape[-1], self.rotary_dim)
        ones = torch.ones(shape, dtype=x.dtype, device=x.device)
        return ones, torch.zeros_like(ones)


def _rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """`(parent, attribute, module)` of every `rotary_emb` submodule of `model`."""
    found = []
    for parent in model.modules():
        child = parent._modules.get("rotary_emb")
        if child is not None:
            found.append((parent, "rotary_emb", child))
    return found


def replace_rotary(model: nn.Module, encoding: RoPE | None = None, *,
                   stateful: bool = True) -> HFRotary:
    """Replace the rotary module(s) `rotary_emb` of an HF model by [`HFRotary`][mmpe.integrations.transformers.HFRotary] (in place).

    Args:
        model: an HF model whose rotary module is called `rotary_emb(x, position_ids)` and
            returns `(cos, sin)` (Llama, Qwen2, Mistral, Phi-3 … `model.model.rotary_emb`).
        encoding: the rotations; default [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope] of `model.config` (the same
            rotations as HF's, with float64 phases).
        stateful: dynamic NTK keeps HF's longest-length state across calls (default, as HF);
            False: each call's own length (see [`HFRotary`][mmpe.integrations.transformers.HFRotary]).

    Returns:
        the new module (one, shared if the model has several `rotary_emb`).

    Raises:
        ValueError: no `rotary_emb` submodule; the errors of [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope].
    """
    targets = _rotary_modules(model)
    if not targets:
        raise ValueError(f"replace_rotary: {type(model).__name__} has no 'rotary_emb' submodule")
    if encoding is None:
        encoding = from_hf_rope(model.config)
    rotary = HFRotary(encoding, stateful=stateful)
    for parent, name, _ in targets:
        setattr(parent, name, rotary)
    return rotary


# ----------------------------------------------------------------------------- attention
class _ModelState:
    """What the attention calls of one forward share: the 2D padding mask, coordinates, biases."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.padding: Tensor | None = None  # [b, L] bool, True at real tokens (HF's attention_mask)
        self.memo: dict[Any, Any] = {}


class _Capture:
    """Forward pre-hook: remember the 2D `attention_mask` of this call (a callable object, so
    `copy.deepcopy` gives the copy its own state)."""

    def __init__(self, state: _ModelState, index: int | None) -> None:
        self.state, self.index = state, index

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        if mask is None and self.index is not None and len(args) > self.index:
            mask = args[self.index]
        self.state.padding = mask.bool() if isinstance(mask, Tensor) and mask.dim() == 2 else None
        self.state.memo = {}


class _Link:
    """Attached to an attention module (as a plain attribute): its encodings and the model state."""

    def __init__(self, state: _ModelState, scores: list[ScoreEncoding], kernel: KernelEncoding | None) -> None:
        self.state, self.scores, self.kernel = state, scores, kernel


def _is_causal(module: nn.Module, kwargs: Mapping[str, Any]) -> bool:
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", False)
    config = getattr(module, "config", None)
    return bool(causal) and getattr(config, "is_causal", True) is not False


def _visible_keys(mask: Tensor | None) -> Tensor | None:
    """`[b, k]` bool: the keys some query may attend to, from HF's 4D boolean or additive mask."""
    if mask is None or mask.dim() != 4:
        return None
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.any(dim=-2).any(dim=1)


def _key_count(state: _ModelState, mask: Tensor | None, q_len: int, k_len: int,
               position_ids: Tensor | None = None) -> int:
    """Keys that hold tokens: a static cache allocates more slots than tokens seen so far (its
    filled slots come first); the rest are dropped.

    Read from the call's 2D padding mask, else from HF's 4D mask, else — an unpadded batch,
    where HF passes no mask at all — from `position_ids`: the queries sit at slots
    `position_ids`, so the filled slots are `0 … max(position_ids)`.
    """
    if k_len <= q_len:
        return k_len
    pad = state.padding
    if pad is not None:
        return pad.shape[-1] if q_len <= pad.shape[-1] < k_len else k_len
    seen = _visible_keys(mask)
    if seen is None and position_ids is not None:
        return min(k_len, max(q_len, int(position_ids.max()) + 1))
    if seen is None or not bool(seen.any()):
        return k_len
    return max(int(seen.any(dim=0).nonzero().max()) + 1, q_len)


def _coordinates(state: _ModelState, mask: Tensor | None, q_len: int, k_len: int, causal: bool,
                 device: torch.device, position_ids: Tensor | None = None) -> Seq1D:
    """The keys' positions: real tokens numbered from 0 per example (HF's `position_ids` for a
    left-padded batch); the queries are the last `q_len` keys.

    Real tokens are read from the model call's 2D `attention_mask` when there is one (the
    last `k_len` of its entries: a sliding-window cache keeps only the newest keys), else from
    HF's 4D mask (keys no query may see are padding), else all keys are real.

    Without a 2D mask the keys are numbered from the first cached one; a sliding-window cache
    has dropped older keys, so the numbers are then shifted to make the last query's position
    its `position_ids` (absolute positions: FIRE normalises by the query's position).
    """
    pad = state.padding
    from_2d = pad is not None and pad.shape[-1] >= k_len
    shift = None
    if not from_2d and position_ids is not None:
        shift = position_ids[:, -1:].to(device).long() - (k_len - 1)  # [b or 1, 1]
    key = ("coords", q_len, k_len, causal, str(device), None if from_2d else id(mask),
           None if shift is None else tuple(shift.flatten().tolist()))
    hit = state.memo.get(key)
    if hit is not None and (from_2d or hit[0] is mask):
        return hit[1]
    if from_2d:
        pad = pad.to(device)
        pos = (pad.long().cumsum(-1) - 1).clamp(min=0)
        pad, pos = pad[:, pad.shape[-1] - k_len:], pos[:, pos.shape[-1] - k_len:]
    else:
        pad = _visible_keys(mask)
        pos = None if pad is None else (pad.long().cumsum(-1) - 1).clamp(min=0)
        if shift is not None and bool((shift > 0).any()):  # older keys were dropped
            if pos is None:
                pos = torch.arange(k_len, device=device).expand(shift.shape[0], k_len)
                pad = torch.ones(shift.shape[0], k_len, dtype=torch.bool, device=device)
            pos = pos + (shift - (pos[:, -1:] - (k_len - 1)))
    offset = k_len - q_len
    if pad is None or (bool(pad.all()) and bool((pos == pos[:1]).all())):
        ids = None if pad is None else pos[0]
        coords = Seq1D(q_len, offset=offset, position_ids=ids, causal=causal, device=device)
    else:
        coords = Seq1D(q_len, offset=offset, position_ids=pos, padding_mask=pad, causal=causal)
    state.memo[key] = (mask, coords)  # the mask is kept alive: its id cannot be reused meanwhile
    return coords


def _plain_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor | None, scaling: float | None, dropout: float,
                     causal: bool) -> Tensor:
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    is_causal = causal and attention_mask is None and query.shape[2] > 1
    if is_causal and key.shape[2] != query.shape[2]:  # SDPA's causal mask is top-left aligned
        q_idx = torch.arange(query.shape[2], device=query.device)[:, None] + key.shape[2] - query.shape[2]
        allowed = torch.arange(key.shape[2], device=query.device)[None, :] <= q_idx
        attention_mask = torch.where(allowed, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
        is_causal = False
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                          dropout_p=dropout if module.training else 0.0,
                                          is_causal=is_causal, scale=scaling)


def mmpe_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, scaling: float | None = None,
                           dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """HF `AttentionInterface` function adding the module's mmpe score encodings.

    Called by HF as `fn(module, query [b, n_h, q, d], key [b, n_kv, k, d], value, attention_mask,
    scaling=..., dropout=..., **kwargs)`; returns `(out [b, q, n_h, d], probs | None)`.

    * Positions: a `Sequence` whose queries are the last `q` of the `k` keys (the cache
      offset), with the real tokens of each example numbered from 0 — read from the model call's
      2D `attention_mask` (captured by [`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings]' hook); a static cache's
      unfilled slots are dropped.
    * Mask: HF's `attention_mask` (boolean, True = attend, or additive float), or HF's causal
      mask when it is None.
    * Grouped-query heads: `key`/`value` are repeated to `n_h` heads
      (`module.num_key_value_groups`).
    * Logit scale: HF's `scaling` unless an encoding prescribes its own (DeBERTa,
      Transformer-XL).

    A module without encodings (cross-attention, or a model not prepared by
    [`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings]) gets plain SDPA attention.
    """
    link: _Link | None = getattr(module, "_mmpe_link", None)
    causal = _is_causal(module, kwargs)
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if link is None or (not link.scores and link.kernel is None):
        out = _plain_attention(module, query, key, value, attention_mask, scaling, dropout, causal)
        return out.transpose(1, 2).contiguous(), None

    state = link.state
    b, n_h, q_len, head_dim = query.shape
    k_len = _key_count(state, attention_mask, q_len, key.shape[2], kwargs.get("position_ids"))
    if k_len != key.shape[2]:
        key, value = key[:, :, :k_len], value[:, :, :k_len]
        if attention_mask is not None:
            attention_mask = attention_mask[..., :k_len]
    coords = _coordinates(state, attention_mask, q_len, k_len, causal, query.device,
                          kwargs.get("position_ids"))
    allowed = additive = None
    if attention_mask is None:
        if causal and (q_len > 1 or k_len > q_len):  # by slot: key j ≤ the query's own slot
            slot = torch.arange(q_len, device=query.device)[:, None] + (k_len - q_len)
            allowed = (torch.arange(k_len, device=query.device)[None, :] <= slot)[None, None]
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask
    else:
        additive = attention_mask
    ctx = AttentionContext(coords, n_h, head_dim, b, None, query, key, value)
    scale = next((s for e in link.scores if (s := e.softmax_scale(head_dim)) is not None),
                 scaling if scaling is not None else head_dim ** -0.5)
    math_path = (state.backend == "math" or link.kernel is not None
                 or any(not e.additive or e.needs_probs for e in link.scores))
    p = dropout if module.training else 0.0
    if not math_path:
        bias = _bias(state, link.scores, ctx).to(query.dtype)
        if additive is not None:
            bias = bias + additive
        if allowed is not None:
            bias = bias.masked_fill(~allowed, torch.finfo(query.dtype).min)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=p, scale=scale)
        return out.transpose(1, 2).contiguous(), None

    scores = (query @ key.transpose(-2, -1)).float() * scale
    if link.scores:
        grid = index_grid(coords.batch_size or 1, n_h, q_len, k_len, query.device)
        for enc in link.scores:
            scores = enc.score_mod(ctx)(scores, *grid)
    if additive is not None:
        scores = scores + additive.float()
    v = value.float()
    if link.kernel is not None and not link.kernel.is_softmax:
        probs = None  # a kernel reads masked logits at -inf
        out = link.kernel.attend(scores if allowed is None else scores.masked_fill(~allowed, float("-inf")),
                                 v, ctx)
    else:
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
        probs = F.dropout(scores.softmax(dim=-1), p=p, training=module.training)
        out = probs @ v
    for enc in link.scores:
        if enc.needs_probs:
            term = enc.value_term(probs, ctx)
            if term is not None:
                out = out + term
    out = out.to(query.dtype)
    return out.transpose(1, 2).contiguous(), None if probs is None else probs.to(query.dtype)


def _bias(state: _ModelState, scores: Sequence[ScoreEncoding], ctx: AttentionContext) -> Tensor:
    """The dense bias (the one door, `mmpe.attention.forms.dense_bias`); content-free terms'
    sum is shared by the layers of one forward without gradients (generation), and recomputed
    per layer when training."""
    if torch.is_grad_enabled() or any(not e.content_free for e in scores):
        return dense_bias(scores, ctx)
    key = ("bias", tuple(id(e) for e in scores), ctx.num_heads, id(ctx.coords))
    if key not in state.memo:
        state.memo[key] = dense_bias(scores, ctx)
    return state.memo[key]


def _mask_function() -> Callable[..., Any]:
    from transformers.masking_utils import sdpa_mask

    def mmpe_mask(*args: Any, **kwargs: Any) -> Tensor | None:
        """HF's boolean SDPA mask (True = attend); None where HF would use SDPA's causal flag
        or no mask at all (no padding)."""
        return sdpa_mask(*args, **kwargs)

    return mmpe_mask


def register_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register mmpe's attention and mask functions with HF transformers.

    Register [`mmpe_attention_forward`][mmpe.integrations.transformers.mmpe_attention_forward] and a boolean mask function under `name` with
    `transformers.AttentionInterface` and `AttentionMaskInterface` (idempotent).

    Without a registered mask function HF passes *no* mask to a custom attention function
    (padding would be lost); this registers HF's own boolean SDPA mask for it.
    """
    require("transformers", "mmpe.integrations.transformers")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, mmpe_attention_forward)
    AttentionMaskInterface.register(name, _mask_function())
    return name


def _default_is_attention(module: nn.Module) -> bool:
    name = type(module).__name__
    return (hasattr(module, "scaling") and hasattr(module, "config") and "Cross" not in name
            and not getattr(module, "is_cross_attention", False))


def _probe(encodings: Sequence[Encoding], num_heads: int, head_dim: int, causal: bool) -> None:
    """Evaluate every encoding once on a 3-token sequence: refuse at apply time what the attention
    interface cannot run (coordinates it does not provide, the layer input x)."""
    coords = Seq1D(3, causal=causal)
    q, k, v = (torch.zeros(1, num_heads, 3, head_dim) for _ in range(3))
    ctx = AttentionContext(coords, num_heads, head_dim, 1, None, q, k, v)
    for enc in encodings:
        name = getattr(enc, "registry_name", type(enc).__name__)
        try:
            with torch.no_grad():
                if isinstance(enc, ScoreEncoding):
                    enc.score_mod(ctx)(torch.zeros(1, num_heads, 3, 3), *index_grid(1, num_heads, 3, 3))
                elif isinstance(enc, KernelEncoding):  # PaTH reads x as well
                    scores = torch.zeros(1, num_heads, 3, 3).masked_fill(
                        ~torch.ones(3, 3, dtype=torch.bool).tril(), float("-inf"))
                    enc.attend(scores, v, ctx)
        except (TypeError, ValueError) as err:
            if "layer input x" in str(err) or "layer's x" in str(err):
                raise ValueError(f"apply_score_encodings: {name} reads the layer input x, which HF's "
                                 "attention interface does not pass; it cannot be added this way") from err
            raise type(err)(f"apply_score_encodings: {name} cannot run on the HF model's token "
                            f"sequence ({'causal' if causal else 'bidirectional'}): {err}") from err


def apply_score_encodings(
    model: nn.Module,
    encodings: EncodingSpec | Sequence[EncodingSpec],
    *,
    share_encodings: bool = True,
    drop_rope: bool = False,
    backend: str = "auto",
    is_attention: Callable[[nn.Module], bool] | None = None,
    **options: Any,
) -> nn.Module:
    """Add mmpe score encodings to an HF model through its attention interface (in place).

    Args:
        model: an HF `PreTrainedModel` whose attention modules call
            `ALL_ATTENTION_FUNCTIONS` (Llama, Qwen2, Mistral, BERT … in transformers ≥ 4.48).
        encodings: registry names, config dicts or built score (or kernel) encodings: `alibi`,
            `t5`, `fire`, `kerple_log` … Each is built with the model's `num_heads`,
            `head_dim`, `d_model` and `max_len` (`max_position_embeddings`).
        share_encodings: one set for all layers in `model.mmpe_encodings` (default), or one
            per layer in each attention module's `mmpe_encodings`.
        drop_rope: replace `rotary_emb` by a module that rotates nothing (NoPE + the score
            encodings, e.g. ALiBi alone as in BLOOM/MPT).
        backend: `"auto"` (SDPA with the additive bias; explicit scores for rescaling or
            value-side terms) or `"math"` (always explicit scores; returns the probabilities).
        is_attention: which submodules are self-attention layers; default: modules with
            `scaling` and `config` attributes that are not cross-attention.
        **options: extra build options for every encoding built here.

    Returns:
        `model`, with `config._attn_implementation == "mmpe"`.

    Raises:
        TypeError: a rotary or input encoding (use [`replace_rotary`][mmpe.integrations.transformers.replace_rotary] for RoPE); an encoding
            whose coordinates needs a token sequence cannot meet (`swin`, `graphormer`);
            a model that is not an HF transformers model.
        ValueError: a model already prepared, no attention module found, an encoding that reads
            the layer input (FoX), more than one kernel encoding, an unknown `backend`.
    """
    if backend not in ("auto", "math"):
        raise ValueError(f"apply_score_encodings: backend must be 'auto' or 'math', got {backend!r}")
    if hasattr(model, "_mmpe_state"):
        raise ValueError("apply_score_encodings: this model already has mmpe encodings")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise TypeError(f"apply_score_encodings: model must be an HF transformers model (with a "
                        f"config giving num_attention_heads), got {type(model).__name__}")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    context = {"d_model": config.hidden_size, "num_heads": num_heads, "head_dim": head_dim}
    if isinstance(getattr(config, "max_position_embeddings", None), int):
        context["max_len"] = config.max_position_embeddings
    specs = [encodings] if isinstance(encodings, str | Mapping | Encoding) else list(encodings)

    def make(spec: EncodingSpec) -> Encoding:
        if isinstance(spec, Encoding):
            return spec
        if options:
            spec = {"name": spec, **options} if isinstance(spec, str) else {**spec, **options}
        return build(spec, context=context)

    check = is_attention or _default_is_attention
    modules = [m for m in model.modules() if check(m)]
    if not modules:
        raise ValueError(f"apply_score_encodings: found no attention module in {type(model).__name__}")
    causal = any(getattr(m, "is_causal", False) for m in modules) and getattr(config, "is_causal", True) is not False
    if not share_encodings and any(isinstance(s, Encoding) for s in specs):
        raise ValueError("apply_score_encodings: share_encodings=False needs names or configs")
    per_layer = [[make(s) for s in specs]] if share_encodings else [[make(s) for s in specs] for _ in modules]
    for encs in per_layer[:1]:
        for enc in encs:
            if not isinstance(enc, (ScoreEncoding, KernelEncoding)):
                raise TypeError(f"apply_score_encodings: {type(enc).__name__} is not a score or kernel "
                                "encoding (RoPE variants: replace_rotary; input encodings belong to "
                                "the embeddings)")
        if sum(isinstance(e, KernelEncoding) for e in encs) > 1:
            raise ValueError("apply_score_encodings: at most one kernel encoding")
        _probe(encs, num_heads, head_dim, causal)

    state = _ModelState(backend)
    if share_encodings:
        model.mmpe_encodings = nn.ModuleList(per_layer[0])
    for i, module in enumerate(modules):
        encs = per_layer[0] if share_encodings else per_layer[i]
        if not share_encodings:
            module.mmpe_encodings = nn.ModuleList(encs)
        scores = [e for e in encs if isinstance(e, ScoreEncoding)]
        kernel = next((e for e in encs if isinstance(e, KernelEncoding)), None)
        object.__setattr__(module, "_mmpe_link", _Link(state, scores, kernel))
    object.__setattr__(model, "_mmpe_state", state)
    hooked = [model]
    base = getattr(model, "base_model", model)
    if base is not model:
        hooked.append(base)
    for m in hooked:
        params = list(inspect.signature(m.forward).parameters)
        index = params.index("attention_mask") if "attention_mask" in params else None
        m.register_forward_pre_hook(_Capture(state, index), with_kwargs=True)
    if drop_rope:
        rotary_dim = int(head_dim * (getattr(config, "partial_rotary_factor", None) or 1.0))
        for parent, name, _ in _rotary_modules(model):
            setattr(parent, name, _NoRotary(rotary_dim))
    name = register_attention()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - very old transformers
        config._attn_implementation = name
    return model
