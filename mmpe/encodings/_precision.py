"""Mixed-precision helpers shared by the encodings (not a registered module: the name starts with `_`).

The rules (docs/architecture.md, "Mixed precision and checkpoints"):

* phases, cumulative sums, distances and frequency tables are formed in float32 or float64,
  whatever the module's or the autocast dtype ([`full_precision`][mmpe.encodings._precision.full_precision], [`KeepDtype`][mmpe.encodings._precision.KeepDtype]);
* small learned tables read by an additive score term, and the distances they read, are
  upcast where the term is built to float32, or kept in float64 in a float64 module
  (`term_dtype`: a float64 check of two paths must not meet float32 rounding inside);
  the math route adds the terms to float32 logits; SDPA casts the summed bias once;
* features computed in float32/float64 are cast to the dtype of the layer that reads them
  ([`module_dtype`][mmpe.encodings._precision.module_dtype]), so `module.to(torch.bfloat16)` runs without dtype mismatches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def full_precision(device: torch.device | str | None) -> Iterator[None]:
    """Disable autocast on `device` inside the block (precision-critical arithmetic).

    Tensors created inside keep the dtype the code gives them; a block that reads a module's
    (possibly bf16) parameters upcasts them itself.
    """
    kind = torch.device(device).type if device is not None else "cpu"
    # torch.is_autocast_enabled(kind) alone: Dynamo cannot trace is_autocast_available().
    if kind in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(kind):
        with torch.autocast(kind, enabled=False):
            yield
    else:
        yield


def module_dtype(module: nn.Module, default: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype of `module`'s first floating-point parameter (`default` without one)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return default


class KeepDtype(nn.Module):
    """Mixin: the buffers and parameters named in [`keep_dtype`][mmpe.encodings._precision.KeepDtype.keep_dtype] follow the module's device
    but never its dtype (`.to(torch.bfloat16)`, `.half()` …).

    For frequency tables and phase matrices: rounded to bf16 they would rotate a token by a
    wrong angle (a 2⁻⁹ relative error in a frequency is ~1 rad at phase 500). A kept parameter
    stays float32 in a bf16 model (its optimizer state too); its gradient follows it.
    """

    keep_dtype: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        buffers = {name: self._buffers[name] for name in self.keep_dtype
                   if self._buffers.get(name) is not None}
        params = {name: self._parameters[name].data for name in self.keep_dtype
                  if self._parameters.get(name) is not None}
        out = super()._apply(fn, recurse)
        for name, old in buffers.items():
            moved = self._buffers[name]
            if moved is not None and moved.dtype != old.dtype:
                self._buffers[name] = old.to(moved.device)
        for name, old in params.items():
            param = self._parameters[name]
            if param is not None and param.dtype != old.dtype:
                param.data = old.to(param.device)
                if param.grad is not None:
                    param.grad = param.grad.to(param.dtype)
        return out


def float32(t: Tensor) -> Tensor:
    """`t` in at least float32 (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def term_dtype(module: nn.Module) -> torch.dtype:
    """The dtype a score term of `module` is built in.

    Float32 for a float32, bf16 or fp16 module (a bias summed over every pair), float64 for a
    float64 one (a float64 check must not meet float32 rounding inside)."""
    return torch.promote_types(module_dtype(module), torch.float32)
