"""A small pre-norm transformer stack built on [`mmpe.attention.MultiHeadAttention`][mmpe.attention.MultiHeadAttention]."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import Tensor, nn

from mmpe.attention import MultiHeadAttention
from mmpe.attention.masks import LocalWindow
from mmpe.attention.modules import check_device
from mmpe.cache import KVCache, ModelCache
from mmpe.context import validate_context_keys
from mmpe.coords.base import Coordinates
from mmpe.encodings.base import Encoding, InputEncoding
from mmpe.prepare import forward_scope
from mmpe.rebuild import records_arguments, reset_in_place
from mmpe.registry import build
from mmpe.schedule import AttentionTemperature, LayerSchedule, LayerSpec

EncodingSpec = str | Mapping[str, Any] | Encoding

#: How `Transformer` combines an input encoding's ``P`` with the token embeddings.
INPUT_COMBINE = ("add", "concat")


def build_encodings(specs: Seq[EncodingSpec], **context: Any) -> list[Encoding]:
    """Build each spec (registry name, config dict, or an already built module).

    `context` (keys of `mmpe.context.CONTEXT_KEYS`) fills the options each encoding
    declares and the spec does not set.
    """
    if isinstance(specs, (str, Mapping, Encoding)):
        raise TypeError(f"encodings must be a list of encodings (names, config dicts or built "
                        f"modules), got a single {type(specs).__name__} {specs!r}: write [{specs!r}]")
    built = [s if isinstance(s, Encoding) else build(s, context=context) for s in specs]
    _warn_duplicates(built)
    return built


def _check_input(x: Tensor, weight: Tensor) -> None:
    """Type and dtype of the model input (its width may change: input encodings concatenate)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"transformer: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"transformer: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"transformer: x must be [b, s, d], got {tuple(x.shape)}")
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"transformer: x is {x.dtype} but the model's weights are "
                        f"{weight.dtype}; cast one to the other or run under torch.autocast")


def _warn_duplicates(encodings: Seq[Encoding]) -> None:
    """Two rotary or two input encodings of one kind apply position twice: almost always a
    configuration mistake (RoPE on RoPE rotates by twice the angle)."""
    seen: dict[tuple[str, str], int] = {}
    for enc in encodings:
        if enc.hook in ("rotary", "input"):
            key = (enc.hook, getattr(enc, "registry_name", type(enc).__name__))
            seen[key] = seen.get(key, 0) + 1
    for (hook, name), count in seen.items():
        if count > 1:
            warnings.warn(f"{count} {hook} encodings {name!r} in one model: position is applied "
                          f"{count} times", UserWarning, stacklevel=3)


def check_input_combine(value: Any, owner: str = "transformer") -> str:
    """`value` if it is one of `INPUT_COMBINE`, else `ValueError` naming the option."""
    if not isinstance(value, str) or value not in INPUT_COMBINE:
        raise ValueError(f"{owner}: input_combine must be one of {', '.join(map(repr, INPUT_COMBINE))}, "
                         f"got {value!r}")
    return value


def pe_width(enc: InputEncoding, d_model: int) -> int:
    """The channels `d_pe` of an input encoding's `P`.

    `d_pe`: the channels of an input encoding's `P` (`width` for encodings that set it,
    such as `tabpet`; otherwise the encoding's `d_model`, by default the model's)."""
    for attr in ("width", "d_model"):
        value = getattr(enc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return d_model


def input_term(enc: InputEncoding, x: Tensor, coords: Coordinates) -> Tensor:
    """The encoding's `P` for tokens `x`.

    The encoding's `P` for tokens `x`: `enc.term(x, coords)` for content-dependent
    encodings that define it (`conv_pe`: `GELU(conv(x))`), else `enc(coords)`."""
    term = getattr(enc, "term", None)
    return term(x, coords) if callable(term) else enc(coords)


class ConcatProjection(nn.Module):
    """An input encoding concatenated with the token embeddings and projected back.

    `Linear(d_model + d_pe → d_model)([x ; P])`: an input encoding concatenated with the
    token embeddings and projected back to the model width.

    `P` (`[s, d_pe]` or `[b, s, d_pe]`) is broadcast over the batch. The weight
    `W = [W_x | W_p]` starts as `[I | I]` (the leading `min(d_model, d_pe)` channels of
    `P` on the diagonal) and the bias at 0, so at initialisation the output is exactly
    `x + P` (for `d_pe = d_model`): the concatenated model starts as the added one and
    training moves `W_x` and `W_p` from there. Building it draws nothing from the global
    RNG, so with one seed the rest of a model is initialised as in its `add` twin. Since `W [x ; P] = W_x x + W_p P`,
    concatenation is addition of a learned linear map of `P` (and of `x`).

    Shapes: `forward(x [b, s, d_model], pe [s, d_pe] or [b, s, d_pe]) -> [b, s, d_model]`.

    Raises:
        ValueError: non-positive widths; `x` or `pe` of the wrong shape (naming the
            expected shape).
    """

    def __init__(self, d_model: int, d_pe: int, name: str = "input encoding") -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("d_pe", d_pe)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"ConcatProjection: {arg} must be a positive int, got {val!r}")
        self.d_model, self.d_pe, self.name = d_model, d_pe, name
        # nn.Linear's random init is overwritten below; drawing it must not move the global RNG,
        # or every module built after this one (blocks, heads) would start elsewhere than in
        # the "add" model of the same seed.
        with torch.random.fork_rng(devices=[]):
            self.proj = nn.Linear(d_model + d_pe, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """`W = [I | I]`, `b = 0`: the projection starts as `x + P`."""
        with torch.no_grad():
            self.proj.weight.zero_()
            eye = torch.eye(self.d_model, dtype=self.proj.weight.dtype)
            self.proj.weight[:, :self.d_model].copy_(eye)
            self.proj.weight[:, self.d_model:].copy_(torch.eye(self.d_model, self.d_pe))
            self.proj.bias.zero_()

    def forward(self, x: Tensor, pe: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"{self.name} (input_combine='concat'): x must be "
                             f"[b, s, {self.d_model}], got {tuple(x.shape)}")
        b, s = x.shape[0], x.shape[1]
        if pe.dim() not in (2, 3) or pe.shape[-2:] != (s, self.d_pe) or (
                pe.dim() == 3 and pe.shape[0] not in (1, b)):
            raise ValueError(f"{self.name} (input_combine='concat'): P must be [{s}, {self.d_pe}] "
                             f"or [{b}, {s}, {self.d_pe}] (the tokens of x, d_pe), got "
                             f"{tuple(pe.shape)}")
        pe = pe.to(x.dtype).expand(b, s, self.d_pe)
        return self.proj(torch.cat((x, pe), dim=-1))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_pe={self.d_pe}"


class TransformerBlock(nn.Module):
    """Pre-norm block: `x + attn(LN(x))` then `x + MLP(LN(x))` (GELU MLP).

    Shapes: `forward(x [b, s, d_model], coords) -> [b, s, d_model]`.
    """

    @records_arguments
    def __init__(self, d_model: int, num_heads: int, encodings: Seq[Encoding] = (),
                 mlp_ratio: float = 4.0, dropout: float = 0.0, route: str = "auto",
                 num_kv_heads: int | None = None, window: LocalWindow | None = None,
                 shared_encodings: Seq[Encoding] = ()) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, encodings, route=route,
                                       num_kv_heads=num_kv_heads, window=window,
                                       shared_encodings=shared_encodings)
        self.norm2 = nn.LayerNorm(d_model)
        hidden = int(d_model * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))
        self.drop = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        """Initialise the block again as its constructor did ([`mmpe.rebuild`][mmpe.rebuild])."""
        reset_in_place(self)

    def forward(self, x: Tensor, coords: Coordinates, cache: KVCache | None = None) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), coords, cache))
        return x + self.drop(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """Encoder or decoder stack (causality comes from the coordinates) with any encodings.

    Input encodings are applied once to the embeddings; rotary, score and kernel encodings
    enter every layer's attention. `input_combine` says how an input encoding's `P` meets
    the embeddings `x`: `"add"` (`x + P`: the encoding's own `combine`) or
    `"concat"` (`Linear(d_model + d_pe → d_model)([x ; P])`, one learned
    [`ConcatProjection`][mmpe.transformer.ConcatProjection] per input encoding, started at `x + P`). By default one set of attention encodings is shared by all
    layers, as T5 shares its relative bias; `share_encodings=False` gives each layer its own.

    Args:
        d_model: width.
        num_heads: `n_h`.
        depth: number of blocks.
        encodings: registry names, config dicts or built encodings.
        mlp_ratio, dropout, route, num_kv_heads: per block (see [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention]).
        share_encodings: share attention encodings across layers. They are then the
            model's modules, whatever the depth: registered once, as `shared_encodings[i]`
            (their state-dict keys), and read by every block without being a block's
            submodule, so `.to()`, `reset_parameters()` and FSDP2's `fully_shard` per block,
            then the root, each meet them once (the root shards them).
        context: model-wide values for building encodings, keys of
            `mmpe.context.CONTEXT_KEYS` (e.g. `max_len`,
            `original_max_position_embeddings`, `grid_shape`); `d_model`, `num_heads`
            and `head_dim` are filled in.
        input_combine: `"add"` (default) or `"concat"` (see above; models without an
            input encoding are unchanged and warn).
        layer_schedule: per-layer encodings and attention windows ([`mmpe.schedule`][mmpe.schedule]):
            a preset name (`"llama4"`, `"gemma3"`, `"gemma2"`, `"cohere2"`, `"smollm3"`), a
            preset dict `{"preset": "gemma3", "sliding_window": 512}`, a pattern `{"every": 4,
            "then": {...}, "otherwise": {...}}`, a list of one layer spec per layer, or a
            [`LayerSchedule`][mmpe.schedule.LayerSchedule]. A layer whose spec gives
            `encodings` uses those instead of the model's attention encodings (input encodings
            still apply once to the embeddings); with `share_encodings`, layers with equal
            specs share one built module. Saved in the `state_dict` and checked on load.

    Raises:
        TypeError: `encodings` given as a single name/config/module instead of a list.
        ValueError: `depth < 1`; an unknown context key or an invalid context value;
            `input_combine` not `"add"` or `"concat"`; a `layer_schedule` that does not parse
            or has not `depth` layers; an input encoding in a layer spec; model attention
            encodings that no layer of the schedule uses.

    Shapes: `forward(x [b, s, d_model], coords, cache=None) -> [b, s, d_model]` (final
    LayerNorm applied). For cached decoding pass `cache = model.make_cache()` and, each step,
    coordinates with `offset = cache.length` (see [`mmpe.cache`][mmpe.cache]). Position-derived
    tensors (rotary tables, shared biases, masks) are computed once per forward and shared by
    the layers (`mmpe.prepare`).
    """

    @records_arguments
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        depth: int,
        encodings: Seq[EncodingSpec] = (),
        *,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        route: str = "auto",
        share_encodings: bool = True,
        context: Mapping[str, Any] | None = None,
        num_kv_heads: int | None = None,
        input_combine: str = "add",
        layer_schedule: Any = None,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"transformer: depth must be >= 1, got {depth}")
        self.input_combine = check_input_combine(input_combine)
        context = validate_context_keys({"d_model": d_model, "num_heads": num_heads,
                                         "head_dim": d_model // num_heads, **(context or {})},
                                        "Transformer(context=...)")
        built = build_encodings(encodings, **context)
        self.input_encodings = nn.ModuleList(e for e in built if isinstance(e, InputEncoding))
        specs = [s for s, e in zip(encodings, built, strict=True) if not isinstance(e, InputEncoding)]
        shared = [e for e in built if not isinstance(e, InputEncoding)]
        # One projection per input encoding under "concat" (empty, and no state, under "add").
        self.input_projections = nn.ModuleList(
            ConcatProjection(d_model, pe_width(e, d_model), getattr(e, "registry_name", type(e).__name__))
            for e in (self.input_encodings if input_combine == "concat" else ()))
        if input_combine == "concat" and not self.input_encodings:
            warnings.warn("transformer: input_combine='concat' has no effect: the model has no "
                          "input encoding", UserWarning, stacklevel=2)

        def layer_encodings() -> list[Encoding]:
            return shared if share_encodings else build_encodings(specs, **context)

        schedule = None if layer_schedule is None else LayerSchedule.parse(layer_schedule, depth)
        if schedule is None:
            layers: list[tuple[list[Encoding], LocalWindow | None]] = [
                (layer_encodings(), None) for _ in range(depth)]
        else:
            if shared and all(spec.encodings is not None for spec in schedule):
                names = [getattr(e, "registry_name", type(e).__name__) for e in shared]
                raise ValueError(f"transformer: encodings {names} are used by no layer: every layer "
                                 "of the layer_schedule gives its own encodings; drop them or leave "
                                 "'encodings' out of some layer specs")
            built_for: dict[str, list[Encoding]] = {}

            def scheduled(spec: LayerSpec) -> list[Encoding]:
                if spec.encodings is None:
                    encs = layer_encodings()
                else:
                    key = json.dumps(spec.to_dict().get("encodings"), sort_keys=True)
                    if key not in built_for or not share_encodings:
                        made = build_encodings(list(spec.encodings), **context)
                        inputs = [e for e in made if isinstance(e, InputEncoding)]
                        if inputs:
                            raise ValueError(f"transformer: layer_schedule encodings must enter "
                                             f"attention; {type(inputs[0]).__name__} is an input "
                                             "encoding: put it in the model's encodings")
                        built_for[key] = made
                    encs = built_for[key]
                if spec.temperature is not None:
                    encs = [*encs, AttentionTemperature(**spec.temperature)]
                return encs

            def window(spec: LayerSpec) -> LocalWindow | None:
                if spec.window is not None:
                    return LocalWindow("sliding", spec.window)
                return None if spec.chunk is None else LocalWindow("chunked", spec.chunk)

            layers = [(scheduled(spec), window(spec)) for spec in schedule]
        # The model's shared attention encodings, and any other read by more than one block,
        # are the model's: registered here once, read by the blocks (state-dict keys
        # `shared_encodings.i.*`; FSDP2 shards them with the root, whatever per-block wrapping
        # a user writes).
        uses = Counter(id(e) for encs, _ in layers for e in dict.fromkeys(encs))
        model_wide = {id(e) for e in shared} if share_encodings else set()

        def is_shared(enc: Encoding) -> bool:
            return uses[id(enc)] > 1 or id(enc) in model_wide

        self.shared_encodings = nn.ModuleList(
            {id(e): e for encs, _ in layers for e in encs if is_shared(e)}.values())
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, num_heads, encs, mlp_ratio, dropout, route, num_kv_heads,
                             window=win, shared_encodings=[e for e in encs if is_shared(e)])
            for encs, win in layers
        )
        #: the per-layer schedule (None: every layer alike); its JSON is in the state_dict.
        self.layer_schedule = schedule
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, coords: Coordinates, cache: ModelCache | None = None) -> Tensor:
        if cache is not None and not isinstance(cache, ModelCache):
            raise TypeError(f"transformer: cache must be the ModelCache of model.make_cache(), "
                            f"got {type(cache).__name__}")
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"transformer: cache has {len(cache)} layers, the model "
                             f"{len(self.blocks)}; make it with model.make_cache()")
        _check_input(x, self.norm.weight)
        check_device("x", x, coords)  # before the input encodings read the coordinates
        coords.check_encodings(self.input_encodings)  # what a shard (mmpe.parallel) refuses
        with forward_scope(coords):
            if self.input_projections:
                for enc, proj in zip(self.input_encodings, self.input_projections, strict=True):
                    x = proj(x, input_term(enc, x, coords))
            else:
                for enc in self.input_encodings:
                    x = enc.combine(x, coords)
            for i, block in enumerate(self.blocks):
                x = block(x, coords, None if cache is None else cache[i])
        return self.norm(x)

    def reset_parameters(self) -> None:
        """Initialise every parameter and buffer again, as the constructor did.

        Initialise every parameter and buffer again, every encoding's included, as the
        constructor did: the step after `to_empty(device=...)` of a model built on `meta`
        (FSDP2's recipe; [`mmpe.rebuild`][mmpe.rebuild]). From the RNG state of a normal
        build it draws the same numbers; on FSDP2-sharded parameters each rank fills its
        shard.

        Raises:
            ValueError: the model is still on `meta`.
        """
        reset_in_place(self)

    def make_cache(self) -> ModelCache:
        """An empty key/value cache with one [`KVCache`][mmpe.cache.KVCache] per layer."""
        return ModelCache(len(self.blocks))
