"""Pieces every recipe shares: finding offline data, threads, LightningCLI, the cosine schedule,
and what makes training reproducible under DDP and across a resume.

Data order and per-sample randomness are functions of `(seed, epoch, index)` only
([`EpochSampler`][recipes.common.EpochSampler], datasets that seed a generator per item), so every rank draws the same
global order and Lightning's `use_distributed_sampler` gives each rank a disjoint share of it;
[`ResumableDataLoader`][recipes.common.ResumableDataLoader] puts its position in the epoch into Lightning's checkpoint, so
`fit --ckpt_path` continues where the run stopped; [`StepSeed`][recipes.common.StepSeed] seeds the global RNG
(dropout, augmentations inside the model) from `(seed, epoch, batch, rank)` at every training
batch; [`RecipeCLI`][recipes.common.RecipeCLI] always adds a `ModelCheckpoint` (`--checkpoint.*`) and saves the
resolved config next to the logs.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import mmpe.configs
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, Sampler

#: The recipes' YAML configs: ``configs/`` in the repository, ``mmpe.configs`` when installed.
CONFIGS = Path(mmpe.configs.__file__).resolve().parent


class MissingDataError(RuntimeError):
    """A data package is not installed; the message says how to install it."""


def require(module: str, install: str) -> ModuleType:
    """Import `module` or raise [`MissingDataError`][recipes.common.MissingDataError] naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDataError(f"the data package {module!r} is not installed: run `{install}`") from err


def set_threads() -> None:
    """Use the CPU cores this process may run on (busy oversubscribed threads run far slower)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, int(os.environ.get("MMPE_THREADS", cores or 1))))


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """LR multiplier: linear warm-up over `warmup` steps, cosine decay to `floor` at `total`."""
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


def planned_steps(trainer: Any, train_size: int, batch_size: int, drop_last: bool = False) -> int:
    """Optimizer steps of the run: `trainer.estimated_stepping_batches`, computed from the
    training set's size instead of by loading the training data.

    Called in `configure_optimizers`, that property builds the train loader before a resumed
    run has restored the loader's place in the epoch, and Lightning then never restores it (the
    resumed run would replay the epoch). Each rank gets `ceil(train_size / world_size)` samples
    (Lightning's `DistributedSampler`).
    """
    per_rank = math.ceil(train_size / max(1, trainer.world_size))
    batches = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
    limit = trainer.limit_train_batches
    batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
    steps = math.ceil(batches / trainer.accumulate_grad_batches) * max(trainer.max_epochs or 1, 1)
    if trainer.max_epochs == -1:
        steps = trainer.max_steps
    elif trainer.max_steps != -1:
        steps = min(steps, trainer.max_steps)
    return max(1, int(steps))


def pop_option(args: list[str], name: str, default: str | None = None) -> str | None:
    """Remove `name VALUE` (or `name=VALUE`) from `args` and return VALUE (`default`
    when absent): a recipe option `run_one` reads before LightningCLI sees the rest."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
            del args[i:i + 2]
            return value
        if a.startswith(name + "="):
            del args[i]
            return a.split("=", 1)[1]
    return default


def cli_args_for(config: str | Path, encoding: str, out_dir: Path, extra: Sequence[str]) -> list[str]:
    """LightningCLI arguments of one `mmpe compare` run."""
    return ["--config", str(config), "--model.encoding", encoding,
            "--trainer.default_root_dir", str(out_dir), *extra]


# ---------------------------------------------------------------------------------------------
# Reproducible data order and randomness (DDP sharding, exact resume)
# ---------------------------------------------------------------------------------------------
def run_seed() -> int:
    """The run's seed: the one `seed_everything` stored in `PL_GLOBAL_SEED` (0 if unset).

    Lightning seeds the `DistributedSampler` it injects under DDP from the same variable.
    """
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def mix_seed(*values: int) -> int:
    """One 63-bit seed from non-negative integers (`numpy.random.SeedSequence`): distinct
    tuples such as `(seed, epoch, index)` give unrelated streams."""
    return int(np.random.SeedSequence([int(v) for v in values]).generate_state(1, np.uint64)[0] >> 1)


class EpochSampler(Sampler):
    """Every index of a map-style dataset once per epoch, in an order fixed by `(seed, epoch)`.

    Lightning calls [`set_epoch`][recipes.common.EpochSampler.set_epoch] at the start of every epoch. The order depends on nothing
    else — not on the global RNG, not on the rank — so under DDP (`use_distributed_sampler`,
    on by default) Lightning wraps this sampler in its `DistributedSamplerWrapper` and each
    rank takes a disjoint share of the same order; after a resume the epoch is drawn again
    identically.

    Args:
        num_samples: dataset length.
        shuffle: a fresh permutation per epoch (else `0 … n−1`).
        seed: permutation seed (default: [`run_seed`][recipes.common.run_seed]).
        with_epoch: yield `(epoch, index)` pairs instead of indices, for datasets whose items
            draw fresh randomness each epoch from a generator seeded by `(seed, epoch, index)`.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int | None = None,
                 with_epoch: bool = False) -> None:
        if num_samples < 1:
            raise ValueError(f"EpochSampler: num_samples must be >= 1, got {num_samples}")
        self.num_samples, self.shuffle, self.with_epoch = num_samples, shuffle, with_epoch
        self.seed = run_seed() if seed is None else int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = range(self.num_samples)
        if self.with_epoch:
            return ((self.epoch, i) for i in order)
        return iter(order)

    def __len__(self) -> int:
        return self.num_samples


def split_index(index: int | tuple[int, int]) -> tuple[int, int]:
    """`(epoch, i)` of a dataset index from [`EpochSampler`][recipes.common.EpochSampler] (a bare `i` is epoch 0)."""
    if isinstance(index, tuple):
        return int(index[0]), int(index[1])
    return 0, int(index)


def _samplers(loader: DataLoader) -> list[Any]:
    """The loader's sampler and its batch sampler's sampler (where `set_epoch` lives)."""
    found = [getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)]
    return [s for i, s in enumerate(found) if s is not None and all(s is not t for t in found[:i])]


class _SkipFirst:
    """The loader's index sampler with its first `skip` batches dropped (once: a restart)."""

    def __init__(self, base: Any, skip: int) -> None:
        self.base, self.skip = base, skip

    def __iter__(self):
        skip, self.skip = self.skip, 0
        it = iter(self.base)
        for _ in range(skip):
            if next(it, None) is None:
                return
        yield from it

    def __len__(self) -> int:
        return len(self.base)


class ResumableDataLoader(DataLoader):
    """A `DataLoader` whose place in the epoch is saved in Lightning's checkpoints.

    Lightning stores `state_dict()` of a stateful training loader in the checkpoint
    (`loops.fit_loop.state_dict.combined_loader`) and calls [`load_state_dict`][recipes.common.ResumableDataLoader.load_state_dict] when
    `fit(ckpt_path=...)` resumes. The state is `{"epoch", "batches"}`: the sampler's epoch and
    the batches handed out in it. On resume the sampler is set to that epoch and the first
    `batches` batches are skipped at the index level (no sample is loaded), so with a sampler
    whose order depends only on `(seed, epoch)` ([`EpochSampler`][recipes.common.EpochSampler], Lightning's
    `DistributedSampler`) the run continues with the very next batch instead of replaying the
    epoch. Batches are counted as the loader yields them, so worker prefetching does not shift
    the count. Resume with the same batch size and number of devices. An epoch counts as over
    when all `len(loader)` batches were handed out: an end-of-epoch checkpoint of a run
    shortened by `limit_train_batches` would skip that many batches of the next epoch.
    """

    _resume_skip = 0
    _yielded = 0

    def _sampler_epoch(self) -> int:
        for s in _samplers(self):
            if isinstance(getattr(s, "epoch", None), int):
                return s.epoch
        return 0

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self._sampler_epoch(), self._yielded
        if batches >= len(self):  # the epoch is over: resume at the start of the next one
            epoch, batches = epoch + 1, 0
        return {"epoch": epoch, "batches": batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for s in _samplers(self):
            if callable(getattr(s, "set_epoch", None)):
                s.set_epoch(int(state["epoch"]))
        self._resume_skip = int(state["batches"])

    @property
    def _index_sampler(self) -> Any:
        base = super()._index_sampler
        return _SkipFirst(base, self._skip_now) if self._skip_now else base

    _skip_now = 0

    def __iter__(self):
        skip, self._resume_skip = self._resume_skip, 0
        self._skip_now = skip  # read by `_index_sampler` while the iterator is built
        try:
            iterator = super().__iter__()
        finally:
            self._skip_now = 0
        self._yielded = skip
        return self._count(iterator)

    def _count(self, iterator: Any):
        for batch in iterator:
            self._yielded += 1
            yield batch


def epoch_loader(dataset: Any, batch_size: int, *, shuffle: bool = True, with_epoch: bool = False,
                 seed: int | None = None, **kwargs: Any) -> ResumableDataLoader:
    """A training loader: [`EpochSampler`][recipes.common.EpochSampler] order, resumable mid-epoch, sharded under DDP."""
    sampler = EpochSampler(len(dataset), shuffle=shuffle, seed=seed, with_epoch=with_epoch)
    return ResumableDataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


class StepSeed(Callback):
    """Seed the global torch RNG at every training batch from `(seed, epoch, batch, rank)`.

    Dropout and augmentations drawn inside the model then depend on the step, not on what ran
    before it (validation, data-loader start-up, a restart), so a resumed run draws what the
    straight run drew; each rank draws its own. `seed` is [`run_seed`][recipes.common.run_seed].
    """

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        torch.manual_seed(mix_seed(run_seed(), trainer.current_epoch, batch_idx, trainer.global_rank))


# ---------------------------------------------------------------------------------------------
# LightningModule steps
# ---------------------------------------------------------------------------------------------
class AdamWCosine:
    """A recipe model's `configure_optimizers` ([`make_optimizer`][recipes.common.make_optimizer]):
    its hyperparameters `lr`, `weight_decay`, `warmup_steps`, the schedule over
    `trainer.max_steps`. Mixed into a `LightningModule` (listed before it)."""

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        return make_optimizer(self, hp.lr, hp.weight_decay, hp.warmup_steps,
                              max(1, self.trainer.max_steps))


class LossMetricSteps(AdamWCosine):
    """Training, validation and test steps of a model whose `loss_and_metric(batch)` returns
    `(loss, metric)` on a dict batch: `train/loss` and `train/<metric_name>` every step,
    `val/<metric_name>` and `test/<metric_name>` averaged over ranks, weighted by the batch size
    `batch[size_key].shape[0]`."""

    metric_name = "metric"
    size_key = "lat"

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, metric = self.loss_and_metric(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log(f"train/{self.metric_name}", metric, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        _, metric = self.loss_and_metric(batch)
        self.log(f"val/{self.metric_name}", metric, prog_bar=True,
                 batch_size=batch[self.size_key].shape[0], sync_dist=True)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        _, metric = self.loss_and_metric(batch)
        self.log(f"test/{self.metric_name}", metric, batch_size=batch[self.size_key].shape[0],
                 sync_dist=True)


# ---------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------
class RecipeCLI(LightningCLI):
    """The recipes' LightningCLI.

    * A `ModelCheckpoint` is always configured, as `--checkpoint.*` (defaults:
      `save_last: true`; each config sets how often): checkpoints go to
      `<log dir>/checkpoints`; `--trainer.enable_checkpointing false` drops it.
    * Training writes the resolved config to `<log dir>/config.yaml` (Lightning's
      `SaveConfigCallback`; it refuses to overwrite one, so give each run its own log dir —
      the CSV logger's `version_N` does).
    * [`StepSeed`][recipes.common.StepSeed] is always on.
    * The progress bar (unless `--trainer.enable_progress_bar false` or one of its own) counts
      steps ([`step_progress_bar`][recipes.common.step_progress_bar]).
    """

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True})

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        callbacks = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        if config.get("enable_checkpointing") is False:
            callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
        given = [*callbacks, *(config.get("callbacks") or [])]
        if config.get("enable_progress_bar", True) is not False and not any(
                isinstance(c, ProgressBar) for c in given):
            callbacks = [*callbacks, step_progress_bar()]
        return self._instantiate_trainer(config, callbacks)


#: Lightning's own console lines that say nothing about the run, silenced by message (narrow
#: filters: every other warning and log line still shows). Lightning 2.6 has no switch for its
#: tips (`logger_connector.configure_logger` logs one on every Trainer without a LitLogger).
_TIP_PREFIX = "💡 Tip: "
_QUIET_WARNINGS = (
    # lightning/pytorch/utilities/_pytree.py builds a `LeafSpec`, which torch >= 2.9 deprecates
    # (a FutureWarning per fit and per test); Lightning's own code, nothing a recipe can change.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning,
     r"lightning\.pytorch\.utilities\._pytree"),
)


class _NoTips:
    """A logging filter that drops Lightning's advertisements ("💡 Tip: … litlogger")."""

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith(_TIP_PREFIX)


def quiet_lightning() -> None:
    """Silence, by message, the Lightning lines that are not about the run: its "💡 Tip" log
    lines (litlogger, litmodels) and the `LeafSpec` deprecation warnings its `_pytree` raises.

    Idempotent; [`make_lightning_cli`][recipes.common.make_lightning_cli] calls it, so every
    recipe's Trainer is quiet the same way.
    """
    import logging

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _NoTips) for f in log.filters):
            log.addFilter(_NoTips())
    for message, category, module in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


@contextlib.contextmanager
def lightning_info_off() -> Iterator[None]:
    """Lightning's INFO lines off inside the block ("Seed set to 0", "GPU available: …",
    "`Trainer.fit` stopped: `max_steps=…` reached."), its warnings and errors kept: what
    `mmpe compare` trains under, where a line per run says what ran."""
    import logging

    logs = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def step_progress_bar() -> Any:
    """Lightning's default progress bar, labelled by steps: a recipe trains for `max_steps`
    (`max_epochs` is -1), which Lightning's bar labels "Epoch 0/-2"."""
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    def label(trainer: Any) -> str | None:
        if trainer.max_steps is None or trainer.max_steps < 0:
            return None  # epochs-based: Lightning's own label
        return f"Epoch {trainer.current_epoch}, to step {trainer.max_steps}"

    class StepRichBar(RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            text = label(self.trainer) or super()._get_train_description(current_epoch)
            return f"{text:{len(self.validation_description)}}"

    class StepTQDMBar(TQDMProgressBar):
        def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
            super().on_train_epoch_start(trainer, *args)
            if label(trainer):
                self.train_progress_bar.set_description(label(trainer))

    return StepRichBar() if _RICH_AVAILABLE else StepTQDMBar()


def make_lightning_cli(cli_cls: type, model_cls: type, data_cls: type,
                       args: list[str] | None, run: bool) -> Any:
    """A recipe's LightningCLI (a [`RecipeCLI`][recipes.common.RecipeCLI]): threads set, [`StepSeed`][recipes.common.StepSeed] added,
    Lightning's lines that are not about the run silenced ([`quiet_lightning`][recipes.common.quiet_lightning])."""
    set_threads()
    quiet_lightning()
    with warnings.catch_warnings():
        # Called from `mmpe compare` with explicit args while sys.argv holds mmpe's own.
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter")
        return cli_cls(model_cls, data_cls, args=args, run=run,
                       trainer_defaults={"callbacks": [StepSeed()]})


def fit_for_compare(make_cli: Callable[..., Any], modality: str, encoding: str, *, seed: int,
                    out_dir: Path, cli_args: Sequence[str], config: str = "default.yaml") -> Any:
    """Build the recipe from `configs/<modality>/<config>` with `encoding` and train it.

    CSV logs, checkpoints and the resolved `config.yaml` go to the run's log directory under
    `out_dir`; `cli_args` (LightningCLI syntax) override the config. No progress bar (runs
    train side by side under `mmpe compare --jobs`, which prints a line as each starts and
    ends; `--trainer.enable_progress_bar true` in `cli_args` brings it back).
    """
    args = cli_args_for(CONFIGS / modality / config, encoding, out_dir,
                        ["--seed_everything", str(seed), "--trainer.enable_progress_bar", "false",
                         *cli_args])
    cli = make_cli(args, run=False)
    from lightning.pytorch.loggers import CSVLogger

    if isinstance(cli.trainer.logger, CSVLogger):  # keep each run's logs with its results
        cli.trainer.loggers = [CSVLogger(save_dir=str(out_dir))]
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def test_or_none(trainer: Any, model: Any, loader: Any, metric: str) -> float | None:
    """Test `model` on `loader` and return the logged `metric`.

    None where the encoding cannot represent the positions (`PositionOutOfRangeError`), which
    `mmpe compare` shows as "n/a".
    """
    from mmpe.encodings.base import PositionOutOfRangeError

    try:
        out = trainer.test(model, dataloaders=loader, verbose=False)
    except PositionOutOfRangeError:
        return None
    return float(out[0][metric])
