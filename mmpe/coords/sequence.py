"""1D token sequences: text, and any data read as a line of tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod


class Sequence(Coordinates):
    """Positions ``0 … n-1`` of a 1D token sequence (units: tokens).

    Args:
        length: number of query tokens ``n`` (> 0). May be omitted when ``position_ids``
            or ``document_ids`` give it.
        offset: tokens already in the key/value cache (cached decoding). Queries sit at
            ``offset … offset+n-1`` and keys at ``0 … offset+n-1``.
        position_ids: explicit integer positions, ``[n]`` or ``[b, n]`` (queries and keys alike).
        causal: queries attend only to keys at the same or earlier positions.
        document_ids: integer document id per token, ``[n]`` or ``[b, n]``, for packed
            sequences: tokens attend only within their document, and positions restart at
            0 in every document (unless ``position_ids`` are given).
        device: where the position tensors live.

    Capabilities: ``Positioned`` (one axis, tokens), ``Directed`` (``relation(q, k) = pos_q −
    pos_k``, positive when the key lies in the past; ``causal``) and ``Metric`` (``distance =
    |relation|``, ``extent`` = the query's position).

    Raises:
        ValueError: non-positive ``length``, negative ``offset``, ``position_ids`` or
            ``document_ids`` of the wrong rank, dtype or length, negative positions, or
            ``offset`` combined with explicit ids.
    """

    kind = "sequence"
    num_axes = 1
    causal: bool

    def __init__(
        self,
        length: int | None = None,
        *,
        offset: int = 0,
        position_ids: Tensor | None = None,
        causal: bool = False,
        document_ids: Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        length = _resolve_length(length, position_ids, document_ids)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"Sequence: offset must be an int >= 0, got {offset!r}")
        if offset and (position_ids is not None or document_ids is not None):
            raise ValueError("Sequence: offset cannot be combined with position_ids or document_ids")
        self.length, self.offset, self.causal = length, offset, bool(causal)
        self.document_ids = _check_ids("document_ids", document_ids, length)
        ids = _check_ids("position_ids", position_ids, length)
        if ids is not None and bool((ids < 0).any()):
            raise ValueError("Sequence: position_ids must be >= 0")
        if ids is None and self.document_ids is not None:
            ids = _restart_per_document(self.document_ids)
        if ids is None:
            ids = torch.arange(offset + length, device=device)
        else:
            ids = ids.to(device) if device is not None else ids
        # Keys cover the cache plus the new tokens; queries are the last `length` of them.
        self._key_ids = ids
        self._query_ids = ids[..., offset:]
        # The key span bounds every distance of a bidirectional query (extent, no host sync).
        self._key_lo, self._key_hi = ids.amin(dim=-1), ids.amax(dim=-1)

    @property
    def num_queries(self) -> int:
        return self.length

    @property
    def num_keys(self) -> int:
        return self.offset + self.length

    @property
    def query_positions(self) -> Tensor:
        """Query positions ``[n, 1]`` or ``[b, n, 1]`` (int64, tokens)."""
        return self._query_ids.unsqueeze(-1)

    @property
    def key_positions(self) -> Tensor:
        """Key positions ``[n_k, 1]`` or ``[b, n_k, 1]`` (int64, tokens)."""
        return self._key_ids.unsqueeze(-1)

    @property
    def max_position(self) -> int:
        """Largest position of any token (tokens)."""
        return int(self._key_ids.max())

    def query_index(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Position (tokens) of query ``q_idx``; ``b`` selects the example when ids are batched."""
        return _gather(self._query_ids, q_idx, b)

    def key_index(self, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Position (tokens) of key ``kv_idx``."""
        return _gather(self._key_ids, kv_idx, b)

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Signed offset ``pos_q − pos_k`` in tokens (int64)."""
        return self.query_index(q_idx, b) - self.key_index(kv_idx, b)

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """``|pos_q − pos_k|`` in tokens (float32)."""
        return self.relation(q_idx, kv_idx, b).abs().to(torch.float32)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """How far keys may lie from the query (tokens, float32): FIRE's normaliser ``ψ(max(L, i))``.

        Causal: the query's position ``i`` (its farthest key is position 0). Bidirectional: the
        distance to the farther end of the keys, ``max(i − first, last − i)``.
        """
        pos = self.query_index(q_idx, b)
        if self.causal:
            return pos.to(torch.float32)
        lo, hi = (self._key_lo, self._key_hi) if self._key_lo.dim() == 0 else \
            (self._key_lo[b], self._key_hi[b])
        return torch.maximum(pos - lo, hi - pos).to(torch.float32)

    def mask_mod(self) -> MaskMod | None:
        docs, causal = self.document_ids, self.causal
        if docs is None and not causal:
            return None

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            allowed = torch.ones((), dtype=torch.bool, device=q_idx.device)
            if causal:
                allowed = allowed & (self.relation(q_idx, kv_idx, b) >= 0)
            if docs is not None:
                allowed = allowed & (_gather(docs, q_idx, b) == _gather(docs, kv_idx, b))
            return allowed

        return mask

    def __repr__(self) -> str:
        return (f"Sequence(length={self.length}, offset={self.offset}, causal={self.causal}, "
                f"batched={self.batch_size is not None})")


def _gather(ids: Tensor, idx: Tensor, b: Tensor | None) -> Tensor:
    if ids.dim() == 1:
        return ids[idx]
    if b is None:
        raise ValueError("Sequence: batched position ids need the batch index b")
    return ids[b, idx]


def _resolve_length(length: int | None, *ids: Tensor | None) -> int:
    if length is None:
        given = [t for t in ids if t is not None]
        if not given:
            raise ValueError("Sequence: give length, position_ids or document_ids")
        length = given[0].shape[-1]
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise ValueError(f"Sequence: length must be a positive int (tokens), got {length!r}")
    return length


def _check_ids(name: str, ids: Tensor | None, length: int) -> Tensor | None:
    if ids is None:
        return None
    if not isinstance(ids, Tensor):
        raise TypeError(f"Sequence: {name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise ValueError(f"Sequence: {name} must hold integers, got dtype {ids.dtype}")
    if ids.dim() not in (1, 2) or ids.shape[-1] != length:
        raise ValueError(
            f"Sequence: {name} must have shape [n] or [b, n] with n={length}, got {tuple(ids.shape)}"
        )
    return ids.long()


def _restart_per_document(docs: Tensor) -> Tensor:
    """Position of each token inside its document: 0 at every document start."""
    n = docs.shape[-1]
    idx = torch.arange(n, device=docs.device).expand_as(docs)
    starts = torch.ones_like(docs, dtype=torch.bool)
    starts[..., 1:] = docs[..., 1:] != docs[..., :-1]
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - start_idx
