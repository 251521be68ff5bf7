"""DAPE (Zheng et al. 2024): an additive positional term refined by an MLP that reads the logits."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Metric
from mmpe.encodings._precision import full_precision
from mmpe.encodings.base import AttentionCall, KernelEncoding, ScoreEncoding
from mmpe.registry import build, register
from mmpe.validation import check_positive_int

#: the MLP's hidden width in the paper's experiments (`D_DAPE`)
HIDDEN = 32


def dape_logits(logits: Tensor, bias: Tensor, mlp: nn.Module) -> Tensor:
    """DAPE's logits `A = L + B + f([L; B])`.

    `A = L + B + f([L; B])` for logits `L` and a bias `B`, `[b, n_h, n_q, n_k]` each, where
    `f` (`mlp`, `2·n_h → n_h` channels) acts on every pair's `2·n_h` values: the heads'
    logits and the heads' biases, concatenated."""
    pairs = torch.cat((logits, bias), dim=1).movedim(1, -1)  # [b, n_q, n_k, 2·n_h]
    return logits + bias + mlp(pairs).movedim(-1, 1)


@register(
    "dape", hook="kernel", needs=(Metric,), learnable=True, family="bias",
    paper="Zheng, Gao, Shi, Huang, Li, Xiong, Ren, Ng, Jiang, Li & Li 2024, DAPE: Data-Adaptive "
          "Positional Encoding for Length Extrapolation (NeurIPS; arXiv:2405.14722)",
    context=("d_model", "num_heads", "head_dim"))
class DAPE(KernelEncoding):
    """DAPE: an additive positional term's bias refined by an MLP that sees the logits.

    DAPE (Zheng et al. 2024): the bias `B` of an additive positional term (ALiBi, KERPLE,
    FIRE, T5 …) refined by a small MLP that also sees the attention logits.

    `A = QKᵀ/√h_d + B + f(QKᵀ/√h_d, B)`, `O = softmax(A) V`, with `f` a two-layer MLP
    (`2·n_h → hidden → n_h`, LeakyReLU) applied to every (query, key) pair on the
    concatenation over heads of the pair's logits and biases
    ([`dape_logits`][mmpe.encodings.dape.dape_logits]). `f = 0` gives the inner term alone.
    The MLP mixes heads, which a FlexAttention `score_mod` (one head at a time) cannot, so DAPE
    is a kernel encoding: the math route, with memory `O(b · n_q · n_k · hidden)`.

    It runs on every coordinate type its inner term runs on (the instance's `needs` are the
    inner term's; the registry lists the default's, ALiBi's `Metric`), with the inner term's
    own errors, and with a cache wherever the inner term decodes exactly. Other score terms of
    the layer add to the logits as they do to softmax's (read as `scores − q·kᵀ/√h_d`; the
    MLP sees `q·kᵀ` and the inner term only).

    Args:
        num_heads: `n_h`.
        inner: the additive term refined: a registry name, a config dict (`{"name": ...,
            **options}`) or a built score encoding; a name or config is built with this
            encoding's context (`d_model`, `num_heads`, `head_dim`).
        hidden: the MLP's hidden width (the paper's `D_DAPE`, 32).
        d_model, head_dim: passed on to the inner term where it takes them.

    Shapes: `attend(scores [b, n_h, n_q, n_k] (masked at −inf), v [b, n_h, n_k, h_d], ctx)`
    reads `ctx.q`, `ctx.k`; the inner term reads what it reads.

    Raises:
        ValueError: a non-positive size; an inner term that is not additive (a rescaling term)
            or adds a value-side term; at run time, heads other than built for.
        TypeError: an inner term that is not a score encoding (a rotary, input or kernel one);
            coordinates the inner term cannot run on.
    """

    is_softmax = False
    shard_refusal = ("its MLP reads every head's logits of a pair from the dense score "
                     "matrix of the math route, which a shard of the sequence does not run")

    def __init__(self, num_heads: int, inner: str | Mapping[str, Any] | ScoreEncoding = "alibi",
                 hidden: int = HIDDEN, d_model: int | None = None,
                 head_dim: int | None = None) -> None:
        super().__init__()
        check_positive_int("dape", "num_heads", num_heads)
        check_positive_int("dape", "hidden", hidden)
        self.num_heads = num_heads
        if isinstance(inner, (str, Mapping)):
            context = {k: v for k, v in (("num_heads", num_heads), ("d_model", d_model),
                                         ("head_dim", head_dim)) if v is not None}
            inner = build(inner, context=context)
        if not isinstance(inner, ScoreEncoding):
            raise TypeError(f"dape: inner must be an additive score encoding (a name, a config "
                            f"or a built one), got {type(inner).__name__}")
        if not inner.additive or inner.needs_probs:
            raise ValueError(f"dape: inner must add a term to the logits; "
                             f"{type(inner).__name__} "
                             f"{'rescales them' if not inner.additive else 'adds a value term'}")
        self.inner = inner
        self.needs = inner.needs  # this instance runs where its inner term runs
        self.mlp = nn.Sequential(nn.Linear(2 * num_heads, hidden), nn.LeakyReLU(),
                                 nn.Linear(hidden, num_heads))

    def bias(self, ctx: AttentionCall) -> Tensor:
        """The inner term's bias `B` on every pair.

        The inner term's bias `B` `[b or 1, n_h, n_q, n_k]` (float32), every pair (masked
        ones too: the MLP is per pair, so they never reach an allowed one)."""
        coords = ctx.coords
        mod = self.inner.score_mod(ctx)
        b, h, q, k = index_grid(coords.batch_size or 1, ctx.num_heads, coords.num_queries,
                                coords.num_keys, ctx.q.device)
        zero = torch.zeros((), dtype=torch.float32, device=ctx.q.device)
        return mod(zero, b, h, q, k).float()

    def logits(self, ctx: AttentionCall) -> Tensor:
        """`A = QKᵀ/√h_d + B + f(QKᵀ/√h_d, B)` `[b, n_h, n_q, n_k]`, float32, unmasked."""
        if ctx.num_heads != self.num_heads:
            raise ValueError(f"dape: built for num_heads={self.num_heads}, attention has "
                             f"{ctx.num_heads}")
        self.check_coords(ctx.coords)
        scale = self.inner.softmax_scale(ctx.head_dim) or 1.0 / math.sqrt(ctx.head_dim)
        bias = self.bias(ctx)
        with full_precision(ctx.q.device):
            logits = (ctx.q.float() @ ctx.k.float().transpose(-2, -1)) * scale
            bias = bias.expand_as(logits)
            mlp = _float32(self.mlp)
            # a pair the inner term masks (a -inf bias) stays masked; the MLP sees finite inputs
            # only, since it mixes the heads of a pair and one -inf would make every head NaN
            ok = torch.isfinite(bias).all(dim=1, keepdim=True)
            out = dape_logits(logits, torch.where(ok, bias, torch.zeros_like(bias)), mlp)
            return torch.where(ok, out, bias)

    def weights(self, scores: Tensor, ctx: AttentionCall) -> Tensor:
        """Attention probabilities for the math route's masked logits.

        Attention probabilities `[b, n_h, n_q, n_k]` (float32) for the math route's masked
        logits `scores` (which carry the mask and the layer's other score terms)."""
        # What the math route added to q·kᵀ/√h_d (the mask and other terms), the same
        # expression as the path's: exactly 0 where nothing else is added.
        plain = (ctx.q @ ctx.k.transpose(-2, -1)).float() * (1.0 / math.sqrt(ctx.head_dim))
        logits = self.logits(ctx) + (scores - plain)
        # a query with every key masked (a left-padded row) attends to nothing: zeros, as SDPA
        # returns for such rows, rather than a NaN that its values would carry to every token
        empty = torch.isneginf(logits).all(dim=-1, keepdim=True)
        return logits.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionCall) -> Tensor:
        probs = self.weights(scores, ctx)
        return probs @ v.to(probs.dtype)


def _float32(mlp: nn.Sequential):
    """`mlp` evaluated with float32 weights (a bf16 model's MLP on float32 logits)."""
    first, act, last = mlp

    def run(x: Tensor) -> Tensor:
        x = F.linear(x, first.weight.float(), first.bias.float())
        return F.linear(act(x), last.weight.float(), last.bias.float())

    return run
