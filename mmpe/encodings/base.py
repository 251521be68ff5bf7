"""Base classes for the four places where position enters attention.

Expanding `softmax((U+P)W_q ((U+P)W_k)^T)` gives content–content, content–position and
position–position terms; every method in the literature acts at one of four hooks:

========  =====================================================  =================================
hook      what the encoding does                                 base class
========  =====================================================  =================================
input     returns `P` to add to (or concatenate with) tokens   [`InputEncoding`][mmpe.encodings.base.InputEncoding]
rotary    rotates `q` and `k` by position                    [`RotaryEncoding`][mmpe.encodings.base.RotaryEncoding]
score     adds to (or rescales) the attention logits             [`ScoreEncoding`][mmpe.encodings.base.ScoreEncoding]
kernel    replaces the softmax normalisation                     [`KernelEncoding`][mmpe.encodings.base.KernelEncoding]
========  =====================================================  =================================

Shapes use torchtune's notation: `b` batch, `s` sequence (tokens), `n_h` heads,
`h_d` head dimension, `n_q` / `n_k` query / key tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.capabilities import Capability, missing
from mmpe.validation import check_attention_work

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class PositionOutOfRangeError(ValueError):
    """A position lies outside what an encoding can represent (e.g. past a learned table)."""


class CachedDecodingError(ValueError):
    """Cached (incremental) decoding would not reproduce a full recomputation for this
    encoding at these positions; decode without a cache instead."""


@dataclass
class AttentionContext:
    """What a score or kernel encoding may read when it builds its term for one attention call.

    Attributes:
        coords: the coordinates of the tokens.
        num_heads: `n_h`.
        head_dim: `h_d`.
        batch: `b`.
        x: the attention layer's input `[b, n_q, d_model]` (content-dependent gates read it).
        q: queries after rotary encodings, `[b, n_h, n_q, h_d]`.
        k: keys after rotary encodings, `[b, n_h, n_k, h_d]`.
        v: values, `[b, n_h, n_k, h_d]`.
        cache: the layer's [`KVCache`][mmpe.cache.KVCache] in cached decoding (`k`/`v` then
            hold every cached key); encodings keep incremental state in `cache.state`.
    """

    coords: Coordinates
    num_heads: int
    head_dim: int
    batch: int
    x: Tensor | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    cache: Any = None


class Encoding(nn.Module):
    """Common base: the hook, and the coordinate capabilities an encoding needs.

    `needs` is set by [`mmpe.registry.register`][mmpe.registry.register] from its `needs=` argument (an
    unregistered subclass may set it as a class attribute).
    """

    hook: ClassVar[str] = ""
    needs: ClassVar[tuple[type[Capability], ...]] = ()

    def check_coords(self, coords: Coordinates) -> None:
        """Raise unless `coords` provides every capability this encoding needs.

        Raises:
            TypeError: `coords` lacks members of a capability (naming both), or is not a
                [`Coordinates`][mmpe.coords.base.Coordinates].
            ValueError: the members are there but a capability's condition is not met
                (`causal == True` for decoder-only methods, `num_axes == 1` for 1D ones).
        """
        name = getattr(self, "registry_name", type(self).__name__)
        if not isinstance(coords, Coordinates):
            raise TypeError(
                f"{name}: coords must be an mmpe Coordinates object, got {type(coords).__name__}"
            )
        gaps = [(cap.__name__, missing(coords, cap)) for cap in self.needs]
        gaps = [(cap, lacks) for cap, lacks in gaps if lacks]
        if not gaps:
            return
        what = "; ".join(f"{cap} needs {', '.join(lacks)}" for cap, lacks in gaps)
        message = (f"{name} needs coordinates providing {[c.__name__ for c in self.needs]}; "
                   f"{type(coords).__name__} does not: {what}")
        note = getattr(coords, "capability_note", None)  # why not, where the object knows
        if note:
            message += f" ({note})"
        # Members absent: the wrong kind of coordinates. Members present but a condition
        # unmet (causal == True, num_axes == 1): the right kind with the wrong values.
        members = {m for cap in self.needs for m in cap.members}
        if any(lack in members for _, lacks in gaps for lack in lacks):
            raise TypeError(message)
        raise ValueError(message)


class InputEncoding(Encoding):
    """Input hook: a tensor `P` combined with the token embeddings before the first layer."""

    hook = "input"

    def forward(self, coords: Coordinates) -> Tensor:  # pragma: no cover - abstract
        """Return `P`, `[s, d_model]` or `[b, s, d_model]`."""
        raise NotImplementedError

    def combine(self, x: Tensor, coords: Coordinates) -> Tensor:
        """Add `P` to token embeddings `x` `[b, s, d_model]` (override to concatenate)."""
        pe = self(coords)
        if pe.shape[-2:] != x.shape[-2:]:
            raise ValueError(
                f"{type(self).__name__}: x must be [b, {pe.shape[-2]}, {pe.shape[-1]}] to match "
                f"the coordinates, got {tuple(x.shape)}"
            )
        return x + pe.to(x.dtype)


class RotaryEncoding(Encoding):
    """Rotary hook: rotate queries and keys by their positions.

    Class attributes:
        length_dependent: the rotation of a token depends on how many tokens there are (dynamic
            NTK, LongRoPE's switch, xPos's centre), so a key cached at an earlier step would be
            stale: the attention module then caches unrotated keys and rotates all of them at
            every step. Fixed-frequency methods leave it False and have keys rotated once.
    """

    hook = "rotary"
    length_dependent: ClassVar[bool] = False

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """Rotate `q` `[b, n_h, n_q, h_d]` and `k` `[b, n_h, n_k, h_d]`."""
        raise NotImplementedError  # pragma: no cover - abstract


class ScoreEncoding(Encoding):
    """Score hook: a FlexAttention-style `score_mod(score, b, h, q_idx, kv_idx)`.

    A subclass implements `score_mod`. The same function runs inside FlexAttention (scalar
    indices, never an `n×n` tensor) and eagerly, evaluated on broadcast index grids by
    [`bias`][mmpe.encodings.base.ScoreEncoding.bias] — which is why the two paths give the same numbers.

    Class attributes:
        additive: the mod adds a term that does not depend on `score` (so the eager path can
            pass it to SDPA as an additive mask). Set False for rescaling methods.
        needs_probs: the encoding also adds a term computed from the attention probabilities
            (value-side relative terms); see [`value_term`][mmpe.encodings.base.ScoreEncoding.value_term].
        content_free: the term does not read the layer's q, k or x.
    """

    hook = "score"
    additive: ClassVar[bool] = True
    needs_probs: ClassVar[bool] = False
    #: the term depends on positions and parameters only (not on q, k, x): its eager bias is
    #: computed once per forward and shared by the layers that share the encoding.
    content_free: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Drop the eager forms a subclass would inherit without what they must agree with.

        A form (`bias_rows`, `relation_bias`, `head_rows`, `bias_tiles`, …; see
        `EAGER_FORMS`) gives the numbers of the `score_mod` (and `bias_rows`) of the class that
        defines it. A subclass that overrides `score_mod` but not, say, `relation_bias` would
        get its parent's term on the sequence path and its own under FlexAttention: a
        plausible wrong number. Such a form falls back to the generic one (`score_mod` on the
        pairs, or none). A subclass that keeps its parent's numbers re-declares the form
        (`relation_bias = Parent.relation_bias`, `grid_offset_only = True`)."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for form, sources in EAGER_FORMS.items():
            if form not in own and any(src in own for src in sources):
                inherited = getattr(cls, form, None)
                generic = vars(ScoreEncoding).get(form, _GENERIC_FORMS.get(form))
                if inherited is not None and inherited is not generic:
                    setattr(cls, form, generic)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_context(self, ctx: AttentionContext) -> None:
        """Raise unless `ctx`'s coordinates are supported and, for an encoding built for
        `num_heads` heads, the attention has that many (`ValueError` naming both); and
        unless the call's work fits `mmpe.validation.check_attention_work`'s limit on the CPU
        (`AttentionTooLargeError`)."""
        self.check_coords(ctx.coords)
        name = getattr(self, "registry_name", type(self).__name__)
        built = getattr(self, "num_heads", None)
        if built is not None and ctx.num_heads != built:
            raise ValueError(f"{name}: built for num_heads={built}, attention has {ctx.num_heads}")
        # Every path (flex, block-wise SDPA, math) builds the term through here first: refuse
        # a CPU call that would run for many minutes before any of it starts.
        coords = ctx.coords
        check_attention_work(name, batch=ctx.batch or coords.batch_size or 1,
                             num_heads=ctx.num_heads, num_queries=coords.num_queries,
                             num_keys=coords.num_keys, head_dim=ctx.head_dim,
                             device=ctx.q.device if ctx.q is not None else coords.device)

    def softmax_scale(self, head_dim: int) -> float | None:
        """Logit scale this method prescribes instead of `1/sqrt(h_d)`, or None."""
        return None

    def bias(self, ctx: AttentionContext) -> Tensor:
        """The additive term on every pair, `[b or 1, n_h, n_q, n_k]` (eager path): all the
        rows of [`bias_rows`][mmpe.encodings.base.ScoreEncoding.bias_rows] (`b` is the content's batch for content-dependent terms)."""
        return self.bias_rows(ctx, 0, ctx.coords.num_queries)

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The additive term of queries `start … stop−1` only, `[b or 1, n_h, stop−start,
        n_k]`: the memory-bounded CPU path evaluates a bias block by block with it. The
        default evaluates `score_mod` on those rows' index grid (equal by construction);
        an encoding with a faster eager form overrides it."""
        if not self.additive:
            raise TypeError(f"{type(self).__name__} rescales scores; it has no additive bias")
        coords = ctx.coords
        batch = ctx.batch if not self.content_free else (coords.batch_size or 1)
        b, h, q, k = index_grid(batch, ctx.num_heads, coords.num_queries, coords.num_keys,
                                coords.device)
        q = q[:, :, start:stop]
        zero = torch.zeros((), device=coords.device)
        out = self.score_mod(ctx)(zero, b, h, q, k)
        return out.expand(batch, ctx.num_heads, stop - start, coords.num_keys)

    def head_rows(self, ctx: AttentionContext, start: int, stop: int) -> HeadRows | None:
        """The rows of [`bias_rows`][mmpe.encodings.base.ScoreEncoding.bias_rows] head by
        head, without a graph (see [`HeadRows`][mmpe.encodings.base.HeadRows]), or None (the
        default: the blocked CPU path then builds every head's rows of a block at once)."""
        return None

    def value_term(self, probs: Tensor, ctx: AttentionContext) -> Tensor | None:
        """Extra output `[b, n_h, n_q, h_d]` from probabilities `[b, n_h, n_q, n_k]`, or None."""
        return None

    def relation_bias(self, ctx: AttentionContext, relation: Tensor) -> Tensor | None:
        """The additive term as a function of the relation alone, or None (the default).

        Called only on coordinates whose `toeplitz` is true (every allowed pair has
        `relation = q_idx + n_k − n_q − kv_idx` and `distance = |relation|`), so the
        term is a Toeplitz matrix that the eager attention path expands from this table
        block by block, and whose gradient it sums along the diagonals onto the table.

        Args:
            ctx: the attention call.
            relation: `[m]` int64 offsets `pos_q − pos_k` (tokens).

        Returns:
            `[n_h, m]` float32, differentiable in the encoding's parameters: the value
                `score_mod` adds to a pair with that relation; None where the term depends on
                more than the relation (FIRE's normaliser reads the query's position).
        """
        return None

    def compact_bias(self, ctx: AttentionContext) -> CompactBias | None:
        """The additive term in a compact form on `toeplitz` coordinates, for a term that is
        not a function of the relation alone (see [`CompactBias`][mmpe.encodings.base.CompactBias]), or None (the default:
        the attention then evaluates [`bias_rows`][mmpe.encodings.base.ScoreEncoding.bias_rows] on every pair)."""
        return None


#: a score term's optional eager forms, each with the definitions whose numbers it gives (in
#: order: a subclass's generic `bias_rows` also drops its parent's per-head and tile forms)
EAGER_FORMS: dict[str, tuple[str, ...]] = {
    "bias_rows": ("score_mod",),
    "bias": ("score_mod", "bias_rows"),
    "relation_bias": ("score_mod",),
    "compact_bias": ("score_mod",),
    "pair_term": ("score_mod",),
    "grid_offset_only": ("score_mod",),
    "head_rows": ("score_mod", "bias_rows"),
    "bias_tiles": ("score_mod", "bias_rows"),
    "bias_rows_vjp": ("score_mod", "bias_rows"),
}

#: the generic value of the forms `ScoreEncoding` does not define: absent (the grid path reads
#: `grid_offset_only` as a declaration, and `None` for the others as "no such form")
_GENERIC_FORMS: dict[str, Any] = {"grid_offset_only": False}


def distance_rows(ctx: AttentionContext, start: int, stop: int) -> Tensor:
    """The coordinates' `distance` of queries `start … stop−1` to every key, `[b or 1, 1,
    stop−start, n_k]` float32, shared by the heads: from the coordinates' own eager
    `distance_rows(start, stop)` where they have one (`Points`, `Graph`: the same numbers in
    fewer passes), else `distance` on the rows' index grid (what `score_mod` evaluates)."""
    coords = ctx.coords
    rows = getattr(coords, "distance_rows", None)
    if rows is not None:
        return rows(start, stop)
    b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                            coords.device)
    return coords.distance(q[:, :, start:stop], k, b)


class CompactBias:
    """A content-free additive term held in a few `O(n)` tensors on `toeplitz` coordinates.

    The eager attention path expands it block by block of queries ([`add_rows`][mmpe.encodings.base.CompactBias.add_rows]) and hands
    each block's gradient of the scores back ([`accumulate_grads`][mmpe.encodings.base.CompactBias.accumulate_grads]), so training keeps no
    `n_q × n_k` autograd graph of the bias; autograd then carries the gradients w.r.t.
    `tensors` on to the encoding's parameters. A block lists its queries in reverse order
    (row `r` is query `stop − 1 − r`), so that pair `(r, k)` lies on anti-diagonal
    `m = r + k` of the block, one offset (see [`toeplitz_rows`][mmpe.encodings.base.toeplitz_rows]).

    Args:
        tensors: the compact tensors (any may require grad).
        batch: `b` where the term differs per example, else 1.
    """

    def __init__(self, *tensors: Tensor, batch: int = 1) -> None:
        self.tensors, self.batch = tensors, batch

    def add_rows(self, out: Tensor, start: int, stop: int,
                 base: Tensor | None) -> None:  # pragma: no cover - abstract
        """Write the term of queries `stop−1 … start` (reversed) on keys `0 … K−1` into
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
                layout of [`antidiagonal_buffer`][mmpe.encodings.base.antidiagonal_buffer]: entry `[.., r, r + k]` is pair
                `(r, k)`'s, the others are zero (so a sum over rows is a sum per offset).
            grads: one accumulator per tensor, of its shape; None where no gradient is needed.
        """
        raise NotImplementedError


class BiasTiles:
    """A content-free additive term on one block of queries, tile by tile of keys: the blocked
    attention path's backward pass (`mmpe.attention.blocked`) of a learned bias.

    That pass walks the block's pairs batch entry by batch entry, tile by tile of `width` keys
    (tile `j`: keys `j·width …`) and, within a tile, head by head `0 … n_h−1`, in cache. For
    each head of a tile it asks the term to [write][mmpe.encodings.base.BiasTiles.write] its
    bias, computes the tile's `dS`, and hands it back at once
    ([take][mmpe.encodings.base.BiasTiles.take]): the term reduces it onto its own small
    tensors (a per-head sum, a bin per bucket) while the tile is in cache, so no `[b, n_h, R,
    n_k]` bias or `dS` of the block is made. After the block,
    [pullback][mmpe.encodings.base.BiasTiles.pullback] gives tensors that carry an autograd
    graph (parameters, positions) and their cotangents. `take` always follows the `write` of
    the same tile and head, and the heads of a tile follow each other, so a term may prepare
    a tile once for all heads (FIRE's inputs) and keep per-tile values until the last head's
    `take`.

    Attributes:
        dtype: the dtype of the term's rows (`bias_rows`'), in which the block's terms are
            summed before the sum is cast to the attention's dtype.
    """

    dtype: torch.dtype

    def write(self, out: Tensor, i: int, head: int, j: int,
              add: bool) -> None:  # pragma: no cover - abstract
        """The term's bias on tile `j` of batch entry `i` and head `head` into `out [R, K]`
        (contiguous, the attention's dtype): `out = bias`, or `out += bias` where `add`. The
        numbers are those `bias_rows` gives on the same pairs."""
        raise NotImplementedError

    def take(self, d_s: Tensor, i: int, head: int,
             j: int) -> None:  # pragma: no cover - abstract
        """Accumulate the gradient w.r.t. the tile's bias, `d_s [R, K]` (contiguous)."""
        raise NotImplementedError

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:  # pragma: no cover - abstract
        """Tensors and their cotangents: `torch.autograd.grad(tensors, inputs, cotangents)` is
        the block's vector-Jacobian product."""
        raise NotImplementedError


class HeadRows:
    """A content-free additive term on one block of queries, one head at a time: the blocked
    attention path's forward pass and its fused backward pass (`mmpe.attention.blocked`).

    That path calls SDPA's fused CPU kernel once per batch entry and head, on a block of
    queries larger than an all-heads block could be in the same memory; for each call every
    term [write][mmpe.encodings.base.HeadRows.write]s the rows of that head into one `[R,
    n_k]` buffer. The term computes what all heads share (the block's distances, FIRE's
    inputs, Graphormer's bucket codes) once, when it is made
    ([ScoreEncoding.head_rows][mmpe.encodings.base.ScoreEncoding.head_rows]), and per head only the
    head's own pass (a product, a gather), chunk by chunk of `chunk` pairs in the cache.

    Attributes:
        dtype: the dtype of the term's rows (`bias_rows`').
        chunk: pairs per chunk of [fill][mmpe.encodings.base.HeadRows.fill].
    """

    dtype: torch.dtype
    chunk: int = 1 << 16
    _scratch: Tensor | None = None

    def write(self, out: Tensor, i: int, head: int, add: bool) -> None:
        """The term of batch entry `i` and head `head` on the block's pairs into `out [R,
        n_k]` (contiguous; `dtype` or a wider float dtype in which the terms are summed): `out
        = bias`, or `out += bias` where `add`. The numbers are those `bias_rows` gives."""
        flat = out.view(-1)
        direct = not add and out.dtype == self.dtype
        if not direct and self._scratch is None:
            self._scratch = torch.empty(min(self.chunk, flat.numel()), dtype=self.dtype,
                                        device=out.device)
        for c in range(0, flat.numel(), self.chunk):
            part = flat[c:c + self.chunk]
            if direct:
                self.fill(part, i, head, c)
                continue
            term = self._scratch[:part.numel()]
            self.fill(term, i, head, c)
            part.add_(term) if add else part.copy_(term)

    def fill(self, out: Tensor, i: int, head: int,
             offset: int) -> None:  # pragma: no cover - abstract
        """The term on the block's flat pairs `offset … offset + len(out) − 1` (row-major `[R,
        n_k]`) of batch entry `i` and head `head` into the flat `out` (`dtype`)."""
        raise NotImplementedError


class ScaledRows(HeadRows):
    """A term that is a per-head multiple of rows shared by the heads: `rows [b or 1, 1, R,
    n_k]` times `scale[head]` (ALiBi's `−m_h·d`), in that order of operands."""

    def __init__(self, rows: Tensor, scale: Tensor) -> None:
        self.dtype = torch.result_type(rows, scale)
        self.flat = rows.detach().reshape(rows.shape[0], -1)
        self.scale = scale.detach()
        self.chunk = self.flat.shape[1] or 1  # one pass: no chunks needed

    def fill(self, out: Tensor, i: int, head: int, offset: int) -> None:
        rows = self.flat[min(i, self.flat.shape[0] - 1), offset:offset + out.numel()]
        torch.mul(rows, self.scale[head], out=out)


#: accumulators per bin where a [BiasTiles][mmpe.encodings.base.BiasTiles] term sums a tile's
#: `dS` by bin (`scatter_add`): consecutive pairs of one bin (far pairs all in the last
#: distance bucket) would each wait for the previous add (3.4 ns a pair); spread over 8
#: copies of the bin, 0.6 ns.
SCATTER_LANES = 8

#: elements per chunk where a term builds its rows without a graph pass by pass (FIRE,
#: KERPLE-log): 256 kB of float32, so each chunk stays in the cache across the passes.
ROW_CHUNK = 1 << 16


def lane_codes(codes: Tensor) -> Tensor:
    """Bin codes `[..., R, K]` (int64) spread over `SCATTER_LANES` copies of each bin: code
    `c` of the `p`-th pair of a `[R, K]` tile becomes `c·SCATTER_LANES + p mod
    SCATTER_LANES` (gather from a table with each bin repeated `SCATTER_LANES` times, and
    fold the accumulators with [fold_lanes][mmpe.encodings.base.fold_lanes])."""
    lanes = torch.arange(codes.shape[-2] * codes.shape[-1], device=codes.device)
    return codes * SCATTER_LANES + (lanes % SCATTER_LANES).view(codes.shape[-2:])


def fold_lanes(acc: Tensor) -> Tensor:
    """Accumulators `[..., bins·SCATTER_LANES]` summed per bin, `[..., bins]`."""
    return acc.unflatten(-1, (-1, SCATTER_LANES)).sum(-1)


def key_tiles(rows: Tensor, width: int) -> list[Tensor]:
    """`rows [..., n_k]` cut into tiles of `width` keys, each contiguous `[..., K]` (so that a
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
    """A zeroed buffer and a `shape` `[.., R, K]` view into it that [`antidiagonal_sums`][mmpe.encodings.base.antidiagonal_sums]
    sums along the anti-diagonals `r + k = const` (the offsets of a [`toeplitz_rows`][mmpe.encodings.base.toeplitz_rows]
    block): row `r` of the view is shifted right by `r` in a `[.., R, K + R]` buffer, so
    summing the buffer over rows sums each anti-diagonal in one pass. Write into the view
    (`out=` or in place) to avoid copying the block."""
    *lead, rows, keys = shape
    buf = like.new_zeros((*lead, rows, keys + rows))
    view = buf.as_strided((*lead, rows, keys), (*buf.stride()[:-2], keys + rows + 1, 1))
    return buf, view


def antidiagonal_sums(buf: Tensor, lead_dims: int = 0) -> Tensor:
    """Sums of the block written into an [`antidiagonal_buffer`][mmpe.encodings.base.antidiagonal_buffer] along its anti-diagonals,
    `[.., R + K − 1]`: entry `m` sums the pairs with `r + k = m` (for a
    [`toeplitz_rows`][mmpe.encodings.base.toeplitz_rows] block of queries `start … stop−1`: table index `n_q − stop + m`),
    also summed over the first `lead_dims` dimensions."""
    dims = (*range(lead_dims), buf.dim() - 2)
    return buf.sum(dims)[..., :-1]


class KernelEncoding(Encoding):
    """Kernel hook: how masked, position-modified logits become attention output."""

    hook = "kernel"
    #: True where the kernel is the ordinary softmax (fused attention paths may be used).
    is_softmax: ClassVar[bool] = False

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """Map logits `[b, n_h, n_q, n_k]` (masked pairs at `-inf`) and values to output."""
        raise NotImplementedError  # pragma: no cover - abstract


def check_qk(name: str, q: Tensor, k: Tensor, head_dim: int | None = None,
             coords: Coordinates | None = None) -> None:
    """Validate rotary inputs `q` `[b, n_h, n_q, h_d]` and `k` `[b, n_kv, s_k, h_d]`.

    Rank 4; the same `b` and `h_d`; `n_h` a multiple of `n_kv` (grouped-query
    attention); with `coords`, `n_q` equal to its query count and `s_k` at most its key
    count (a cached decoder passes only the newest keys: they are the *last* `s_k` keys).

    Raises:
        ValueError: naming the argument and the expected shape.
    """
    for arg, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: {arg} must be [b, n_h, s, h_d] (rank 4), got {shape}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{name}: q {tuple(q.shape)} and k {tuple(k.shape)} must share b and h_d, and q's "
            "heads must be a multiple of k's"
        )
    if head_dim is not None and q.shape[-1] != head_dim:
        raise ValueError(f"{name}: q and k must have h_d={head_dim}, got {q.shape[-1]}")
    if coords is not None:
        if q.shape[-2] != coords.num_queries:
            raise ValueError(f"{name}: q has {q.shape[-2]} tokens but the coordinates have "
                             f"{coords.num_queries} queries")
        if k.shape[-2] > coords.num_keys:
            raise ValueError(f"{name}: k has {k.shape[-2]} tokens but the coordinates have only "
                             f"{coords.num_keys} keys")


def position_bound(coords: Coordinates) -> int:
    """One more than the largest key position (1D coordinates), computed once per object.

    `Sequence` knows it without reading the device (`max_position`); for other coordinates
    the value is read once and remembered on the object, so the layers of a model share it
    instead of each stalling the device.
    """
    known = getattr(coords, "max_position", None)
    if isinstance(known, int):
        return known + 1
    memo = coords.__dict__.get("_mmpe_position_bound")
    if memo is None:
        memo = coords.__dict__["_mmpe_position_bound"] = int(coords.key_positions[..., 0].max()) + 1
    return memo


def rotary_positions(coords: Coordinates, k: Tensor) -> tuple[Tensor, Tensor]:
    """Positions `[.., n_q, a]` of the queries and `[.., s_k, a]` of the keys `k` holds.

    A cached decoder rotates only its new keys: they are the last `s_k` of the coordinates'
    keys, so the cache keeps keys already rotated at their own positions.
    """
    return coords.query_positions, newest_key_positions(coords, k.shape[-2])


def newest_key_positions(coords: Coordinates, n_keys: int | None) -> Tensor:
    """Positions `[.., n_keys, a]` of the last `n_keys` keys (all keys for None): the keys
    a cached step holds."""
    kpos = coords.key_positions
    return kpos if n_keys is None else kpos[..., kpos.shape[-2] - n_keys:, :]


def table_positions(name: str, coords: Coordinates) -> Tensor:
    """Query positions `[s]` or `[b, s]` of 1D coordinates as table rows (int64).

    Raises:
        ValueError: positions that are not integers (a learned table has one row per integer
            position; continuous positions need a functional encoding such as `sinusoidal`).
    """
    pos = coords.query_positions[..., 0]
    if pos.dtype.is_floating_point or pos.dtype == torch.bool:
        raise ValueError(f"{name}: a learned table needs integer positions, got {pos.dtype} "
                         "positions; use a functional encoding (sinusoidal, rope) instead")
    return pos.long()
