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

from einops import rearrange
from torch import Tensor

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
    with forward_scope(coords):
        coords.prepare()
        q, k = layer._rotate(q, k, coords)  # queries and keys at their global positions
        ctx = AttentionContext(coords, layer.num_heads, layer.head_dim, q.shape[0], x, q,
                               layer._expand_kv(k), layer._expand_kv(v))
        out = layer.attend(ctx)
    return layer.proj(rearrange(out, "b h s d -> b s (h d)"))
