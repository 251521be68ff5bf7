"""FoX, the Forgetting Transformer: forget gates as a data-dependent decay (Lin et al. 2025)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Causal
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_causal,
    require_qk,
)
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.registry import register


@register(
    "fox", hook="score", needs=(Causal,), learnable=True, family="gate",
    aliases=("forgetting_transformer",),
    paper="Lin, Nikishin, He & Courville 2025, Forgetting Transformer: Softmax Attention with "
          "a Forget Gate (ICLR), eqs. 4-6", context=("d_model", "num_heads"))
class ForgettingGate(ContentScoreEncoding):
    """Per-head scalar forget gates turned into an additive decay (Lin et al. 2025).

    `f_t = σ(w_hᵀ x_t + b_h)` per head and token; `D_ij = Σ_{l=j+1}^{i} log f_l` for
    `j ≤ i` (masked otherwise); `O = softmax(QKᵀ/√d + D) V`. With per-token cumulative
    sums `c_i = Σ_{l ≤ i} log f_l` the term is `D_ij = c_i − c_j`, so the score mod reads
    two `[b, n_h, n]` vectors: memory O(n), never an `n×n` tensor (the FlexAttention form
    the paper recommends). All gates 1 (`log f = 0`) give `D = 0`: no positional term.
    `log f` is computed with `logsigmoid` (no underflow) and summed in float32 whatever the
    model's dtype or autocast (a bf16 running sum drifts by whole nats). Causal attention only.
    Cached decoding is exact: the cumulative sums of the cached tokens are kept in the layer's
    cache (`cache.state`) and a step extends them with its own gates.

    Args:
        d_model: width of `x`.
        num_heads: `n_h`.

    Raises:
        ValueError: non-positive sizes; non-causal coordinates; `x` missing or not
            covering every key.
    """

    shard_refusal = ("its forget gates are a running sum over every token from the key to "
                     "the query, computed from each token's layer input x; a rank holds only its "
                     "own tokens' x")

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        check_positive_int("fox", "d_model", d_model)
        check_positive_int("fox", "num_heads", num_heads)
        self.num_heads = num_heads
        self.gate = nn.Linear(d_model, num_heads)

    def log_forget(self, x: Tensor) -> Tensor:
        """The log forget gates `log f [b, n, n_h]` (float32) of `x [b, n, d_model]`."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            w, b = self.gate.weight.float(), self.gate.bias.float()
            return F.logsigmoid(F.linear(x.float(), w, b))

    def cumulative_log_forget(self, x: Tensor, start: Tensor | None = None) -> Tensor:
        """FoX's running sum of the log forget gates.

        `c [b, n_h, n]` float32: running sum over tokens of `log f` from `x [b, n, d_model]`,
        continuing from `start` `[b, n_h]` (the last cached token's sum) when given."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            c = self.log_forget(x).cumsum(dim=1).transpose(1, 2)
        return c if start is None else c + start.unsqueeze(-1)

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self.check_coords(ctx.coords)
        require_causal("fox", ctx)
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        c, batch = self._sums(ctx), ctx.batch
        # A second tensor for the key side: compiled flex differentiates a captured tensor only
        # if the score_mod indexes it once (tests/package/test_score_mod_indexing.py).
        c_q, c_k = c, c.clone()
        first = ctx.coords.num_keys - ctx.coords.num_queries  # the queries' own key slots

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = batch_index(b, batch)
            return score + c_q[bb, h, q_idx + first] - c_k[bb, h, kv_idx]

        return mod

    def _sums(self, ctx: AttentionCall) -> Tensor:
        """`c` for every key: from `x` alone, or the cached sums extended by this step's."""
        cache = ctx.cache
        if cache is None:
            require_qk("fox", ctx, x=True)
            return self.cumulative_log_forget(ctx.x)
        key = ("fox", id(self))
        past = cache.state.get(key)
        if past is not None and past.shape[-1] == ctx.coords.num_keys:
            return past  # this step's sums are already in (a second call in one forward)
        if past is None and ctx.coords.num_keys != ctx.x.shape[1]:
            raise ValueError("fox: the cache holds keys but no forget-gate sums for them; fill "
                             "the cache through this model from its first token")
        start = None if past is None else past[..., -1]
        c = self.cumulative_log_forget(ctx.x, start)
        c = c if past is None else torch.cat((past, c), dim=-1)
        if c.shape[-1] != ctx.coords.num_keys:
            raise ValueError(f"fox: {c.shape[-1]} gate sums for {ctx.coords.num_keys} keys")
        cache.state[key] = c
        return c
