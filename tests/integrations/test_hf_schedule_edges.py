"""`layer_schedule_from_hf` on configs HF would read otherwise: layer types it does not know,
lengths that disagree with the depth, missing windows, temperature tuning's defaults, and
`partial_rotary_factor`, which HF's default rotary module reads for some model types only."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from mmpe.integrations.transformers import (
    HONORS_PARTIAL_ROTARY,
    from_hf_rope,
    layer_schedule_from_hf,
)

BASE = {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


@pytest.mark.parametrize(("extra", "names"), [
    ({"layer_types": ["full_attention", "linear_attention", "full_attention"]},
     "layer_types\\[1\\] = 'linear_attention'"),
    ({"layer_types": ["full_attention", "full_attention"]}, "layer_types has 2 entries"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries"),
    ({"layer_types": ["sliding_attention"] * 3}, "sliding_window"),
    ({"layer_types": ["chunked_attention"] * 3}, "attention_chunk_size"),
    ({"no_rope_layers": [1, 0, 1], "attn_temperature_tuning": True}, "floor_scale"),
    ({"no_rope_layers": [1, 0, 1], "attn_temperature_tuning": True, "floor_scale": 8192},
     "attn_scale"),
], ids=["unknown-type", "short-types", "short-no-rope", "no-window", "no-chunk",
        "no-floor-scale", "no-attn-scale"])
def test_configs_hf_reads_otherwise_are_refused(extra: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        layer_schedule_from_hf({**BASE, **extra})


def test_llama4_temperature_tuning_takes_hf_defaults() -> None:
    config = {**BASE, "model_type": "llama4_text", "no_rope_layers": [1, 0, 1]}
    schedule = layer_schedule_from_hf(config)
    assert schedule.layers[1].temperature == {"floor_scale": 8192.0, "attn_scale": 0.1}
    assert schedule.layers[0].temperature is None
    off = layer_schedule_from_hf({**config, "attn_temperature_tuning": False})
    assert off.layers[1].temperature is None


def _hf_modeling_modules():
    pytest.importorskip("transformers")
    root = importlib.import_module("transformers.models")
    for info in pkgutil.iter_modules(root.__path__):
        spec = importlib.util.find_spec(f"transformers.models.{info.name}.modeling_{info.name}")
        if spec is not None and spec.origin:
            yield info.name, spec.origin


def _default_reads_partial(source: str) -> bool:
    start = source.find("def compute_default_rope_parameters")
    if start < 0:
        return False
    end = source.find("return inv_freq", start)
    return "partial_rotary_factor" in source[start:end]


def test_the_partial_rotary_set_is_the_installed_transformers() -> None:
    """Read from HF's own sources: which installed models' default rotary modules read the
    factor (written against transformers 5.24; older releases are not judged)."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.24"):
        pytest.skip(f"HONORS_PARTIAL_ROTARY is read from transformers 5.24; this is "
                    f"{transformers.__version__}")
    modules = dict(_hf_modeling_modules())
    reads = {name for name, path in modules.items()
             if _default_reads_partial(open(path, encoding="utf-8").read())}
    assert reads, "no HF modeling module found"
    wrong = {name for name in modules if (name in reads) != (name in HONORS_PARTIAL_ROTARY)}
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("model_type", ["llama4_text", "gemma3_text", "gemma2", "cohere2",
                                        "smollm3", "llama", "phi3", "gpt_neox", "stablelm"])
def test_partial_rotary_factor_as_hf_applies_it(model_type: str) -> None:
    """The rotated channels equal those of HF's own rotary module for the same config."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    kw = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, head_dim=16,
              num_key_value_heads=4, rope_parameters=rope, partial_rotary_factor=0.5)
    config = transformers.AutoConfig.for_model(model_type, **kw)
    module = importlib.import_module(transformers.models.auto.modeling_auto.__name__)
    model_cls = module.MODEL_MAPPING[type(config)]
    modeling = importlib.import_module(model_cls.__module__)
    rotary_cls = next(c for n, c in inspect.getmembers(modeling, inspect.isclass)
                      if n.endswith("RotaryEmbedding") and c.__module__ == modeling.__name__)
    rotary = rotary_cls(config=config)
    sizes = {2 * b.numel() for n, b in rotary.named_buffers()
             if n.endswith("inv_freq") and "original" not in n}  # Gemma 3: one per layer type
    assert len(sizes) == 1, sizes
    (hf_dim,) = sizes
    schedule = layer_schedule_from_hf(config)
    specs = [layer.encodings[0] for layer in schedule.layers if layer.encodings]
    assert specs, "no RoPE layer"
    ours = {spec.get("rotary_dim", config.head_dim) if isinstance(spec, dict) else spec
            for spec in specs}
    assert ours == {hf_dim}, (model_type, ours, hf_dim)
    nested = isinstance(config.rope_parameters.get("full_attention"), dict)  # Gemma 3
    layer_type = "full_attention" if nested else None
    assert from_hf_rope(config, layer_type=layer_type).rotary_dim == hf_dim  # standalone too
