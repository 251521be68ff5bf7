"""Tables: the feature columns of a dataset as tokens, placed on a feature graph (Tab-PET).

A tabular transformer (FT-Transformer, Gorishniy et al. 2021) reads one token per feature
column, plus an optional ``[CLS]`` token. The columns have no natural order, so Tab-PET
(Leng, Ghosh & Motani 2025, "Tab-PET: Graph-Based Positional Encodings for Tabular
Transformers", AAAI 2026) gives them a geometry: a **feature graph** estimated from the
*training rows only*, whose nodes are the columns and whose edge weights measure how strongly
two columns depend on each other. From that graph this module derives

* **positions** — Laplacian eigenvectors of the feature graph (Tab-PET's PE, read by the
  ``tabpet`` input encoding, which scales them by ``alpha`` and concatenates them), and
* **distances** — shortest-path hops in the (sparsified) feature graph, so that every score
  encoding written for sequences (ALiBi, T5 buckets, FIRE) also runs on tables.

Pipeline (:meth:`Table.from_data`):

1. :func:`feature_graph` — ``W[i, j] = |ρ(x_i, x_j)|`` with ``ρ`` Pearson or Spearman
   correlation, or the mutual information ``I(x_i; x_j)`` (nats, scikit-learn's
   ``mutual_info_classif`` / ``mutual_info_regression``, symmetrised ``(M + Mᵀ)/2``) when
   columns are categorical. Diagonal 0.
2. :func:`sparsify_graph` — keep each column's ``knn`` strongest neighbours (union:
   ``A = max(M, Mᵀ)``), or the edges with ``W >= threshold``, or everything (``None``; the
   dense association graph of the Tab-PET reference code).
3. Laplacian eigenvectors of ``A`` (:func:`mmpe.coords.spectral.laplacian_eigenvectors`;
   ``L = I − D^-½ A D^-½`` by default, as Tab-PET): the ``k`` smallest non-trivial
   eigenvectors and optionally the ``k_high`` largest (the Tab-PET reference concatenates
   low- and high-frequency eigenvectors).
4. :func:`feature_hops` — unweighted shortest paths in ``A`` (``scipy.sparse.csgraph``).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import shortest_path
from scipy.stats import rankdata
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.spectral import laplacian_eigenvectors

__all__ = ["GRAPH_METHODS", "Table", "feature_graph", "feature_hops", "sparsify_graph"]

GRAPH_METHODS = ("pearson", "spearman", "mi", "auto")


def _check_table(X: object, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 ``[n_rows, n_features]`` array, or a clear error."""
    if isinstance(X, Tensor):
        X = X.detach().cpu().numpy()
    try:
        arr = np.asarray(X)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise TypeError(f"table: {name} must be array-like [n_rows, n_features], got {type(X).__name__}") from err
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise TypeError(f"table: {name} must hold numbers (encode categorical columns as integer "
                        f"codes first), got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"table: {name} must have shape [n_rows, n_features], got {arr.shape}")
    n, f = arr.shape
    if n < 3:
        raise ValueError(f"table: {name} needs at least 3 training rows to estimate a feature graph, got {n}")
    if f < 2:
        raise ValueError(f"table: {name} needs at least 2 feature columns, got {f}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        cols = sorted(set(np.nonzero(bad)[1].tolist()))
        raise ValueError(f"table: {name} has NaN or infinite values in columns {cols[:10]} "
                         f"({int(bad.sum())} cells); impute them on the training rows first")
    return arr


def _check_categorical(categorical: Seq[int], f: int) -> list[int]:
    cats = [int(c) for c in categorical]
    if any(c < 0 or c >= f for c in cats):
        raise ValueError(f"table: categorical column indices must lie in [0, {f - 1}], got {cats}")
    if len(set(cats)) != len(cats):
        raise ValueError(f"table: categorical column indices must be unique, got {cats}")
    return sorted(cats)


def _abs_correlation(X: np.ndarray) -> np.ndarray:
    """``|Pearson(x_i, x_j)|`` of the columns; a constant column correlates 0 with all others."""
    xc = X - X.mean(axis=0, keepdims=True)
    norm = np.sqrt((xc**2).sum(axis=0))
    const = norm <= 1e-12 * max(1.0, float(np.abs(X).max()))
    norm = np.where(const, 1.0, norm)
    corr = (xc.T @ xc) / np.outer(norm, norm)
    corr[const, :] = 0.0
    corr[:, const] = 0.0
    corr = np.abs(np.clip(corr, -1.0, 1.0))
    np.fill_diagonal(corr, 0.0)
    return corr


def _mutual_information(X: np.ndarray, categorical: list[int], random_state: int) -> np.ndarray:
    """Pairwise MI (nats): row ``j`` estimates ``I(x_j; x_i)`` with ``x_j`` as the target."""
    from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

    f = X.shape[1]
    discrete = np.zeros(f, dtype=bool)
    discrete[categorical] = True
    mi = np.zeros((f, f))
    for j in range(f):
        if discrete[j]:
            mi[j] = mutual_info_classif(X, X[:, j].astype(np.int64), discrete_features=discrete,
                                        random_state=random_state)
        else:
            mi[j] = mutual_info_regression(X, X[:, j], discrete_features=discrete,
                                           random_state=random_state)
    mi = np.clip((mi + mi.T) / 2.0, 0.0, None)
    np.fill_diagonal(mi, 0.0)
    return mi


def feature_graph(
    X: object,
    method: str = "spearman",
    *,
    categorical: Seq[int] = (),
    random_state: int = 0,
) -> np.ndarray:
    """Dense association graph of the columns of ``X`` (Tab-PET's association-based graphs).

    Args:
        X: training rows only, ``[n_rows, n_features]`` numbers (categorical columns as integer
            codes). Never pass validation or test rows: the graph (and every encoding built on
            it) must not see them.
        method: ``"pearson"`` (``|ρ_P|``), ``"spearman"`` (``|ρ_S|``, Pearson of average ranks),
            ``"mi"`` (mutual information in nats, scikit-learn's k-NN / contingency estimators,
            symmetrised), or ``"auto"`` (``"mi"`` when ``categorical`` is non-empty, else
            ``"spearman"``, the paper's best association graph).
        categorical: indices of categorical columns (discrete for the MI estimators).
        random_state: seed of scikit-learn's MI estimators (they add tiny noise).

    Returns:
        ``W [n_features, n_features]`` float64, symmetric, non-negative, zero diagonal.

    Raises:
        TypeError: non-numeric ``X``.
        ValueError: ``X`` not 2-D, fewer than 3 rows or 2 columns, NaN/inf cells (the message
            names the columns), bad ``categorical`` indices, unknown ``method``.
    """
    arr = _check_table(X)
    cats = _check_categorical(categorical, arr.shape[1])
    if method not in GRAPH_METHODS:
        raise ValueError(f"table: method must be one of {GRAPH_METHODS}, got {method!r}")
    if method == "auto":
        method = "mi" if cats else "spearman"
    if method == "pearson":
        return _abs_correlation(arr)
    if method == "spearman":
        return _abs_correlation(rankdata(arr, axis=0))
    return _mutual_information(arr, cats, random_state)


def sparsify_graph(weights: object, mode: str | None = "knn", *, knn: int = 4,
                   threshold: float = 0.3) -> np.ndarray:
    """Sparsify a dense feature graph.

    Args:
        weights: ``[f, f]`` symmetric non-negative weights (e.g. from :func:`feature_graph`).
        mode: ``"knn"`` — each node keeps its ``knn`` largest-weight neighbours (ties: lower
            index first), and an edge survives if either endpoint kept it (``max(M, Mᵀ)``);
            ``"threshold"`` — keep edges with weight ``>= threshold``; ``None`` — keep all.
        knn: neighbours per node, ``1 <= knn <= f − 1``.
        threshold: minimum weight kept (same units as the weights).

    Returns:
        ``A [f, f]`` float64, symmetric, zero diagonal, weights of the kept edges.

    Raises:
        ValueError: non-square, asymmetric, negative or non-finite weights; ``knn`` out of range;
            unknown ``mode``.
    """
    w = np.array(weights.detach().cpu().numpy() if isinstance(weights, Tensor) else weights,
                 dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"table: weights must be square [f, f], got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("table: weights must be finite and non-negative")
    if np.abs(w - w.T).max(initial=0.0) > 1e-8:
        raise ValueError("table: weights must be symmetric")
    f = w.shape[0]
    np.fill_diagonal(w, 0.0)
    if mode is None:
        return w
    if mode == "threshold":
        return np.where(w >= threshold, w, 0.0)
    if mode != "knn":
        raise ValueError(f"table: sparsify must be 'knn', 'threshold' or None, got {mode!r}")
    if isinstance(knn, bool) or not isinstance(knn, (int, np.integer)) or not 1 <= knn <= f - 1:
        raise ValueError(f"table: knn must be an int in [1, {f - 1}] (features − 1), got {knn!r}")
    keep = np.zeros_like(w, dtype=bool)
    masked = w.copy()
    np.fill_diagonal(masked, -np.inf)  # never pick yourself
    order = np.argsort(-masked, axis=1, kind="stable")[:, :knn]
    keep[np.arange(f)[:, None], order] = True
    keep &= w > 0  # a zero weight is no edge
    keep |= keep.T
    return np.where(keep, w, 0.0)


def feature_hops(adjacency: object) -> np.ndarray:
    """All-pairs unweighted shortest-path hops of an undirected graph (``inf`` if unreachable).

    Args:
        adjacency: ``[f, f]``; a non-zero entry is an edge (its weight is ignored).

    Returns:
        ``[f, f]`` float64 hop counts, ``0`` on the diagonal, ``inf`` between components.
    """
    a = adjacency.detach().cpu().numpy() if isinstance(adjacency, Tensor) else np.asarray(adjacency)
    graph = sp.csr_matrix((np.asarray(a) != 0).astype(np.float64))
    return shortest_path(graph, method="D", directed=False, unweighted=True)


class Table(Coordinates):
    """Feature columns as tokens on a feature graph (units: positions dimensionless, hops).

    Tokens are ``[CLS]`` (index 0, when ``cls_token``) followed by the ``f`` feature columns in
    the order of the table. One graph serves every row, so positions are shared across the
    batch (``batch_size`` is None).

    * ``query_positions`` / ``key_positions``: ``[n_tokens, a]`` float32 with
      ``a = k + k_high``: the feature's entries in the ``k`` smallest non-trivial and the
      ``k_high`` largest Laplacian eigenvectors (sign convention of
      :func:`mmpe.coords.spectral.canonical_sign`); the ``[CLS]`` row is zero. Unscaled: the
      ``tabpet`` encoding applies ``alpha``.
    * ``distance(q, k)`` = ``relation(q, k)``: hops between the two features in the sparsified
      graph (float32); features in different components are ``f`` hops apart (one more than any
      path can be, its own value); ``[CLS]`` is ``cls_distance`` from every token (0 from
      itself).
    * ``extent``: the graph diameter (largest finite hop count, at least 1), FIRE's normaliser.

    Build it from training rows with :meth:`from_data`, or from a ready adjacency.

    Args:
        adjacency: ``[f, f]`` symmetric non-negative feature-graph weights (numpy, torch or
            scipy.sparse).
        k: low-frequency eigenvectors (``>= 0``).
        k_high: high-frequency eigenvectors (``>= 0``); ``1 <= k + k_high <= f − 1``.
        normalization: ``"sym"`` (``I − D^-½ A D^-½``, Tab-PET) or ``None`` (``D − A``).
        cls_token: prepend a ``[CLS]`` token.
        cls_distance: hops between ``[CLS]`` and any feature (``>= 0``).
        feature_names: optional column names (length ``f``), for reports.
        device: where the tensors live.

    Raises:
        ValueError: bad adjacency (see :func:`mmpe.coords.spectral.laplacian_eigenvectors`),
            ``k``/``k_high`` out of range, negative ``cls_distance``, wrong number of names.
    """

    kind = "table"
    directed = False

    def __init__(
        self,
        adjacency: object,
        *,
        k: int = 4,
        k_high: int = 0,
        normalization: str | None = "sym",
        cls_token: bool = False,
        cls_distance: float = 0.0,
        feature_names: Seq[str] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        a = adjacency.toarray() if sp.issparse(adjacency) else adjacency
        a = np.array(a.detach().cpu().numpy() if isinstance(a, Tensor) else a, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"Table: adjacency must be square [f, f], got {a.shape}")
        f = a.shape[0]
        if f < 2:
            raise ValueError(f"Table: a table needs at least 2 feature columns, got {f}")
        for arg, val in (("k", k), ("k_high", k_high)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 0:
                raise ValueError(f"Table: {arg} must be an int >= 0, got {val!r}")
        if not 1 <= k + k_high <= f - 1:
            raise ValueError(f"Table: k + k_high must lie in [1, {f - 1}] (features − 1 non-trivial "
                             f"eigenvectors exist), got k={k}, k_high={k_high}")
        if cls_distance < 0:
            raise ValueError(f"Table: cls_distance must be >= 0 (hops), got {cls_distance}")
        if feature_names is not None and len(feature_names) != f:
            raise ValueError(f"Table: feature_names must have {f} names, got {len(feature_names)}")
        np.fill_diagonal(a, 0.0)
        # All f − 1 non-trivial eigenpairs (ascending); take the k lowest and k_high highest.
        vals, vecs = laplacian_eigenvectors(a, f - 1, normalization)
        pick = list(range(k)) + list(range(f - 1 - k_high, f - 1))
        self.k, self.k_high, self.normalization = int(k), int(k_high), normalization
        self.cls_token, self.cls_distance = bool(cls_token), float(cls_distance)
        self.num_features = f
        self.feature_names = list(feature_names) if feature_names is not None else None
        hops = feature_hops(a)
        finite = np.isfinite(hops)
        self.diameter = float(max(1.0, hops[finite].max()))
        hops = np.where(finite, hops, float(f))
        c = int(self.cls_token)
        full = np.full((f + c, f + c), self.cls_distance)
        full[c:, c:] = hops
        if c:
            full[0, 0] = 0.0
        pos = np.zeros((f + c, len(pick)))
        pos[c:] = vecs[:, pick]
        self.adjacency = torch.as_tensor(a, dtype=torch.float32, device=device)
        self.eigenvalues = torch.as_tensor(vals[pick], dtype=torch.float32, device=device)
        self.hops = torch.as_tensor(full, dtype=torch.float32, device=device)
        self._positions = torch.as_tensor(pos, dtype=torch.float32, device=device)

    @classmethod
    def from_data(
        cls,
        X_train: object,
        *,
        method: str = "spearman",
        categorical: Seq[int] = (),
        sparsify: str | None = "knn",
        knn: int = 4,
        threshold: float = 0.3,
        random_state: int = 0,
        **options: object,
    ) -> Table:
        """Estimate the feature graph from training rows and build the coordinates.

        ``X_train`` must hold the training rows only (no validation/test rows: the encoding is
        then a function of the training data alone). Column names are taken from a pandas
        ``DataFrame``. ``method``/``categorical``/``random_state`` go to :func:`feature_graph`,
        ``sparsify``/``knn``/``threshold`` to :func:`sparsify_graph`, the other ``options``
        (``k``, ``k_high``, ``normalization``, ``cls_token``, ``cls_distance``, ``device``) to
        :class:`Table`.
        """
        if "feature_names" not in options and hasattr(X_train, "columns"):
            options["feature_names"] = [str(c) for c in X_train.columns]
        weights = feature_graph(X_train, method, categorical=categorical, random_state=random_state)
        adjacency = sparsify_graph(weights, sparsify, knn=knn, threshold=threshold)
        return cls(adjacency, **options)  # type: ignore[arg-type]

    def to(self, device: torch.device | str) -> Table:
        """The same coordinates with every tensor on ``device`` (a shallow copy)."""
        new = object.__new__(Table)
        new.__dict__.update(self.__dict__)
        for name in ("adjacency", "eigenvalues", "hops", "_positions"):
            setattr(new, name, getattr(self, name).to(device))
        return new

    @property
    def num_tokens(self) -> int:
        """``f`` plus one for ``[CLS]``."""
        return self.num_features + int(self.cls_token)

    @property
    def num_queries(self) -> int:
        return self.num_tokens


    @property
    def query_positions(self) -> Tensor:
        """``[n_tokens, k + k_high]`` Laplacian-eigenvector entries (``[CLS]`` row zero)."""
        return self._positions



    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hops between the tokens (undirected: same as :meth:`distance`), float32."""
        return self.hops[q_idx, kv_idx]

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hops between the tokens in the feature graph, float32 (see the class docstring)."""
        return self.hops[q_idx, kv_idx]

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The feature graph's diameter in hops (same for every query), float32."""
        return torch.full(q_idx.shape, self.diameter, dtype=torch.float32, device=q_idx.device)

    def __repr__(self) -> str:
        return (f"Table(features={self.num_features}, k={self.k}, k_high={self.k_high}, "
                f"normalization={self.normalization!r}, cls_token={self.cls_token}, "
                f"edges={int((self.adjacency > 0).sum()) // 2})")
