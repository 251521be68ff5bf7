"""Masks of the coordinates on the eager routes, and local attention windows.

Masks of the coordinates on the eager routes: the dense boolean mask (once per forward), which
masks are SDPA's own causal triangle, and a bias cast with masked pairs at ``-inf``; and the
local attention windows of per-layer schedules ([`LocalWindow`][mmpe.attention.masks.LocalWindow]:
sliding-window and chunked masks laid over the coordinates' own mask)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from mmpe.attention.memory import block_bytes
from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.views import prepare_views, view_class
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import AttentionCall
from mmpe.prepare import _MEMO, memoized

#: The kinds of [`LocalWindow`][mmpe.attention.masks.LocalWindow].
LOCAL_KINDS = ("sliding", "chunked")


def dense_mask_of(coords: Coordinates) -> Tensor | None:
    """The coordinates' dense boolean mask, built once per forward.

    `coords.dense_mask()` (bool `[b or 1, 1, n_q, n_k]`, or None without a mask), built once
    per forward (memoized on the coordinates)."""
    return memoized(coords, ("dense_mask",), coords.dense_mask)


def _only_causal(coords: Coordinates) -> bool:
    """On ``toeplitz`` coordinates: the mask is causality alone (no documents, no padding)."""
    return (getattr(coords, "causal", False) is True
            and getattr(coords, "document_ids", None) is None and coords.key_mask is None
            and getattr(coords, "local_window", None) is None)


def plain_causal(coords: Coordinates) -> bool:
    """Whether the mask is SDPA's plain causal triangle.

    A causal mask with nothing else: square, no cache, no documents, no padding, and every
    key's position its index (so the mask is SDPA's ``is_causal`` triangle)."""
    return (getattr(coords, "toeplitz", False) is True and _only_causal(coords)
            and coords.num_queries == coords.num_keys and coords.batch_size is None)


def kernel_mask_of(coords, dtype: torch.dtype) -> Tensor | None:
    """The coordinates' mask alone as the additive mask the fused kernels take.

    The coordinates' mask alone as the additive mask the fused kernels take (`0 / -inf` in
    `dtype`, aligned: [cast_bias][mmpe.attention.masks.cast_bias]), once per forward and dtype;
    None without a mask. SDPA would convert a boolean mask into a packed `[.., n_k]` tensor on
    every call, which CUDA's memory-efficient kernel then pads again unless `n_k % 8 == 0`."""
    mask = dense_mask_of(coords)
    if mask is None:
        return None
    return memoized(coords, ("kernel_mask", dtype),
                    lambda: cast_bias(None, dtype, mask, aligned=True))


def large_mask(ctx: AttentionCall) -> bool:
    """Whether the coordinates' dense boolean mask would exceed the block budget.

    Whether the coordinates' dense boolean mask (not SDPA's own causal one) would exceed
    [`block_bytes`][mmpe.attention.memory.block_bytes]: then SDPA runs block by block with each
    block's rows of the mask."""
    coords = ctx.coords
    if coords.mask_mod() is None or plain_causal(coords):
        return False
    return (coords.batch_size or 1) * coords.num_queries * coords.num_keys > block_bytes()


#: SDPA's memory-efficient CUDA kernel takes a mask as given only where every stride but the
#: last is a multiple of this many elements; otherwise torch 2.11's `preprocess_mask` pads a copy
#: of it on every call (`aligned_tensor<8>`, `pad_bias<8>` in aten's `attention.cpp`)
MASK_ALIGNMENT = 8


def aligned_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype,
                  device: torch.device | str) -> Tensor:
    """An uninitialised tensor laid out as the fused kernels want a mask.

    An uninitialised `shape` tensor that is the `[..., :n_k]` view of a contiguous buffer
    whose last dimension is `n_k` rounded up to `MASK_ALIGNMENT`: last-dimension stride 1 and
    every other stride a multiple of 8, the layout the fused kernels take without a copy (the
    padding columns are never read)."""
    n_k = shape[-1]
    width = -(-n_k // MASK_ALIGNMENT) * MASK_ALIGNMENT
    return torch.empty(*shape[:-1], width, dtype=dtype, device=device)[..., :n_k]


def cast_bias(bias: Tensor | None, dtype: torch.dtype, mask: Tensor | None,
              aligned: bool = False) -> Tensor:
    """The summed bias, masked pairs at ``-inf``, in the attention dtype.
    In bf16/fp16 the maximum over each row's allowed pairs is taken out first (softmax ignores it):
    a large bias (SwinV2's up to 16, FoX's long decays) then keeps its differences instead of losing
    |bias|·2⁻⁹ to rounding.

    With `aligned` (the dense route's SDPA call) the result is written once into an
    [aligned_empty][mmpe.attention.masks.aligned_empty] buffer, head-major whatever the layout
    of `bias` (a gather by offset comes out channel-last), so CUDA's memory-efficient kernel
    takes it without falling back (last-dimension stride 1) or padding a copy (strides
    multiples of 8); the numbers are those of the unaligned cast. `bias=None` then gives the
    mask alone as an additive `0 / -inf` mask (a boolean mask would be converted by SDPA into a
    packed, unaligned tensor on every call).

    Raises:
        ValueError: neither a bias nor a mask.
    """
    if bias is None:
        if mask is None or not aligned:
            raise ValueError("cast_bias: bias=None needs a mask and aligned=True")
        out = aligned_empty(mask.shape, dtype, mask.device)
        return out.zero_().masked_fill_(~mask, float("-inf"))
    if not aligned:
        if mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))
        if dtype == bias.dtype or not _low_precision(dtype):
            return bias.to(dtype)
        return _less_row_max(bias).to(dtype)
    shape = bias.shape if mask is None else torch.broadcast_shapes(bias.shape, mask.shape)
    out = aligned_empty(shape, dtype, bias.device)
    if dtype != bias.dtype and _low_precision(dtype):
        masked = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return out.copy_(_less_row_max(masked))  # (cast as it is written)
    # in place on the buffer's view: the one pass that writes the mask, no float32 copy
    out.copy_(bias)
    return out if mask is None else out.masked_fill_(~mask, float("-inf"))


def _low_precision(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and torch.finfo(dtype).bits <= 16


def _less_row_max(bias: Tensor) -> Tensor:
    """`bias` less the maximum over each row's finite entries (a row masked out keeps 0)."""
    top = bias.amax(dim=-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return bias - top


class LocalWindow(SavesSettings, nn.Module):
    """A local attention window laid over the coordinates' own mask (a layer's key set).

    Two kinds, in the conventions of HF transformers' `masking_utils` (positions `p`, in
    tokens, from the coordinates; `rel = p_q − p_k`):

    * `"sliding"` (Beltagy et al. 2020, Longformer; Mistral, Gemma 2/3, Cohere 2): on causal
      coordinates a query sees the `size` most recent keys, itself included,
      `0 ≤ rel < size` (HF `sliding_window_overlay`: `kv > q − size`); on bidirectional
      coordinates the keys within `distance(q, k) ≤ size` (HF
      `sliding_window_bidirectional_overlay`), which also serves grids and points (`Metric`).
    * `"chunked"` (Llama 4's `attention_chunk_size`): positions are cut into chunks of `size`
      and a query sees only keys of its own chunk, `p_q // size == p_k // size` (HF
      `chunked_overlay`; a left-padded batch counts positions from each example's first real
      token, as HF subtracts the left padding). Needs one integer position per token.

    The window is a function of positions, so it holds unchanged with a key/value cache
    (`Sequence(s, offset=cache.length)`): every key stays cached and the window masks those out
    of reach, so incremental decoding equals the full forward. Its `kind` and `size` are saved
    with the `state_dict` (`<prefix>settings.kind`, `settings.size`) and checked on load.

    Args:
        kind: `"sliding"` or `"chunked"`.
        size: the window or chunk length in tokens (`>= 1`).

    Raises:
        ValueError: an unknown `kind`, a `size` that is not an int `>= 1`; at use, coordinates
            without what the window reads (`relation` for a causal sliding window, `distance`
            for a bidirectional one, one integer position per token for chunks).
    """

    saved_settings = ("kind", "size")

    def __init__(self, kind: str, size: int) -> None:
        super().__init__()
        if kind not in LOCAL_KINDS:
            raise ValueError(f"LocalWindow: kind must be one of {LOCAL_KINDS}, got {kind!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"LocalWindow: size must be an int >= 1 (tokens), got {size!r}")
        self.kind, self.size = kind, size
        prepare_views(_Local)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, size={self.size}"

    def overlay(self, coords: Coordinates) -> MaskMod:
        """The window alone as a `mask_mod(b, h, q_idx, kv_idx) -> bool` on `coords`."""
        return window_overlay(self.kind, self.size, coords)

    def apply(self, coords: Coordinates) -> Coordinates:
        """`coords` with this window laid over its mask.

        `coords` with this window laid over its mask: a view of a subclass of the same class
        (every capability, position and tensor read from `coords`) whose `mask_mod` is the
        coordinates' mask AND the window. Inside a model's forward the views of one window share
        their memo (the dense mask or `BlockMask` is built once for all layers with this
        window).

        Raises:
            ValueError: coordinates that already carry a window, or that lack what the window
                reads (see the class docstring).
        """
        if isinstance(coords, _Local):
            raise ValueError(f"LocalWindow: the coordinates already carry the window "
                             f"{coords.local_window}; a layer has one window")
        self.overlay(coords)  # the error for coordinates the window cannot read, now
        return view_class(_Local, type(coords))(coords, self.kind, self.size)


def window_overlay(kind: str, size: int, coords: Coordinates) -> MaskMod:
    """The `mask_mod` of a local window of `kind` and `size` on `coords`.

    The `mask_mod` of a [`LocalWindow`][mmpe.attention.masks.LocalWindow] of `kind` and `size`
    on `coords` (without the coordinates' own mask)."""
    if kind == "sliding":
        if getattr(coords, "causal", False) is True:
            if not callable(getattr(coords, "relation", None)):
                raise ValueError(f"LocalWindow('sliding'): causal coordinates need relation(); "
                                 f"{type(coords).__name__} has none")
            return lambda b, h, q, k: coords.relation(q, k, b) < size
        if not callable(getattr(coords, "distance", None)):
            raise ValueError(f"LocalWindow('sliding'): bidirectional coordinates need "
                             f"distance() (Metric); {type(coords).__name__} has none")
        return lambda b, h, q, k: coords.distance(q, k, b) <= size
    if kind != "chunked":
        raise ValueError(f"LocalWindow: kind must be one of {LOCAL_KINDS}, got {kind!r}")
    qpos, kpos = (_positions_1d(coords, attr) for attr in ("query_positions", "key_positions"))

    def chunk(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        return _take(qpos, q, b) // size == _take(kpos, k, b) // size

    return chunk


def _positions_1d(coords: Coordinates, attr: str) -> Tensor:
    pos = getattr(coords, attr, None)
    if not isinstance(pos, Tensor) or pos.shape[-1] != 1 or pos.dtype.is_floating_point:
        raise ValueError(f"LocalWindow('chunked'): needs one integer position per token "
                         f"({attr} [n, 1] or [b, n, 1]); {type(coords).__name__} gives "
                         f"{tuple(pos.shape) if isinstance(pos, Tensor) else None}")
    return pos[..., 0]


def _take(pos: Tensor, idx: Tensor, b: Tensor) -> Tensor:
    return pos[idx] if pos.dim() == 1 else pos[b, idx]


class _Local:
    """Mixin of the window views made by `LocalWindow.apply`: an instance of a subclass of the
    coordinates' own class (so every capability check sees that class's members) that holds the
    coordinates and reads every attribute it lacks from them. Built with a plain `__init__`, so
    `torch.compile(fullgraph=True)` traces it (no copy of the object's `__dict__`)."""

    view_prefix = "Local"
    local_window: tuple[str, int]

    def __init__(self, base: Coordinates, kind: str, size: int) -> None:  # noqa: D107
        self._local_base = base
        self.local_window = (kind, size)
        if not torch.compiler.is_compiling():  # layers with one window share a memo (eager)
            memo = base.__dict__.get(_MEMO)
            if memo is not None:
                self.__dict__[_MEMO] = memo.setdefault(("local_window", kind, size), {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_local_base", "local_window", _MEMO):
            raise AttributeError(name)
        return getattr(self._local_base, name)

    def mask_mod(self) -> MaskMod | None:
        base = super().mask_mod()  # type: ignore[misc]
        kind, size = self.local_window
        local = window_overlay(kind, size, self)  # type: ignore[arg-type]
        if base is None:
            return local
        return lambda b, h, q, k: base(b, h, q, k) & local(b, h, q, k)

    def dense_mask(self, start: int = 0, stop: int | None = None) -> Tensor | None:
        # the base evaluation of mask_mod, whatever the coordinates' class does for its own
        return Coordinates.dense_mask(self, start, stop)  # type: ignore[arg-type]

    def mask_key(self) -> tuple | None:
        base = super().mask_key()  # type: ignore[misc]
        return None if base is None else (*base, "local_window", *self.local_window)

    def __repr__(self) -> str:
        return f"{super().__repr__()} + LocalWindow{self.local_window}"
