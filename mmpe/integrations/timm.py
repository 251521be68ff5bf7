"""Put any registered mmpe encoding into a timm ``VisionTransformer`` with one call.

    >>> import timm, torch
    >>> from mmpe.integrations.timm import apply_encoding
    >>> model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64,
    ...                           num_classes=10, dynamic_img_size=True)
    >>> model = apply_encoding(model, "rope_axial")        # or "swin", "learned_grid", ...
    >>> model(torch.randn(2, 3, 64, 64)).shape
    torch.Size([2, 10])
    >>> model(torch.randn(2, 3, 96, 128)).shape             # another resolution: a 6x8 grid
    torch.Size([2, 10])
    >>> state = model.state_dict()
    >>> "pos_embed" in state, "mmpe_encodings.0.head_dim" in state
    (False, False)

What changes:

* ``model._pos_embed`` is replaced: it concatenates the cls/register tokens as timm does,
  builds a :class:`~mmpe.coords.Grid` from the patch grid of *this* input (so
  ``dynamic_img_size=True`` keeps working: the grid follows the image size) with the model's
  ``num_prefix_tokens``, and adds the input encodings (``sincos``, ``learned_grid``,
  ``factorized`` …). timm's ``pos_embed`` parameter is removed unless ``keep_pos_embed``.
* Each block's ``attn`` (timm ``Attention``) becomes a :class:`TimmAttention` that reuses its
  ``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``proj`` modules (same state_dict keys), applies
  the rotary encodings to ``q``/``k`` and runs the score encodings through mmpe's
  attention paths (SDPA with the bias on CPU, FlexAttention on CUDA).
* Encodings live in ``model.mmpe_encodings`` (shared by all blocks) or, with
  ``share_encodings=False``, in each block's ``attn.encodings`` (RoPE-Mixed learns
  frequencies per layer) — so ``state_dict``/``load_state_dict`` carry them.

Model-wide values reach the encodings that take them: ``d_model`` (embed dim), ``num_heads``,
``head_dim``, ``grid_shape`` (the patch grid at ``img_size``), ``prefix_tokens``
(``num_prefix_tokens``), ``num_axes`` (2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from mmpe.attention import MultiHeadAttention
from mmpe.coords.grid import Grid
from mmpe.encodings.base import (
    Encoding,
    InputEncoding,
    KernelEncoding,
    RotaryEncoding,
    ScoreEncoding,
)
from mmpe.registry import build

EncodingSpec = str | Mapping[str, Any] | Encoding


class _PosEmbed:
    """Replaces ``model._pos_embed``: timm's own, then the grid of this input and mmpe's input encodings.

    A plain object holding the model (not a closure or a bound method), so ``copy.deepcopy``
    (EMA) and pickling give a copy that refers to the copied model.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, x: Tensor) -> Tensor:
        model = self.model
        if x.dim() == 4:  # dynamic_img_size: [b, H, W, C]
            shape = (x.shape[1], x.shape[2])
        else:
            shape = tuple(int(s) for s in model.patch_embed.grid_size)
        grid = model.mmpe_grid_state.set(shape, x.device)
        x = type(model)._pos_embed(model, x)  # prefix tokens (+ timm's pos_embed when kept)
        grid.check_tokens(x)
        for enc in model.mmpe_encodings:
            if isinstance(enc, InputEncoding):
                x = enc.combine(x, grid)
        return x


class _GridState:
    """The grid of the current forward pass, shared by the patched model and its attentions."""

    def __init__(self, prefix_tokens: int) -> None:
        self.prefix_tokens = prefix_tokens
        self.grid: Grid | None = None
        self._cache: dict[tuple[int, ...], Grid] = {}

    def set(self, shape: tuple[int, ...], device: torch.device) -> Grid:
        key = (*shape, str(device))
        if key not in self._cache:
            self._cache[key] = Grid(shape, prefix_tokens=self.prefix_tokens, device=device)
        self.grid = self._cache[key]
        return self.grid


class TimmAttention(MultiHeadAttention):
    """timm ``Attention`` with mmpe rotary/score/kernel encodings (replaces ``block.attn``).

    Reuses the timm module's ``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``, ``proj`` and
    ``proj_drop`` so its state_dict keys are unchanged (plus ``encodings.*`` when the encodings
    are per layer). Attention dropout of the timm module is not applied.

    Shapes: ``forward(x [b, n, d], attn_mask=None, is_causal=False) -> [b, n, d]``; the grid
    comes from the model's patched ``_pos_embed``.
    """

    def __init__(self, attn: nn.Module, encodings: Sequence[Encoding], state: _GridState,
                 own_encodings: bool, backend: str = "auto") -> None:
        nn.Module.__init__(self)  # not MultiHeadAttention.__init__: timm's projections are reused
        for name in ("qkv", "q_norm", "k_norm", "norm", "proj", "proj_drop"):
            setattr(self, name, getattr(attn, name))
        self.gate = getattr(attn, "gate", None)
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.d_model = attn.qkv.in_features
        self.backend = backend
        rotary = [e for e in encodings if isinstance(e, RotaryEncoding)]
        scores = [e for e in encodings if isinstance(e, ScoreEncoding)]
        kernels = [e for e in encodings if isinstance(e, KernelEncoding)]
        if len(kernels) > 1:
            raise ValueError(f"apply_encoding: at most one kernel encoding, got {len(kernels)}")
        if own_encodings:
            self.encodings = nn.ModuleList(encodings)
        # Plain lists (not submodules) when shared: the model owns them once, in mmpe_encodings.
        object.__setattr__(self, "rotary", rotary)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "kernel", kernels[0] if kernels else None)
        object.__setattr__(self, "_state", state)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("TimmAttention: attn_mask / is_causal are not supported with mmpe "
                             "encodings (grid coordinates carry no mask)")
        grid = self._state.grid
        if grid is None:
            raise RuntimeError("TimmAttention: no grid set; call the timm model, not the block")
        grid.check_tokens(x)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = rearrange(self.qkv(x), "b s (three h d) -> three b h s d", three=3, h=self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        for rotary in self.rotary:
            q, k = rotary(q, k, grid)
        from mmpe.encodings.base import AttentionContext

        ctx = AttentionContext(grid, self.num_heads, self.head_dim, x.shape[0], x, q, k, v)
        out = rearrange(self.attend(ctx), "b h s d -> b s (h d)")
        out = self.norm(out)
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


def apply_encoding(
    model: nn.Module,
    encodings: EncodingSpec | Sequence[EncodingSpec],
    *,
    share_encodings: bool = True,
    keep_pos_embed: bool = False,
    backend: str = "auto",
    **options: Any,
) -> nn.Module:
    """Replace a timm ViT's position handling by mmpe encodings (in place; returns ``model``).

    Args:
        model: a timm ``VisionTransformer`` (``timm.create_model("vit_...", pretrained=False)``),
            with timm's standard ``Attention`` in its blocks.
        encodings: one or several registry names, config dicts or built encodings (any hook).
        share_encodings: one set of attention encodings for all blocks (default), or one per
            block (built per block from names/configs; RoPE-Mixed's per-layer frequencies).
        keep_pos_embed: keep timm's own ``pos_embed`` (e.g. learned APE + RoPE); default drops it.
        backend: mmpe attention path (``"auto"``, ``"sdpa"``, ``"flex"``, ``"math"``).
        **options: extra build options for every encoding built here (e.g. ``base=100``).

    Raises:
        TypeError: not a timm VisionTransformer, or blocks whose ``attn`` is not timm's fused-qkv
            ``Attention``; an encoding of an unknown hook.
        ValueError: a patch-dropout model (tokens dropped at random have no fixed grid), a
            model that already went through ``apply_encoding``,
            ``share_encodings=False`` with an already built attention encoding.
    """
    for attr in ("patch_embed", "blocks", "_pos_embed", "num_prefix_tokens"):
        if not hasattr(model, attr):
            raise TypeError(f"apply_encoding: model must be a timm VisionTransformer "
                            f"(missing {attr!r}), got {type(model).__name__}")
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if not all(hasattr(attn, a) for a in ("qkv", "num_heads", "head_dim", "proj")) or attn.qkv is None:
            raise TypeError(f"apply_encoding: block {i} has {type(attn).__name__}; timm's "
                            "fused-qkv Attention is required")
    if hasattr(model, "mmpe_grid_state"):
        raise ValueError("apply_encoding: this model already has mmpe encodings; create a fresh "
                         "timm model to change them")
    if not isinstance(model.patch_drop, nn.Identity):
        raise ValueError("apply_encoding: patch dropout (patch_drop_rate > 0) drops grid tokens; "
                         "create the model with patch_drop_rate=0")
    specs = [encodings] if isinstance(encodings, str | Mapping | Encoding) else list(encodings)
    attn0 = model.blocks[0].attn
    grid_shape = tuple(int(s) for s in model.patch_embed.grid_size)
    context = {"d_model": model.embed_dim, "num_heads": attn0.num_heads,
               "head_dim": attn0.head_dim, "grid_shape": grid_shape,
               "prefix_tokens": model.num_prefix_tokens, "num_axes": 2}

    def make(spec: EncodingSpec) -> Encoding:
        if isinstance(spec, Encoding):
            return spec
        if options:
            spec = {"name": spec, **options} if isinstance(spec, str) else {**spec, **options}
        return build(spec, context=context)

    built = [make(s) for s in specs]
    for enc in built:
        if not isinstance(enc, Encoding):
            raise TypeError(f"apply_encoding: {type(enc).__name__} is not an mmpe Encoding")
    inputs = [e for e in built if isinstance(e, InputEncoding)]
    attn_specs = [(s, e) for s, e in zip(specs, built, strict=True) if not isinstance(e, InputEncoding)]
    if not share_encodings and any(isinstance(s, Encoding) for s, _ in attn_specs):
        raise ValueError("apply_encoding: share_encodings=False needs names or configs "
                         "(a built encoding cannot be copied per block)")

    state = _GridState(model.num_prefix_tokens)
    model.mmpe_encodings = nn.ModuleList(inputs + ([e for _, e in attn_specs] if share_encodings else []))
    if attn_specs:
        for i, block in enumerate(model.blocks):
            layer = ([e for _, e in attn_specs] if share_encodings or i == 0
                     else [make(s) for s, _ in attn_specs])
            block.attn = TimmAttention(block.attn, layer, state, own_encodings=not share_encodings,
                                       backend=backend)

    if not keep_pos_embed and getattr(model, "pos_embed", None) is not None:
        model.pos_embed = None
    model.mmpe_grid_state = state
    model._pos_embed = _PosEmbed(model)
    return model
