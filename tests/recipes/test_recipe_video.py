"""The moving-digits video recipe: deterministic clips, direction labels, longer clips, a few steps."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from mmpe.recipes import video
from mmpe.recipes.common import CONFIGS


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = video.small_digits(16)["test"]
    return x[:200], y[:200]


def centre_of_mass(frame: torch.Tensor) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(frame.shape[0]), torch.arange(frame.shape[1]), indexing="ij")
    m = frame.sum()
    return torch.stack([(frame * ys).sum() / m, (frame * xs).sum() / m])


def test_clips_are_deterministic_and_longer_clips_continue_shorter(digits) -> None:
    a = video.MovingDigits(*digits, num_clips=40, frames=8, seed=3)
    b = video.MovingDigits(*digits, num_clips=40, frames=8, seed=3)
    long = video.MovingDigits(*digits, num_clips=40, frames=16, seed=3)
    other = video.MovingDigits(*digits, num_clips=40, frames=8, seed=4)
    for i in (0, 7, 39):
        (ca, da, ma), (cb, db, mb), (cl, dl, ml) = a[i], b[i], long[i]
        assert torch.equal(ca, cb) and (da, ma) == (db, mb)
        assert ca.shape == (8, 32, 32) and cl.shape == (16, 32, 32)
        assert torch.equal(cl[:8], ca) and (dl, ml) == (da, ma)
    assert any(not torch.equal(a[i][0], other[i][0]) for i in range(10))


def test_direction_labels_match_the_motion(digits) -> None:
    ds = video.MovingDigits(*digits, num_clips=64, frames=16, speed=1, seed=0)
    seen = set()
    for i in range(len(ds)):
        clip, label, direction = ds[i]
        k = ds.params(i)[0]
        assert label == int(digits[1][k])
        # the whole digit stays in the canvas in every frame
        assert torch.allclose(clip.sum(dim=(1, 2)), digits[0][k].sum().expand(16), rtol=1e-5)
        moved = centre_of_mass(clip[-1]) - centre_of_mass(clip[0])
        expected = torch.tensor(video.DIRECTIONS[direction], dtype=torch.float32) * 15
        assert torch.allclose(moved, expected, atol=1e-3), (i, direction, moved)
        seen.add(direction)
    assert seen == set(range(8))
    assert video.DIRECTION_NAMES[video.DIRECTIONS.index((-1, 0))] == "N"  # up is north


def test_bad_geometry_raises(digits) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        video.MovingDigits(*digits, num_clips=4, frames=8, max_frames=20, frame_size=32)
    with pytest.raises(ValueError, match="max_frames"):
        video.MovingDigits(*digits, num_clips=4, frames=17, max_frames=16)
    with pytest.raises(ValueError, match="not divisible by the tubelet"):
        video.VideoClassifier(frames=8, tubelet=(3, 8))
    model = video.VideoClassifier(encoding="nope", d_model=24, num_heads=2, depth=1)
    with pytest.raises(ValueError, match="not divisible by the tubelet"):
        model(torch.zeros(1, 8, 30, 30))


@pytest.mark.parametrize("encoding", ["factorized", "sincos", "rope_axial", "alibi", "learned_grid"])
def test_model_takes_longer_clips(encoding: str) -> None:
    model = video.VideoClassifier(encoding=encoding, d_model=24, num_heads=2, depth=1).eval()
    for frames in (8, 16):
        digit, direction = model(torch.rand(2, frames, 32, 32))
        assert digit.shape == (2, 10) and direction.shape == (2, 8)
        assert torch.isfinite(digit).all() and torch.isfinite(direction).all()


def test_training_smoke_and_longer_clip_eval(tmp_path) -> None:
    cli = video.make_cli([
        "--config", str(CONFIGS / "video" / "default.yaml"), "--model.encoding", "factorized",
        "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "3",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.train_clips", "48", "--data.eval_clips", "16",
        "--data.batch_size", "16", "--model.d_model", "24", "--model.depth", "1",
        "--model.warmup_steps", "1",
    ], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    results = video.evaluate_lengths(cli.trainer, cli.model, cli.datamodule, lengths=(8, 16))
    assert {"8f", "16f", "digit@16f", "direction@16f"} <= set(results)
    assert all(v is not None and math.isfinite(v) and 0.0 <= v <= 1.0 for v in results.values())
