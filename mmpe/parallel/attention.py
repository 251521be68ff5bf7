"""Self-attention of a rank's queries to every rank's keys (all-gather context parallelism).

Each rank projects its own tokens, gathers K and V from the context group (differentiable:
the gradients of the gathered copies are summed back onto the owning rank), rotates its queries
and all keys at their **global** positions, and attends through the layer's own path
(`MultiHeadAttention.attend`: the SDPA plans on the CPU, the CUDA routes on a GPU), with the
score terms evaluated at global offsets by [`ShardedCoords`][mmpe.parallel.coords.ShardedCoords].
This is the all-gather design of Llama 3's context parallelism (Dubey et al. 2024, §3.3.2): one
gather of `K, V` (`2·n·n_kv·h_d` numbers) per layer, queries never leave their rank.

`MultiHeadAttention.forward` hands the call here when its coordinates are sharded; a model
needs no other change.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from mmpe._scratch import block_bytes
from mmpe.coords.sequence import Sequence
from mmpe.encodings.base import AttentionContext
from mmpe.parallel.collectives import gather_tokens
from mmpe.parallel.refusals import ContextParallelError, check_encodings
from mmpe.prepare import forward_scope


def sharded_attention(layer: Any, x: Tensor, coords: Any, cache: Any = None) -> Tensor:
    """`layer(x, coords)` for this rank's tokens `x` of a sharded sequence.

    Args:
        layer: a `MultiHeadAttention` (the same on every rank of the group).
        x: this rank's tokens `[b, n/W, d_model]`.
        coords: `shard(whole_sequence_coords, group, layout)`.
        cache: must be None (a key/value cache is per device, not sharded).

    Returns:
        `[b, n/W, d_model]`: the unsharded layer's output rows at `coords.index`.

    Raises:
        ContextParallelError: a cache, a local window, a refused encoding.
        ValueError: `x` not `[b, n/W, d_model]` (as the layer's own check).
    """
    if cache is not None:
        raise ContextParallelError("context parallel: cache must be None (cached decoding runs "
                                   "on one device; unshard the prompt's outputs first)")
    if getattr(layer, "window", None) is not None:
        raise ContextParallelError("context parallel: a local window (LocalWindow) is not "
                                   "supported on a shard: its mask reads query indices")
    check_encodings([*layer.rotary, *layer.scores, *([layer.kernel] if layer.kernel else [])],
                    coords)
    layer._check_x("x", x, layer.d_model, coords.num_queries, "queries")
    layer._check_batch(x, coords)
    q, k, v = layer._project(x)
    k = gather_tokens(k, 2, coords.group, coords.layout)
    v = gather_tokens(v, 2, coords.group, coords.layout)
    chunks = causal_chunks(layer, coords, x.shape[0])
    if chunks is not None:
        out = torch.cat([_attend_rows(layer, x, q, k, v, *chunk) for chunk in chunks], dim=2)
    else:
        out = _attend(layer, x, q, k, v, coords)
    return layer.proj(rearrange(out, "b h s d -> b s (h d)"))


def _attend(layer: Any, x: Tensor, q: Tensor, k: Tensor, v: Tensor, coords: Any) -> Tensor:
    """`[b, n_h, n_q, h_d]`: the layer's rotations and path on `coords` (queries `q`, keys
    `k`, `v` at the coordinates' global positions)."""
    with forward_scope(coords):
        coords.prepare()
        q, k = layer._rotate(q, k, coords)
        ctx = AttentionContext(coords, layer.num_heads, layer.head_dim, q.shape[0], x, q,
                               layer._expand_kv(k), layer._expand_kv(v))
        return layer.attend(ctx)


def _attend_rows(layer: Any, x: Tensor, q: Tensor, k: Tensor, v: Tensor, lo: int, hi: int,
                 stop: int, part: Any, checkpointed: bool) -> Tensor:
    """The rank's queries `lo … hi−1` on the keys before `stop`, on `part`'s coordinates;
    `checkpointed`: recomputed in the backward (the block's mask and bias are not kept)."""
    args = (x[:, lo:hi], q[:, :, lo:hi], k[:, :, :stop], v[:, :, :stop])
    if not checkpointed or not torch.is_grad_enabled():
        return _attend(layer, *args, part)
    return checkpoint(_attend, layer, *args, part, use_reentrant=False)


def causal_chunks(layer: Any, coords: Any,
                  batch: int) -> list[tuple[int, int, int, Any, bool]] | None:
    """On a plain causal `Sequence` (implicit positions, no documents or padding): per
    contiguous chunk of the rank's queries, `(lo, hi, stop, Sequence(hi − lo, offset=start,
    causal=True), blocked)` — the key/value cache's coordinates, queries `start … start+c−1`
    after the keys before them — with the keys cut at `stop = start + c` (later keys are
    masked): the paths see what a cached prefill step is, and offset terms keep their `O(n)`
    forms. A chunk whose `c × stop` mask would pass the block budget is cut into blocks of
    rows, each recomputed in the backward (`blocked`), so no rank holds an `n/W × n` mask.
    None elsewhere (the general `ShardedCoords` answers), and where a rotation depends on the
    total length (dynamic NTK, LongRoPE: the cut keys would change it)."""
    full = coords.full
    if type(full) is not Sequence or full.mask_key() is None:
        return None
    if any(getattr(r, "length_dependent", False) for r in layer.rotary):
        return None
    out, lo = [], 0
    for start, c in coords.spans:
        # A block's boolean mask rows (and SDPA's float copy) stay within the attention's block
        # budget (MMPE_ATTN_BLOCK_BYTES): rows of `start + c` keys, recomputed in the backward
        rows = max(1, block_bytes() // (8 * batch * (start + c)))
        blocked = rows < c
        for r in range(0, c, rows if blocked else c):
            size = min(rows if blocked else c, c - r)
            out.append((lo + r, lo + r + size, start + r + size,
                        Sequence(size, offset=start + r, causal=True, device=full.device),
                        blocked))
        lo += c
    return out
