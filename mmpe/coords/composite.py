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

class Composite(Coordinates):
    """Qwen2-VL style `(t, h, w)` position ids for a sequence of text and vision segments.

    Args:
        segments: in token order, each an `int` (a text segment of that many tokens), a pair
            `(H, W)` (an image of `H × W` patches, `T = 1`), a triple `(T, H, W)` (a
            video), or a [`Grid`][mmpe.coords.grid.Grid] / [`Sequence`][mmpe.coords.sequence.Sequence]
            without prefix tokens / offset.
        temporal_scale: multiplies a video's temporal index before truncation to an int
            (Qwen2.5-VL's absolute-time ids: `tokens_per_second · second_per_grid_t`); 1 gives
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
    num_axes = 3
    causal: bool

    def __init__(
        self,
        segments: Seq[Segment | Coordinates],
        *,
        temporal_scale: float | Seq[float] = 1.0,
        causal: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(segments, Seq) or isinstance(segments, str) or not segments:
            raise ValueError(f"Composite: segments must be a non-empty list, got {segments!r}")
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self.causal = bool(causal)
        self.segments: list[tuple[str, tuple[int, ...]]] = [_parse(s, i) for i, s in enumerate(segments)]
        n_video = sum(kind == "video" for kind, _ in self.segments)
        scalar = isinstance(temporal_scale, int | float)
        scales = [temporal_scale] * max(n_video, 1) if scalar else list(temporal_scale)
        if (len(scales) != n_video and not scalar) or not all(
                isinstance(v, int | float) and 0 < v < math.inf for v in scales):
            raise ValueError(f"Composite: temporal_scale must be a finite float > 0 or a list of "
                             f"one per video segment ({n_video}); got {temporal_scale!r}")
        scales.reverse()
        ids, seg_ids, vision = [], [], []
        start = 0
        for n, (kind, shape) in enumerate(self.segments):
            if kind == "text":
                p = torch.arange(shape[0]) + start
                block = torch.stack((p, p, p), dim=-1)
            else:
                t, h, w = shape
                grid = torch.cartesian_prod(torch.arange(t), torch.arange(h), torch.arange(w))
                grid = grid.reshape(-1, 3)
                scale = scales.pop() if kind == "video" else 1.0
                tt = (grid[:, 0].double() * scale).long()
                block = torch.stack((tt, grid[:, 1], grid[:, 2]), dim=-1) + start
            ids.append(block)
            seg_ids.append(torch.full((block.shape[0],), n))
            vision.append(torch.full((block.shape[0],), kind != "text"))
            start = int(block.max()) + 1
        self._ids = torch.cat(ids).to(self._device)
        self.segment_ids = torch.cat(seg_ids).to(self._device)
        self.is_vision = torch.cat(vision).to(self._device)
        self._t = self._ids[:, 0].contiguous()
        self._t_lo, self._t_hi = self._t.amin(), self._t.amax()

    @property
    def num_queries(self) -> int:
        return self._ids.shape[0]




    @property
    def query_positions(self) -> Tensor:
        """`[n, 3]` int64 `(t, h, w)` position ids (Qwen2-VL)."""
        return self._ids


    @property
    def key_positions(self) -> Tensor:
        """`[n, 3]` int64, the queries' (self-attention)."""
        return self._ids

    @property
    def position_ids(self) -> Tensor:
        """`[3, n]`, the layout of HF transformers' `get_rope_index` (per example)."""
        return self._ids.T

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """`t_q − t_k` (int64): token distance on text, temporal offset across segments."""
        return self._t[q_idx] - self._t[kv_idx]

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """`|t_q − t_k|` (float32)."""
        return self.relation(q_idx, kv_idx, b).abs().to(torch.float32)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """How far keys lie from the query in temporal ids (as [`Sequence.extent`][mmpe.coords.sequence.Sequence.extent]), float32:
        the query's id when causal, else the distance to the farther end."""
        t = self._t[q_idx]
        if self.causal:
            return t.to(torch.float32)
        return torch.maximum(t - self._t_lo, self._t_hi - t).to(torch.float32)

    def mask_mod(self) -> MaskMod | None:
        return causal_mask if self.causal else None

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
