"""The attention modules: self-attention and cross-attention.

The attention modules: [MultiHeadAttention][mmpe.attention.MultiHeadAttention] (self-attention
with grouped-query heads and an optional [KVCache][mmpe.cache.KVCache]) and
[CrossAttention][mmpe.attention.CrossAttention] (from one token set to another, each with its
coordinates). They sort the encodings by hook, project and rotate, and hand the call to the route
that [mmpe.attention.dispatch][] chooses."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import replace

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mmpe.attention import route as _route
from mmpe.attention.dispatch import _softmax_scale, run_dense, run_flex, run_math, run_sdpa
from mmpe.attention.fla import run_fla
from mmpe.attention.fold import run_fold
from mmpe.attention.masks import LocalWindow
from mmpe.cache import KVCache
from mmpe.coords.base import Coordinates, RowBlock
from mmpe.coords.cross import Cross
from mmpe.encodings.base import (
    AttentionCall,
    Encoding,
    KernelEncoding,
    RotaryEncoding,
    ScoreEncoding,
)
from mmpe.prepare import forward_scope
from mmpe.rebuild import records_arguments, reset_in_place
from mmpe.validation import check_attention_work, check_positive_int

ROUTE_CHOICES = _route.ROUTE_CHOICES



def _check_positive(name: str, value: object) -> int:
    check_positive_int("attention", name, value)
    return int(value)



def _autocast(x: Tensor) -> bool:
    """Whether autocast is on for ``x``'s device (then x and the weights may differ in dtype)."""
    try:
        return torch.is_autocast_enabled(x.device.type)
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()



def _head_dim(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """``h_d``: given, or ``d_model // num_heads`` (which must divide)."""
    _check_positive("d_model", d_model)
    _check_positive("num_heads", num_heads)
    if head_dim is None:
        if d_model % num_heads:
            raise ValueError(
                f"attention: d_model={d_model} must be divisible by num_heads={num_heads}"
            )
        return d_model // num_heads
    return _check_positive("head_dim", head_dim)



class _Attention(nn.Module):
    """What self- and cross-attention share: encodings by hook, the route choice, the routes."""

    def _setup(self, num_heads: int, num_kv_heads: int | None, head_dim: int,
               encodings: Seq[Encoding], route: str, dense_bias_bytes: int | None,
               shared: Seq[Encoding] = ()) -> None:
        _check_positive("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _check_positive("num_kv_heads",
                                                                              num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"attention: num_heads={num_heads} must be a multiple of "
                             f"num_kv_heads={num_kv_heads}")
        if route not in ROUTE_CHOICES:
            raise ValueError(f"attention: route must be one of {ROUTE_CHOICES}, got {route!r}")
        if isinstance(encodings, (str, Encoding)):
            raise TypeError("attention: encodings must be a list of built encodings, got a "
                            f"single {type(encodings).__name__}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.route = route
        _route.dense_budget(dense_bias_bytes)  # refuse a bad budget at construction
        self.dense_bias_bytes = dense_bias_bytes
        rotary, scores, kernels = _split_by_hook(encodings)
        if len(kernels) > 1:
            raise ValueError(f"attention: at most one kernel encoding, got {len(kernels)}")
        kernel = kernels[0] if kernels else None
        held = _held_elsewhere(encodings, shared)
        if not held:
            self.rotary, self.scores, self.kernel = rotary, scores, kernel
            return
        # The model's: read here, registered there, so that its state dict and an FSDP2 unit
        # per block hold them once (fully_shard(block) would shard them with the first block
        # and meet them again, already sharded, in the second).
        self.own_encodings = nn.ModuleList(e for e in encodings if id(e) not in held)
        for name, value in (("rotary", rotary), ("scores", scores), ("kernel", kernel)):
            object.__setattr__(self, name, value)

    def reset_parameters(self) -> None:
        """Initialise every parameter and buffer again, the encodings' included, as the
        constructor did (a model built on `meta` and moved with `to_empty`): see
        [`mmpe.rebuild`][mmpe.rebuild]. With the RNG state of a normal build it draws the same
        numbers.

        Raises:
            ValueError: the layer is still on `meta`.
        """
        reset_in_place(self)

    def all_encodings(self) -> list[Encoding]:
        """The layer's rotary, score and kernel encodings, in that order."""
        return [*self.rotary, *self.scores, *([self.kernel] if self.kernel is not None else [])]

    def _projection_weight(self) -> Tensor | None:
        """The input projection's weight (encodings may keep float32 tables in a bf16 model)."""
        for name in ("qkv", "q_proj"):
            layer = getattr(self, name, None)
            if isinstance(layer, nn.Linear):
                return layer.weight
        return next((p for p in self.parameters() if p.is_floating_point()), None)

    def _check_x(self, arg: str, x: Tensor, width: int, tokens: int, what: str) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"attention: {arg} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"attention: {arg} must be a floating-point tensor, got {x.dtype}")
        weight = self._projection_weight()
        if weight is not None and x.dtype != weight.dtype and not _autocast(x):
            raise TypeError(f"attention: {arg} is {x.dtype} but the layer's weights are "
                            f"{weight.dtype}; cast one to the other (x.to(dtype) or "
                            "module.to(dtype)) or run under torch.autocast")
        if x.dim() != 3 or x.shape[-1] != width:
            raise ValueError(f"attention: {arg} must be [b, s, {width}], got {tuple(x.shape)}")
        if x.shape[1] != tokens:
            raise ValueError(f"attention: {arg} has s={x.shape[1]} tokens but the coordinates "
                             f"have {tokens} {what}")

    def _check_batch(self, x: Tensor, coords: Coordinates) -> None:
        if coords.batch_size is not None and coords.batch_size != x.shape[0]:
            raise ValueError(f"attention: x has batch {x.shape[0]} but the coordinates hold "
                             f"positions for {coords.batch_size} examples")
        check_device("x", x, coords)

    def _rotate(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        for rotary in self.rotary:
            q, k = rotary(q, k, coords)
        return q, k

    def _expand_kv(self, t: Tensor) -> Tensor:
        groups = self.num_heads // t.shape[1]
        return t if groups == 1 else t.repeat_interleave(groups, dim=1)

    def attend(self, ctx: AttentionCall) -> Tensor:
        """Attention output ``[b, n_h, n_q, h_d]`` for the call's (rotated) q, k, v."""
        assert ctx.q is not None and ctx.k is not None and ctx.v is not None
        # every term and the work, once, before a route is chosen: the routes and their forms
        # trust their caller (a CPU call that would run for minutes is refused before it starts)
        for enc in self.scores:
            enc.check_call(ctx)
        ctx = replace(ctx, checked=True)
        b, n_h, n_q, h_d = ctx.q.shape
        names = [getattr(e, "registry_name", type(e).__name__) for e in self.scores]
        check_attention_work(", ".join(names) or type(self).__name__, batch=b, num_heads=n_h, num_queries=n_q,
                             num_keys=ctx.k.shape[2], head_dim=h_d, device=ctx.q.device)
        scale = _softmax_scale(self.scores, ctx.head_dim)
        inputs = _route.route_inputs(self.scores, ctx.coords, self.num_heads, ctx.q.shape[0],
                                     ctx.q.device, ctx.q.dtype, torch.is_grad_enabled(),
                                     self.dense_bias_bytes)
        route = _route.choose_route(self.route, self.scores, self.kernel, inputs)
        _route.note(self, route)
        if route == "flex":
            return run_flex(self.scores, ctx, scale)
        if route == "dense":
            return run_dense(self.scores, ctx, scale)
        if route == "sdpa":
            return run_sdpa(self.scores, ctx, scale)
        if route == "fold":
            return run_fold(self.scores, ctx, scale)
        if route == "fla":
            return run_fla(self.scores, self.kernel, ctx, scale)
        return run_math(self.scores, self.kernel, ctx, scale)


class MultiHeadAttention(_Attention):
    """Self-attention with positional encodings at the rotary, score and kernel hooks.

    Args:
        d_model: model width.
        num_heads: query heads ``n_h``.
        encodings: built encodings (rotary, score, kernel; input encodings belong to the
            model's embedding, see [`Transformer`][mmpe.transformer.Transformer]). At most
            one kernel.
        num_kv_heads: key/value heads ``n_kv`` for grouped-query attention (Ainslie et al.
            2023; ``1`` is multi-query attention, Shazeer 2019); a divisor of ``num_heads``,
            default ``num_heads``. The cache keeps ``n_kv`` heads.
        head_dim: ``h_d``; defaults to ``d_model // num_heads``.
        qkv_bias: bias in the q/k/v projection.
        route: ``"auto"`` (the rule of [mmpe.attention.route][], or the route
            ``MMPE_ATTENTION_ROUTE`` names), or a route forced: ``"flex"``, ``"dense"``
            (one SDPA call with the dense bias, on any device), ``"sdpa"`` or ``"math"``.
        dense_bias_bytes: the dense route's budget for this layer's bias (bytes, float32);
            None: ``MMPE_DENSE_BIAS_BYTES``, else 1 GiB.
        window: a [`LocalWindow`][mmpe.attention.masks.LocalWindow] (sliding or chunked local
            attention) laid over the coordinates' mask in this layer, or None (per-layer
            schedules, [`mmpe.schedule`][mmpe.schedule], set it).
        shared_encodings: those of ``encodings`` that a model holds and shares across its
            layers ([`Transformer`][mmpe.transformer.Transformer] passes them): the layer
            reads them but does not register them as its submodules, so the model's state
            dict, `.to()` and an FSDP2 `fully_shard` per block hold each once; the layer's own
            encodings are then registered as ``own_encodings``.

    Shapes: ``forward(x [b, s, d_model], coords, cache=None) -> [b, s, d_model]``; ``coords``
    has ``n_q = s`` queries and ``n_k`` keys: ``s`` without a cache, ``cache.length + s``
    with one (``Sequence(s, offset=cache.length, causal=True)``).
    [`forward_heads`][mmpe.attention.modules.MultiHeadAttention.forward_heads] runs the same
    attention on already projected ``q``, ``k``, ``v``.

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads`` (with no ``head_dim``), heads
            that do not divide, an input encoding or more than one kernel in ``encodings``, an
            unknown ``route``, ``shared_encodings`` not among ``encodings``; at forward, ``x``
            not ``[b, s, d_model]`` with ``s`` equal to the coordinates' queries, a batch that
            differs from the coordinates', or coordinates whose key count is not
            ``cache.length + s``.
        TypeError: ``x`` not a floating-point tensor, ``encodings`` not a list.
    """

    @records_arguments
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        encodings: Seq[Encoding] = (),
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        route: str = "auto",
        window: LocalWindow | None = None,
        dense_bias_bytes: int | None = None,
        shared_encodings: Seq[Encoding] = (),
    ) -> None:
        super().__init__()
        head_dim = _head_dim(d_model, num_heads, head_dim)
        self._setup(num_heads, num_kv_heads, head_dim, encodings, route, dense_bias_bytes,
                    shared_encodings)
        if window is not None and not isinstance(window, LocalWindow):
            raise TypeError(f"attention: window must be a LocalWindow or None, got "
                            f"{type(window).__name__}")
        self.window = window
        self.d_model = d_model
        width = (num_heads + 2 * self.num_kv_heads) * head_dim
        self.qkv = nn.Linear(d_model, width, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, d_model)

    def forward(self, x: Tensor, coords: Coordinates, cache: KVCache | None = None) -> Tensor:
        if not isinstance(coords, Coordinates):
            raise TypeError(f"attention: coords must be an mmpe Coordinates object, got "
                            f"{type(coords).__name__}")
        self._check_x("x", x, self.d_model, coords.num_queries, "queries")
        self._check_batch(x, coords)
        q, k, v = self._project(x)  # forward_heads checks the keys against the cache
        out = self.forward_heads(q, k, v, coords, cache, x=x)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))

    def _check_keys(self, coords: Coordinates, cache: KVCache | None, tokens: int) -> None:
        """The coordinates' keys are the cached ones and this step's (after gathering)."""
        past = 0 if cache is None else cache.length
        if coords.num_keys != past + coords.step_keys(tokens):
            raise ValueError(f"attention: the coordinates have {coords.num_keys} keys but there "
                             f"are {past} cached + {tokens} new tokens; build them with "
                             f"offset={past} (e.g. Sequence({tokens}, offset={past}, "
                             "causal=True))")

    def forward_heads(self, q: Tensor, k: Tensor, v: Tensor, coords: Coordinates,
                      cache: KVCache | None = None, x: Tensor | None = None) -> Tensor:
        """Attention of already projected heads.

        Attention of projected heads: the layer's window, rotary encodings, cache and score
        terms, without the input and output projections (a bridge into another model's
        attention layer uses it with that model's projections and q/k norms).

        The one route of every call: the coordinates refuse what they cannot serve
        (`check_encodings`), gather the keys the queries attend to (`gather_keys`: the
        identity on one process, every rank's keys on a shard, `mmpe.parallel`), and name the
        query rows attended separately (`row_blocks`: a causal shard's chunks).

        Shapes: ``q [b, n_h, s, h_d]``, ``k``/``v [b, n_kv, s, h_d]`` (this step's tokens) ->
        ``[b, n_h, s, h_d]``; ``x`` (``[b, s, d]``, optional) is what content-dependent
        score terms read as the layer input.

        Raises:
            ValueError: heads, head dim or tokens that differ from the layer's and the
                coordinates' (checked before anything runs); what the coordinates refuse
                (`ContextParallelError` on a shard).
        """
        if not isinstance(coords, Coordinates):
            raise TypeError(f"attention: coords must be an mmpe Coordinates object, got "
                            f"{type(coords).__name__}")
        # before any term is built: coordinates elsewhere fail deep in a route otherwise
        check_device("q", q, coords)
        expected = ((self.num_heads, self.head_dim), (self.num_kv_heads, self.head_dim),
                    (self.num_kv_heads, self.head_dim))
        for name, t, (heads, dim) in zip("qkv", (q, k, v), expected, strict=True):
            if not isinstance(t, Tensor) or t.dim() != 4 or t.shape[1] != heads or \
                    t.shape[-1] != dim or t.shape[2] != coords.num_queries or t.shape[0] != q.shape[0]:
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"attention: {name} must be [b, {heads}, {coords.num_queries}, "
                                 f"{dim}] (heads, the coordinates' queries, head dim), got {shape}")
        coords.check_encodings(self.all_encodings(), window=self.window, cache=cache)
        self._check_keys(coords, cache, q.shape[2])
        if cache is not None and not coords.supports_cache:
            raise ValueError(f"attention: cache: {type(coords).__name__} coordinates cannot "
                             "describe a cached step (supports_cache is False: their keys are "
                             "their queries); cached decoding needs coordinates with keys "
                             "before the queries, such as Sequence(s, offset=cache.length, "
                             "causal=True)")
        if q.shape[0] == 0:  # an empty batch, as torch.nn layers take it: an empty output
            if cache is not None:
                raise ValueError("attention: an empty batch (b=0) cannot extend a KV cache")
            return q * 0.0  # [0, n_h, s, h_d], still in the graph of the projections
        if self.window is not None:
            coords = self.window.apply(coords)
        k, v = coords.gather_keys(k, v)
        blocks = coords.row_blocks(q.shape[0], any(r.length_dependent for r in self.rotary))
        if blocks is None:
            return self._attend_on(coords, x, q, k, v, cache)
        return torch.cat([self._attend_block(block, x, q, k, v) for block in blocks], dim=2)

    def _attend_block(self, block: RowBlock, x: Tensor | None, q: Tensor, k: Tensor,
                      v: Tensor) -> Tensor:
        """The block's query rows on the keys before its `stop`, on its own coordinates."""
        lo, hi, stop = block.lo, block.hi, block.stop
        args = (block.coords, None if x is None else x[:, lo:hi], q[:, :, lo:hi],
                k[:, :, :stop], v[:, :, :stop])
        if not block.checkpointed or not torch.is_grad_enabled():
            return self._attend_on(*args)
        return checkpoint(self._attend_on, *args, use_reentrant=False)

    def _attend_on(self, coords: Coordinates, x: Tensor | None, q: Tensor, k: Tensor,
                   v: Tensor, cache: KVCache | None = None) -> Tensor:
        """Rotations, the cache and the route on `coords` (keys `k`, `v` already gathered)."""
        with forward_scope(coords):
            coords.prepare()
            # Length-dependent rotations (dynamic NTK, xPos …) re-rotate every key each step.
            lazy = cache is not None and any(r.length_dependent for r in self.rotary)
            if not lazy:
                q, k = self._rotate(q, k, coords)
            if cache is not None:
                k, v = cache.update(k, v, owner=self, causal=getattr(coords, "causal", None),
                                    key_mask=coords.key_mask)
            if lazy:
                q, k = self._rotate(q, k, coords)
            ctx = AttentionCall(coords, self.num_heads, self.head_dim, q.shape[0], x, q,
                                   self._expand_kv(k), self._expand_kv(v), cache=cache)
            return self.attend(ctx)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        q, k, v = self.qkv(x).split((hq * d, hkv * d, hkv * d), dim=-1)
        return (rearrange(q, "b s (h d) -> b h s d", h=hq),
                rearrange(k, "b s (h d) -> b h s d", h=hkv),
                rearrange(v, "b s (h d) -> b h s d", h=hkv))



class CrossAttention(_Attention):
    """Attention from queries ``x`` to another token set ``memory``, each with its coordinates.

    The coordinates of the call are ``Cross(coords, memory_coords)``
    ([`Cross`][mmpe.coords.cross.Cross]): rotary encodings rotate ``q`` by the query side's
    positions and ``k`` by the key side's; a distance-based score needs a distance between the
    two sides (both on one grid, sequence, sphere or point space) and is refused with an
    error naming the ``Metric`` capability otherwise; latent queries
    ([`Latents`][mmpe.coords.cross.Latents]) have no position. With identical coordinates on both
    sides and ``memory is x`` it computes what
    [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention] does.

    Args:
        d_model: width of ``x`` (and of the output).
        num_heads, num_kv_heads, head_dim, qkv_bias, route, dense_bias_bytes: as
            [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention].
        encodings: built rotary/score/kernel encodings.
        kv_dim: width of ``memory`` (default ``d_model``).

    Shapes: ``forward(x [b, n_q, d_model], coords, memory [b, n_k, kv_dim], memory_coords)
    -> [b, n_q, d_model]``.

    Raises:
        ValueError: as [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention], for ``x``
            and for ``memory`` against ``memory_coords``' keys.
    """

    @records_arguments
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        encodings: Seq[Encoding] = (),
        *,
        kv_dim: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        route: str = "auto",
        dense_bias_bytes: int | None = None,
    ) -> None:
        super().__init__()
        head_dim = _head_dim(d_model, num_heads, head_dim)
        kv_dim = d_model if kv_dim is None else _check_positive("kv_dim", kv_dim)
        self._setup(num_heads, num_kv_heads, head_dim, encodings, route, dense_bias_bytes)
        self.d_model, self.kv_dim = d_model, kv_dim
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=qkv_bias)
        self.kv_proj = nn.Linear(kv_dim, 2 * self.num_kv_heads * head_dim, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, d_model)

    def forward(self, x: Tensor, coords: Coordinates, memory: Tensor,
                memory_coords: Coordinates) -> Tensor:
        pair = coords if isinstance(coords, Cross) else Cross(coords, memory_coords)
        self._check_x("x", x, self.d_model, pair.num_queries, "queries")
        self._check_x("memory", memory, self.kv_dim, pair.num_keys, "keys")
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"attention: x has batch {x.shape[0]} but memory {memory.shape[0]}")
        self._check_batch(x, pair)
        if x.shape[0] == 0:  # an empty batch, as torch.nn layers take it: an empty output
            return self.proj(self.q_proj(x) * 0.0)
        with forward_scope(pair):
            pair.prepare()
            q = rearrange(self.q_proj(x), "b s (h d) -> b h s d", h=self.num_heads)
            k, v = rearrange(self.kv_proj(memory), "b s (two h d) -> two b h s d", two=2,
                             h=self.num_kv_heads)
            q, k = self._rotate(q, k, pair)
            ctx = AttentionCall(pair, self.num_heads, self.head_dim, x.shape[0], x, q,
                                   self._expand_kv(k), self._expand_kv(v))
            out = self.attend(ctx)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))



def check_device(arg: str, t: Tensor, coords: Coordinates) -> None:
    """Refuse coordinates on another device than the tensors, naming both.

    Raises:
        ValueError: `coords.device` of another type than `t.device`.
    """
    device = getattr(coords, "device", None)
    if isinstance(device, torch.device) and device.type != t.device.type:
        raise ValueError(f"attention: the coordinates are on {device} but {arg} is on "
                         f"{t.device}; build them with device={arg}.device (or coords.to(...) "
                         "where the coordinates have it)")


def _held_elsewhere(encodings: Seq[Encoding], shared: Seq[Encoding]) -> set[int]:
    """The ids of `shared`, each one of `encodings` (a model's, read by this layer)."""
    mine = {id(e) for e in encodings}
    for enc in shared:
        if id(enc) not in mine:
            raise ValueError(f"attention: shared_encodings must be encodings of this layer; "
                             f"{type(enc).__name__} is not one of its encodings")
    return {id(e) for e in shared}


def _split_by_hook(
    encodings: Seq[Encoding],
) -> tuple[nn.ModuleList, nn.ModuleList, list[KernelEncoding]]:
    rotary, scores, kernels = nn.ModuleList(), nn.ModuleList(), []
    for enc in encodings:
        if isinstance(enc, RotaryEncoding):
            rotary.append(enc)
        elif isinstance(enc, ScoreEncoding):
            scores.append(enc)
        elif isinstance(enc, KernelEncoding):
            kernels.append(enc)
        else:
            raise ValueError(
                f"attention: {type(enc).__name__} (hook {getattr(enc, 'hook', '?')!r}) is not a "
                "rotary, score or kernel encoding; add input encodings to the embeddings"
            )
    return rotary, scores, kernels

