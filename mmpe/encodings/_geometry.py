"""Helpers shared by the geometry encodings (not a registered module: the name starts with `_`).

[`DistanceFeatureBias`][mmpe.encodings._geometry.DistanceFeatureBias] is the common shape of the distance-kernel biases of molecular
transformers (Graphormer-3D / Transformer-M / Uni-Mol Gaussian kernels, SchNet and DimeNet
radial bases): a function `f_h(d)` of the pairwise distance alone, one value per head, added
to the logits, evaluated vectorised over a trailing feature axis; FlexAttention gathers
from the table the eager path builds (see the class docstring for why not unrolled code).
[`safe_sqrt`][mmpe.encodings._geometry.safe_sqrt] and [`pad_axes`][mmpe.encodings._geometry.pad_axes] serve the position-based ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe._scratch import block_bytes
from mmpe.coords.base import distance_rows, safe_sqrt  # noqa: F401  (safe_sqrt: its old home)
from mmpe.encodings._precision import full_precision, term_dtype
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod, Term


class DistanceFeatureBias(ScoreEncoding):
    """`score + f_h(d(q, k))`: a per-head function of the coordinates' distance (structure
    `"distance"`).

    A subclass implements [`head_values`][mmpe.encodings._geometry.DistanceFeatureBias.head_values] (`d [...] -> [..., n_h]`, vectorised over a
    trailing feature axis, from the parameter snapshot (float32, float64 in a float64 module) of [`term_parameters`][mmpe.encodings._geometry.DistanceFeatureBias.term_parameters]), and
    sets `feature_width`, the channels of its widest per-pair intermediate (the attention paths
    bound the rows they evaluate at once by it).

    The `score_mod` gathers from the whole table `table[b, h, q_idx, kv_idx]`, built once per
    call: a FlexAttention-compatible mod (a gather, as a learned bias; gradients reach the
    parameters through the table). An unrolled scalar MLP is not an option at the papers'
    sizes: FlexAttention traces the mod on every call, and the `K·W ≈ 16k` scalar operations of
    a 128-kernel, 128-wide MLP take minutes to trace. Memory: the table is `[b or 1, n_h, n_q,
    n_k]` float32, the size of one score matrix. The paths that need less (a grid's table over
    cell offsets, blocks of rows) read [`distance_term`][mmpe.encodings._geometry.DistanceFeatureBias.distance_term] instead.
    """

    num_heads: int
    structure = "distance"
    #: channels of the widest per-pair intermediate (kernels, hidden units): bounds the rows
    #: evaluated at once so that ``[b, rows, n_k, feature_width]`` fits the block budget.
    feature_width: int = 1

    def term_parameters(self) -> dict[str, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def head_values(self, p: dict[str, Tensor], d: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def distance_term(self, ctx: AttentionCall) -> Term:
        """`term(d, h) = f_h(d)`: every head's value on `d` (float32, also under autocast),
        then head `h`'s."""
        p, dtype = self.term_parameters(), term_dtype(self)

        def term(dist: Tensor, h: Tensor) -> Tensor:
            with full_precision(dist.device):
                values = self.head_values(p, dist.to(dtype))  # [*d, n_h]
            shape = torch.broadcast_shapes(dist.shape, h.shape)
            return values.expand(*shape, values.shape[-1]).gather(
                -1, h.expand(shape).unsqueeze(-1)).squeeze(-1)

        return term

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        # float32: FlexAttention accumulates a captured tensor's gradient in its dtype, and a
        # bf16 accumulator over every pair loses it (relative error > 1 measured on an H200).
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        table = self._table(ctx)
        if table.shape[0] == 1:  # positions shared by the batch: no batch index
            shared = table[0]

            def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return score + shared[h, q_idx, kv_idx]

            return mod

        def mod_batched(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                        kv_idx: Tensor) -> Tensor:
            return score + table[b, h, q_idx, kv_idx]

        return mod_batched

    def _table(self, ctx: AttentionCall) -> Tensor:
        """`f_h(d)` on every pair, `[b or 1, n_h, n_q, n_k]` float32, a chunk of query rows at a
        time so that the per-pair features `[b, rows, n_k, feature_width]` stay within the
        block budget (they are `feature_width / n_h` times the table)."""
        coords = ctx.coords
        per_row = (coords.batch_size or 1) * coords.num_keys * max(self.feature_width,
                                                                   self.num_heads) * 4
        step = max(1, block_bytes() // max(1, per_row))
        p, dtype = self.term_parameters(), term_dtype(self)
        chunks = []
        for lo in range(0, coords.num_queries, step):
            d = distance_rows(coords, lo, min(coords.num_queries, lo + step)).to(dtype)
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
