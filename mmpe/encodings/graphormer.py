"""Graphormer's structural encodings.

Graphormer's structural encodings (Ying et al. 2021, "Do Transformers Really Perform Bad for
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

from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GraphEdges, GraphLayout, VirtualNode
from mmpe.coords.graph import UNREACHABLE, VIRTUAL
from mmpe.encodings._pair_bias import dense_bias_mod
from mmpe.encodings.base import AttentionCall, InputEncoding, ScoreEncoding, ScoreMod
from mmpe.registry import register

PAPER = ("Ying et al. 2021, Do Transformers Really Perform Bad for Graph Representation? "
         "(NeurIPS)")

#: Parameter-free path-edge codes per coordinates object (shared by every GraphormerEdge, so
#: the layers of one model derive them once per batch); entries vanish with the coordinates.
_PATH_CODES: WeakKeyDictionary[Any, dict[Any, Any]] = WeakKeyDictionary()


def spatial_buckets(spd: Tensor, max_distance: int, out: Tensor | None = None) -> Tensor:
    """Map `spd` codes to bucket ids.

    Map `spd` codes (`GraphLayout`) to bucket ids (`spd`'s dtype; into `out` where given,
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

    structure = "table"

    def __init__(self, num_heads: int, max_distance: int = 20) -> None:
        super().__init__()
        if num_heads < 1 or max_distance < 1:
            raise ValueError(f"graphormer_spatial: num_heads and max_distance must be >= 1, "
                             f"got {num_heads}, {max_distance}")
        self.num_heads, self.max_distance = num_heads, max_distance
        self.table = nn.Parameter(torch.randn(max_distance + 3, num_heads) * 0.02)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        buckets = spatial_buckets(ctx.coords.spd, self.max_distance)  # [b, n, n]
        table = self.table

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[buckets[b, q_idx, kv_idx], h]

        return mod


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

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        return dense_bias_mod(self.pair_bias(ctx.coords))


@register("graphormer", hook="score", needs=(GraphLayout, GraphEdges), learnable=True, family="graph",
          paper=PAPER + ", eqs. 6-7", context=("num_heads",))
class GraphormerBias(ScoreEncoding):
    """Graphormer's attention bias: spatial plus edge terms.

    Graphormer's attention bias `b_φ(v_i, v_j) + c_ij`: [`GraphormerSpatial`][mmpe.encodings.graphormer.GraphormerSpatial] plus
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

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        spatial = self.spatial.score_mod(ctx)
        if self.edge is None:
            return spatial
        edge = self.edge.score_mod(ctx)

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return edge(spatial(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

        return mod


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
