"""The attention interface: mmpe score encodings inside an HF model's attention calls.

[`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings] links each
attention module to its encodings and the model's per-forward state;
[`mmpe_attention_forward`][mmpe.integrations.transformers.mmpe_attention_forward], registered
with HF's `AttentionInterface` by
[`register_attention`][mmpe.integrations.transformers.register_attention], reads HF's masks
and cache into mmpe coordinates, checks the call once as mmpe's layers do, and runs it through
mmpe's own doors: the dense bias (`mmpe.attention.forms.summed_bias`, the sum of
`dense_bias`) on SDPA, the math route (`mmpe.attention.dispatch.run_math`) where the
probabilities are needed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe._optional import require
from mmpe.attention.dispatch import run_math
from mmpe.attention.forms import summed_bias
from mmpe.coords.base import index_grid
from mmpe.coords.sequence import Sequence as Seq1D
from mmpe.encodings.base import (
    AttentionCall,
    Encoding,
    KernelEncoding,
    ScoreEncoding,
)
from mmpe.integrations.transformers.rotary_swap import _NoRotary, _rotary_modules
from mmpe.prepare import forward_scope
from mmpe.registry import build
from mmpe.validation import check_attention_work

__all__ = ["ATTN_IMPLEMENTATION", "EncodingSpec", "apply_score_encodings", "mmpe_attention_forward",
           "register_attention"]

#: the name under which `register_attention` registers the attention and mask functions.
ATTN_IMPLEMENTATION = "mmpe"

EncodingSpec = str | Mapping[str, Any] | Encoding


class _ModelState:
    """What the attention calls of one forward share: the 2D padding mask, coordinates, biases."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.padding: Tensor | None = None  # [b, L] bool, True at real tokens (HF's attention_mask)
        self.memo: dict[Any, Any] = {}
        # the door's per-forward memo (`mmpe.prepare.forward_scope`) on this forward's coordinates
        self.scopes = ExitStack()

    def share(self, coords: Seq1D) -> None:
        """Let the layers of this forward share the door's content-free biases and masks on
        `coords` — without gradients only (generation): a shared tensor would break HF's
        gradient checkpointing, whose recomputed layer computes it again."""
        if not torch.is_grad_enabled():
            self.scopes.enter_context(forward_scope(coords))

    def end_forward(self) -> None:
        self.scopes.close()


class _Capture:
    """Forward pre-hook: remember the 2D `attention_mask` of this call (a callable object, so
    `copy.deepcopy` gives the copy its own state)."""

    def __init__(self, state: _ModelState, index: int | None) -> None:
        self.state, self.index = state, index

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        if mask is None and self.index is not None and len(args) > self.index:
            mask = args[self.index]
        self.state.end_forward()
        self.state.padding = mask.bool() if isinstance(mask, Tensor) and mask.dim() == 2 else None
        self.state.memo = {}


class _EndForward:
    """Forward hook (also when the forward raises): close the forward's shared memos."""

    def __init__(self, state: _ModelState) -> None:
        self.state = state

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.state.end_forward()


class _Link:
    """Attached to an attention module (as a plain attribute): its encodings and the model state."""

    def __init__(self, state: _ModelState, scores: list[ScoreEncoding], kernel: KernelEncoding | None) -> None:
        self.state, self.scores, self.kernel = state, scores, kernel


def _is_causal(module: nn.Module, kwargs: Mapping[str, Any]) -> bool:
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", False)
    config = getattr(module, "config", None)
    return bool(causal) and getattr(config, "is_causal", True) is not False


def _visible_keys(mask: Tensor | None) -> Tensor | None:
    """`[b, k]` bool: the keys some query may attend to, from HF's 4D boolean or additive mask."""
    if mask is None or mask.dim() != 4:
        return None
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.any(dim=-2).any(dim=1)


def _key_count(state: _ModelState, mask: Tensor | None, q_len: int, k_len: int,
               position_ids: Tensor | None = None) -> int:
    """Keys that hold tokens: a static cache allocates more slots than tokens seen so far (its
    filled slots come first); the rest are dropped.

    Read from the call's 2D padding mask, else from HF's 4D mask, else — an unpadded batch,
    where HF passes no mask at all — from `position_ids`: the queries sit at slots
    `position_ids`, so the filled slots are `0 … max(position_ids)`.
    """
    if k_len <= q_len:
        return k_len
    pad = state.padding
    if pad is not None:
        return pad.shape[-1] if q_len <= pad.shape[-1] < k_len else k_len
    seen = _visible_keys(mask)
    if seen is None and position_ids is not None:
        return min(k_len, max(q_len, int(position_ids.max()) + 1))
    if seen is None or not bool(seen.any()):
        return k_len
    return max(int(seen.any(dim=0).nonzero().max()) + 1, q_len)


def _coordinates(state: _ModelState, mask: Tensor | None, q_len: int, k_len: int, causal: bool,
                 device: torch.device, position_ids: Tensor | None = None) -> Seq1D:
    """The keys' positions: real tokens numbered from 0 per example (HF's `position_ids` for a
    left-padded batch); the queries are the last `q_len` keys.

    Real tokens are read from the model call's 2D `attention_mask` when there is one (the
    last `k_len` of its entries: a sliding-window cache keeps only the newest keys), else from
    HF's 4D mask (keys no query may see are padding), else all keys are real.

    Without a 2D mask the keys are numbered from the first cached one; a sliding-window cache
    has dropped older keys, so the numbers are then shifted to make the last query's position
    its `position_ids` (absolute positions: FIRE normalises by the query's position).
    """
    pad = state.padding
    from_2d = pad is not None and pad.shape[-1] >= k_len
    shift = None
    if not from_2d and position_ids is not None:
        shift = position_ids[:, -1:].to(device).long() - (k_len - 1)  # [b or 1, 1]
    key = ("coords", q_len, k_len, causal, str(device), None if from_2d else id(mask),
           None if shift is None else tuple(shift.flatten().tolist()))
    hit = state.memo.get(key)
    if hit is not None and (from_2d or hit[0] is mask):
        return hit[1]
    if from_2d:
        pad = pad.to(device)
        pos = (pad.long().cumsum(-1) - 1).clamp(min=0)
        pad, pos = pad[:, pad.shape[-1] - k_len:], pos[:, pos.shape[-1] - k_len:]
    else:
        pad = _visible_keys(mask)
        pos = None if pad is None else (pad.long().cumsum(-1) - 1).clamp(min=0)
        if shift is not None and bool((shift > 0).any()):  # older keys were dropped
            if pos is None:
                pos = torch.arange(k_len, device=device).expand(shift.shape[0], k_len)
                pad = torch.ones(shift.shape[0], k_len, dtype=torch.bool, device=device)
            pos = pos + (shift - (pos[:, -1:] - (k_len - 1)))
    offset = k_len - q_len
    if pad is None or (bool(pad.all()) and bool((pos == pos[:1]).all())):
        ids = None if pad is None else pos[0]
        coords = Seq1D(q_len, offset=offset, position_ids=ids, causal=causal, device=device)
    else:
        coords = Seq1D(q_len, offset=offset, position_ids=pos, padding_mask=pad, causal=causal)
    state.memo[key] = (mask, coords)  # the mask is kept alive: its id cannot be reused meanwhile
    state.share(coords)
    return coords


def _plain_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor | None, scaling: float | None, dropout: float,
                     causal: bool) -> Tensor:
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    is_causal = causal and attention_mask is None and query.shape[2] > 1
    if is_causal and key.shape[2] != query.shape[2]:  # SDPA's causal mask is top-left aligned
        q_idx = torch.arange(query.shape[2], device=query.device)[:, None] + key.shape[2] - query.shape[2]
        allowed = torch.arange(key.shape[2], device=query.device)[None, :] <= q_idx
        attention_mask = torch.where(allowed, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
        is_causal = False
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                          dropout_p=dropout if module.training else 0.0,
                                          is_causal=is_causal, scale=scaling)


def mmpe_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, scaling: float | None = None,
                           dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """HF `AttentionInterface` function adding the module's mmpe score encodings.

    Called by HF as `fn(module, query [b, n_h, q, d], key [b, n_kv, k, d], value, attention_mask,
    scaling=..., dropout=..., **kwargs)`; returns `(out [b, q, n_h, d], probs | None)`.

    * Positions: a `Sequence` whose queries are the last `q` of the `k` keys (the cache
      offset), with the real tokens of each example numbered from 0 — read from the model call's
      2D `attention_mask` (captured by [`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings]' hook); a static cache's
      unfilled slots are dropped.
    * Mask: HF's `attention_mask` (boolean, True = attend, or additive float), or HF's causal
      mask when it is None.
    * Grouped-query heads: `key`/`value` are repeated to `n_h` heads
      (`module.num_key_value_groups`).
    * Logit scale: HF's `scaling` unless an encoding prescribes its own (DeBERTa,
      Transformer-XL).

    A module without encodings (cross-attention, or a model not prepared by
    [`apply_score_encodings`][mmpe.integrations.transformers.apply_score_encodings]) gets plain SDPA attention.
    """
    link: _Link | None = getattr(module, "_mmpe_link", None)
    causal = _is_causal(module, kwargs)
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if link is None or (not link.scores and link.kernel is None):
        out = _plain_attention(module, query, key, value, attention_mask, scaling, dropout, causal)
        return out.transpose(1, 2).contiguous(), None

    state = link.state
    b, n_h, q_len, head_dim = query.shape
    k_len = _key_count(state, attention_mask, q_len, key.shape[2], kwargs.get("position_ids"))
    if k_len != key.shape[2]:
        key, value = key[:, :, :k_len], value[:, :, :k_len]
        if attention_mask is not None:
            attention_mask = attention_mask[..., :k_len]
    coords = _coordinates(state, attention_mask, q_len, k_len, causal, query.device,
                          kwargs.get("position_ids"))
    allowed, additive = _hf_mask(attention_mask, causal, q_len, k_len, query.device)
    ctx = _checked(link.scores, AttentionCall(coords, n_h, head_dim, b, None, query, key, value))
    scale = next((s for e in link.scores if (s := e.softmax_scale(head_dim)) is not None),
                 scaling if scaling is not None else head_dim ** -0.5)
    p = dropout if module.training else 0.0
    if not _needs_math(state, link):
        out = _sdpa(link.scores, ctx, scale, allowed, additive, p)
        return out.transpose(1, 2).contiguous(), None
    # HF's eager attention: the math route of mmpe's own layers, with HF's mask and dropout
    out, probs = run_math(link.scores, link.kernel, ctx, scale, mask=additive, allowed=allowed,
                          dropout=p, return_probs=True)
    return out.transpose(1, 2).contiguous(), None if probs is None else probs.to(query.dtype)


def _hf_mask(attention_mask: Tensor | None, causal: bool, q_len: int, k_len: int,
             device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """`(allowed, additive)`: HF's boolean mask (True = attend) or its additive float mask;
    without one, a causal call's mask by slot (key j ≤ the query's own slot)."""
    if attention_mask is None:
        if causal and (q_len > 1 or k_len > q_len):
            slot = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
            return (torch.arange(k_len, device=device)[None, :] <= slot)[None, None], None
        return None, None
    if attention_mask.dtype == torch.bool:
        return attention_mask, None
    return None, attention_mask


def _checked(scores: Sequence[ScoreEncoding], ctx: AttentionCall) -> AttentionCall:
    """`ctx` marked checked, after each term's context and the call's work are checked once,
    as mmpe's layers check them (the paths and forms then trust it)."""
    for enc in scores:
        enc.check_call(ctx)
    b, n_h, n_q, h_d = ctx.q.shape
    names = [getattr(e, "registry_name", type(e).__name__) for e in scores]
    check_attention_work(", ".join(names) or "mmpe_attention_forward", batch=b, num_heads=n_h,
                         num_queries=n_q, num_keys=ctx.k.shape[2], head_dim=h_d,
                         device=ctx.q.device)
    return replace(ctx, checked=True)


def _needs_math(state: _ModelState, link: _Link) -> bool:
    """Explicit scores: asked for, a kernel, a rescaling term or one that reads the weights."""
    return (state.route == "math" or link.kernel is not None
            or any(not e.additive or e.needs_probs for e in link.scores))


def _sdpa(scores: Sequence[ScoreEncoding], ctx: AttentionCall, scale: float,
          allowed: Tensor | None, additive: Tensor | None, p: float) -> Tensor:
    """SDPA with the dense bias (the door's sum on a checked context, `summed_bias`, as the
    layers' dense route) plus HF's mask; masked pairs at the dtype's minimum, not `-inf`, so a
    row HF masks entirely (a padding query) stays finite."""
    dtype = ctx.q.dtype
    bias = summed_bias(scores, ctx).to(dtype)
    if additive is not None:
        bias = bias + additive
    if allowed is not None:
        bias = bias.masked_fill(~allowed, torch.finfo(dtype).min)
    return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, attn_mask=bias, dropout_p=p,
                                          scale=scale)


def _mask_function() -> Callable[..., Any]:
    from transformers.masking_utils import sdpa_mask

    def mmpe_mask(*args: Any, **kwargs: Any) -> Tensor | None:
        """HF's boolean SDPA mask (True = attend); None where HF would use SDPA's causal flag
        or no mask at all (no padding)."""
        return sdpa_mask(*args, **kwargs)

    return mmpe_mask


def register_attention(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register mmpe's attention and mask functions with HF transformers.

    Register [`mmpe_attention_forward`][mmpe.integrations.transformers.mmpe_attention_forward] and a boolean mask function under `name` with
    `transformers.AttentionInterface` and `AttentionMaskInterface` (idempotent).

    Without a registered mask function HF passes *no* mask to a custom attention function
    (padding would be lost); this registers HF's own boolean SDPA mask for it.
    """
    require("transformers", "mmpe.integrations.transformers")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, mmpe_attention_forward)
    AttentionMaskInterface.register(name, _mask_function())
    return name


def _default_is_attention(module: nn.Module) -> bool:
    name = type(module).__name__
    return (hasattr(module, "scaling") and hasattr(module, "config") and "Cross" not in name
            and not getattr(module, "is_cross_attention", False))


def _probe(encodings: Sequence[Encoding], num_heads: int, head_dim: int, causal: bool) -> None:
    """Evaluate every encoding once on a 3-token sequence: refuse at apply time what the attention
    interface cannot run (coordinates it does not provide, the layer input x)."""
    coords = Seq1D(3, causal=causal)
    q, k, v = (torch.zeros(1, num_heads, 3, head_dim) for _ in range(3))
    ctx = AttentionCall(coords, num_heads, head_dim, 1, None, q, k, v)
    for enc in encodings:
        name = getattr(enc, "registry_name", type(enc).__name__)
        try:
            with torch.no_grad():
                if isinstance(enc, ScoreEncoding):
                    enc.check_call(ctx)
                    enc.score_mod(ctx)(torch.zeros(1, num_heads, 3, 3), *index_grid(1, num_heads, 3, 3))
                elif isinstance(enc, KernelEncoding):  # PaTH reads x as well
                    scores = torch.zeros(1, num_heads, 3, 3).masked_fill(
                        ~torch.ones(3, 3, dtype=torch.bool).tril(), float("-inf"))
                    enc.attend(scores, v, ctx)
        except (TypeError, ValueError) as err:
            if "layer input x" in str(err) or "layer's x" in str(err):
                raise ValueError(f"apply_score_encodings: {name} reads the layer input x, which HF's "
                                 "attention interface does not pass; it cannot be added this way") from err
            raise type(err)(f"apply_score_encodings: {name} cannot run on the HF model's token "
                            f"sequence ({'causal' if causal else 'bidirectional'}): {err}") from err


def apply_score_encodings(
    model: nn.Module,
    encodings: EncodingSpec | Sequence[EncodingSpec],
    *,
    share_encodings: bool = True,
    drop_rope: bool = False,
    route: str = "auto",
    is_attention: Callable[[nn.Module], bool] | None = None,
    **options: Any,
) -> nn.Module:
    """Add mmpe score encodings to an HF model through its attention interface (in place).

    Args:
        model: an HF `PreTrainedModel` whose attention modules call
            `ALL_ATTENTION_FUNCTIONS` (Llama, Qwen2, Mistral, BERT … in transformers ≥ 4.48).
        encodings: registry names, config dicts or built score (or kernel) encodings: `alibi`,
            `t5`, `fire`, `kerple_log` … Each is built with the model's `num_heads`,
            `head_dim`, `d_model` and `max_len` (`max_position_embeddings`).
        share_encodings: one set for all layers in `model.mmpe_encodings` (default), or one
            per layer in each attention module's `mmpe_encodings`.
        drop_rope: replace `rotary_emb` by a module that rotates nothing (NoPE + the score
            encodings, e.g. ALiBi alone as in BLOOM/MPT).
        route: `"auto"` (SDPA with the additive bias; explicit scores for rescaling or
            value-side terms) or `"math"` (always explicit scores; returns the probabilities).
        is_attention: which submodules are self-attention layers; default: modules with
            `scaling` and `config` attributes that are not cross-attention.
        **options: extra build options for every encoding built here.

    Returns:
        `model`, with `config._attn_implementation == "mmpe"`.

    Raises:
        TypeError: a rotary or input encoding (use [`replace_rotary`][mmpe.integrations.transformers.replace_rotary] for RoPE); an encoding
            whose coordinates needs a token sequence cannot meet (`swin`, `graphormer`);
            a model that is not an HF transformers model.
        ValueError: a model already prepared, no attention module found, an encoding that reads
            the layer input (FoX), more than one kernel encoding, an unknown `route`.
    """
    if route not in ("auto", "math"):
        raise ValueError(f"apply_score_encodings: route must be 'auto' or 'math', got {route!r}")
    if hasattr(model, "_mmpe_state"):
        raise ValueError("apply_score_encodings: this model already has mmpe encodings")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise TypeError(f"apply_score_encodings: model must be an HF transformers model (with a "
                        f"config giving num_attention_heads), got {type(model).__name__}")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    context = {"d_model": config.hidden_size, "num_heads": num_heads, "head_dim": head_dim}
    if isinstance(getattr(config, "max_position_embeddings", None), int):
        context["max_len"] = config.max_position_embeddings
    specs = [encodings] if isinstance(encodings, str | Mapping | Encoding) else list(encodings)

    def make(spec: EncodingSpec) -> Encoding:
        if isinstance(spec, Encoding):
            return spec
        if options:
            spec = {"name": spec, **options} if isinstance(spec, str) else {**spec, **options}
        return build(spec, context=context)

    check = is_attention or _default_is_attention
    modules = [m for m in model.modules() if check(m)]
    if not modules:
        raise ValueError(f"apply_score_encodings: found no attention module in {type(model).__name__}")
    causal = any(getattr(m, "is_causal", False) for m in modules) and getattr(config, "is_causal", True) is not False
    if not share_encodings and any(isinstance(s, Encoding) for s in specs):
        raise ValueError("apply_score_encodings: share_encodings=False needs names or configs")
    per_layer = [[make(s) for s in specs]] if share_encodings else [[make(s) for s in specs] for _ in modules]
    for encs in per_layer[:1]:
        for enc in encs:
            if not isinstance(enc, (ScoreEncoding, KernelEncoding)):
                raise TypeError(f"apply_score_encodings: {type(enc).__name__} is not a score or kernel "
                                "encoding (RoPE variants: replace_rotary; input encodings belong to "
                                "the embeddings)")
        if sum(isinstance(e, KernelEncoding) for e in encs) > 1:
            raise ValueError("apply_score_encodings: at most one kernel encoding")
        _probe(encs, num_heads, head_dim, causal)

    state = _ModelState(route)
    if share_encodings:
        model.mmpe_encodings = nn.ModuleList(per_layer[0])
    for i, module in enumerate(modules):
        encs = per_layer[0] if share_encodings else per_layer[i]
        if not share_encodings:
            module.mmpe_encodings = nn.ModuleList(encs)
        scores = [e for e in encs if isinstance(e, ScoreEncoding)]
        kernel = next((e for e in encs if isinstance(e, KernelEncoding)), None)
        object.__setattr__(module, "_mmpe_link", _Link(state, scores, kernel))
    object.__setattr__(model, "_mmpe_state", state)
    hooked = [model]
    base = getattr(model, "base_model", model)
    if base is not model:
        hooked.append(base)
    for m in hooked:
        params = list(inspect.signature(m.forward).parameters)
        index = params.index("attention_mask") if "attention_mask" in params else None
        m.register_forward_pre_hook(_Capture(state, index), with_kwargs=True)
        m.register_forward_hook(_EndForward(state), always_call=True)
    if drop_rope:
        rotary_dim = int(head_dim * (getattr(config, "partial_rotary_factor", None) or 1.0))
        for parent, name, _ in _rotary_modules(model):
            setattr(parent, name, _NoRotary(rotary_dim))
    name = register_attention()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - very old transformers
        config._attn_implementation = name
    return model
