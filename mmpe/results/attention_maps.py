"""Attention maps of trained models, stored for the docs' attention gallery.

The text recipe's checkpoints (`mmpe compare text`, one per encoding and seed) are read back,
one held-out Shakespeare passage of `L` characters (the training context; a learned table
holds no more) is run
through each model under [`record_attention`][mmpe.attention.record.record_attention], and per
layer the head whose attention is most concentrated (lowest mean entropy over queries) is
kept. The maps go to one compressed `.npz` under `results/attention/` with the passage, the
seed, the heads kept and each checkpoint's step, so `make docs` draws them without training
and without the checkpoints.

    python -m mmpe.results.attention_maps --runs runs/compare/text --seed 1 \\
        --out results/attention/text.npz

The checkpoints are read with the text recipe's classes, named by class path (`MODEL`,
`DATA`) and imported only when maps are made: the results layer sits below the recipes.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mmpe.attention import record_attention

MAIN_JOB = ("sinusoidal", "learned", "rope", "alibi", "t5", "fire", "nope")
#: Characters of the test plays skipped before the passage (past the first play's title page).
SKIP = 10_000
#: The LightningModule and LightningDataModule that wrote the checkpoints, by class path.
MODEL = "mmpe.recipes.text.CharLM"
DATA = "mmpe.recipes.text.ShakespeareData"


def _load_class(path: str) -> type:
    """The class a dotted path names (`package.module.Class`).

    Raises:
        ImportError: its module does not import (the recipes need `mmpe[recipes]`).
        AttributeError: the module has no such class.
    """
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def checkpoint_of(runs: Path, encoding: str, seed: int) -> Path:
    """The last checkpoint of `encoding`, seed `seed`, under a `mmpe compare text --out` folder.

    Raises:
        FileNotFoundError: no checkpoint there.
    """
    found = sorted((runs / encoding / f"seed{seed}").glob("lightning_logs/version_*/checkpoints/last.ckpt"))
    if not found:
        raise FileNotFoundError(f"attention_maps: no checkpoint for {encoding!r} seed {seed} "
                                f"under {runs} (run `mmpe compare text --out {runs}` first)")
    return found[-1]


def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean over queries of each head's attention entropy.

    Mean over queries of each head's attention entropy (nats), `[n_h]`, for
    `weights [n_h, n_q, n_k]`."""
    return -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean(-1)


def text_maps(runs: Path, encodings: Sequence[str], seed: int = 0, multiple: int = 1, *,
              model: str = MODEL, data: str = DATA) -> dict[str, np.ndarray | str]:
    """Attention maps of the text recipe's trained models.

    Per encoding, `[depth, n, n]` float16 maps of the most concentrated head per layer on
    `multiple × L` characters of the test plays from character `SKIP`, plus metadata arrays.
    `model` and `data` are the class paths of the checkpoints' LightningModule and
    LightningDataModule (the text recipe's).

    Raises:
        FileNotFoundError: a checkpoint is missing.
        ValueError: `multiple` < 1 or no encodings.
    """
    if multiple < 1:
        raise ValueError(f"attention_maps: multiple must be >= 1, got {multiple}")
    if not encodings:
        raise ValueError("attention_maps: give at least one encoding")
    out: dict[str, np.ndarray | str] = {}
    meta: dict[str, dict] = {}
    model_cls, data_cls = _load_class(model), _load_class(data)
    text = None
    for name in encodings:
        path = checkpoint_of(runs, name, seed)
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        if text is None:
            hp = ckpt.get("datamodule_hyper_parameters", {})
            text = data_cls(**{k: v for k, v in hp.items()
                               if k in ("context_length", "val_plays", "test_plays")})
            n = multiple * text.hparams.context_length
            tokens = text.ids["test"][SKIP:SKIP + n][None]
            out["text"] = np.array("".join(text.vocab[i] for i in tokens[0].tolist()))
        lm = model_cls.load_from_checkpoint(path, map_location="cpu").eval()
        with torch.no_grad(), record_attention() as weights:
            lm(tokens)
        heads = [int(entropy(w[0]).argmin()) for w in weights]
        out[name] = np.stack([w[0, h].numpy() for w, h in zip(weights, heads, strict=True)]
                             ).astype(np.float16)
        meta[name] = {"heads": heads, "step": int(ckpt.get("global_step", -1))}
    out["meta"] = np.array(json.dumps({"seed": seed, "multiple": multiple, "runs": meta}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/compare/text"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multiple", type=int, default=1)
    parser.add_argument("--encodings", default=",".join(MAIN_JOB))
    parser.add_argument("--out", type=Path, default=Path("results/attention/text.npz"))
    args = parser.parse_args(argv)
    maps = text_maps(args.runs, args.encodings.split(","), args.seed, args.multiple)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **maps)
    print(f"attention maps of {args.encodings} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
