"""Base classes for the four places where position enters attention.

Expanding `softmax((U+P)W_q ((U+P)W_k)^T)` gives content–content, content–position and
position–position terms; every method in the literature acts at one of four hooks:

========  =====================================================  =================================
hook      what the encoding does                                 base class
========  =====================================================  =================================
input     returns `P` to add to (or concatenate with) tokens   [`InputEncoding`][mmpe.encodings.base.InputEncoding]
rotary    rotates `q` and `k` by position                    [`RotaryEncoding`][mmpe.encodings.base.RotaryEncoding]
score     adds to (or rescales) the attention logits             [`ScoreEncoding`][mmpe.encodings.base.ScoreEncoding]
kernel    replaces the softmax normalisation                     [`KernelEncoding`][mmpe.encodings.base.KernelEncoding]
========  =====================================================  =================================

Shapes use torchtune's notation: `b` batch, `s` sequence (tokens), `n_h` heads,
`h_d` head dimension, `n_q` / `n_k` query / key tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Capability, Directed, missing

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class PositionOutOfRangeError(ValueError):
    """A position lies outside what an encoding can represent (e.g. past a learned table)."""


class CachedDecodingError(ValueError):
    """Cached decoding would not reproduce a full recomputation here.

    Cached (incremental) decoding would not reproduce a full recomputation for this
    encoding at these positions; decode without a cache instead."""


@dataclass
class AttentionCall:
    """What a score or kernel encoding may read when it builds its term for one attention call.

    Attributes:
        coords: the coordinates of the tokens.
        num_heads: `n_h`.
        head_dim: `h_d`.
        batch: `b`.
        x: the attention layer's input `[b, n_q, d_model]` (content-dependent gates read it).
        q: queries after rotary encodings, `[b, n_h, n_q, h_d]`.
        k: keys after rotary encodings, `[b, n_h, n_k, h_d]`.
        v: values, `[b, n_h, n_k, h_d]`.
        cache: the layer's [`KVCache`][mmpe.cache.KVCache] in cached decoding (`k`/`v` then
            hold every cached key); encodings keep incremental state in `cache.state`.
        checked: True where the attention layer that made this call has checked every
            term against it (`ScoreEncoding.check_call`, once per call, before the route
            is chosen); `score_mod` and the forms then trust it. A call you build yourself
            leaves it False, and `score_mod` checks.
    """

    coords: Coordinates
    num_heads: int
    head_dim: int
    batch: int
    x: Tensor | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    cache: Any = None
    checked: bool = False


class Encoding(nn.Module):
    """Common base: the hook, the coordinate capabilities an encoding needs, and what a shard refuses.

    `needs` is set by [`mmpe.registry.register`][mmpe.registry.register] from its `needs=` argument (an
    unregistered subclass may set it as a class attribute).
    """

    hook: ClassVar[str] = ""
    needs: ClassVar[tuple[type[Capability], ...]] = ()
    shard_refusal: ClassVar[str | None] = None
    """Why the encoding cannot run on one rank's shard of a sequence, or None where it can.

    Context parallelism (`mmpe.parallel`): a shard refuses the encoding with
    this reason."""

    def check_coords(self, coords: Coordinates) -> None:
        """Raise unless `coords` provides every capability this encoding needs.

        Raises:
            TypeError: `coords` lacks members of a capability (naming both), or is not a
                [`Coordinates`][mmpe.coords.base.Coordinates].
            ValueError: the members are there but a capability's condition is not met
                (`causal == True` for decoder-only methods, `num_axes == 1` for 1D ones).
        """
        name = getattr(self, "registry_name", type(self).__name__)
        if not isinstance(coords, Coordinates):
            raise TypeError(
                f"{name}: coords must be an mmpe Coordinates object, got {type(coords).__name__}"
            )
        gaps = [(cap.__name__, missing(coords, cap)) for cap in self.needs]
        gaps = [(cap, lacks) for cap, lacks in gaps if lacks]
        if not gaps:
            return
        what = "; ".join(f"{cap} needs {', '.join(lacks)}" for cap, lacks in gaps)
        message = (f"{name} needs coordinates providing {[c.__name__ for c in self.needs]}; "
                   f"{type(coords).__name__} does not: {what}")
        note = getattr(coords, "capability_note", None)  # why not, where the object knows
        if note:
            message += f" ({note})"
        # Members absent: the wrong kind of coordinates. Members present but a condition
        # unmet (causal == True, num_axes == 1): the right kind with the wrong values.
        members = {m for cap in self.needs for m in cap.members}
        if any(lack in members for _, lacks in gaps for lack in lacks):
            raise TypeError(message)
        raise ValueError(message)


class InputEncoding(Encoding):
    """Input hook: a tensor `P` combined with the token embeddings before the first layer."""

    hook = "input"

    def forward(self, coords: Coordinates) -> Tensor:  # pragma: no cover - abstract
        """Return `P`, `[s, d_model]` or `[b, s, d_model]`."""
        raise NotImplementedError

    def combine(self, x: Tensor, coords: Coordinates) -> Tensor:
        """Add `P` to token embeddings `x` `[b, s, d_model]` (override to concatenate)."""
        pe = self(coords)
        if pe.shape[-2:] != x.shape[-2:]:
            raise ValueError(
                f"{type(self).__name__}: x must be [b, {pe.shape[-2]}, {pe.shape[-1]}] to match "
                f"the coordinates, got {tuple(x.shape)}"
            )
        return x + pe.to(x.dtype)


class RotaryEncoding(Encoding):
    """Rotary hook: rotate queries and keys by their positions.

    Class attributes:
        length_dependent: the rotation of a token depends on how many tokens there are (dynamic
            NTK, LongRoPE's switch, xPos's centre), so a key cached at an earlier step would be
            stale: the attention module then caches unrotated keys and rotates all of them at
            every step. Fixed-frequency methods leave it False and have keys rotated once.
    """

    hook = "rotary"
    length_dependent: ClassVar[bool] = False

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """Rotate `q` `[b, n_h, n_q, h_d]` and `k` `[b, n_h, n_k, h_d]`."""
        raise NotImplementedError  # pragma: no cover - abstract


#: what a score term may be a function of (`ScoreEncoding.structure`), each with the one
#: function the attention paths call for it: see docs/extending.md
STRUCTURES: dict[str, str] = {
    "pair": "anything per (query, key): the paths evaluate `score_mod` on the pairs",
    "relation": "the signed offset pos_q − pos_k on sequences: `relation_term(ctx)`",
    "distance": "the coordinates' metric distance alone: `distance_term(ctx)`",
    "offset": "the cell offset on a grid: `score_mod` on one pair per offset",
    "table": "a per-pair lookup into a precomputed table (hops, random-walk features)",
}

#: a term as a function of a distance or relation `[...]` and head indices `h` (int64, broadcast
#: with it), giving the value `score_mod` adds to such a pair: shape of the broadcast
Term = Callable[[Tensor, Tensor], Tensor]


class ScoreEncoding(Encoding):
    """Score hook: a FlexAttention-style `score_mod(score, b, h, q_idx, kv_idx)`.

    A subclass writes its paper's formula once and declares its **structure**, what the term is
    a function of (`STRUCTURES`):

    * `"distance"`: write [`distance_term`][mmpe.encodings.base.ScoreEncoding.distance_term];
      `score_mod` is derived from it (ALiBi, KERPLE, Gaussian and radial kernels).
    * `"relation"`: write [`relation_term`][mmpe.encodings.base.ScoreEncoding.relation_term];
      `score_mod` is derived from it (T5's buckets).
    * `"offset"`, `"table"`, `"pair"` (the default): write `score_mod`.

    The same `score_mod` runs inside FlexAttention (scalar indices, never an `n×n` tensor) and
    eagerly on broadcast index grids (`mmpe.attention.generic.pair_rows`; the dense bias of any
    terms through one door, `mmpe.attention.dense_bias`); the
    attention paths read the structure to pick a faster form (a table over offsets, rows
    shared by the heads). How a path computes a structure fast lives with the path
    (`mmpe.attention.forms`), and a hand-written fast form of one class in a table keyed by
    that exact class (`mmpe.attention.fast_forms`): a subclass never inherits one.

    Class attributes:
        structure: one key of `STRUCTURES`. A subclass that overrides `score_mod` without
            declaring its own structure is treated as `"pair"` (its formula may no longer be a
            function of the distance or relation its parent's was).
        additive: the mod adds a term that does not depend on `score` (so the eager path can
            pass it to SDPA as an additive mask). Set False for rescaling methods.
        needs_probs: the encoding also adds a term computed from the attention probabilities
            (value-side relative terms); see [`value_term`][mmpe.encodings.base.ScoreEncoding.value_term].
        content_free: the term does not read the layer's q, k or x.
    """

    hook = "score"
    structure: ClassVar[str] = "pair"
    additive: ClassVar[bool] = True
    needs_probs: ClassVar[bool] = False
    #: the term depends on positions and parameters only (not on q, k, x): its eager bias is
    #: computed once per forward and shared by the layers that share the encoding.
    content_free: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "structure" in own and cls.structure not in STRUCTURES:
            raise TypeError(f"{cls.__name__}.structure must be one of {list(STRUCTURES)}, got "
                            f"{cls.structure!r}")
        if "score_mod" in own and "structure" not in own and cls.structure != "pair":
            cls.structure = "pair"

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        """The term as a FlexAttention `score_mod`.

        The term as a FlexAttention `score_mod`, derived from the term function the class
        writes: `distance_term` (structure `"distance"`) of the coordinates' distance, or
        `relation_term` (structure `"relation"`) of their relation `pos_q − pos_k` (of the
        distance on coordinates without a direction, which the term then buckets as such).
        A class that writes neither writes `score_mod`."""
        cls = type(self)
        if cls.distance_term is not ScoreEncoding.distance_term:
            if not ctx.checked:  # a direct call: no layer checked it
                self.check_call(ctx)
            coords, term = ctx.coords, self.distance_term(ctx)
            pair = coords.distance
        elif cls.relation_term is not ScoreEncoding.relation_term:
            if not ctx.checked:  # a direct call: no layer checked it
                self.check_call(ctx)
            coords, term = ctx.coords, self.relation_term(ctx)
            pair = coords.relation if isinstance(coords, Directed) else coords.distance
        else:  # pragma: no cover
            raise NotImplementedError(f"{cls.__name__} must define score_mod")

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + term(pair(q_idx, kv_idx, b), h)

        return mod

    def distance_term(self, ctx: AttentionCall) -> Term:
        """Structure `"distance"`: the term as a function of distances.

        Structure `"distance"`: the term as a function `term(dist, h)` of distances `[...]`
        (float32, the coordinates' unit) and head indices `h` (int64) broadcast with them.

        Read every parameter here, once (the FlexAttention rule: a learned tensor captured by a
        `score_mod` is read by index inside it, `slopes[h]`, never transformed there); the
        returned function does elementwise work only.
        """
        raise NotImplementedError(f"{type(self).__name__} declares structure "
                                  f"{self.structure!r}, not 'distance'")

    def relation_term(self, ctx: AttentionCall) -> Term:
        """Structure `"relation"`: the term as a function of signed offsets.

        Structure `"relation"`: the term as a function `term(relation, h)` of signed offsets
        `pos_q − pos_k` `[...]` (int64 tokens) and head indices `h` broadcast with them, on
        coordinates whose `toeplitz` is true; the derived `score_mod` passes the distance
        (float) on coordinates without a direction. Parameters are read here, once."""
        raise NotImplementedError(f"{type(self).__name__} declares structure "
                                  f"{self.structure!r}, not 'relation'")

    def check_call(self, ctx: AttentionCall) -> None:
        """Raise unless the call's coordinates and head count are supported.

        Raise unless `ctx`'s coordinates are supported (`check_coords`) and, for an encoding
        built for `num_heads` heads, the attention has that many (`ValueError` naming both).

        The doors where a call enters call it once per call, before any term is built:
        the attention layers (`_Attention.attend`, which then marks the call `checked`),
        `mmpe.functional.score_mod` and `mmpe.attention.dense_bias`. The forms of
        `mmpe.attention` trust their caller; `score_mod` checks a call no layer checked."""
        self.check_coords(ctx.coords)
        built = getattr(self, "num_heads", None)
        if built is not None and ctx.num_heads != built:
            name = getattr(self, "registry_name", type(self).__name__)
            raise ValueError(f"{name}: built for num_heads={built}, attention has {ctx.num_heads}")

    def softmax_scale(self, head_dim: int) -> float | None:
        """Logit scale this method prescribes instead of `1/sqrt(h_d)`, or None."""
        return None

    def value_term(self, probs: Tensor, ctx: AttentionCall) -> Tensor | None:
        """Extra output `[b, n_h, n_q, h_d]` from probabilities `[b, n_h, n_q, n_k]`, or None."""
        return None


class KernelEncoding(Encoding):
    """Kernel hook: how masked, position-modified logits become attention output."""

    hook = "kernel"
    #: True where the kernel is the ordinary softmax (fused attention paths may be used).
    is_softmax: ClassVar[bool] = False

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionCall) -> Tensor:
        """Map logits `[b, n_h, n_q, n_k]` (masked pairs at `-inf`) and values to output."""
        raise NotImplementedError  # pragma: no cover - abstract

