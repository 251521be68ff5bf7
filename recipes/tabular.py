"""Tabular classification with an FT-Transformer, with and without Tab-PET feature-graph PEs.

Data (all offline, installed with their packages):

* `breast_cancer` — scikit-learn's Wisconsin diagnostic breast cancer (569 × 30 numeric,
  2 classes; UCI, CC BY 4.0).
* `wine` — scikit-learn's wine recognition (178 × 13 numeric, 3 classes; UCI, CC BY 4.0).
* `image_segments` — river's ImageSegments (2,310 × 18 numeric, 7 classes; UCI statlog
  image segmentation; `pip install river`).
* `oj` — ISLP's Orange Juice purchases (1,070 × 17: 14 numeric and 3 categorical —
  `StoreID`, `STORE`, `Store7`; target `Purchase` CH/MM; `pip install --no-deps ISLP`).

Protocol (after Leng et al. 2025, Tab-PET): one fixed stratified split per table (seed
`data.split_seed`: 60 % train, 20 % validation, 20 % test). Everything estimated from data
— the numeric scaler, the category codes and the **feature graph** — sees the training rows
only. The model is FT-Transformer (Gorishniy et al. 2021): one token per feature (numeric:
`x_j·w_j + b_j`; categorical: an embedding per category plus `b_j`) and a `[CLS]` token
whose final state feeds the classifier. `mmpe compare tabular` trains every encoding with 5
model seeds on every table and reports the **test accuracy at the epoch of best validation
accuracy**, one stored run per seed (`mmpe report tabular`: mean ± sd over seeds).

Encodings: `nope` (no PE; FT-Transformer's per-feature bias `b_j` is still a learned
column embedding), `tabpet` (feature-graph Laplacian eigenvectors scaled by α and
concatenated; the tokenizer is narrowed by the PE width so the transformer keeps its size),
and score encodings on feature-graph hops (`alibi`, `t5`, `fire`).

    python -m mmpe.recipes.tabular fit --config configs/tabular/default.yaml --model.encoding tabpet \
        --data.dataset wine
    mmpe compare tabular --encodings nope,tabpet,alibi
    mmpe compare tabular --seeds 3 -- --compare.datasets wine,oj   # subset, fewer seeds
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from mmpe.recipes.common import (
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    make_optimizer,
    planned_steps,
    pop_option,
    require,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from mmpe.coords import Table
from mmpe.transformer import Transformer

DATASETS = ("breast_cancer", "wine", "image_segments", "oj")
SEEDS = 5

COMPARE = CompareSpec(
    metric="accuracy",
    columns=list(DATASETS),
    xlabel="table",
    lower_is_better=False,
    default_encodings=["nope", "tabpet", "alibi"],
    coords="table",
    title="FT-Transformer on real tables: test accuracy (mean ± sd over 5 seeds)",
    seeds=SEEDS,
    fmt="{:.4f}",
    notes=[
        "Test accuracy at the epoch of best validation accuracy; fixed stratified 60/20/20 split; "
        "5 model seeds (one stored run each).",
        "Feature graph from training rows only: |Spearman| (MI where columns are categorical: oj), "
        "4-NN sparsified; Tab-PET: 4 lowest + 2 highest sym-Laplacian eigenvectors, α = 1, width 8.",
        "nope: FT-Transformer without PE (its per-feature bias is a learned column embedding).",
    ],
)


# ----------------------------------------------------------------------------- data


def load_table(name: str) -> dict[str, Any]:
    """Raw table: `X [n, f]` float64 (numeric columns first, then categorical codes),
    `y [n]` int64 labels, `names`, `num_numeric`, `classes`.

    Raises:
        ValueError: unknown `name`.
        MissingDataError: `river` or `ISLP` not installed (the message names the command).
    """
    if name == "breast_cancer" or name == "wine":
        from sklearn import datasets

        bunch = datasets.load_breast_cancer() if name == "breast_cancer" else datasets.load_wine()
        return {"X": bunch.data.astype(np.float64), "y": bunch.target.astype(np.int64),
                "names": [str(n) for n in bunch.feature_names], "num_numeric": bunch.data.shape[1],
                "classes": [str(c) for c in bunch.target_names]}
    if name == "image_segments":
        river_datasets = require("river.datasets", "pip install river")
        rows = list(river_datasets.ImageSegments())
        names = list(rows[0][0])
        classes = sorted({label for _, label in rows})
        return {"X": np.array([[x[c] for c in names] for x, _ in rows], dtype=np.float64),
                "y": np.array([classes.index(label) for _, label in rows], dtype=np.int64),
                "names": names, "num_numeric": len(names), "classes": classes}
    if name == "oj":
        islp = require("ISLP", "pip install --no-deps ISLP")
        df = islp.load_data("OJ")
        categorical = ["StoreID", "STORE", "Store7"]
        numeric = [c for c in df.columns if c not in categorical and c != "Purchase"]
        cats = np.stack([df[c].astype("category").cat.codes.to_numpy() for c in categorical], 1)
        classes = [str(c) for c in df["Purchase"].cat.categories]
        return {"X": np.concatenate([df[numeric].to_numpy(np.float64), cats.astype(np.float64)], 1),
                "y": df["Purchase"].cat.codes.to_numpy().astype(np.int64),
                "names": numeric + categorical, "num_numeric": len(numeric), "classes": classes}
    raise ValueError(f"unknown table {name!r}; known tables: {', '.join(DATASETS)}")


def split_indices(y: np.ndarray, seed: int, val: float = 0.2, test: float = 0.2) -> dict[str, np.ndarray]:
    """Stratified train/val/test row indices (fractions of all rows), fixed by `seed`."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    rest, test_idx = train_test_split(idx, test_size=test, stratify=y, random_state=seed)
    train_idx, val_idx = train_test_split(rest, test_size=val / (1 - test), stratify=y[rest],
                                          random_state=seed)
    return {"train": np.sort(train_idx), "val": np.sort(val_idx), "test": np.sort(test_idx)}


@lru_cache(maxsize=16)
def prepare(name: str, split_seed: int, graph_method: str, sparsify: str | None, knn: int,
            k: int, k_high: int) -> dict[str, Any]:
    """Split, preprocess and estimate the feature graph — all fitted on the training rows.

    Numeric columns are standardised with the training mean/std; a categorical column's codes
    are re-indexed by the categories seen in training, unseen ones map to an extra "unknown"
    code. Cached per argument tuple (the graph does not depend on the model seed).
    """
    raw = load_table(name)
    X, y, m = raw["X"], raw["y"], raw["num_numeric"]
    split = split_indices(y, split_seed)
    train = X[split["train"]]
    out: dict[str, Any] = {"num_numeric": m, "num_classes": len(raw["classes"]), "names": raw["names"]}
    mean, std = train[:, :m].mean(0), train[:, :m].std(0)
    std = np.where(std > 0, std, 1.0)
    cards = []
    cat_maps = []
    for j in range(m, X.shape[1]):
        seen = np.unique(train[:, j])
        cat_maps.append({float(v): i for i, v in enumerate(seen)})
        cards.append(len(seen) + 1)  # + "unknown"
    for part, rows in split.items():
        xs = X[rows]
        num = torch.tensor((xs[:, :m] - mean) / std, dtype=torch.float32)
        cat = torch.tensor([[cat_maps[c].get(float(v), len(cat_maps[c])) for c, v in enumerate(r)]
                            for r in xs[:, m:]], dtype=torch.long).reshape(len(rows), X.shape[1] - m)
        out[part] = (num, cat, torch.tensor(y[rows]))
    out["cat_cardinalities"] = cards
    categorical = list(range(m, X.shape[1]))
    out["table"] = Table.from_data(train, method=graph_method, categorical=categorical,
                                   sparsify=sparsify, knn=knn, k=k, k_high=k_high, cls_token=True,
                                   feature_names=raw["names"])
    return out


class TabularData(L.LightningDataModule):
    """One table, split and preprocessed on its training rows, with its feature-graph coordinates.

    Args:
        dataset: one of [`DATASETS`][mmpe.recipes.tabular.DATASETS].
        batch_size: rows per step.
        split_seed: seed of the fixed stratified 60/20/20 split.
        graph_method: `"pearson"`, `"spearman"`, `"mi"` or `"auto"` (MI if the table has
            categorical columns, else Spearman); see [`mmpe.table_maths.feature_graph`][mmpe.table_maths.feature_graph].
        sparsify: `"knn"`, `"threshold"` or `None`.
        knn: neighbours per feature for `"knn"`.
        k, k_high: low/high-frequency Laplacian eigenvectors in the coordinates.
    """

    def __init__(self, dataset: str = "wine", batch_size: int = 64, split_seed: int = 0,
                 graph_method: str = "auto", sparsify: str | None = "knn", knn: int = 4, k: int = 4,
                 k_high: int = 2) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"unknown table {dataset!r}; known tables: {', '.join(DATASETS)}")
        self.save_hyperparameters()
        self.data = prepare(dataset, split_seed, graph_method, sparsify, knn, k, k_high)

    @property
    def schema(self) -> dict[str, Any]:
        """What the model needs: column counts, category sizes, classes and the coordinates."""
        d = self.data
        return {"num_numeric": d["num_numeric"], "cat_cardinalities": list(d["cat_cardinalities"]),
                "num_classes": d["num_classes"], "table": d["table"]}

    def _loader(self, part: str) -> DataLoader:
        return DataLoader(TensorDataset(*self.data[part]), batch_size=self.hparams.batch_size)

    def train_dataloader(self) -> DataLoader:
        # Shuffled per epoch from the run's seed; under DDP Lightning shards the order.
        return epoch_loader(TensorDataset(*self.data["train"]), self.hparams.batch_size)

    def val_dataloader(self) -> list[DataLoader]:
        """Validation and test: the model keeps the test accuracy of its best validation epoch."""
        return [self._loader("val"), self._loader("test")]

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


# ----------------------------------------------------------------------------- model


class FeatureTokenizer(nn.Module):
    """FT-Transformer tokens (Gorishniy et al. 2021): `[CLS]`, numeric, then categorical.

    Numeric feature `j`: `x_j · w_j + b_j`; categorical feature `j` with code `c`:
    `E_j[c] + b_j`; `[CLS]`: a learned vector. Initialisation `U(−1/√d, 1/√d)` (rtdl).

    Shapes: `forward(x_num [b, m], x_cat [b, c]) -> [b, 1 + m + c, d_token]`.
    """

    def __init__(self, num_numeric: int, cat_cardinalities: list[int], d_token: int) -> None:
        super().__init__()
        s = 1 / math.sqrt(d_token)
        n_feat = num_numeric + len(cat_cardinalities)
        self.weight = nn.Parameter(torch.empty(num_numeric, d_token).uniform_(-s, s))
        self.bias = nn.Parameter(torch.empty(n_feat, d_token).uniform_(-s, s))
        self.cls = nn.Parameter(torch.empty(1, 1, d_token).uniform_(-s, s))
        self.embed = nn.Embedding(max(1, sum(cat_cardinalities)), d_token)
        nn.init.uniform_(self.embed.weight, -s, s)
        # No categorical column: the (placeholder) table gets no gradient; frozen, DDP need not
        # look for unused parameters.
        self.embed.weight.requires_grad_(bool(cat_cardinalities))
        offsets = torch.tensor([0, *cat_cardinalities[:-1]], dtype=torch.long).cumsum(0)
        self.register_buffer("offsets", offsets[: len(cat_cardinalities)], persistent=False)
        self.num_numeric = num_numeric

    def forward(self, x_num: Tensor, x_cat: Tensor) -> Tensor:
        tokens = [x_num.unsqueeze(-1) * self.weight]
        if x_cat.shape[1]:
            tokens.append(self.embed(x_cat + self.offsets))
        x = torch.cat(tokens, dim=1) + self.bias
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)


class FTTransformerClassifier(L.LightningModule):
    """FT-Transformer with any table encoding; logs accuracy, keeps the best-validation test score.

    Args:
        encoding: registry name (`nope`, `tabpet`, `alibi`, `t5`, `fire` …).
        encoding_options: options per encoding name, e.g. `{"tabpet": {"alpha": 1.0}}`;
            only the entry of `encoding` is used.
        schema: linked from the data module (column counts, classes, `Table` coordinates).
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
    """

    def __init__(self, encoding: str = "nope", encoding_options: dict[str, dict[str, Any]] | None = None,
                 schema: dict[str, Any] | None = None, d_model: int = 32, num_heads: int = 4,
                 depth: int = 2, mlp_ratio: float = 2.0, dropout: float = 0.1, lr: float = 1e-3,
                 weight_decay: float = 1e-5, warmup_steps: int = 20) -> None:
        super().__init__()
        if schema is None:
            raise ValueError("FTTransformerClassifier: schema is required (linked from TabularData.schema)")
        self.save_hyperparameters(ignore=["schema"])
        spec = {"name": encoding, **(encoding_options or {}).get(encoding, {})}
        self.transformer = Transformer(d_model, num_heads, depth, [spec], mlp_ratio=mlp_ratio,
                                       dropout=dropout)
        d_token = d_model
        for enc in self.transformer.input_encodings:  # concatenating encodings narrow the tokens
            d_token = getattr(enc, "input_width", d_token)
        self.tokenizer = FeatureTokenizer(schema["num_numeric"], schema["cat_cardinalities"], d_token)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(d_model, schema["num_classes"]))
        self.coords: Table = schema["table"]
        self.best: dict[str, float] = {}
        self._counts = torch.zeros(2, 3)  # per dataloader: correct, total, loss sum

    def forward(self, x_num: Tensor, x_cat: Tensor) -> Tensor:
        """Class logits `[b, classes]`."""
        if self.coords.device != x_num.device:  # move the graph tensors once, with the model
            self.coords = self.coords.to(x_num.device)
        h = self.transformer(self.tokenizer(x_num, x_cat), self.coords)
        return self.head(h[:, 0])

    def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
        x_num, x_cat, y = batch
        loss = F.cross_entropy(self(x_num, x_cat), y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(y))
        return loss

    def on_validation_epoch_start(self) -> None:
        self._counts.zero_()

    def validation_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int,
                        dataloader_idx: int = 0) -> None:
        x_num, x_cat, y = batch
        logits = self(x_num, x_cat)
        self._counts[dataloader_idx] += torch.tensor([
            float((logits.argmax(-1) == y).sum()), float(len(y)),
            float(F.cross_entropy(logits, y, reduction="sum"))])

    def on_validation_epoch_end(self) -> None:
        # Under DDP each rank counted its shard: sum the counts (a no-op on one device).
        counts = self.trainer.strategy.reduce(self._counts.to(self.device), reduce_op="sum")
        (v_ok, v_n, v_loss), (t_ok, t_n, _) = counts.cpu().tolist()
        val_acc, val_loss, test_acc = v_ok / max(v_n, 1), v_loss / max(v_n, 1), t_ok / max(t_n, 1)
        self.log_dict({"val/acc": val_acc, "val/loss": val_loss}, sync_dist=True)
        if self.trainer.sanity_checking:
            return
        best = self.best
        if not best or (val_acc, -val_loss) > (best["val_acc"], -best["val_loss"]):
            self.best = {"val_acc": val_acc, "val_loss": val_loss, "test_acc": test_acc,
                         "epoch": float(self.current_epoch)}

    def test_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> None:
        x_num, x_cat, y = batch
        acc = (self(x_num, x_cat).argmax(-1) == y).float().mean()
        self.log("test/acc", acc, batch_size=len(y), sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["best"] = dict(self.best)  # the best-validation record survives a resume

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.best = dict(checkpoint.get("best", {}))

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        # Not trainer.estimated_stepping_batches: it would load the training data before a resumed
        # run restores the loader's place in the epoch (see mmpe.recipes.common.planned_steps).
        data = self.trainer.datamodule
        total = (planned_steps(self.trainer, len(data.data["train"][2]), data.hparams.batch_size)
                 if isinstance(data, TabularData) else int(self.trainer.estimated_stepping_batches))
        return make_optimizer(self, hp.lr, hp.weight_decay, hp.warmup_steps, max(1, total))


class TabularCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.schema", "model.schema", apply_on="instantiate")


def make_cli(args: list[str] | None = None, run: bool = True) -> TabularCLI:
    return make_lightning_cli(TabularCLI, FTTransformerClassifier, TabularData, args, run)


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train `encoding` with `seed` on every table; test accuracy per table.

    `mmpe compare` runs the seeds (`COMPARE.seeds`: 5) and stores one record per seed.
    Besides LightningCLI arguments, `cli_args` may hold `--compare.datasets a,b` (tables
    not run report None).

    Raises:
        ValueError: an unknown table name (names the known ones).
    """
    args = list(cli_args)
    if any(a.split("=")[0] == "--compare.seeds" for a in args):
        raise ValueError("tabular: --compare.seeds is gone; use `mmpe compare tabular --seeds N`")
    tables = [t.strip() for t in pop_option(args, "--compare.datasets", ",".join(DATASETS)).split(",")]
    for t in tables:
        if t not in DATASETS:
            raise ValueError(f"unknown table {t!r}; known tables: {', '.join(DATASETS)}")
    results: dict[str, float | None] = dict.fromkeys(DATASETS)
    for table in tables:
        cli = fit_for_compare(make_cli, "tabular", encoding, seed=seed, out_dir=Path(out_dir) / table,
                              cli_args=["--data.dataset", table, *args])
        results[table] = float(cli.model.best["test_acc"])
    return results


if __name__ == "__main__":
    make_cli()
