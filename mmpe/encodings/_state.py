"""Settings saved with the state_dict (not a registered module: the name starts with `_`).

An encoding's output depends on its tensors *and* on constructor settings no tensor holds (a
RoPE scaling's `original_max_position_embeddings`, SwinV2's training window, T5's
`max_distance` …). A state_dict loaded into a module built with other settings would run
without an error and give other numbers. `SavesSettings` writes those settings into the
state_dict as small CPU tensors under `<prefix>settings.<name>` and, on load, compares them
with the module's own: a mismatch is a load error naming the setting and both values
(`load_state_dict` raises `RuntimeError`, with `strict=False` too). A state_dict that
lacks the entries (saved before they existed) is reported as missing keys under
`strict=True`; `strict=False` loads it unchecked.

Values are encoded as tensors (safetensors-compatible, never cast by `.to(dtype)`): `bool`
→ bool, `int` → int64, `float` → float64, a tuple/list of numbers → 1-d int64/float64,
`str` → uint8 UTF-8 bytes, `None` → an empty bool tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

SETTINGS_PREFIX = "settings."


def encode_setting(value: Any) -> Tensor:
    """A setting as a CPU tensor (see the module docstring for the encoding).

    Raises:
        TypeError: a value of another type.
    """
    if value is None:
        return torch.zeros(0, dtype=torch.bool)
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    if isinstance(value, str):
        return torch.tensor(list(value.encode()), dtype=torch.uint8)
    if isinstance(value, Tensor):
        return value.detach().to("cpu", torch.float64).reshape(-1)
    if isinstance(value, (tuple, list)):
        flat = [v for v in value]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            return torch.tensor(flat, dtype=torch.int64).reshape(-1)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
            return torch.tensor(flat, dtype=torch.float64).reshape(-1)
    raise TypeError(f"a saved setting must be None, a bool, int, float, str or a flat tuple of "
                    f"numbers, got {value!r}")


def decode_setting(t: Tensor) -> Any:
    """The Python value of an encoded setting (for messages)."""
    if not isinstance(t, Tensor):
        return t
    if t.dtype == torch.bool:
        return None if t.numel() == 0 else bool(t)
    if t.dtype == torch.uint8:
        return bytes(t.tolist()).decode(errors="replace")
    if t.dim() == 0:
        return t.item()
    return tuple(t.tolist())


def same_setting(a: Tensor, b: Tensor) -> bool:
    """Whether two encoded settings hold the same value (numbers compare by value: 64 == 64.0)."""
    if not isinstance(a, Tensor) or a.shape != b.shape:
        return False
    numeric = (torch.int64, torch.float64)
    if a.dtype in numeric and b.dtype in numeric:
        return torch.equal(a.cpu().double(), b.cpu().double())
    return a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())


class SavesSettings(nn.Module):
    """Mixin: the settings in [`saved_settings`][mmpe.encodings._state.SavesSettings.saved_settings] travel with the state_dict and are checked
    on load (see the module docstring).

    `saved_settings` names attributes (`("base", "rotary_dim")`) or maps a setting's name
    to the attribute holding it (`{"max_relative_positions": "max_position"}`); a subclass
    with derived values overrides [`function_settings`][mmpe.encodings._state.SavesSettings.function_settings].
    """

    saved_settings: ClassVar[tuple[str, ...] | Mapping[str, str]] = ()

    def function_settings(self) -> dict[str, Any]:
        """`{setting: value}` of the settings that define the output beyond the tensors."""
        names = self.saved_settings
        pairs = names.items() if isinstance(names, Mapping) else ((n, n) for n in names)
        return {name: getattr(self, attr) for name, attr in pairs}

    @property
    def settings(self) -> SimpleNamespace:
        """The saved settings as the state_dict holds them (`settings.<name>`: encoded
        tensors), as attributes: `torch.distributed.checkpoint` finds a state_dict entry by
        walking its key's attributes (Lightning's `ModelParallelStrategy` checkpoints)."""
        return SimpleNamespace(**{name: encode_setting(value)
                                  for name, value in self.function_settings().items()})

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[override]
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self.function_settings().items():
            destination[prefix + SETTINGS_PREFIX + name] = encode_setting(value)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,  # type: ignore[override]
                              missing_keys, unexpected_keys, error_msgs):
        label = getattr(self, "registry_name", type(self).__name__)
        ours = {prefix + SETTINGS_PREFIX + name: (name, value)
                for name, value in self.function_settings().items()}
        for key, (name, value) in ours.items():
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            saved = state_dict[key]
            if not same_setting(saved, encode_setting(value)):
                error_msgs.append(
                    f"{key}: {label} was saved with {name}={decode_setting(saved)!r} but this "
                    f"module was built with {name}={value!r}; the setting changes the "
                    f"encoding's output, so build the module with {name}={decode_setting(saved)!r}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        unexpected_keys[:] = [k for k in unexpected_keys if k not in ours]
