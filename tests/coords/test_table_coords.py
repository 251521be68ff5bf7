"""Table coordinates: feature graphs, sparsification, Laplacian eigenvectors, hops, no leakage."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("sklearn", reason="scikit-learn (mmpe[data]) gives the data and reference values")

import scipy.stats
import torch
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

import mmpe
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.coords import Table, index_grid
from mmpe.coords.spectral import graph_laplacian
from mmpe.coords.table import feature_graph, feature_hops, sparsify_graph
from mmpe.encodings.base import AttentionCall


def _pearson_by_hand(x: np.ndarray, y: np.ndarray) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    vx = sum((a - mx) ** 2 for a in x)
    vy = sum((b - my) ** 2 for b in y)
    return cov / math.sqrt(vx * vy)


def test_pearson_graph_matches_hand_computed_correlations():
    X = np.array([[1.0, 2.0, 9.0], [2.0, 4.5, 7.0], [3.0, 5.0, 8.0], [4.0, 8.5, 1.0], [5.0, 9.0, 2.0]])
    W = feature_graph(X, "pearson")
    for i in range(3):
        assert W[i, i] == 0.0
        for j in range(3):
            if i != j:
                assert W[i, j] == pytest.approx(abs(_pearson_by_hand(X[:, i], X[:, j])), abs=1e-12)
    # a hand-checkable pair: column 1 = 2 * column 0 plus noise is strongly correlated
    assert W[0, 1] > 0.97


def test_spearman_graph_matches_scipy_on_wine():
    X = load_wine().data[:120]
    rho = scipy.stats.spearmanr(X).correlation
    expected = np.abs(rho)
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(feature_graph(X, "spearman"), expected, atol=1e-12)


def test_constant_column_is_isolated_not_nan():
    X = np.c_[np.arange(10.0), np.ones(10), np.arange(10.0) ** 2]
    W = feature_graph(X, "pearson")
    assert np.all(np.isfinite(W))
    assert W[1].sum() == 0 and W[:, 1].sum() == 0
    assert W[0, 2] > 0.9


def test_mutual_information_graph_matches_sklearn_and_is_symmetric():
    rng = np.random.default_rng(0)
    cat = rng.integers(0, 3, 200)
    num = cat * 2.0 + rng.normal(0, 0.3, 200)
    noise = rng.normal(size=200)
    X = np.c_[num, noise, cat]
    W = feature_graph(X, "mi", categorical=[2], random_state=0)
    disc = np.array([False, False, True])
    row0 = mutual_info_regression(X, X[:, 0], discrete_features=disc, random_state=0)
    row2 = mutual_info_classif(X, cat, discrete_features=disc, random_state=0)
    assert W[0, 2] == pytest.approx(max(0.0, (row0[2] + row2[0]) / 2), abs=1e-12)
    np.testing.assert_allclose(W, W.T)
    assert W[0, 2] > 0.5 > W[1, 2]  # the dependent pair beats the independent one
    assert feature_graph(X, "auto", categorical=[2], random_state=0) == pytest.approx(W)


def test_knn_and_threshold_sparsification_by_hand():
    W = np.array([[0.0, 0.9, 0.1, 0.5],
                  [0.9, 0.0, 0.2, 0.3],
                  [0.1, 0.2, 0.0, 0.8],
                  [0.5, 0.3, 0.8, 0.0]])
    A = sparsify_graph(W, "knn", knn=1)
    # nearest neighbours: 0->1, 1->0, 2->3, 3->2 ; union keeps exactly those two edges
    expected = np.zeros_like(W)
    expected[0, 1] = expected[1, 0] = 0.9
    expected[2, 3] = expected[3, 2] = 0.8
    np.testing.assert_array_equal(A, expected)
    A2 = sparsify_graph(W, "knn", knn=2)  # adds 0->3 (0.5), 1->3 (0.3), 2->1 (0.2), 3->0
    assert set(zip(*np.nonzero(np.triu(A2)), strict=True)) == {(0, 1), (0, 3), (1, 3), (1, 2), (2, 3)}
    T = sparsify_graph(W, "threshold", threshold=0.5)
    assert set(zip(*np.nonzero(np.triu(T)), strict=True)) == {(0, 1), (0, 3), (2, 3)}
    np.testing.assert_array_equal(sparsify_graph(W, None), W)


def test_hops_match_networkx_and_unreachable_is_its_own_value():
    W = feature_graph(load_breast_cancer().data[:300], "spearman")
    A = sparsify_graph(W, "knn", knn=2)
    hops = feature_hops(A)
    G = nx.from_numpy_array(A)
    for i, lengths in nx.all_pairs_shortest_path_length(G):
        for j, d in lengths.items():
            assert hops[i, j] == d
    # two components: 0-1 and 2-3
    A2 = np.zeros((4, 4))
    A2[0, 1] = A2[1, 0] = A2[2, 3] = A2[3, 2] = 1.0
    t = Table(A2, k=2, cls_token=True, cls_distance=1.0)
    assert t.hops.tolist() == [[0, 1, 1, 1, 1], [1, 0, 1, 4, 4], [1, 1, 0, 4, 4],
                               [1, 4, 4, 0, 1], [1, 4, 4, 1, 0]]
    assert t.extent(torch.tensor([0, 3])).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("normalization", ["sym", None])
def test_eigenvectors_are_orthonormal_laplacian_eigenpairs(normalization):
    X = load_breast_cancer().data[:300]
    t = Table.from_data(X, method="spearman", sparsify="knn", knn=4, k=5, k_high=3,
                        normalization=normalization)
    V = t.spectral_positions.double().numpy()  # [30, 8]
    lam = t.eigenvalues.double().numpy()
    L = graph_laplacian(t.adjacency.double().numpy(), normalization)
    L = L.toarray() if hasattr(L, "toarray") else L
    np.testing.assert_allclose(V.T @ V, np.eye(8), atol=1e-5)
    np.testing.assert_allclose(L @ V, V * lam, atol=1e-5)
    spectrum = np.linalg.eigvalsh(L)
    np.testing.assert_allclose(lam[:5], spectrum[1:6], atol=1e-5)
    np.testing.assert_allclose(lam[5:], spectrum[-3:], atol=1e-5)
    assert np.all(np.diff(lam) >= -1e-6)


def test_cls_token_gets_zero_position_and_prefix_index():
    X = load_wine().data[:100]
    plain = Table.from_data(X, k=3)
    with_cls = Table.from_data(X, k=3, cls_token=True)
    assert with_cls.num_tokens == plain.num_tokens + 1 == 14
    assert torch.all(with_cls.spectral_positions[0] == 0)
    torch.testing.assert_close(with_cls.spectral_positions[1:], plain.spectral_positions)
    torch.testing.assert_close(with_cls.hops[1:, 1:], plain.hops)
    assert with_cls.batch_size is None and with_cls.mask_mod() is None


def test_no_leakage_changing_test_rows_does_not_change_the_encoding():
    data = load_breast_cancer().data
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(data))
    train_idx, test_idx = perm[:400], perm[400:]

    def encode(X):
        t = Table.from_data(X[train_idx], method="spearman", knn=4, k=4, k_high=2, cls_token=True)
        return t.spectral_positions, t.hops

    pos, hops = encode(data)
    tampered = data.copy()
    tampered[test_idx] = rng.normal(size=tampered[test_idx].shape) * 1e3
    pos2, hops2 = encode(tampered)
    torch.testing.assert_close(pos, pos2, rtol=0, atol=0)
    torch.testing.assert_close(hops, hops2, rtol=0, atol=0)
    # while the same tampering on training rows does change it (the test can fail)
    leaky = data.copy()
    leaky[train_idx[:200]] = tampered[test_idx[:169]].repeat(2, axis=0)[:200]
    pos3, _ = encode(leaky)
    assert not torch.allclose(pos, pos3)


def test_bad_inputs_raise_clear_errors():
    X = load_wine().data[:50].copy()
    X[3, 5] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinite values in columns \[5\]"):
        Table.from_data(X)
    with pytest.raises(ValueError, match=r"shape \[n_rows, n_features\]"):
        feature_graph(np.zeros(10))
    with pytest.raises(ValueError, match="at least 2 feature columns"):
        feature_graph(np.zeros((10, 1)))
    with pytest.raises(TypeError, match="must hold numbers"):
        feature_graph(np.array([["a", "b"]] * 5))
    clean = load_wine().data[:50]
    with pytest.raises(ValueError, match=r"k \+ k_high must lie in \[1, 12\]"):
        Table.from_data(clean, k=10, k_high=3)
    with pytest.raises(ValueError, match=r"k must be an int >= 0"):
        Table.from_data(clean, k=-1)
    with pytest.raises(ValueError, match=r"knn must be an int in \[1, 12\]"):
        Table.from_data(clean, knn=13)
    with pytest.raises(ValueError, match="method must be one of"):
        feature_graph(clean, "kendall")
    with pytest.raises(ValueError, match="categorical column indices"):
        feature_graph(clean, "mi", categorical=[13])
    with pytest.raises(ValueError, match="square"):
        Table(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="non-negative"):
        Table(-np.ones((3, 3)), k=1)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_score_encodings_run_on_feature_graph_hops(name):
    t = Table.from_data(load_wine().data[:100], k=3, cls_token=True)
    enc = mmpe.build(name, num_heads=2)
    ctx = AttentionCall(t, num_heads=2, head_dim=8, batch=3)
    bias = dense_bias([enc], ctx)
    assert bias.shape == (1, 2, 14, 14)
    if name == "alibi":  # −m_h · hops
        b, h, q, k = index_grid(1, 2, 14, 14)
        expected = -enc.slopes[h] * t.hops[q, k]
        torch.testing.assert_close(bias, expected.expand_as(bias))
    attn = MultiHeadAttention(16, 2, [enc])
    out = attn(torch.randn(3, 14, 16), t)
    assert out.shape == (3, 14, 16) and torch.isfinite(out).all()
