"""Graphormer's structural encodings (Ying et al. 2021, "Do Transformers Really Perform Bad for
Graph Representation?", NeurIPS), on coordinates with the `GraphLayout` capability
([`mmpe.coords.Graph`][mmpe.coords.graph.Graph], or any class with its members), read only through that protocol.

* `graphormer_centrality` (input hook, eq. 5): `h_i⁽⁰⁾ = x_i + z⁻[deg⁻(v_i)] + z⁺[deg⁺(v_i)]`.
* `graphormer_spatial` (score hook, eq. 6): `A_ij += b_φ(v_i, v_j)`, one learned scalar per
  shortest-path-distance bucket and head.
* `graphormer_edge` (score hook, eq. 7): `A_ij += c_ij = (1/N) Σ_{n=1}^{N} x_{e_n} (w_n^E)ᵀ`
  along the shortest path `(e_1 … e_N)` from `v_i` to `v_j`.
* `graphormer` (score hook): the whole Graphormer attention bias, spatial + edge
  (`b_φ + c_ij`) in one module; pair it with `graphormer_centrality` for the full model.
* `graphormer_virtual` (input hook, §3.1 "Special node"): the learned embedding of the
  virtual graph token. Build the coordinates with `Graph(..., virtual_token=True)`: slot 0
  of every graph is then the virtual node, connected to every node; its spatial bias uses its
  own bucket (the paper's distinct learnable scalar) and its output is the graph readout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from mmpe._scratch import block_empty
from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphEdges, GraphLayout, VirtualNode
from mmpe.coords.graph import UNREACHABLE, VIRTUAL
from mmpe.encodings.base import (
    SCATTER_LANES,
    AttentionContext,
    BiasTiles,
    HeadRows,
    InputEncoding,
    ScoreEncoding,
    ScoreMod,
    fold_lanes,
    key_tiles,
    lane_codes,
)
from mmpe.registry import register

PAPER = ("Ying et al. 2021, Do Transformers Really Perform Bad for Graph Representation? "
         "(NeurIPS)")

#: Parameter-free path-edge codes per coordinates object (shared by every GraphormerEdge, so
#: the layers of one model derive them once per batch); entries vanish with the coordinates.
_PATH_CODES: WeakKeyDictionary[Any, dict[Any, Any]] = WeakKeyDictionary()


def spatial_buckets(spd: Tensor, max_distance: int, out: Tensor | None = None) -> Tensor:
    """Map `spd` codes (`GraphLayout`) to bucket ids (`spd`'s dtype; into `out` where given,
    of `spd`'s shape): hops clipped to `[0, max_distance]`, unreachable → `max_distance + 1`,
    virtual-token pairs → `max_distance + 2`."""
    out = torch.clamp(spd, min=0, max=max_distance, out=out) if out is not None \
        else spd.clamp(min=0, max=max_distance)
    out.masked_fill_(spd == UNREACHABLE, max_distance + 1)
    return out.masked_fill_(spd == VIRTUAL, max_distance + 2)


@register("graphormer_spatial", hook="score", needs=(GraphLayout,), learnable=True,
          family="graph", paper=PAPER + ", eq. 6", context=("num_heads",))
class GraphormerSpatial(ScoreEncoding):
    """`score(i, j) += b[bucket(φ(v_i, v_j)), h]` — a learned bias per SPD bucket and head.

    `φ` is the shortest-path hop count (the `GraphLayout` member `spd`); buckets as
    [`spatial_buckets`][mmpe.encodings.graphormer.spatial_buckets] (`max_distance + 3` rows).

    Args:
        num_heads: `n_h`.
        max_distance: hops above it share its bucket (Graphormer clips as well).

    Raises:
        ValueError: `num_heads` or `max_distance` < 1.
        TypeError: coordinates without the `GraphLayout` capability.
    """

    def __init__(self, num_heads: int, max_distance: int = 20) -> None:
        super().__init__()
        if num_heads < 1 or max_distance < 1:
            raise ValueError(f"graphormer_spatial: num_heads and max_distance must be >= 1, "
                             f"got {num_heads}, {max_distance}")
        self.num_heads, self.max_distance = num_heads, max_distance
        self.table = nn.Parameter(torch.randn(max_distance + 3, num_heads) * 0.02)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        buckets = spatial_buckets(ctx.coords.spd, self.max_distance)  # [b, n, n]
        table = self.table

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[buckets[b, q_idx, kv_idx], h]

        return mod

    def bias(self, ctx: AttentionContext) -> Tensor:
        """Eager path: `table[bucket]` on all pairs, `[b, n_h, n, n]` (equals the mod)."""
        self.check_context(ctx)
        return self.table[spatial_buckets(ctx.coords.spd, self.max_distance)].permute(0, 3, 1, 2)

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """`table[bucket]` on the pairs of queries `start … stop−1`, `[b, n_h, stop−start, n]`:
        the buckets of those rows only (the default would bucket every pair per block); where
        no gradient is recorded, gathered head by head (one contiguous block, no copy)."""
        if torch.is_grad_enabled() and self.table.requires_grad:
            self.check_context(ctx)
            buckets = spatial_buckets(ctx.coords.spd[:, start:stop], self.max_distance)
            return self.table[buckets].permute(0, 3, 1, 2)
        return GraphormerSpatial.bias_rows_vjp(self, ctx, start, stop)[0]  # (not a subclass's)

    def bias_rows_vjp(self, ctx: AttentionContext, start: int,
                      stop: int) -> tuple[Tensor, Callable]:
        """The rows of [bias_rows][mmpe.encodings.graphormer.GraphormerSpatial.bias_rows] (no
        graph) and their pullback by hand, for the blocked attention path
        (`mmpe.attention.blocked._BlockedPlan.pullback_bias`): the gradient of
        `b_φ` (Ying et al. 2021, eq. 6) is `dS` summed by bucket, per head — an `index_add`
        over the block's bucket codes instead of autograd's backward of the gather.

        Returns the rows `[b, n_h, R, n]` and the map `dS [b, n_h, R, n]` → `([table],
        [d_table])` (`table`, `d_table` `[max_distance + 3, n_h]`)."""
        self.check_context(ctx)
        buckets = self._buckets(ctx, start, stop)
        table = self.table
        with torch.no_grad():
            per_head = table.detach().t().contiguous()  # [n_h, buckets]
            rows = block_empty(self, "rows", (per_head.shape[0], *buckets.shape),
                               table.dtype, buckets.device)
            flat = buckets.reshape(-1)
            for head, values in enumerate(per_head):  # index_select: ~3× torch.take's speed
                torch.index_select(values, 0, flat, out=rows[head].view(-1))

        def pull(d_bias: Tensor) -> tuple[list[Tensor], list[Tensor]]:
            with torch.no_grad():
                d_s = d_bias.sum_to_size(rows.shape[1], *rows.shape[:1], *rows.shape[2:])
                grad = per_head.new_zeros(per_head.shape)
                for i in range(d_s.shape[0]):
                    grad.index_add_(1, buckets[i].reshape(-1),
                                    d_s[i].reshape(grad.shape[0], -1).to(grad.dtype))
                return [table], [grad.t()]

        return rows.transpose(0, 1), pull

    @torch.no_grad()
    def head_rows(self, ctx: AttentionContext, start: int, stop: int) -> HeadRows:
        """The rows of `bias_rows` head by head: the block's hop codes less their least (one
        pass), each code's row of `b_φ`, and per head a gather from the head's column of
        those rows (see [HeadRows][mmpe.encodings.base.HeadRows])."""
        self.check_context(ctx)
        spd = ctx.coords.spd[:, start:stop]
        lo, hi = (int(v) for v in torch.aminmax(spd)) if spd.numel() else (0, 0)
        # each hop code's bucket (a table of hi − lo + 1): no pass over the pairs to bucket them
        buckets = spatial_buckets(torch.arange(lo, hi + 1, device=spd.device), self.max_distance)
        codes = torch.sub(spd, lo, out=block_empty(self, "codes", spd.shape, spd.dtype,
                                                   spd.device))
        return _SpatialRows(self.table[buckets], codes)

    def bias_tiles(self, ctx: AttentionContext, start: int, stop: int,
                   width: int) -> BiasTiles:
        """The rows of queries `start … stop−1` tile by tile, for the blocked attention path's
        backward pass (see [BiasTiles][mmpe.encodings.base.BiasTiles]): the block's bucket
        codes once (contiguous per tile), per head and tile a gather from the head's column of
        `b_φ` and a `scatter_add` of the tile's `dS` into the head's gradient."""
        self.check_context(ctx)
        return _SpatialTiles(self.table, self._buckets(ctx, start, stop), width)

    def _buckets(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The bucket codes of queries `start … stop−1`, `[b, R, n]` (a scratch block: see
        `mmpe._scratch`)."""
        spd = ctx.coords.spd[:, start:stop]
        return spatial_buckets(spd, self.max_distance,
                               out=block_empty(self, "buckets", spd.shape, spd.dtype,
                                               spd.device))


class _SpatialRows(HeadRows):
    """Graphormer's spatial bias as `HeadRows`: `table [codes, n_h]` (each code's row of
    `b_φ`) and the block's codes `[b, R, n]`; per head an `index_select` from the head's
    column."""

    def __init__(self, table: Tensor, buckets: Tensor) -> None:
        self.dtype = table.dtype
        self.values = table.detach().t().contiguous()  # [n_h, buckets]
        self.codes = buckets.reshape(buckets.shape[0], -1)
        self.chunk = self.codes.shape[1] or 1  # one pass: no chunks needed

    def fill(self, out: Tensor, i: int, head: int, offset: int) -> None:
        codes = self.codes[min(i, self.codes.shape[0] - 1), offset:offset + out.numel()]
        torch.index_select(self.values[head], 0, codes, out=out)


class _SpatialTiles(BiasTiles):
    """Graphormer's spatial bias as `BiasTiles`: `table [buckets, n_h]` (with its graph), the
    block's bucket codes per tile `[b, R, K]` spread over lanes
    ([lane_codes][mmpe.encodings.base.lane_codes]), and the gradient `[n_h, buckets·lanes]`."""

    def __init__(self, table: Tensor, buckets: Tensor, width: int) -> None:
        self.table = table
        self.dtype = table.dtype
        self.codes = [lane_codes(t) for t in key_tiles(buckets, width)]
        # [n_h, buckets·lanes]: each head's column of the table, every value SCATTER_LANES times
        self.values = table.detach().t().repeat_interleave(SCATTER_LANES, dim=1).contiguous()
        self.grad: Tensor | None = None

    def write(self, out: Tensor, i: int, head: int, j: int, add: bool) -> None:
        codes = self.codes[j][min(i, self.codes[j].shape[0] - 1)].view(-1)
        if add or out.dtype != self.values.dtype:
            term = torch.index_select(self.values[head], 0, codes).view_as(out)
            out.add_(term) if add else out.copy_(term)
        else:
            torch.index_select(self.values[head], 0, codes, out=out.view(-1))

    def take(self, d_s: Tensor, i: int, head: int, j: int) -> None:
        if self.grad is None:
            self.grad = torch.zeros(self.values.shape, dtype=d_s.dtype)
        codes = self.codes[j][min(i, self.codes[j].shape[0] - 1)].view(-1)
        self.grad[head].scatter_add_(0, codes, d_s.view(-1))

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:
        grad = torch.zeros_like(self.values) if self.grad is None else self.grad
        return [self.table], [fold_lanes(grad).t().to(self.table.dtype)]


@register("graphormer_edge", hook="score", needs=(GraphLayout, GraphEdges), learnable=True,
          family="graph", paper=PAPER + ", eq. 7", context=("num_heads",))
class GraphormerEdge(ScoreEncoding):
    """`score(i, j) += c_ij[h] = (1/N) Σ_{n ≤ N} Σ_{h'} x_{e_n}[h'] · W_n[h', h]`.

    `x_e ∈ R^{n_h}` embeds edge `e`'s features: integer features (categories, e.g. bond
    type) through one table with a block of `num_edge_types` rows per feature column,
    averaged over columns, as Graphormer's reference model does; float features through a
    linear map. `(e_1 … e_N)` is the shortest path from `v_i` to `v_j`
    (the `GraphEdges` member `path_edge_attr`, first `max_hops` edges;
    `N = min(SPD, max_hops)`);
    `W_n` is a learned `n_h × n_h` matrix per hop. Pairs without a path (self pairs,
    unreachable pairs, the virtual token, padding) get `c = 0`.

    Args:
        num_heads: `n_h`.
        num_edge_types: categories per integer edge-feature column (values must lie in
            `[0, num_edge_types)`).
        edge_dim: number of float edge features (used when `edge_attr` is floating point).
        max_hops: path edges used (Graphormer's `multi_hop_max_dist`, 5 on PCQM4M).

    Raises:
        ValueError: no edge features on the coordinates, integer features out of range,
            float features of a width other than `edge_dim`.
        TypeError: coordinates without the `GraphLayout` and `GraphEdges` capabilities.
    """

    def __init__(self, num_heads: int, num_edge_types: int = 32, edge_dim: int | None = None,
                 max_hops: int = 5, max_feature_columns: int = 8) -> None:
        super().__init__()
        if num_heads < 1 or num_edge_types < 1 or max_hops < 1:
            raise ValueError("graphormer_edge: num_heads, num_edge_types and max_hops must be >= 1")
        self.num_heads, self.num_edge_types, self.max_hops = num_heads, num_edge_types, max_hops
        self.max_feature_columns = max_feature_columns
        self.embed = nn.Embedding(num_edge_types * max_feature_columns, num_heads)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.linear = nn.Linear(edge_dim, num_heads) if edge_dim else None
        self.hop_weight = nn.Parameter(torch.randn(max_hops, num_heads, num_heads) / num_heads ** 0.5)

    def edge_embedding(self, attr: Tensor) -> Tensor:
        """Edge features `[..., F]` → `x_e [..., n_h]`."""
        if attr.dtype.is_floating_point:
            if self.linear is None or attr.shape[-1] != self.linear.in_features:
                want = self.linear.in_features if self.linear is not None else "edge_dim (unset)"
                raise ValueError(f"graphormer_edge: float edge_attr needs edge_dim={want}, "
                                 f"got {attr.shape[-1]} features")
            return self.linear(attr)
        f = attr.shape[-1]
        if f > self.max_feature_columns:
            raise ValueError(f"graphormer_edge: at most {self.max_feature_columns} integer edge "
                             f"feature columns, got {f}")
        if attr.numel() and (int(attr.min()) < 0 or int(attr.max()) >= self.num_edge_types):
            raise ValueError(f"graphormer_edge: integer edge_attr values must lie in "
                             f"[0, num_edge_types={self.num_edge_types})")
        offset = torch.arange(f, device=attr.device) * self.num_edge_types
        return self.embed(attr.long() + offset).mean(-2)

    def _path_codes(self, attr: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Parameter-free part of integer features `attr [b,n,n,P,F]` (`valid [b,n,n,P]`):
        the distinct edge-feature rows `[U, F]`, a gather index `[b, n, n, P]` into
        `P·U + 1` rows (hop `p`, row `u` → `p·U + u`; no edge → the last, zero row) and
        `N_ij` `[b, n, n, 1]`."""
        if attr.numel() and (int(attr.min()) < 0 or int(attr.max()) >= self.num_edge_types):
            raise ValueError(f"graphormer_edge: integer edge_attr values must lie in "
                             f"[0, num_edge_types={self.num_edge_types})")
        f = attr.shape[-1]
        radix = self.num_edge_types ** torch.arange(f, device=attr.device)
        code = (attr.long() * radix).sum(-1)  # [b,n,n,P]
        uniq, inv = torch.unique(code[valid], return_inverse=True)
        rows = torch.stack([(uniq // self.num_edge_types ** i) % self.num_edge_types
                            for i in range(f)], dim=-1)
        u = uniq.numel()
        hop = torch.arange(self.max_hops, device=attr.device).expand_as(code)
        index = torch.full_like(code, self.max_hops * u)
        index[valid] = hop[valid] * u + inv
        count = valid.sum(-1, keepdim=True).clamp(min=1)
        return rows, index, count

    def _cached_path_codes(self, coords: Coordinates, attr: Tensor,
                           valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`_path_codes`, derived once per coordinates object (and hops, vocabulary)."""
        key = (self.max_hops, self.num_edge_types)
        try:
            per_coords = _PATH_CODES.setdefault(coords, {})
        except TypeError:  # coordinates that cannot be weakly referenced or hashed
            return self._path_codes(attr, valid)
        if key not in per_coords:
            # Normal tensors even under inference_mode: a later training forward on the same
            # coordinates saves them for backward.
            with torch.inference_mode(False):
                per_coords[key] = self._path_codes(attr, valid)
        return per_coords[key]

    def pair_bias(self, coords: Coordinates) -> Tensor:
        """`c` on all pairs, `[b, n_h, n, n]`."""
        attr, valid = coords.path_edge_attr(self.max_hops)  # [b,n,n,P,F], [b,n,n,P]
        if attr.dtype.is_floating_point:
            x = self.edge_embedding(attr) * valid[..., None]  # [b,n,n,P,h']
            c = torch.einsum("bijph,phk->bijk", x, self.hop_weight)
            return (c / valid.sum(-1, keepdim=True).clamp(min=1)).permute(0, 3, 1, 2)
        rows, index, count = self._cached_path_codes(coords, attr, valid)
        x = self.edge_embedding(rows)  # [U, h']
        per_hop = torch.einsum("uh,phk->puk", x, self.hop_weight).flatten(0, 1)  # [P·U, h]
        per_hop = torch.cat([per_hop, per_hop.new_zeros(1, per_hop.shape[-1])])
        c = per_hop[index].sum(-2) / count  # [b, n, n, h]
        return c.permute(0, 3, 1, 2)

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        c = self.pair_bias(ctx.coords)

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + c[b, h, q_idx, kv_idx]

        return mod

    def bias(self, ctx: AttentionContext) -> Tensor:
        self.check_context(ctx)
        return self.pair_bias(ctx.coords)


@register("graphormer", hook="score", needs=(GraphLayout, GraphEdges), learnable=True, family="graph",
          paper=PAPER + ", eqs. 6-7", context=("num_heads",))
class GraphormerBias(ScoreEncoding):
    """Graphormer's attention bias `b_φ(v_i, v_j) + c_ij`: [`GraphormerSpatial`][mmpe.encodings.graphormer.GraphormerSpatial] plus
    [`GraphormerEdge`][mmpe.encodings.graphormer.GraphormerEdge] (skipped with `use_edges=False`). Use it with
    `graphormer_centrality` (input hook) for the paper's full set of encodings.

    Args:
        num_heads, max_distance: as [`GraphormerSpatial`][mmpe.encodings.graphormer.GraphormerSpatial].
        num_edge_types, edge_dim, max_hops: as [`GraphormerEdge`][mmpe.encodings.graphormer.GraphormerEdge].
        use_edges: include the edge term (needs edge features on the coordinates).

    Raises:
        ValueError: as [`GraphormerSpatial`][mmpe.encodings.graphormer.GraphormerSpatial] and [`GraphormerEdge`][mmpe.encodings.graphormer.GraphormerEdge].
        TypeError: coordinates without the `GraphLayout` and `GraphEdges` capabilities.
    """

    def __init__(self, num_heads: int, max_distance: int = 20, num_edge_types: int = 32,
                 edge_dim: int | None = None, max_hops: int = 5, use_edges: bool = True) -> None:
        super().__init__()
        self.spatial = GraphormerSpatial(num_heads, max_distance)
        self.edge = GraphormerEdge(num_heads, num_edge_types, edge_dim, max_hops) if use_edges else None

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        spatial = self.spatial.score_mod(ctx)
        if self.edge is None:
            return spatial
        edge = self.edge.score_mod(ctx)

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return edge(spatial(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

        return mod

    def bias(self, ctx: AttentionContext) -> Tensor:
        """Eager path: spatial plus edge bias, `[b, n_h, n, n]`."""
        out = self.spatial.bias(ctx)
        return out if self.edge is None else out + self.edge.bias(ctx)


@register("graphormer_centrality", hook="input", needs=(GraphLayout,), learnable=True,
          family="graph", paper=PAPER + ", eq. 5", context=("d_model",))
class GraphormerCentrality(InputEncoding):
    """`P_i = z⁻[min(deg⁻(v_i), max_degree)] + z⁺[min(deg⁺(v_i), max_degree)]`.

    Degrees from the `GraphLayout` members `in_degree`/`out_degree`; `P` is zero at
    padding and at the virtual token. On an undirected graph `deg⁻ = deg⁺` and the two
    tables act as one (the paper uses a single degree there).

    Args:
        d_model: width of `P`.
        max_degree: degrees above it share its row (Graphormer: 512).

    Shapes: `forward(coords) -> [b, n_max, d_model]`.

    Raises:
        ValueError: `d_model` or `max_degree` < 1.
        TypeError: coordinates without the `GraphLayout` capability.
    """

    def __init__(self, d_model: int, max_degree: int = 64) -> None:
        super().__init__()
        if d_model < 1 or max_degree < 1:
            raise ValueError("graphormer_centrality: d_model and max_degree must be >= 1")
        self.max_degree = max_degree
        self.z_in = nn.Embedding(max_degree + 1, d_model)
        self.z_out = nn.Embedding(max_degree + 1, d_model)
        nn.init.normal_(self.z_in.weight, std=0.02)
        nn.init.normal_(self.z_out.weight, std=0.02)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        p = (self.z_in(coords.in_degree.clamp(max=self.max_degree))
             + self.z_out(coords.out_degree.clamp(max=self.max_degree)))
        return p * coords.node_mask[..., None]


@register("graphormer_virtual", hook="input", needs=(VirtualNode,), learnable=True,
          family="graph", paper=PAPER + ", §3.1 (special node)", context=("d_model",))
class GraphormerVirtualToken(InputEncoding):
    """The virtual graph token's learned embedding, placed in slot 0 (zeros elsewhere).

    Needs `Graph(..., virtual_token=True)`; `Graph.pad_nodes` leaves slot 0 at zero, so
    `x + P` makes it the learned [VNode] vector. Read the graph representation from the
    transformer's output at slot 0.

    Shapes: `forward(coords) -> [b, n_max, d_model]`.

    Raises:
        ValueError: coordinates built without `virtual_token=True`.
        TypeError: coordinates without the `GraphLayout` capability.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(d_model) * 0.02)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        if not coords.virtual_token:
            raise ValueError("graphormer_virtual: build the coordinates with Graph(..., virtual_token=True)")
        mask = coords.node_mask  # [b, n_max]
        slot = torch.zeros(*mask.shape, 1, device=mask.device, dtype=self.token.dtype)
        slot[:, 0] = 1.0
        return slot * self.token
