"""Model-wide context: the values a model hands to every encoding it builds by name.

A model (`mmpe.Transformer`, a recipe) knows things every encoding may need — its width, its
heads, the length or grid it trains on. It passes them once as `build(name, context={...})`;
each encoding declares in `register(..., context=(...))` which of these keys it takes, and
receives only those (an option given explicitly wins). Every key has one meaning:

| key | meaning |
| --- | --- |
| `d_model` | model width (channels of the token embeddings) |
| `num_heads` | attention heads `n_h` |
| `head_dim` | channels per head `h_d` |
| `max_len` | positions a learned table holds (tokens): the table size |
| `original_max_position_embeddings` | the context length the model is trained at (tokens); HF's name; RoPE scalings extend from it |
| `grid_shape` | the training grid, cells per axis (tuple of ints) |
| `prefix_tokens` | coordinate-free tokens before the grid (cls, registers) |
| `num_axes` | axes of the positions (2 for images, 3 for video) |
| `distance_unit` | the distance one step of a bucketed/linear bias spans, in the coordinates' unit (e.g. `radians(1°)` on the sphere) |

An unknown key, or a value of the wrong type or range, raises before anything is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTEXT_KEYS", "ContextKey", "validate_context_keys", "coords_context"]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive_float(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(map(_positive_int, value))


@dataclass(frozen=True)
class ContextKey:
    """One model-wide value: its name, meaning, and what a valid value is."""

    name: str
    meaning: str
    expected: str
    valid: Callable[[Any], bool]


CONTEXT_KEYS: dict[str, ContextKey] = {k.name: k for k in (
    ContextKey("d_model", "model width", "an int >= 1", _positive_int),
    ContextKey("num_heads", "attention heads n_h", "an int >= 1", _positive_int),
    ContextKey("head_dim", "channels per head h_d", "an int >= 1", _positive_int),
    ContextKey("max_len", "positions a learned table holds (tokens)", "an int >= 1",
               _positive_int),
    ContextKey("original_max_position_embeddings",
               "the context length the model trains at (tokens; RoPE scalings extend from it)",
               "an int >= 1", _positive_int),
    ContextKey("grid_shape", "the training grid (cells per axis)",
               "a non-empty tuple of ints >= 1", _shape),
    ContextKey("prefix_tokens", "coordinate-free tokens before the grid", "an int >= 0",
               _non_negative_int),
    ContextKey("num_axes", "axes of the positions", "an int >= 1", _positive_int),
    ContextKey("distance_unit", "distance one bias step spans (coordinates' unit)",
               "a finite float > 0", _positive_float),
)}


def validate_context_keys(context: Mapping[str, Any] | None, where: str = "context") -> dict[str, Any]:
    """Validate `context`: every key declared in `CONTEXT_KEYS`, every value valid.

    Returns a plain dict (`grid_shape` as a tuple).

    Raises:
        TypeError: `context` is not a mapping.
        ValueError: an unknown key (the message lists the known ones) or an invalid value.
    """
    if context is None:
        return {}
    if not isinstance(context, Mapping):
        raise TypeError(f"{where} must be a mapping of context keys, got {type(context).__name__}")
    out: dict[str, Any] = {}
    for key, value in context.items():
        spec = CONTEXT_KEYS.get(key)
        if spec is None:
            raise ValueError(f"{where}: unknown context key {key!r}; context keys are "
                             f"{sorted(CONTEXT_KEYS)} (pass encoding options in the spec instead)")
        if not spec.valid(value):
            raise ValueError(f"{where}: {key} ({spec.meaning}) must be {spec.expected}, "
                             f"got {value!r}")
        out[key] = tuple(value) if key == "grid_shape" else value
    return out


def coords_context(coords: Any) -> dict[str, Any]:
    """The context keys a coordinates object answers.

    The context keys a coordinates object answers: `num_axes` (`Positioned`),
    `grid_shape` and `prefix_tokens` (`GridLayout`); others are absent."""
    from mmpe.coords.capabilities import GridLayout, Positioned

    out: dict[str, Any] = {}
    if isinstance(coords, Positioned):
        out["num_axes"] = coords.num_axes
    if isinstance(coords, GridLayout):
        out["grid_shape"] = tuple(coords.shape)
        out["prefix_tokens"] = coords.prefix_tokens
    return out
