"""The newest public APIs on malformed, extreme and valid-but-unusual input.

Each case states what a user must get — a clear error naming the argument (`clear`), the right
answer (`right`) or a warning about an implausible value (`warned`) — and the run classifies
what happened: `clear`, `right`, `warned`, `internal` (another exception, or an error that
does not name the argument) or `silent` (no error or warning where one was due). Only the
stated outcome passes. The terminal summary prints the counts per class and per API
(`OUTCOMES`), and `test_every_listed_api_has_cases` fails for an API in `APIS` without
cases, so a new API shows up as a gap. The older suites are tests/package/test_bad_input.py
and tests/package/test_misuse_edges.py.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import mmpe
from mmpe.coords.randomized import randomized_positions
from mmpe.coords.spacetime import TimeLine
from mmpe.schedule import LayerSchedule

#: the APIs this suite drives (each needs at least one case)
APIS = ("Grid", "PackedGrids", "Points", "Sphere", "Cross", "KVCache", "randomized_positions",
        "record_attention", "abacus", "videorope", "MMPE_ATTN_BLOCK_BYTES", "attention device",
        "LayerSchedule.from_state_dict", "layer_schedule_from_hf", "spe", "LayerSpec",
        "Numbers", "PerImage", "TransformerBlock", "TimeLine", "V2PESequence",
        "VideoRoPEComposite", "index_grid", "register_cross_distance", "register_cross_positions",
        "qwen2_5_vl_composite", "v2pe_position_ids", "LayerSchedule")

#: public names of `mmpe` and `mmpe.coords` no bad-input suite drives, and why
NO_INPUT = {
    "CONTEXT_KEYS": "a constant",
    "Coordinates": "the base class (subclassed, not called with data)",
    "Directed": "a capability protocol (isinstance checks only)",
    "GraphLayout": "a capability protocol",
    "GridLayout": "a capability protocol",
    "FeatureGraph": "a capability protocol",
    "LatLonOnly": "a class never instantiated (capability checks read its members)",
}

OUTCOMES: Counter = Counter()  # (api, outcome), read by conftest's terminal summary


def clear(api, label, fn, *names):
    return pytest.param(api, fn, ("clear", names), id=f"{api}: {label}")


def right(api, label, fn, check):
    return pytest.param(api, fn, ("right", check), id=f"{api}: {label}")


def warned(api, label, fn, pattern):
    return pytest.param(api, fn, ("warned", pattern), id=f"{api}: {label}")


def _attn(x, coords, **kw):
    return mmpe.MultiHeadAttention(32, 4, **kw)(x, coords)


def _record_too_large():
    from mmpe import validation

    real = validation.available_memory
    validation.available_memory = lambda: 16 << 20  # a machine with 16 MiB free
    try:
        with mmpe.attention.record_attention():
            _attn(torch.randn(1, 1024, 32), mmpe.Sequence(1024))
    finally:
        validation.available_memory = real


def _schedule_state(text: str):
    from mmpe.encodings._state import encode_setting

    return {"layer_schedule.settings.config": encode_setting(text)}


def _hf(**extra):
    from mmpe.integrations.transformers import layer_schedule_from_hf

    return layer_schedule_from_hf({"num_hidden_layers": 2, "head_dim": 8, **extra})


def _env_budget(value: str):
    import os

    from mmpe._scratch import block_bytes

    old = os.environ.get("MMPE_ATTN_BLOCK_BYTES")
    os.environ["MMPE_ATTN_BLOCK_BYTES"] = value
    try:
        return block_bytes()
    finally:
        if old is None:
            del os.environ["MMPE_ATTN_BLOCK_BYTES"]
        else:
            os.environ["MMPE_ATTN_BLOCK_BYTES"] = old


def _spe_load(k_saved: int, k_built: int):
    mmpe.build("spe", num_heads=4, k=k_built).load_state_dict(
        mmpe.build("spe", num_heads=4, k=k_saved).state_dict())


CASES = [
    right("Grid", "scalar scale", lambda: mmpe.Grid((2, 3), scale=2.0).scale,
          lambda s: s == (2.0, 2.0)),
    clear("Grid", "scale a str", lambda: mmpe.Grid((2, 3), scale="2"), "scale"),
    clear("Grid", "scale of 3 for 2 axes", lambda: mmpe.Grid((2, 3), scale=(1.0, 1.0, 1.0)),
          "scale"),
    right("PackedGrids", "numpy integers", lambda: mmpe.PackedGrids(
        [[(np.int64(2), np.int64(3))]], prefix_tokens=np.int64(1), max_tokens=np.int32(8)),
          lambda p: p.max_tokens == 8 and p.prefix_tokens == 1),
    clear("PackedGrids", "max_tokens a float", lambda: mmpe.PackedGrids([[(2, 3)]],
                                                                        max_tokens=8.0),
          "max_tokens"),
    right("Points", "100,000 points build in O(n)", lambda: mmpe.Points(torch.randn(100_000, 3)),
          lambda p: p.num_keys == 100_000),
    right("Points", "diameter of a flat cloud", lambda: float(mmpe.Points(
        torch.tensor([[0.0, 0, 0], [3, 4, 0], [1, 1, 0]] * 30)).diameter),
          lambda d: d == 5.0),
    warned("Points", "positions in metres of an atom", lambda: mmpe.Points(
        torch.randn(8, 3) * 1e-10, units="m"), "rescale"),
    warned("Sphere", "radians given as degrees", lambda: mmpe.Sphere(
        torch.tensor([0.1, -0.5, 0.7, 1.2]), torch.tensor([-2.0, 0.5, 1.5, 3.0])), "radians"),
    clear("Cross", "causal queries", lambda: mmpe.Cross(mmpe.Sequence(3, causal=True),
                                                        mmpe.Sequence(4)), "causal"),
    right("Cross", "causal queries, flag ignored on request", lambda: mmpe.Cross(
        mmpe.Sequence(3, causal=True), mmpe.Sequence(4), ignore_causal=True).num_keys,
          lambda n: n == 4),
    clear("KVCache", "a grid cannot decode", lambda: mmpe.MultiHeadAttention(32, 4)(
        torch.randn(1, 6, 32), mmpe.Grid((2, 3)), mmpe.KVCache()), "cache"),
    clear("KVCache", "points cannot decode", lambda: mmpe.MultiHeadAttention(32, 4)(
        torch.randn(1, 5, 32), mmpe.Points(torch.randn(5, 3)), mmpe.KVCache()), "cache"),
    right("randomized_positions", "a range of 2^34 in O(length)",
          lambda: randomized_positions(1, 8, 2**34),
          lambda p: p.shape == (1, 8) and bool((p.diff() > 0).all()) and int(p.max()) < 2**34),
    right("randomized_positions", "numpy integers",
          lambda: randomized_positions(np.int64(2), np.int32(3), np.int64(10)),
          lambda p: p.shape == (2, 3)),
    clear("randomized_positions", "generator an int",
          lambda: randomized_positions(1, 2, 4, generator=123), "generator"),
    clear("randomized_positions", "max_len below length",
          lambda: randomized_positions(1, 5, 4), "max_len"),
    clear("record_attention", "weights larger than free memory", _record_too_large,
          "GiB", "free"),
    right("abacus", "max_offset 0 disables the offset",
          lambda: mmpe.build("abacus", d_model=8, max_offset=0).max_offset, lambda v: v == 0),
    clear("abacus", "max_offset -1", lambda: mmpe.build("abacus", d_model=8, max_offset=-1),
          "max_offset"),
    clear("videorope", "head_dim 4", lambda: mmpe.build("videorope", head_dim=4), "head_dim"),
    clear("MMPE_ATTN_BLOCK_BYTES", "not a number", lambda: _env_budget("abc"),
          "MMPE_ATTN_BLOCK_BYTES"),
    clear("MMPE_ATTN_BLOCK_BYTES", "negative", lambda: _env_budget("-1"), "MMPE_ATTN_BLOCK_BYTES"),
    right("MMPE_ATTN_BLOCK_BYTES", "a number", lambda: _env_budget("4096"), lambda v: v == 4096),
    clear("attention device", "coordinates on another device", lambda: _attn(
        torch.randn(1, 4, 32), mmpe.Sequence(4, device="meta")), "device"),
    clear("LayerSchedule.from_state_dict", "corrupted config",
          lambda: LayerSchedule.from_state_dict(_schedule_state("{not json")),
          "layer_schedule.settings.config"),
    right("LayerSchedule.from_state_dict", "no schedule saved",
          lambda: LayerSchedule.from_state_dict({}), lambda v: v is None),
    clear("layer_schedule_from_hf", "a linear-attention layer", lambda: _hf(
        layer_types=["full_attention", "linear_attention"]), "layer_types[1]"),
    clear("layer_schedule_from_hf", "sliding without a window", lambda: _hf(
        layer_types=["sliding_attention"] * 2), "sliding_window"),
    clear("layer_schedule_from_hf", "layer_types too short", lambda: _hf(
        layer_types=["full_attention"]), "layer_types"),
    clear("layer_schedule_from_hf", "no_rope_layers too short", lambda: _hf(no_rope_layers=[1]),
          "no_rope_layers"),
    clear("layer_schedule_from_hf", "temperature tuning without floor_scale", lambda: _hf(
        no_rope_layers=[1, 0], attn_temperature_tuning=True), "floor_scale"),
    clear("spe", "k of another model", lambda: _spe_load(8, 2), "k"),
    clear("LayerSchedule", "no layers", lambda: mmpe.LayerSchedule([]), "layers"),
    clear("LayerSchedule", "a layer of an int", lambda: mmpe.LayerSchedule([1]), "layer spec"),
    clear("LayerSpec", "window -1", lambda: mmpe.LayerSpec(encodings=("rope",), window=-1),
          "window"),
    clear("LayerSpec", "encodings a str", lambda: mmpe.LayerSpec(encodings="rope"), "encodings"),
    clear("Numbers", "is_digit of ints", lambda: mmpe.Numbers(torch.tensor([1, 0, 1])),
          "is_digit"),
    clear("Numbers", "digit_ids a str", lambda: mmpe.Numbers.from_tokens(
        torch.tensor([1, 2]), "0123"), "digit_ids"),
    clear("Numbers", "float token ids", lambda: mmpe.Numbers.from_tokens(
        torch.tensor([1.0, 2.0]), [1]), "tokens"),
    clear("PerImage", "a rotary encoding", lambda: mmpe.PerImage(mmpe.build("rope", head_dim=8)),
          "encoding"),
    clear("TransformerBlock", "d_model not divisible", lambda: mmpe.TransformerBlock(30, 4),
          "d_model"),
    clear("TimeLine", "a list", lambda: TimeLine([1, 2]), "time"),
    clear("TimeLine", "NaN stamps", lambda: TimeLine(torch.tensor([0.0, float("nan")])), "time"),
    clear("V2PESequence", "delta 0", lambda: mmpe.coords.V2PESequence([3, (2, 2)], delta=0),
          "delta"),
    clear("VideoRoPEComposite", "delta -1", lambda: mmpe.coords.VideoRoPEComposite(
        [3, (2, 2, 2)], delta=-1), "delta"),
    clear("index_grid", "a negative count", lambda: mmpe.coords.index_grid(1, 1, -1, 2), "n_q"),
    clear("register_cross_distance", "not classes", lambda: mmpe.coords.register_cross_distance(
        "a", "b", None), "query_cls"),
    clear("register_cross_positions", "same_space not callable",
          lambda: mmpe.coords.register_cross_positions(mmpe.Points, mmpe.Points, 3), "same_space"),
    clear("qwen2_5_vl_composite", "tokens_per_second 0", lambda: mmpe.coords.qwen2_5_vl_composite(
        [(2, 2, 2)], second_per_grid_ts=[1.0], tokens_per_second=0), "tokens_per_second"),
    clear("v2pe_position_ids", "delta 2", lambda: mmpe.coords.v2pe_position_ids([3], 2.0),
          "delta"),
]


def _classify(fn, expect) -> str:
    kind, what = expect
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
        except (ValueError, TypeError, MemoryError, RuntimeError, KeyError) as err:
            named = kind == "clear" and any(n in str(err) for n in what)
            if isinstance(err, RuntimeError) and "load_state_dict" not in str(err) and \
                    "Error(s) in loading" not in str(err):
                return "internal"
            return "clear" if named else "internal"
        except Exception:  # noqa: BLE001 - anything else is an internal error by definition
            return "internal"
    if kind == "warned":
        return "warned" if any(what in str(w.message) for w in caught) else "silent"
    if kind == "right":
        return "right" if what(value) else "silent"
    return "silent"


@pytest.mark.parametrize(("api", "fn", "expect"), CASES)
def test_outcome(api: str, fn, expect) -> None:
    got = _classify(fn, expect)
    OUTCOMES[(api, got)] += 1
    assert got == expect[0], f"{api}: expected {expect[0]}, got {got}"


def test_every_listed_api_has_cases() -> None:
    covered = {p.values[0] for p in CASES}
    assert set(APIS) <= covered, f"APIs without cases: {sorted(set(APIS) - covered)}"
    assert covered <= set(APIS), f"cases of unlisted APIs: {sorted(covered - set(APIS))}"


def test_every_public_name_is_driven_by_a_bad_input_suite() -> None:
    """A public class or function of `mmpe` or `mmpe.coords` appears in one of the three
    suites, or in `NO_INPUT` with the reason it takes no input to check: a new API without
    cases fails here."""
    import types
    from pathlib import Path

    here = Path(__file__).parent
    text = "".join((here / f).read_text(encoding="utf-8") for f in (
        "test_bad_input.py", "test_misuse_edges.py", "test_newest_api_edges.py"))
    names = {n for n in mmpe.__all__ if not isinstance(getattr(mmpe, n), types.ModuleType)}
    names |= set(mmpe.coords.__all__)
    gaps = sorted(n for n in names - set(NO_INPUT)
                  if f"{n}(" not in text and f".{n}" not in text and f'"{n}"' not in text)
    assert not gaps, f"public names no bad-input suite drives: {gaps}"


def summary() -> str:
    by_class = Counter()
    for (_, outcome), n in OUTCOMES.items():
        by_class[outcome] += n
    return json.dumps(dict(sorted(by_class.items())))
