"""Table maths as pure functions: the feature graph of a table's columns (Tab-PET).

Tab-PET (Leng, Ghosh & Motani 2025, "Tab-PET: Graph-Based Positional Encodings for Tabular
Transformers", AAAI 2026, arXiv:2511.13338) gives the feature columns of a table a geometry: a
**feature graph** estimated from the *training rows only*, whose nodes are the columns and whose
edge weights measure how strongly two columns depend on each other. [`mmpe.coords.Table`][mmpe.coords.table.Table]
holds the result as coordinates; these functions compute it:

1. [`feature_graph`][mmpe.table_maths.feature_graph] — `W[i, j] = |ρ(x_i, x_j)|` with `ρ` Pearson
   ([`abs_pearson`][mmpe.table_maths.abs_pearson]) or Spearman ([`abs_spearman`][mmpe.table_maths.abs_spearman]) correlation, or the mutual
   information `I(x_i; x_j)` (nats; [`mutual_information`][mmpe.table_maths.mutual_information]) when columns are categorical.
   Diagonal 0.
2. [`sparsify_graph`][mmpe.table_maths.sparsify_graph] — keep each column's `knn` strongest neighbours (union:
   `A = max(M, Mᵀ)`), or the edges with `W >= threshold`, or everything (`None`; the
   dense association graph of the Tab-PET reference code).
3. [`feature_spectrum`][mmpe.table_maths.feature_spectrum] — Laplacian eigenvectors of `A`
   ([`mmpe.graph_maths.laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]; `L = I − D^-½ A D^-½` by default, as
   Tab-PET): the `k` smallest non-trivial eigenvectors and optionally the `k_high` largest
   (the Tab-PET reference concatenates low- and high-frequency eigenvectors).
4. [`feature_hops`][mmpe.table_maths.feature_hops] — unweighted shortest-path hops in `A` (`scipy.sparse.csgraph`).

Every function takes numpy arrays or torch tensors and returns float64 numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
from torch import Tensor

from mmpe._optional import require
from mmpe.graph_maths import laplacian_eigenvectors

__all__ = ["GRAPH_METHODS", "abs_pearson", "abs_spearman", "feature_graph", "feature_hops",
           "feature_spectrum", "mutual_information", "sparsify_graph"]

#: The ``method`` values `feature_graph` accepts.
GRAPH_METHODS = ("pearson", "spearman", "mi", "auto")


def _check_table(X: object, name: str = "X") -> np.ndarray:
    """`X` as a finite float64 `[n_rows, n_features]` array, or a clear error."""
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
    """`|Pearson(x_i, x_j)|` of the columns of a checked table (constant columns: 0)."""
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


def abs_pearson(X: object) -> np.ndarray:
    """`W[i, j] = |ρ_P(x_i, x_j)|`, the absolute Pearson correlation of the columns of `X`.

    A constant column correlates 0 with every other (not NaN); the diagonal is 0.

    Args:
        X: `[n_rows, n_features]` numbers (at least 3 rows and 2 columns, finite).

    Returns:
        `[n_features, n_features]` float64, symmetric, in `[0, 1]`.

    Raises:
        TypeError: non-numeric `X`.
        ValueError: `X` not 2-D, too few rows or columns, NaN/inf cells (named by column).
    """
    return _abs_correlation(_check_table(X))


def abs_spearman(X: object) -> np.ndarray:
    """The absolute Spearman correlation of every pair of columns.

    `W[i, j] = |ρ_S(x_i, x_j)|`: Pearson correlation of the columns' average ranks (ties
    share their mean rank, as `scipy.stats.spearmanr`); the association graph Tab-PET
    reports best (Leng et al. 2025). Same input rules and output as [`abs_pearson`][mmpe.table_maths.abs_pearson]."""
    return _abs_correlation(_ranks(_check_table(X)))


def _ranks(arr: np.ndarray) -> np.ndarray:
    """Column-wise average ranks `[n, f]` (ties share their mean rank)."""
    from scipy.stats import rankdata  # here, not at the top: scipy.stats is ~1 s of import

    return rankdata(arr, axis=0)


def mutual_information(X: object, categorical: Seq[int] = (), *, random_state: int = 0) -> np.ndarray:
    """Pairwise mutual information of the columns of `X` (nats), symmetrised.

    Row `j` of the raw matrix `M` estimates `I(x_j; x_i)` for all `i` with `x_j` as the
    target: scikit-learn's `mutual_info_classif` (categorical target, contingency / k-NN
    estimators) or `mutual_info_regression` (continuous target, Kraskov k-NN estimator), with
    `categorical` marked discrete. The result is `W = max((M + Mᵀ) / 2, 0)`, diagonal 0.

    Args:
        X: `[n_rows, n_features]` numbers; categorical columns as integer codes.
        categorical: indices of the categorical columns.
        random_state: seed of scikit-learn's estimators (they add tiny noise).

    Returns:
        `[n_features, n_features]` float64, symmetric, non-negative.

    Raises:
        TypeError / ValueError: as [`abs_pearson`][mmpe.table_maths.abs_pearson]; `categorical` indices out of range or
            repeated.
    """
    require("sklearn", "mutual_information")
    from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

    arr = _check_table(X)
    f = arr.shape[1]
    discrete = np.zeros(f, dtype=bool)
    discrete[_check_categorical(categorical, f)] = True
    mi = np.zeros((f, f))
    for j in range(f):
        if discrete[j]:
            mi[j] = mutual_info_classif(arr, arr[:, j].astype(np.int64), discrete_features=discrete,
                                        random_state=random_state)
        else:
            mi[j] = mutual_info_regression(arr, arr[:, j], discrete_features=discrete,
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
    """Dense association graph of the columns of `X` (Tab-PET's association-based graphs).

    Args:
        X: training rows only, `[n_rows, n_features]` numbers (categorical columns as integer
            codes). Never pass validation or test rows: the graph (and every encoding built on
            it) must not see them.
        method: `"pearson"` ([`abs_pearson`][mmpe.table_maths.abs_pearson]), `"spearman"` ([`abs_spearman`][mmpe.table_maths.abs_spearman]),
            `"mi"` ([`mutual_information`][mmpe.table_maths.mutual_information]), or `"auto"` (`"mi"` when `categorical`
            is non-empty, else `"spearman"`, the paper's best association graph).
        categorical: indices of categorical columns (discrete for the MI estimators).
        random_state: seed of scikit-learn's MI estimators.

    Returns:
        `W [n_features, n_features]` float64, symmetric, non-negative, zero diagonal.

    Raises:
        TypeError: non-numeric `X`.
        ValueError: `X` not 2-D, fewer than 3 rows or 2 columns, NaN/inf cells (the message
            names the columns), bad `categorical` indices, unknown `method`.
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
        return _abs_correlation(_ranks(arr))
    return mutual_information(arr, cats, random_state=random_state)


def _square_weights(weights: object, name: str = "weights") -> np.ndarray:
    import scipy.sparse as sp

    w = weights.toarray() if sp.issparse(weights) else weights
    w = np.array(w.detach().cpu().numpy() if isinstance(w, Tensor) else w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"table: {name} must be square [f, f], got {w.shape}")
    return w


def sparsify_graph(weights: object, mode: str | None = "knn", *, knn: int = 4,
                   threshold: float = 0.3) -> np.ndarray:
    """Sparsify a dense feature graph.

    Args:
        weights: `[f, f]` symmetric non-negative weights (e.g. from [`feature_graph`][mmpe.table_maths.feature_graph]).
        mode: `"knn"` — each node keeps its `knn` largest-weight neighbours (ties: lower
            index first), and an edge survives if either endpoint kept it (`max(M, Mᵀ)`);
            `"threshold"` — keep edges with weight `>= threshold`; `None` — keep all.
        knn: neighbours per node, `1 <= knn <= f − 1`.
        threshold: minimum weight kept (same units as the weights).

    Returns:
        `A [f, f]` float64, symmetric, zero diagonal, weights of the kept edges.

    Raises:
        ValueError: non-square, asymmetric, negative or non-finite weights; `knn` out of range;
            unknown `mode`.
    """
    w = _square_weights(weights)
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
    """All-pairs unweighted shortest-path hops of an undirected graph (`inf` if unreachable).

    Args:
        adjacency: `[f, f]` (numpy, torch or scipy.sparse); a non-zero entry is an edge (its
            weight is ignored; `A[i, j]` or `A[j, i]` non-zero joins `i` and `j`).

    Returns:
        `[f, f]` float64 hop counts (units: hops), `0` on the diagonal, `inf` between
            components.

    Raises:
        ValueError: `adjacency` not square.
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import shortest_path

    a = _square_weights(adjacency, "adjacency")
    graph = sp.csr_matrix((a != 0).astype(np.float64))
    return shortest_path(graph, method="D", directed=False, unweighted=True)


def feature_spectrum(adjacency: object, k: int, k_high: int = 0,
                     normalization: str | None = "sym") -> tuple[np.ndarray, np.ndarray]:
    """Tab-PET's positions: eigenpairs of the feature graph's Laplacian.

    Tab-PET's positions: the `k` smallest non-trivial and `k_high` largest Laplacian
    eigenpairs of the feature graph (Leng et al. 2025; eigenvectors of
    [`mmpe.graph_maths.laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors], deterministic signs).

    Args:
        adjacency: `[f, f]` symmetric non-negative weights (numpy, torch or scipy.sparse); the
            diagonal is ignored.
        k: low-frequency eigenpairs (`>= 0`).
        k_high: high-frequency eigenpairs (`>= 0`); `1 <= k + k_high <= f − 1`.
        normalization: `"sym"` (`I − D^-½ A D^-½`, Tab-PET) or `None` (`D − A`).

    Returns:
        `eigvals [k + k_high]` (ascending) and `eigvecs [f, k + k_high]` float64 (unit-norm
            columns): the `k` lowest, then the `k_high` highest.

    Raises:
        ValueError: `k`/`k_high` out of range; bad adjacency (see
            [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]).
    """
    a = _square_weights(adjacency, "adjacency")
    f = a.shape[0]
    if f < 2:
        raise ValueError(f"table: a feature graph needs at least 2 features, got {f}")
    for arg, val in (("k", k), ("k_high", k_high)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 0:
            raise ValueError(f"Table: {arg} must be an int >= 0, got {val!r}")
    if not 1 <= k + k_high <= f - 1:
        raise ValueError(f"Table: k + k_high must lie in [1, {f - 1}] (features − 1 non-trivial "
                         f"eigenvectors exist), got k={k}, k_high={k_high}")
    np.fill_diagonal(a, 0.0)
    # All f − 1 non-trivial eigenpairs (ascending); take the k lowest and k_high highest.
    vals, vecs = laplacian_eigenvectors(a, f - 1, normalization)
    pick = list(range(k)) + list(range(f - 1 - k_high, f - 1))
    return vals[pick], vecs[:, pick]
