"""Mixed-precision helpers shared by the encodings (not a registered module: the name starts with ``_``).

The rules (docs/architecture.md, "Mixed precision and checkpoints"):

* phases, cumulative sums, distances and frequency tables are formed in float32 or float64,
  whatever the module's or the autocast dtype (:func:`full_precision`, :class:`KeepDtypeBuffers`);
* small learned tables read by an additive score term are upcast to float32 where the term is
  built (the math path adds the terms to float32 logits; SDPA casts the summed bias once);
* features computed in float32/float64 are cast to the dtype of the layer that reads them
  (:func:`module_dtype`), so ``module.to(torch.bfloat16)`` runs without dtype mismatches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def full_precision(device: torch.device | str | None) -> Iterator[None]:
    """Disable autocast on ``device`` inside the block (precision-critical arithmetic).

    Tensors created inside keep the dtype the code gives them; a block that reads a module's
    (possibly bf16) parameters upcasts them itself.
    """
    kind = torch.device(device).type if device is not None else "cpu"
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        with torch.autocast(kind, enabled=False):
            yield
    else:
        yield


def module_dtype(module: nn.Module, default: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype of ``module``'s first floating-point parameter (``default`` without one)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return default


class KeepDtypeBuffers(nn.Module):
    """Mixin: the buffers named in :attr:`keep_dtype_buffers` follow the module's device but
    never its dtype (``.to(torch.bfloat16)``, ``.half()`` …): frequency tables and phase
    matrices rounded to bf16 would rotate a token by a wrong angle (a 2⁻⁹ relative error in a
    frequency is ~1 rad at phase 500).
    """

    keep_dtype_buffers: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        kept = {name: self._buffers[name] for name in self.keep_dtype_buffers
                if self._buffers.get(name) is not None}
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            moved = self._buffers[name]
            if moved is not None and moved.dtype != old.dtype:
                self._buffers[name] = old.to(moved.device)
        return out


def float32(t: Tensor) -> Tensor:
    """``t`` in at least float32 (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
