"""Put any registered mmpe encoding into a timm vision transformer with one call.

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

Tested models (`pretrained=False`, tiny sizes; `tests/integrations/test_timm_integration.py`), by timm
class, with what `apply_encoding` replaces:

* `vit_tiny_patch16_224` (also with register tokens) — `VisionTransformer`: `pos_embed`.
* `deit_tiny_distilled_patch16_224` — `VisionTransformerDistilled`: `pos_embed` (cls and
  distillation tokens are the two prefix tokens).
* `vit_small_patch16_rope_224`, `vit_small_patch16_rope_mixed_224` — `Eva` (RoPE-ViT):
  the built-in RoPE (`model.rope`). For the axial one, `"rope_axial"` is built with the
  model's convention (see below) and the model's output equals timm's — tested with every layer
  scale set to 1 and weights of std 0.3, so that attention and the position encoding change the
  output (timm's own init, layer scale 1e-5, hides them: there any RoPE, or none, matches): max
  difference 2.3e-6, relative 3e-7, also with `rope_rotate_half=True`, `"ij"` indexing with
  another temperature, register tokens, and at 3×5 / 5×3 grids; mmpe's default convention, the
  other axis order or no position encoding differ there by 0.4–0.6 relative. RoPE-Mixed's
  frequencies are learned per layer and random at init; `"rope_mixed"` draws its own, so
  only the kept RoPE (`keep_pos_embed=True`) is compared with timm for that model.
* `eva02_tiny_patch14_224` — `Eva` (EVA-02): `pos_embed` and the built-in RoPE. Not
  reproduced: the learned `pos_embed` is dropped, and EVA-02's RoPE rescales positions to
  `ref_feat_shape` (its pretraining grid), which mmpe's grids do not; `"rope_axial"` takes
  its frequencies, axis order and pair layout only.
* `beit_base_patch16_224` — `Beit`: each block's relative bias table (mmpe's `swin` with
  `prefix_tokens=1` is the same table, three prefix entries included).
* `swin_tiny_patch4_window7_224` — `SwinTransformer`: each window attention's bias table
  (`{"name": "swin", "prefix_bias": False}` is the same table).

What changes (ViT, DeiT, Eva, BEiT):

* The token embedding step is replaced (`model._pos_embed`, or BEiT's `forward_features`):
  the prefix tokens (cls, distillation, registers) are concatenated as timm does, a
  [`Grid`][mmpe.coords.grid.Grid] is built from the patch grid of *this* input (so
  `dynamic_img_size=True` keeps working) with the model's `num_prefix_tokens`, and the input
  encodings (`sincos`, `learned_grid`, `factorized` …) are added. timm's own position
  handling — `pos_embed`, Eva's `rope`, BEiT's relative bias tables — is removed unless
  `keep_pos_embed=True` (then it runs as in timm, before mmpe's encodings).
* Each block's `attn` becomes a [`TimmAttention`][mmpe.integrations.timm.TimmAttention] that reuses the timm module's
  projections and norms (`qkv` or `q_proj`/`k_proj`/`v_proj`, `q_bias`/`v_bias`,
  `q_norm`, `k_norm`, `norm`, `gate`, `proj`; same state_dict keys), applies the rotary
  encodings to `q`/`k` and runs the score encodings through mmpe's attention paths.
* Encodings live in `model.mmpe_encodings` (shared by all blocks) or, with
  `share_encodings=False`, in each block's `attn.encodings` — so
  `state_dict`/`load_state_dict` carry them.

Swin (windowed attention): each `WindowAttention` becomes a [`SwinWindowAttention`][mmpe.integrations.timm.SwinWindowAttention]
whose coordinates are the window (`Grid(window_size)`): the relative bias of `"swin"` over
the window is exactly Swin's own table (copy `attn.relative_position_bias_table` into
`attn.encodings[0].table` to convert a checkpoint), and `rope_axial`, `alibi`, `t5` …
act within windows. Only rotary and additive score encodings apply (no input encodings: Swin
has no token grid of fixed shape after patch merging); the shift mask is kept. Encodings are
built per block (the head count changes between stages) and, with `share_encodings`, shared
by the blocks of a stage.

Model-wide values reach the encodings that take them: `d_model` (embed dim), `num_heads`,
`head_dim`, `grid_shape` (the patch grid at `img_size`; a Swin window), `prefix_tokens`
(`num_prefix_tokens`), `num_axes` (2).

Eva's own axial RoPE convention: when `apply_encoding` replaces an `Eva`'s RoPE
(`keep_pos_embed=False`) and that RoPE is timm's `RotaryEmbeddingCat` in language mode
(`in_pixels=False`, integer cell positions), every `"rope_axial"` it builds (by name or
config, aliases included) takes the model's convention, read from `model.rope` by
[`rope_axial_options`][mmpe.integrations.timm.rope_axial_options]: `base` = its `temperature`, `grid_indexing` = its
`grid_indexing`, `interleaved` = `not rotate_half`. timm's RoPE-ViT
(`vit_*_patch16_rope_224`) is `base=100, grid_indexing="xy", interleaved=True` (the first
half of each head's rotary pairs turns with the column); mmpe's defaults are `10000`,
`"ij"` (rows first) and rotate-half pairs. Options in the spec or in `**options` win; a
built encoding is used as given. The model's RoPE is then reproduced (to float32 rounding)
when timm adds nothing to the integer grid: `grid_offset=0`, no `ref_feat_shape` and no
coordinate augmentation — as in the RoPE-ViTs (tested); EVA-02, the `*_rope_reg*_gap_256` and
the PE models rescale positions to their pretraining grid (PE also offsets them by 1), so
there the convention is shared but the rotations are not. Other timm RoPEs (`rope_mixed`,
`dinov3`, `mrope`) leave mmpe's defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mmpe._optional import require
from mmpe.attention import MultiHeadAttention
from mmpe.attention.forms import dense_bias
from mmpe.coords.grid import Grid
from mmpe.encodings.base import (
    AttentionCall,
    Encoding,
    InputEncoding,
    KernelEncoding,
    RotaryEncoding,
    ScoreEncoding,
)
from mmpe.registry import build, get

require("timm", "mmpe.integrations.timm")

EncodingSpec = str | Mapping[str, Any] | Encoding

#: attributes of timm attention modules reused by the replacements (state_dict keys unchanged).
_REUSED = ("qkv", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "norm", "gate", "proj", "proj_drop")


def _is_eva(model: nn.Module) -> bool:
    from timm.models.eva import Eva

    return isinstance(model, Eva)


def _is_beit(model: nn.Module) -> bool:
    from timm.models.beit import Beit

    return isinstance(model, Beit)


def _is_swin(model: nn.Module) -> bool:
    from timm.models.swin_transformer import SwinTransformer

    return isinstance(model, SwinTransformer)


#: timm model classes whose attention mmpe cannot take over, and why (refused by name).
UNSUPPORTED = {
    "VisionTransformerRelPos": "its blocks hand the attention a shared relative-position table "
                               "(shared_rel_pos) that mmpe's attention does not take",
    "Xcit": "cross-covariance attention mixes channels, not tokens: there are no token pairs "
            "for a position encoding to act on",
    "Cait": "its class-attention layers attend from the class token alone with their own "
            "attention modules",
}


def _check_supported(model: nn.Module) -> None:
    """Refuse a model class mmpe cannot adapt, by name, before touching it."""
    from timm.models.vision_transformer import VisionTransformer

    name = type(model).__name__
    if name in UNSUPPORTED:
        raise TypeError(f"apply_encoding: timm's {name} is not supported: {UNSUPPORTED[name]}. "
                        "Supported: VisionTransformer (ViT, DeiT), Eva, Beit, SwinTransformer")
    if not (isinstance(model, VisionTransformer) or _is_eva(model) or _is_beit(model)):
        raise TypeError(f"apply_encoding: model must be a timm VisionTransformer, Eva, Beit or "
                        f"SwinTransformer, got {name}")


class _GridState:
    """The grid of the current forward pass, shared by the patched model and its attentions."""

    def __init__(self, prefix_tokens: int, keep_pos_embed: bool = False) -> None:
        self.prefix_tokens = prefix_tokens
        self.keep_pos_embed = keep_pos_embed
        self.grid: Grid | None = None
        self._cache: dict[tuple[Any, ...], Grid] = {}

    def set(self, shape: tuple[int, ...], device: torch.device) -> Grid:
        key = (*shape, str(device))
        if key not in self._cache:
            self._cache[key] = Grid(shape, prefix_tokens=self.prefix_tokens, device=device)
        self.grid = self._cache[key]
        return self.grid


def _prefix_tokens(model: nn.Module, batch: int) -> list[Tensor]:
    """The prefix tokens in timm's order: cls, distillation (DeiT), registers."""
    out = []
    for name in ("cls_token", "dist_token", "reg_token"):
        token = getattr(model, name, None)
        if token is not None:
            out.append(token.expand(batch, -1, -1))
    return out


def _embed(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """Patch tokens → tokens with prefix, timm's kept position handling and mmpe input encodings.

    Returns the tokens and Eva's rotary embedding (None unless timm's RoPE is kept)."""
    state: _GridState = model.mmpe_grid_state
    if x.dim() == 4:  # dynamic_img_size: [b, H, W, C]
        shape = (x.shape[1], x.shape[2])
    else:
        shape = tuple(int(s) for s in model.patch_embed.grid_size)
    grid = state.set(shape, x.device)
    rope = None
    if state.keep_pos_embed and hasattr(type(model), "_pos_embed"):
        out = type(model)._pos_embed(model, x)  # timm's own: prefix tokens, pos_embed, Eva's rope
        x, rope = out if isinstance(out, tuple) else (out, None)
    else:
        if x.dim() == 4:
            x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = torch.cat([*_prefix_tokens(model, x.shape[0]), x], dim=1)
        if state.keep_pos_embed and getattr(model, "pos_embed", None) is not None:  # BEiT
            x = x + model.pos_embed
        x = model.pos_drop(x)
    grid.check_tokens(x)
    for enc in model.mmpe_encodings:
        if isinstance(enc, InputEncoding):
            x = enc.combine(x, grid)
    return x, rope


class _PosEmbed:
    """Replaces `model._pos_embed` (ViT, DeiT, Eva).

    A plain object holding the model (not a closure or a bound method), so `copy.deepcopy`
    (EMA) and pickling give a copy that refers to the copied model.
    """

    def __init__(self, model: nn.Module, returns_rope: bool) -> None:
        self.model, self.returns_rope = model, returns_rope

    def __call__(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor | None]:
        x, rope = _embed(self.model, x)
        return (x, rope) if self.returns_rope else x


class _BeitFeatures:
    """Replaces BEiT's `forward_features` (BEiT has no `_pos_embed` step to patch)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, x: Tensor) -> Tensor:
        model = self.model
        x, _ = _embed(model, model.patch_embed(x))
        shared = model.rel_pos_bias() if getattr(model, "rel_pos_bias", None) is not None else None
        for blk in model.blocks:
            x = blk(x, shared_rel_pos_bias=shared)
        return model.norm(x)


def _reuse(target: nn.Module, attn: nn.Module) -> None:
    """Take over the timm attention's projections, norms and qkv biases (same state_dict keys)."""
    for name in _REUSED:
        setattr(target, name, getattr(attn, name, None))
    for name in ("q_bias", "v_bias"):
        setattr(target, name, getattr(attn, name, None))
    k_bias = getattr(attn, "k_bias", None)
    if k_bias is not None:
        target.register_buffer("k_bias", k_bias, persistent=False)
    else:
        target.k_bias = None
    target.qkv_bias_separate = bool(getattr(attn, "qkv_bias_separate", False))


def _project(module: nn.Module, x: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """`q, k, v` `[b, n_h, n, h_d]` as timm's ViT / Eva / BEiT / Swin attention computes them."""
    if module.qkv is not None:
        qkv = module.qkv(x)
        if module.q_bias is not None:
            qkv = qkv + torch.cat((module.q_bias, module.k_bias, module.v_bias))
        return rearrange(qkv, "b s (three h d) -> three b h s d", three=3, h=num_heads)
    return tuple(rearrange(p(x), "b s (h d) -> b h s d", h=num_heads)
                 for p in (module.q_proj, module.k_proj, module.v_proj))


def _split(encodings: Sequence[Encoding]) -> tuple[list, list, list]:
    rotary = [e for e in encodings if isinstance(e, RotaryEncoding)]
    scores = [e for e in encodings if isinstance(e, ScoreEncoding)]
    kernels = [e for e in encodings if isinstance(e, KernelEncoding)]
    if len(kernels) > 1:
        raise ValueError(f"apply_encoding: at most one kernel encoding, got {len(kernels)}")
    return rotary, scores, kernels


class TimmAttention(MultiHeadAttention):
    """A timm attention with mmpe encodings.

    A timm ViT / Eva / BEiT attention with mmpe rotary/score/kernel encodings (replaces
    `block.attn`).

    Reuses the timm module's `qkv` (or `q_proj`/`k_proj`/`v_proj`), `q_bias`/`k_bias`/
    `v_bias`, `q_norm`, `k_norm`, `norm`, `gate`, `proj` and `proj_drop` so its
    state_dict keys are unchanged (plus `encodings.*` when the encodings are per layer). With
    `keep_pos_embed`, Eva's rotary embedding (`rope=`) is applied as in timm and BEiT's
    relative bias table is kept and added. Attention dropout of the timm module is not applied.

    Shapes: `forward(x [b, n, d], attn_mask=None, is_causal=False, rope=None,
    shared_rel_pos_bias=None) -> [b, n, d]`; the grid comes from the model's patched
    embedding step.

    Raises:
        ValueError: at forward, `attn_mask` or `is_causal` (grid coordinates carry no mask).
    """

    def __init__(self, attn: nn.Module, encodings: Sequence[Encoding], state: _GridState,
                 own_encodings: bool, route: str = "auto") -> None:
        nn.Module.__init__(self)  # not MultiHeadAttention.__init__: timm's projections are reused
        _reuse(self, attn)
        for name in ("q_norm", "k_norm", "norm", "proj_drop"):
            if getattr(self, name) is None:
                setattr(self, name, nn.Identity())
        self.num_heads = attn.num_heads
        self.head_dim = getattr(attn, "head_dim", None) or attn.proj.in_features // attn.num_heads
        self.d_model = attn.proj.out_features
        self.route = route
        self.dense_bias_bytes = None
        self.num_prefix_tokens = getattr(attn, "num_prefix_tokens", state.prefix_tokens)
        self.rotate_half = bool(getattr(attn, "rotate_half", False))
        self.relative_position_bias_table = None
        if state.keep_pos_embed and getattr(attn, "relative_position_bias_table", None) is not None:
            self.relative_position_bias_table = attn.relative_position_bias_table  # BEiT's own
            self.register_buffer("relative_position_index", attn.relative_position_index,
                                 persistent=False)
            self.window_size = attn.window_size
        rotary, scores, kernels = _split(encodings)
        if own_encodings:
            self.encodings = nn.ModuleList(encodings)
        # Plain lists (not submodules) when shared: the model owns them once, in mmpe_encodings.
        object.__setattr__(self, "rotary", rotary)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "kernel", kernels[0] if kernels else None)
        object.__setattr__(self, "_state", state)

    def _timm_bias(self) -> Tensor:
        """BEiT's relative position bias `[1, n_h, n, n]` (its `_get_rel_pos_bias`)."""
        n = self.window_size[0] * self.window_size[1] + 1
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                rope: Tensor | None = None, shared_rel_pos_bias: Tensor | None = None) -> Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("TimmAttention: attn_mask / is_causal are not supported with mmpe "
                             "encodings (grid coordinates carry no mask)")
        grid = self._state.grid
        if grid is None:
            raise RuntimeError("TimmAttention: no grid set; call the timm model, not the block")
        grid.check_tokens(x)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = _project(self, x, self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # Eva's own RoPE, kept (keep_pos_embed=True)
            from timm.layers import apply_rot_embed_cat

            npt = self.num_prefix_tokens
            q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=self.rotate_half)],
                          dim=2).type_as(v)
            k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=self.rotate_half)],
                          dim=2).type_as(v)
        for rotary in self.rotary:
            q, k = rotary(q, k, grid)
        ctx = AttentionCall(grid, self.num_heads, self.head_dim, x.shape[0], x, q, k, v)
        timm_bias = self._timm_bias() if self.relative_position_bias_table is not None else None
        if shared_rel_pos_bias is not None:
            timm_bias = shared_rel_pos_bias if timm_bias is None else timm_bias + shared_rel_pos_bias
        if timm_bias is None:
            out = self.attend(ctx)
        else:
            out = self._attend_with(ctx, timm_bias)
        out = self.norm(rearrange(out, "b h s d -> b s (h d)"))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))

    def _attend_with(self, ctx: AttentionCall, extra: Tensor) -> Tensor:
        """SDPA with timm's kept bias plus the additive mmpe terms."""
        if self.kernel is not None or any(not s.additive or s.needs_probs for s in self.scores):
            raise ValueError("TimmAttention: keep_pos_embed with BEiT's bias table needs additive "
                             "score encodings and the softmax")
        terms = dense_bias(self.scores, ctx)
        bias = extra if terms is None else extra + terms
        return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, attn_mask=bias.to(ctx.q.dtype),
                                              scale=self.head_dim ** -0.5)


class SwinWindowAttention(nn.Module):
    """timm's Swin `WindowAttention` with mmpe rotary and additive score encodings over the window.

    The coordinates of every window are `Grid(window_size)`; Swin's shift mask (`mask`
    `[n_w, N, N]`, 0 / −100) is added as timm does. Reuses `qkv`, `proj`, `proj_drop`;
    with `keep_pos_embed` also Swin's own table (`relative_position_bias_table`), added first.

    Shapes: `forward(x [n_w·b, N, C], mask=None) -> [n_w·b, N, C]` with `N` = window area.

    Raises:
        ValueError: at forward, `N` other than the window area.
    """

    def __init__(self, attn: nn.Module, encodings: Sequence[Encoding], keep_pos_embed: bool,
                 own_encodings: bool) -> None:
        super().__init__()
        _reuse(self, attn)
        self.num_heads = attn.num_heads
        self.head_dim = attn.proj.in_features // attn.num_heads
        self.scale = attn.scale
        self.window_size = tuple(attn.window_size)
        self.relative_position_bias_table = None
        if keep_pos_embed:
            self.relative_position_bias_table = attn.relative_position_bias_table
            self.register_buffer("relative_position_index", attn.relative_position_index,
                                 persistent=False)
        rotary, scores, kernels = _split(encodings)
        if kernels or any(not s.additive or s.needs_probs for s in scores):
            raise ValueError("apply_encoding: Swin windows take rotary and additive score "
                             "encodings (no kernel, rescaling or value-side terms)")
        if own_encodings:
            self.encodings = nn.ModuleList(encodings)
        object.__setattr__(self, "rotary", rotary)
        object.__setattr__(self, "scores", scores)
        self._grids: dict[tuple[Any, ...], Grid] = {}

    def set_window_size(self, window_size: tuple[int, int]) -> None:
        """Follow timm's `set_input_size`: the window grid changes, mmpe's table interpolates."""
        if self.relative_position_bias_table is not None and tuple(window_size) != self.window_size:
            raise ValueError("SwinWindowAttention: keep_pos_embed tables cannot change window size")
        self.window_size = tuple(window_size)

    def grid(self, device: torch.device) -> Grid:
        key = (*self.window_size, str(device))
        if key not in self._grids:
            self._grids[key] = Grid(self.window_size, device=device)
        return self._grids[key]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        b_, n, _ = x.shape
        if n != math.prod(self.window_size):
            raise ValueError(f"SwinWindowAttention: {n} tokens per window, expected "
                             f"{self.window_size[0]}×{self.window_size[1]}")
        grid = self.grid(x.device)
        q, k, v = _project(self, x, self.num_heads)
        for rotary in self.rotary:
            q, k = rotary(q, k, grid)
        ctx = AttentionCall(grid, self.num_heads, self.head_dim, b_, x, q, k, v)
        bias = None
        if self.relative_position_bias_table is not None:
            table = self.relative_position_bias_table[self.relative_position_index.view(-1)]
            bias = table.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        terms = dense_bias(self.scores, ctx)
        if terms is not None:
            bias = terms if bias is None else bias + terms
        if mask is not None:
            num_win = mask.shape[0]
            mask = mask.view(1, num_win, 1, n, n).expand(b_ // num_win, -1, self.num_heads, -1, -1)
            mask = mask.reshape(-1, self.num_heads, n, n)
            bias = mask if bias is None else bias + mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                             scale=self.scale)
        return self.proj_drop(self.proj(rearrange(out, "b h s d -> b s (h d)")))


def _specs(encodings: EncodingSpec | Sequence[EncodingSpec]) -> list[EncodingSpec]:
    return [encodings] if isinstance(encodings, str | Mapping | Encoding) else list(encodings)


def rope_axial_options(model: nn.Module) -> dict[str, Any]:
    """The `rope_axial` options that follow a timm `Eva`'s own axial RoPE convention.

    `{"base": temperature, "grid_indexing": "ij" | "xy", "interleaved": not rotate_half}`
    read from `model.rope` when it is timm's `RotaryEmbeddingCat` in language mode
    (`in_pixels=False`, integer cell positions); `{}` for any other model or RoPE
    (`rope_mixed`, `dinov3`, `mrope`, none, or a model whose RoPE `apply_encoding`
    already removed). With those options `rope_axial` equals the model's RoPE when the latter
    has `grid_offset=0`, no `ref_feat_shape` and no coordinate augmentation (timm's
    RoPE-ViT: `{"base": 100.0, "grid_indexing": "xy", "interleaved": True}`); otherwise it
    shares its frequencies, axis order and pair layout only (see the module docstring).
    """
    from timm.layers import RotaryEmbeddingCat

    rope = getattr(model, "rope", None)
    if (not isinstance(rope, RotaryEmbeddingCat) or rope.in_pixels
            or getattr(rope, "grid_type", "index") != "index"
            or getattr(rope, "grid_indexing", "ij") not in ("ij", "xy")):
        return {}
    return {"base": float(rope.temperature), "grid_indexing": rope.grid_indexing,
            "interleaved": not rope.rotate_half}


def _is_rope_axial(spec: EncodingSpec) -> bool:
    name = spec if isinstance(spec, str) else spec.get("name") if isinstance(spec, Mapping) else None
    try:
        return isinstance(name, str) and get(name).name == "rope_axial"
    except KeyError:  # an unknown name: build reports it
        return False


def _maker(context: dict[str, Any], options: Mapping[str, Any],
           rope_axial: Mapping[str, Any] | None = None):
    """`make(spec)`: builds a spec with the model's context; `rope_axial` holds the model's
    own RoPE convention, given to `rope_axial` specs under their options and `options`."""
    def make(spec: EncodingSpec) -> Encoding:
        if isinstance(spec, Encoding):
            return spec
        if rope_axial and _is_rope_axial(spec):
            spec = {**rope_axial, **({"name": spec} if isinstance(spec, str) else spec)}
        if options:
            spec = {"name": spec, **options} if isinstance(spec, str) else {**spec, **options}
        enc = build(spec, context=context)
        if not isinstance(enc, Encoding):
            raise TypeError(f"apply_encoding: {type(enc).__name__} is not an mmpe Encoding")
        return enc

    return make


def _apply_swin(model: nn.Module, specs: list[EncodingSpec], share_encodings: bool,
                keep_pos_embed: bool, options: Mapping[str, Any]) -> nn.Module:
    if any(isinstance(s, Encoding) for s in specs):
        raise ValueError("apply_encoding: Swin builds encodings per block (heads change between "
                         "stages); pass names or configs")
    stages = []
    for stage in model.layers:
        attns = [blk.attn for blk in stage.blocks]
        if not attns:
            continue
        a0 = attns[0]
        context = {"d_model": a0.proj.out_features, "num_heads": a0.num_heads,
                   "head_dim": a0.proj.in_features // a0.num_heads,
                   "grid_shape": tuple(a0.window_size), "prefix_tokens": 0, "num_axes": 2}
        make = _maker(context, options)
        shared = [make(spec) for spec in specs] if share_encodings else None
        if shared is not None and any(isinstance(e, InputEncoding) for e in shared):
            raise ValueError("apply_encoding: Swin takes no input encodings (its token grid shrinks "
                             "at every patch merging); use score or rotary encodings")
        stages.append(nn.ModuleList(shared or []))
        for blk in stage.blocks:
            encs = shared if shared is not None else [make(spec) for spec in specs]
            if any(isinstance(e, InputEncoding) for e in encs):
                raise ValueError("apply_encoding: Swin takes no input encodings (its token grid "
                                 "shrinks at every patch merging); use score or rotary encodings")
            blk.attn = SwinWindowAttention(blk.attn, encs, keep_pos_embed, own_encodings=shared is None)
    model.mmpe_encodings = nn.ModuleList(stages) if share_encodings else nn.ModuleList()
    model.mmpe_grid_state = _GridState(0, keep_pos_embed)
    return model


def apply_encoding(
    model: nn.Module,
    encodings: EncodingSpec | Sequence[EncodingSpec],
    *,
    share_encodings: bool = True,
    keep_pos_embed: bool = False,
    route: str = "auto",
    **options: Any,
) -> nn.Module:
    """Replace a timm vision transformer's position handling by mmpe encodings.

    Replace a timm vision transformer's position handling by mmpe encodings (in place; returns
    `model`).

    Args:
        model: a timm `VisionTransformer` (ViT, DeiT incl. distilled), `Eva` (EVA-02, the
            `vit_*_rope_*` RoPE-ViTs), `Beit` or `SwinTransformer`, created with
            `pretrained=False` or loaded. See the module docstring for the tested list.
        encodings: one or several registry names, config dicts or built encodings (any hook;
            Swin: rotary and additive score encodings).
        share_encodings: one set of attention encodings for all blocks (default; Swin: per
            stage), or one per block (RoPE-Mixed's per-layer frequencies; Swin's own layout).
        keep_pos_embed: keep timm's own position handling (learned `pos_embed`, Eva's RoPE,
            BEiT/Swin relative bias tables) and add mmpe's on top; default drops it.
        route: mmpe attention path (`"auto"`, `"sdpa"`, `"flex"`, `"math"`).
        **options: extra build options for every encoding built here (e.g. `base=100`).
            Replacing an `Eva`'s axial RoPE, `"rope_axial"` specs first take the model's
            `base`/`grid_indexing`/`interleaved` ([`rope_axial_options`][mmpe.integrations.timm.rope_axial_options]); a spec's
            own options and these override them.

    Raises:
        TypeError: not one of the supported timm model classes (`VisionTransformerRelPos`,
            XCiT and CaiT are refused by name, saying why), blocks whose `attn` does not
            project with `qkv` or `q_proj`/`k_proj`/`v_proj`; an encoding of an unknown hook.
        ValueError: a patch-dropout model (tokens dropped at random have no fixed grid), a model
            that already went through `apply_encoding`, `share_encodings=False` with an
            already built attention encoding; for Swin, input encodings, kernels or rescaling
            score encodings.
    """
    if hasattr(model, "mmpe_grid_state"):
        raise ValueError("apply_encoding: this model already has mmpe encodings; create a fresh "
                         "timm model to change them")
    specs = _specs(encodings)
    if _is_swin(model):
        return _apply_swin(model, specs, share_encodings, keep_pos_embed, options)
    _check_supported(model)
    for attr in ("patch_embed", "blocks", "num_prefix_tokens"):
        if not hasattr(model, attr):
            raise TypeError(f"apply_encoding: model must be a timm VisionTransformer, Eva, Beit or "
                            f"SwinTransformer (missing {attr!r}), got {type(model).__name__}")
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        fused = getattr(attn, "qkv", None) is not None
        split = all(getattr(attn, a, None) is not None for a in ("q_proj", "k_proj", "v_proj"))
        if not (hasattr(attn, "num_heads") and hasattr(attn, "proj") and (fused or split)):
            raise TypeError(f"apply_encoding: block {i} has {type(attn).__name__}; a timm attention "
                            "with qkv (or q_proj/k_proj/v_proj), num_heads and proj is required")
    if getattr(model, "patch_drop", None) is not None and not isinstance(model.patch_drop, nn.Identity):
        raise ValueError("apply_encoding: patch dropout (patch_drop_rate > 0) drops grid tokens; "
                         "create the model with patch_drop_rate=0")
    eva, beit = _is_eva(model), _is_beit(model)
    attn0 = model.blocks[0].attn
    head_dim = getattr(attn0, "head_dim", None) or attn0.proj.in_features // attn0.num_heads
    grid_shape = tuple(int(s) for s in model.patch_embed.grid_size)
    context = {"d_model": model.embed_dim, "num_heads": attn0.num_heads,
               "head_dim": head_dim, "grid_shape": grid_shape,
               "prefix_tokens": model.num_prefix_tokens, "num_axes": 2}
    # Replacing Eva's axial RoPE: rope_axial follows its convention (read before it is dropped).
    convention = rope_axial_options(model) if eva and not keep_pos_embed else {}
    make = _maker(context, options, convention)
    built = [make(s) for s in specs]
    # An encoding the patch grid cannot carry (rope_yarn needs a 1D sequence) is refused here,
    # before the model changes; it used to fail at the first forward.
    patches = Grid(grid_shape, prefix_tokens=model.num_prefix_tokens)
    for enc in built:
        try:
            enc.check_coords(patches)
        except (TypeError, ValueError) as err:
            raise type(err)(f"apply_encoding: {err}") from err
    inputs = [e for e in built if isinstance(e, InputEncoding)]
    attn_specs = [(s, e) for s, e in zip(specs, built, strict=True) if not isinstance(e, InputEncoding)]
    if not share_encodings and any(isinstance(s, Encoding) for s, _ in attn_specs):
        raise ValueError("apply_encoding: share_encodings=False needs names or configs "
                         "(a built encoding cannot be copied per block)")

    state = _GridState(model.num_prefix_tokens, keep_pos_embed)
    model.mmpe_encodings = nn.ModuleList(inputs + ([e for _, e in attn_specs] if share_encodings else []))
    # BEiT's bias tables live in its attention modules: dropping them replaces the attention.
    replace_attn = bool(attn_specs) or (not keep_pos_embed and beit and getattr(
        attn0, "relative_position_bias_table", None) is not None)
    if replace_attn:
        for i, block in enumerate(model.blocks):
            layer = ([e for _, e in attn_specs] if share_encodings or i == 0
                     else [make(s) for s, _ in attn_specs])
            block.attn = TimmAttention(block.attn, layer, state, own_encodings=not share_encodings,
                                       route=route)

    if not keep_pos_embed:
        if getattr(model, "pos_embed", None) is not None:
            model.pos_embed = None
        if eva:
            model.rope = None
        if beit:
            model.rel_pos_bias = None
    model.mmpe_grid_state = state
    if beit:
        model.forward_features = _BeitFeatures(model)
    else:
        model._pos_embed = _PosEmbed(model, returns_rope=eva)
    return model
