"""mmpe.plot and `mmpe plot`: every figure kind is drawn from real encodings into a PNG that is
not blank, and the numbers behind the figures are the encodings' own."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mmpe
from mmpe import plot
from mmpe.cli import main
from mmpe.functional import alibi_slopes

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

from mmpe.attention import dense_bias


def assert_png(path: Path, min_kb: float = 8) -> None:
    """A PNG that exists, has some size, and shows something: grey levels vary and some pixels
    are coloured (lines, heatmaps), not only black axes on white."""
    path = Path(path)
    assert path.is_file(), path
    assert path.stat().st_size > min_kb * 1024, (path, path.stat().st_size)
    rgb = imread(path)[..., :3]
    assert rgb.std() > 0.05, f"{path} is blank"
    coloured = (rgb.max(-1) - rgb.min(-1)) > 0.2
    assert coloured.mean() > 0.005, f"{path} has no coloured content"


def line_data(fig, i: int = 0) -> tuple[np.ndarray, np.ndarray]:
    line = fig.axes[0].lines[i]
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


# -- input encodings -----------------------------------------------------------------------
def test_input_matrix_and_similarity_sinusoidal(tmp_path):
    enc = mmpe.build("sinusoidal", d_model=64)
    coords = mmpe.Sequence(96)
    fig = plot.plot_input_matrix(enc, coords, path=tmp_path / "m.png")
    assert_png(tmp_path / "m.png")
    shown = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(shown, enc(coords).numpy())
    assert shown.shape == (96, 64)  # positions × dimensions

    fig = plot.plot_similarity("sinusoidal", coords, context={"d_model": 64},
                               path=tmp_path / "s.png")
    assert_png(tmp_path / "s.png")
    sim = np.asarray(fig.axes[0].images[0].get_array())
    assert sim.shape == (96, 96)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    np.testing.assert_allclose(sim, sim.T, atol=1e-6)
    # Sinusoidal: similarity depends on the offset only (a Toeplitz matrix), highest at 0.
    np.testing.assert_allclose(sim[10, 20], sim[50, 60], atol=1e-4)
    assert sim[40, 41] > sim[40, 60]


@pytest.mark.parametrize("name", ["learned_grid", "sincos"])
def test_similarity_maps_on_a_grid(tmp_path, name):
    h, w = 5, 6
    grid = mmpe.Grid((h, w), prefix_tokens=1)
    enc = mmpe.build(name, context={"d_model": 32, "grid_shape": (h, w), "prefix_tokens": 1})
    fig = plot.plot_similarity(enc, grid, path=tmp_path / f"{name}.png")
    assert_png(tmp_path / f"{name}.png")
    mosaic = np.asarray(fig.axes[0].images[0].get_array().filled(np.nan))
    assert mosaic.shape == (h * (h + 1) - 1, w * (w + 1) - 1)  # ViT Fig. 7: a map per patch
    pe = enc(grid)[1:].detach()  # the cls token is left out
    pe = pe / pe.norm(dim=-1, keepdim=True)
    for i, j in [(0, 0), (2, 3), (4, 5)]:
        block = mosaic[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w]
        assert block[i, j] == pytest.approx(1.0, abs=1e-5)  # each patch is most like itself
        expect = (pe @ pe[i * w + j]).reshape(h, w).numpy()
        np.testing.assert_allclose(block, expect, atol=1e-5)
    assert np.isnan(mosaic[h, :]).all()  # gaps between the maps


# -- score encodings -----------------------------------------------------------------------
def test_bias_vs_distance_alibi_slopes(tmp_path):
    fig = plot.plot_bias_vs_distance("alibi", 64, num_heads=8, path=tmp_path / "alibi.png")
    assert_png(tmp_path / "alibi.png")
    assert len(fig.axes[0].lines) == 8
    for h, slope in enumerate(alibi_slopes(8).tolist()):
        x, y = line_data(fig, h)
        np.testing.assert_array_equal(x, np.arange(65))
        np.testing.assert_allclose(y, -slope * x, rtol=1e-5, atol=1e-7)


def test_bias_vs_distance_t5_buckets_and_kerple(tmp_path):
    t5 = mmpe.build("t5", num_heads=4)
    with torch.no_grad():
        t5.table.copy_(torch.randn(t5.table.shape, generator=torch.Generator().manual_seed(0)))
    fig = plot.plot_bias_vs_distance(t5, 200, path=tmp_path / "t5.png")
    assert_png(tmp_path / "t5.png")
    x, y = line_data(fig, 2)
    buckets = mmpe.functional.t5_bucket(-torch.as_tensor(x).long(), False, 32, 128)
    np.testing.assert_allclose(y, t5.table[buckets, 2].detach().numpy(), rtol=1e-6)
    assert np.all(y[x >= 128] == y[-1])  # one bucket past max_distance

    kerple = mmpe.build("kerple_log", num_heads=4)
    fig = plot.plot_bias_vs_distance(kerple, path=tmp_path / "kerple.png")
    assert_png(tmp_path / "kerple.png")
    r1, r2 = (t.detach().numpy() for t in kerple.constrained())
    x, y = line_data(fig, 1)
    np.testing.assert_allclose(y, -r1[1] * np.log1p(r2[1] * x), rtol=1e-5)


@pytest.mark.parametrize("name", ["fire", "t5", "kerple_power"])
def test_the_drawn_bias_is_the_dense_bias_door(tmp_path, monkeypatch, name):
    """The figures read the bias through `dense_bias`, the numbers the attention layers add,
    not an evaluation of their own (FIRE's generic and fast forms differ in the last bit)."""
    from mmpe.plot import figures

    enc = mmpe.build(name, num_heads=4)
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    calls = []

    def door(scores, ctx):
        calls.append(type(ctx.coords).__name__)
        return dense_bias(scores, ctx)

    monkeypatch.setattr(figures, "dense_bias", door)
    fig = plot.plot_bias_row(enc, query=40, path=tmp_path / "row.png")
    assert calls == ["Sequence"]
    coords = mmpe.Sequence(41, causal=True)
    with torch.no_grad():
        expect = dense_bias([enc], mmpe.encodings.base.AttentionCall(coords, 4, 8, 1))
    for h in range(4):
        np.testing.assert_array_equal(line_data(fig, h)[1], expect[0, h, 40].numpy())
    grid = mmpe.Grid((3, 4), prefix_tokens=1)
    bias, allowed = figures._score_terms("t", enc, grid, 4)
    with torch.no_grad():
        expect = dense_bias([enc], mmpe.encodings.base.AttentionCall(grid, 4, 8, 1))
    np.testing.assert_array_equal(bias, expect[0].numpy())
    assert allowed.all() and calls[-1] == "Grid"


def test_bias_on_a_grid_is_averaged_per_distance_and_rows_are_maps(tmp_path):
    grid = mmpe.Grid((6, 6))
    fig = plot.plot_bias_vs_distance("alibi", grid, num_heads=4, path=tmp_path / "b.png")
    assert_png(tmp_path / "b.png")
    x, y = line_data(fig, 0)
    assert x[0] == 0 and x[-1] == pytest.approx(math.hypot(5, 5), rel=1e-5)
    np.testing.assert_allclose(y, -alibi_slopes(4)[0].item() * x, rtol=1e-5, atol=1e-6)
    fig = plot.plot_bias_row("alibi", grid, num_heads=4, path=tmp_path / "r.png")
    assert_png(tmp_path / "r.png")
    head0 = np.asarray(fig.axes[0].images[0].get_array())
    assert head0.shape == (6, 6) and head0[3, 3] == 0 and head0[0, 0] < head0[2, 2]


@pytest.fixture(scope="module")
def fire_checkpoint(tmp_path_factory):
    """A few steps of an mmpe.Transformer with FIRE on random data, saved Lightning-style."""
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 4, 2, ["fire"])
    coords = mmpe.Sequence(48, causal=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    x, target = torch.randn(4, 48, 32), torch.randn(4, 48, 32)
    for _ in range(6):
        loss = torch.nn.functional.mse_loss(model(x, coords), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = {f"transformer.{k}": v for k, v in model.state_dict().items()}
    path = tmp_path_factory.mktemp("ckpt") / "fire.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"encoding": "fire", "num_heads": 4,
                                                          "d_model": 32}}, path)
    return path, model.blocks[0].attn.scores[0]


def test_bias_row_from_a_trained_fire_checkpoint(tmp_path, fire_checkpoint):
    path, trained = fire_checkpoint
    fresh = mmpe.build("fire", num_heads=4)
    assert not torch.equal(fresh.mlp[2].weight, trained.mlp[2].weight)  # training moved it
    prefix = "transformer.shared_encodings.0"
    for given in (prefix, None):  # explicit, and found by the parameter names
        enc = plot.load_encoding("fire", path, given)  # num_heads from hyper_parameters
        for a, b in zip(enc.state_dict().values(), trained.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b)
    fig = plot.plot_bias_row("fire", query=128, checkpoint=path, prefix=prefix,
                             path=tmp_path / "fire_row.png")
    assert_png(tmp_path / "fire_row.png")
    assert len(fig.axes[0].lines) == 4 + 1  # a line per head, the query marker
    x, y = line_data(fig, 3)
    np.testing.assert_array_equal(x, np.arange(129))
    coords = mmpe.Sequence(129, causal=True)
    ctx = mmpe.encodings.base.AttentionCall(coords, 4, 8, 1)
    expect = dense_bias([trained], ctx)[0, 3, 128].detach().numpy()
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-5)

    with pytest.raises(ValueError, match="no tensors under"):
        plot.load_encoding("fire", path, "transformer.blocks.9.attn")
    with pytest.raises(ValueError, match="do not fit"):
        plot.load_encoding("fire", path, prefix, context={"num_heads": 2})
    with pytest.raises(ValueError, match="no module"):
        plot.load_encoding("t5", path)


def test_load_encoding_builds_with_the_saved_settings(tmp_path):
    t5 = mmpe.build("t5", num_heads=2, max_distance=64)
    with torch.no_grad():
        t5.table.normal_()
    state = {f"model.bias.{k}": v for k, v in t5.state_dict().items()}
    assert "model.bias.settings.max_distance" in state
    torch.save({"state_dict": state}, tmp_path / "t5.ckpt")
    loaded = plot.load_encoding("t5", tmp_path / "t5.ckpt", context={"num_heads": 2})
    assert loaded.max_distance == 64  # not the default 128: read from the saved settings
    torch.testing.assert_close(loaded.table, t5.table)
    # A checkpoint from before settings were saved loads too (unchecked), with what is given.
    old = {k: v for k, v in state.items() if ".settings." not in k}
    torch.save({"state_dict": old}, tmp_path / "old.ckpt")
    loaded = plot.load_encoding("t5", tmp_path / "old.ckpt", context={"num_heads": 2},
                                max_distance=64)
    torch.testing.assert_close(loaded.table, t5.table)
    with pytest.raises(ValueError, match="max_distance"):  # a contradicting explicit option
        plot.load_encoding("t5", tmp_path / "t5.ckpt", context={"num_heads": 2}, max_distance=32)


# -- rotary encodings ----------------------------------------------------------------------
def test_rotary_decay_rope_and_its_scalings(tmp_path):
    names = ["rope", "rope_pi", "rope_ntk", "rope_yarn"]
    fig = plot.plot_rotary_decay(names, 512, head_dim=64,
                                 context={"original_max_position_embeddings": 128},
                                 path=tmp_path / "decay.png")
    assert_png(tmp_path / "decay.png")
    lines = {ln.get_label().split(" ")[0]: ln for ln in fig.axes[0].lines if ln.get_label()[0] != "_"}
    assert sorted(lines) == sorted(names)
    d = np.arange(513)
    theta = 10000.0 ** (-np.arange(32) / 32)
    rope = np.asarray(lines["rope"].get_ydata())
    # x = 1: <R_m x, R_n x> = sum_i 2 cos((m − n) θ_i), divided by h_d.
    np.testing.assert_allclose(rope, np.cos(np.outer(d, theta)).sum(1) / 32, atol=1e-5)
    pi = np.asarray(lines["rope_pi"].get_ydata())
    np.testing.assert_allclose(pi[::4][:100], rope[:100], atol=1e-5)  # PI: positions / 4
    yarn = mmpe.build("rope_yarn", head_dim=64, original_max_position_embeddings=128)
    assert lines["rope_yarn"].get_ydata()[0] == pytest.approx(yarn.attention_scaling ** 2, rel=1e-5)
    assert rope[0] == pytest.approx(1.0) and rope[200:].mean() < 0.5 * rope[:8].mean()  # decays
    random = plot.plot_rotary_decay("rope", 64, head_dim=32, qk="random", samples=8)
    assert random.axes[0].lines[0].get_ydata()[0] > 0.5


# -- the sphere and graphs -----------------------------------------------------------------
def test_sphere_map_of_spherical_harmonics(tmp_path):
    enc = mmpe.build("spherical_harmonics", d_model=16, max_degree=3)
    fig = plot.plot_sphere(enc, n_lat=30, n_lon=60, components=[1, 2, 3], features=True,
                           path=tmp_path / "sh.png")
    assert_png(tmp_path / "sh.png")
    y10 = np.asarray(fig.axes[2 * 1].images[0].get_array())  # Y_1^0 ∝ sin(latitude)
    lat = np.deg2rad(-90 + (np.arange(30) + 0.5) * 6)
    np.testing.assert_allclose(y10[:, 0], math.sqrt(3 / (4 * math.pi)) * np.sin(lat), atol=1e-5)
    np.testing.assert_allclose(y10, y10[:, :1].repeat(60, 1), atol=1e-6)  # no longitude
    plot.plot_sphere(enc, mmpe.Sphere.grid(20, 40), path=tmp_path / "out.png")
    assert_png(tmp_path / "out.png")
    with pytest.raises(ValueError, match="Sphere.grid"):
        plot.plot_sphere(enc, mmpe.Sequence(4))


def test_molecule_coloured_by_laplacian_eigenvectors(tmp_path):
    pytest.importorskip("rdkit")
    smiles = "CC(=O)Nc1ccc(O)cc1"  # paracetamol
    fig = plot.plot_graph_eigenvectors(smiles, encoding="lappe", path=tmp_path / "g.png")
    assert_png(tmp_path / "g.png")
    graph = plot.molecule_graph(smiles)
    vecs, _ = graph.laplacian_pe(8)  # lappe's k and normalisation
    first = fig.axes[0].collections[0].get_array()
    np.testing.assert_allclose(first, vecs[0, :, 0].numpy(), atol=1e-5)
    pytest.importorskip("networkx")
    fig = plot.plot_graph_eigenvectors(graph, 3, path=tmp_path / "nx.png")
    assert_png(tmp_path / "nx.png")
    assert len(fig.axes) == 3 + 1  # three panels and the colour bar
    with pytest.raises(ValueError, match="SMILES"):
        plot.plot_graph_eigenvectors("not a molecule((")


# -- errors and the command line -----------------------------------------------------------
def test_wrong_encoding_for_a_figure_is_named():
    with pytest.raises(ValueError, match="rope is a rotary encoding; plot_input_matrix needs an input"):
        plot.plot_input_matrix("rope", context={"head_dim": 8})
    with pytest.raises(ValueError, match="alibi is a score encoding"):
        plot.plot_rotary_decay(["rope", "alibi"], 16, context={"num_heads": 4})
    with pytest.raises(ValueError, match="shaw"):
        plot.plot_bias_vs_distance(mmpe.build("shaw", head_dim=8), 16, num_heads=2)
    with pytest.raises(KeyError, match="Did you mean 'alibi'"):
        plot.plot_bias_vs_distance("alibii", 16)


def test_cli_writes_every_kind(tmp_path, capsys, fire_checkpoint):
    out = tmp_path / "plots"
    runs = [
        (["sinusoidal", "--length", "64"], ["sinusoidal_matrix", "sinusoidal_similarity"]),
        (["learned_grid", "--grid", "6", "6", "--d-model", "32"], ["learned_grid_similarity"]),
        (["alibi", "--heads", "4", "--length", "32"], ["alibi_bias"]),
        (["rope,rope_pi,rope_ntk,rope_yarn", "--length", "256", "--head-dim", "32",
          "--option", "original_max_position_embeddings=64"], ["rope+rope_pi+rope_ntk+rope_yarn_decay"]),
        (["fire", "--checkpoint", str(fire_checkpoint[0]), "--prefix",
          "transformer.shared_encodings.0", "--query", "64"], ["fire_row", "fire_bias"]),
        (["spherical_harmonics", "--features", "--option", "max_degree=2"],
         ["spherical_harmonics_sphere"]),
        (["sinusoidal", "--kind", "matrix", "--length", "16"], ["sinusoidal_matrix"]),
    ]
    if __import__("importlib").util.find_spec("rdkit"):
        runs.append((["lappe", "--option", "k=3"], ["lappe_graph", "lappe_matrix"]))
    for argv, stems in runs:
        assert main(["plot", *argv, "--out", str(out)]) == 0, argv
        printed = capsys.readouterr().out.split()
        assert printed == [str(out / f"{s}.png") for s in stems]
        for p in printed:
            assert_png(Path(p), min_kb=5)


def test_cli_reads_an_input_encoding_from_a_checkpoint(tmp_path, capsys):
    """A ViT-style checkpoint: the learned grid table's size comes from image/patch size."""
    enc = mmpe.build("learned_grid", d_model=16, grid_shape=(4, 4))
    state = {f"transformer.input_encodings.0.{k}": v for k, v in enc.state_dict().items()}
    ckpt = tmp_path / "vit.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"encoding": "learned_grid",
                "image_size": 28, "patch_size": 7, "d_model": 16}}, ckpt)
    assert main(["plot", "learned_grid", "--checkpoint", str(ckpt), "--grid", "4", "4",
                 "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "learned_grid_similarity.png")]
    assert_png(tmp_path / "learned_grid_similarity.png")
    fig = plot.plot_similarity(plot.load_encoding("learned_grid", ckpt), mmpe.Grid((4, 4)))
    mosaic = np.asarray(fig.axes[0].images[0].get_array().filled(np.nan))
    table = enc.table.detach()
    table = table / table.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(mosaic[:4, 5:9], (table @ table[1]).reshape(4, 4), atol=1e-5)


def test_cli_errors(tmp_path, capsys):
    assert main(["plot", "alibii", "--out", str(tmp_path)]) == 2
    assert "Did you mean 'alibi'" in capsys.readouterr().err
    assert main(["plot", "rope", "--kind", "matrix", "--out", str(tmp_path)]) == 2
    assert "rope is a rotary encoding" in capsys.readouterr().err
    assert main(["plot", "nope", "--out", str(tmp_path)]) == 2
    assert "kernel encoding" in capsys.readouterr().err
    assert main(["plot", "alibi", "--option", "colour=red", "--out", str(tmp_path)]) == 2
    assert "colour" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


SIZE_FLAGS = {"d_model": ("--d-model", "d_model"), "num_heads": ("--heads", "heads"),
              "head_dim": ("--head-dim", "head_dim")}


@pytest.mark.parametrize("key", sorted(SIZE_FLAGS))
def test_a_size_no_drawn_encoding_takes_is_refused_for_every_encoding(tmp_path, key):
    """`--d-model`, `--heads`, `--head-dim` given to an encoding that has no such size (ALiBi's
    d_model, a sinusoid's heads) is refused by name before anything is drawn, never dropped;
    over every registered encoding but the kernels (nothing to plot)."""
    from mmpe import registry
    from mmpe.plot.command import plot_command

    flag, argument = SIZE_FLAGS[key]
    refused = 0
    for entry in registry.available():
        drawn = {entry.name, "rope"} if entry.hook == "rotary" else {entry.name}
        if entry.hook == "kernel" or any(key in registry.get(n).context for n in drawn):
            continue
        with pytest.raises(ValueError) as err:
            plot_command(entry.name, out=tmp_path, **{argument: 16})
        if "no figure for" in str(err.value):  # coordinates no figure draws (digits, meshes)
            continue
        assert f"{flag} does not change {entry.name}" in str(err.value)
        refused += 1
    assert refused >= 5, refused
    assert not list(tmp_path.iterdir())


def test_import_mmpe_does_not_need_matplotlib():
    code = "import sys, mmpe, mmpe.plot, mmpe.cli; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
