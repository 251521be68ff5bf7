"""Position ids of vision-language sequences: Qwen2.5-VL absolute time, VideoRoPE, V2PE.

Three layouts of text + image/video tokens, each from its paper's reference code:

* [`qwen2_5_vl_composite`][mmpe.coords.vlm.qwen2_5_vl_composite] — Qwen2.5-VL's M-RoPE ids
  whose temporal component counts *time*: temporal patch `t` of a video sits at
  `s + ⌊t · tokens_per_second · second_per_grid_t⌋` (Bai et al. 2025, Qwen2.5-VL Technical
  Report, absolute time encoding; HF transformers' `Qwen2_5_VLModel.get_rope_index`).
* [`VideoRoPEComposite`][mmpe.coords.vlm.VideoRoPEComposite] — VideoRoPE's diagonal layout
  with adjustable temporal spacing δ (Wei et al. 2025, arXiv:2502.05173).
* [`V2PESequence`][mmpe.coords.vlm.V2PESequence] — V2PE's 1D positions in which a visual
  token advances the position by `δ < 1` and a text token by 1 (Ge et al. 2024).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.composite import (
    Composite,
    Segment,
    _Ordered1D,
    _parse,
    _SegmentIds,
    patch_indices,
    segment_labels,
)


def _positive(name: str, arg: str, value: object, *, at_most: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < math.inf) or (at_most is not None and value > at_most):
        bound = f" and <= {at_most}" if at_most is not None else ""
        raise ValueError(f"{name}: {arg} must be a finite number > 0{bound}, got {value!r}")
    return float(value)


def qwen2_5_vl_composite(
    segments: Seq[Segment | Coordinates],
    *,
    second_per_grid_ts: Seq[float],
    tokens_per_second: float,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Composite:
    """Qwen2.5-VL position ids, video temporal ids aligned to seconds.

    Qwen2.5-VL position ids: a [`Composite`][mmpe.coords.composite.Composite] whose video
    temporal ids are aligned to seconds.

    Temporal patch `t` of the `v`-th video starting at `s` gets the temporal id
    `s + ⌊t · tokens_per_second · second_per_grid_ts[v]⌋` (truncated after multiplying, as
    `get_vision_position_ids`; in float32, with the seconds rounded to float32 as HF's
    processor passes them, so the ids are HF's where float32 rounds up); height/width ids are `s + h`, `s + w`; images and text are
    as in Qwen2-VL. One temporal id is `1 / tokens_per_second` seconds, so two videos
    sampled at different frame rates share a time axis. Use with [`mrope`][mmpe.encodings.mrope.MRoPE]
    (Qwen2.5-VL's rotation is Qwen2-VL's, sections `(16, 24, 24)` at `h_d = 128`).

    Args:
        segments: as [`Composite`][mmpe.coords.composite.Composite] (text counts, `(H, W)` images,
            `(T, H, W)` videos, in LLM patches after the spatial merge).
        second_per_grid_ts: seconds spanned by one temporal patch, one per video segment in
            order (HF's `second_per_grid_ts` = `temporal_patch_size / fps`).
        tokens_per_second: temporal ids per second (the vision config's
            `tokens_per_second`; 2 in the released Qwen2.5-VL checkpoints).
        causal, device: as `Composite`.

    Text after a video starts at `1 + max` of every id so far (Qwen's reference and HF
    transformers ≤ 5.2). HF transformers ≥ 5.3 starts it at `s + max(H, W)` instead, which
    is the same unless a video's last temporal id `s + ⌊(T−1)·interval⌋` reaches
    `s + max(H, W)`; then HF's following text ids fall inside the video's time span.

    Raises:
        ValueError: `tokens_per_second` or a `second_per_grid_ts` entry not a finite number
            > 0, a `second_per_grid_ts` whose length is not the number of videos (naming it),
            and every error of `Composite`.
    """
    rate = _positive("qwen2_5_vl_composite", "tokens_per_second", tokens_per_second)
    if isinstance(second_per_grid_ts, Tensor):
        second_per_grid_ts = second_per_grid_ts.tolist()
    if isinstance(second_per_grid_ts, str) or not isinstance(second_per_grid_ts, Seq):
        raise ValueError("qwen2_5_vl_composite: second_per_grid_ts must be a list of seconds, one "
                         f"per video segment, got {second_per_grid_ts!r}")
    seconds = [_positive("qwen2_5_vl_composite", "second_per_grid_ts", s)
               for s in second_per_grid_ts]
    n_video = sum(_parse(s, i)[0] == "video" for i, s in enumerate(segments)) \
        if isinstance(segments, Seq) and not isinstance(segments, str) else None
    if n_video is not None and len(seconds) != n_video:
        raise ValueError(f"qwen2_5_vl_composite: second_per_grid_ts needs one entry per video "
                         f"segment ({n_video}), got {len(seconds)}")
    # the interval as HF forms it: tokens_per_second times the processor's float32 seconds,
    # rounded to float32 (so a 25 fps clip's 0.08 s gives HF's ids, not float64's)
    f32 = torch.float32
    intervals = [float(torch.tensor(rate, dtype=f32) * torch.tensor(s, dtype=f32)) for s in seconds]
    return Composite(segments, temporal_scale=intervals, causal=causal, device=device)


class VideoRoPEComposite(_SegmentIds):
    """VideoRoPE's diagonal layout with adjustable temporal spacing.

    VideoRoPE's diagonal layout with adjustable temporal spacing (Wei et al. 2025,
    "VideoRoPE: What Makes for Good Video Rotary Position Embedding?", arXiv:2502.05173:
    Diagonal Layout, Adjustable Temporal Spacing; reference code `get_t_scale_rope_index`).

    Every segment starts at `s = 1 + ` the largest temporal id so far (0 at the start).
    Text token `i` gets `(s + i, s + i, s + i)`. Patch `(t, h, w)` of a `T × H × W`
    video (an image is `T = 1`) gets

        t_id = s + δ·t,   h_id = t_id + h − ⌊(H−1)/2⌋,   w_id = t_id + w − ⌊(W−1)/2⌋,

    so each frame is centred on the diagonal `(t_id, t_id, t_id)` that text positions run
    along, and consecutive frames lie `δ` apart in all three ids. Use with
    [`videorope`][mmpe.encodings.videorope.VideoRoPE] (its low-frequency temporal allocation).

    Args:
        segments: as [`Composite`][mmpe.coords.composite.Composite].
        delta: temporal spacing `δ` > 0 (the paper's choice is δ = 2; δ = 1 is the
            diagonal layout alone).
        causal: queries attend only to keys at or before them in token order (decoder).
        device: where the tensors live.

    Positions: `query_positions` / `key_positions` `[n, 3]` `(t, h, w)`, int64 when `δ`
    is a whole number, else float64; `position_ids` `[3, n]`. Pairs: `distance = |t_q −
    t_k|` (float32, temporal ids), `extent` a bound on it. Capabilities: `Positioned` (3 axes),
    `Metric` — not `Directed`, whose table-indexing encodings need integer offsets and these
    ids may be fractional. `segment_ids` `[n]` and `is_vision` `[n]` tell the segments apart.

    Raises:
        ValueError: `delta` not a finite number > 0, and the segment errors of `Composite`.
    """

    kind = "videorope_composite"

    def __init__(
        self,
        segments: Seq[Segment | Coordinates],
        *,
        delta: float = 2.0,
        causal: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        delta = _positive("VideoRoPEComposite", "delta", delta)
        self._parse_segments("VideoRoPEComposite", segments, causal, device)
        self.delta = delta
        whole = float(delta).is_integer()
        dtype = torch.int64 if whole else torch.float64
        step: float = int(delta) if whole else delta
        blocks: list[Tensor] = []
        start: float = 0
        for kind, shape in self.segments:
            if kind == "text":
                p = torch.arange(shape[0], dtype=dtype) + start
                block = torch.stack((p, p, p), dim=-1)
            else:
                _, h, w = shape
                grid = patch_indices(shape)
                tt = grid[:, 0].to(dtype) * step + start
                hh = grid[:, 1] - (h - 1) // 2 + tt
                ww = grid[:, 2] - (w - 1) // 2 + tt
                block = torch.stack((tt, hh.to(dtype), ww.to(dtype)), dim=-1)
            blocks.append(block)
            start = block[:, 0].max().item() + 1
        self._set_ids(blocks)

    def __repr__(self) -> str:
        segs = ", ".join(f"{k}{s}" for k, s in self.segments)
        return f"VideoRoPEComposite([{segs}], delta={self.delta}, causal={self.causal})"


def v2pe_position_ids(segments: Seq[Segment | Coordinates], delta: float) -> Tensor:
    """V2PE positions of text and visual segments.

    V2PE positions `[n]` (float64) of text and visual segments (Ge et al. 2024, "V2PE:
    Improving Multimodal Long-Context Capability of Vision-Language Models with Variable
    Visual Position Encoding", arXiv:2412.09616; reference code
    `get_rope_pos_id(..., rope_pos_id_version='v2pe_fix')`).

    `p_i = p_{i−1} + 1` for a text token, `p_{i−1} + δ` for a visual token, with
    `p_{−1} = −1`; after a visual segment the position is rounded up, `⌈p⌉`, before the
    next text token adds 1 (the reference's `ceil` — no change when `N·δ` is whole).
    `δ = 1` gives `0, 1, 2, …`, a plain sequence.

    Args:
        segments: as [`Composite`][mmpe.coords.composite.Composite]: an int is that many text
            tokens; an `(H, W)` / `(T, H, W)` tuple (or a Grid) is `T·H·W` visual tokens.
        delta: visual increment `δ`, `0 < δ ≤ 1` (the paper samples it from
            `{1, 1/2, 1/4, …, 1/256}` in training).

    Raises:
        ValueError: `delta` outside `(0, 1]`, and the segment errors of `Composite`.
    """
    delta = _positive("v2pe_position_ids", "delta", delta, at_most=1.0)
    if not isinstance(segments, Seq) or isinstance(segments, str) or not segments:
        raise ValueError(f"v2pe_position_ids: segments must be a non-empty list, got {segments!r}")
    out: list[Tensor] = []
    last = -1.0
    for i, seg in enumerate(segments):
        kind, shape = _parse(seg, i)
        n = math.prod(shape)
        if kind == "text":
            p = last + 1 + torch.arange(n, dtype=torch.float64)
            last = float(p[-1])
        else:
            p = last + delta * torch.arange(1, n + 1, dtype=torch.float64)
            last = float(math.ceil(float(p[-1])))
        out.append(p)
    return torch.cat(out)


class V2PESequence(_Ordered1D):
    """A 1D sequence of text and visual tokens at V2PE positions.

    A 1D sequence of text and visual tokens at V2PE positions (see
    [`v2pe_position_ids`][mmpe.coords.vlm.v2pe_position_ids]): visual tokens advance the
    position by `δ < 1`, text tokens by 1 (units: text tokens).

    Use with 1D encodings that accept fractional positions (`rope`, its scalings,
    `sinusoidal`; V2PE is InternVL's 1D RoPE on these positions). A long image then spans
    `N·δ` positions instead of `N`, so long multimodal inputs stay inside the trained range.

    Args:
        segments: as [`v2pe_position_ids`][mmpe.coords.vlm.v2pe_position_ids].
        delta: visual increment `δ`, `0 < δ ≤ 1`.
        causal: queries attend only to keys at or before them in token order.
        device: where the tensors live.

    Positions: `query_positions` / `key_positions` `[n, 1]` float64. Pairs: `distance =
    |p_q − p_k|` (float32), `extent` a bound on it (`Metric`); `is_vision` `[n]` marks
    visual tokens, `segment_ids` `[n]` numbers the segments. Capabilities: `Positioned` (1 axis), `Metric`.

    Raises:
        ValueError: as `v2pe_position_ids`.
    """

    kind = "v2pe"
    num_axes = 1
    causal: bool

    def __init__(self, segments: Seq[Segment | Coordinates], *, delta: float,
                 causal: bool = False, device: torch.device | str | None = None) -> None:
        pos = v2pe_position_ids(segments, delta)
        self.delta = float(delta)
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self.causal = bool(causal)
        self.segment_ids, self.is_vision = segment_labels(
            [_parse(s, i) for i, s in enumerate(segments)], self._device)
        self._pos = pos.to(self._device)
        self._set_order(self._pos)

    @property
    def num_queries(self) -> int:
        return self._pos.shape[0]

    @property
    def query_positions(self) -> Tensor:
        """`[n, 1]` float64 V2PE positions."""
        return self._pos.unsqueeze(-1)

    @property
    def key_positions(self) -> Tensor:
        """`[n, 1]` float64, the queries' (self-attention)."""
        return self._pos.unsqueeze(-1)

    def __repr__(self) -> str:
        return f"V2PESequence(n={self.num_queries}, delta={self.delta}, causal={self.causal})"
