"""Length generalisation on synthetic reasoning tasks: train short, test long, per encoding.

The experiment of Kazemnejad et al. 2023 ("The Impact of Positional Encoding on Length
Generalization in Transformers", NeurIPS 2023, Fig. 3), with two remedies from the literature
beside the encodings: randomised positions (Ruoss et al. 2023, ACL) and Abacus digit
embeddings (McLeish et al. 2024, NeurIPS). A decoder-only transformer (`mmpe.CausalLM`)
reads `[task] input = output <eos>` and is trained on the answer tokens; tasks and their
data are generated on the machine (`mmpe.recipes.algorithmic`: copy, reverse, sort,
addition, parity, SCAN and passkey retrieval), deterministically per seed.

Protocol: each task `t` has a training length `L_t` (`data.train_lengths`); training
draws a task uniformly and an instance length uniformly from `1 … L_t`. Evaluation is exact
match of the whole answer (every answer token the argmax under teacher forcing, which equals
greedy decoding's exact match) on `data.eval_examples` fixed examples per length bucket:
`1x` = lengths `1 … L_t` (in distribution), `mx` = lengths `(m/2·L_t, m·L_t]`. The
column `<task> reach` is the largest `m` up to which every bucket keeps ≥ 50 % accuracy
(0: not even in distribution). Evaluation sets do not depend on the run's seed.

One model is trained on the mixture of all tasks (a task token first): Kazemnejad et al. train
one model per task; a mixture is what fits the 2-core budget (`--data.tasks [copy]` trains
on one task).

    python -m mmpe.recipes.lengthgen fit --config configs/lengthgen/default.yaml --model.encoding nope
    mmpe compare lengthgen --encodings nope,rope,alibi,abacus,rope+randpos

`<encoding>+randpos` trains with randomised positions drawn from `[0, data.random_positions)`
(default 256; it must cover the longest evaluation sequence).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence as Sequence_
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from mmpe.recipes import algorithmic as tasks_mod
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
from torch import Tensor
from torch.utils.data import Dataset

from mmpe import registry
from mmpe.coords import Numbers, Sequence, randomized_positions
from mmpe.coords.numbers import DigitPositioned
from mmpe.encodings.base import PositionOutOfRangeError
from mmpe.lm import CausalLM

TASKS = ["copy", "reverse", "sort", "addition", "parity", "scan", "passkey"]
MULTIPLIERS = (1, 2, 4, 8)
#: Training instance lengths: digits per string or operand, SCAN actions, passkey filler letters.
TRAIN_LENGTHS = {"copy": 8, "reverse": 8, "sort": 8, "addition": 4, "parity": 8, "scan": 6,
                 "passkey": 16}
RANDPOS = "+randpos"
#: Randomised positions as Ruoss et al.'s reference runs them: random ordered positions at
#: evaluation too (`<encoding>+randpos_ref`; `+randpos` evaluates with positions 0, 1, …).
RANDPOS_REF = "+randpos_ref"
#: Evaluation sets are the same for every run (seeded apart from the runs' seeds).
EVAL_SEED = 20_231_104

# --- the per-task protocol (Kazemnejad et al. 2023): one model per task, every length --------
#: Per-task runs are evaluated at every instance length 1 … EVAL_UP_TO · L.
EVAL_UP_TO = 2
#: The encodings the per-task protocol compares (the paper's five, FIRE, randomised positions).
PER_TASK_ENCODINGS = ["nope", "learned", "t5", "alibi", "rope", "fire", "rope+randpos",
                      "rope+randpos_ref"]
#: Training steps per task in the per-task plan (`configs/lengthgen/per_task.yaml` sets 1500):
#: copy, reverse and addition need more on two CPU cores (measured with NoPE, seed 0: reverse
#: 0.60 in distribution after 1,500 steps, 0.89 after 3,000; addition 0.27 after 1,500).
PER_TASK_STEPS = {"copy": 3000, "reverse": 3000, "addition": 3000}
#: Per-token chance of each task's answer tokens (digits 1/10, SCAN's 6 actions, one bit).
TOKEN_CHANCE = {"copy": 0.1, "reverse": 0.1, "sort": 0.1, "addition": 0.1, "parity": 0.5,
                "scan": 1 / 6, "passkey": 0.1}


def task_setting(task: str) -> str:
    """The store setting of a per-task run: `task-<task>`."""
    return f"task-{task}"


def length_column(task: str, n: int, tok: bool = False) -> str:
    """`copy[12]` (exact match at instance length 12) or `copy tok[12]` (per-token accuracy)."""
    return f"{task}{' tok' if tok else ''}[{n}]"


def per_task_lengths(task: str, train_length: int | None = None) -> list[int]:
    """The instance lengths a per-task run is evaluated at: `1 … EVAL_UP_TO · L`."""
    L_t = train_length or TRAIN_LENGTHS[task]
    return tasks_mod.task_lengths(task, 1, EVAL_UP_TO * L_t)


def per_task_columns(task: str) -> list[str]:
    """Summary columns of a per-task run, then every length's exact match and token accuracy."""
    lengths = per_task_lengths(task)
    return ([f"{task} ≤L", f"{task} >L", f"{task} tok >L", f"{task} reach/L"]
            + [length_column(task, n) for n in lengths]
            + [length_column(task, n, tok=True) for n in lengths])


def column_task(column: str) -> str:
    """The task a column belongs to (`"parity tok[3]"` -> `"parity"`)."""
    return column.replace("@", " ").replace("[", " ").split(" ")[0]


def chance(column: str) -> float | None:
    """Chance level of a column: exact match ≈ 0 except parity's one bit (0.5); per-token
    accuracy `TOKEN_CHANCE`; reach columns have none."""
    task = column_task(column)
    if "reach" in column or task not in TOKEN_CHANCE:
        return None
    if task == "parity":
        return 0.5
    return TOKEN_CHANCE[task] if " tok" in column else 0.0


def in_distribution(column: str) -> str | None:
    """The in-distribution column an extrapolation column is read against (`copy >L` ->
    `copy ≤L`, `copy@4x` -> `copy@1x`); None for in-distribution columns."""
    task = column_task(column)
    if column.startswith(f"{task}@"):  # the mixture's buckets
        return None if column == f"{task}@1x" else f"{task}@1x"
    if column == f"{task} reach":
        return f"{task}@1x"
    if column == f"{task} ≤L":
        return None
    if "[" in column:
        n = int(column.rsplit("[", 1)[1].rstrip("]"))
        if n <= TRAIN_LENGTHS[task]:
            return None
    return f"{task} ≤L"

COMPARE = CompareSpec(
    metric="exact-match accuracy",
    columns=([f"{t}@{m}x" for t in TASKS for m in MULTIPLIERS] + [f"{t} reach" for t in TASKS]
             + [c for t in TASKS for c in per_task_columns(t)]),
    xlabel="instance length bucket (multiples of the training length L of each task)",
    lower_is_better=False,
    default_encodings=["nope", "learned", "sinusoidal", "rope", "alibi", "t5", "fire", "kerple_log",
                       "cope", "abacus", "rope+randpos", "learned+randpos"],
    coords=Sequence(2, causal=True),
    title="Length generalisation: exact match per length bucket (train ≤ L)",
    fmt="{:.2f}",
    notes=[
        "1x: lengths 1…L (in distribution); mx: lengths (m/2·L, m·L]. reach: largest m with "
        "≥ 50 % in every bucket up to it.",
        "n/a: the encoding cannot represent those positions (a learned table of the training "
        "length).",
        "Per-task settings (task-<task>): one model per task trained on lengths ≤ L, evaluated "
        "at every length to 2 L; ≤L, >L: mean exact match over lengths ≤ L and L < n ≤ 2 L; "
        "tok: per-token accuracy; reach/L: the largest length n / L up to which every length "
        "keeps exact match above halfway between chance and 1.",
    ],
    check_encoding=lambda name: parse_encoding(name),
    plot=lambda records, path, setting="default", rows=None: (
        plot_per_length(records, path, setting.split(","), rows)
        if setting.startswith("task-") else plot_tasks(records, path, setting, rows)),
    chance=chance,
    in_distribution=in_distribution,
    command=lambda settings: (
        "python -m mmpe.recipes.lengthgen per-task --store results --seeds 0,1,2"
        if any(s.startswith("task-") for s in settings) else "mmpe compare lengthgen --store results"),
)


def parse_encoding(name: str) -> tuple[str, bool]:
    """`"rope+randpos"` -> `("rope", True)`, `"rope+randpos_ref"` too (see
    [`randpos_at_eval`][recipes.lengthgen.randpos_at_eval]); the base must be a registered
    encoding.

    Raises:
        ValueError: an unknown encoding (names the known ones).
    """
    for suffix in (RANDPOS_REF, RANDPOS):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            registry.get(base)
            return base, True
    registry.get(name)
    return name, False


def randpos_at_eval(name: str) -> bool:
    """Whether `name` evaluates with random ordered positions too (`<encoding>+randpos_ref`,
    the reference implementation of Ruoss et al. 2023)."""
    return name.endswith(RANDPOS_REF)


# --- data ------------------------------------------------------------------------------------
class Tokenizer:
    """The shared vocabulary of `mmpe.recipes.algorithmic` (`<pad>` is id 0)."""

    def __init__(self) -> None:
        self.vocab = tasks_mod.vocabulary()
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.digit_ids = [self.index[d] for d in tasks_mod.DIGITS]

    def encode(self, tokens: list[str]) -> list[int]:
        return [self.index[t] for t in tokens]


def bucket_lengths(task: str, train_length: int, m: int) -> list[int]:
    """Instance lengths of bucket `m`: `1 … L` for `m = 1`, else `(m/2·L, m·L]`."""
    low = 1 if m == 1 else m * train_length // 2 + 1
    return tasks_mod.task_lengths(task, low, m * train_length)


def encode_example(tok: Tokenizer, task: str, n: int, rng: np.random.Generator) -> tuple[list[int], int]:
    tokens, sep = tasks_mod.layout(task, tasks_mod.sample(task, n, rng))
    return tok.encode(tokens), sep


class TrainStream(Dataset):
    """`num_samples` training examples; item `(epoch, i)` is drawn from `(seed, epoch, i)`."""

    def __init__(self, tasks: list[str], train_lengths: dict[str, int], num_samples: int,
                 seed: int) -> None:
        self.tok, self.tasks, self.lengths = Tokenizer(), tasks, train_lengths
        self.num_samples, self.seed = num_samples, seed
        self.choices = {t: tasks_mod.task_lengths(t, 1, train_lengths[t]) for t in tasks}

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[list[int], int, int]:
        epoch, i = split_index(index)
        item_seed = mix_seed(self.seed, epoch, i)
        rng = np.random.default_rng(item_seed)
        task = self.tasks[int(rng.integers(len(self.tasks)))]
        n = self.choices[task][int(rng.integers(len(self.choices[task])))]
        ids, sep = encode_example(self.tok, task, n, rng)
        return ids, sep, item_seed


class Collate:
    """Right-pads a batch; the loss mask covers the answer and `<eos>`. With
    `random_positions` each row gets sorted random positions from `[0, random_positions)`
    drawn from its example's seed (Ruoss et al. 2023)."""

    def __init__(self, random_positions: int | None = None) -> None:
        self.random_positions = random_positions

    def __call__(self, items: list[tuple[list[int], int, int]]) -> dict[str, Tensor]:
        width = max(len(ids) for ids, _, _ in items)
        tokens = torch.zeros(len(items), width, dtype=torch.long)
        answer = torch.zeros(len(items), width - 1, dtype=torch.bool)
        for row, (ids, sep, _) in enumerate(items):
            tokens[row, :len(ids)] = torch.tensor(ids)
            answer[row, sep:len(ids) - 1] = True  # targets after `=`: the answer, then <eos>
        batch = {"tokens": tokens, "answer": answer}
        if self.random_positions is not None:
            batch["position_ids"] = torch.cat([
                randomized_positions(1, width - 1, self.random_positions,
                                     generator=torch.Generator().manual_seed(seed))
                for _, _, seed in items])
        return batch


class TaskData(L.LightningDataModule):
    """Generated reasoning tasks (`mmpe.recipes.algorithmic`).

    Args:
        tasks: the tasks trained and evaluated together.
        train_lengths: training instance lengths `L` per task (missing tasks: the defaults).
        batch_size: examples per step.
        eval_examples: fixed test examples per (task, length bucket).
        samples_per_epoch: training examples per epoch (fresh every epoch).
        random_positions: `L_max` of randomised positions for training, or None (ordinary
            positions). Set by `mmpe compare` for `<encoding>+randpos`.
        per_length: the per-task protocol (Kazemnejad et al. 2023): evaluate at every
            instance length `1 … EVAL_UP_TO · L` (`evaluate_per_length`) instead of the
            buckets; a learned table then holds every evaluated position (rows beyond the
            training sequences are never trained, as in the paper). Needs one task.
        eval_random_positions: evaluate with random ordered positions from
            `[0, random_positions)` too (Ruoss et al.'s reference; `<encoding>+randpos_ref`).

    Raises:
        ValueError: an unknown task, a non-positive length, or `random_positions` shorter
            than the longest evaluation sequence (before any training).
    """

    def __init__(self, tasks: list[str] | None = None, train_lengths: dict[str, int] | None = None,
                 batch_size: int = 64, eval_examples: int = 100, samples_per_epoch: int = 10**6,
                 random_positions: int | None = None, per_length: bool = False,
                 eval_random_positions: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tasks = list(tasks or TASKS)
        if not self.tasks:
            raise ValueError("lengthgen: data.tasks must name at least one task")
        for t in self.tasks:
            tasks_mod.check_task(t)
        self.lengths = {**TRAIN_LENGTHS, **(train_lengths or {})}
        for t, n in self.lengths.items():
            tasks_mod.check_task(t)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"lengthgen: data.train_lengths[{t!r}] must be an int >= 1, got {n!r}")
        if per_length and len(self.tasks) != 1:
            raise ValueError(f"lengthgen: data.per_length trains one model per task; data.tasks "
                             f"names {len(self.tasks)} ({self.tasks})")
        if eval_random_positions and random_positions is None:
            raise ValueError("lengthgen: data.eval_random_positions needs data.random_positions")
        self.tok = Tokenizer()
        self.longest_train = max(self.sequence_bound(t, self.lengths[t]) for t in self.tasks)
        up_to = EVAL_UP_TO if per_length else MULTIPLIERS[-1]
        self.longest_eval = max(self.sequence_bound(t, self.lengths[t] * up_to) for t in self.tasks)
        if random_positions is not None and random_positions < self.longest_eval:
            raise ValueError(
                f"lengthgen: data.random_positions={random_positions} is smaller than the longest "
                f"evaluation sequence ({self.longest_eval} tokens); randomised positions must cover "
                "every position seen at test time")

    @staticmethod
    def sequence_bound(task: str, n: int) -> int:
        """Tokens of the longest input sequence (without the final `<eos>`) at length ≤ n."""
        longest = max(tasks_mod.task_lengths(task, 1, n))
        ids, _ = encode_example(Tokenizer(), task, longest, np.random.default_rng(0))
        # Addition's sum may carry one digit more than this draw had.
        return len(ids) - 1 + (1 if task == "addition" else 0)

    @property
    def vocab_size(self) -> int:
        return len(self.tok.vocab)

    @property
    def table_positions(self) -> int:
        """Positions a learned table must hold: the randomised range, or the longest training
        sequence (the longest evaluated one in the per-task protocol)."""
        if self.hparams.random_positions:
            return self.hparams.random_positions
        return self.longest_eval if self.hparams.per_length else self.longest_train

    def train_dataloader(self):
        hp = self.hparams
        ds = TrainStream(self.tasks, self.lengths, hp.samples_per_epoch, seed=run_seed())
        return epoch_loader(ds, hp.batch_size, shuffle=False, with_epoch=True,
                            collate_fn=Collate(hp.random_positions))

    def eval_set(self, task: str, m: int) -> list[tuple[list[int], int, int]]:
        """The fixed examples of bucket `m` of `task` (empty where no length fits)."""
        lengths = bucket_lengths(task, self.lengths[task], m)
        rng = np.random.default_rng(mix_seed(EVAL_SEED, TASKS.index(task), m))
        out = []
        for _ in range(self.hparams.eval_examples if lengths else 0):
            ids, sep = encode_example(self.tok, task, lengths[int(rng.integers(len(lengths)))], rng)
            out.append((ids, sep, 0))
        return out

    def length_set(self, task: str, n: int) -> list[tuple[list[int], int, int]]:
        """`eval_examples` fixed examples of instance length exactly `n`; each carries its own
        seed for random evaluation positions. The same for every run and encoding."""
        rng = np.random.default_rng(mix_seed(EVAL_SEED, TASKS.index(task), 1000 + n))
        out = []
        for i in range(self.hparams.eval_examples):
            ids, sep = encode_example(self.tok, task, n, rng)
            out.append((ids, sep, mix_seed(EVAL_SEED, TASKS.index(task), n, i)))
        return out


# --- model -----------------------------------------------------------------------------------
class TaskLM(AdamWCosine, L.LightningModule):
    """A causal decoder (`mmpe.CausalLM`) trained on the answer tokens.

    Args:
        encoding: registry name (`abacus` reads digit places from `mmpe.Numbers`).
        encoding_options: extra options for it.
        vocab_size, max_len: linked from the data (`max_len`: positions a learned table holds).
        d_model, num_heads, depth: transformer size.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
    """

    def __init__(self, encoding: str = "nope", encoding_options: dict[str, Any] | None = None,
                 vocab_size: int = 64, max_len: int = 64, d_model: int = 64, num_heads: int = 4,
                 depth: int = 3, lr: float = 1e-3, weight_decay: float = 0.1,
                 warmup_steps: int = 200) -> None:
        super().__init__()
        self.save_hyperparameters()
        spec = {"name": encoding, **(encoding_options or {})}
        self.digits = registry.get(encoding).cls.needs == (DigitPositioned,)
        self.digit_ids = Tokenizer().digit_ids
        self.lm = CausalLM(vocab_size, d_model, num_heads, depth, [spec],
                           context={"max_len": max_len,
                                    "original_max_position_embeddings": max_len})

    def coords(self, tokens: Tensor, position_ids: Tensor | None = None) -> Sequence:
        if self.digits:
            return Numbers.from_tokens(tokens, self.digit_ids, causal=True, position_ids=position_ids)
        return Sequence(tokens.shape[1], causal=True, position_ids=position_ids, device=tokens.device)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["tokens"][:, :-1]
        return self.lm(tokens, self.coords(tokens, batch.get("position_ids")))

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        logits, answer = self(batch), batch["answer"]
        return F.cross_entropy(logits[answer], batch["tokens"][:, 1:][answer])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["tokens"].shape[0])
        return loss

    @torch.no_grad()
    def exact_match(self, batch: dict[str, Tensor]) -> Tensor:
        """Per example: every answer token predicted (greedy decoding's exact match)."""
        pred = self(batch).argmax(-1)
        wrong = (pred != batch["tokens"][:, 1:]) & batch["answer"]
        return ~wrong.any(-1)

    @torch.no_grad()
    def answer_hits(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Per example: exact match (answer and `<eos>`), correct answer tokens and answer
        tokens (`<eos>` not counted: per-token accuracy of Ruoss et al. 2023)."""
        pred = self(batch).argmax(-1)
        answer = batch["answer"]
        right = (pred == batch["tokens"][:, 1:]) & answer
        exact = (right == answer).all(-1)
        last = answer.long().cumsum(-1) == answer.long().sum(-1, keepdim=True)
        digits = answer & ~(last & answer)  # every answer target but the final <eos>
        return exact, (right & digits).sum(-1), digits.sum(-1)


def evaluate(model: TaskLM, data: TaskData, batch_size: int = 100) -> dict[str, float | None]:
    """Exact-match accuracy per (task, bucket) and each task's reach (see the module doc)."""
    model.eval()
    collate, out = Collate(), {}
    for task in data.tasks:
        for m in MULTIPLIERS:
            examples = data.eval_set(task, m)
            out[f"{task}@{m}x"] = _accuracy(model, [collate(examples[i:i + batch_size])
                                                     for i in range(0, len(examples), batch_size)])
        out[f"{task} reach"] = float(reach([out[f"{task}@{m}x"] for m in MULTIPLIERS]))
    return out


def evaluate_per_length(model: TaskLM, data: TaskData,
                        batch_size: int = 100) -> dict[str, float | None]:
    """The per-task protocol's metrics (see `per_task_columns`): exact match and per-token
    accuracy at every length `1 … EVAL_UP_TO · L`, their means over `≤ L` and `L < n`, and
    `reach/L`. With `data.eval_random_positions` every example gets sorted random positions
    from `[0, random_positions)` (its own fixed draw)."""
    model.eval()
    (task,) = data.tasks
    L_t = data.lengths[task]
    hp = data.hparams
    collate = Collate(hp.random_positions if hp.eval_random_positions else None)
    out: dict[str, float | None] = {}
    exact_by_n: dict[int, float | None] = {}
    for n in per_task_lengths(task, L_t):
        examples = data.length_set(task, n)
        try:
            hits = [model.answer_hits(collate(examples[i:i + batch_size]))
                    for i in range(0, len(examples), batch_size)]
        except PositionOutOfRangeError:
            exact_by_n[n] = out[length_column(task, n)] = out[length_column(task, n, True)] = None
            continue
        exact = torch.cat([h[0] for h in hits]).float().mean().item()
        tok = sum(int(h[1].sum()) for h in hits) / max(1, sum(int(h[2].sum()) for h in hits))
        exact_by_n[n] = out[length_column(task, n)] = exact
        out[length_column(task, n, True)] = tok
    inside = [n for n in exact_by_n if n <= L_t]
    beyond = [n for n in exact_by_n if n > L_t]
    out[f"{task} ≤L"] = _mean([exact_by_n[n] for n in inside])
    out[f"{task} >L"] = _mean([exact_by_n[n] for n in beyond])
    out[f"{task} tok >L"] = _mean([out[length_column(task, n, True)] for n in beyond])
    level = chance(length_column(task, 1))
    threshold = level + (1 - level) / 2
    reached = 0
    for n in sorted(exact_by_n):
        if exact_by_n[n] is None or exact_by_n[n] < threshold:
            break
        reached = n
    out[f"{task} reach/L"] = reached / L_t
    return out


def _mean(values: list[float | None]) -> float | None:
    """The mean, None where any value is None (an encoding that cannot represent a length)."""
    if not values or any(v is None for v in values):
        return None
    return float(np.mean(values))


def _accuracy(model: TaskLM, batches: list[dict[str, Tensor]]) -> float | None:
    if not batches:
        return None
    try:
        hits = torch.cat([model.exact_match(b) for b in batches])
    except PositionOutOfRangeError:
        return None
    return float(hits.float().mean())


def reach(accuracies: list[float | None], threshold: float = 0.5) -> int:
    """Largest multiplier up to which every bucket has accuracy ≥ `threshold` (0: none)."""
    best = 0
    for m, acc in zip(MULTIPLIERS, accuracies, strict=True):
        if acc is None or acc < threshold:
            break
        best = m
    return best


def plot_tasks(records: list[dict[str, Any]], path: Path, setting: str = "default",
               rows: list[str] | None = None) -> Path:
    """Accuracy vs length bucket, one panel per task, one line per encoding with the seeds'
    sd as a band (the layout of Kazemnejad et al. 2023, Fig. 3)."""
    from mmpe.plot.style import save, subplots
    from mmpe.results.report import draw_bands, summarise

    runs = [r for r in records if r["setting"] == setting and (not rows or r["encoding"] in rows)]
    summary = summarise(runs, COMPARE.columns)
    tasks = [t for t in TASKS if any(row[f"{t}@1x"].mean is not None for row in summary.values())]
    # three panels a row, 6.9 inches: shown at the docs' 688 px column unscaled, so labels and
    # legend keep their size (mmpe.plot.legibility checks it)
    cols = min(3, len(tasks))
    rows_n = -(-len(tasks) // cols)
    fig, axes = subplots(rows_n, cols, figsize=(2.3 * cols, 2.2 * rows_n), squeeze=False, sharey=True)
    flat = list(axes.flat)
    x = np.arange(len(MULTIPLIERS))
    for ax, task in zip(flat, tasks, strict=False):
        draw_bands(ax, summary, [f"{task}@{m}x" for m in MULTIPLIERS])
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
        ax.set_title(task)
        ax.set_xticks(x, [f"{m}x" for m in MULTIPLIERS])
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("length / L")
    for ax in flat[::cols]:
        ax.set_ylabel("exact match")
    handles, labels = flat[0].get_legend_handles_labels()
    for ax in flat[len(tasks):]:  # the spare panel holds the legend
        ax.axis("off")
    (flat[-1] if len(flat) > len(tasks) else fig).legend(handles, labels, fontsize=8, loc="center")
    return save(fig, path)


def plot_per_length(records: list[dict[str, Any]], path: Path, settings: list[str],
                    rows: list[str] | None = None) -> Path:
    """Exact match against instance length, one panel per task (the per-task settings), one
    line per encoding with the seeds' sd as a band, the training length L and chance marked:
    the shape of Kazemnejad et al. 2023, Fig. 3."""
    from mmpe.plot.style import save, subplots
    from mmpe.results.report import summarise

    tasks = [s.removeprefix("task-") for s in settings if s.startswith("task-")]
    tasks = [t for t in tasks if any(r["setting"] == task_setting(t) for r in records)] or tasks
    # three panels a row, 6.9 inches: shown at the docs' 688 px column unscaled, so labels and
    # legend keep their size (mmpe.plot.legibility checks it)
    cols = min(3, len(tasks))
    rows_n = -(-len(tasks) // cols)
    fig, axes = subplots(rows_n, cols, figsize=(2.3 * cols, 2.3 * rows_n), squeeze=False,
                         sharey=True)
    flat = list(axes.flat)
    for ax, task in zip(flat, tasks, strict=False):
        runs = [r for r in records if r["setting"] == task_setting(task)
                and (not rows or r["encoding"] in rows)]
        # The lengths and L the runs used (a config may change L; the spec's columns follow
        # the default).
        lengths = sorted({int(k[len(task) + 1:-1]) for r in runs for k in r["metrics"]
                          if k.startswith(f"{task}[")}) or per_task_lengths(task)
        L_t = _train_length(runs, task)
        summary = summarise(runs, [length_column(task, n) for n in lengths])
        for enc in (rows or summary):
            if enc not in summary:
                continue
            keep = [n for n in lengths if summary[enc][length_column(task, n)].mean is not None]
            mean = np.array([summary[enc][length_column(task, n)].mean for n in keep])
            sd = np.array([summary[enc][length_column(task, n)].sd or 0.0 for n in keep])
            (line,) = ax.plot(keep, mean, marker="o", ms=2.5, lw=1.2, label=enc)
            ax.fill_between(keep, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, lw=0)
        ax.axvline(L_t + 0.5, color="0.5", lw=0.8, ls="--")
        ax.axhline(chance(length_column(task, 1)), color="0.6", lw=0.8, ls=":")
        ax.set_title(f"{task} (L = {L_t})")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("instance length")
    for ax in flat[::cols]:
        ax.set_ylabel("exact match")
    handles, labels = [], []
    for ax in flat[:len(tasks)]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    for ax in flat[len(tasks):]:  # a spare panel holds the legend
        ax.axis("off")
    (flat[-1] if len(flat) > len(tasks) else fig).legend(handles, labels, fontsize=8, loc="center")
    return save(fig, path)


def _train_length(runs: list[dict[str, Any]], task: str) -> int:
    """The training length `L` of `task` in stored runs' resolved configs (default otherwise)."""
    for r in runs:
        for config in (r.get("config") or {}).values():
            lengths = ((config or {}).get("data") or {}).get("train_lengths") or {}
            if task in lengths:
                return int(lengths[task])
    return TRAIN_LENGTHS[task]


class LengthGenCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.table_positions", "model.max_len", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> LengthGenCLI:
    return make_lightning_cli(LengthGenCLI, TaskLM, TaskData, args, run)


def check_options(encoding: str, cli_args: list[str]) -> None:
    """Bad combinations, before any training: Abacus on tasks without numbers."""
    if encoding == "abacus":
        picked = _option(cli_args, "--data.tasks")
        names = TASKS if picked is None else [t.strip(" []'\"") for t in picked.split(",") if t.strip(" []")]
        if not any(tasks_mod.has_digits(t) for t in names):
            raise ValueError(f"lengthgen: abacus reads digit places, but data.tasks {names} contain "
                             "no numbers")


def _option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` (`<name>+randpos`: randomised positions) and evaluate."""
    base, randpos = parse_encoding(encoding)
    check_options(base, cli_args)
    extra = ["--data.random_positions", "256"] if randpos and _option(cli_args, "--data.random_positions") is None else []
    if randpos_at_eval(encoding):
        extra += ["--data.eval_random_positions", "true"]
    cli = fit_for_compare(make_cli, "lengthgen", base, seed=seed, out_dir=out_dir,
                          cli_args=[*extra, *cli_args])
    if cli.datamodule.hparams.per_length:
        return evaluate_per_length(cli.model, cli.datamodule)
    return evaluate(cli.model, cli.datamodule)


def run_per_task(store: str | Path = "runs/results", seeds: Sequence_[int] = (0, 1, 2),
                 tasks: Sequence_[str] = tuple(TASKS),
                 encodings: Sequence_[str] = tuple(PER_TASK_ENCODINGS),
                 out_dir: str | Path = "runs/compare/lengthgen_per_task",
                 allow_dirty: bool = False, extra: Sequence_[str] = ()) -> None:
    """The per-task protocol's whole plan, in the order that stores a complete first seed
    before any second: for each seed, each task, every encoding (`mmpe compare` per task,
    setting `task-<task>`, `configs/lengthgen/per_task.yaml`, `PER_TASK_STEPS` where a task
    needs more steps; `extra` comes last and overrides both). Stored runs are skipped, so a
    stopped plan continues where it stopped.

        python -m mmpe.recipes.lengthgen per-task --store results --seeds 0,1,2
    """
    from mmpe.recipes.common import CONFIGS
    from mmpe.recipes.compare import compare

    config = CONFIGS / "lengthgen" / "per_task.yaml"
    try:  # a relative path in the stored arguments where the run starts in the repository
        config = config.relative_to(Path.cwd())
    except ValueError:
        pass
    for seed in seeds:
        for task in tasks:
            steps = (["--trainer.max_steps", str(PER_TASK_STEPS[task])]
                     if task in PER_TASK_STEPS else [])
            compare("lengthgen", encodings=",".join(encodings), seed=seed, seeds=1, store=store,
                    setting=task_setting(task), out_dir=Path(out_dir) / task,
                    allow_dirty=allow_dirty,
                    cli_args=["--config", str(config), "--data.tasks", f"[{task}]", *steps, *extra])


def _per_task_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mmpe.recipes.lengthgen per-task",
                                     description=run_per_task.__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="runs/results")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, in order")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--encodings", default=",".join(PER_TASK_ENCODINGS))
    parser.add_argument("--out", default="runs/compare/lengthgen_per_task")
    parser.add_argument("--allow-dirty", action="store_true")
    args, extra = parser.parse_known_args(argv)
    run_per_task(args.store, [int(s) for s in args.seeds.split(",")], args.tasks.split(","),
                 args.encodings.split(","), args.out, args.allow_dirty, extra)


if __name__ == "__main__":
    if sys.argv[1:2] == ["per-task"]:
        _per_task_main(sys.argv[2:])
    else:
        make_cli()
    sys.exit(0)
