"""Huang et al. 2020: four relative position embeddings with more query–key–position interaction.

Huang, Liang, Xu & Xiang 2020, *Improve Transformer Models with Better Relative Position
Embeddings* (Findings of EMNLP), §3. With `r = clip(j − i, k)` (key minus query position,
tokens) and `d = h_d`:

* method 1 `e_ij = (q_i·k_j) · a_{|r|} / √d` — a learned scalar per absolute distance;
* method 2 `e_ij = (q_i·k_j) · a_r / √d` — a learned scalar per signed offset;
* method 3 `e_ij = Σ_c q_ic k_jc a_{r,c} / √d` — a learned vector inside the dot product;
* method 4 `e_ij = (q_i·k_j + q_i·a_r + k_j·a_r) / √d` — Shaw et al. plus a key-side term.

In a causal decoder only `r ≤ 0` occurs, so methods 1 and 2 have the same free parameters
and (with the same initialisation) train identically; they differ in bidirectional encoders.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.capabilities import Directed
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_qk,
)
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.encodings.shaw import ShawRelative, clipped_relative_index
from mmpe.registry import register

PAPER = ("Huang, Liang, Xu & Xiang 2020, Improve Transformer Models with Better Relative "
         "Position Embeddings (Findings of EMNLP), §3, method {}")


class _ScalarMultiplier(ScoreEncoding):
    """Methods 1 and 2: the scaled logit `q·k/√d` times a learned scalar per head and offset."""

    additive = False
    signed = False

    def __init__(self, num_heads: int, max_relative_position: int = 16) -> None:
        super().__init__()
        name = type(self).registry_name
        check_positive_int(name, "num_heads", num_heads)
        check_positive_int(name, "max_relative_position (k)", max_relative_position)
        self.num_heads, self.k = num_heads, max_relative_position
        rows = 2 * max_relative_position + 1 if self.signed else max_relative_position + 1
        # ones: the method starts as plain attention and learns the multipliers.
        self.table = nn.Parameter(torch.ones(rows, num_heads))

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        table, k, signed = self.table, self.k, self.signed

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            r = clipped_relative_index(ctx, q_idx, kv_idx, b, k)
            row = r if signed else (r - k).abs()
            return score * table[row, h]

        return mod


@register("huang_1", hook="score", needs=(Directed,), learnable=True, family="relative",
          paper=PAPER.format(1), context=("num_heads",))
class HuangMethod1(_ScalarMultiplier):
    """Method 1: `e_ij = (q_i·k_j/√d) · a_{h, min(|j − i|, k)}`, one scalar per head and distance.

    Args:
        num_heads: `n_h`.
        max_relative_position: clipping distance `k` (tokens, ≥ 1); table `[k+1, n_h]`
            initialised to 1 (plain attention).

    Raises:
        ValueError: `max_relative_position < 1` or `num_heads < 1`.
    """

    signed = False


@register("huang_2", hook="score", needs=(Directed,), learnable=True, family="relative",
          paper=PAPER.format(2), context=("num_heads",))
class HuangMethod2(_ScalarMultiplier):
    """Method 2: `e_ij = (q_i·k_j/√d) · a_{h, clip(j − i, k)}`, direction-aware scalars.

    Args:
        num_heads: `n_h`.
        max_relative_position: clipping distance `k` (tokens, ≥ 1); table `[2k+1, n_h]`
            initialised to 1.

    Raises:
        ValueError: `max_relative_position < 1` or `num_heads < 1`.
    """

    signed = True


@register("huang_3", hook="score", needs=(Directed,), learnable=True, family="relative",
          paper=PAPER.format(3), context=("head_dim",))
class HuangMethod3(ContentScoreEncoding):
    """Method 3: `e_ij = Σ_c q_ic k_jc a_{r,c} / √d`, `r = clip(j − i, k)`.

    Written as the usual logit plus an additive content term,
    `e_ij = q_i·k_j/√d + Σ_c q_ic k_jc (a_{r,c} − 1)/√d`, so it composes with other score
    terms. Efficient form: two `[b, n_h, n_q, n_k]` products for the pairs clipped to `±k`,
    and a gather over the `≈ n·(2k−1)` pairs inside the window ([`term`][mmpe.encodings.huang.HuangMethod3.term]) — never
    `n×n×h_d`.

    Args:
        head_dim: `h_d`.
        max_relative_position: clipping distance `k` (tokens, ≥ 1); table `[2k+1, h_d]`
            shared by the heads, initialised to 1 (plain attention).

    Raises:
        ValueError: `max_relative_position < 1` or `head_dim < 1`.
    """

    def __init__(self, head_dim: int, max_relative_position: int = 16) -> None:
        super().__init__()
        check_positive_int("huang_3", "head_dim", head_dim)
        check_positive_int("huang_3", "max_relative_position (k)", max_relative_position)
        self.head_dim, self.k = head_dim, max_relative_position
        self.table = nn.Parameter(torch.ones(2 * max_relative_position + 1, head_dim))

    def term(self, ctx: AttentionCall) -> Tensor:
        """`Σ_c q_ic k_jc (a_{r(i,j),c} − 1)/√d` on every pair, `[b, n_h, n_q, n_k]`.

        Pairs beyond the clipping distance share the rows `±k`: two full products, each kept
        on its side. Pairs inside it (`|j − i| < k`, about `n·(2k−1)` of them) are gathered
        and summed channel by channel: memory `O(n·k·h_d)`, never `n×n×h_d`.
        """
        from mmpe.coords.base import index_grid

        coords, kk = ctx.coords, self.k
        q, k = ctx.q.float(), ctx.k.float()
        bsz = q.shape[0]
        b, _, qi, ki = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                                  coords.device)
        rows = clipped_relative_index(ctx, qi, ki, b, kk)[:, 0]  # [b or 1, n_q, n_k]
        delta = self.table.float() - 1.0
        kt = k.transpose(-2, -1)
        # The products may run in bf16 under autocast; the sum is accumulated in float32.
        out = ((rows == 2 * kk).unsqueeze(1) * ((q * delta[2 * kk]) @ kt).float()
               + (rows == 0).unsqueeze(1) * ((q * delta[0]) @ kt).float())
        if torch.compiler.is_compiling():
            # Static shapes for the compiler: one product per interior row (no nonzero()).
            for r in range(1, 2 * kk):
                out = out + (rows == r).unsqueeze(1) * ((q * delta[r]) @ kt).float()
            return out * ctx.head_dim ** -0.5
        pb, pi, pj = torch.nonzero((rows > 0) & (rows < 2 * kk), as_tuple=True)
        if pi.numel():
            r = rows[pb, pi, pj]
            if rows.shape[0] == 1:  # positions shared by the batch: every example, same pairs
                vals = (q[:, :, pi] * k[:, :, pj] * delta[r]).sum(-1)  # [b, n_h, M]
                heads = torch.arange(q.shape[1], device=q.device)
                out = out.index_put((torch.arange(bsz, device=q.device)[:, None, None], heads[None, :, None],
                                     pi[None, None], pj[None, None]), vals, accumulate=True)
            else:
                vals = (q[pb, :, pi] * k[pb, :, pj] * delta[r][:, None]).sum(-1)  # [M, n_h]
                heads = torch.arange(q.shape[1], device=q.device)
                out = out.index_put((pb[:, None], heads[None], pi[:, None], pj[:, None]),
                                    vals, accumulate=True)
        return out * ctx.head_dim ** -0.5

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self.check_coords(ctx.coords)
        require_qk("huang_3", ctx)
        term, batch = self.term(ctx), ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + term[batch_index(b, batch), h, q_idx, kv_idx]

        return mod


@register("huang_4", hook="score", needs=(Directed,), learnable=True, family="relative",
          paper=PAPER.format(4), context=("head_dim",))
class HuangMethod4(ShawRelative):
    """Method 4: `e_ij = (q_i·k_j + q_i·a_r + k_j·a_r)/√d` — Shaw's key term plus `k_j·a_r`.

    Both products are gathered from `[b, n_h, n, 2k+1]` tables (`q·aᵀ` and `k·aᵀ`).
    With the key-side term zero this is exactly [`ShawRelative`][mmpe.encodings.shaw.ShawRelative].

    Args:
        head_dim: `h_d`.
        max_relative_position: clipping distance `k` (tokens, ≥ 1).

    Raises:
        ValueError: `max_relative_position < 1` or `head_dim < 1`.
    """

    def __init__(self, head_dim: int, max_relative_position: int = 16) -> None:
        super().__init__(head_dim, max_relative_position, values=False)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self._check(ctx)
        qa = self.key_logits(ctx)
        ka = torch.einsum("bhnd,rd->bhnr", ctx.k.float(), self.key_table.float()) * ctx.head_dim ** -0.5
        k, batch = self.k, ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            r = clipped_relative_index(ctx, q_idx, kv_idx, b, k)
            bb = batch_index(b, batch)
            return score + qa[bb, h, q_idx, r] + ka[bb, h, kv_idx, r]

        return mod
