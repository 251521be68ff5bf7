"""What the sdpa route's plans read from a score term besides its `score_mod`.

A term's structure (`ScoreEncoding.structure`) tells a plan *what* the term is a function of;
the forms here are *how* a plan evaluates it fast on the CPU: tiles with their own backward pass
([BiasTiles][mmpe.attention.term_layouts.BiasTiles]), compact terms on `toeplitz` sequences
([CompactBias][mmpe.attention.term_layouts.CompactBias]), and the Toeplitz / anti-diagonal views
the relation plan reads them through. The generic forms come from the structure
([mmpe.attention.forms][]); the hand-written ones of single classes sit in
[mmpe.attention.fast_forms][].
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import distance_rows as coord_distance_rows
from mmpe.encodings.base import AttentionCall


def distance_rows(ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The coordinates' `distance` of queries `start … stop−1` to every key.

    The coordinates' `distance` of queries `start … stop−1` to every key, `[b or 1, 1,
    stop−start, n_k]`, shared by the heads (see
    `mmpe.coords.base.distance_rows`)."""
    return coord_distance_rows(ctx.coords, start, stop)


class CompactBias:
    """A content-free additive term held in a few `O(n)` tensors on `toeplitz` coordinates.

    The sdpa route expands it block by block of queries ([`add_rows`][mmpe.attention.term_layouts.CompactBias.add_rows]) and hands
    each block's gradient of the scores back ([`accumulate_grads`][mmpe.attention.term_layouts.CompactBias.accumulate_grads]), so training keeps no
    `n_q × n_k` autograd graph of the bias; autograd then carries the gradients w.r.t.
    `tensors` on to the encoding's parameters. A block lists its queries in reverse order
    (row `r` is query `stop − 1 − r`), so that pair `(r, k)` lies on anti-diagonal
    `m = r + k` of the block, one offset (see [`toeplitz_rows`][mmpe.attention.term_layouts.toeplitz_rows]).

    Args:
        tensors: the compact tensors (any may require grad).
        batch: `b` where the term differs per example, else 1.
    """

    def __init__(self, *tensors: Tensor, batch: int = 1) -> None:
        self.tensors, self.batch = tensors, batch

    def add_rows(self, out: Tensor, start: int, stop: int,
                 base: Tensor | None) -> None:  # pragma: no cover - abstract
        """Write the term of a block of queries into `out`, in place.

        Write the term of queries `stop−1 … start` (reversed) on keys `0 … K−1` into
        `out` `[b', n_h, stop−start, K]` in place, without autograd: `out = base + term`
        where `base` `[n_h or 1, stop−start+K−1]` is the sum of the other terms per offset
        (pair `(r, k)` at `base[.., r + k]`), or `out += term` for None."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop any scratch kept between the blocks of one pass (called after each pass)."""

    def accumulate_grads(self, d_diagonals: Tensor, start: int, stop: int,
                         grads: list[Tensor | None]) -> None:  # pragma: no cover - abstract
        """Add one block's share of the loss's gradient w.r.t. `tensors` to `grads`.

        Args:
            d_diagonals: `[b, n_h, R, K + R]`, the gradient w.r.t. the block's term in the
                layout of [`antidiagonal_buffer`][mmpe.attention.term_layouts.antidiagonal_buffer]: entry `[.., r, r + k]` is pair
                `(r, k)`'s, the others are zero (so a sum over rows is a sum per offset).
            grads: one accumulator per tensor, of its shape; None where no gradient is needed.
        """
        raise NotImplementedError


class BiasTiles:
    """A content-free additive term on one block of queries, tile by tile of keys.

    A content-free additive term on one block of queries, tile by tile of keys: the tiles
    plan's backward pass (`mmpe.attention.plans.tiles`) of a learned bias.

    That pass walks the block's pairs batch entry by batch entry, tile by tile of `width` keys
    (tile `j`: keys `j·width …`) and, within a tile, head by head `0 … n_h−1`, in cache. For
    each head of a tile it asks the term to [write][mmpe.attention.term_layouts.BiasTiles.write] its
    bias, computes the tile's `dS`, and hands it back at once
    ([take][mmpe.attention.term_layouts.BiasTiles.take]): the term reduces it onto its own small
    tensors (a per-head sum, a bin per bucket) while the tile is in cache, so no `[b, n_h, R,
    n_k]` bias or `dS` of the block is made. After the block,
    [pullback][mmpe.attention.term_layouts.BiasTiles.pullback] gives tensors that carry an autograd
    graph (parameters, positions) and their cotangents. `take` always follows the `write` of
    the same tile and head, and the heads of a tile follow each other, so a term may prepare
    a tile once for all heads (FIRE's inputs) and keep per-tile values until the last head's
    `take`.

    Attributes:
        dtype: the dtype of the term's rows (the term's rows'), in which the block's terms are
            summed before the sum is cast to the attention's dtype.
    """

    dtype: torch.dtype

    def write(self, out: Tensor, i: int, head: int, j: int,
              add: bool) -> None:  # pragma: no cover - abstract
        """The term's bias on one tile into `out`.

        The term's bias on tile `j` of batch entry `i` and head `head` into `out [R, K]`
        (contiguous, the attention's dtype): `out = bias`, or `out += bias` where `add`. The
        numbers are those the term's rows give on the same pairs."""
        raise NotImplementedError

    def take(self, d_s: Tensor, i: int, head: int,
             j: int) -> None:  # pragma: no cover - abstract
        """Accumulate the gradient w.r.t. the tile's bias, `d_s [R, K]` (contiguous)."""
        raise NotImplementedError

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:  # pragma: no cover - abstract
        """Tensors and their cotangents.

        Tensors and their cotangents: `torch.autograd.grad(tensors, inputs, cotangents)` is
        the block's vector-Jacobian product."""
        raise NotImplementedError


#: accumulators per bin where a [BiasTiles][mmpe.attention.term_layouts.BiasTiles] term sums a tile's
#: `dS` by bin (`scatter_add`): consecutive pairs of one bin (far pairs all in the last
#: distance bucket) would each wait for the previous add (3.4 ns a pair); spread over 8
#: copies of the bin, 0.6 ns.
SCATTER_LANES = 8

#: elements per chunk where a term builds its rows without a graph pass by pass (FIRE):
#: 256 kB of float32, so each chunk stays in the cache across the passes.
ROW_CHUNK = 1 << 16


def lane_codes(codes: Tensor) -> Tensor:
    """Bin codes spread over `SCATTER_LANES` copies of each bin.

    Bin codes `[..., R, K]` (int64) spread over `SCATTER_LANES` copies of each bin: code
    `c` of the `p`-th pair of a `[R, K]` tile becomes `c·SCATTER_LANES + p mod
    SCATTER_LANES` (gather from a table with each bin repeated `SCATTER_LANES` times, and
    fold the accumulators with [fold_lanes][mmpe.attention.term_layouts.fold_lanes])."""
    lanes = torch.arange(codes.shape[-2] * codes.shape[-1], device=codes.device)
    return codes * SCATTER_LANES + (lanes % SCATTER_LANES).view(codes.shape[-2:])


def fold_lanes(acc: Tensor) -> Tensor:
    """Accumulators `[..., bins·SCATTER_LANES]` summed per bin, `[..., bins]`."""
    return acc.unflatten(-1, (-1, SCATTER_LANES)).sum(-1)


def key_tiles(rows: Tensor, width: int) -> list[Tensor]:
    """`rows` cut into contiguous tiles of `width` keys.

    `rows [..., n_k]` cut into tiles of `width` keys, each contiguous `[..., K]` (so that a
    tile of one batch entry is one flat run of memory)."""
    return [rows[..., c:c + width].contiguous() for c in range(0, rows.shape[-1], width)]


def toeplitz_rows(table: Tensor, n_q: int, start: int, stop: int, n_keys: int) -> Tensor:
    """Queries `stop−1 … start` (reversed) × keys `0 … n_keys−1` of a Toeplitz matrix, a view.

    `table[..., s]` is the value at `kv_idx − q_idx = s − (n_q − 1)`, ``s = 0 … n_q + n_k
    − 2` (the relation `n_k − 1 − s`): row `r` of the block (query `stop − 1 − r``)
    starts at `s = n_q − stop + r`, so rows and keys both step by one element of the table and
    the block is an overlapping strided view of it (no `n×n` tensor is made).

    Args:
        table: `[.., n_q + n_k − 1]`, contiguous in its last dimension.

    Returns:
        `[.., stop−start, n_keys]` view of `table`.
    """
    *lead, length = table.shape
    rows = stop - start
    if (table.stride(-1) != 1 and length > 1) or n_q - stop + rows + n_keys - 1 > length:
        raise ValueError(f"toeplitz_rows: table {tuple(table.shape)} does not cover queries "
                         f"{start}…{stop - 1} of {n_q} and {n_keys} keys")
    return table.as_strided((*lead, rows, n_keys), (*table.stride()[:-1], 1, 1),
                            table.storage_offset() + n_q - stop)


def antidiagonal_buffer(shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, Tensor]:
    """A zeroed buffer and a view into it for anti-diagonal sums.

    A zeroed buffer and a `shape` `[.., R, K]` view into it that [`antidiagonal_sums`][mmpe.attention.term_layouts.antidiagonal_sums]
    sums along the anti-diagonals `r + k = const` (the offsets of a [`toeplitz_rows`][mmpe.attention.term_layouts.toeplitz_rows]
    block): row `r` of the view is shifted right by `r` in a `[.., R, K + R]` buffer, so
    summing the buffer over rows sums each anti-diagonal in one pass. Write into the view
    (`out=` or in place) to avoid copying the block."""
    *lead, rows, keys = shape
    buf = like.new_zeros((*lead, rows, keys + rows))
    view = buf.as_strided((*lead, rows, keys), (*buf.stride()[:-2], keys + rows + 1, 1))
    return buf, view


def antidiagonal_sums(buf: Tensor, lead_dims: int = 0) -> Tensor:
    """Sums of an anti-diagonal buffer along its anti-diagonals.

    Sums of the block written into an [`antidiagonal_buffer`][mmpe.attention.term_layouts.antidiagonal_buffer] along its anti-diagonals,
    `[.., R + K − 1]`: entry `m` sums the pairs with `r + k = m` (for a
    [`toeplitz_rows`][mmpe.attention.term_layouts.toeplitz_rows] block of queries `start … stop−1`: table index `n_q − stop + m`),
    also summed over the first `lead_dims` dimensions."""
    dims = (*range(lead_dims), buf.dim() - 2)
    return buf.sum(dims)[..., :-1]
