"""1D token sequences: text, and any data read as a line of tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod
from mmpe.validation import check_bool


class Sequence(Coordinates):
    """Positions `0 … n-1` of a 1D token sequence (units: tokens).

    Args:
        length: number of query tokens `n` (> 0). May be omitted when `position_ids`
            or `document_ids` give it.
        offset: tokens already in the key/value cache (cached decoding). Queries sit at
            `offset … offset+n-1` and keys at `0 … offset+n-1`.
        position_ids: explicit integer positions of every key, `[n_k]` or `[b, n_k]` with
            `n_k = offset + n` (the queries are the last `n`).
        causal: queries attend only to keys at the same or earlier positions.
        document_ids: integer document id per key, `[n_k]` or `[b, n_k]`, for packed
            sequences: tokens attend only within their document, and positions restart at
            0 in every document (unless `position_ids` are given).
        padding_mask: `[n_k]` or `[b, n_k]` bool, True at real tokens (a left-padded batch
            for generation): padded keys are masked (a padded query still sees itself, so its
            row stays finite), and unless `position_ids` are given the real tokens of each
            example are numbered `0, 1, …` from their first one (HF's convention).
        device: where the position tensors live.

    Capabilities: `Positioned` (one axis, tokens), `Directed` (``relation(q, k) = pos_q −
    pos_k`, positive when the key lies in the past; `causal`) and `Metric` (`distance =
    |relation|`, `extent`` = the query's position).

    Raises:
        ValueError: non-positive `length`, negative `offset`, `position_ids`,
            `document_ids` or `padding_mask` of the wrong rank, dtype or length (naming the
            expected shape), negative positions, batch sizes that differ between them.
    """

    kind = "sequence"
    supports_cache = True  # Sequence(s, offset=cache.length, causal=True)
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
        padding_mask: Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"Sequence: offset must be an int >= 0, got {offset!r}")
        length = _resolve_length(length, offset, position_ids, document_ids, padding_mask)
        self.length, self.offset = length, offset
        self.causal = check_bool("Sequence", "causal", causal)
        n_k = offset + length
        self.document_ids = _check_ids("document_ids", document_ids, n_k)
        self.padding_mask = _check_mask(padding_mask, n_k)
        ids = _check_ids("position_ids", position_ids, n_k)
        #: whether the positions were given (`position_ids`), not implicit
        self.explicit_positions = ids is not None
        _check_batches(self.document_ids, self.padding_mask, ids)
        # Implicit positions (or restarts per document, which the mask confines pairs to)
        # differ from the key index by one shift; padding renumbers from the first real token.
        self._toeplitz = ids is None and (self.document_ids is not None or self.padding_mask is None)
        if ids is not None and bool((ids < 0).any()):
            raise ValueError("Sequence: position_ids must be >= 0")
        if ids is None and self.document_ids is not None:
            ids = _restart_per_document(self.document_ids)
        if ids is None and self.padding_mask is not None:
            ids = (self.padding_mask.long().cumsum(-1) - 1).clamp(min=0)
        self._max_position = None
        if ids is None:
            ids = torch.arange(offset + length, device=device)
            self._max_position = offset + length - 1
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
        """Query positions `[n, 1]` or `[b, n, 1]` (int64, tokens)."""
        return self._query_ids.unsqueeze(-1)

    @property
    def key_positions(self) -> Tensor:
        """Key positions `[n_k, 1]` or `[b, n_k, 1]` (int64, tokens)."""
        return self._key_ids.unsqueeze(-1)

    @property
    def max_position(self) -> int:
        """Largest position of any token.

        Largest position of any token (tokens): known without a device read for implicit
        positions, read once and remembered for explicit `position_ids`/`document_ids`."""
        if self._max_position is None:
            self._max_position = int(self._key_ids.max())
        return self._max_position

    @property
    def toeplitz(self) -> bool:
        """Whether the relation is the Toeplitz one of token indices on every allowed pair.

        Whether every pair the mask allows has `relation(q_idx, kv_idx) = q_idx + n_k − n_q
        − kv_idx` (and `distance` its absolute value): the positions are the implicit `0 …
        n_k−1`, or restart at every document (the mask keeps pairs inside one document, where
        positions and indices differ by the same shift). False with explicit `position_ids`,
        or with a `padding_mask` and no documents (positions then count real tokens only).

        A term that depends on the relation alone is then constant along the diagonals of the
        `n_q × n_k` score matrix (a Toeplitz matrix): the eager attention path evaluates it on
        the `n_q + n_k − 1` offsets instead of on every pair.
        """
        return self._toeplitz

    def query_index(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Position (tokens) of query `q_idx`; `b` selects the example when ids are batched."""
        return _gather(self._query_ids, q_idx, b)

    def key_index(self, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Position (tokens) of key `kv_idx`."""
        return _gather(self._key_ids, kv_idx, b)

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Signed offset `pos_q − pos_k` in tokens (int64)."""
        return self.query_index(q_idx, b) - self.key_index(kv_idx, b)

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """`|pos_q − pos_k|` in tokens (float32)."""
        return self.relation(q_idx, kv_idx, b).abs().to(torch.float32)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """How far keys may lie from the query (tokens, float32): FIRE's normaliser `ψ(max(L, i))`.

        Causal: the query's position `i` (its farthest key is position 0). Bidirectional: the
        distance to the farther end of the keys, `max(i − first, last − i)`.
        """
        pos = self.query_index(q_idx, b)
        if self.causal:
            return pos.to(torch.float32)
        lo, hi = (self._key_lo, self._key_hi) if self._key_lo.dim() == 0 else \
            (self._key_lo[b], self._key_hi[b])
        return torch.maximum(pos - lo, hi - pos).to(torch.float32)

    @property
    def batch_size(self) -> int | None:
        """`b` when positions, documents or padding differ per example, else None."""
        for t in (self._key_ids, self.document_ids, self.padding_mask):
            if t is not None and t.dim() == 2:
                return t.shape[0]
        return None

    @property
    def key_mask(self) -> Tensor | None:
        """`[n_k]` or `[b, n_k]` bool, True at real (unpadded) keys, or None."""
        return self.padding_mask

    def mask_mod(self) -> MaskMod | None:
        docs, causal, pad, offset = self.document_ids, self.causal, self.padding_mask, self.offset
        if docs is None and not causal and pad is None:
            return None

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            allowed = torch.ones((), dtype=torch.bool, device=q_idx.device)
            slot = q_idx + offset  # the query's own key slot
            if causal:
                allowed = allowed & (self.relation(q_idx, kv_idx, b) >= 0)
            if docs is not None:
                allowed = allowed & (_gather(docs, slot, b) == _gather(docs, kv_idx, b))
            if pad is not None:
                allowed = allowed & (_gather(pad, kv_idx, b) | (kv_idx == slot))
            return allowed

        return mask

    def mask_key(self) -> tuple | None:
        """The mask key of a plain causal sequence, or None.

        `("sequence-causal", n_q, n_k)` for a causal sequence with implicit positions and no
        documents or padding (its mask is `q + offset ≥ k`); None otherwise (the mask then
        reads position, document or padding tensors)."""
        plain = self.document_ids is None and self.padding_mask is None
        if self.causal and plain and self._toeplitz:
            return ("sequence-causal", self.length, self.offset + self.length)
        return None

    def __repr__(self) -> str:
        return (f"Sequence(length={self.length}, offset={self.offset}, causal={self.causal}, "
                f"batched={self.batch_size is not None})")


def _gather(ids: Tensor, idx: Tensor, b: Tensor | None) -> Tensor:
    if ids.dim() == 1:
        return ids[idx]
    if b is None:
        raise ValueError("Sequence: batched position ids need the batch index b")
    return ids[b, idx]


def _resolve_length(length: int | None, offset: int, *ids: Tensor | None) -> int:
    if length is None:
        given = [t for t in ids if isinstance(t, Tensor) and t.dim() > 0]
        if not given:
            raise ValueError("Sequence: give length, position_ids, document_ids or padding_mask")
        length = given[0].shape[-1] - offset
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
            f"Sequence: {name} must have shape [n_k] or [b, n_k] with n_k={length} (offset + "
            f"length), got {tuple(ids.shape)}"
        )
    return ids.long()


def _check_mask(mask: Tensor | None, n_k: int) -> Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"Sequence: padding_mask must be a bool tensor, got {kind}")
    if mask.dim() not in (1, 2) or mask.shape[-1] != n_k:
        raise ValueError(f"Sequence: padding_mask must have shape [n_k] or [b, n_k] with "
                         f"n_k={n_k} (offset + length), got {tuple(mask.shape)}")
    return mask


def _check_batches(*tensors: Tensor | None) -> None:
    batches = {t.shape[0] for t in tensors if t is not None and t.dim() == 2}
    if len(batches) > 1:
        raise ValueError(f"Sequence: position_ids, document_ids and padding_mask must share the "
                         f"batch size, got {sorted(batches)}")


def _restart_per_document(docs: Tensor) -> Tensor:
    """Position of each token inside its document: 0 at every document start."""
    n = docs.shape[-1]
    idx = torch.arange(n, device=docs.device).expand_as(docs)
    starts = torch.ones_like(docs, dtype=torch.bool)
    starts[..., 1:] = docs[..., 1:] != docs[..., :-1]
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - start_idx
