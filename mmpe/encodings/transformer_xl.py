"""Transformer-XL relative positional attention (Dai et al. 2019) and TENER (Yan et al. 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Directed
from mmpe.encodings._content import (
    ContentScoreEncoding,
    batch_index,
    check_positive_int,
    require_qk,
)
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.registry import register


def relative_range(ctx: AttentionCall) -> tuple[int, int]:
    """Smallest and largest `i − j` (query minus key position, tokens) among all pairs."""
    qpos, kpos = ctx.coords.query_positions[..., 0], ctx.coords.key_positions[..., 0]
    return int(qpos.min() - kpos.max()), int(qpos.max() - kpos.min())


def xl_sinusoid(rel: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Transformer-XL's `R_r = [sin(r·θ), cos(r·θ)]` (concatenated halves), `θ_c = base^(−2c/dim)`.

    Returns `[*rel.shape, dim]` float32; the phase is formed in float64.
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"transformer_xl: the sinusoid width must be a positive even int, got {dim}")
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=rel.device) / dim)
    phase = rel.to(torch.float64).unsqueeze(-1) * inv
    return torch.cat((phase.sin(), phase.cos()), dim=-1).float()


class _RelativeSinusoid(ContentScoreEncoding):
    """`(q_i + v)·r_{i−j} + u·k_j` with `r` from a `(hi − lo + 1)`-row table of offsets."""

    def _relative_vectors(self, rel: Tensor) -> Tensor:  # pragma: no cover - abstract
        """`[L, n_h, h_d]` for the offsets `rel` `[L]`."""
        raise NotImplementedError

    def _scale(self, ctx: AttentionCall) -> float:
        return ctx.head_dim ** -0.5

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        self.check_coords(ctx.coords)
        name = type(self).registry_name
        require_qk(name, ctx)
        if ctx.num_heads != self.num_heads or ctx.head_dim != self.head_dim:
            raise ValueError(f"{name}: built for num_heads={self.num_heads}, head_dim={self.head_dim}; "
                             f"attention has {ctx.num_heads}, {ctx.head_dim}")
        lo, hi = relative_range(ctx)
        rel = torch.arange(lo, hi + 1, device=ctx.q.device)
        r = self._relative_vectors(rel)  # [L, n_h, h_d]
        scale = self._scale(ctx)
        q, k = ctx.q.float(), ctx.k.float()
        u, v = self.u.float(), self.v.float()  # float32 even in a bf16 module, as q and k here
        bd = torch.einsum("bhnd,lhd->bhnl", q + v[None, :, None], r.float()) * scale  # (b) + (d)
        uk = torch.einsum("bhnd,hd->bhn", k, u) * scale  # (c)
        coords, batch = ctx.coords, ctx.batch

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = batch_index(b, batch)
            row = coords.relation(q_idx, kv_idx, b) - lo
            return score + bd[bb, h, q_idx, row] + uk[bb, h, kv_idx]

        return mod


@register(
    "transformer_xl", hook="score", needs=(Directed,), learnable=True, family="relative",
    aliases=("txl",),
    paper="Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length "
          "Context (ACL), §3.3", context=("d_model", "num_heads", "head_dim"))
class TransformerXLRelative(_RelativeSinusoid):
    """Transformer-XL's relative attention score (Dai et al. 2019, §3.3).

    `A_ij = q_iᵀk_j (a) + q_iᵀ W_R R_{i−j} (b) + uᵀk_j (c) + vᵀ W_R R_{i−j} (d)`, all over
    `√h_d`; `R_{i−j}` is the sinusoid of the offset `i − j` (query minus key position,
    tokens) in `d_model` channels, `W_R` a learned projection to `n_h·h_d`, and `u, v`
    the global content and position biases `[n_h, h_d]`. Term (a) is the layer's own
    `q·k`; this encoding adds (b)+(c)+(d). Efficient form (the paper's appendix B): `W_R R`
    is built once for the `2n − 1` offsets present and `(q + v)·(W_R R)` is gathered per
    pair — no `n×n×d` tensor.

    Args:
        d_model: width of the sinusoid `R` (even).
        num_heads: `n_h`.
        head_dim: `h_d`.

    Raises:
        ValueError: odd `d_model`, non-positive sizes, q/k missing from the context.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int("transformer_xl", arg, val)
        if d_model % 2:
            raise ValueError(f"transformer_xl: d_model must be even, got {d_model}")
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.r_net = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)

    def _relative_vectors(self, rel: Tensor) -> Tensor:
        # The sinusoid's phase is float64, its value float32; W_R is read in float32 too.
        r = F.linear(xl_sinusoid(rel, self.d_model), self.r_net.weight.float())
        return r.view(rel.shape[0], self.num_heads, self.head_dim)


@register(
    "tener", hook="score", needs=(Directed,), learnable=True, family="relative",
    paper="Yan, Deng, Li & Qiu 2019, TENER: Adapting Transformer Encoder for Named Entity "
          "Recognition (arXiv:1911.04474), eqs. 14-18", context=("num_heads", "head_dim"))
class TENER(SavesSettings, _RelativeSinusoid):
    """TENER's direction- and distance-aware relative attention (Yan et al. 2019, eqs. 14-18).

    `A_tj = Q_tᵀK_j + Q_tᵀR_{t−j} + uᵀK_j + vᵀR_{t−j}`, with the fixed, unprojected sinusoid
    `R_{t−j} = [… sin((t−j)/10000^{2c/h_d}), cos((t−j)/10000^{2c/h_d}) …]` in `h_d`
    channels (`t − j` = query minus key position, tokens). Because `sin` is odd,
    `R_{t−j} ≠ R_{j−t}`: the score tells left from right context (eq. 17), which the
    sinusoidal absolute encoding's dot product `PE_tᵀPE_j` cannot. TENER also drops the
    `1/√d` factor ("un-scaled" attention, §3.2.2): `softmax_scale` returns 1 unless
    `scaled=True`.

    Args:
        num_heads: `n_h`.
        head_dim: `h_d` (even).
        scaled: keep the usual `1/√h_d` instead of the paper's un-scaled attention.

    Raises:
        ValueError: odd or non-positive `head_dim`, non-positive `num_heads`.
    """

    saved_settings = ("scaled",)

    def __init__(self, num_heads: int, head_dim: int, scaled: bool = False) -> None:
        super().__init__()
        check_positive_int("tener", "num_heads", num_heads)
        check_positive_int("tener", "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"tener: head_dim must be even, got {head_dim}")
        self.num_heads, self.head_dim, self.scaled = num_heads, head_dim, bool(scaled)
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)

    def softmax_scale(self, head_dim: int) -> float | None:
        return None if self.scaled else 1.0

    def _scale(self, ctx: AttentionCall) -> float:
        return ctx.head_dim ** -0.5 if self.scaled else 1.0

    def _relative_vectors(self, rel: Tensor) -> Tensor:
        r = sinusoidal_table(rel, self.head_dim)  # interleaved sin/cos, as in eq. 16
        return r.unsqueeze(1).expand(rel.shape[0], self.num_heads, self.head_dim)
