"""Pieces every recipe shares: finding offline data, threads, LightningCLI, the cosine schedule."""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Sequence
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
