"""Frame-averaged axial RoPE: an E(d)- (or SE(d)-) invariant rotary score (Frame Averaging)."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._content import ContentScoreEncoding, batch_index, require_qk
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall, ScoreMod
from mmpe.encodings.rope import apply_rotary
from mmpe.encodings.rope_axial import axial_phase
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int


def pca_frames(positions: Tensor, mask: Tensor | None = None,
               reflections: bool = True) -> tuple[Tensor, Tensor]:
    """The PCA frames of a point set (Puny et al. 2022, §3.3 / Appendix "E(d)" and "SE(d)").

    With centroid `t = mean_i x_i` and covariance `C = Σ_i (x_i − t)(x_i − t)ᵀ / n` with
    eigenvectors `v_1 … v_d` (ascending eigenvalues), the frames are the orthogonal matrices
    `O = [±v_1, …, ±v_d]`: all `2^d` sign choices for `E(d)` (rotations and reflections;
    `reflections=True`), or the `2^(d−1)` with `det O = +1` for `SE(d)`. Averaging a
    function over them makes it invariant to the group (given distinct eigenvalues; a point set
    with a repeated eigenvalue has no unique PCA frame, the measure-zero case the paper sets
    aside).

    Args:
        positions: `[..., n, d]` (computed in float64).
        mask: `[..., n]` bool, True at real points (padded points are left out); None = all.
        reflections: the `E(d)` frame set (True) or the `SE(d)` one (False).

    Returns:
        `(t [..., d], frames [..., F, d, d])` float64; column `a` of a frame is its axis `a`.
    """
    x = positions.to(torch.float64)
    weight = torch.ones(x.shape[:-1], dtype=torch.float64, device=x.device) if mask is None \
        else mask.to(torch.float64)
    count = weight.sum(-1, keepdim=True).clamp_min(1.0)
    centroid = (x * weight.unsqueeze(-1)).sum(-2) / count
    centred = (x - centroid.unsqueeze(-2)) * weight.unsqueeze(-1)
    cov = centred.transpose(-1, -2) @ centred / count.unsqueeze(-1)
    _, vecs = torch.linalg.eigh(cov)  # [..., d, d], columns = eigenvectors
    d = x.shape[-1]
    if not reflections:  # a proper rotation: flip the last axis where det = −1
        sign = torch.sign(torch.linalg.det(vecs))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        vecs = torch.cat((vecs[..., :-1], vecs[..., -1:] * sign[..., None, None]), dim=-1)
    signs = [s for s in itertools.product((1.0, -1.0), repeat=d)
             if reflections or math.prod(s) > 0]
    s = torch.tensor(signs, dtype=torch.float64, device=x.device)  # [F, d]
    return centroid, vecs.unsqueeze(-3) * s[:, None, :]


@register(
    "rope_frame_averaged", hook="score", needs=(Positioned,), learnable=False,
    family="geometry", aliases=("fa_rope",),
    paper="Puny et al. 2022, Frame Averaging for Invariant and Equivariant Network Design (ICLR), "
          "PCA frames (§3.3); axial RoPE of Heo et al. 2024 / Su et al. 2021 in each frame",
    context=("head_dim", "num_axes"))


class FrameAveragedRoPE(SavesSettings, ContentScoreEncoding):
    """Axial RoPE averaged over the PCA frames of the point set: an E(d)-invariant rotary score.

    Axial RoPE (`rope_axial`) scores `q · R(x_k − x_q) k`: it depends on the displacement,
    so it is translation-invariant, but on the displacement's *components*, so a rotation of the
    point set changes it. Frame Averaging (Puny et al. 2022) makes a function invariant by
    averaging it over a small equivariant set of frames `F(X)`: here the `2^d` PCA frames
    of the keys' positions ([`pca_frames`][mmpe.encodings.rope_frame_averaged.pca_frames]: the covariance eigenvectors with every choice of
    signs; 8 in 3D). The score is

        `s(q, k) = (1/|F|) Σ_{O ∈ F(X)} q · R(Oᵀ(x_k − x_q)) k`

    with `R` the axial RoPE rotation of the displacement expressed in frame `O`. When the
    points are rotated or reflected by `Q` and translated, the frames become `Q·O` — the same
    set of frame coordinates — so `s` is unchanged, and a permutation of the points permutes
    it (given distinct covariance eigenvalues; a degenerate spectrum has no unique frame).

    Exact reduction: the axial score is a sum of per-axis terms `A_j cos(θ_j Δ_a) + B_j
    sin(θ_j Δ_a)`, each depending on one axis' sign only, so over the sign frames the odd
    (sine) parts cancel and `s = Σ_j A_j cos(θ_j (Vᵀ(x_k − x_q))_a)` — the same as averaging
    over the two frames `{V, −V}`, which is what is computed (4× fewer than the 8 frames in
    3D, identical numbers; the tests compare with the explicit 8-frame average). The proper
    `SE(d)` frame set gives the same average for `d ≥ 2`, so the score is
    reflection-invariant too.

    An average of scores is not one rotation of `q` and `k`, so this is a score-hook
    encoding: it adds `(s(q, k) − q·k) / √h_d` to the logits, which therefore become
    `s / √h_d` (use it without another rotary encoding; with one, `q`, `k` are the rotated
    ones). With `y^± = ±Vᵀ(x − t)`, `s = Q_F · K_F` for `Q_F = [R(y_q^+) q, R(y_q^−) q] / 2`
    and `K_F = [R(y_k^+) k, R(y_k^−) k]`; the FlexAttention mod computes `s − q·k` as one
    dot product of `3·h_d` scalar terms per score, the dense form (`mmpe.attention.fast_forms.geometry`) as one matrix
    product.

    The frame is that of the key positions (padded keys left out; a grid's prefix tokens, at
    0, count as points). On causal coordinates with several axes it therefore depends on all
    keys' positions (not contents); in 1D the frames are `±1` and the score is the
    sign-averaged RoPE `Σ_j A_j cos(θ_j Δ)`, independent of the other tokens.

    Args:
        head_dim: `h_d`, divisible by `2·A` for `A` axes.
        base: RoPE frequency base (per axis `θ_j = base^(−2j/(h_d/A))`, radians per
            coordinate unit: 10000 leaves most channels nearly constant over a molecule in Å;
            a base of 10–100 resolves ångströms).
        num_axes: if given, `head_dim` is checked at construction and the coordinates' axes
            at run time.

    Raises:
        ValueError: `head_dim` not divisible by `2·A`; `base <= 1`; coordinates with
            another number of axes than `num_axes`; q/k not matching the coordinates.
        TypeError: coordinates without positions (`Positioned`).
    """

    saved_settings = ("base",)

    def __init__(self, head_dim: int, base: float = 10000.0, num_axes: int | None = None) -> None:
        super().__init__()
        check_int("rope_frame_averaged", "head_dim", head_dim, minimum=2)
        if head_dim % 2:
            raise ValueError(f"rope_frame_averaged: head_dim must be even, got {head_dim}")
        if num_axes is not None:
            check_int("rope_frame_averaged", "num_axes", num_axes)
            if head_dim % (2 * num_axes):
                raise ValueError(f"rope_frame_averaged: head_dim={head_dim} must be divisible by "
                                 f"2·num_axes = {2 * num_axes}")
        base = check_finite_float("rope_frame_averaged", "base", base, low=1.0, low_open=True)
        self.head_dim, self.base = head_dim, float(base)
        self.num_axes = num_axes

    def frame_positions(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """The queries' and keys' positions in the PCA frame and its negation.

        The queries' and keys' positions in the PCA frame and its negation,
        `y^± = ±Vᵀ(x − t)`: `[b or 1, 2, n_q, A]` and `[b or 1, 2, n_k, A]` (float64)."""
        self.check_coords(coords)
        qpos, kpos = coords.query_positions, coords.key_positions
        axes = kpos.shape[-1]
        if self.num_axes is not None and axes != self.num_axes:
            raise ValueError(f"rope_frame_averaged: built for num_axes={self.num_axes}, the "
                             f"coordinates have {axes} axes")
        if self.head_dim % (2 * axes):
            raise ValueError(f"rope_frame_averaged: head_dim={self.head_dim} must be divisible "
                             f"by 2·axes = {2 * axes} for {axes}-axis positions")
        kpos = kpos.to(torch.float64)
        qpos = qpos.to(torch.float64)
        if kpos.dim() == 2:
            kpos = kpos.unsqueeze(0)
        if qpos.dim() == 2:
            qpos = qpos.unsqueeze(0)
        mask = coords.key_mask
        if mask is not None and mask.dim() == 1:
            mask = mask.unsqueeze(0)
        centroid, frames = pca_frames(kpos, mask)  # [B, d], [B, 2^d, d, d]; frame 0 = V
        both = torch.stack((frames[:, 0], -frames[:, 0]), dim=1)  # {V, −V}
        c = centroid[:, None, None, :]
        return (qpos.unsqueeze(1) - c) @ both, (kpos.unsqueeze(1) - c) @ both

    def _operands(self, ctx: AttentionCall) -> tuple[Tensor, Tensor]:
        """`Q_x = [R(y_q^+) q / 2, R(y_q^−) q / 2, −q]` and `K_x = [R(y_k^+) k, R(y_k^−) k, k]`
        (float32), so that `Q_x · K_x = s(q, k) − q·k`: `[b, n_h, n, 3·h_d]`."""
        require_qk("rope_frame_averaged", ctx)
        if ctx.q.shape[-1] != self.head_dim:
            raise ValueError(f"rope_frame_averaged: q and k must have h_d={self.head_dim}, "
                             f"got {ctx.q.shape[-1]}")
        yq, yk = self.frame_positions(ctx.coords)
        q, k = ctx.q.float(), ctx.k.float()
        frames = yq.shape[1]
        q_parts, k_parts = [], []
        for f in range(frames):
            for y, t, parts in ((yq[:, f], q, q_parts), (yk[:, f], k, k_parts)):
                phase = torch.remainder(axial_phase(y, self.head_dim, self.base), 2 * math.pi)
                parts.append(apply_rotary(t, phase.cos().float(), phase.sin().float()))
        qx = torch.cat([p / frames for p in q_parts] + [-q], dim=-1)
        kx = torch.cat([*k_parts, k], dim=-1)
        batch = ctx.batch
        return qx.expand(batch, *qx.shape[1:]), kx.expand(batch, *kx.shape[1:])

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        qx, kx = self._operands(ctx)
        scale, batch, channels = ctx.head_dim ** -0.5, ctx.batch, qx.shape[-1]

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = batch_index(b, batch)
            acc = qx[bb, h, q_idx, 0] * kx[bb, h, kv_idx, 0]
            for c in range(1, channels):  # scalar ops only: FlexAttention-compatible
                acc = acc + qx[bb, h, q_idx, c] * kx[bb, h, kv_idx, c]
            return score + scale * acc

        return mod

    def scores(self, q: Tensor, k: Tensor, coords: Coordinates) -> Tensor:
        """The frame-averaged RoPE score, for analysis.

        The frame-averaged RoPE score `s(q, k)` `[b, n_h, n_q, n_k]` (float32), for
        analysis: `q` `[b, n_h, n_q, h_d]`, `k` `[b, n_h, n_k, h_d]`."""
        ctx = AttentionCall(coords, q.shape[1], q.shape[-1], q.shape[0], q=q, k=k)
        self.check_call(ctx)
        qx, kx = self._operands(ctx)  # s − q·k = Q_F·K_F − q·k, one matrix product
        return qx.float() @ kx.float().transpose(-1, -2) + q.float() @ k.float().transpose(-1, -2)
