"""mmpe: positional encodings for every kind of data a transformer reads.

A PE is defined once over a coordinate system (``mmpe.coords``) and enters attention at one
of four hooks (``mmpe.encodings``): input, rotary, score, kernel. ``mmpe.build`` makes any
registered encoding by its paper's name.
"""

from mmpe.attention import MultiHeadAttention
from mmpe.coords import Composite, Coordinates, Graph, Grid, Points, Sequence, Sphere, Table
from mmpe.registry import available, build, get, register
from mmpe.transformer import Transformer, TransformerBlock

__version__ = "0.1.0"

__all__ = [
    "Composite", "Coordinates", "Graph", "Grid", "MultiHeadAttention", "Points", "Sequence",
    "Sphere", "Table", "Transformer", "TransformerBlock",
    "available", "build", "get", "register",
]
