"""Context extension of a trained RoPE model: each scaling zero-shot and after a short fine-tune.

The RoPE scalings (position interpolation, NTK-aware, dynamic NTK, YaRN, LongRoPE, Llama 3)
exist to stretch a model trained at a short context to a longer one. This recipe measures that
on the text recipe's model (`mmpe.recipes.text`): a character-level RoPE transformer is
trained on Shakespeare at `L = 64` (once per seed, shared by every scaling), then for each
scaling with factor `s = 4`:

* **zero-shot**: the trained weights with the scaled rotation, test bits/char at `1 … 16 × L`
  (columns `zs@mx`);
* **fine-tuned**: the same, after `--finetune_steps` steps (default 100, the same for every
  scaling) of training at `s · L = 256` (columns `ft@mx`);
* **retrieval**: a RoPE model trained on passkey retrieval (the task of
  `mmpe.recipes.lengthgen`, filler lengths up to 16; once per seed) with the scaling and no
  training, exact match at 1–8 × its training length (columns `passkey@mx`).

* **ladder**: test bits/char at `4 L` by sliding window after `0` and each step count of
  `--ladder` (default 25, 50, 100: checkpoints of the one fine-tune; columns `ladder@<k>`), to
  test "fewest fine-tuning steps";
* **sliding window** (the YaRN paper's perplexity protocol): windows of `m·L` characters moved
  by a stride of `STRIDE = L` characters; each window scores only its last `STRIDE` characters
  (every scored character sees at least `m·L − L` characters before it), over the first
  `SLIDING_CHARS` test characters (columns `zs sw@mx`, `ft sw@mx`, `m` in 4, 16). The
  non-overlapping columns (`zs@mx`, `ft@mx`) score every position of a window from position 0.

`rope` (no scaling) is the control: the base model as it is, and fine-tuned at 256 with its
original rotation. Peng et al. 2023 (YaRN, arXiv:2309.00071, Tables 1–2 and Fig. 4) report that
YaRN reaches the lowest perplexity at the extended length after the fewest fine-tuning steps,
that dynamic NTK helps without any fine-tuning, and that position interpolation (Chen et al.
2023) needs fine-tuning; the tables here test that ordering on a small model.

    mmpe compare context --encodings rope,rope_pi,rope_ntk,rope_dynamic_ntk,rope_yarn,rope_longrope,rope_llama3
    mmpe compare context -- --finetune_steps 200
"""

from __future__ import annotations

import fcntl
import math
from pathlib import Path
from typing import Any

import torch
from mmpe.recipes import text
from mmpe.recipes.common import CONFIGS, cli_args_for, fit_for_compare, pop_option, test_or_none
from mmpe.recipes.compare import CompareSpec

from mmpe import registry
from mmpe.coords import Sequence

MULTIPLIERS = (1, 2, 4, 8, 16)
SCALINGS = ["rope", "rope_pi", "rope_ntk", "rope_dynamic_ntk", "rope_yarn", "rope_longrope",
            "rope_llama3"]
FACTOR = 4
FINETUNE_STEPS = 100
PASSKEY_STEPS = 1500
PASSKEY_COLUMNS = [f"passkey@{m}x" for m in (1, 2, 4, 8)]
#: Fine-tuning steps at which the ladder is read by default (and 0, the zero-shot model): a
#: quarter, half and all of `FINETUNE_STEPS`.
LADDER = (25, 50, 100)
#: Sliding-window evaluation: stride (characters scored per window) and characters scored.
STRIDE = 64
SLIDING_CHARS = 8192
SLIDING_MULTIPLIERS = (4, 16)
SLIDING_COLUMNS = [f"{p} sw@{m}x" for p in ("zs", "ft") for m in SLIDING_MULTIPLIERS]


def ladder_columns(ladder: tuple[int, ...] = LADDER) -> list[str]:
    """`ladder@0` (zero-shot) and `ladder@<k>` for each rung: sliding-window bpc at 4 L."""
    return [f"ladder@{k}" for k in (0, *ladder)]

COMPARE = CompareSpec(
    metric="bpc",
    columns=([f"zs@{m}x" for m in MULTIPLIERS] + [f"ft@{m}x" for m in MULTIPLIERS]
             + PASSKEY_COLUMNS + SLIDING_COLUMNS + ladder_columns()),
    higher_is_better=tuple(PASSKEY_COLUMNS),
    xlabel="evaluation length (multiples of the training context L = 64 characters)",
    lower_is_better=True,
    default_encodings=SCALINGS,
    coords=Sequence(2, causal=True),
    title="Context extension of a RoPE char LM trained at L = 64 (factor 4): test bits/char",
    notes=["zs: the trained weights with the scaling, no training; ft: after the same short "
           "fine-tune at 4 L = 256 for every scaling.",
           "rope: no scaling (the control).",
           "passkey@mx: exact match of passkey retrieval (mmpe compare lengthgen's task) by a "
           "RoPE model trained on it at L = 16 filler letters, with the scaling, no training.",
           "sw@mx: bits/char by sliding window (windows of m·L, stride L = 64, the last 64 "
           "characters of each window scored); ladder@k: sw@4x after k fine-tuning steps."],
    check_encoding=lambda name: check_scaling(name),
    plot=lambda records, path, setting="default", rows=None: plot_panels(records, path, setting, rows),
    # A five-digit key: exact match by guessing is 1e-5.
    chance={c: 0.0 for c in PASSKEY_COLUMNS},
    command=lambda settings: ("mmpe compare context --setting ladder --store results"
                              if "ladder" in settings else "mmpe compare context --store results"),
)

#: The figure's panels: (title, columns, y label).
PANELS = [
    ("zero-shot", [f"zs@{m}x" for m in MULTIPLIERS], "test bits/char"),
    ("after 100 steps at 4 L", [f"ft@{m}x" for m in MULTIPLIERS], "test bits/char"),
    ("passkey retrieval, zero-shot", PASSKEY_COLUMNS, "exact match"),
]


def plot_panels(records: list[dict[str, Any]], path: Path, setting: str = "default",
                rows: list[str] | None = None) -> Path:
    """Zero-shot bpc, fine-tuned bpc and passkey accuracy vs length, one line per scaling with
    the seeds' sd as a band."""
    from mmpe.plot.style import save, subplots
    from mmpe.results.report import draw_bands, summarise

    runs = [r for r in records if r["setting"] == setting and (not rows or r["encoding"] in rows)]
    summary = summarise(runs, COMPARE.columns)
    # two panels a row, 6.9 inches: shown at the docs' 688 px column unscaled (labels and legend
    # keep their size, mmpe.plot.legibility); a spare panel holds the legend
    rows_n = -(-(len(PANELS) + 1) // 2)
    fig, axes = subplots(rows_n, 2, figsize=(6.9, 2.9 * rows_n), squeeze=False)
    flat = list(axes.flat)
    for ax, (title, columns, ylabel) in zip(flat, PANELS, strict=False):
        draw_bands(ax, summary, columns)
        ax.set_xticks(range(len(columns)), [c.split("@")[1] for c in columns])
        ax.set_title(title)
        ax.set_xlabel("length / L")
        ax.set_ylabel(ylabel)
    for ax in flat[len(PANELS):]:
        ax.axis("off")
    flat[-1].legend(*flat[0].get_legend_handles_labels(), fontsize=8, loc="center")
    return save(fig, path)


def check_scaling(name: str) -> None:
    """Raises ValueError unless `name` is `rope` or a RoPE scaling of the registry."""
    entry = registry.get(name)
    if entry.name not in SCALINGS:
        raise ValueError(f"context: {name!r} is not a RoPE scaling; known: {', '.join(SCALINGS)}")


def scaling_options(name: str, factor: float, original: int) -> dict[str, Any]:
    """The scaling's options: the factor and, where it takes one, the original context."""
    if name == "rope":
        return {}
    options: dict[str, Any] = {"factor": factor}
    if "original_max_position_embeddings" in registry.get(name).context:
        options["original_max_position_embeddings"] = original
    return options


def train_base(seed: int, root: Path, cli_args: list[str]) -> Path:
    """The seed's RoPE model at L = 64 (trained once; other runs wait for it and reuse it)."""
    folder = root / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "rope_base.pt"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel runs of one seed train the base once
        if not weights.exists():
            cli = fit_for_compare(text.make_cli, "text", "rope", seed=seed, out_dir=folder,
                                  cli_args=cli_args)
            torch.save(cli.model.state_dict(), weights)
    return weights


def load_base(model: text.CharLM, weights: Path) -> None:
    """Copy the base weights; only the scaling's own settings may be new."""
    missing, unexpected = model.load_state_dict(torch.load(weights, map_location="cpu"), strict=False)
    # a rotary encoding's settings: in a block, or the model's shared encodings
    stray = [k for k in [*missing, *unexpected] if ".settings." not in k
             or not (".rotary." in k or ".shared_encodings." in k)]
    if stray:
        raise RuntimeError(f"context: base weights do not fit the model: {stray[:5]}")


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Zero-shot and fine-tuned test bpc of the scaling `encoding` on the seed's base model.

    Recipe options (before LightningCLI's): `--finetune_steps N` (default 100), `--factor s`
    (default 4), `--passkey_steps N` (training steps of the retrieval model, default 1500; 0
    leaves the retrieval columns out). Other arguments go to the text base training and the
    fine-tune.

    Raises:
        ValueError: not a RoPE scaling; `factor <= 1`; `finetune_steps < 0`; `passkey_steps < 0`.
    """
    check_scaling(encoding)
    args = list(cli_args)
    steps = int(pop_option(args, "--finetune_steps", str(FINETUNE_STEPS)))
    factor = float(pop_option(args, "--factor", str(FACTOR)))
    passkey_steps = int(pop_option(args, "--passkey_steps", str(PASSKEY_STEPS)))
    # Default rungs: a quarter, half and all of the fine-tune (25, 50, 100 for 100 steps).
    rungs = sorted({max(1, steps // 4), max(1, steps // 2), steps}) if steps else []
    ladder = tuple(int(k) for k in pop_option(args, "--ladder", ",".join(map(str, rungs))).split(",") if k)
    if any(k < 1 or k > steps for k in ladder) or list(ladder) != sorted(set(ladder)):
        raise ValueError(f"context: --ladder must be increasing step counts in 1 … finetune_steps "
                         f"({steps}), got {ladder}")
    if passkey_steps < 0:
        raise ValueError(f"context: --passkey_steps must be >= 0, got {passkey_steps}")
    if steps < 0:
        raise ValueError(f"context: --finetune_steps must be >= 0, got {steps}")
    if not factor > 1:
        raise ValueError(f"context: --factor must be > 1 (the context is extended), got {factor}")
    weights = train_base(seed, Path(out_dir).parent.parent / "_base", args)
    cli = _finetune_cli(encoding, seed, Path(out_dir), factor, steps, args)
    load_base(cli.model, weights)
    out = _evaluate(cli, "zs")
    out.update(_sliding(cli, "zs"))
    out["ladder@0"] = out["zs sw@4x"]
    if steps:
        rungs = LadderRungs(cli.datamodule, ladder)
        cli.trainer.callbacks.append(rungs)
        cli.trainer.fit(cli.model, cli.datamodule)
        out.update(rungs.found)
    out.update(_evaluate(cli, "ft") if steps else {f"ft@{m}x": out[f"zs@{m}x"] for m in MULTIPLIERS})
    out.update(_sliding(cli, "ft") if steps else {f"ft sw@{m}x": out[f"zs sw@{m}x"]
                                                 for m in SLIDING_MULTIPLIERS})
    out.update(dict.fromkeys(PASSKEY_COLUMNS))
    if passkey_steps:
        root = Path(out_dir).parent.parent / "_base"
        out.update(passkey_retrieval(encoding, factor, train_passkey(seed, root, passkey_steps)))
    return out


def train_passkey(seed: int, root: Path, steps: int) -> Path:
    """The seed's RoPE model trained on passkey retrieval alone (once; shared like the base)."""
    from mmpe.recipes import lengthgen

    folder = root / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "rope_passkey.pt"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not weights.exists():
            cli = fit_for_compare(lengthgen.make_cli, "lengthgen", "rope", seed=seed,
                                  out_dir=folder / "passkey",
                                  cli_args=["--data.tasks", "[passkey]", "--trainer.max_steps", str(steps)])
            hparams = {k: v for k, v in cli.model.hparams.items() if not k.startswith("_")}
            torch.save({"hparams": hparams, "state": cli.model.state_dict()}, weights)
    return weights


def passkey_retrieval(encoding: str, factor: float, weights: Path) -> dict[str, float | None]:
    """Exact match of the passkey model with the scaling `encoding`, no training."""
    from mmpe.recipes import lengthgen

    saved = torch.load(weights, map_location="cpu")
    data = lengthgen.TaskData(tasks=["passkey"])
    options = scaling_options(encoding, factor, data.longest_train)
    model = lengthgen.TaskLM(**{**saved["hparams"], "encoding": encoding, "encoding_options": options})
    missing, unexpected = model.load_state_dict(saved["state"], strict=False)
    if any(".settings." not in k for k in [*missing, *unexpected]):
        raise RuntimeError(f"context: passkey weights do not fit the model: {[*missing, *unexpected][:5]}")
    found = lengthgen.evaluate(model, data)
    return {c: found[c] for c in PASSKEY_COLUMNS}


def _finetune_cli(encoding: str, seed: int, out_dir: Path, factor: float, steps: int,
                  args: list[str]) -> Any:
    original = 64
    options = scaling_options(encoding, factor, original)
    import json

    extra = ["--seed_everything", str(seed), "--data.context_length", str(int(factor * original)),
             "--model.encoding_options", json.dumps(options), "--model.warmup_steps", "10",
             "--model.lr", "0.001", "--trainer.val_check_interval", str(max(1, steps)),
             "--trainer.limit_val_batches", "0", *args, "--trainer.max_steps", str(max(1, steps))]
    cli = text.make_cli(cli_args_for(CONFIGS / "text" / "default.yaml", encoding, out_dir, extra), run=False)
    from lightning.pytorch.loggers import CSVLogger

    cli.trainer.loggers = [CSVLogger(save_dir=str(out_dir))]
    return cli


def sliding_bpc(model: Any, ids: torch.Tensor, window: int, stride: int = STRIDE,
                batch_size: int = 8) -> float:
    """Bits/char of `ids` by sliding window: windows of `window` characters start every
    `stride` characters; the first window scores all its targets, every later one only its
    last `stride` (so each character is scored once, after at least `window − stride`
    characters of context where the text allows).

    Raises:
        ValueError: `stride` not in `1 … window`, or `ids` shorter than `window + 1`.
    """
    if not 1 <= stride <= window:
        raise ValueError(f"sliding_bpc: stride must be in 1 … window ({window}), got {stride}")
    if len(ids) < window + 1:
        raise ValueError(f"sliding_bpc: {len(ids)} characters, fewer than window + 1 = {window + 1}")
    starts = list(range(0, len(ids) - window, stride))
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts), batch_size):
            chunk = starts[i:i + batch_size]
            batch = torch.stack([ids[s:s + window + 1] for s in chunk])
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:],
                                                     reduction="none")
            for row, s in enumerate(chunk):
                keep = loss[row] if s == 0 else loss[row, window - stride:]
                total += float(keep.sum())
                count += keep.numel()
    model.train(was_training)
    return total / count / math.log(2)


def sliding_chars(data: Any) -> int:
    """Characters the sliding window scores: `SLIDING_CHARS`, at most `data.eval_chars`."""
    return min(SLIDING_CHARS, data.hparams.eval_chars)


def _sliding(cli: Any, prefix: str) -> dict[str, float | None]:
    """`<prefix> sw@mx` for `m` in `SLIDING_MULTIPLIERS` (None where the encoding cannot)."""
    from mmpe.encodings.base import PositionOutOfRangeError

    ids = cli.datamodule.ids["test"][:sliding_chars(cli.datamodule) + 1]
    out: dict[str, float | None] = {}
    for m in SLIDING_MULTIPLIERS:
        window = m * 64
        try:
            value = sliding_bpc(cli.model, ids, window) if len(ids) > window else None
        except PositionOutOfRangeError:
            value = None
        out[f"{prefix} sw@{m}x"] = None if value is None or not math.isfinite(value) else value
    return out


class LadderRungs:
    """A Lightning callback: sliding-window bpc at 4 L after each step count of `ladder`."""

    def __init__(self, data: Any, ladder: tuple[int, ...]) -> None:
        import lightning as L

        # Subclassed here so the recipe module imports without Lightning's callback base.
        self.__class__ = type("LadderRungs", (LadderRungs, L.Callback), {})
        self.ids, self.ladder, self.found = data.ids["test"][:sliding_chars(data) + 1], ladder, {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        step = trainer.global_step
        if step in self.ladder and f"ladder@{step}" not in self.found:
            self.found[f"ladder@{step}"] = sliding_bpc(pl_module, self.ids, 4 * 64)


def _evaluate(cli: Any, prefix: str) -> dict[str, float | None]:
    data, out = cli.datamodule, {}
    for m in MULTIPLIERS:
        value = test_or_none(cli.trainer, cli.model, data.eval_dataloader("test", m * 64), "test/bpc")
        out[f"{prefix}@{m}x"] = None if value is None or not math.isfinite(value) else value
    return out
