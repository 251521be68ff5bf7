"""mmpe: positional encodings for every kind of data a transformer reads.

A PE is defined once over a coordinate system (``mmpe.coords``) and enters attention at one
of four hooks (``mmpe.encodings``): input, rotary, score, kernel. An encoding declares the
coordinate capabilities it needs (``mmpe.coords.capabilities``: ``Metric``, ``Directed``,
``Positioned`` …) and runs on any coordinates that provide them. ``mmpe.build`` makes any
registered encoding by its paper's name; ``mmpe.functional`` holds the pure functions and a
one-call FlexAttention ``score_mod``; ``mmpe.testing`` the coordinates contract.
"""

from mmpe import functional, testing
from mmpe.attention import MultiHeadAttention
from mmpe.context import CONTEXT_KEYS
from mmpe.coords import Composite, Coordinates, Graph, Grid, Points, Sequence, Sphere, Table
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
from mmpe.registry import available, build, get, register
from mmpe.transformer import Transformer, TransformerBlock

__version__ = "0.1.0"

__all__ = [
    "CONTEXT_KEYS", "Causal", "Composite", "Coordinates", "Directed", "FeatureGraph", "Graph",
    "GraphLayout", "Grid", "GridLayout", "Metric", "MultiHeadAttention", "Points", "Positioned",
    "Positioned1D", "Sequence", "Sphere", "Spherical", "Table", "Transformer",
    "TransformerBlock", "available", "build", "functional", "get", "register", "testing",
]
