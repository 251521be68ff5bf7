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
from mmpe.parallel.coords import ShardedCoords
from mmpe.prepare import forward_scope

#: registered encodings that cannot run on a shard, with the reason (registry name -> why)
REFUSED: dict[str, str] = {}


class ContextParallelError(ValueError):
    """An encoding or a layer setting that context parallelism cannot run (names it and why)."""


def check_encodings(layer: Any, coords: ShardedCoords) -> None:
    """Refuse, by name and with the reason, what cannot run on `coords` (see `REFUSED`).

    Raises:
        ContextParallelError: a refused encoding, one whose needs the shard does not offer,
            a cache, a local window.
    """
    for enc in (*layer.rotary, *layer.scores, *([layer.kernel] if layer.kernel else [])):
        name = getattr(enc, "registry_name", type(enc).__name__)
        if name in REFUSED:
            raise ContextParallelError(f"context parallel: {name} is refused: {REFUSED[name]}")
        try:
            enc.check_coords(coords)
        except (TypeError, ValueError) as err:
            raise ContextParallelError(f"context parallel: {name} cannot run on a shard: "
                                       f"{err}") from err


def sharded_attention(layer: Any, x: Tensor, coords: ShardedCoords, cache: Any = None) -> Tensor:
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
    check_encodings(layer, coords)
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


def unshard(x: Tensor, coords: ShardedCoords, dim: int = 1) -> Tensor:
    """Every rank's tokens of `x` in sequence order (differentiable; for evaluation, losses
    over the whole sequence, or checks).

    Shapes: `x [..., n/W, ...]` along `dim` -> `[..., n, ...]`.

    Raises:
        TypeError: `coords` not `ShardedCoords`.
        ValueError: `x` without `n/W` entries along `dim`.
    """
    if not isinstance(coords, ShardedCoords):
        raise TypeError(f"context parallel: unshard needs the ShardedCoords of shard(...), got "
                        f"{type(coords).__name__}")
    if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[dim] != coords.num_queries:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"context parallel: unshard: x must hold this rank's "
                         f"{coords.num_queries} tokens along dim {dim}, got {shape}")
    return gather_tokens(x, dim, coords.group, coords.layout)
