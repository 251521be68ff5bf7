"""Eager forms of position-based geometry terms.

Eager forms of position-based geometry terms whose `score_mod` is scalar code for
FlexAttention: the same formula on a block of rows as tensor operations (the mesh MLP a chunk
of rows at a time within the block budget; frame-averaged RoPE as one matrix product)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmpe._scratch import block_bytes
from mmpe.attention.fast_forms.by_class import register
from mmpe.encodings._geometry import safe_sqrt
from mmpe.encodings._precision import full_precision
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.mesh_displacement import MeshDisplacementBias
from mmpe.encodings.rope_frame_averaged import FrameAveragedRoPE


def mesh_rows(self: MeshDisplacementBias, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The MLP on the pairs of queries `start … stop−1`.

    The MLP on the pairs of queries `start … stop−1`, `[b or 1, n_h, stop−start, n_k]`
    (a chunk of rows at a time: the hidden layer `[b, rows, n_k, W]` stays within
    `mmpe.attention.block_bytes()`)."""
    qpos, kpos = self._positions(ctx.coords)
    lin1, lin2 = self.mlp[0], self.mlp[2]
    batch = qpos.shape[0] if qpos.dim() == 3 else 1
    per_row = batch * kpos.shape[-2] * max(lin1.out_features, self.num_axes + 1) * 4
    step = max(1, block_bytes() // max(1, per_row))
    chunks = []
    for lo in range(start, stop, step):
        rows = qpos[..., lo:min(stop, lo + step), :]
        # float32 even under autocast: displacements of thousands of units in a bf16 matmul
        # would be off by whole units (the scalar mod is float32 too).
        with full_precision(rows.device):
            diff = ((rows.unsqueeze(-2) - kpos.unsqueeze(-3)) / self.length_scale).float()
            dist = safe_sqrt((diff * diff).sum(-1, keepdim=True))
            feats = torch.cat((diff, dist), dim=-1)  # [(b,) rows, n_k, A + 1]
            hidden = torch.relu(F.linear(feats, lin1.weight.float(), lin1.bias.float()))
            out = F.linear(hidden, lin2.weight.float(), lin2.bias.float())  # [.., n_h]
        if out.dim() == 3:
            out = out.unsqueeze(0)
        chunks.append(out.permute(0, 3, 1, 2))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=2)


def frame_averaged_rows(self: FrameAveragedRoPE, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The term of queries `start … stop−1`, `[b, n_h, stop−start, n_k]`."""
    qx, kx = self._operands(ctx)
    with full_precision(qx.device):  # a float32 difference of two scores, also under autocast
        return (qx[:, :, start:stop] @ kx.transpose(-1, -2)) * ctx.head_dim ** -0.5


register(MeshDisplacementBias, rows=mesh_rows)
register(FrameAveragedRoPE, rows=frame_averaged_rows)
