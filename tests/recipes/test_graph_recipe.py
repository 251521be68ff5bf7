"""recipes/graph.py: helpers (fast) and a short training run (slow)."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs and reference values")

import torch
from mmpe.recipes import graph as recipe
from sklearn.metrics import mean_squared_error, r2_score


def test_alias_expansion() -> None:
    assert recipe.expand_encoding("rwse", {"k": 8}) == [{"name": "rwse", "k": 8}]
    assert recipe.expand_encoding("graphormer", {"graphormer": {"max_hops": 3}}) == [
        {"name": "graphormer", "max_hops": 3}, {"name": "graphormer_centrality"}]
    with pytest.raises(ValueError, match="alias"):
        recipe.expand_encoding("graphormer", {"k": 3})


def test_regression_metrics_match_sklearn() -> None:
    pred, target = torch.randn(50), torch.randn(50)
    m = recipe.regression_metrics(pred, target)
    assert m["rmse"] == pytest.approx(mean_squared_error(target, pred) ** 0.5, rel=1e-5)
    assert m["r2"] == pytest.approx(r2_score(target, pred), rel=1e-5)


def test_scaffold_split_keeps_scaffolds_together() -> None:
    from rdkit.Chem.Scaffolds import MurckoScaffold

    smiles = ["c1ccccc1O", "c1ccccc1N", "c1ccccc1C", "C1CCCCC1O", "C1CCCCC1N", "CCO", "CCN",
              "c1ccncc1", "c1ccncc1C", "O=C1CCCC1"]
    split = recipe.scaffold_split(smiles, (0.6, 0.2))
    assert split.tolist() == recipe.scaffold_split(smiles, (0.6, 0.2)).tolist()
    scaffold = [MurckoScaffold.MurckoScaffoldSmiles(smiles=s) for s in smiles]
    for s in set(scaffold):
        assert len({split[i] for i in range(len(smiles)) if scaffold[i] == s}) == 1
    assert (split == "train").sum() <= 6


def test_size_bucket_sampler_covers_every_molecule_once() -> None:
    sizes = torch.randint(1, 40, (203,)).tolist()
    batches = list(recipe.SizeBucketSampler(sizes, 16, pool=4, seed=1))
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(203)) and len(batches) == len(recipe.SizeBucketSampler(sizes, 16))
    spread = sum(max(sizes[i] for i in b) - min(sizes[i] for i in b) for b in batches) / len(batches)
    assert spread < 20  # sorted pools: similar sizes per batch


@pytest.mark.slow
def test_recipe_trains(tmp_path) -> None:
    out = recipe.run_one("graphormer", seed=0, out_dir=tmp_path,
                         cli_args=["--trainer.max_steps", "30", "--trainer.logger", "false",
                                   "--data.dataset", "solubility"])
    assert set(out) == set(recipe.COMPARE.columns) and out["freesolv rmse"] is None
    assert 0 < out["solubility rmse"] < 3 and out["solubility r2"] > 0
