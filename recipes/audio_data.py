"""Synthesise spoken digits with espeak-ng (Debian) for the audio recipe.

    python -m mmpe.recipes.audio_data --out data/spoken_digits        # `make data-audio`

writes `<out>/main/<digit>/<voice>_r<rate>_p<pitch>.wav` — the English words "zero" … "nine"
spoken by every *voice* (an espeak-ng English accent + a voice variant, e.g. `en-us+f3`) at a
few speaking rates (words per minute) and pitches (0-99) — and `<out>/slow/<digit>/…`: the same
words by the held-out test voices at a slow rate (`--slow-rate`, default 80 wpm), for the
evaluation of longer inputs. The voice is the speaker: the file name's text before the first
`_` ([`speaker_of`][recipes.audio_data.speaker_of]); voices are held out by variant ([`group_of`][recipes.audio_data.group_of], [`split_groups`][recipes.audio_data.split_groups]).
Defaults: 24 variants × 8 accents = 192 voices, 1,920 clips in `main/` and 480 in `slow/`
(about a minute with two espeak-ng processes, ~110 MB).

Which (rate, pitch) pairs a voice speaks is drawn from `random.Random(seed)` over the sorted
voices: the same files on every machine with the same espeak-ng voices. Espeak-ng writes 16-bit
mono WAV at 22,050 Hz.

Raises [`MissingEspeakError`][recipes.audio_data.MissingEspeakError] (`apt-get install espeak-ng`) when the program is missing.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mmpe.recipes.common import MissingDataError

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: espeak-ng's own English accents (not the mbrola voices, which need another package).
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
           "en-029", "en-us-nyc")
RATES = (120, 150, 180, 210)
PITCHES = (25, 50, 75)
INSTALL = "apt-get install espeak-ng"


class MissingEspeakError(MissingDataError):
    """espeak-ng is not installed; the message names the Debian package (a
    [`MissingDataError`][recipes.common.MissingDataError]: callers that skip on missing data skip
    here too)."""


def espeak() -> str:
    """Path of the `espeak-ng` program, or [`MissingEspeakError`][recipes.audio_data.MissingEspeakError] naming the package."""
    path = shutil.which("espeak-ng")
    if path is None:
        raise MissingEspeakError(f"the audio recipe synthesises speech with espeak-ng, which is not "
                                 f"installed: run `{INSTALL}` (Debian/Ubuntu, as root)")
    return path


def variants() -> list[str]:
    """espeak-ng voice variants (`m1`, `f3`, `klatt`, `whisper` …), sorted."""
    out = subprocess.run([espeak(), "--voices=variant"], check=True, capture_output=True,
                         text=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 5 and fields[4].startswith("!v/"):
            names.add(fields[4][3:])
    return sorted(names)


def voices(num_variants: int | None = None, accents: tuple[str, ...] = ACCENTS) -> list[str]:
    """Voices `accent+variant` (the first `num_variants` variants of every accent), sorted."""
    vs = variants()[:num_variants]
    return sorted(f"{a}+{v}" for a, v in itertools.product(accents, vs))


def synthesise(text: str, path: Path, voice: str, rate: int, pitch: int) -> Path:
    """`espeak-ng -v voice -s rate -p pitch -w path text`; returns `path`.

    Raises:
        ValueError: `rate` outside 80-450 wpm or `pitch` outside 0-99.
        RuntimeError: espeak-ng failed (its message included).
    """
    if not 80 <= rate <= 450:
        raise ValueError(f"rate must be in 80..450 words per minute, got {rate}")
    if not 0 <= pitch <= 99:
        raise ValueError(f"pitch must be in 0..99, got {pitch}")
    path.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([espeak(), "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", str(path),
                          text], capture_output=True, text=True)
    if res.returncode != 0 or not path.exists():
        raise RuntimeError(f"espeak-ng failed for voice {voice!r}: {res.stderr.strip()}")
    return path


def speaker_of(path: str | Path) -> str:
    """The speaker of a WAV file: its name's text before the first `_` (the whole stem if none)."""
    return Path(path).stem.split("_", 1)[0]


def group_of(speaker: str) -> str:
    """The hold-out unit of a speaker: the voice variant after the last `+` (`en-us+f3` → `f3`).

    Voices that share a variant (`en-us+f3`, `en-gb+f3`) sound alike, so they go to the same
    split; a speaker name without `+` (your own recordings) is its own group.
    """
    return speaker.rsplit("+", 1)[-1]


def split_groups(groups: list[str], test_fraction: float = 0.2, val_fraction: float = 0.1,
                 seed: int = 0) -> dict[str, list[str]]:
    """Disjoint `{"train", "val", "test"}` lists of groups: a fixed shuffle (`seed`) of the sorted
    unique groups gives the first `round(n·test_fraction)` to test, the next
    `round(n·val_fraction)` to validation and the rest to training (at least one each for n ≥ 3).

    Raises:
        ValueError: fractions outside [0, 1) or summing to 1 or more; fewer than 3 groups.
    """
    if not (0 <= test_fraction < 1 and 0 <= val_fraction < 1 and test_fraction + val_fraction < 1):
        raise ValueError(f"test_fraction and val_fraction must be in [0, 1) with a sum < 1, got "
                         f"{test_fraction} and {val_fraction}")
    order = sorted(set(groups))
    if len(order) < 3:
        raise ValueError(f"need at least 3 speakers (or voice variants) to split, got {order}")
    random.Random(seed).shuffle(order)
    n = len(order)
    n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    n_test, n_val = min(n_test, n - 1), min(n_val, n - 1 - min(n_test, n - 1))
    return {"test": sorted(order[:n_test]), "val": sorted(order[n_test:n_test + n_val]),
            "train": sorted(order[n_test + n_val:])}


def plan(voice_list: list[str], per_voice: int, seed: int = 0,
         rates: tuple[int, ...] = RATES, pitches: tuple[int, ...] = PITCHES) -> list[tuple[str, int, int]]:
    """`per_voice` distinct (voice, rate, pitch) settings per voice, drawn with `seed`."""
    rng = random.Random(seed)
    combos = list(itertools.product(rates, pitches))
    out = []
    for v in sorted(voice_list):
        for rate, pitch in rng.sample(combos, min(per_voice, len(combos))):
            out.append((v, rate, pitch))
    return out


def generate(out: str | Path, num_variants: int | None = 24, per_voice: int = 1,
             slow_rate: int | None = 80, seed: int = 0, workers: int = 2) -> dict[str, int]:
    """Write the spoken-digit folders under `out` (see the module docstring); skips existing files.

    Args:
        out: root folder (`main/` and `slow/` are written inside).
        num_variants: voice variants used (× 8 accents = voices); `None`: all.
        per_voice: (rate, pitch) settings per voice and word.
        slow_rate: words per minute of the `slow/` set (pitch 50; only the voices whose variant
            [`split_groups`][recipes.audio_data.split_groups] puts in the test split); `None`: no slow set.
        seed: fixes the (rate, pitch) draws.
        workers: espeak-ng processes run at once.

    Returns `{"main": files, "slow": files}`.
    """
    out = Path(out)
    jobs = []
    for voice, rate, pitch in plan(voices(num_variants), per_voice, seed):
        for d, word in enumerate(WORDS):
            jobs.append((word, out / "main" / str(d) / f"{voice}_r{rate}_p{pitch}.wav", voice, rate, pitch))
    n_main = len(jobs)
    if slow_rate is not None:
        test_groups = set(split_groups([group_of(v) for v in voices(num_variants)])["test"])
        for voice in (v for v in voices(num_variants) if group_of(v) in test_groups):
            for d, word in enumerate(WORDS):
                jobs.append((word, out / "slow" / str(d) / f"{voice}_r{slow_rate}_p50.wav", voice,
                             slow_rate, 50))
    todo = [j for j in jobs if not j[1].exists()]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(lambda j: synthesise(*j), todo))
    return {"main": n_main, "slow": len(jobs) - n_main}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/spoken_digits", help="output folder")
    parser.add_argument("--variants", type=int, default=24, help="voice variants (x 8 accents)")
    parser.add_argument("--per-voice", type=int, default=1, help="(rate, pitch) settings per voice")
    parser.add_argument("--slow-rate", type=int, default=80, help="wpm of the slow/ set (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    counts = generate(args.out, args.variants, args.per_voice, args.slow_rate or None, args.seed,
                      args.workers)
    print(f"spoken digits in {args.out}: {counts['main']} clips in main/, {counts['slow']} in slow/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
