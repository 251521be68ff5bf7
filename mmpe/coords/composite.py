"""Multimodal sequences: text segments interleaved with image and video segments (M-RoPE).

Qwen2-VL (Wang et al. 2024, §2.1 "Multimodal Rotary Position Embedding") gives every token a
three-component position id `(t, h, w)`:

* a text token at sequence position `p` gets `(p, p, p)` — 1D RoPE on all three sections;
* an image/video segment of `T × H × W` patches that starts after position `s − 1` gets
  `(s + t, s + h, s + w)` for its patch `(t, h, w)` (an image is `T = 1`);
* the next segment starts at `1 + max` of every id so far.

    >>> c = Composite([3, (2, 2), 2])
    >>> c.query_positions[:, 0].tolist()   # temporal component
    [0, 1, 2, 3, 3, 3, 3, 5, 6]
    >>> c.query_positions[3:7, 1:].tolist()  # (h, w) of the image patches
    [[3, 3], [3, 4], [4, 3], [4, 4]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod

Segment = int | tuple[int, ...]



def causal_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """The causal `mask_mod` over token order (a key at or before its query)."""
    return kv_idx <= q_idx


class _Ordered1D(Coordinates):
    """Distance, extent and causal mask of coordinates whose tokens carry one ordered 1-D key
    (the temporal id of M-RoPE and VideoRoPE, a V2PE position): `distance = |key_q − key_k|`
    (float32), the extent its bound from the query (the key minus the smallest when causal,
    else the distance to the farther end), the causal mask in token order."""

    causal: bool

    def _set_order(self, key: Tensor) -> None:
        self._key = key
        self._key_lo, self._key_hi = key.amin(), key.amax()

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """`|key_q − key_k|` (float32; M-RoPE, VideoRoPE: temporal ids, V2PE: text-token units)."""
        return (self._key[q_idx] - self._key[kv_idx]).abs().to(torch.float32)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The largest distance from the query to a key it may see (float32; as
        [`Sequence.extent`][mmpe.coords.sequence.Sequence.extent])."""
        k = self._key[q_idx]
        if self.causal:
            return (k - self._key_lo).to(torch.float32)
        return torch.maximum(k - self._key_lo, self._key_hi - k).to(torch.float32)

    def mask_mod(self) -> MaskMod | None:
        return causal_mask if self.causal else None


def segment_labels(segments: Seq[tuple[str, tuple[int, ...]]],
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """The segment ids and vision flags of parsed segments.

    `segment_ids` `[n]` (int64, the segment's index) and `is_vision` `[n]` (bool) of
    parsed segments (`(kind, shape)` pairs, `prod(shape)` tokens each)."""
    sizes = torch.tensor([math.prod(shape) for _, shape in segments])
    segment_ids = torch.repeat_interleave(torch.arange(len(segments)), sizes)
    is_vision = torch.tensor([kind != "text" for kind, _ in segments]).repeat_interleave(sizes)
    return segment_ids.to(device), is_vision.to(device)


def patch_indices(shape: tuple[int, int, int]) -> Tensor:
    """`[T·H·W, 3]` int64 `(t, h, w)` indices of a vision segment's patches, row-major."""
    t, h, w = shape
    return torch.cartesian_prod(torch.arange(t), torch.arange(h), torch.arange(w)).reshape(-1, 3)


class _SegmentIds(_Ordered1D):
    """Text and vision segments whose tokens carry `[n, 3]` `(t, h, w)` ids (`_ids`), ordered
    by the temporal id `t`: the checks and bookkeeping M-RoPE and VideoRoPE layouts share."""

    num_axes = 3

    def _parse_segments(self, name: str, segments: Seq[Segment | Coordinates], causal: bool,
                        device: torch.device | str | None) -> None:
        if not isinstance(segments, Seq) or isinstance(segments, str) or not segments:
            raise ValueError(f"{name}: segments must be a non-empty list, got {segments!r}")
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self.causal = bool(causal)
        self.segments: list[tuple[str, tuple[int, ...]]] = [_parse(s, i) for i, s in enumerate(segments)]

    def _set_ids(self, blocks: list[Tensor]) -> None:
        """Store the segments' `[n_i, 3]` id blocks, in token order."""
        self._ids = torch.cat(blocks).to(self._device)
        self.segment_ids, self.is_vision = segment_labels(self.segments, self._device)
        self._set_order(self._ids[:, 0].contiguous())

    @property
    def num_queries(self) -> int:
        return self._ids.shape[0]

    @property
    def query_positions(self) -> Tensor:
        """`[n, 3]` `(t, h, w)` position ids (int64; VideoRoPE: float64 for a fractional δ)."""
        return self._ids

    @property
    def key_positions(self) -> Tensor:
        """`[n, 3]`, the queries' (self-attention)."""
        return self._ids

    @property
    def position_ids(self) -> Tensor:
        """`[3, n]`, the layout of HF transformers' `get_rope_index` (per example)."""
        return self._ids.T


class Composite(_SegmentIds):
    """Qwen2-VL style `(t, h, w)` position ids for a sequence of text and vision segments.

    Args:
        segments: in token order, each an `int` (a text segment of that many tokens), a pair
            `(H, W)` (an image of `H × W` patches, `T = 1`), a triple `(T, H, W)` (a
            video), or a [`Grid`][mmpe.coords.grid.Grid] / [`Sequence`][mmpe.coords.sequence.Sequence]
            without prefix tokens / offset.
        temporal_scale: multiplies a video's temporal index before truncation to an int, in
            float32 as HF does (Qwen2.5-VL's absolute-time ids: `tokens_per_second ·
            second_per_grid_t`); 1 gives
            Qwen2-VL. A float applies to every video; a list gives one per video segment, in
            order ([`qwen2_5_vl_composite`][mmpe.coords.vlm.qwen2_5_vl_composite] builds it from seconds).
        causal: queries attend only to keys at or before them in token order (decoder).
        device: where the tensors live.

    Positions: `query_positions` / `key_positions` are `[n, 3]` int64 `(t, h, w)`.
    Pairs: `relation(q, k) = t_q − t_k` (temporal component, the text position on text
    tokens), `distance` its absolute value, `extent` the query's temporal id. Capabilities:
    `Positioned` (3 axes), `Directed`, `Metric`.
    `segment_ids` `[n]` and `is_vision` `[n]` tell the segments apart.

    Raises:
        ValueError: an empty `segments` list, a segment that is not a positive int or a
            2/3-tuple of positive ints, a Grid with prefix tokens or more than 3 axes,
            `temporal_scale <= 0`, a `temporal_scale` list whose length is not the number of
            video segments.
    """

    kind = "composite"

    def __init__(
        self,
        segments: Seq[Segment | Coordinates],
        *,
        temporal_scale: float | Seq[float] = 1.0,
        causal: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        self._parse_segments("Composite", segments, causal, device)
        n_video = sum(kind == "video" for kind, _ in self.segments)
        scalar = isinstance(temporal_scale, int | float)
        scales = [temporal_scale] * max(n_video, 1) if scalar else list(temporal_scale)
        if (len(scales) != n_video and not scalar) or not all(
                isinstance(v, int | float) and 0 < v < math.inf for v in scales):
            raise ValueError(f"Composite: temporal_scale must be a finite float > 0 or a list of "
                             f"one per video segment ({n_video}); got {temporal_scale!r}")
        scales.reverse()
        blocks = []
        start = 0
        for kind, shape in self.segments:
            if kind == "text":
                p = torch.arange(shape[0]) + start
                block = torch.stack((p, p, p), dim=-1)
            else:
                grid = patch_indices(shape)
                scale = scales.pop() if kind == "video" else 1.0
                # float32, as HF's get_vision_position_ids multiplies (int64 ids × a float32
                # interval): a float64 product truncates one lower where float32 rounds up
                tt = (grid[:, 0].float() * torch.tensor(scale, dtype=torch.float32)).long()
                block = torch.stack((tt, grid[:, 1], grid[:, 2]), dim=-1) + start
            blocks.append(block)
            start = int(block.max()) + 1
        self._set_ids(blocks)

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """`t_q − t_k` (int64): token distance on text, temporal offset across segments."""
        return self._key[q_idx] - self._key[kv_idx]

    def __repr__(self) -> str:
        segs = ", ".join(f"{k}{s}" for k, s in self.segments)
        return f"Composite([{segs}], causal={self.causal})"


def _parse(seg: Segment | Coordinates, i: int) -> tuple[str, tuple[int, ...]]:
    from mmpe.coords.grid import Grid
    from mmpe.coords.sequence import Sequence

    if isinstance(seg, Grid):
        if seg.prefix_tokens:
            raise ValueError(f"Composite: segment {i} is a Grid with prefix tokens; give them as text")
        seg = seg.shape
    elif isinstance(seg, Sequence):
        if seg.offset or seg.batch_size is not None:
            raise ValueError(f"Composite: segment {i} must be a plain Sequence (no offset, unbatched)")
        seg = seg.length
    if isinstance(seg, int) and not isinstance(seg, bool):
        if seg <= 0:
            raise ValueError(f"Composite: text segment {i} must have > 0 tokens, got {seg}")
        return "text", (seg,)
    if isinstance(seg, tuple | list) and len(seg) in (2, 3) and all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in seg):
        shape = tuple(seg)
        return ("image", (1, *shape)) if len(shape) == 2 else ("video", shape)
    raise ValueError(
        f"Composite: segment {i} must be an int (text tokens), (H, W) (image) or (T, H, W) "
        f"(video) of positive ints, or a Grid/Sequence; got {seg!r}"
    )
