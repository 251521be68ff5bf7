"""KERPLE-log's CPU forms.

KERPLE-log's CPU forms (Chi et al. 2022, eq. 8): its rows without a graph chunk by chunk in
the cache, head by head, and its pullback by hand (whole rows, or tile by tile in the tiles
plan's backward pass) instead of autograd's graph over every pair. Numbers of
[KerpleLog.distance_term][mmpe.encodings.kerple._Kerple.distance_term]."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.attention.fast_forms.by_class import register
from mmpe.attention.term_layouts import BiasTiles, distance_rows, key_tiles
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.kerple import KerpleLog


def tiles(self: KerpleLog, ctx: AttentionCall, start: int, stop: int,
          width: int) -> BiasTiles:
    """The rows of queries `start … stop−1` tile by tile.

    The rows of queries `start … stop−1` tile by tile, for the tiles plan's
    backward pass (see `BiasTiles`): the distance rows once
    per block, `L = log(1 + r2·d)` and the bias per head and tile, and from each tile's `dS`
    the sums `Σ dS·L` and `Σ dS·d/(1 + r2·d)` per head (eq. 8's derivatives: `∂/∂r1 = −Σ
    dS·L`, `∂/∂r2 = −r1·Σ dS·d/(1 + r2·d)`, `∂/∂d = −Σ_h r1·r2·dS/(1 + r2·d)`) — in cache, no
    `[b, n_h, R, n_k]` tensor."""
    return _LogTiles(*self.constrained(), distance_rows(ctx, start, stop), width)


class _LogTiles(BiasTiles):
    """KERPLE-log's `BiasTiles`: `r1, r2` `[n_h]` and the distance rows `[b', 1, R, n_k]`
    with their graphs; per tile the distances (contiguous), and per head the sums `Σ dS·L`,
    `Σ dS·d/(1 + r2·d)` (float64) and, where the distances take a gradient, `∂/∂d`."""

    def __init__(self, r1: Tensor, r2: Tensor, dist: Tensor, width: int) -> None:
        self.r1, self.r2, self.dist = r1, r2, dist
        with torch.no_grad():
            # the rows' dtype: float64 in a float64 model (the product promotes the distances)
            self.dtype = torch.result_type(dist, r2)
            self.d = key_tiles(dist.detach()[:, 0].to(self.dtype), width)  # [b', R, K] each
            self.r2_ = r2.detach().to(self.dtype)
            self.neg_r1 = -r1.detach().to(self.dtype)
            self.coef = (-(r1 * r2).detach().double()).tolist()  # ∂b/∂d = −r1·r2/(1 + r2·d)
        heads = r1.shape[0]
        self.sums = torch.zeros(2, heads, dtype=torch.float64)
        self.d_dist = ([torch.zeros_like(t) for t in self.d] if dist.requires_grad else None)
        self.t = self.log = None

    def write(self, out: Tensor, i: int, head: int, j: int, add: bool) -> None:
        d = self.d[j][min(i, self.d[j].shape[0] - 1)]
        # the operations of `_rows`: log1p(d·r2), then · −r1
        self.t = torch.mul(d, self.r2_[head])
        self.log = torch.log1p(self.t)
        if add or out.dtype != self.dtype:
            term = self.log * self.neg_r1[head]
            out.add_(term) if add else out.copy_(term)
        else:
            torch.mul(self.log, self.neg_r1[head], out=out)

    def take(self, d_s: Tensor, i: int, head: int, j: int) -> None:
        ii = min(i, self.d[j].shape[0] - 1)
        d = self.d[j][ii].view(-1)
        ds = d_s.reshape(-1).to(self.dtype)
        w = self.t.view(-1).add_(1.0)
        w = torch.div(ds, w, out=w)  # dS / (1 + r2·d)
        self.sums[0, head] += torch.dot(ds, self.log.view(-1)).item()
        self.sums[1, head] += torch.dot(w, d).item()
        if self.d_dist is not None:
            self.d_dist[j][ii].view(-1).add_(w, alpha=self.coef[head])

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:
        r1, r2 = self.r1, self.r2
        g_r1 = -self.sums[0]
        g_r2 = -r1.detach().double() * self.sums[1]
        tensors, cotangents = [r1, r2], [g_r1.to(r1.dtype), g_r2.to(r2.dtype)]
        if self.d_dist is not None:
            tensors.append(self.dist)
            cotangents.append(torch.cat(self.d_dist, -1).unsqueeze(1).to(self.dist.dtype))
        return tensors, cotangents


register(KerpleLog, tiles=tiles)
