"""Relative displacement and distance as a per-head bias (MeshGraphNets' edge features)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._captured import per_head_units
from mmpe.encodings._geometry import pad_axes, safe_sqrt
from mmpe.encodings._precision import term_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int


def _float_positions(pos: Tensor) -> Tensor:
    return pos.to(torch.float64 if pos.dtype == torch.float64 else torch.float32)


@register(
    "mesh_displacement", hook="score", needs=(Positioned,), learnable=True, family="geometry",
    aliases=("meshgraphnet_edges",),
    paper="Pfaff et al. 2021, Learning Mesh-Based Simulation with Graph Networks (ICLR; "
          "MeshGraphNets), §3.1 edge features",
    context=("num_heads", "num_axes"))


class MeshDisplacementBias(SavesSettings, ScoreEncoding):
    """`score + MLP([x_q − x_k, ‖x_q − x_k‖] / L)_h`: MeshGraphNets' edge features as a bias.

    MeshGraphNets (Pfaff et al. 2021, §3.1) encode a mesh edge from node `j` to node `i` by
    the relative displacement and its norm, `e_ij = [x_i − x_j, |x_i − x_j|]`, and an MLP.
    Here every (query `i`, key `j`) pair is such an edge: the `A + 1` features (divided by
    a fixed `length_scale` L, in place of MeshGraphNets' running normaliser) go through
    `Linear(A + 1, W) → ReLU → Linear(W, n_h)`, one bias per head. `x` are the coordinates'
    positions (mesh-space coordinates of [`mmpe.Points`][mmpe.coords.points.Points], grid cells, …).

    The displacement is relative, so the bias is invariant to translations of all positions,
    but its components are not invariant to rotations (the MLP sees the direction): MeshGraphNets
    is translation-equivariant, not rotation-equivariant. Tokens without a coordinate (a grid's
    prefix tokens) sit at 0, as the coordinates report them.

    FlexAttention: the features and the MLP are unrolled into `≈ W·(A + 4)` scalar operations
    per score (FIRE's form, O(n) memory); the dense form (`mmpe.attention.fast_forms.geometry`) runs the MLP as matrix
    products on every pair, with the same numbers.

    Args:
        num_heads: `n_h`.
        num_axes: `A`, axes of the displacement (2 for MeshGraphNets' CFD meshes, 3 in world
            space; the model context passes the coordinates'). Positions with fewer axes are
            embedded with zeros appended (a planar mesh in 3D); more axes are an error.
        mlp_width: hidden width `W`.
        length_scale: `L` (coordinate units): typical edge length, so that the MLP reads
            features of order 1.

    Shapes: bias `[b or 1, n_h, n_q, n_k]`.

    Raises:
        ValueError: non-positive `num_heads`, `num_axes`, `mlp_width` or
            `length_scale`; coordinates with more than `num_axes` axes; attention with
            another head count.
        TypeError: coordinates without positions (`Positioned`).
    """

    saved_settings = ("length_scale",)

    def __init__(self, num_heads: int, num_axes: int = 3, mlp_width: int = 32,
                 length_scale: float = 1.0) -> None:
        super().__init__()
        for arg, val in (("num_heads", num_heads), ("num_axes", num_axes), ("mlp_width", mlp_width)):
            check_int("mesh_displacement", arg, val)
        length_scale = check_finite_float("mesh_displacement", "length_scale", length_scale,
                                          low=0.0, low_open=True)
        self.num_heads, self.num_axes, self.length_scale = num_heads, num_axes, float(length_scale)
        self.mlp = nn.Sequential(nn.Linear(num_axes + 1, mlp_width), nn.ReLU(),
                                 nn.Linear(mlp_width, num_heads))

    def _positions(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        qpos, kpos = coords.query_positions, coords.key_positions
        return (pad_axes("mesh_displacement", _float_positions(qpos), self.num_axes),
                pad_axes("mesh_displacement", _float_positions(kpos), self.num_axes))

    def features(self, coords: Coordinates) -> Tensor:
        """The pair features `[(b,) n_q, n_k, A + 1]`, in the term's dtype.

        `[Δ_1 … Δ_A, ‖Δ‖] / L` with `Δ = x_q − x_k`."""
        self.check_coords(coords)
        qpos, kpos = self._positions(coords)
        diff = (qpos.unsqueeze(-2) - kpos.unsqueeze(-3)) / self.length_scale
        dist = safe_sqrt((diff * diff).sum(-1, keepdim=True))
        return torch.cat((diff, dist), dim=-1).to(term_dtype(self))

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        qpos, kpos = self._positions(ctx.coords)
        q_axes = [qpos[..., a].contiguous() for a in range(self.num_axes)]
        k_axes = [kpos[..., a].contiguous() for a in range(self.num_axes)]
        scale = 1.0 / self.length_scale
        lin1, lin2 = self.mlp[0], self.mlp[2]
        # Compiled flex differentiates a captured tensor only through one indexing of it
        # (tests/package/test_score_mod_indexing.py): one `[n_h]` tensor per weight, read once as `[h]`.
        n_h = lin2.out_features
        t = term_dtype(self)
        w1 = [per_head_units(row, 0, n_h) for row in lin1.weight.to(t).unbind(0)]
        b1 = per_head_units(lin1.bias.to(t), 0, n_h)
        w2 = per_head_units(lin2.weight.to(t), 1, n_h)
        b2 = lin2.bias.to(t)

        def take(values: Tensor, idx: Tensor, b: Tensor) -> Tensor:
            return values[b, idx] if values.dim() == 2 else values[idx]

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            diffs = [((take(qa, q_idx, b) - take(ka, kv_idx, b)) * scale).to(t)
                     for qa, ka in zip(q_axes, k_axes, strict=True)]
            square = diffs[0] * diffs[0]
            for diff in diffs[1:]:
                square = square + diff * diff
            feats = [*diffs, safe_sqrt(square)]
            # The MLP unrolled over its hidden units so FlexAttention sees scalar ops only.
            out = b2[h]
            for w1_u, b1_u, w2_u in zip(w1, b1, w2, strict=True):
                pre = b1_u[h]
                for w, feat in zip(w1_u, feats, strict=True):
                    pre = pre + w[h] * feat
                out = out + w2_u[h] * torch.relu(pre)
            return score + out

        return mod
