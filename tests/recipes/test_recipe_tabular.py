"""The tabular recipe: data loading without leakage, FT-Transformer tokens, a smoke run."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("sklearn", reason="scikit-learn (mmpe[data]) gives the data and reference values")

import torch
from mmpe.recipes import tabular
from mmpe.recipes.common import MissingDataError


def test_compare_spec_columns_are_the_tables():
    assert tabular.COMPARE.columns == list(tabular.DATASETS)
    assert tabular.COMPARE.coords == "table" and not tabular.COMPARE.lower_is_better
    assert "tabpet" in tabular.COMPARE.default_encodings and "nope" in tabular.COMPARE.default_encodings


@pytest.mark.parametrize("name,shape,classes", [
    ("breast_cancer", (569, 30), 2), ("wine", (178, 13), 3),
    ("image_segments", (2310, 18), 7), ("oj", (1070, 17), 2),
])
def test_real_tables_load(name, shape, classes):
    raw = tabular.load_table(name)
    assert raw["X"].shape == shape and np.isfinite(raw["X"]).all()
    assert len(raw["classes"]) == classes and set(np.unique(raw["y"])) == set(range(classes))
    assert len(raw["names"]) == shape[1]


def test_oj_categorical_columns_come_last_and_use_mutual_information():
    data = tabular.prepare("oj", 0, "auto", "knn", 4, 4, 2)
    assert data["num_numeric"] == 14 and data["cat_cardinalities"] == [6, 6, 3]  # + unknown code
    assert data["names"][-3:] == ["StoreID", "STORE", "Store7"]
    num, cat, y = data["train"]
    assert num.shape[1] == 14 and cat.shape[1] == 3 and cat.dtype == torch.long
    # StoreID and STORE carry the same information: MI links them
    adj = data["table"].adjacency
    assert adj[14, 15] > 0


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ISLP", None)
    with pytest.raises(MissingDataError, match=r"pip install --no-deps ISLP"):
        tabular.load_table("oj")
    with pytest.raises(ValueError, match="known tables"):
        tabular.load_table("iris2")


def test_prepare_is_fit_on_training_rows_only(monkeypatch):
    real = tabular.load_table("breast_cancer")
    split = tabular.split_indices(real["y"], 0)
    tampered = {**real, "X": real["X"].copy()}
    rows = np.r_[split["val"], split["test"]]
    tampered["X"][rows] = np.random.default_rng(1).normal(size=(len(rows), 30)) * 100
    prepare = tabular.prepare.__wrapped__  # bypass the cache
    monkeypatch.setattr(tabular, "load_table", lambda name: real)
    a = prepare("breast_cancer", 0, "spearman", "knn", 4, 4, 2)
    monkeypatch.setattr(tabular, "load_table", lambda name: tampered)
    b = prepare("breast_cancer", 0, "spearman", "knn", 4, 4, 2)
    assert torch.equal(a["table"].spectral_positions, b["table"].spectral_positions)
    assert torch.equal(a["table"].hops, b["table"].hops)
    assert torch.equal(a["train"][0], b["train"][0])  # the scaler saw training rows only
    assert not torch.equal(a["test"][0], b["test"][0])


def test_feature_tokenizer_matches_ft_transformer_formula():
    tok = tabular.FeatureTokenizer(2, [3, 4], d_token=5)
    x_num = torch.tensor([[0.5, -2.0]])
    x_cat = torch.tensor([[2, 1]])
    out = tok(x_num, x_cat)
    assert out.shape == (1, 5, 5)
    torch.testing.assert_close(out[0, 0], tok.cls[0, 0])
    torch.testing.assert_close(out[0, 1], 0.5 * tok.weight[0] + tok.bias[0])
    torch.testing.assert_close(out[0, 2], -2.0 * tok.weight[1] + tok.bias[1])
    torch.testing.assert_close(out[0, 3], tok.embed.weight[2] + tok.bias[2])
    torch.testing.assert_close(out[0, 4], tok.embed.weight[3 + 1] + tok.bias[3])


def test_smoke_run_one_tiny(tmp_path):
    out = tabular.run_one("tabpet", seed=0, out_dir=tmp_path, cli_args=[
        "--compare.datasets", "wine", "--trainer.max_epochs", "2"])
    assert 0.0 <= out["wine"] <= 1.0
    assert out["oj"] is None and out["breast_cancer"] is None
    assert set(out) == set(tabular.COMPARE.columns) and tabular.COMPARE.seeds == 5
    with pytest.raises(ValueError, match="--seeds"):
        tabular.run_one("tabpet", seed=0, out_dir=tmp_path, cli_args=["--compare.seeds", "2"])


@pytest.mark.slow
def test_one_seed_on_every_table_reaches_sane_accuracy(tmp_path):
    floors = {"breast_cancer": 0.9, "wine": 0.9, "image_segments": 0.9, "oj": 0.75}
    for enc in ("nope", "tabpet", "alibi"):
        out = tabular.run_one(enc, seed=0, out_dir=tmp_path / enc, cli_args=[])
        for table, floor in floors.items():
            assert out[table] >= floor, (enc, table, out[table])
