"""Pieces every recipe shares: finding offline data, threads, LightningCLI, the cosine schedule."""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


class MissingDataError(RuntimeError):
    """A data package is not installed; the message says how to install it."""


def require(module: str, install: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDataError` naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDataError(f"the data package {module!r} is not installed: run `{install}`") from err


def set_threads() -> None:
    """Use the CPU cores this process may run on (busy oversubscribed threads run far slower)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, int(os.environ.get("MMPE_THREADS", cores or 1))))


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, cosine decay to ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(module: torch.nn.Module, lr: float, weight_decay: float, warmup: int,
                   total: int) -> dict[str, Any]:
    """AdamW (no decay on biases, norms, tables of position) with warm-up + cosine, per step."""
    decay, no_decay = [], []
    for _, p in module.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warmup, total))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def cli_args_for(config: str | Path, encoding: str, out_dir: Path, extra: Sequence[str]) -> list[str]:
    """LightningCLI arguments of one ``mmpe compare`` run."""
    return ["--config", str(config), "--model.encoding", encoding,
            "--trainer.default_root_dir", str(out_dir), *extra]


def make_lightning_cli(cli_cls: type, model_cls: type, data_cls: type,
                       args: list[str] | None, run: bool) -> Any:
    """A recipe's LightningCLI: threads set, no config file written next to each run."""
    set_threads()
    with warnings.catch_warnings():
        # Called from `mmpe compare` with explicit args while sys.argv holds mmpe's own.
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter")
        return cli_cls(model_cls, data_cls, args=args, run=run, save_config_callback=None)


def fit_for_compare(make_cli: Callable[..., Any], modality: str, encoding: str, *, seed: int,
                    out_dir: Path, cli_args: Sequence[str], config: str = "default.yaml") -> Any:
    """Build the recipe from ``configs/<modality>/<config>`` with ``encoding`` and train it.

    CSV logs go to ``out_dir``; ``cli_args`` (LightningCLI syntax) override the config.
    """
    args = cli_args_for(CONFIGS / modality / config, encoding, out_dir,
                        ["--seed_everything", str(seed), *cli_args])
    cli = make_cli(args, run=False)
    from lightning.pytorch.loggers import CSVLogger

    if isinstance(cli.trainer.logger, CSVLogger):  # keep each run's logs with its results
        cli.trainer.loggers = [CSVLogger(save_dir=str(out_dir))]
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def test_or_none(trainer: Any, model: Any, loader: Any, metric: str) -> float | None:
    """Test ``model`` on ``loader`` and return the logged ``metric``.

    None where the encoding cannot represent the positions (``PositionOutOfRangeError``), which
    ``mmpe compare`` shows as "n/a".
    """
    from mmpe.encodings.base import PositionOutOfRangeError

    try:
        out = trainer.test(model, dataloaders=loader, verbose=False)
    except PositionOutOfRangeError:
        return None
    return float(out[0][metric])
