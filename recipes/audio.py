"""Spoken-digit recognition with a spectrogram transformer (AST-style), on held-out voices.

Data: the words "zero" … "nine" synthesised by espeak-ng (Debian `espeak-ng`; run
`make data-audio` = `python -m mmpe.recipes.audio_data --out data/spoken_digits`, or let the data
module do it on first use): 192 voices (8 English accents × 24 voice variants) at several speaking
rates and pitches, plus the held-out voices at a slow 80 words per minute. Voices are held out by
variant: no test or validation voice shares its variant (timbre) with a training voice. Any folder
of labelled WAV files works instead (`--data.root my_recordings`): `<root>/<label>/*.wav`,
where the speaker of a file is its name's text before the first `_`.

Features (Gong et al. 2021, AST): 16 kHz audio → `torchaudio.transforms.MelSpectrogram` (25 ms
windows, 10 ms hop, `n_mels` bands) → log → normalised with the training mean and standard
deviation. Leading and trailing silence is trimmed; the word is placed in a fixed window
(`window_seconds`; at a random offset while training, at the start for evaluation) padded with
silence. The `[time, mel]` image is cut into non-overlapping `patch` patches (`(10, 8)`:
0.1 s × 8 mel bands), a [`Grid`][mmpe.coords.grid.Grid] of (time, frequency) patches with a cls token.

Protocol: train on 1 s windows; test on the held-out voices in a 1 s window, in a 2 s window (the
same words, the grid twice as long along time, the rest silence), and on the held-out voices
speaking slowly (80 wpm, about 1.4–2.2 s) in a 2 s window — longer speech, more time patches.

    make data-audio
    python -m mmpe.recipes.audio fit --config configs/audio/default.yaml --model.encoding rope_axial
    mmpe compare audio --encodings learned_grid,sincos,rope_axial,swin,alibi,nope,conv_pe

`conv_pe` is wav2vec 2.0 / HuBERT's convolutional position embedding (a grouped convolution
over the frames, GELU, added): on the (time, mel) grid it slides along the time axis of every
mel band with one kernel (default `K = 128` patches, 16 groups: at 10 or 20 time patches it
spans the whole window).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from einops import rearrange
from mmpe.recipes.audio_data import INSTALL, generate, group_of, speaker_of, split_groups
from mmpe.recipes.common import (
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    mix_seed,
    run_seed,
    split_index,
    test_or_none,
)
from mmpe.recipes.compare import CompareSpec
from mmpe.recipes.vision import GridClassifier, GridEncoder
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mmpe._optional import check_torchaudio
from mmpe._optional import require as require_module

DEFAULT_ROOT = "data/spoken_digits"
SAMPLE_RATE = 16000
HOP = 160  # 10 ms at 16 kHz
EVAL_SETTINGS = (("1s", "test", 1.0), ("2s", "test", 2.0), ("slow 2s", "slow", 2.0))
SILENCE = 1e-6  # mel power floor (the log of it is the padding value)

COMPARE = CompareSpec(
    metric="accuracy",
    columns=[name for name, _, _ in EVAL_SETTINGS],
    xlabel="test input (held-out voices; trained on 1 s windows)",
    lower_is_better=False,
    default_encodings=["learned_grid", "sincos", "rope_axial", "swin", "alibi", "nope", "conv_pe"],
    coords="grid",
    title="Spoken digits (espeak-ng, held-out voices): accuracy vs input length",
    chance=lambda column: 0.1,  # ten spoken digits
    notes=[
        "1s: as trained (10×5 patches); 2s: same words padded to 2 s (20×5 patches); "
        "slow 2s: held-out voices at 80 wpm in 2 s.",
        "Test voices never share a voice variant with the training voices; chance is 10 %.",
        "n/a: the encoding cannot represent the longer grid.",
    ],
)


# ---------------------------------------------------------------------------------------------
# Reading WAV folders
# ---------------------------------------------------------------------------------------------
def find_wavs(root: str | Path) -> list[tuple[Path, str]]:
    """`(path, label)` of every `<root>/<label>/*.wav` (`.WAV` too; sorted).

    Raises:
        FileNotFoundError: `root` is missing or holds no `<label>/*.wav` file.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"audio: no folder {root} (expected <root>/<label>/*.wav)")
    files = sorted((p, p.parent.name) for p in root.glob("*/*") if p.suffix.lower() == ".wav")
    if not files:
        raise FileNotFoundError(f"audio: no WAV files in {root}/<label>/*.wav")
    return files


def read_wav(path: str | Path, sample_rate: int = SAMPLE_RATE) -> Tensor:
    """Mono float32 waveform `[n]` of a WAV file, resampled to `sample_rate` with torchaudio."""
    import soundfile as sf

    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    wav = torch.from_numpy(data.mean(axis=1))
    if sr != sample_rate:
        with torch.no_grad():
            wav = resampler(sr, sample_rate)(wav)
    return wav


@functools.lru_cache(maxsize=8)
def resampler(orig: int, new: int) -> nn.Module:
    """`torchaudio.transforms.Resample` (its sinc kernel computed once per rate pair)."""
    torchaudio = require_module("torchaudio", "the audio recipe")

    return torchaudio.transforms.Resample(orig, new)


def trim(wav: Tensor, threshold: float = 0.02) -> Tensor:
    """Drop leading and trailing samples quieter than `threshold` × the clip's peak."""
    loud = (wav.abs() >= threshold * wav.abs().max().clamp_min(1e-8)).nonzero()
    return wav if len(loud) == 0 else wav[int(loud[0]):int(loud[-1]) + 1]


@functools.lru_cache(maxsize=4)
def mel_transform(n_mels: int) -> nn.Module:
    torchaudio = require_module("torchaudio", "the audio recipe")

    return torchaudio.transforms.MelSpectrogram(sample_rate=SAMPLE_RATE, n_fft=400, win_length=400,
                                                hop_length=HOP, n_mels=n_mels)


def log_mel(wav: Tensor, n_mels: int = 40) -> Tensor:
    """`log(mel power + 1e-6)` of a 16 kHz waveform `[n]`: `[frames, n_mels]`, 10 ms frames."""
    with torch.no_grad():
        return torch.log(mel_transform(n_mels)(wav) + SILENCE).T.contiguous()


def fit_window(features: Tensor, frames: int, offset: int = 0) -> Tensor:
    """Place `features [f, n_mels]` at `offset` in a `frames` window of silence (crop if long)."""
    out = torch.full((frames, features.shape[1]), float(np.log(SILENCE)), dtype=features.dtype)
    n = min(len(features), frames - offset)
    out[offset:offset + n] = features[:n]
    return out


@functools.lru_cache(maxsize=8)
def load_folder(root: str, n_mels: int) -> tuple[list[Tensor], list[str], list[str]]:
    """Log-mel features, labels and speakers of every WAV under `root` (trimmed; cached).

    Runs single-threaded: these small per-clip ops only lose time to thread hand-offs.
    """
    feats, labels, speakers = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for path, label in find_wavs(root):
            feats.append(log_mel(trim(read_wav(path)), n_mels))
            labels.append(label)
            speakers.append(speaker_of(path))
    finally:
        torch.set_num_threads(threads)
    return feats, labels, speakers


class Clips(Dataset):
    """Log-mel clips in fixed windows: item `(features [frames, n_mels], label index)`.

    Args:
        feats: per-clip `[f, n_mels]` log-mel features.
        labels: per-clip label index.
        frames: window length (10 ms frames).
        mean, std: normalisation.
        random_offset: place each clip at a random offset (training) instead of at 0.
        seed: the offset of item `(epoch, i)` (or `i`: epoch 0) is drawn from a generator
            seeded by `(seed, epoch, i)`: fresh each epoch, the same on every rank and after a
            resume, never from the global RNG.
    """

    def __init__(self, feats: list[Tensor], labels: list[int], frames: int, mean: float, std: float,
                 random_offset: bool = False, seed: int = 0) -> None:
        self.feats, self.labels, self.frames = feats, labels, frames
        self.mean, self.std, self.random_offset, self.seed = mean, std, random_offset, seed

    def __len__(self) -> int:
        return len(self.feats)

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[Tensor, int]:
        epoch, i = split_index(index)
        f = self.feats[i]
        offset = 0
        if self.random_offset and len(f) < self.frames:
            g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, i))
            offset = int(torch.randint(self.frames - len(f) + 1, (), generator=g))
        return (fit_window(f, self.frames, offset) - self.mean) / self.std, self.labels[i]


class SpokenDigitsData(L.LightningDataModule):
    """Labelled WAV folders, split by speaker groups (held-out voices).

    Args:
        root: `<root>/<label>/*.wav`. The default, `data/spoken_digits/main`, is synthesised
            with espeak-ng on first use if missing.
        slow_root: an extra test folder (same layout) for the "slow 2s" column; only its files whose
            speaker is a test speaker are used. `None`: no such column.
        n_mels: mel bands.
        window_seconds: training window (the 1 s column).
        test_fraction, val_fraction, split_seed: the held-out speaker groups
            ([`mmpe.recipes.audio_data.split_groups`][recipes.audio_data.split_groups] over [`mmpe.recipes.audio_data.group_of`][recipes.audio_data.group_of]).
        batch_size: clips per step.

    Raises:
        FileNotFoundError: `root` holds no `<label>/*.wav`.
        mmpe.recipes.audio_data.MissingEspeakError: the default data is missing and espeak-ng is not
            installed (`apt-get install espeak-ng`).
    """

    def __init__(self, root: str = f"{DEFAULT_ROOT}/main", slow_root: str | None = f"{DEFAULT_ROOT}/slow",
                 n_mels: int = 40, window_seconds: float = 1.0, test_fraction: float = 0.2,
                 val_fraction: float = 0.1, split_seed: int = 0, batch_size: int = 64,
                 num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        if window_seconds <= 0:
            raise ValueError(f"window_seconds must be > 0, got {window_seconds}")
        check_torchaudio("the audio recipe")  # before synthesising data it could not read
        default = os.path.normpath(root) == os.path.normpath(f"{DEFAULT_ROOT}/main")
        if default and not Path(root).is_dir():
            print(f"audio: synthesising spoken digits into {DEFAULT_ROOT} with espeak-ng "
                  f"(needs `{INSTALL}`)", flush=True)
            generate(DEFAULT_ROOT)
        feats, labels, speakers = load_folder(str(root), n_mels)
        self.classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(self.classes)}
        self.groups = split_groups([group_of(s) for s in speakers], test_fraction, val_fraction,
                                   split_seed)
        where = {g: split for split, gs in self.groups.items() for g in gs}
        self.split: dict[str, tuple[list[Tensor], list[int], list[str]]] = {}
        for name in ("train", "val", "test"):
            keep = [i for i, s in enumerate(speakers) if where[group_of(s)] == name]
            self.split[name] = ([feats[i] for i in keep], [index[labels[i]] for i in keep],
                                [speakers[i] for i in keep])
        if slow_root is not None and Path(slow_root).is_dir():
            sf, sl, ss = load_folder(str(slow_root), n_mels)
            keep = [i for i, s in enumerate(ss) if where.get(group_of(s)) == "test" and sl[i] in index]
            self.split["slow"] = ([sf[i] for i in keep], [index[sl[i]] for i in keep],
                                  [ss[i] for i in keep])
        train_all = torch.cat(self.split["train"][0])
        self.mean, self.std = float(train_all.mean()), float(train_all.std())

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def window_frames(self) -> int:
        """Training window in 10 ms frames."""
        return self.frames(self.hparams.window_seconds)

    def frames(self, seconds: float) -> int:
        return int(round(seconds * SAMPLE_RATE / HOP))

    def dataset(self, split: str, seconds: float, random_offset: bool = False) -> Clips:
        if split not in self.split:
            raise KeyError(f"audio: no {split!r} clips (slow_root missing?)")
        feats, labels, _ = self.split[split]
        return Clips(feats, labels, self.frames(seconds), self.mean, self.std, random_offset,
                     seed=run_seed())

    def train_dataloader(self) -> DataLoader:
        ds = self.dataset("train", self.hparams.window_seconds, random_offset=True)
        # Shuffled per epoch from the run's seed, offsets per (epoch, clip); sharded under DDP.
        return epoch_loader(ds, self.hparams.batch_size, with_epoch=True, drop_last=True,
                            num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val", self.hparams.window_seconds)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test", self.hparams.window_seconds)

    def eval_dataloader(self, split: str, seconds: float) -> DataLoader:
        return DataLoader(self.dataset(split, seconds), batch_size=self.hparams.batch_size,
                          num_workers=self.hparams.num_workers)


class SpectrogramTransformer(GridClassifier):
    """AST-style classifier: `[time, mel]` log-mel → `patch` patches → cls + [`GridEncoder`][recipes.vision.GridEncoder].

    Args:
        encoding, encoding_options: the positional encoding (registry name, options).
        num_classes: labels (linked from the data module).
        n_mels: mel bands (linked).
        window_frames: training window in 10 ms frames (linked); sets the training grid.
        patch: `(time frames, mel bands)` per patch; `n_mels` and every window must divide.
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        eval_positions: see [`mmpe.recipes.vision.GridEncoder`][recipes.vision.GridEncoder].
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        input_combine: `"add"` or `"concat"`: how an input encoding meets the patch
            tokens ([`mmpe.Transformer`][mmpe.transformer.Transformer], docs/add_vs_concat.md).

    Shapes: `forward(features [b, frames, n_mels]) -> logits [b, num_classes]`.
    """

    def __init__(self, encoding: str = "rope_axial", encoding_options: dict[str, Any] | None = None,
                 num_classes: int = 10, n_mels: int = 40, window_frames: int = 100,
                 patch: Seq[int] = (10, 8), d_model: int = 64, num_heads: int = 4, depth: int = 3,
                 mlp_ratio: float = 2.0, dropout: float = 0.1, eval_positions: str = "cells",
                 lr: float = 2e-3, weight_decay: float = 0.05, warmup_steps: int = 50,
                 input_combine: str = "add") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.pt, self.pf = (int(v) for v in patch)
        if window_frames % self.pt or n_mels % self.pf:
            raise ValueError(f"SpectrogramTransformer: a {window_frames}x{n_mels} (frames x mels) "
                             f"input is not divisible by the patch {self.pt}x{self.pf}")
        self.embed = nn.Conv2d(1, d_model, (self.pt, self.pf), stride=(self.pt, self.pf))
        train_grid = (window_frames // self.pt, n_mels // self.pf)
        self.encoder = GridEncoder(encoding, encoding_options, train_grid, d_model, num_heads,
                                   depth, mlp_ratio, dropout, eval_positions=eval_positions,
                                   input_combine=input_combine)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() != 3 or features.shape[1] % self.pt or features.shape[2] % self.pf:
            raise ValueError(f"SpectrogramTransformer: features must be [b, frames, n_mels] divisible "
                             f"by the patch {self.pt}x{self.pf}, got {tuple(features.shape)}")
        tokens = rearrange(self.embed(features.unsqueeze(1)), "b d t f -> b t f d")
        return self.head(self.encoder(tokens)[:, 0])




class AudioCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.n_mels", "model.n_mels")
        parser.link_arguments("data.window_frames", "model.window_frames", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> AudioCLI:
    return make_lightning_cli(AudioCLI, SpectrogramTransformer, SpokenDigitsData, args, run)


def evaluate_inputs(trainer: L.Trainer, model: SpectrogramTransformer, data: SpokenDigitsData,
                    settings: Seq[tuple[str, str, float]] = EVAL_SETTINGS) -> dict[str, float | None]:
    """Held-out accuracy per (column, split, window seconds); None where the PE cannot go or the
    split is missing."""
    results: dict[str, float | None] = {}
    for name, split, seconds in settings:
        if split not in data.split:
            results[name] = None
            continue
        results[name] = test_or_none(trainer, model, data.eval_dataloader(split, seconds), "test/acc")
    return results


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/audio/default.yaml`; held-out accuracy per input."""
    cli = fit_for_compare(make_cli, "audio", encoding, seed=seed, out_dir=out_dir, cli_args=cli_args)
    return evaluate_inputs(cli.trainer, cli.model, cli.datamodule)


if __name__ == "__main__":
    make_cli()
