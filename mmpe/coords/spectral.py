"""Laplacian eigenvectors of a weighted undirected graph (kept for backwards compatibility).

The functions live in [`mmpe.graph_maths`][mmpe.graph_maths] (see its docstring for the Laplacian and sign
conventions); this module re-exports them under their old import path.
"""

from __future__ import annotations

from mmpe.graph_maths import (
    DENSE_THRESHOLD,
    canonical_sign,
    graph_laplacian,
    laplacian_eigenvectors,
    random_sign_flip,
)

__all__ = ["DENSE_THRESHOLD", "canonical_sign", "graph_laplacian", "laplacian_eigenvectors",
           "random_sign_flip"]
