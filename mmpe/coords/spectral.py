"""Laplacian eigenvectors of a weighted undirected graph: the spectral "absolute position".

Used by :class:`mmpe.coords.Graph` (LapPE, Dwivedi & Bresson 2020; Kreuzer 2021; GraphGPS,
Rampášek 2022) and by the Tab-PET feature graphs of :mod:`mmpe.coords.table` (Leng 2025).

For a symmetric, non-negative adjacency ``A`` (``n × n``) with degrees ``D = diag(A·1)``:

* ``normalization=None`` — combinatorial Laplacian ``L = D − A``;
* ``normalization="sym"`` — ``L = I − D^{-1/2} A D^{-1/2}`` (eigenvalues in ``[0, 2]``).

Both are built by :func:`scipy.sparse.csgraph.laplacian`, which **ignores the diagonal of**
``A`` (self-loops do not enter the Laplacian) and gives an isolated node a zero row (so each
connected component, isolated nodes included, contributes one zero eigenvalue).

:func:`laplacian_eigenvectors` returns the ``k`` smallest **non-trivial** eigenpairs: the
eigenpairs sorted by eigenvalue with the first (the trivial one, eigenvalue 0, vector
``∝ D^{1/2}·1`` per component) dropped — the convention of PyG's
``AddLaplacianEigenvectorPE``. On a disconnected graph the other zero eigenvalues (component
indicators) are kept: they are informative positions.

Sign convention (deterministic): every eigenvector is flipped so that its entry of largest
absolute value is positive (ties within ``1e-8`` go to the lowest node index). Eigenvectors
of a repeated eigenvalue are only defined up to a rotation of their subspace; the solver's
basis is returned as is. Models should not rely on the sign: :func:`random_sign_flip`
multiplies every eigenvector by an independent random ±1 (LapPE training augmentation,
Dwivedi 2020).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import eigh
from scipy.sparse.csgraph import laplacian
from scipy.sparse.linalg import eigsh
from torch import Tensor

__all__ = ["DENSE_THRESHOLD", "canonical_sign", "graph_laplacian", "laplacian_eigenvectors",
           "random_sign_flip"]

#: Graphs with fewer nodes than this use the dense ``scipy.linalg.eigh``; larger ones ``eigsh``.
DENSE_THRESHOLD = 100


def _as_adjacency(adjacency: object) -> sp.csr_matrix | np.ndarray:
    """Validate ``adjacency`` and return it as float64 CSR (sparse input) or ndarray (dense)."""
    if isinstance(adjacency, Tensor):
        adjacency = adjacency.detach().cpu().numpy()
    if sp.issparse(adjacency):
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        values = a.data
    elif isinstance(adjacency, np.ndarray):
        if adjacency.dtype == object or adjacency.dtype.kind not in "biuf":
            raise TypeError(f"laplacian_eigenvectors: adjacency must hold real numbers, "
                            f"got dtype {adjacency.dtype}")
        a = np.asarray(adjacency, dtype=np.float64)
        values = a
    else:
        raise TypeError("laplacian_eigenvectors: adjacency must be a scipy.sparse matrix, a numpy "
                        f"array or a torch.Tensor, got {type(adjacency).__name__}")
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"laplacian_eigenvectors: adjacency must be square [n, n], got {a.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("laplacian_eigenvectors: adjacency has NaN or infinite weights")
    if np.any(values < 0):
        raise ValueError("laplacian_eigenvectors: adjacency weights must be non-negative")
    asym = abs(a - a.T)
    asym = asym.max() if asym.size else 0.0
    if asym > 1e-8 * max(1.0, float(abs(a).max()) if a.size else 1.0):
        raise ValueError("laplacian_eigenvectors: adjacency must be symmetric (undirected graph); "
                         f"max |A - A^T| = {asym:.3g}")
    return a


def graph_laplacian(adjacency: object, normalization: str | None = "sym") -> sp.csr_matrix | np.ndarray:
    """The Laplacian of ``adjacency`` (``None``: ``D − A``; ``"sym"``: ``I − D^-½ A D^-½``).

    Same input rules as :func:`laplacian_eigenvectors`; the output is sparse for sparse input.
    """
    if normalization not in (None, "sym"):
        raise ValueError(f"normalization must be 'sym' or None, got {normalization!r}")
    a = _as_adjacency(adjacency)
    return laplacian(a, normed=normalization == "sym")


def canonical_sign(eigvecs: np.ndarray, atol: float = 1e-8) -> np.ndarray:
    """Flip each column so that its largest-|entry| (lowest index among ties) is positive."""
    v = np.array(eigvecs, dtype=np.float64, copy=True)
    if v.size == 0:
        return v
    mag = np.abs(v)
    top = mag.max(axis=0, keepdims=True)
    first = np.argmax(mag >= top - atol, axis=0)  # lowest index within atol of the max
    signs = np.sign(v[first, np.arange(v.shape[1])])
    signs[signs == 0] = 1.0
    return v * signs


def laplacian_eigenvectors(
    adjacency: object,
    k: int,
    normalization: str | None = "sym",
    *,
    dense_threshold: int = DENSE_THRESHOLD,
    return_mask: bool = False,
    tol: float = 0.0,
) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` smallest non-trivial eigenpairs of the graph Laplacian of ``adjacency``.

    Args:
        adjacency: symmetric non-negative weights ``[n, n]``: a ``scipy.sparse`` matrix, a
            numpy array or a torch tensor. The diagonal (self-loops) is ignored.
        k: number of eigenpairs (>= 1).
        normalization: ``"sym"`` (``I − D^-½ A D^-½``) or ``None`` (``D − A``).
        dense_threshold: graphs with ``n < dense_threshold`` use dense ``scipy.linalg.eigh``,
            larger ones ``scipy.sparse.linalg.eigsh`` (``k+1`` smallest algebraic).
        return_mask: also return ``mask [k]`` (bool, True where the eigenpair exists).
        tol: ``eigsh`` tolerance (0 = machine precision).

    Returns:
        ``eigvals [k]`` (ascending, float64) and ``eigvecs [n, k]`` (float64, unit-norm columns,
        sign convention of :func:`canonical_sign`). A graph with ``n < k + 1`` nodes has only
        ``n − 1`` non-trivial eigenpairs: the missing columns (and eigenvalues) are zeros and
        ``mask`` is False there. A graph with 0 nodes gives ``[k]`` zeros and ``[0, k]``.

    Raises:
        TypeError: adjacency of an unsupported type or dtype.
        ValueError: non-square, asymmetric, negative or non-finite adjacency; ``k < 1``; an
            unknown ``normalization``.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"laplacian_eigenvectors: k must be an int >= 1, got {k!r}")
    k = int(k)
    lap = graph_laplacian(adjacency, normalization)
    n = lap.shape[0]
    m = min(k, max(n - 1, 0))  # non-trivial eigenpairs that exist
    vals_out = np.zeros(k, dtype=np.float64)
    vecs_out = np.zeros((n, k), dtype=np.float64)
    mask = np.zeros(k, dtype=bool)
    if m > 0:
        if n < dense_threshold or m + 1 >= n - 1:
            dense = lap.toarray() if sp.issparse(lap) else np.asarray(lap)
            vals, vecs = eigh(dense, subset_by_index=[0, m])
        else:
            # Deterministic start vector so repeated calls give the same basis.
            v0 = np.linspace(1.0, 2.0, n)
            vals, vecs = eigsh(sp.csr_matrix(lap), k=m + 1, which="SA", v0=v0, tol=tol)
        order = np.argsort(vals, kind="stable")
        vals, vecs = vals[order], vecs[:, order]
        vals_out[:m] = np.clip(vals[1:m + 1], 0.0, None)
        vecs_out[:, :m] = canonical_sign(vecs[:, 1:m + 1])
        mask[:m] = True
    if return_mask:
        return vals_out, vecs_out, mask
    return vals_out, vecs_out


def random_sign_flip(eigvecs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Multiply every eigenvector by an independent random sign (LapPE training augmentation).

    Args:
        eigvecs: ``[n, k]`` (one graph; one sign per column) or ``[b, n, k]`` (one sign per
            graph and column).
        generator: optional ``torch.Generator`` for reproducible flips.

    Returns:
        Tensor of the same shape and dtype.

    Raises:
        ValueError: ``eigvecs`` not of rank 2 or 3.
    """
    if not isinstance(eigvecs, Tensor):
        raise TypeError(f"random_sign_flip: eigvecs must be a torch.Tensor, got {type(eigvecs).__name__}")
    if eigvecs.dim() not in (2, 3):
        raise ValueError(f"random_sign_flip: eigvecs must be [n, k] or [b, n, k], got {tuple(eigvecs.shape)}")
    shape = (eigvecs.shape[-1],) if eigvecs.dim() == 2 else (eigvecs.shape[0], 1, eigvecs.shape[-1])
    bits = torch.randint(0, 2, shape, generator=generator, device="cpu").to(eigvecs.device)
    return eigvecs * (2 * bits - 1).to(eigvecs.dtype)
