"""Encodings read back from training checkpoints: [`load_encoding`][mmpe.checkpoints.load_encoding].

A Lightning checkpoint (`torch.load(path)["state_dict"]`, or a plain state dict) holds every
module of a trained model; [`load_encoding`][mmpe.checkpoints.load_encoding] builds one encoding (with the checkpoint's
saved hyperparameters and settings) and loads its tensors from the module under `prefix`,
found by parameter names when not given. [`mmpe.plot`][mmpe.plot] draws what it returns, e.g. FIRE's
learned bias row (`mmpe plot fire --checkpoint last.ckpt`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mmpe import registry
from mmpe.context import CONTEXT_KEYS, validate_context_keys
from mmpe.encodings._state import SETTINGS_PREFIX, decode_setting
from mmpe.encodings.base import Encoding

__all__ = ["find_prefix", "load_encoding", "read_checkpoint"]


def read_checkpoint(checkpoint: str | os.PathLike,
                    fn: str = "read_checkpoint") -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """`(state_dict, hyper_parameters)` of a checkpoint file.

    A Lightning checkpoint gives its `state_dict` and `hyper_parameters`; a plain state
    dict is its own state dict, with no hyperparameters. The file is loaded with
    `weights_only=True` first; a checkpoint that needs more (pickled objects in its
    hyperparameters) is loaded fully, so only read checkpoints you trust.

    Args:
        checkpoint: the file.
        fn: the name errors start with.

    Raises:
        FileNotFoundError: no such file. ValueError: the file does not load (empty,
            truncated, not a torch file) or holds no dict.
    """
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"{fn}: no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # pickled hyperparameters: Lightning itself loads these fully
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # empty, truncated, or not a torch file at all
            reason = " ".join(str(err).split())[:80] or "no detail"
            raise ValueError(f"{fn}: {path} is not a readable checkpoint "
                             f"({type(err).__name__}: {reason})") from None
    if not isinstance(ckpt, Mapping):
        raise ValueError(f"{fn}: {path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt.get("state_dict", ckpt), ckpt.get("hyper_parameters") or {}


def find_prefix(state: Mapping[str, Any], wanted: list[str]) -> str | None:
    """The first module of `state` that holds every name of `wanted`, or None.

    The first module of `state` (a state dict) that holds every name of `wanted` (an
    encoding's own state-dict keys), e.g. `"transformer.shared_encodings.0"`; None when
    no module does or `wanted` is empty."""
    if not wanted:
        return None
    first = wanted[0]
    for key in state:
        if key.endswith("." + first):
            prefix = key[: -len(first) - 1]
            if all(f"{prefix}.{w}" in state for w in wanted):
                return prefix
    return None


def load_encoding(enc: str | Mapping[str, Any] | Encoding, checkpoint: str | os.PathLike,
                  prefix: str | None = None, *, context: Mapping[str, Any] | None = None,
                  defaults: Mapping[str, Any] | None = None, **options: Any) -> Encoding:
    """An encoding with its parameters read from a training checkpoint.

    Reads `torch.load(checkpoint)["state_dict"]` (a Lightning checkpoint; a plain state dict
    works too) and loads the tensors under `prefix` (e.g.
    `"transformer.shared_encodings.0"`) into the encoding. Without `prefix` the first
    module of the state dict holding every parameter name of the encoding is used. A Lightning
    checkpoint's `hyper_parameters` fill the context keys it holds (`num_heads`,
    `d_model` …; `head_dim = d_model // num_heads`; `grid_shape` from `image_size` /
    `patch_size` as in `recipes/vision.py`) and, when its `encoding` is this one, the
    `encoding_options`; `context` and `options` given here win, and `defaults` fill
    the context keys neither gives.

    The file is loaded with `weights_only=True` first; a checkpoint that needs more (pickled
    objects in its hyperparameters) is loaded fully, so only read checkpoints you trust.

    Raises:
        FileNotFoundError: no such file. KeyError: an unknown encoding name.
        ValueError: nothing under `prefix`, no module holding the encoding's parameters, or
            tensors whose names or shapes differ from the encoding's (build options such as
            `num_heads` that do not match the checkpoint).
    """
    path = Path(checkpoint)
    state, hparams = read_checkpoint(path, "load_encoding")
    if isinstance(enc, Encoding):
        built, rebuild = enc, None
    else:
        name = enc if isinstance(enc, str) else enc.get("name", "")
        entry = registry.get(name)
        known = {k: v for k, v in hparams.items()
                 if k in CONTEXT_KEYS and CONTEXT_KEYS[k].valid(v)}
        if "head_dim" not in known and "d_model" in known and "num_heads" in known:
            known["head_dim"] = known["d_model"] // known["num_heads"]
        size, patch = hparams.get("image_size"), hparams.get("patch_size")
        if "grid_shape" not in known and isinstance(size, int) and isinstance(patch, int) \
                and 0 < patch <= size:
            known["grid_shape"] = (size // patch, size // patch)
        explicit = validate_context_keys(context, "load_encoding(context=...)")
        ctx = {**validate_context_keys(defaults, "load_encoding(defaults=...)"), **known, **explicit}
        saved = hparams.get("encoding_options") if hparams.get("encoding") == entry.name else None
        opts = {**(dict(saved) if isinstance(saved, Mapping) else {}), **options}

        def rebuild(extra: Mapping[str, Any]) -> Encoding:
            try:
                return registry.build(enc, context={k: v for k, v in ctx.items()
                                                    if k in entry.context}, **{**extra, **opts})
            except TypeError as err:
                raise ValueError(f"load_encoding: {err}") from err

        built = rebuild({})
    wanted = [k for k in built.state_dict() if not _is_setting(k)]
    if prefix is None:
        prefix = find_prefix(state, wanted)
        if prefix is None:
            modules = sorted({k.rsplit(".", 1)[0] for k in state if "." in k})[:12]
            raise ValueError(f"load_encoding: no module in {path} holds the parameters of "
                             f"{_name_of(built)} ({wanted}); pass prefix=... (modules: {modules} …)")
    prefix = prefix.rstrip(".")
    sub = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
    if not sub and wanted:
        raise ValueError(f"load_encoding: {path} has no tensors under {prefix!r}")
    if rebuild is not None:
        # Settings saved with the tensors (T5's max_distance, a RoPE scaling's training length
        # …) that the constructor takes and nobody gave here: build with the saved values.
        accepted = set(inspect.signature(registry.get(_name_of(built)).cls).parameters)
        extra = {k[len(SETTINGS_PREFIX):]: decode_setting(v) for k, v in sub.items()
                 if k.startswith(SETTINGS_PREFIX)}
        extra = {k: v for k, v in extra.items()
                 if k in accepted and k not in options and k not in explicit}
        current = getattr(built, "function_settings", dict)()
        if any(k not in current or current[k] != v for k, v in extra.items()):
            built = rebuild(extra)
    try:
        # strict=False: settings a checkpoint saved before they existed are absent; every
        # tensor must still be there, and saved settings that differ still fail the load.
        result = built.load_state_dict(sub, strict=False)
    except RuntimeError as err:
        raise ValueError(f"load_encoding: the tensors under {prefix!r} do not fit "
                         f"{_name_of(built)} as built (pass its options, e.g. num_heads): {err}") from err
    missing = [k for k in result.missing_keys if not _is_setting(k)]
    if missing or result.unexpected_keys:
        raise ValueError(f"load_encoding: the tensors under {prefix!r} do not fit {_name_of(built)}: "
                         f"missing {missing}, unexpected {list(result.unexpected_keys)}")
    return built


def _is_setting(key: str) -> bool:
    return key.startswith(SETTINGS_PREFIX) or f".{SETTINGS_PREFIX}" in key


def _name_of(enc: Encoding) -> str:
    return getattr(enc, "registry_name", type(enc).__name__)
