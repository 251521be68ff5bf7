"""mmpe: positional encodings for every kind of data a transformer reads.

A PE is defined once over a coordinate system (`mmpe.coords`) and enters attention at one
of four hooks (`mmpe.encodings`): input, rotary, score, kernel. An encoding declares the
coordinate capabilities it needs (`mmpe.coords.capabilities`: `Metric`, `Directed`,
`Positioned` …) and runs on any coordinates that provide them. `mmpe.build` makes any
registered encoding by its paper's name; `mmpe.functional` holds the pure functions and a
one-call FlexAttention `score_mod`; `mmpe.testing` the coordinates contract.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# `import mmpe` imports none of the package: torch alone takes seconds, and `mmpe --version`,
# `mmpe --help` need neither it nor the rest (issue 52). The names below are read from their
# modules on first use (PEP 562 `__getattr__`); the block under TYPE_CHECKING is where they come
# from, for type checkers and readers, and `_EXPORTS` is the same table for the interpreter
# (tests/package/test_import_budget.py holds them equal).
if TYPE_CHECKING:
    from mmpe import cache, functional, generation, plot, testing
    from mmpe.attention import CrossAttention, MultiHeadAttention
    from mmpe.cache import KVCache, ModelCache
    from mmpe.context import CONTEXT_KEYS
    from mmpe.coords import (
        Composite,
        Coordinates,
        Cross,
        Graph,
        Grid,
        Latents,
        Numbers,
        PackedGrids,
        Points,
        Sequence,
        Sphere,
        Table,
    )
    from mmpe.coords.capabilities import (
        Causal,
        Directed,
        FeatureGraph,
        GraphLayout,
        GridLayout,
        Metric,
        Positioned,
        Positioned1D,
        Spherical,
    )
    from mmpe.encodings.per_image import PerImage
    from mmpe.generation import generate
    from mmpe.lm import CausalLM
    from mmpe.registry import available, build, get, register
    from mmpe.schedule import LayerSchedule, LayerSpec
    from mmpe.transformer import Transformer, TransformerBlock

#: public name -> the module that defines it (submodules map to themselves)
_EXPORTS = {
    **dict.fromkeys(("cache", "functional", "generation", "plot", "testing"), ""),
    "CrossAttention": "mmpe.attention", "MultiHeadAttention": "mmpe.attention",
    "KVCache": "mmpe.cache", "ModelCache": "mmpe.cache",
    "CONTEXT_KEYS": "mmpe.context",
    **dict.fromkeys(("Composite", "Coordinates", "Cross", "Graph", "Grid", "Latents", "Numbers",
                     "PackedGrids", "Points", "Sequence", "Sphere", "Table"), "mmpe.coords"),
    **dict.fromkeys(("Causal", "Directed", "FeatureGraph", "GraphLayout", "GridLayout", "Metric",
                     "Positioned", "Positioned1D", "Spherical"), "mmpe.coords.capabilities"),
    "PerImage": "mmpe.encodings.per_image",
    "generate": "mmpe.generation",
    "CausalLM": "mmpe.lm",
    **dict.fromkeys(("available", "build", "get", "register"), "mmpe.registry"),
    **dict.fromkeys(("LayerSchedule", "LayerSpec"), "mmpe.schedule"),
    **dict.fromkeys(("Transformer", "TransformerBlock"), "mmpe.transformer"),
}


def __getattr__(name: str) -> object:
    """A public name (or any submodule, `mmpe.coords`), imported on its first read."""
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("__") or importlib.util.find_spec(f"mmpe.{name}") is None:
            raise AttributeError(f"module 'mmpe' has no attribute {name!r}")
        return importlib.import_module(f"mmpe.{name}")
    value = importlib.import_module(f"mmpe.{name}") if not module else \
        getattr(importlib.import_module(module), name)
    globals()[name] = value  # read once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "CONTEXT_KEYS", "CausalLM", "Causal", "Composite", "CrossAttention", "Cross", "KVCache",
    "Latents", "LayerSchedule", "LayerSpec", "ModelCache", "Numbers", "cache", "generate", "generation", "plot", "Coordinates", "Directed", "FeatureGraph", "Graph",
    "GraphLayout", "Grid", "GridLayout", "Metric", "MultiHeadAttention", "PackedGrids", "PerImage", "Points", "Positioned",
    "Positioned1D", "Sequence", "Sphere", "Spherical", "Table", "Transformer",
    "TransformerBlock", "available", "build", "functional", "get", "register", "testing",
]
