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

The package, one idea per file:

| file | what |
| --- | --- |
| `rope_config.py` | RoPE conversion: HF rope configs to mmpe encodings and back, HF configs to layer schedules |
| `rotary_swap.py` | the rotary swap: `HFRotary`, `replace_rotary` and the rotate-nothing module of `drop_rope` |
| `attention.py` | the attention interface: `apply_score_encodings`, the registered attention function, HF's masks and caches read into coordinates |
"""

from __future__ import annotations

from mmpe.integrations.transformers.attention import (
    ATTN_IMPLEMENTATION,
    apply_score_encodings,
    mmpe_attention_forward,
    register_attention,
)
from mmpe.integrations.transformers.attention import EncodingSpec as EncodingSpec
from mmpe.integrations.transformers.rope_config import (
    HONORS_PARTIAL_ROTARY as HONORS_PARTIAL_ROTARY,
)
from mmpe.integrations.transformers.rope_config import (
    ROPE_TYPES,
    from_hf_rope,
    layer_schedule_from_hf,
    to_hf_rope,
)
from mmpe.integrations.transformers.rotary_swap import HFRotary, replace_rotary

# EncodingSpec and HONORS_PARTIAL_ROTARY import from here as before, outside `__all__` (and the
# API page) as before
__all__ = ["ATTN_IMPLEMENTATION", "HFRotary", "ROPE_TYPES", "apply_score_encodings", "from_hf_rope",
           "layer_schedule_from_hf", "mmpe_attention_forward", "register_attention", "replace_rotary",
           "to_hf_rope"]
