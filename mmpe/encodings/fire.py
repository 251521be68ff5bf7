"""FIRE: functional interpolation for relative positions (Li et al. 2024)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Metric
from mmpe.encodings._fire_pieces import piecewise_score_mod
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import (
    ROW_CHUNK,
    SCATTER_LANES,
    AttentionContext,
    BiasTiles,
    CompactBias,
    ScoreEncoding,
    ScoreMod,
    distance_rows,
    fold_lanes,
    key_tiles,
    lane_codes,
)
from mmpe.registry import register


@register(
    "fire", hook="score", needs=(Metric,),
    learnable=True, family="bias",
    paper="Li et al. 2024, Functional Interpolation for Relative Positions Improves Long "
          "Context Transformers (ICLR), eq. 4", context=("num_heads",))
class FIRE(SavesSettings, ScoreEncoding):
    """`b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) )` per head (Li et al. 2024, eq. 4).

    `ψ(x) = log(c·|x| + 1)` with learnable `c > 0`; `L` is a learnable threshold
    (`|L_mult · L_init|`) below which short queries are not over-normalised; `f_θ` is an MLP
    `1 → width → n_h` (ReLU), shared by all heads. Normalising by the query position maps
    every relative distance into `[0, 1]`, so a model trained at length `L` meets no unseen
    inputs at length `16L` — the paper's route to length generalisation. `i`, `j` are
    positions in tokens. On other coordinates `|i − j|` is their distance and `i` their
    `extent` (grid diagonal, graph diameter …), so the same MLP reads normalised distances.

    Args:
        num_heads: `n_h`.
        mlp_width: hidden width of `f_θ` (32 in the paper).
        init_c: initial `c` (0.1).
        init_L: initial threshold `L` (tokens, 512).
        eps: added to the normaliser to keep it positive.

    Raises:
        ValueError: non-positive `num_heads`, `mlp_width`, `init_c` or `init_L`.
    """

    saved_settings = ("eps",)
    #: on a Grid the term depends on a pair only through its cell offset (the extent is the
    #: grid's diagonal for every query): the attention's grid path reads it from a table
    grid_offset_only = True

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        for arg, val in (("num_heads", num_heads), ("mlp_width", mlp_width),
                         ("init_c", init_c), ("init_L", init_L)):
            if val <= 0:
                raise ValueError(f"fire: {arg} must be > 0, got {val}")
        self.num_heads, self.eps = num_heads, eps
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.init_L = nn.Parameter(torch.tensor(float(init_L)), requires_grad=False)
        self.L_mult = nn.Parameter(torch.tensor(1.0))
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))

    def _psi(self, x: Tensor, c: Tensor | None = None) -> Tensor:
        return torch.log(torch.abs((self.c.float() if c is None else c) * x) + 1.0)

    def _threshold(self) -> Tensor:
        return torch.abs(self.L_mult.float() * self.init_L.float())

    def normalised_distance(self, ctx: AttentionContext, q_idx: Tensor, kv_idx: Tensor,
                            b: Tensor, c: Tensor | None = None,
                            threshold: Tensor | None = None) -> Tensor:
        """`ψ(i − j) / ψ(max(L, i))` on the broadcast pairs (float32); `c` and `threshold`
        default to the module's (a `score_mod` passes its per-head copies)."""
        coords = ctx.coords
        rel = coords.distance(q_idx, kv_idx, b).float()
        i = coords.extent(q_idx, b).float()
        threshold = self._threshold() if threshold is None else threshold
        return self._psi(rel, c) / (self._psi(torch.maximum(i, threshold), c) + self.eps)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        """The term as linear pieces of the MLP (`mmpe.encodings._fire_pieces`): a few reads per
        score, so that compiled FlexAttention's backward adds into `W + 1` slopes and
        intercepts per head rather than into one address per hidden unit."""
        self.check_context(ctx)
        return piecewise_score_mod(self, ctx)

    def pair_term(self, ctx: AttentionContext, q_idx: Tensor, kv_idx: Tensor,
                  b: Tensor) -> Tensor:
        """The term on the given pairs only, `[*pairs, n_h]` float32 (broadcast `q_idx`,
        `kv_idx`, `b`), for the grid paths' table over cell offsets: the normalised distance
        once per pair, then the MLP's linear pieces per head (through `score_mod` the
        normaliser's graph was kept per head: 15 MB more at 128 × 128)."""
        self.check_context(ctx)
        return self._on_pieces(self.normalised_distance(ctx, q_idx, kv_idx, b))

    def _on_pieces(self, x: Tensor) -> Tensor:
        """The MLP on inputs `x [...]` as its linear pieces, `[..., n_h]`: each input's piece,
        then one multiply-add per head instead of a hidden layer per input."""
        slope, intercept, cuts = self.pieces()
        piece = piece_of(cuts, x.detach())
        return slope[piece] * x.unsqueeze(-1) + intercept[piece]

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The MLP on the pairs of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`
        (without a recorded gradient: the rows of
        [bias_rows_vjp][mmpe.encodings.fire.FIRE.bias_rows_vjp], head by head and chunk by
        chunk of `ROW_CHUNK` pairs, in the cache)."""
        self.check_context(ctx)
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return self._rows_in_chunks(ctx, start, stop)
        out = self._on_pieces(self._input_rows(ctx, start, stop))  # [b, 1, rows, n_k, n_h]
        return out.squeeze(1).permute(0, 3, 1, 2)

    def _rows_in_chunks(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The rows without a graph, `[b or 1, n_h, R, n_k]`: per head and chunk, the piece's
        intercept gathered, plus its slope gathered times `x` (the operations and rounding of
        `bias_rows_vjp`, with every pass over a chunk in the cache)."""
        x = self._input_rows(ctx, start, stop)  # [b', 1, R, n_k]
        slope, intercept, cuts = self.pieces()
        flat_x = x.reshape(x.shape[0], -1)
        piece = piece_of(cuts, flat_x)
        tables = [t.t().to(x.dtype).contiguous() for t in (slope, intercept)]  # [n_h, W+1]
        out = x.new_empty(x.shape[0], self.num_heads, *x.shape[2:])
        flat_out = out.view(*out.shape[:2], -1)
        tmp = x.new_empty(min(ROW_CHUNK, flat_x.shape[1]))
        for i in range(out.shape[0]):
            for c in range(0, flat_x.shape[1], ROW_CHUNK):
                codes, xc = piece[i, c:c + ROW_CHUNK], flat_x[i, c:c + ROW_CHUNK]
                t = tmp[:xc.shape[0]]
                for head in range(self.num_heads):
                    chunk = torch.index_select(tables[1][head], 0, codes,
                                               out=flat_out[i, head, c:c + ROW_CHUNK])
                    torch.index_select(tables[0][head], 0, codes, out=t)
                    chunk.add_(t.mul_(xc))
        return out

    def _input_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The MLP's input `ψ(d) / ψ(max(L, extent))` on the rows' pairs, `[b or 1, 1, R,
        n_k]` float32: the operations of normalised_distance on the coordinates' eager
        distance rows."""
        coords = ctx.coords
        b, _, q, _ = index_grid(coords.batch_size or 1, 1, coords.num_queries, 1, coords.device)
        rel = distance_rows(ctx, start, stop).float()  # [b or 1, 1, rows, n_k]
        i = coords.extent(q[:, :, start:stop], b).float()  # [b or 1, 1, rows, 1]
        return self._psi(rel) / (self._psi(torch.maximum(i, self._threshold())) + self.eps)

    def bias_rows_vjp(self, ctx: AttentionContext, start: int,
                      stop: int) -> tuple[Tensor, Callable]:
        """The rows of [bias_rows][mmpe.encodings.fire.FIRE.bias_rows] (no graph) and their
        pullback by hand, for the blocked attention path
        (`mmpe.attention.blocked._BlockedPlan.pullback_bias`). On its piece
        `p` a pair's bias is `slope[p]·x + intercept[p]` (Li et al. 2024, eq. 4's MLP, see
        [pieces][mmpe.encodings.fire.FIRE.pieces]), so `∂/∂intercept[p]` and `∂/∂slope[p]`
        are `dS` and `dS·x` summed by piece (an `index_add` per block) and `∂/∂x = Σ_h
        dS·slope[p]`; autograd carries these on to the MLP, `c`, `L` and the positions through
        the `[n_h]`-free input rows `x` and the `[W+1, n_h]` pieces only.

        Returns the rows `[b or 1, n_h, R, n_k]` and the map `dS [b, n_h, R, n_k]` →
        `([slope, intercept, x], cotangents)`."""
        self.check_context(ctx)
        x = self._input_rows(ctx, start, stop)  # [b', 1, R, n_k]
        slope, intercept, cuts = self.pieces()
        with torch.no_grad():
            xd = x.detach()
            piece = piece_of(cuts, xd).reshape(-1)
            # in the rows' float32 (under autocast the MLP returns the pieces in bf16/fp16)
            tables = (slope.detach().t().to(xd.dtype).contiguous(),
                      intercept.detach().t().to(xd.dtype).contiguous())
            slopes, rows = (xd.new_empty(self.num_heads, xd.shape[0], *xd.shape[2:])
                            for _ in tables)
            for head in range(self.num_heads):  # index_select: ~3× an indexing's speed
                for table, out in zip(tables, (slopes, rows), strict=True):
                    torch.index_select(table[head], 0, piece, out=out[head].view(-1))
            rows.add_(slopes * xd[:, 0])  # not addcmul: the rounding of the graph's form

        def pull(d_bias: Tensor) -> tuple[list[Tensor], list[Tensor]]:
            with torch.no_grad():
                d_s = d_bias.sum_to_size(rows.shape[1], *rows.shape[:1], *rows.shape[2:])
                d_s = d_s.to(rows.dtype).transpose(0, 1).reshape(self.num_heads, -1)
                d_intercept = d_s.new_zeros(tables[1].shape).index_add_(1, piece, d_s)
                weighted = d_s * xd.reshape(1, -1)
                d_slope = d_s.new_zeros(tables[0].shape).index_add_(1, piece, weighted)
                d_x = torch.mul(d_s, slopes.reshape(self.num_heads, -1), out=weighted).sum(0)
            return [slope, intercept, x], [d_slope.t(), d_intercept.t(), d_x.view(x.shape)]

        return rows.transpose(0, 1), pull

    def bias_tiles(self, ctx: AttentionContext, start: int, stop: int,
                   width: int) -> BiasTiles:
        """The rows of queries `start … stop−1` tile by tile, for the blocked attention path's
        backward pass (see [BiasTiles][mmpe.encodings.base.BiasTiles]): the MLP's input rows
        `x` and their pieces once per block (contiguous per tile), per head and tile the
        pieces' slopes and intercepts gathered, and from the tile's `dS` the sums of `dS` and
        `dS·x` by piece (`scatter_add`) and `∂/∂x += dS·slope` — the pullback of
        [bias_rows_vjp][mmpe.encodings.fire.FIRE.bias_rows_vjp], in cache."""
        self.check_context(ctx)
        return _FireTiles(self._input_rows(ctx, start, stop), *self.pieces(), width)

    def compact_bias(self, ctx: AttentionContext) -> CompactBias:
        """On `toeplitz` coordinates: `ψ` on the `n_q + n_k − 1` offsets, the normaliser
        on the `n_q` queries and the MLP's linear pieces (see [`FIRERows`][mmpe.encodings.fire.FIRERows])."""
        self.check_context(ctx)
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
        return FIRERows(n_q, psi, norm.expand(norm.shape[0], n_q).contiguous(), slope, intercept,
                        cuts)

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP `f(x) = W₂ relu(w₁x + b₁) + b₂` as linear pieces (float32).

        Returns `slope`, `intercept` `[W+1, n_h]` and the sorted breakpoints `cuts`
        `[W]` (`−b₁/w₁`): on the piece between two cuts the set of active hidden units is
        fixed, so `f(x) = slope[p]·x + intercept[p]` exactly, with gradients to every MLP
        parameter (the active sets are constants almost everywhere, as for the ReLU itself).
        """
        w1, b1 = self.mlp[0].weight[:, 0].float(), self.mlp[0].bias.float()
        w2, b2 = self.mlp[2].weight.float(), self.mlp[2].bias.float()
        with torch.no_grad():
            flat = w1 == 0
            cuts = torch.where(flat, torch.full_like(b1, 1e6),
                               (-b1 / torch.where(flat, torch.ones_like(w1), w1)).clamp(-1e6, 1e6))
            cuts = cuts.sort().values
            probe = torch.cat((cuts[:1] - 1, (cuts[:-1] + cuts[1:]) / 2, cuts[-1:] + 1))
            active = (probe[:, None] * w1 + b1 > 0).float()  # [W+1, W]
        slope = (active * w1) @ w2.T  # [W+1, n_h]
        intercept = (active * b1) @ w2.T + b2
        return slope, intercept, cuts


def piece_of(cuts: Tensor, x: Tensor) -> Tensor:
    """`torch.searchsorted(cuts, x)` (int64, the number of `cuts` below each `x`; `cuts`
    sorted): the cuts below every `x` counted once, then one comparison pass per cut within
    the range of `x` — a binary search per element measured 20 ns an element on the CPU, a
    pass 0.3 ns (and FIRE's normalised distances lie in `[0, 1]`, with a few cuts)."""
    if x.numel() == 0 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return torch.searchsorted(cuts, x.contiguous())  # (the passes read x's range eagerly)
    lo, hi = torch.aminmax(x)
    below = int((cuts < lo).sum())
    inside = cuts[(cuts >= lo) & (cuts < hi)].tolist()
    if len(inside) > 16 or bool(torch.isnan(lo) | torch.isnan(hi)):
        return torch.searchsorted(cuts, x.contiguous())
    piece = torch.full(x.shape, below, dtype=torch.int64)
    for cut in inside:
        piece += x > cut
    return piece


class _FireTiles(BiasTiles):
    """FIRE's `BiasTiles`: the input rows `x [b', 1, R, n_k]` and the pieces `slope,
    intercept [W+1, n_h]` with their graphs; per tile `x` and the piece codes (spread over
    lanes, [lane_codes][mmpe.encodings.base.lane_codes]); the gradients by piece and head and
    `∂/∂x` per tile (float32, the rows' dtype)."""

    def __init__(self, x: Tensor, slope: Tensor, intercept: Tensor, cuts: Tensor,
                 width: int) -> None:
        self.x, self.slope, self.intercept = x, slope, intercept
        self.dtype = x.dtype
        with torch.no_grad():
            xd = x.detach()
            piece = piece_of(cuts, xd)[:, 0]  # [b', R, n_k]
            self.xs = key_tiles(xd[:, 0], width)
            self.codes = [lane_codes(t) for t in key_tiles(piece, width)]
            # [n_h, (W+1)·lanes] in the rows' float32 (under autocast the MLP gives bf16)
            self.tables = [t.detach().t().to(xd.dtype).repeat_interleave(SCATTER_LANES, dim=1)
                           .contiguous() for t in (slope, intercept)]
        self.grads = [torch.zeros_like(t) for t in self.tables]
        self.d_x = [torch.zeros_like(t) for t in self.xs] if x.requires_grad else None
        size = self.xs[0][0].numel()
        self.slopes, self.tmp = xd.new_empty(size), xd.new_empty(size)
        self.size = 0

    def write(self, out: Tensor, i: int, head: int, j: int, add: bool) -> None:
        ii = min(i, self.xs[j].shape[0] - 1)
        codes, x = self.codes[j][ii].view(-1), self.xs[j][ii].view(-1)
        self.size = size = x.numel()
        slopes, tmp = self.slopes[:size], self.tmp[:size]
        torch.index_select(self.tables[0][head], 0, codes, out=slopes)
        torch.mul(slopes, x, out=tmp)
        if add or out.dtype != x.dtype:  # intercept + slope·x, as bias_rows_vjp rounds it
            term = torch.index_select(self.tables[1][head], 0, codes).add_(tmp)
            flat = out.view(-1)
            flat.add_(term) if add else flat.copy_(term)
        else:
            flat = torch.index_select(self.tables[1][head], 0, codes, out=out.view(-1))
            flat.add_(tmp)

    def take(self, d_s: Tensor, i: int, head: int, j: int) -> None:
        ii = min(i, self.xs[j].shape[0] - 1)
        codes, x = self.codes[j][ii].view(-1), self.xs[j][ii].view(-1)
        ds = d_s.reshape(-1).to(x.dtype)
        d_slope, d_intercept = (g[head] for g in self.grads)
        d_intercept.scatter_add_(0, codes, ds)
        tmp = torch.mul(ds, x, out=self.tmp[:self.size])
        d_slope.scatter_add_(0, codes, tmp)
        if self.d_x is not None:
            self.d_x[j][ii].view(-1).addcmul_(ds, self.slopes[:self.size])

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:
        d_slope, d_intercept = (fold_lanes(g).t() for g in self.grads)
        tensors = [self.slope, self.intercept]
        cotangents = [d_slope.to(self.slope.dtype), d_intercept.to(self.intercept.dtype)]
        if self.d_x is not None:
            tensors.append(self.x)
            cotangents.append(torch.cat(self.d_x, -1).unsqueeze(1))
        return tensors, cotangents


class FIRERows(CompactBias):
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

