"""Positional encodings, one method (or family) per module, grouped by hook.

Importing this package imports every module in it, and each module registers its classes
(`mmpe.registry.register`), so a new method needs only a new file here.
"""

import importlib
import pkgutil

from mmpe.encodings.base import (
    AttentionCall,
    Encoding,
    InputEncoding,
    KernelEncoding,
    PositionOutOfRangeError,
    RotaryEncoding,
    ScoreEncoding,
)

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _mod.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod}")

__all__ = [
    "AttentionCall", "Encoding", "InputEncoding", "KernelEncoding",
    "PositionOutOfRangeError", "RotaryEncoding", "ScoreEncoding",
]
