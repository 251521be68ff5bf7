"""FIRE's MLP on one block of query rows, for the tiles plan (Li et al. 2024, eq. 4).

On the block's inputs `x ∈ [0, hi]` the MLP `f` is linear between the breakpoints (`cuts`) that
fall in that range. With few of them below the inputs' bound (`RAMP_MAX_CUTS`) `f` is read as
ramps shared by the heads, `f(x) = s₀·x + t₀ + Σ_m Δs_m·relu(x − c_m)` (`s₀, t₀` the piece at
0, `Δs_m` the change of slope at cut `c_m`): two passes per ramp and head, no gather. With more, each
pair's piece is gathered (`slope[p]·x + intercept[p]`). The tiles of the backward pass take the
gradient by hand: per piece from dot products (ramps) or sums by piece (gathers), and through
`x = ψ(d) / ψ(max(L, extent))` to `c`, the normaliser and the distances from per-row sums,
with no autograd graph of the block's pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.attention.term_layouts import (
    ROW_CHUNK,
    SCATTER_LANES,
    BiasTiles,
    fold_lanes,
    lane_codes,
)

#: the most breakpoints of the MLP below the inputs' bound for which a block is read as ramps:
#: each ramp costs two passes per head, the gathered form two gathers and two scatters per head
#: whatever the count (a gather 0.5 ns an element, a pass 0.14 ns). At 4,096 points with three
#: cuts in range a step took 2.2–2.3 s with ramps, 2.55 s with gathers (one thread).
RAMP_MAX_CUTS = 6


def piece_of(cuts: Tensor, x: Tensor) -> Tensor:
    """`torch.searchsorted(cuts, x)`, computed faster.

    `torch.searchsorted(cuts, x)` (int64, the number of `cuts` below each `x`; `cuts`
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


def on_pieces(slope: Tensor, intercept: Tensor, cuts: Tensor, x: Tensor) -> Tensor:
    """The MLP on inputs `x` as its linear pieces.

    The MLP on inputs `x [...]` as its linear pieces (`slope, intercept [W+1, n_h]`,
    sorted `cuts [W]`), `[..., n_h]`: each input's piece, then one multiply-add per head
    instead of a hidden layer per input (differentiable in all four)."""
    piece = piece_of(cuts.detach(), x.detach())
    return slope[piece] * x.unsqueeze(-1) + intercept[piece]


class BlockMLP:
    """FIRE's MLP on the inputs of one block, `x ∈ [lo, hi]` (see the module's docstring).

    Args:
        slope, intercept: `[W+1, n_h]` the pieces (any graph), read in float32.
        cuts: `[W]` sorted breakpoints, with the graph of `−b₁/w₁` (the ramps' gradient
            w.r.t. a cut is that of the intercepts past it).
        x: the block's inputs (any shape; only their range is read).
        bound: the inputs' bound over every block (0-d; FIRE's `ψ(extent) / ψ(max(L,
            extent))`, the largest input where no distance exceeds its query's extent), from
            which the form is chosen.
    """

    def __init__(self, slope: Tensor, intercept: Tensor, cuts: Tensor, x: Tensor,
                 bound: Tensor) -> None:
        self.slope, self.intercept = slope.float(), intercept.float()
        self.cuts = cuts
        with torch.no_grad():
            lo, hi = torch.aminmax(x.detach()) if x.numel() else (x.new_zeros(()),) * 2
            # The ramps start at 0 (FIRE's inputs are >= 0), not at the block's least input,
            # and a cut past every input adds 0: each pair's number is then the same in every
            # block (the forward and backward passes, and the plans they replace, block the
            # queries differently). The form is chosen from the cuts below `bound`, the same
            # for every block, for the same reason.
            base = torch.clamp(lo, max=0.0)
            c = cuts.detach()
            self.first = int((c < base).sum())
            self.k = int((c < hi).sum()) - self.first
            in_range = int((c < bound).sum()) - self.first
        self.ramps = (in_range <= RAMP_MAX_CUTS
                      and not bool(torch.isnan(lo) | torch.isnan(hi)))
        first, last = self.first, self.first + self.k
        self.s0, self.t0 = self.slope[first], self.intercept[first]  # [n_h]
        self.d_slope = self.slope[first + 1:last + 1] - self.slope[first:last]  # [k, n_h]
        self.ramp_cuts = cuts[first:last].to(self.slope.dtype)  # [k]

    def rows(self, x: Tensor) -> Tensor:
        """`f` on `x` per head, differentiable.

        `f` on `x [b', 1, R, n_k]` per head, `[b', n_h, R, n_k]`, differentiable (the
        operations, in order, of `chunks` and of
        the tiles' `write`)."""
        if not self.ramps:
            out = on_pieces(self.slope, self.intercept, self.cuts, x)
            return out.squeeze(1).permute(0, 3, 1, 2)

        def per_head(t: Tensor) -> Tensor:
            return t.view(1, -1, 1, 1)

        out = x * per_head(self.s0) + per_head(self.t0)
        for m in range(self.k):
            out = out + per_head(self.d_slope[m]) * torch.relu(x - self.ramp_cuts[m])
        return out

    @torch.no_grad()
    def chunks(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """`rows` without a graph, chunk by chunk.

        `rows` without a graph, the same numbers,
        chunk by chunk of `ROW_CHUNK` pairs in the cache (the ramps once per chunk for every
        head); into `out` (`[b', n_h, R, n_k]`, contiguous) where given."""
        heads, chunk = self.slope.shape[1], ROW_CHUNK * 4  # (fewer operations per pair)
        flat_x = x.reshape(x.shape[0], -1)
        if out is None:
            out = x.new_empty(x.shape[0], heads, *x.shape[2:])
        flat_out = out.view(*out.shape[:2], -1)
        head_form = _HeadForm(self, min(chunk, flat_x.shape[1]))
        for i in range(out.shape[0]):
            for c in range(0, flat_x.shape[1], chunk):
                head_form.prepare(flat_x[i, c:c + chunk])
                for head in range(heads):
                    head_form.write(flat_out[i, head, c:c + chunk], head, add=False)
        return out


class _HeadForm:
    """The per-head evaluation of a `BlockMLP` on one
    flat run of inputs (`prepare`), shared by the rows and the tiles: the ramps, or the pieces'
    codes (spread over lanes for the gradient's sums)."""

    def __init__(self, mlp: BlockMLP, size: int) -> None:
        self.mlp = mlp
        with torch.no_grad():
            if mlp.ramps:
                self.s0, self.t0 = mlp.s0.detach(), mlp.t0.detach()
                self.d_slope, self.cuts = mlp.d_slope.detach(), mlp.ramp_cuts.detach()
                # the inputs, the ramps and where each is on (the gradient's dot products)
                self.features = torch.empty(2 * mlp.k + 1, size)
                self.ramp = self.features[1:mlp.k + 1]
            else:
                self.tables = [t.detach().t().repeat_interleave(SCATTER_LANES, dim=1)
                               .contiguous() for t in (mlp.slope, mlp.intercept)]
                self.slopes = torch.empty(size)
        self.tmp, self.term = torch.empty(size), torch.empty(size)
        self.x: Tensor | None = None

    def prepare(self, x: Tensor) -> None:
        """The flat inputs `x` (contiguous float32) the next writes read."""
        self.x = x
        n = x.numel()
        if self.mlp.ramps:
            for m in range(self.mlp.k):
                torch.sub(x, self.cuts[m], out=self.ramp[m, :n]).relu_()
        else:
            self.codes = lane_codes(piece_of(self.mlp.cuts.detach(), x).view(1, -1))[0]

    def write(self, out: Tensor, head: int, add: bool) -> None:
        """`f` of head `head` on the prepared inputs into the flat `out` (`+=` where `add`)."""
        x, n = self.x, self.x.numel()
        direct = not add and out.dtype == x.dtype
        term = out if direct else self.term[:n]
        if self.mlp.ramps:
            torch.mul(x, self.s0[head], out=term)
            term.add_(self.t0[head])
            for m in range(self.mlp.k):
                term.add_(torch.mul(self.ramp[m, :n], self.d_slope[m, head], out=self.tmp[:n]))
        else:
            slopes = torch.index_select(self.tables[0][head], 0, self.codes,
                                        out=self.slopes[:n])
            torch.index_select(self.tables[1][head], 0, self.codes, out=term)
            term.add_(torch.mul(slopes, x, out=self.tmp[:n]))
        if not direct:
            out.add_(term) if add else out.copy_(term)


class FIRETiles(BiasTiles):
    """FIRE's `BiasTiles` on one block.

    FIRE's [BiasTiles][mmpe.attention.term_layouts.BiasTiles] on one block: the MLP on the block
    (`mlp`), the distances `d [b', 1, R, n_k]` and the normaliser `norm [b', 1, R, 1]` (with
    their graphs), `c` (FIRE's `ψ` scale, float32).

    Per tile (prepared at its first head) the inputs `x = ψ(d) / norm` and their ramps or
    pieces; per head the bias written from them and the tile's `dS` kept; after the last head
    the gradients w.r.t. the pieces (one matrix product over the heads' `dS`, or the sums by
    piece taken head by head), `∂/∂x` per pair, and from it per row `Σ ∂/∂x · ∂x/∂c` and
    `Σ ∂/∂x · x` (the normaliser's gradient is `−Σ ∂/∂x · x / norm`) and, where the distances
    take a gradient, `∂/∂d`.
    """

    def __init__(self, mlp: BlockMLP, x: Tensor, d: Tensor, norm: Tensor, c: Tensor,
                 batch: int, width: int) -> None:
        self.mlp, self.x, self.d, self.norm, self.c = mlp, x, d, norm, c
        self.dtype = x.dtype
        self.heads = mlp.slope.shape[1]
        with torch.no_grad():
            self.dd, self.cd, self.inv = d.detach(), c.detach(), 1.0 / norm.detach()
            ratio = torch.mul(self.dd, self.cd.abs()).add_(1.0)
            self.ratio = torch.div(self.dd, ratio, out=ratio).mul_(torch.sign(self.cd))
        rows, n_k = self.x.shape[2:]
        self.width, self.n_k = width, n_k
        size = rows * min(width, n_k)
        self.form = _HeadForm(mlp, size)
        self.ds = torch.empty(self.heads, size)
        if mlp.ramps:
            self.sums = torch.zeros(2, mlp.k + 2, self.heads, dtype=torch.float64)
        else:
            pieces = mlp.slope.shape[0]
            self.grads = [torch.zeros(self.heads, pieces * SCATTER_LANES) for _ in range(2)]
            self.d_x = torch.empty(size)
        self.row_c = torch.zeros(batch, rows, dtype=torch.float64)
        self.row_x = torch.zeros(batch, rows, dtype=torch.float64)
        self.d_d = torch.zeros(batch, 1, rows, n_k) if d.requires_grad else None
        self.tile: tuple[int, int] | None = None

    def _cols(self, j: int) -> slice:
        return slice(j * self.width, min(self.n_k, (j + 1) * self.width))

    def write(self, out: Tensor, i: int, head: int, j: int, add: bool) -> None:
        if self.tile != (i, j):
            self.tile = (i, j)
            x = self.x[min(i, self.x.shape[0] - 1), 0, :, self._cols(j)].contiguous().view(-1)
            self.form.prepare(x)
            if not self.mlp.ramps:
                self.d_x[:x.numel()].zero_()
        self.form.write(out.view(-1), head, add)

    def take(self, d_s: Tensor, i: int, head: int, j: int) -> None:
        n = d_s.numel()
        ds = self.ds[head, :n]
        ds.copy_(d_s.view(-1))
        if not self.mlp.ramps:
            codes, form = self.form.codes, self.form
            self.grads[1][head].scatter_add_(0, codes, ds)
            self.grads[0][head].scatter_add_(0, codes, torch.mul(ds, form.x, out=form.tmp[:n]))
            self.d_x[:n].addcmul_(ds, form.slopes[:n])
        if head == self.heads - 1:
            self._finish(i, j, n)

    def _finish(self, i: int, j: int, n: int) -> None:
        """The tile's gradients once every head's `dS` is in."""
        x, cols = self.form.x, self._cols(j)  # the inputs its first head prepared
        d = self.dd[min(i, self.dd.shape[0] - 1), 0, :, cols]
        ds = self.ds[:, :n]
        if self.mlp.ramps:
            d_x = self._ramp_sums(x, ds, n)
        else:
            d_x = self.d_x[:n]
        d_x = d_x.view(d.shape)
        # ψ(d) = log(|c·d| + 1), d >= 0: ∂ψ/∂c = sign(c)·d / (|c|·d + 1), the ratio per block
        ratio = self.ratio[min(i, self.ratio.shape[0] - 1), 0, :, cols]
        self.row_c[i] += torch.mul(d_x, ratio).sum(-1).double()
        self.row_x[i] += torch.mul(d_x, x.view(d.shape)).sum(-1).double()
        if self.d_d is not None:  # ∂ψ/∂d = sign(c·d)·c / (|c·d| + 1) (0 at d = 0, as abs')
            t = self.cd * d
            inv = self.inv[min(i, self.inv.shape[0] - 1), 0]  # [R, 1]
            self.d_d[i, 0, :, cols] = d_x * torch.sign(t) * self.cd / t.abs().add_(1.0) * inv

    def _ramp_sums(self, x: Tensor, ds: Tensor, n: int) -> Tensor:
        """Ramps: each head's sums of `dS` and `dS·x` from `lo` and past each cut, and `∂/∂x =
        Σ_h dS·(s₀ + Σ_m Δs_m·[x > c_m])`."""
        k, form = self.mlp.k, self.form
        features = form.features[:, :n]  # [2k+1, P]: x, the ramps, then their masks
        features[0].copy_(x)
        masks = torch.sign(form.ramp[:, :n], out=features[k + 1:])  # ramps are >= 0
        dots = (features @ ds.t()).double()  # [2k+1, n_h]
        totals = ds.sum(1).double()  # (a float64 sum of float32 is 20x slower)
        # past cut m: Σ dS·[x > c_m] and Σ dS·x·[x > c_m] = Σ dS·relu(x − c_m) + c_m·Σ dS·[..]
        past = dots[1 + k:]
        past_x = dots[1:1 + k] + form.cuts.double()[:, None] * past
        self.sums[0, 0] += totals
        self.sums[1, 0] += dots[0]
        self.sums[0, 1:k + 1] += past
        self.sums[1, 1:k + 1] += past_x
        coef = torch.cat((form.s0[None], form.d_slope))  # [k+1, n_h]
        per = coef @ ds  # [k+1, P]
        d_x = per[0]
        for m in range(k):
            d_x.addcmul_(per[m + 1], masks[m])
        return d_x

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:
        mlp = self.mlp
        if mlp.ramps:
            # the pairs on piece first + m are those past cut m − 1 and not past cut m
            beyond = self.sums[:, 1:]  # [2, k+1, n_h], the last row zeros
            on_piece = self.sums[:, :-1] - beyond
            d_slope = torch.zeros(mlp.slope.shape, dtype=torch.float64)
            d_intercept = torch.zeros_like(d_slope)
            d_intercept[mlp.first:mlp.first + mlp.k + 1] = on_piece[0]
            d_slope[mlp.first:mlp.first + mlp.k + 1] = on_piece[1]
        else:
            d_slope, d_intercept = (fold_lanes(g).t() for g in self.grads)
        tensors = [mlp.slope, mlp.intercept]
        cotangents = [d_slope.to(mlp.slope.dtype), d_intercept.to(mlp.intercept.dtype)]
        inv = self.inv.double()[:, 0, :, 0]  # [b', R]
        d_norm = -(self.row_x * inv).float()  # ∂x/∂norm = −x / norm
        tensors.append(self.norm)
        cotangents.append(d_norm[:, None, :, None].sum_to_size(self.norm.shape))
        tensors.append(self.c)
        cotangents.append((self.row_c * inv).sum().to(self.c.dtype))
        if self.d_d is not None:
            tensors.append(self.d)
            cotangents.append(self.d_d.sum_to_size(self.d.shape).to(self.d.dtype))
        return tensors, cotangents
