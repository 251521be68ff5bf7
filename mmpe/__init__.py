"""mmpe: positional encodings for every kind of data a transformer reads.

A PE is defined once over a coordinate system (`mmpe.coords`) and enters attention at one
of four hooks (`mmpe.encodings`): input, rotary, score, kernel. An encoding declares the
coordinate capabilities it needs (`mmpe.coords.capabilities`: `Metric`, `Directed`,
`Positioned` …) and runs on any coordinates that provide them. `mmpe.build` makes any
registered encoding by its paper's name; `mmpe.functional` holds the pure functions and a
one-call FlexAttention `score_mod`; `mmpe.testing` the coordinates contract.
"""

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

__version__ = "0.1.0"

__all__ = [
    "CONTEXT_KEYS", "CausalLM", "Causal", "Composite", "CrossAttention", "Cross", "KVCache",
    "Latents", "LayerSchedule", "LayerSpec", "ModelCache", "Numbers", "cache", "generate", "generation", "plot", "Coordinates", "Directed", "FeatureGraph", "Graph",
    "GraphLayout", "Grid", "GridLayout", "Metric", "MultiHeadAttention", "PackedGrids", "PerImage", "Points", "Positioned",
    "Positioned1D", "Sequence", "Sphere", "Spherical", "Table", "Transformer",
    "TransformerBlock", "available", "build", "functional", "get", "register", "testing",
]
