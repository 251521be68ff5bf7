"""mmpe.table_maths: feature graphs as pure functions, checked against numpy, scipy, sklearn and
networkx on random tables (hypothesis) and by hand."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn (mmpe[data]) gives the data and reference values")

import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

import mmpe.coords.table
from mmpe import table_maths as tm
from mmpe.graph_maths import graph_laplacian

FAST = settings(max_examples=30, deadline=None)


@st.composite
def tables(draw, max_rows: int = 25, max_features: int = 6):
    """Random ``[n, f]`` tables: small integers (ties) or floats, sometimes a constant column."""
    n = draw(st.integers(3, max_rows))
    f = draw(st.integers(2, max_features))
    if draw(st.booleans()):
        X = draw(arrays(np.float64, (n, f), elements=st.integers(-3, 3).map(float)))
    else:
        X = draw(arrays(np.float64, (n, f), elements=st.floats(-1e3, 1e3, allow_nan=False,
                                                                width=32)))
    if draw(st.booleans()):
        X[:, draw(st.integers(0, f - 1))] = draw(st.floats(-5, 5, width=32))
    return X


@st.composite
def weights(draw, max_features: int = 9):
    f = draw(st.integers(2, max_features))
    w = draw(arrays(np.float64, (f, f), elements=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 1.0])))
    w = np.triu(w, 1)
    return w + w.T


def constant(X: np.ndarray) -> np.ndarray:
    xc = X - X.mean(0)
    return np.sqrt((xc**2).sum(0)) <= 1e-12 * max(1.0, float(np.abs(X).max()))


def check_graph(W: np.ndarray, f: int) -> None:
    assert W.shape == (f, f) and np.all(np.isfinite(W)) and np.all(W >= 0)
    np.testing.assert_allclose(W, W.T, atol=1e-12)
    assert np.all(np.diag(W) == 0)


# ---------------------------------------------------------------- association graphs
@FAST
@given(tables())
def test_abs_pearson_matches_numpy(X: np.ndarray) -> None:
    W = tm.abs_pearson(X)
    f = X.shape[1]
    check_graph(W, f)
    assert np.all(W <= 1)
    const = constant(X)
    live = ~const
    ref = np.abs(np.corrcoef(X[:, live], rowvar=False)) if live.sum() > 1 else np.zeros((0, 0))
    if live.sum() > 1:
        np.fill_diagonal(ref, 0)
        np.testing.assert_allclose(W[np.ix_(live, live)], ref, atol=1e-9)
    assert np.all(W[const] == 0) and np.all(W[:, const] == 0)  # a constant column is isolated
    np.testing.assert_array_equal(tm.feature_graph(X, "pearson"), W)


@FAST
@given(tables())
def test_abs_spearman_matches_scipy(X: np.ndarray) -> None:
    W = tm.abs_spearman(torch.from_numpy(X))
    check_graph(W, X.shape[1])
    live = ~constant(scipy.stats.rankdata(X, axis=0))
    if live.sum() > 1:
        rho = scipy.stats.spearmanr(X[:, live]).statistic
        ref = np.abs(np.atleast_2d(rho)) if live.sum() > 2 else np.array([[1, abs(rho)], [abs(rho), 1]])
        np.fill_diagonal(ref, 0)
        np.testing.assert_allclose(W[np.ix_(live, live)], ref, atol=1e-9)
    np.testing.assert_array_equal(tm.feature_graph(X, "spearman"), W)
    np.testing.assert_array_equal(tm.feature_graph(X, "auto"), W)  # no categorical columns


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16), st.integers(40, 80))
def test_mutual_information_matches_sklearn(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, 3, n)
    X = np.c_[cat * 1.5 + rng.normal(0, 0.5, n), rng.normal(size=n), cat]
    W = tm.mutual_information(X, categorical=[2], random_state=seed % 7)
    check_graph(W, 3)
    disc = np.array([False, False, True])
    rows = [mutual_info_regression(X, X[:, 0], discrete_features=disc, random_state=seed % 7),
            mutual_info_regression(X, X[:, 1], discrete_features=disc, random_state=seed % 7),
            mutual_info_classif(X, cat, discrete_features=disc, random_state=seed % 7)]
    raw = np.stack(rows)
    ref = np.clip((raw + raw.T) / 2, 0, None)
    np.fill_diagonal(ref, 0)
    np.testing.assert_allclose(W, ref, atol=1e-12)
    np.testing.assert_allclose(tm.feature_graph(X, "auto", categorical=[2], random_state=seed % 7), W)


# ---------------------------------------------------------------- sparsification
@FAST
@given(weights(), st.integers(1, 8))
def test_knn_sparsification_keeps_each_nodes_strongest_edges(W: np.ndarray, knn: int) -> None:
    f = W.shape[0]
    knn = min(knn, f - 1)
    A = tm.sparsify_graph(W, "knn", knn=knn)
    check_graph(A, f)
    assert np.all((A == 0) | (A == W))  # a subset of the edges, weights kept
    for i in range(f):
        others = [j for j in range(f) if j != i]
        # the knn strongest (ties: lower index) positive neighbours of i survive
        ranked = sorted(others, key=lambda j: (-W[i, j], j))[:knn]
        assert all(A[i, j] > 0 for j in ranked if W[i, j] > 0)
        # a surviving edge was among the picks of one of its endpoints
        for j in others:
            if A[i, j] > 0:
                picks_j = sorted([u for u in range(f) if u != j], key=lambda u: (-W[j, u], u))[:knn]
                assert j in ranked or i in picks_j


@FAST
@given(weights(), st.sampled_from([0.1, 0.3, 0.5, 0.9]))
def test_threshold_and_dense_sparsification(W: np.ndarray, threshold: float) -> None:
    np.testing.assert_array_equal(tm.sparsify_graph(W, "threshold", threshold=threshold),
                                  np.where(W >= threshold, W, 0))
    np.testing.assert_array_equal(tm.sparsify_graph(torch.from_numpy(W), None), W)


# ---------------------------------------------------------------- hops and spectrum
@FAST
@given(weights())
def test_feature_hops_match_networkx(A: np.ndarray) -> None:
    hops = tm.feature_hops(A)
    f = A.shape[0]
    g = nx.Graph()
    g.add_nodes_from(range(f))
    g.add_edges_from(zip(*np.nonzero(A), strict=True))
    np.testing.assert_array_equal(hops, nx.floyd_warshall_numpy(g, nodelist=range(f)))


@FAST
@given(weights(), st.integers(0, 4), st.integers(0, 3), st.sampled_from(["sym", None]))
def test_feature_spectrum_picks_low_and_high_eigenpairs(A, k: int, k_high: int, normalization) -> None:
    f = A.shape[0]
    if not 1 <= k + k_high <= f - 1:
        with pytest.raises(ValueError, match=r"k \+ k_high must lie"):
            tm.feature_spectrum(A, k, k_high, normalization)
        return
    vals, vecs = tm.feature_spectrum(A, k, k_high, normalization)
    lap = graph_laplacian(A, normalization)
    lap = lap.toarray() if hasattr(lap, "toarray") else lap
    spectrum = np.linalg.eigvalsh(lap)
    assert vals.shape == (k + k_high,) and vecs.shape == (f, k + k_high)
    np.testing.assert_allclose(vals[:k], spectrum[1:k + 1], atol=1e-8)
    np.testing.assert_allclose(vals[k:], spectrum[f - k_high:], atol=1e-8)
    np.testing.assert_allclose(lap @ vecs, vecs * vals, atol=1e-8)
    np.testing.assert_allclose(vecs.T @ vecs, np.eye(k + k_high), atol=1e-8)
    table = mmpe.coords.Table(A, k=k, k_high=k_high, normalization=normalization)
    torch.testing.assert_close(table.spectral_positions, torch.as_tensor(vecs, dtype=torch.float32))


def test_table_module_re_exports_the_functions() -> None:
    for name in ("feature_graph", "sparsify_graph", "feature_hops", "feature_spectrum",
                 "abs_pearson", "abs_spearman", "mutual_information", "GRAPH_METHODS"):
        assert getattr(mmpe.coords.table, name) is getattr(tm, name)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, err, match", [
    (lambda: tm.abs_pearson(np.zeros(5)), ValueError, r"X must have shape \[n_rows, n_features\]"),
    (lambda: tm.abs_spearman(np.zeros((2, 3))), ValueError, "at least 3 training rows"),
    (lambda: tm.abs_pearson(np.array([["a", "b"]] * 4)), TypeError, "X must hold numbers"),
    (lambda: tm.mutual_information(np.zeros((5, 2)), categorical=[2]), ValueError, "categorical column"),
    (lambda: tm.feature_graph(np.zeros((5, 2)), "kendall"), ValueError, "method must be one of"),
    (lambda: tm.sparsify_graph(np.zeros((2, 3))), ValueError, "weights must be square"),
    (lambda: tm.sparsify_graph(np.array([[0, 1.0], [0, 0]])), ValueError, "symmetric"),
    (lambda: tm.sparsify_graph(np.zeros((3, 3)), "knn", knn=3), ValueError, "knn must be"),
    (lambda: tm.sparsify_graph(np.zeros((3, 3)), "top"), ValueError, "sparsify must be"),
    (lambda: tm.feature_hops(np.zeros((2, 3))), ValueError, "adjacency must be square"),
    (lambda: tm.feature_spectrum(np.ones((3, 3)), -1), ValueError, "k must be an int >= 0"),
    (lambda: tm.feature_spectrum(-np.ones((3, 3)), 1), ValueError, "non-negative"),
])
def test_bad_input_names_the_argument(call, err, match) -> None:
    with pytest.raises(err, match=match):
        call()
