"""Per-layer position schedules: which encodings and which attention window each layer uses.

Several recent decoders do not use one positional scheme in every layer:

| preset | layers | source |
| --- | --- | --- |
| `"llama4"` | iRoPE: every 4th layer NoPE with attention-temperature tuning, the others interleaved RoPE (base 500 000) with chunked local attention (8192 tokens) | HF `Llama4TextConfig`: `no_rope_layers`, `attention_chunk_size`, `attn_temperature_tuning`, `floor_scale`, `attn_scale` |
| `"gemma3"` | 5 sliding-window layers (window 4096, RoPE base 10 000) then 1 global layer (RoPE base 1 000 000) | HF `Gemma3TextConfig`: `layer_types` / `sliding_window_pattern = 6`, `rope_parameters` per layer type |
| `"gemma2"` | alternating sliding-window (4096) and global layers, RoPE base 10 000 in both | HF `Gemma2Config.layer_types` |
| `"cohere2"` | 3 sliding-window layers (4096) with interleaved RoPE, then 1 global layer without positions (NoPE) | HF `Cohere2Config`: `sliding_window_pattern = 4`; RoPE only where `sliding_window` is set |
| `"smollm3"` | every 4th layer NoPE, the others RoPE (base 2 000 000) | HF `SmolLM3Config.no_rope_layers` |

"Every k-th layer" follows HF: layer `i` (0-based) is the k-th when `(i + 1) % k == 0`, so
with `k = 4` layers 3, 7, 11 … are NoPE.

A schedule is given once to [`Transformer`][mmpe.transformer.Transformer] (or `CausalLM`) as
`layer_schedule=`:

* a preset name, `"gemma3"`, or a preset with options, `{"preset": "gemma3", "sliding_window":
  512}` (the keyword arguments of the preset functions below);
* a pattern, `{"every": 4, "then": {...}, "otherwise": {...}}` (layer specs as dicts);
* a list with one layer spec (a [`LayerSpec`][mmpe.schedule.LayerSpec] or its dict) per layer;
* a [`LayerSchedule`][mmpe.schedule.LayerSchedule].

A layer spec holds `encodings` (the layer's rotary/score/kernel encodings, names or config
dicts; absent or None: the model's `encodings`; `[]`: none, NoPE), `window` (a causal sliding
window of that many tokens) or `chunk` (chunked attention, chunks of that many tokens), and
`temperature` (`{"floor_scale": ..., "attn_scale": ...}`: Llama 4's query temperature, see
[`AttentionTemperature`][mmpe.schedule.AttentionTemperature]). The schedule is saved in the
model's `state_dict` (`layer_schedule.settings.config`, its JSON) and checked on load; each
windowed layer also saves its window (`blocks.<i>.attn.window.settings.kind`/`size`).
[`LayerSchedule.from_state_dict`][mmpe.schedule.LayerSchedule.from_state_dict] reads it back,
[`layer_schedule_from_hf`][mmpe.integrations.transformers.layer_schedule_from_hf] reads an HF config's
`layer_types`, `no_rope_layers`, windows and RoPE bases (each preset equals its HF config's
defaults read this way), and `mmpe show gemma3 --depth 12` prints a preset layer by layer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._state import SETTINGS_PREFIX, SavesSettings, decode_setting
from mmpe.encodings.base import RotaryEncoding

__all__ = ["PRESETS", "AttentionTemperature", "LayerSchedule", "LayerSpec", "cohere2", "gemma2",
           "gemma3", "llama4", "smollm3"]

_SPEC_KEYS = ("encodings", "window", "chunk", "temperature")


class AttentionTemperature(SavesSettings, RotaryEncoding):
    """Llama 4's attention-temperature tuning of the queries of its NoPE layers.

    The query of the token at position `p` (tokens) is multiplied by
    `s(p) = 1 + attn_scale · log(1 + ⌊(p + 1) / floor_scale⌋)`, so the logits of long-range
    NoPE layers sharpen slowly with position (Nakanishi 2025, Scalable-Softmax,
    arXiv:2501.19399; HF `Llama4TextAttention`, `attn_temperature_tuning`). `s(p) = 1` for
    `p + 1 < floor_scale`. Keys are untouched. It sits at the rotary hook (a per-position
    transform of `q`) of the layers a schedule gives it to; it is not a registry encoding.

    Args:
        floor_scale: tokens per temperature step (HF `floor_scale`, 8192), `> 0`.
        attn_scale: slope of the logarithm (HF `attn_scale`, 0.1), finite.

    Shapes: `forward(q [b, n_h, n_q, h_d], k, coords) -> (q · s(p_q), k)`, `s` formed in
    float32 and the product cast back to `q`'s dtype (as HF does); positions are the
    coordinates' query positions (with a cache, `offset + i`). HF counts
    `arange(s) + past_seen_tokens`, the same numbers except in a left-padded batch, where
    mmpe counts from each example's first real token (HF counts the pads too).

    Raises:
        ValueError: `floor_scale <= 0` or not finite, `attn_scale` not finite; `q` not rank 4
            with `n_q` equal to the coordinates' queries.
        TypeError: coordinates without one position per token (`Positioned1D`).
    """

    needs = (Positioned1D,)
    saved_settings = ("floor_scale", "attn_scale")

    def __init__(self, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> None:
        super().__init__()
        for name, value in (("floor_scale", floor_scale), ("attn_scale", attn_scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"AttentionTemperature: {name} must be a finite number, got {value!r}")
        if floor_scale <= 0:
            raise ValueError(f"AttentionTemperature: floor_scale must be > 0 (tokens), got {floor_scale!r}")
        self.floor_scale, self.attn_scale = float(floor_scale), float(attn_scale)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale:g}, attn_scale={self.attn_scale:g}"

    def scales(self, positions: Tensor) -> Tensor:
        """`s(p)` (float32) of integer or float positions `p`, any shape."""
        p = positions.to(torch.float32)
        return torch.log1p(torch.floor((p + 1.0) / self.floor_scale)) * self.attn_scale + 1.0

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        if q.dim() != 4 or q.shape[2] != coords.num_queries:
            raise ValueError(f"AttentionTemperature: q must be [b, n_h, {coords.num_queries}, h_d], "
                             f"got {tuple(q.shape)}")
        pos = coords.query_positions[..., 0]  # type: ignore[attr-defined]
        s = self.scales(pos).to(q.device)
        s = s[:, None, :, None] if s.dim() == 2 else s[None, None, :, None]
        return (q * s).to(q.dtype), k


def _check_size(owner: str, name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be an int >= 1 (tokens) or None, got {value!r}")
    return value


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a schedule.

    Args:
        encodings: the layer's attention encodings (registry names or config dicts, e.g.
            `{"name": "rope", "base": 1e6}`; `head_dim` and other context keys come from the
            model); None: the model's `encodings`; `()`: none (NoPE).
        window: causal sliding window (tokens; the query sees itself and the `window − 1`
            keys before it), or None.
        chunk: chunked local attention (tokens per chunk), or None. Not with `window`.
        temperature: `{"floor_scale": f, "attn_scale": a}` for
            [`AttentionTemperature`][mmpe.schedule.AttentionTemperature], or None.

    Raises:
        ValueError: a `window`/`chunk` that is not an int >= 1, both given, encodings that are
            not names or JSON-serialisable config dicts with a `"name"`, a `temperature`
            dict with other keys.
    """

    encodings: tuple[str | Mapping[str, Any], ...] | None = None
    window: int | None = None
    chunk: int | None = None
    temperature: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        _check_size("LayerSpec", "window", self.window)
        _check_size("LayerSpec", "chunk", self.chunk)
        if self.window is not None and self.chunk is not None:
            raise ValueError(f"LayerSpec: give window or chunk, not both (got window={self.window}, "
                             f"chunk={self.chunk}): a layer has one local window")
        if self.encodings is not None:
            if isinstance(self.encodings, (str, Mapping)) or not isinstance(self.encodings, Seq):
                raise ValueError(f"LayerSpec: encodings must be a list of names or config dicts "
                                 f"(or None for the model's), got {self.encodings!r}")
            for spec in self.encodings:
                if isinstance(spec, Mapping):
                    if not isinstance(spec.get("name"), str):
                        raise ValueError(f"LayerSpec: a config dict needs a 'name', got {dict(spec)!r}")
                    try:
                        json.dumps(dict(spec))
                    except (TypeError, ValueError) as err:
                        raise ValueError(f"LayerSpec: encoding config {dict(spec)!r} is not "
                                         f"JSON-serialisable ({err}); the schedule is saved as JSON") from None
                elif not isinstance(spec, str):
                    raise ValueError(f"LayerSpec: encodings must be registry names or config dicts "
                                     f"(a schedule is saved as JSON), got a {type(spec).__name__}")
            object.__setattr__(self, "encodings",
                               tuple(dict(e) if isinstance(e, Mapping) else e for e in self.encodings))
        if self.temperature is not None:
            if not isinstance(self.temperature, Mapping) or \
                    set(self.temperature) - {"floor_scale", "attn_scale"}:
                raise ValueError("LayerSpec: temperature must be a dict with keys 'floor_scale' "
                                 f"and/or 'attn_scale', got {self.temperature!r}")
            AttentionTemperature(**self.temperature)  # the value errors, now
            object.__setattr__(self, "temperature", dict(self.temperature))

    @classmethod
    def parse(cls, spec: LayerSpec | Mapping[str, Any]) -> LayerSpec:
        """A `LayerSpec` from itself or its dict.

        A `LayerSpec` from itself or its dict (keys `encodings`, `window`, `chunk`,
        `temperature`).

        Raises:
            ValueError: another type, or unknown keys (naming them).
        """
        if isinstance(spec, LayerSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"layer_schedule: a layer spec must be a LayerSpec or a dict with keys "
                             f"{_SPEC_KEYS}, got {type(spec).__name__} {spec!r}")
        unknown = set(spec) - set(_SPEC_KEYS)
        if unknown:
            raise ValueError(f"layer_schedule: unknown layer spec keys {sorted(unknown)}; "
                             f"expected some of {_SPEC_KEYS}")
        enc = spec.get("encodings")
        return cls(encodings=None if enc is None else tuple(enc) if isinstance(enc, (list, tuple)) else enc,
                   window=spec.get("window"), chunk=spec.get("chunk"),
                   temperature=spec.get("temperature"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict of the spec (keys with None left out)."""
        out: dict[str, Any] = {}
        if self.encodings is not None:
            out["encodings"] = [dict(e) if isinstance(e, Mapping) else e for e in self.encodings]
        for key in ("window", "chunk"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.temperature is not None:
            out["temperature"] = dict(self.temperature)
        return out

    def describe(self) -> str:
        """One line: encodings, window and temperature."""
        if self.encodings is None:
            enc = "model encodings"
        elif not self.encodings:
            enc = "NoPE"
        else:
            enc = " + ".join(e if isinstance(e, str) else
                             e["name"] + "(" + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                         for k, v in e.items() if k != "name") + ")"
                             for e in self.encodings)
        parts = [enc]
        parts.append(f"sliding window {self.window}" if self.window is not None else
                     f"chunks of {self.chunk}" if self.chunk is not None else "global")
        if self.temperature is not None:
            parts.append("temperature(" + ", ".join(f"{k}={v:g}" for k, v in self.temperature.items()) + ")")
        return ", ".join(parts)


class LayerSchedule(SavesSettings):
    """The layer specs of a model, one per layer (see the module docstring).

    Build one with [`parse`][mmpe.schedule.LayerSchedule.parse] (any `layer_schedule=` form),
    [`pattern`][mmpe.schedule.LayerSchedule.pattern] or a preset function. As a module of the
    model it writes its JSON into the `state_dict` (`settings.config`), so loading a
    checkpoint into a model with another schedule is a `RuntimeError` naming both.

    Args:
        layers: one [`LayerSpec`][mmpe.schedule.LayerSpec] (or its dict) per layer.
        name: the preset it came from, for display (not saved).

    Raises:
        ValueError: no layers, or a layer spec that does not parse.
    """

    saved_settings = ("config",)

    def __init__(self, layers: Seq[LayerSpec | Mapping[str, Any]], name: str | None = None) -> None:
        super().__init__()
        if isinstance(layers, (str, Mapping)) or not isinstance(layers, Seq) or not layers:
            raise ValueError(f"LayerSchedule: layers must be a non-empty list of layer specs, got {layers!r}")
        self.layers = tuple(LayerSpec.parse(s) for s in layers)
        self.name = name

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerSpec:
        return self.layers[i]

    def __iter__(self):  # type: ignore[override]
        return iter(self.layers)

    @property
    def config(self) -> str:
        """The schedule as JSON: a list of layer-spec dicts (what the `state_dict` holds)."""
        return json.dumps(self.to_config(), sort_keys=True)

    def to_config(self) -> list[dict[str, Any]]:
        """A JSON-able list with one layer-spec dict per layer; `parse` reads it back."""
        return [spec.to_dict() for spec in self.layers]

    def extra_repr(self) -> str:
        return f"{len(self.layers)} layers" + (f", preset={self.name!r}" if self.name else "")

    @classmethod
    def pattern(cls, depth: int, every: int, then: LayerSpec | Mapping[str, Any],
                otherwise: LayerSpec | Mapping[str, Any] | None = None,
                name: str | None = None) -> LayerSchedule:
        """A schedule that gives every `every`-th layer `then`, the others `otherwise`.

        Layer `i` gets `then` when `(i + 1) % every == 0` (every `every`-th layer, HF's
        convention), else `otherwise` (default: the model's encodings, global attention).

        Raises:
            ValueError: `depth` or `every` not an int >= 1.
        """
        for arg, value in (("depth", depth), ("every", every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"layer_schedule: {arg} must be an int >= 1, got {value!r}")
        a, b = LayerSpec.parse(then), LayerSpec.parse({} if otherwise is None else otherwise)
        return cls([a if (i + 1) % every == 0 else b for i in range(depth)], name=name)

    @classmethod
    def parse(cls, schedule: Any, depth: int) -> LayerSchedule:
        """A schedule of `depth` layers from any form `Transformer(layer_schedule=...)` takes.

        Raises:
            ValueError: an unknown preset (naming the presets), a list whose length is not
                `depth`, a pattern dict with other keys than `every`, `then`, `otherwise`,
                or a layer spec that does not parse.
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"layer_schedule: depth must be an int >= 1, got {depth!r}")
        if isinstance(schedule, str):
            schedule = {"preset": schedule}
        if isinstance(schedule, LayerSchedule):
            out = schedule
        elif isinstance(schedule, Mapping) and "preset" in schedule:
            options = {k: v for k, v in schedule.items() if k != "preset"}
            name = schedule["preset"]
            if name not in PRESETS:
                raise ValueError(f"layer_schedule: unknown preset {name!r}; presets: {sorted(PRESETS)}")
            try:
                out = PRESETS[name](depth, **options)
            except TypeError as err:
                raise ValueError(f"layer_schedule: preset {name!r}: {err}") from None
        elif isinstance(schedule, Mapping):
            unknown = set(schedule) - {"every", "then", "otherwise"}
            if unknown or "every" not in schedule or "then" not in schedule:
                raise ValueError("layer_schedule: a dict is a preset ({'preset': name, **options}) "
                                 "or a pattern ({'every': k, 'then': spec, 'otherwise': spec}); "
                                 f"got keys {sorted(schedule)}")
            out = cls.pattern(depth, schedule["every"], schedule["then"], schedule.get("otherwise"))
        elif isinstance(schedule, Seq) and not isinstance(schedule, (bytes, bytearray)):
            out = cls(schedule)
        else:
            raise ValueError("layer_schedule must be a preset name, a preset or pattern dict, a "
                             f"list of layer specs or a LayerSchedule, got {type(schedule).__name__}")
        if len(out) != depth:
            raise ValueError(f"layer_schedule: {len(out)} layer specs for depth={depth}; give one "
                             "per layer")
        return out

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], prefix: str | None = None) -> LayerSchedule | None:
        """The schedule saved in a model's `state_dict`, or None.

        The schedule saved in a model's `state_dict` (`<prefix>layer_schedule.settings.config`;
        the first such key when `prefix` is None), or None when it holds none.

        Raises:
            ValueError: the saved config is not a schedule's JSON (a corrupted or foreign
                entry), naming the key.
        """
        suffix = "layer_schedule." + SETTINGS_PREFIX + "config"
        keys = [k for k in state if k.endswith(suffix) and (prefix is None or k == prefix + suffix)]
        if not keys:
            return None
        try:
            config = json.loads(decode_setting(state[keys[0]]))
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise ValueError(f"LayerSchedule.from_state_dict: {keys[0]} does not hold a layer "
                             f"schedule's JSON config ({err})") from None
        return cls(config)

    def describe(self) -> str:
        """A table, one line per layer."""
        head = f"layer schedule{f' {self.name!r}' if self.name else ''}: {len(self.layers)} layers"
        width = len(str(len(self.layers) - 1))
        return "\n".join([head] + [f"  layer {i:>{width}}: {s.describe()}" for i, s in enumerate(self.layers)])


# ------------------------------------------------------------------------------- presets
def rope_spec(base: float, interleaved: bool = False) -> dict[str, Any]:
    """The layer-spec dict of plain RoPE at `base`.

    The layer-spec dict of plain RoPE at `base` (adjacent channel pairs if `interleaved`),
    as the presets and `layer_schedule_from_hf` write it."""
    spec: dict[str, Any] = {"name": "rope", "base": float(base)}
    if interleaved:
        spec["interleaved"] = True
    return spec


def llama4(depth: int, *, chunk_size: int | None = 8192, rope_base: float = 500000.0,
           nope_every: int = 4, temperature: bool = True, floor_scale: float = 8192.0,
           attn_scale: float = 0.1) -> LayerSchedule:
    """Llama 4's iRoPE layer schedule.

    Llama 4's iRoPE (HF `Llama4TextConfig` defaults): every `nope_every`-th layer NoPE
    with global attention and (`temperature`) [`AttentionTemperature`][mmpe.schedule.AttentionTemperature]
    `(floor_scale, attn_scale)`; the other layers RoPE with interleaved channel pairs (HF
    Llama 4 rotates complex pairs `(2i, 2i+1)`), base `rope_base`, and chunked attention of
    `chunk_size` tokens (None: global)."""
    rope = LayerSpec(encodings=(rope_spec(rope_base, interleaved=True),), chunk=chunk_size)
    nope = LayerSpec(encodings=(), temperature={"floor_scale": float(floor_scale),
                                                "attn_scale": float(attn_scale)} if temperature else None)
    return LayerSchedule.pattern(depth, nope_every, nope, rope, name="llama4")


def gemma3(depth: int, *, sliding_window: int = 4096, local_base: float = 10000.0,
           global_base: float = 1000000.0, pattern: int = 6) -> LayerSchedule:
    """Gemma 3's layer schedule.

    Gemma 3 (HF `Gemma3TextConfig`): `pattern − 1` sliding-window layers (`sliding_window`
    tokens, RoPE base `local_base`) then one global layer (RoPE base `global_base`)."""
    local = LayerSpec(encodings=(rope_spec(local_base),), window=sliding_window)
    return LayerSchedule.pattern(depth, pattern, LayerSpec(encodings=(rope_spec(global_base),)), local,
                                 name="gemma3")


def gemma2(depth: int, *, sliding_window: int = 4096, base: float = 10000.0,
           pattern: int = 2) -> LayerSchedule:
    """Gemma 2's layer schedule.

    Gemma 2 (HF `Gemma2Config.layer_types`): sliding-window and global layers alternate
    (the first sliding), one RoPE base."""
    local = LayerSpec(encodings=(rope_spec(base),), window=sliding_window)
    return LayerSchedule.pattern(depth, pattern, LayerSpec(encodings=(rope_spec(base),)), local,
                                 name="gemma2")


def cohere2(depth: int, *, sliding_window: int = 4096, base: float = 10000.0,
            pattern: int = 4) -> LayerSchedule:
    """Cohere 2's (Command R7B's) layer schedule.

    Cohere 2 / Command R7B (HF `Cohere2Config`): `pattern − 1` sliding-window layers with
    interleaved RoPE (HF Cohere repeats each frequency on adjacent channels), then one global
    layer with no positional encoding."""
    local = LayerSpec(encodings=(rope_spec(base, interleaved=True),), window=sliding_window)
    return LayerSchedule.pattern(depth, pattern, LayerSpec(encodings=()), local, name="cohere2")


def smollm3(depth: int, *, base: float = 2000000.0, nope_every: int = 4) -> LayerSchedule:
    """SmolLM3's layer schedule.

    SmolLM3 (HF `SmolLM3Config.no_rope_layers`): every `nope_every`-th layer NoPE, the
    others RoPE of base `base`; global attention everywhere."""
    return LayerSchedule.pattern(depth, nope_every, LayerSpec(encodings=()),
                                 LayerSpec(encodings=(rope_spec(base),)), name="smollm3")


#: Preset name → function `(depth, **options) -> LayerSchedule`.
PRESETS: dict[str, Callable[..., LayerSchedule]] = {
    "llama4": llama4, "gemma3": gemma3, "gemma2": gemma2, "cohere2": cohere2, "smollm3": smollm3,
}
