"""FIRE's CPU forms.

FIRE's CPU forms (Li et al. 2024, eq. 4): its term on given pairs for the grids' offset
tables, its rows on a block's range of inputs as ramps or pieces of the MLP (`BlockMLP`),
head by head, tile by tile with the gradient by hand, and on `toeplitz` sequences in `O(n)`
tensors (`FIRECompact`). Every form gives the numbers of
[FIRE.score_mod][mmpe.encodings.fire.FIRE.score_mod]: the MLP as its linear pieces."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe._scratch import block_empty
from mmpe.attention.fast_forms.by_class import register
from mmpe.attention.fast_forms.fire_tiles import BlockMLP, FIRETiles, on_pieces
from mmpe.attention.term_layouts import BiasTiles, CompactBias, distance_rows
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.fire import FIRE


def pair_term(self: FIRE, ctx: AttentionCall, q_idx: Tensor, kv_idx: Tensor,
              b: Tensor) -> Tensor:
    """The term on the given pairs only.

    The term on the given pairs only, `[n_h, *pairs]` float32 (broadcast `q_idx`,
    `kv_idx`, `b`), for the grid plans' table over cell offsets: the normalised distance
    once per pair, then the MLP's linear pieces per head (through `score_mod` the
    normaliser's graph was kept per head: 15 MB more at 128 × 128)."""
    return _on_pieces(self, self.normalised_distance(ctx, q_idx, kv_idx, b)).movedim(-1, 0)


def _on_pieces(self: FIRE, x: Tensor) -> Tensor:
    """The MLP on inputs `x [...]` as its linear pieces, `[..., n_h]`: each input's piece,
    then one multiply-add per head instead of a hidden layer per input."""
    return on_pieces(*self.pieces(), x)


def rows(self: FIRE, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The MLP on the pairs of queries `start … stop−1`.

    The MLP on the pairs of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`
    float32: on the block's range of inputs, as ramps shared by the heads or piece by piece
    (`BlockMLP` in `mmpe.attention.fast_forms.fire_tiles`; without a gradient chunk by chunk in the
    cache). A pair's number is the same in every block, and that of the tiles plan's backward
    pass's tiles."""
    x = _input_rows(self, ctx, start, stop)  # [b', 1, R, n_k]
    if torch.compiler.is_compiling():  # (the block's range is read eagerly)
        return _on_pieces(self, x).squeeze(1).permute(0, 3, 1, 2)
    mlp = BlockMLP(*self._pieces(), x, _input_bound(self, ctx))
    if torch.is_grad_enabled():
        return mlp.rows(x)
    shape = (x.shape[0], self.num_heads, *x.shape[2:])
    return mlp.chunks(x, out=block_empty(self, "rows", shape, x.dtype, x.device))


def _extent_rows(self: FIRE, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The coordinates' extent of queries `start … stop−1`, `[b or 1, 1, R, 1]` float32."""
    coords = ctx.coords
    b, _, q, _ = index_grid(coords.batch_size or 1, 1, coords.num_queries, 1, coords.device)
    return coords.extent(q[:, :, start:stop], b).float()


def _normaliser(self: FIRE, extent: Tensor) -> Tensor:
    return self._psi(torch.maximum(extent, self._threshold())) + self.eps


def _norm_rows(self: FIRE, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """`ψ(max(L, extent)) + eps` of queries `start … stop−1`, `[b or 1, 1, R, 1]`."""
    return _normaliser(self, _extent_rows(self, ctx, start, stop))


@torch.no_grad()
def _input_bound(self: FIRE, ctx: AttentionCall) -> Tensor:
    """The largest input `ψ(extent) / ψ(max(L, extent))` over the queries (0-d): a bound on
    every pair's input where no distance exceeds its query's extent (points: the
    diameter; graphs; causal sequences)."""
    extent = _extent_rows(self, ctx, 0, ctx.coords.num_queries)
    return (self._psi(extent) / _normaliser(self, extent)).amax()


def _input_rows(self: FIRE, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The MLP's input `ψ(d) / ψ(max(L, extent))` on the rows' pairs, `[b or 1, 1, R,
    n_k]` float32: the operations of normalised_distance on the coordinates' eager
    distance rows."""
    d, norm = distance_rows(ctx, start, stop).float(), _norm_rows(self, ctx, start, stop)
    if torch.is_grad_enabled() and (d.requires_grad or norm.requires_grad
                                    or self.c.requires_grad):
        return self._psi(d) / norm
    return _psi_rows(self, d).div_(norm)


def _psi_rows(self: FIRE, d: Tensor) -> Tensor:
    """`ψ(d)` without a graph, in one scratch block (`mmpe._scratch`; the operations of
    `_psi`, the later ones in place: each fresh block costs its page faults; `d` may be the
    coordinates' own, so never in place on it)."""
    out = block_empty(self, "psi", d.shape, torch.float32, d.device)
    return torch.mul(self.c.detach().float(), d, out=out).abs_().add_(1.0).log_()


def tiles(self: FIRE, ctx: AttentionCall, start: int, stop: int,
               width: int) -> BiasTiles:
    """The rows of queries `start … stop−1` tile by tile.

    The rows of queries `start … stop−1` tile by tile, for the tiles plan's
    backward pass (see `BiasTiles` and `FIRETiles` in
    `mmpe.attention.fast_forms.fire_tiles`): the distances and the normaliser once per block, per
    tile the inputs and the MLP's ramps or pieces, and the gradient by hand (no autograd
    graph of the block's pairs)."""
    d = distance_rows(ctx, start, stop).float()
    norm = _norm_rows(self, ctx, start, stop)
    with torch.no_grad():
        x = _psi_rows(self, d.detach()).div_(norm)  # the numbers of _input_rows
    mlp = BlockMLP(*self._pieces(), x, _input_bound(self, ctx))
    return FIRETiles(mlp, x, d, norm, self.c.float(), ctx.batch or 1, width)


def compact(self: FIRE, ctx: AttentionCall) -> CompactBias:
    """FIRE's compact form on `toeplitz` coordinates.

    On `toeplitz` coordinates: `ψ` on the `n_q + n_k − 1` offsets, the normaliser
    on the `n_q` queries and the MLP's linear pieces (see `FIRECompact`)."""
    coords = ctx.coords
    n_q, n_k = coords.num_queries, coords.num_keys
    relation = torch.arange(n_k - 1, -n_q, -1, device=coords.device)
    psi = self._psi(relation.abs().to(torch.float32))  # the table of toeplitz_rows
    batch = coords.batch_size or 1
    extent = coords.extent(torch.arange(n_q, device=coords.device)[None, :],
                           torch.arange(batch, device=coords.device)[:, None]).float()
    threshold = self._threshold()
    norm = self._psi(torch.maximum(extent, threshold)) + self.eps
    slope, intercept, cuts = self.pieces()
    return FIRECompact(n_q, psi, norm.expand(norm.shape[0], n_q).contiguous(), slope, intercept,
                    cuts)


class FIRECompact(CompactBias):
    """FIRE's bias on `toeplitz` coordinates, one offset at a time where it can be.

    With `ψ` on the offsets and `norm` per query, a pair's input is `x = ψ[m] / norm[r]`
    and its bias `slope[p]·x + intercept[p]` on the MLP's piece `p` of `x`. In a block of
    queries the normaliser varies little, so on most offsets every query of the block falls on
    one piece (tested exactly: `x` lies between `ψ/max norm` and `ψ/min norm`, whose pieces
    agree); there the bias is `a[m] / norm[r] + c[m]` from two per-offset tables, and the
    gradient reduces per offset (sums along the anti-diagonals, one matrix product). The pairs
    of the remaining offsets (where a piece boundary crosses the block) are evaluated one by one.

    Args:
        n_q: queries.
        psi: `[n_q + n_k − 1]` `ψ(|relation|)` on the offsets of `toeplitz_rows`.
        norm: `[b or 1, n_q]` `ψ(max(L, extent)) + eps` per query (> 0).
        slope, intercept: `[W + 1, n_h]` the MLP's pieces; `cuts`: `[W]` their bounds.
    """

    def __init__(self, n_q: int, psi: Tensor, norm: Tensor, slope: Tensor, intercept: Tensor,
                 cuts: Tensor) -> None:
        super().__init__(psi, norm, slope, intercept, batch=norm.shape[0])
        self.n_q, self.heads, self.cuts = n_q, slope.shape[1], cuts.detach()
        self._psi, self._norm = psi.detach(), norm.detach()
        self._slope, self._intercept = slope.detach(), intercept.detach()
        self._last: tuple = ()

    def _block(self, start: int, stop: int, keys: int) -> dict[str, Tensor]:
        """Per-offset tables and the pairs on mixed offsets of one block (the backward pass
        asks for the block it has just built, so the last one is kept)."""
        if self._last and self._last[0] == (start, stop, keys):
            return self._last[1]
        rows, first = stop - start, self.n_q - stop
        psi = self._psi[first:first + rows + keys - 1]  # offset m = r + k of the block
        norm = self._norm[:, start:stop].flip(-1)  # [b', R], row r = query stop − 1 − r
        piece = torch.searchsorted(self.cuts, psi / norm.amax())
        uniform = piece == torch.searchsorted(self.cuts, psi / norm.amin())
        slope = (self._slope[piece] * uniform[:, None]).T.contiguous()  # [n_h, M], 0 if mixed
        mixed = (~uniform).nonzero()[:, 0]  # [Mx]
        r = torch.arange(rows, device=psi.device)[:, None]
        k = mixed[None, :] - r  # [R, Mx]: the key of each pair on a mixed offset
        valid = (k >= 0) & (k < keys)
        x = psi[mixed] / norm[:, :, None]  # [b', R, Mx], the division of score_mod
        mixed_piece = torch.searchsorted(self.cuts, x)
        block = dict(psi=psi, inv=1.0 / norm, piece=piece, uniform=uniform, slope=slope,
                     a=slope * psi, c=(self._intercept[piece] * uniform[:, None]).T.contiguous(),
                     mixed=mixed,
                     flat=torch.where(valid, r * keys + k, 0).view(-1), valid=valid, x=x,
                     mixed_piece=mixed_piece, mixed_slope=self._slope[mixed_piece])
        self._last = ((start, stop, keys), block)
        return block

    def release(self) -> None:
        self._last = ()

    def add_rows(self, out: Tensor, start: int, stop: int, base: Tensor | None) -> None:
        rows, keys = out.shape[-2:]
        blk, h = self._block(start, stop, keys), self.heads
        span = rows + keys - 1

        def per_offset(table: Tensor) -> Tensor:  # [n_h, M] -> [n_h, R, K], pair (r, k) at r + k
            return table.contiguous().as_strided((h, rows, keys), (span, 1, 1))

        c, inv = blk["c"], blk["inv"][:, None, :, None].expand(out.shape[0], 1, rows, 1)
        if base is None:
            out.addcmul_(per_offset(blk["a"]), inv).add_(per_offset(c))
        else:  # out = base + c + a / norm, one pass over the block
            torch.addcmul(per_offset(c + base), per_offset(blk["a"]), inv, out=out)
        if blk["mixed"].numel():
            x = blk["x"][..., None]  # [b', R, Mx, 1]
            value = blk["mixed_slope"] * x + self._intercept[blk["mixed_piece"]]
            value = (value * blk["valid"][..., None]).permute(0, 3, 1, 2)  # [b', n_h, R, Mx]
            flat = out.view(*out.shape[:2], rows * keys)
            flat.index_add_(-1, blk["flat"], value.reshape(*value.shape[:2], -1).expand(
                flat.shape[0], -1, -1).to(out.dtype))

    def accumulate_grads(self, d_diagonals: Tensor, start: int, stop: int,
                         grads: list[Tensor | None]) -> None:
        rows, width = d_diagonals.shape[-2:]
        keys = width - rows
        blk, h = self._block(start, stop, keys), self.heads
        d_psi, d_norm, d_slope, d_intercept = grads
        w = d_diagonals.to(self._psi.dtype)  # float64 attention: the bias is float32 anyway
        if w.shape[0] != self.batch:  # one bias for the whole batch
            w = w.sum(0, keepdim=True)
        span, inv, psi, first = rows + keys - 1, blk["inv"], blk["psi"], self.n_q - stop
        # Σ_r d and Σ_r d / norm_r on each offset, in one pass over the block.
        weights = torch.stack((torch.ones_like(inv), inv), dim=1)[:, None]  # [b', 1, 2, R]
        sums = torch.matmul(weights, w)[..., :span].sum(0)  # [n_h, 2, M]
        if d_intercept is not None:
            d_intercept.index_add_(0, blk["piece"], (sums[:, 0] * blk["uniform"]).T)
        if d_slope is not None:
            d_slope.index_add_(0, blk["piece"], (sums[:, 1] * psi * blk["uniform"]).T)
        if d_psi is not None:
            d_psi[first:first + span] += (blk["slope"] * sums[:, 1]).sum(0)
        if d_norm is not None:
            a = torch.nn.functional.pad(blk["a"], (0, width - span))[:, None]  # [n_h, 1, K+R]
            row = (w * a).sum((1, 3))  # [b', R]: Σ_h Σ_m d·a (a GEMV here is 5× slower)
            d_norm[:, start:stop] -= (row * inv * inv).flip(-1)
        mixed = blk["mixed"]
        if not mixed.numel():
            return
        d = w.index_select(-1, mixed).permute(0, 2, 3, 1)  # [b', R, Mx, n_h]; 0 off the block
        x, piece = blk["x"], blk["mixed_piece"].reshape(-1)
        if d_intercept is not None:
            d_intercept.index_add_(0, piece, d.reshape(-1, h))
        if d_slope is not None:
            d_slope.index_add_(0, piece, (d * x[..., None]).reshape(-1, h))
        d_x = (d * blk["mixed_slope"]).sum(-1)  # [b', R, Mx]
        if d_psi is not None:
            d_psi.index_add_(0, first + mixed, (d_x * inv[..., None]).sum((0, 1)))
        if d_norm is not None:
            d_norm[:, start:stop] -= ((d_x * x).sum(-1) * inv).flip(-1)


# FIRE's normalised distance on a grid is a function of the cell offset: the grid plans may
# take it (a declaration of what the term depends on, with the form their offset table reads)
register(FIRE, rows=rows, tiles=tiles, compact=compact, pair_term=pair_term,
         offset_on_grids=True)
