"""Tab-PET: scaled, standardised feature-graph eigenvectors concatenated to feature tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn", reason="scikit-learn (mmpe[data]) gives the data and reference values")

import torch
from sklearn.datasets import load_breast_cancer

import mmpe
from mmpe.coords import Sequence, Table
from mmpe.encodings.tabpet import TabPET, tabpet_table
from mmpe.transformer import Transformer


@pytest.fixture(scope="module")
def table() -> Table:
    return Table.from_data(load_breast_cancer().data[:300], k=4, k_high=2, cls_token=True)


def test_registry_metadata():
    entry = mmpe.registry.get("tabpet")
    assert entry.hook == "input" and entry.coords == ("table",) and not entry.learnable
    assert "Leng" in entry.paper
    assert mmpe.registry.get("tab_pet").name == "tabpet"


def test_concatenation_shapes_and_values(table):
    enc = mmpe.build("tabpet", d_model=32, width=8, alpha=0.5)
    assert enc.input_width == 24
    x = torch.randn(5, 31, 24)
    out = enc.combine(x, table)
    assert out.shape == (5, 31, 32)
    torch.testing.assert_close(out[..., :24], x)  # embeddings untouched
    pe = out[..., 24:]
    assert torch.all(pe[:, 0] == 0)  # [CLS] has no position
    assert torch.all(pe[..., 6:] == 0)  # k + k_high = 6 channels, 2 zero-padding channels
    # PE = alpha * z-scored eigenvectors (feature rows), identical for every row of the batch
    V = table.spectral_positions[1:].double()
    z = (V - V.mean(0)) / V.std(0)
    torch.testing.assert_close(pe[0, 1:, :6].double(), 0.5 * z, atol=1e-5, rtol=0)
    torch.testing.assert_close(pe[0], pe[4])


def test_alpha_scales_linearly_and_zero_is_the_baseline(table):
    p1 = TabPET(32, width=6, alpha=1.0)(table)
    p3 = TabPET(32, width=6, alpha=3.0)(table)
    torch.testing.assert_close(p3, 3 * p1)
    assert torch.count_nonzero(TabPET(32, width=6, alpha=0.0)(table)) == 0
    z = p1[1:]
    torch.testing.assert_close(z.mean(0), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0), torch.ones(6), atol=1e-5, rtol=0)


def test_raw_eigenvectors_and_clip():
    v = torch.tensor([[0.0, 1.0], [0.0, -1.0], [0.0, 100.0]])
    out = tabpet_table(v, 2.0, standardize=False, clip=10.0)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0], [0.0, -2.0], [0.0, 20.0]]))
    # a constant column keeps zero spread: centred but not divided by 0
    z = tabpet_table(torch.tensor([[3.0], [3.0]]), 1.0)
    assert torch.equal(z, torch.zeros(2, 1))


def test_projection_mode_keeps_d_model(table):
    enc = TabPET(32, width=8, project=True)
    assert enc.input_width == 32
    out = enc.combine(torch.randn(2, 31, 32), table)
    assert out.shape == (2, 31, 32)
    assert sum(p.numel() for p in enc.parameters()) == (32 + 8) * 32 + 32


def test_transformer_end_to_end_with_tabpet(table):
    model = Transformer(32, 4, 2, [{"name": "tabpet", "width": 8}])
    out = model(torch.randn(3, 31, 24), table)
    assert out.shape == (3, 31, 32) and torch.isfinite(out).all()


def test_errors(table):
    with pytest.raises(ValueError, match=r"x must be \[b, 31, 24\]"):
        TabPET(32, width=8).combine(torch.randn(2, 31, 32), table)
    with pytest.raises(ValueError, match="width=4"):
        TabPET(32, width=4)(table)  # 6 eigenvectors do not fit in 4 channels
    with pytest.raises(ValueError, match="width must be"):
        TabPET(32, width=32)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        TabPET(32, alpha=-1.0)
    with pytest.raises(TypeError, match=r"FeatureGraph.*spectral_positions"):
        TabPET(32)(Sequence(10))


def test_any_feature_graph_provider_works(table):
    """Tab-PET reads only the protocol: spectral_positions, and prefix_tokens when Prefixed."""
    from mmpe.coords.base import Coordinates
    from mmpe.coords.capabilities import FeatureGraph, Prefixed

    class Columns(Coordinates):  # a third-party table without a [CLS] token
        def __init__(self, positions):
            self.spectral_positions = positions

        num_queries = property(lambda self: self.spectral_positions.shape[0])

    assert isinstance(table, Prefixed) and table.prefix_tokens == 1
    cols = Columns(table.spectral_positions[1:])
    assert isinstance(cols, FeatureGraph) and not isinstance(cols, Prefixed)
    enc = TabPET(32, width=8, alpha=0.5)
    torch.testing.assert_close(enc(cols), enc(table)[1:])

