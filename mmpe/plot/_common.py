"""What the encoding figures share: building an encoding to draw, and evaluating it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from mmpe import registry
from mmpe.context import validate_context_keys
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import Encoding, InputEncoding


def article(word: str) -> str:
    """`"an input"`, `"a score"`."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def name_of(enc: Any) -> str:
    """The registry name of a built encoding, else its class name."""
    return getattr(enc, "registry_name", type(enc).__name__)


def build(fn: str, enc: Any, base: type[Encoding], context: Mapping[str, Any] | None) -> Any:
    """`enc` itself, or built from a registry name / config with `context`; check its hook."""
    if isinstance(enc, (str, Mapping)):
        entry = registry.get(enc if isinstance(enc, str) else enc.get("name", ""))
        ctx = validate_context_keys(context, f"{fn}(context=...)")
        enc = registry.build(enc, context={k: v for k, v in ctx.items() if k in entry.context})
    if not isinstance(enc, base):
        hook = getattr(enc, "hook", None)
        what = f"{article(hook)} encoding" if hook else article(type(enc).__name__)
        raise ValueError(f"{fn}: {name_of(enc)} is {what}; {fn} needs {article(base.hook)} encoding")
    return enc


@contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no LapPE sign flips, no dropout) and no grad, restoring the mode after."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was)


def positions(enc: InputEncoding, coords: Coordinates) -> Tensor:
    """`P` of an input encoding on `coords` as float32 `[n, d]` (first batch element)."""
    enc.check_coords(coords)
    with evaluating(enc):
        pe = enc(coords)
    if pe.dim() == 3:
        pe = pe[0]
    return pe.detach().float().cpu()
