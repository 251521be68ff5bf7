"""Gene sequences: periodic and local motif arrangements and a nucleotide LM, tested to 8 × L.

Gong et al. 2025 ("Evaluation of Coding Schemes for Transformer-based Gene Sequence Modeling")
find that RoPE captures periodic motifs and extrapolates to long sequences while ALiBi does
well where local dependencies drive the task. This recipe tests that profile on real DNA that
ships offline (:mod:`mmpe.recipes.genomics_data` has sources and licences):

* background: the lambda phage genome (NC_001416.1, 48,502 bp) from Debian's
  `bowtie2-examples` (`apt-get install bowtie2-examples`; GPL-3.0+ per the Debian copyright
  file), split by coordinate: the first 80 % trains, the last 20 % (9,700 bp) tests;
* motifs: JASPAR 2024 CORE position frequency matrices from the `pyjaspar` package (`pip
  install pyjaspar`; MIT code, open-access JASPAR data): MYCN (MA0104.3), SOX2 (MA0143.5),
  POU5F1 (MA1115.2). Every planted site is a fresh draw from its PFM.

Tasks, generated on the machine and deterministic per seed (rules in
:class:`mmpe.recipes.genomics_data.TaskRules`), each window cut into blocks of ``L`` bp:

* ``periodic``: per block, 5 MYCN sites; label 1 if consecutive sites start exactly 10 bp
  apart (helical phasing), 0 if the spacings are drawn from 8, 9, 11, 12 bp (same sites,
  same mean span: only the exact offset differs).
* ``local``: per block, a SOX2 site followed by a POU5F1 site; label 1 with 0–2 bp between
  them (the Sox–Oct composite element), 0 with 16–32 bp.
* ``lm``: next-nucleotide prediction; bits per nucleotide on held-out genome.

One model per (encoding, seed) learns the three at once: ``[task] + L nucleotides``, a causal
:class:`mmpe.Transformer`, a nucleotide head for ``lm`` and, for each classification task, a
linear head on the feature-wise max over the nucleotide positions' final states. A max, not a
last-token readout: one position that has seen an arrangement is evidence at any window
length, so the longer columns measure how the encoding carries to unseen positions, not how
far one token can attend. Each nucleotide position is embedded as the overlapping k-mer
ending there (``model.kmer``, default 4; causal, nothing after the position enters): with
single nucleotides the model must spell out every site through attention, which the CPU
budget does not teach (periodic and local stayed at chance after 600 steps of the mixture;
with 4-mers periodic reaches 1.0 in 450 steps and local 0.9 in 900).

Columns ``<task>@<m>x``, windows of ``m·L`` bp for ``m`` in 1, 2, 4, 8: accuracy for the
classification tasks (400 fixed test windows per length, labels by a fair coin; chance 0.5)
and bits per nucleotide for ``lm`` (the same first 8,192 test nucleotides at every length,
cut into windows of ``m·L``; 2 bits is a uniform guess).
Test windows come from the test region and do not depend on the run's seed.

    python -m mmpe.recipes.genomics fit --config configs/genomics/default.yaml --model.encoding rope
    mmpe compare genomics --jobs 2
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from mmpe.recipes import genomics_data as gd
from mmpe.recipes.common import (
    AdamWCosine,
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    mix_seed,
    run_seed,
    split_index,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import Dataset

from mmpe.coords import Sequence
from mmpe.encodings.base import PositionOutOfRangeError
from mmpe.transformer import Transformer

TASKS = ["periodic", "local", "lm"]
CLASSIFY = ("periodic", "local")
#: How a test window of m·L holds arrangements: one per block, or one in all (`data.arrangements`).
ARRANGEMENTS = ("per_block", "one")
MULTIPLIERS = (1, 2, 4, 8)
#: Token ids: nucleotides 0-3 (A, C, G, T), then one task token per task (the model embeds
#: nucleotides as k-mers, see :func:`kmer_ids`).
TASK_TOKEN = {t: 4 + i for i, t in enumerate(TASKS)}
#: Evaluation windows are the same for every run (seeded apart from the runs' seeds).
EVAL_SEED = 20_250_113

COMPARE = CompareSpec(
    metric="accuracy (periodic, local) / bits per nucleotide (lm)",
    columns=[f"{t}@{m}x" for t in TASKS for m in MULTIPLIERS],
    xlabel="window length (multiples of the training length L = 128 bp)",
    lower_is_better=True,
    higher_is_better=tuple(f"{t}@{m}x" for t in CLASSIFY for m in MULTIPLIERS),
    default_encodings=["rope", "alibi", "sinusoidal", "learned", "t5", "fire", "nope"],
    coords=Sequence(2, causal=True),
    title="Gene sequences (lambda phage + JASPAR motifs): accuracy and bits/nt vs window length",
    seeds=3,
    notes=[
        "periodic: MYCN sites exactly 10 bp apart vs 8/9/11/12 bp; local: SOX2 then POU5F1 "
        "0–2 bp apart vs 16–32 bp; chance is 0.5. lm: bits per nucleotide (2 = uniform).",
        "mx: windows of m·L bp (m blocks, one arrangement each) from the held-out genome region; "
        "the max readout sees m arrangements, so accuracy may rise with m where the encoding "
        "carries to unseen positions.",
        "n/a: the encoding cannot represent those positions (a learned table of L + 1 rows).",
    ],
    plot=lambda records, path, setting="default", rows=None: plot_tasks(records, path, setting,
                                                                        rows),
    # Labels by a fair coin: accuracy 0.5 is chance; bits/nt has no chance level here.
    chance=lambda column: 0.5 if column.split("@")[0] in CLASSIFY else None,
    command=lambda settings: (
        "mmpe compare genomics --setting one --store results -- --config "
        "configs/genomics/one_arrangement.yaml" if "one" in settings
        else "mmpe compare genomics --store results"),
)


# --- data ------------------------------------------------------------------------------------
class Motifs:
    """The three PFMs of :data:`mmpe.recipes.genomics_data.MOTIF_IDS`, loaded once."""

    def __init__(self) -> None:
        self.pfm = {k: gd.load_pfm(v) for k, v in gd.MOTIF_IDS.items()}

    @property
    def lengths(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.pfm.items()}


def make_example(task: str, region: np.ndarray, block: int, blocks: int, rules: gd.TaskRules,
                 motifs: Motifs, rng: np.random.Generator,
                 arrangements: str = "per_block") -> tuple[list[int], int]:
    """``([task token] + blocks·block nucleotides, label)``; the label is -1 for ``lm``.

    The background is a random window of `region`; a classification label is a fair coin.
    `arrangements`: `"per_block"` plants one arrangement in every block (a window of ``m·L``
    holds ``m``, all of the label's kind); `"one"` plants a single arrangement in one block
    drawn uniformly, the other blocks are background only (the evidence is the same at every
    length, so a longer window tests transfer to unseen positions alone).
    """
    if arrangements not in ARRANGEMENTS:
        raise ValueError(f"genomics: arrangements must be one of {ARRANGEMENTS}, got {arrangements!r}")
    length = block * blocks
    start = int(rng.integers(0, len(region) - length + 1))
    seq, label = region[start:start + length].copy(), -1
    if task in CLASSIFY:
        label = int(rng.integers(2))
        at = int(rng.integers(blocks)) * block if arrangements == "one" else 0
        span = block if arrangements == "one" else length
        part = seq[at:at + span]
        if task == "periodic":
            part, _ = gd.periodic_example(part, block, bool(label), rules, motifs.pfm["periodic"], rng)
        else:
            part, _ = gd.local_example(part, block, bool(label), rules, motifs.pfm["local_a"],
                                       motifs.pfm["local_b"], rng)
        seq[at:at + span] = part
    return [TASK_TOKEN[task], *seq.tolist()], label


class TrainStream(Dataset):
    """``num_samples`` training windows; item ``(epoch, i)`` is drawn from ``(seed, epoch, i)``
    (task uniform over `tasks`)."""

    def __init__(self, data: GenomicsData, num_samples: int, seed: int) -> None:
        self.data, self.num_samples, self.seed = data, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[list[int], int, int]:
        epoch, i = split_index(index)
        rng = np.random.default_rng(mix_seed(self.seed, epoch, i))
        d = self.data
        task = d.tasks[int(rng.integers(len(d.tasks)))]
        ids, label = make_example(task, d.regions["train"], d.block, 1, d.rules, d.motifs, rng)
        return ids, label, TASKS.index(task)


def collate(items: list[tuple[list[int], int, int]]) -> dict[str, Tensor]:
    """Stack equal-length windows: ``tokens [b, 1 + n]``, ``label [b]``, ``task [b]``."""
    return {"tokens": torch.tensor([ids for ids, _, _ in items]),
            "label": torch.tensor([label for _, label, _ in items]),
            "task": torch.tensor([task for _, _, task in items])}


class GenomicsData(L.LightningDataModule):
    """Lambda phage windows with planted JASPAR motifs (see the module doc).

    Args:
        context_length: the training window ``L`` (bp); also the block that holds one
            arrangement at every evaluation length.
        tasks: the tasks trained (and evaluated) together: any of periodic, local, lm.
        eval_multipliers: evaluation windows, as multiples ``m ≥ 1`` of ``L``.
        batch_size: training windows per step.
        eval_examples: fixed test windows per classification task and length (labels drawn
            by a fair coin).
        eval_nucleotides: held-out nucleotides scored by ``lm`` at every length.
        test_fraction: the held-out end of the genome (split by coordinate).
        samples_per_epoch: training windows per epoch (fresh every epoch).
        period, sites: the periodic task's spacing and sites per block.
        arrangements: test windows of ``m·L`` with one arrangement per block (`"per_block"`,
            the stored default setting) or a single one in a random block (`"one"`: accuracy
            at ``8x`` measures transfer, not accumulated evidence). Training windows are one
            block either way.

    Raises:
        ValueError: an unknown task, an evaluation multiplier below 1 (shorter than training)
            or not an integer, ``L`` too short for an arrangement, or a test region too short
            for the longest evaluation window — before any training.
    """

    def __init__(self, context_length: int = 128, tasks: list[str] | None = None,
                 eval_multipliers: list[int] | None = None, batch_size: int = 32,
                 eval_examples: int = 400, eval_nucleotides: int = 8192,
                 test_fraction: float = 0.2, samples_per_epoch: int = 10**6, period: int = 10,
                 sites: int = 5, arrangements: str = "per_block") -> None:
        super().__init__()
        self.save_hyperparameters()
        if arrangements not in ARRANGEMENTS:
            raise ValueError(f"genomics: data.arrangements must be one of {ARRANGEMENTS}, "
                             f"got {arrangements!r}")
        self.tasks = check_tasks(TASKS if tasks is None else tasks)
        self.multipliers = check_multipliers(MULTIPLIERS if eval_multipliers is None
                                             else eval_multipliers)
        self.rules = gd.TaskRules(period=period, sites=sites)
        self.motifs = Motifs()
        self.block = int(context_length)
        need = gd.longest_span(self.rules, self.motifs.lengths)
        if self.block < need:
            raise ValueError(f"genomics: data.context_length={context_length} cannot hold an "
                             f"arrangement of {need} bp")
        self.regions = gd.split_genome(gd.lambda_genome(), test_fraction)
        longest = self.block * max(self.multipliers)
        if len(self.regions["test"]) < max(longest, eval_nucleotides) + 1:
            raise ValueError(f"genomics: the test region ({len(self.regions['test'])} bp) is "
                             "shorter "
                             f"than the longest evaluation window ({longest} bp) or "
                             f"data.eval_nucleotides={eval_nucleotides}")

    @property
    def max_positions(self) -> int:
        """Tokens of a training window (task token + L): the rows a learned table holds."""
        return self.block + 1

    def train_dataloader(self):
        hp = self.hparams
        ds = TrainStream(self, hp.samples_per_epoch, seed=run_seed())
        return epoch_loader(ds, hp.batch_size, shuffle=False, with_epoch=True, collate_fn=collate)

    def eval_set(self, task: str, m: int) -> list[tuple[list[int], int, int]]:
        """The fixed test windows of `task` at ``m·L`` bp (labels drawn by a fair coin)."""
        rng = np.random.default_rng(mix_seed(EVAL_SEED, TASKS.index(task), m))
        out = []
        for _ in range(self.hparams.eval_examples):
            ids, label = make_example(task, self.regions["test"], self.block, m, self.rules,
                                      self.motifs, rng, self.hparams.arrangements)
            out.append((ids, label, TASKS.index(task)))
        return out

    def lm_windows(self, m: int) -> list[tuple[list[int], int, int]]:
        """The first `eval_nucleotides` test nucleotides in non-overlapping ``m·L`` windows."""
        length, region = self.block * m, self.regions["test"][: self.hparams.eval_nucleotides]
        return [([TASK_TOKEN["lm"], *region[i:i + length].tolist()], -1, TASKS.index("lm"))
                for i in range(0, len(region) - length + 1, length)]


def check_tasks(tasks: list[str]) -> list[str]:
    """`tasks` as a list, or ValueError naming ``data.tasks`` and the known tasks."""
    tasks = list(tasks)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"genomics: data.tasks must be a non-empty list of {TASKS}, got "
                         f"{tasks} (unknown: {unknown})")
    return tasks


def check_multipliers(multipliers: list[int]) -> list[int]:
    """Integers ≥ 1, or ValueError naming ``data.eval_multipliers``."""
    multipliers = list(multipliers)
    bad = [m for m in multipliers if isinstance(m, bool) or not isinstance(m, int) or m < 1]
    if bad or not multipliers:
        raise ValueError(f"genomics: data.eval_multipliers must be integers >= 1 (evaluation "
                         f"windows no shorter than the training length), got {multipliers}")
    return multipliers


# --- model -----------------------------------------------------------------------------------
def kmer_ids(nucleotides: Tensor, k: int) -> Tensor:
    """Overlapping k-mer ids ``[b, n]``: position ``i`` gets nucleotides ``i−k+1 … i`` (in
    base 5; positions before the window count as 4). Causal: nothing after ``i`` enters."""
    padded = F.pad(nucleotides, (k - 1, 0), value=4)
    n = nucleotides.shape[1]
    return sum(padded[:, k - 1 - j:k - 1 - j + n] * 5 ** j for j in range(k))


class GenomicsModel(AdamWCosine, L.LightningModule):
    """Causal transformer with a nucleotide head (lm) and a pooled head per classification task.

    Args:
        encoding: registry name of the positional encoding.
        encoding_options: extra options for it.
        max_len: tokens of a training window (linked from the data): a learned table's rows
            and the original context of the RoPE scalings.
        d_model, num_heads, depth, mlp_ratio: transformer size.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        kmer: each nucleotide position is embedded as the k-mer ending there (1: the
            nucleotide alone).

    Raises:
        ValueError: `kmer` outside 1 … 6.
    """

    def __init__(self, encoding: str = "rope", encoding_options: dict[str, Any] | None = None,
                 max_len: int = 129, d_model: int = 64, num_heads: int = 4, depth: int = 3,
                 mlp_ratio: float = 2.0, lr: float = 2e-3, weight_decay: float = 0.05,
                 warmup_steps: int = 100, kmer: int = 4) -> None:
        super().__init__()
        if isinstance(kmer, bool) or not isinstance(kmer, int) or not 1 <= kmer <= 6:
            raise ValueError(f"genomics: model.kmer must be an int in 1 … 6, got {kmer!r}")
        self.save_hyperparameters()
        spec = {"name": encoding, **(encoding_options or {})}
        # One row per k-mer over A, C, G, T and "before the window" (id 4), per task token.
        self.embed = nn.Embedding(5 ** kmer, d_model)
        self.task_embed = nn.Embedding(len(TASKS), d_model)
        self.transformer = Transformer(d_model, num_heads, depth, [spec], mlp_ratio=mlp_ratio,
                                       context={"max_len": max_len,
                                                "original_max_position_embeddings": max_len})
        self.lm_head = nn.Linear(d_model, 4)
        self.heads = nn.ModuleDict({t: nn.Linear(d_model, 2) for t in CLASSIFY})

    def forward(self, tokens: Tensor) -> Tensor:
        """Final states ``[b, 1 + n, d]`` of ``[task] + nucleotides`` under a causal mask."""
        coords = Sequence(tokens.shape[1], causal=True, device=tokens.device)
        x = torch.cat([self.task_embed(tokens[:, :1] - TASK_TOKEN[TASKS[0]]),
                       self.embed(kmer_ids(tokens[:, 1:], self.hparams.kmer))], 1)
        return self.transformer(x, coords)

    def class_logits(self, hidden: Tensor, task: str) -> Tensor:
        """``[b, 2]`` from the feature-wise max over the nucleotide positions (not the task
        token): one position that has seen the arrangement is evidence at any window length."""
        return self.heads[task](hidden[:, 1:].amax(1))

    def nucleotide_nll(self, hidden: Tensor, tokens: Tensor) -> Tensor:
        """Nats per nucleotide ``[b, n]``: nucleotide ``i`` predicted from everything before it
        (the first one from the task token alone)."""
        logits = self.lm_head(hidden[:, :-1])
        return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        """The mean over the batch's windows of each window's loss (cross-entropy of its label,
        or its mean nats per nucleotide)."""
        hidden, per_window = self(batch["tokens"]), []
        for index, task in enumerate(TASKS):
            rows = batch["task"] == index
            if not rows.any():
                continue
            if task == "lm":
                per_window.append(self.nucleotide_nll(hidden[rows], batch["tokens"][rows]).mean(1))
            else:
                per_window.append(F.cross_entropy(self.class_logits(hidden[rows], task),
                                                  batch["label"][rows], reduction="none"))
        return torch.cat(per_window).mean()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["tokens"].shape[0])
        return loss


# --- evaluation ------------------------------------------------------------------------------
@torch.no_grad()
def score(model: GenomicsModel, task: str, items: list[tuple[list[int], int, int]],
          batch_tokens: int = 8192) -> float | None:
    """Accuracy (classification) or bits per nucleotide (lm) over `items`; None where the
    encoding cannot represent the positions."""
    model.eval()
    per_batch = max(1, batch_tokens // len(items[0][0]))
    hits, total = 0.0, 0
    try:
        for i in range(0, len(items), per_batch):
            batch = collate(items[i:i + per_batch])
            hidden = model(batch["tokens"])
            if task == "lm":
                nll = model.nucleotide_nll(hidden, batch["tokens"])
                hits, total = hits + float(nll.sum()), total + nll.numel()
            else:
                pred = model.class_logits(hidden, task).argmax(-1)
                hits, total = hits + float((pred == batch["label"]).sum()), total + len(pred)
    except PositionOutOfRangeError:
        return None
    return hits / total / math.log(2) if task == "lm" else hits / total


def evaluate(model: GenomicsModel, data: GenomicsData) -> dict[str, float | None]:
    """Every ``<task>@<m>x`` column: trained tasks scored, untrained ones None."""
    out: dict[str, float | None] = {}
    for task in TASKS:
        for m in data.multipliers:
            if task not in data.tasks:
                out[f"{task}@{m}x"] = None
                continue
            items = data.lm_windows(m) if task == "lm" else data.eval_set(task, m)
            out[f"{task}@{m}x"] = score(model, task, items)
    return out


def plot_tasks(records: list[dict[str, Any]], path: Path, setting: str = "default",
               rows: list[str] | None = None) -> Path:
    """One panel per task (accuracy, accuracy, bits/nt) vs window length, one line per
    encoding with the seeds' sd as a band."""
    from mmpe.plot.style import save, subplots
    from mmpe.results.report import draw_bands, summarise

    runs = [r for r in records if r["setting"] == setting and (not rows or r["encoding"] in rows)]
    summary = summarise(runs, COMPARE.columns)
    # two panels a row, 6.9 inches: shown at the docs' 688 px column unscaled (labels and legend
    # keep their size, mmpe.plot.legibility); a spare panel holds the legend
    rows_n = -(-(len(TASKS) + 1) // 2)
    fig, axes = subplots(rows_n, 2, figsize=(6.9, 2.9 * rows_n), squeeze=False)
    flat = list(axes.flat)
    x = np.arange(len(MULTIPLIERS))
    for ax, task in zip(flat, TASKS, strict=False):
        draw_bands(ax, summary, [f"{task}@{m}x" for m in MULTIPLIERS])
        ax.set_title(task)
        ax.set_xticks(x, [f"{m}x" for m in MULTIPLIERS])
        ax.set_xlabel("window / L")
        if task in CLASSIFY:
            ax.axhline(0.5, color="0.6", lw=0.8, ls=":")  # chance
            ax.set_ylim(-0.03, 1.03)
            ax.set_ylabel("accuracy (higher is better)")
        else:
            ax.set_ylabel("bits per nucleotide (lower is better)")
    for ax in flat[len(TASKS):]:
        ax.axis("off")
    flat[-1].legend(*flat[0].get_legend_handles_labels(), fontsize=8, loc="center", ncols=2)
    return save(fig, path)


class GenomicsCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.max_positions", "model.max_len", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> GenomicsCLI:
    return make_lightning_cli(GenomicsCLI, GenomicsModel, GenomicsData, args, run)


def run_one(encoding: str, *, seed: int, out_dir: Path,
            cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/genomics/default.yaml`; score every column."""
    cli = fit_for_compare(make_cli, "genomics", encoding, seed=seed, out_dir=out_dir,
                          cli_args=cli_args)
    return evaluate(cli.model, cli.datamodule)


if __name__ == "__main__":
    make_cli()
    sys.exit(0)
