"""p-RoPE: RoPE with its lowest frequencies removed (Barbero et al. 2025)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings.rope import RoPE, rope_inv_freq
from mmpe.registry import register


def p_rope_inv_freq(head_dim: int, p: float, base: float = 10000.0) -> Tensor:
    """Frequencies of p-RoPE, float64 `[head_dim/2]` (radians per token).

    The first `⌊p·h_d/2⌋` entries are RoPE's own `θ_i = base^(−2i/h_d)` (the highest
    frequencies, exponent over the *whole* head dimension); the remaining `h_d/2 − ⌊p·h_d/2⌋`
    (the lowest) are 0, so their pairs are never rotated.

    Raises:
        ValueError: `p` not in (0, 1], or `⌊p·h_d/2⌋ = 0` (nothing would rotate).
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p_rope: p must be in (0, 1] (the fraction of frequencies kept; "
                         f"p = 0 is NoPE, build 'nope'), got {p!r}")
    half = head_dim // 2
    kept = math.floor(p * head_dim / 2 + 1e-9)
    if kept < 1:
        raise ValueError(f"p_rope: p={p} keeps ⌊p·head_dim/2⌋ = 0 of the {half} frequencies "
                         f"of head_dim={head_dim}: nothing would rotate (that is 'nope'); use "
                         f"p >= {2 / head_dim:.4g}")
    inv = rope_inv_freq(head_dim, base)
    inv[kept:] = 0.0
    return inv


@register(
    "p_rope", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("prope",),
    paper="Barbero et al. 2025, Round and Round We Go! What makes Rotary Positional Encodings "
          "useful? (ICLR 2025, arXiv:2410.06205), §6 (p-RoPE)", context=("head_dim",))
class PRoPE(RoPE):
    """p-RoPE: only the highest-frequency fraction `p` of RoPE's pairs rotate.

    p-RoPE: only the highest-frequency fraction `p` of RoPE's pairs rotate (Barbero et al.
    2025, §6).

    The paper's convention: `p` is the fraction of frequencies **kept**; 1-RoPE is RoPE and
    0-RoPE is NoPE. Pair `i` of a token at position `m` turns by `m·θ_i` with

        θ_i = base^(−2i/h_d)  for i < ⌊p·h_d/2⌋,    θ_i = 0 otherwise

    ([`p_rope_inv_freq`][mmpe.encodings.p_rope.p_rope_inv_freq]): the low frequencies — those
    that barely move over a context and so act as position-free "semantic channels" in the
    paper's analysis — are truncated to exactly 0, the kept ones are unchanged. This differs
    from `rope(rotary_dim=r)` (GPT-NeoX partial rotary), which rotates the first `r`
    channels with the spectrum `base^(−2i/r)` recomputed over `r` (so it keeps the lowest
    frequency `base^(−(r−2)/r)`), and with the half-split layout leaves the *last* channels
    unrotated; here the unrotated channels are the pairs `(i, i + h_d/2)`, `i ≥ ⌊p·h_d/2⌋`
    (interleaved: `(2i, 2i+1)`). The number kept is `⌊p·h_d/2⌋` (floor; an assumption where
    the paper gives no rounding rule, matching Gemma's reference code as we know it, which pads
    the kept frequencies with zeros).

    Scores stay relative (`q_mᵀ k_n` depends on `m − n` only); the unrotated pairs contribute
    a position-independent term.

    Args:
        head_dim: `h_d` (even).
        p: fraction of the frequencies kept, in (0, 1] (default 0.75; the paper trains Gemma 2B
            with p = 0.25 and 0.75). p = 1 is `rope`; p = 0 is `nope` (build that instead).
        base: frequency base (10000).
        interleaved: pairs `(2i, 2i+1)` (True) or `(i, i + h_d/2)` (False, default, HF/Gemma).

    Shapes: as [`RoPE`][mmpe.encodings.rope.RoPE]: `forward(q [b, n_h, n_q, h_d], k, coords)
    -> (q, k)`.

    Raises:
        ValueError: `p` outside (0, 1] or keeping no frequency of `head_dim`, odd `head_dim`,
            `base <= 1`, bad q/k shapes.
    """

    saved_settings = ("p", "base", "rotary_dim", "interleaved")

    def __init__(self, head_dim: int, p: float = 0.75, base: float = 10000.0,
                 interleaved: bool = False) -> None:
        super().__init__(head_dim, base, None, interleaved)
        self.p = float(p)
        self._inv_freq = p_rope_inv_freq(head_dim, self.p, self.base)  # checks p
        with torch.device("cpu"):  # a setting, counted on the host (a meta build included)
            self.kept = int((p_rope_inv_freq(head_dim, self.p, self.base) > 0).sum())

    def inv_freq(self, seq_len: int) -> Tensor:
        """`[h_d/2]` float64: RoPE's first `⌊p·h_d/2⌋` frequencies, then zeros."""
        return self._inv_freq.clone()
