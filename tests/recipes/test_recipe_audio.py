"""The spoken-digits audio recipe: espeak-ng synthesis, log-mel features, WAV folders, held-out
voices, and a few training steps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("soundfile", reason="the audio recipe needs mmpe[data]")

import soundfile as sf
import torch
from helpers import require_debian
from mmpe.recipes import audio, audio_data
from mmpe.recipes.common import CONFIGS


def write_tone_folder(root: Path, sr: int = 22050) -> None:
    """``<root>/<label>/<speaker>_<i>.wav``: label ``k`` is a tone of 300·(k+1) Hz, 0.3-0.6 s."""
    rng = np.random.default_rng(0)
    for k in range(3):
        for s, speaker in enumerate(("ann", "bob", "cat", "dan", "eve")):
            n = int(sr * (0.3 + 0.1 * s))
            t = np.arange(n) / sr
            wav = 0.5 * np.sin(2 * np.pi * 300 * (k + 1) * t) + 0.01 * rng.standard_normal(n)
            path = root / f"tone{k}" / f"{speaker}_{k}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, wav.astype(np.float32), sr, subtype="PCM_16")


def test_espeak_synthesis_and_log_mel(tmp_path: Path) -> None:
    require_debian("espeak-ng", command="espeak-ng")
    path = audio_data.synthesise("seven", tmp_path / "7" / "en-us+f3_r150_p50.wav", "en-us+f3", 150, 50)
    info = sf.info(str(path))
    assert info.samplerate == 22050 and info.channels == 1 and 0.3 < info.duration < 1.5
    wav = audio.read_wav(path)
    assert abs(len(wav) - round(info.frames * 16000 / 22050)) <= 1
    feats = audio.log_mel(audio.trim(wav), n_mels=40)
    assert feats.shape == (len(audio.trim(wav)) // audio.HOP + 1, 40)
    assert torch.isfinite(feats).all() and float(feats.max()) > float(np.log(audio.SILENCE)) + 5
    slow = audio_data.synthesise("seven", tmp_path / "slow.wav", "en-us+f3", 80, 50)
    assert sf.info(str(slow)).duration > 1.3 * info.duration  # slower speech, longer input
    with pytest.raises(ValueError, match="pitch"):
        audio_data.synthesise("seven", tmp_path / "x.wav", "en-us", 150, 120)


def test_espeak_voices_and_plan() -> None:
    require_debian("espeak-ng", command="espeak-ng")
    variants = audio_data.variants()
    assert len(variants) >= 24 and {"f3", "m1", "klatt"} <= set(variants)
    voices = audio_data.voices(num_variants=24)
    assert len(voices) == 8 * 24 and "en-us+" + variants[0] in voices
    plan = audio_data.plan(voices, per_voice=2, seed=0)
    assert len(plan) == 2 * len(voices) and plan == audio_data.plan(voices, per_voice=2, seed=0)
    assert all(r in audio_data.RATES and p in audio_data.PITCHES for _, r, p in plan)


def test_missing_espeak_names_the_apt_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audio_data.shutil, "which", lambda name: None)
    with pytest.raises(audio_data.MissingEspeakError, match="apt-get install espeak-ng"):
        audio_data.synthesise("one", Path("/nonexistent/x.wav"), "en-us", 150, 50)


def test_log_mel_of_a_tone_peaks_at_its_frequency() -> None:
    import torchaudio

    t = torch.arange(16000) / 16000
    feats = audio.log_mel(torch.sin(2 * torch.pi * 1000 * t), n_mels=40)
    assert feats.shape == (101, 40)
    fb = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, 40, 16000)  # [freq bins, mels]
    expected = int(fb[1000 * 400 // 16000].argmax())  # the mel band holding the 1 kHz bin
    assert int(feats[10:90].mean(0).argmax()) == expected


def test_held_out_voices_are_disjoint_by_variant() -> None:
    speakers = [f"{a}+{v}" for a in ("en-us", "en-gb", "en-029") for v in
                ("f1", "f2", "m1", "m2", "m3", "klatt", "croak", "whisper", "Alex", "Lee")]
    groups = audio_data.split_groups([audio_data.group_of(s) for s in speakers], 0.2, 0.1, seed=0)
    assert sorted(sum(groups.values(), [])) == sorted({audio_data.group_of(s) for s in speakers})
    assert (len(groups["test"]), len(groups["val"]), len(groups["train"])) == (2, 1, 7)
    assert not set(groups["test"]) & set(groups["train"])
    assert not set(groups["val"]) & set(groups["train"])
    assert audio_data.group_of("en-gb-x-rp+f3") == "f3" and audio_data.group_of("ann") == "ann"
    assert audio_data.speaker_of("data/7/en-us+f3_r150_p50.wav") == "en-us+f3"
    with pytest.raises(ValueError, match="at least 3"):
        audio_data.split_groups(["a", "b"])
    with pytest.raises(ValueError, match="test_fraction"):
        audio_data.split_groups(["a", "b", "c"], 0.6, 0.5)


def test_folder_of_wavs_loader(tmp_path: Path) -> None:
    write_tone_folder(tmp_path / "wavs")
    files = audio.find_wavs(tmp_path / "wavs")
    assert len(files) == 15 and {label for _, label in files} == {"tone0", "tone1", "tone2"}
    data = audio.SpokenDigitsData(root=str(tmp_path / "wavs"), slow_root=None, test_fraction=0.2,
                                  val_fraction=0.2, batch_size=4)
    assert data.classes == ["tone0", "tone1", "tone2"] and data.num_classes == 3
    speakers = {k: set(v[2]) for k, v in data.split.items()}
    assert {k: len(s) for k, s in speakers.items()} == {"train": 3, "val": 1, "test": 1}
    assert not speakers["test"] & speakers["train"] and not speakers["val"] & speakers["train"]
    x, y = data.dataset("test", 1.0)[0]
    assert x.shape == (100, 40) and 0 <= y < 3
    assert data.dataset("test", 2.0)[0][0].shape == (200, 40)
    with pytest.raises(FileNotFoundError, match="<label>"):
        audio.find_wavs(tmp_path / "nothing")


def test_training_smoke_and_longer_input_eval(tmp_path: Path) -> None:
    write_tone_folder(tmp_path / "wavs")
    cli = audio.make_cli([
        "--config", str(CONFIGS / "audio" / "default.yaml"), "--model.encoding", "sincos",
        "--data.root", str(tmp_path / "wavs"), "--data.slow_root", "null",
        "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.batch_size", "4",
        "--model.d_model", "32", "--model.depth", "1", "--model.warmup_steps", "1",
    ], run=False)
    assert cli.model.hparams.num_classes == 3 and cli.model.hparams.window_frames == 100
    cli.trainer.fit(cli.model, cli.datamodule)
    results = audio.evaluate_inputs(cli.trainer, cli.model, cli.datamodule)
    assert results["slow 2s"] is None  # no slow folder given
    assert all(math.isfinite(results[k]) and 0.0 <= results[k] <= 1.0 for k in ("1s", "2s"))


@pytest.mark.parametrize("combine", ["add", "concat"])
def test_conv_pe_trains_and_evaluates_longer_inputs(tmp_path: Path, combine: str) -> None:
    # wav2vec 2.0's convolutional position embedding over the time axis of the (t, f) grid
    write_tone_folder(tmp_path / "wavs")
    cli = audio.make_cli([
        "--config", str(CONFIGS / "audio" / "default.yaml"), "--model.encoding", "conv_pe",
        "--model.encoding_options", "{kernel_size: 4, groups: 4}",
        "--model.input_combine", combine,
        "--data.root", str(tmp_path / "wavs"), "--data.slow_root", "null",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.batch_size", "4",
        "--model.d_model", "32", "--model.depth", "1", "--model.warmup_steps", "1",
    ], run=False)
    transformer = cli.model.encoder.transformer
    assert type(transformer.input_encodings[0]).__name__ == "ConvPositionalEmbedding"
    assert len(transformer.input_projections) == (combine == "concat")
    cli.trainer.fit(cli.model, cli.datamodule)
    results = audio.evaluate_inputs(cli.trainer, cli.model, cli.datamodule)
    assert all(math.isfinite(results[k]) and 0.0 <= results[k] <= 1.0 for k in ("1s", "2s"))
