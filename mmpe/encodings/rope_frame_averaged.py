"""Frame-averaged axial RoPE: an E(d)- (or SE(d)-) invariant rotary score (Frame Averaging)."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._content import ContentScoreEncoding, batch_index, require_qk
from mmpe.encodings._precision import full_precision
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionContext, ScoreMod
from mmpe.encodings.rope import apply_rotary
from mmpe.encodings.rope_axial import axial_phase
from mmpe.registry import register


def pca_frames(positions: Tensor, mask: Tensor | None = None,
               reflections: bool = True) -> tuple[Tensor, Tensor]:
    """The PCA frames of a point set (Puny et al. 2022, §3.3 / Appendix "E(d)" and "SE(d)").

    With centroid ``t = mean_i x_i`` and covariance ``C = Σ_i (x_i − t)(x_i − t)ᵀ / n`` with
    eigenvectors ``v_1 … v_d`` (ascending eigenvalues), the frames are the orthogonal matrices
    ``O = [±v_1, …, ±v_d]``: all ``2^d`` sign choices for ``E(d)`` (rotations and reflections;
    ``reflections=True``), or the ``2^(d−1)`` with ``det O = +1`` for ``SE(d)``. Averaging a
    function over them makes it invariant to the group (given distinct eigenvalues; a point set
    with a repeated eigenvalue has no unique PCA frame, the measure-zero case the paper sets
    aside).

    Args:
        positions: ``[..., n, d]`` (computed in float64).
        mask: ``[..., n]`` bool, True at real points (padded points are left out); None = all.
        reflections: the ``E(d)`` frame set (True) or the ``SE(d)`` one (False).

    Returns:
        ``(t [..., d], frames [..., F, d, d])`` float64; column ``a`` of a frame is its axis ``a``.
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
    """Axial RoPE averaged over the PCA frames of the point set: an invariant rotary score.

    Axial RoPE (``rope_axial``) scores ``q · R(x_k − x_q) k``: it depends on the displacement,
    so it is translation-invariant, but on the displacement's *components*, so a rotation of the
    point set changes it. Frame Averaging (Puny et al. 2022) makes any function invariant by
    averaging it over a small equivariant set of frames ``F(X)``: here the PCA frames of the
    keys' positions (:func:`pca_frames`; 8 in 3D with reflections, 4 without). The score is

        ``s(q, k) = (1/|F|) Σ_{O ∈ F(X)} q · R(Oᵀ(x_k − x_q)) k``

    with ``R`` the axial RoPE rotation of the displacement expressed in frame ``O``. When the
    points are rotated (or reflected, with ``reflections``) by ``Q`` and translated, the frames
    become ``Q·O`` — the same set of frame coordinates — so ``s`` is unchanged, and a permutation
    of the points permutes it. An average of scores is not one rotation of ``q`` and ``k``, so
    this is a score-hook encoding: it adds ``(s(q, k) − q·k) / √h_d`` to the logits, which
    therefore become ``s / √h_d`` (use it without another rotary encoding; with one, ``q``, ``k``
    are the rotated ones). Equivalently ``s = Q_F · K_F`` with
    ``Q_F = [R(y_q^O) q]_O / |F|`` concatenated over the frames (``y^O = Oᵀ(x − t)``) and
    ``K_F = [R(y_k^O) k]_O``; the FlexAttention mod computes the difference as one dot product
    of ``(|F| + 1)·h_d`` scalar terms per score, the eager :meth:`bias` as one matrix product.

    The frames are those of the key positions (padded keys left out; a grid's prefix tokens,
    at 0, count as points). On causal coordinates with several axes they therefore depend on
    all keys' positions (not contents); in 1D the two frames are ``±1`` and the score is the
    sign-averaged RoPE ``Σ_j (q·k)_j cos(θ_j Δ)``, independent of the other tokens.

    Args:
        head_dim: ``h_d``, divisible by ``2·A`` for ``A`` axes.
        base: RoPE frequency base (per axis ``θ_j = base^(−2j/(h_d/A))``, radians per
            coordinate unit).
        reflections: average over the ``E(d)`` frames (invariant to reflections too) or only
            the proper ``SE(d)`` ones.
        num_axes: if given, ``head_dim`` is checked at construction and the coordinates' axes
            at run time.

    Raises:
        ValueError: ``head_dim`` not divisible by ``2·A``; ``base <= 1``; coordinates with
            another number of axes than ``num_axes``; q/k not matching the coordinates.
        TypeError: coordinates without positions (``Positioned``).
    """

    saved_settings = ("base", "reflections")

    def __init__(self, head_dim: int, base: float = 10000.0, reflections: bool = True,
                 num_axes: int | None = None) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"rope_frame_averaged: head_dim must be a positive even int, got {head_dim!r}")
        if num_axes is not None and (isinstance(num_axes, bool) or not isinstance(num_axes, int)
                                     or num_axes < 1 or head_dim % (2 * num_axes)):
            raise ValueError(f"rope_frame_averaged: head_dim={head_dim} must be divisible by "
                             f"2·num_axes (num_axes={num_axes!r})")
        if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 1):
            raise ValueError(f"rope_frame_averaged: base must be a finite float > 1, got {base!r}")
        if not isinstance(reflections, bool):
            raise TypeError(f"rope_frame_averaged: reflections must be a bool, got {reflections!r}")
        self.head_dim, self.base, self.reflections = head_dim, float(base), reflections
        self.num_axes = num_axes

    def frame_positions(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """The queries' and keys' positions in every frame, ``y = Oᵀ(x − t)``:
        ``[b or 1, F, n_q, A]`` and ``[b or 1, F, n_k, A]`` (float64)."""
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
        centroid, frames = pca_frames(kpos, mask, self.reflections)  # [B, d], [B, F, d, d]
        c = centroid[:, None, None, :]
        yq = (qpos.unsqueeze(1) - c) @ frames  # [B, F, n_q, d]
        yk = (kpos.unsqueeze(1) - c) @ frames
        return yq, yk

    def _operands(self, ctx: AttentionContext) -> tuple[Tensor, Tensor]:
        """``Q_x = [R(y_q^O) q / |F| …, −q]`` and ``K_x = [R(y_k^O) k …, k]`` (float32), so
        that ``Q_x · K_x = s(q, k) − q·k``: ``[b, n_h, n, (|F|+1)·h_d]``."""
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

    def score_mod(self, ctx: AttentionContext) -> ScoreMod:
        self.check_context(ctx)
        qx, kx = self._operands(ctx)
        scale, batch, channels = ctx.head_dim ** -0.5, ctx.batch, qx.shape[-1]

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = batch_index(b, batch)
            acc = qx[bb, h, q_idx, 0] * kx[bb, h, kv_idx, 0]
            for c in range(1, channels):  # scalar ops only: FlexAttention-compatible
                acc = acc + qx[bb, h, q_idx, c] * kx[bb, h, kv_idx, c]
            return score + scale * acc

        return mod

    def bias(self, ctx: AttentionContext) -> Tensor:
        """``(s(q, k) − q·k) / √h_d`` on every pair, ``[b, n_h, n_q, n_k]`` (eager path)."""
        return self.bias_rows(ctx, 0, ctx.coords.num_queries)

    def bias_rows(self, ctx: AttentionContext, start: int, stop: int) -> Tensor:
        """The term of queries ``start … stop−1``, ``[b, n_h, stop−start, n_k]``."""
        self.check_context(ctx)
        qx, kx = self._operands(ctx)
        with full_precision(qx.device):  # a float32 difference of two scores, also under autocast
            return (qx[:, :, start:stop] @ kx.transpose(-1, -2)) * ctx.head_dim ** -0.5

    def scores(self, q: Tensor, k: Tensor, coords: Coordinates) -> Tensor:
        """The frame-averaged RoPE score ``s(q, k)`` ``[b, n_h, n_q, n_k]`` (float32), for
        analysis: ``q`` ``[b, n_h, n_q, h_d]``, ``k`` ``[b, n_h, n_k, h_d]``."""
        ctx = AttentionContext(coords, q.shape[1], q.shape[-1], q.shape[0], q=q, k=k)
        return self.bias(ctx) * q.shape[-1] ** 0.5 + q.float() @ k.float().transpose(-1, -2)
