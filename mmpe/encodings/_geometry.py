"""Helpers shared by the geometry encodings (not a registered module: the name starts with `_`).

[`DistanceFeatureBias`][mmpe.encodings._geometry.DistanceFeatureBias] is the common shape of the distance-kernel biases of molecular
transformers (Graphormer-3D / Transformer-M / Uni-Mol Gaussian kernels, SchNet and DimeNet
radial bases): a function `f_h(d)` of the pairwise distance alone, one value per head, added
to the logits, evaluated vectorised over a trailing feature axis; FlexAttention gathers
from the table the eager path builds (see the class docstring for why not unrolled code).
[`safe_sqrt`][mmpe.encodings._geometry.safe_sqrt] and [`pad_axes`][mmpe.encodings._geometry.pad_axes] serve the position-based ones.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from mmpe.encodings._precision import full_precision
from mmpe.encodings.base import AttentionContext, ScoreEncoding, ScoreMod, distance_rows


def safe_sqrt(x: Tensor) -> Tensor:
    """`√x` for `x ≥ 0` with gradient 0 (not NaN) where `x == 0`."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))),
                       torch.zeros_like(x))


class DistanceFeatureBias(ScoreEncoding):
    """`score + f_h(d(q, k))`: a per-head function of the coordinates' distance.

    A subclass implements [`head_values`][mmpe.encodings._geometry.DistanceFeatureBias.head_values] (`d [...] -> [..., n_h]`, vectorised over a
    trailing feature axis, from the float32 parameter snapshot of [`parameters_f32`][mmpe.encodings._geometry.DistanceFeatureBias.parameters_f32]).

    [`bias_rows`][mmpe.encodings._geometry.DistanceFeatureBias.bias_rows] evaluates it on index grids (SDPA, block by block). The `score_mod`
    gathers from the table [`bias`][mmpe.encodings.base.ScoreEncoding.bias] builds once per call, `table[b, h, q_idx, kv_idx]`:
    a FlexAttention-compatible mod (a gather, as a learned bias; gradients reach the
    parameters through the table) that is the eager bias exactly. An unrolled scalar MLP is
    not an option at the papers' sizes: FlexAttention traces the mod on every call, and the
    `K·W ≈ 16k` scalar operations of a 128-kernel, 128-wide MLP take minutes to trace.
    Memory: the table is `[b or 1, n_h, n_q, n_k]` float32, the size of one score matrix.
    On a self-attention Grid the term is a function of the cell offset: the attention's grid
    paths (CPU relation path, GPU flex) evaluate [`pair_term`][mmpe.encodings._geometry.DistanceFeatureBias.pair_term]
    once per offset instead, `[n_h, Π (2 s_a − 1) + 3]`.
    """

    num_heads: int
    #: on a Grid the distance of two cells depends only on their offset (and the prefix kind):
    #: the attention's grid paths evaluate the term once per offset (`pair_term`)
    grid_offset_only = True

    def pair_term(self, ctx: AttentionContext, q_idx: Tensor, kv_idx: Tensor,
                  b: Tensor) -> Tensor:
        """The term on the given pairs only, `[*pairs, n_h]` float32 (broadcast `q_idx`,
        `kv_idx`, `b`): no table over all pairs (the grid paths' offset table reads it)."""
        self.check_context(ctx)
        d = ctx.coords.distance(q_idx, kv_idx, b).float()
        with full_precision(d.device):
            return self.head_values(self.parameters_f32(), d)

    def parameters_f32(self) -> dict[str, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def head_values(self, p: dict[str, Tensor], d: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        # float32: FlexAttention accumulates a captured tensor's gradient in its dtype, and a
        # bf16 accumulator over every pair loses it (relative error > 1 measured on an H200).
        # The table is the rows of bias_rows (which check the context): a subclass's own, or
        # this class's where the subclass overrides score_mod, whose bias_rows is then the
        # generic one that reads score_mod (ScoreEncoding.__init_subclass__)
        rows = type(self).bias_rows
        if inspect.unwrap(rows) is ScoreEncoding.bias_rows:  # (a plugin's is wrapped)
            rows = DistanceFeatureBias.bias_rows
        table = rows(self, ctx, 0, ctx.coords.num_queries).float()
        if table.shape[0] == 1:  # positions shared by the batch: no batch index
            shared = table[0]

            def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return score + shared[h, q_idx, kv_idx]

            return mod

        def mod_batched(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                        kv_idx: Tensor) -> Tensor:
            return score + table[b, h, q_idx, kv_idx]

        return mod_batched

    #: channels of the widest per-pair intermediate (kernels, hidden units): bounds the rows
    #: evaluated at once so that ``[b, rows, n_k, feature_width]`` fits the block budget.
    feature_width: int = 1

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The term of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`.

        Evaluated a chunk of rows at a time, so that the per-pair features `[b, rows, n_k, K]`
        stay within `mmpe.attention.block_bytes()` (they are `K/n_h` times the bias).
        """
        from mmpe.attention import block_bytes  # the attention module imports the encodings

        self.check_context(ctx)
        coords = ctx.coords
        batch = coords.batch_size or 1
        per_row = batch * coords.num_keys * max(self.feature_width, self.num_heads) * 4
        step = max(1, block_bytes() // max(1, per_row))
        p = self.parameters_f32()
        chunks = []
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            d = distance_rows(ctx, lo, hi).float()  # [b or 1, 1, rows, n_k]
            with full_precision(d.device):  # float32 features and MLP, also under autocast
                values = self.head_values(p, d)  # [b or 1, 1, rows, n_k, n_h]
            chunks.append(values.squeeze(1).permute(0, 3, 1, 2))
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=2)


def pad_axes(name: str, positions: Tensor, num_axes: int) -> Tensor:
    """`positions [..., a]` embedded in `num_axes ≥ a` axes (zeros appended: a line or a
    plane is a line or a plane in 3D space).

    Raises:
        ValueError: more axes than `num_axes` (naming both).
    """
    axes = positions.shape[-1]
    if axes > num_axes:
        raise ValueError(f"{name}: built for num_axes={num_axes}, the coordinates have {axes} "
                         f"axes; build it with num_axes={axes}")
    if axes == num_axes:
        return positions
    pad = positions.new_zeros(*positions.shape[:-1], num_axes - axes)
    return torch.cat((positions, pad), dim=-1)
