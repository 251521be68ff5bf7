"""Masks of the coordinates on the eager paths: the dense boolean mask (once per forward), which
masks are SDPA's own causal triangle, and a bias cast with masked pairs at ``-inf``."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.attention.memory import block_bytes
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import AttentionContext
from mmpe.prepare import memoized


def _dense_mask(coords: Coordinates) -> Tensor | None:
    return memoized(coords, ("dense_mask",), coords.dense_mask)


def _only_causal(coords: Coordinates) -> bool:
    """On ``toeplitz`` coordinates: the mask is causality alone (no documents, no padding)."""
    return (getattr(coords, "causal", False) is True
            and getattr(coords, "document_ids", None) is None and coords.key_mask is None)


def _plain_causal(coords: Coordinates) -> bool:
    """A causal mask with nothing else: square, no cache, no documents, no padding, and every
    key's position its index (so the mask is SDPA's ``is_causal`` triangle)."""
    return (getattr(coords, "toeplitz", False) is True and _only_causal(coords)
            and coords.num_queries == coords.num_keys and coords.batch_size is None)


def _large_mask(ctx: AttentionContext) -> bool:
    """Whether the coordinates' dense boolean mask (not SDPA's own causal one) would exceed
    :func:`block_bytes`: then SDPA runs block by block with each block's rows of the mask."""
    coords = ctx.coords
    if coords.mask_mod() is None or _plain_causal(coords):
        return False
    return (coords.batch_size or 1) * coords.num_queries * coords.num_keys > block_bytes()


def _cast_bias(bias: Tensor, dtype: torch.dtype, mask: Tensor | None) -> Tensor:
    """The summed bias, masked pairs at ``-inf``, in the attention dtype. In bf16/fp16 the
    maximum over each row's allowed pairs is taken out first (softmax ignores it): a large bias
    (SwinV2's up to 16, FoX's long decays) then keeps its differences instead of losing
    |bias|·2⁻⁹ to rounding."""
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    if dtype == bias.dtype or not dtype.is_floating_point or torch.finfo(dtype).bits > 16:
        return bias.to(dtype)
    top = bias.amax(dim=-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (bias - top).to(dtype)
