"""The rotary swap: HF's rotary modules replaced by one with float64 phases.

[`HFRotary`][mmpe.integrations.transformers.HFRotary] returns what HF's `rotary_emb` returns
from an mmpe rotary encoding; [`replace_rotary`][mmpe.integrations.transformers.replace_rotary]
puts it into a model. `_NoRotary` (rotate nothing) is what `apply_score_encodings(...,
drop_rope=True)` puts there instead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.encodings.rope import RoPE
from mmpe.integrations.transformers.rope_config import ROPE_TYPES, from_hf_rope

__all__ = ["HFRotary", "replace_rotary"]


class HFRotary(nn.Module):
    """Drop-in for HF's `LlamaRotaryEmbedding` from an mmpe rotary encoding.

    Drop-in for HF's `LlamaRotaryEmbedding` (and its copies in Qwen2, Mistral …) from an mmpe
    rotary encoding, with float64 phases.

    `forward(x, position_ids) -> (cos, sin)`, each `[b, s, rotary_dim]` (the two halves
    equal, as HF's `rotate_half` expects) in `x.dtype`: `cos(m·θ_i)·a` and `sin(m·θ_i)·a`
    with `θ` the encoding's [`inv_freq`][mmpe.encodings.rope.RoPE.inv_freq] at a length `L` and
    `a` its `attention_scaling`. LongRoPE (and every static scaling) uses ``L =
    max(position_ids) + 1` of the call. Dynamic NTK keeps HF's state (`stateful=True`): `L``
    is the longest length seen so far, grown when a call is longer, and reset to the original
    context when a call falls back within it while the longest seen is beyond it
    (`transformers.modeling_rope_utils.dynamic_rope_update`); `stateful=False` uses each
    call's own length instead, and [`reset`][mmpe.integrations.transformers.HFRotary.reset] forgets the lengths seen. The phase `m·θ` is formed in float64 and reduced modulo 2π
    before the cosine, so it stays exact at positions where HF's float32 `m·θ` drifts.

    The encoding is held as a plain attribute, not a submodule: the model's `state_dict` is
    unchanged (HF's rotary module holds only non-persistent buffers).

    Raises:
        TypeError: `encoding` not an mmpe [`RoPE`][mmpe.encodings.rope.RoPE].
        ValueError: interleaved pairs; at call, `position_ids` not `[b, s]` integers.
    """

    def __init__(self, encoding: RoPE, stateful: bool = True) -> None:
        super().__init__()
        if not isinstance(encoding, RoPE):
            raise TypeError(f"HFRotary: encoding must be an mmpe RoPE (rope, rope_yarn …), got "
                            f"{type(encoding).__name__}")
        if encoding.interleaved:
            raise ValueError("HFRotary: HF models rotate halves; build the encoding with "
                             "interleaved=False")
        object.__setattr__(self, "encoding", encoding)
        self.rope_type = next((t for t, n in ROPE_TYPES.items()
                               if n == getattr(encoding, "registry_name", "")), "default")
        self.stateful = bool(stateful)
        self.reset()

    def reset(self) -> None:
        """Forget the lengths seen (dynamic NTK starts again from the original context)."""
        self.max_seq_len_cached = getattr(self.encoding, "original_max_position_embeddings", 0)

    def _length(self, seq_len: int) -> int:
        """The length whose frequencies this call uses (HF's dynamic-NTK state rule)."""
        if self.rope_type != "dynamic" or not self.stateful:
            return seq_len
        original = self.encoding.original_max_position_embeddings
        before = self.max_seq_len_cached
        if seq_len > before:  # growth
            self.max_seq_len_cached = seq_len
        if seq_len < original and before > original:  # back within the original context
            self.max_seq_len_cached = original
        return self.max_seq_len_cached

    @property
    def attention_scaling(self) -> float:
        return self.encoding.attention_scaling

    def extra_repr(self) -> str:
        return f"{getattr(self.encoding, 'registry_name', type(self.encoding).__name__)}, float64 phases"

    @torch.no_grad()
    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.is_floating_point():
            shape = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise ValueError(f"HFRotary: position_ids must be integer [b, s], got {shape}")
        enc = self.encoding
        top = self._length(int(position_ids.max()) + 1)
        device = position_ids.device
        work = device if device.type != "mps" else torch.device("cpu")  # no float64 on MPS
        inv_freq = enc.inv_freq(top).to(device=work, dtype=torch.float64)
        phase = position_ids.to(work, torch.float64).unsqueeze(-1) * inv_freq
        phase = torch.remainder(phase, 2 * math.pi)
        emb = torch.cat((phase, phase), dim=-1)
        scale = float(enc.attention_scaling)
        cos, sin = emb.cos() * scale, emb.sin() * scale
        return cos.to(device=device, dtype=x.dtype), sin.to(device=device, dtype=x.dtype)


class _NoRotary(nn.Module):
    """A rotary module that rotates nothing (cos 1, sin 0): NoPE, for score encodings alone."""

    def __init__(self, rotary_dim: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.rope_type = "none"
        self.attention_scaling = 1.0

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        shape = (*position_ids.shape[-2:], self.rotary_dim) if position_ids.dim() >= 2 else \
            (1, position_ids.shape[-1], self.rotary_dim)
        ones = torch.ones(shape, dtype=x.dtype, device=x.device)
        return ones, torch.zeros_like(ones)


def _rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """`(parent, attribute, module)` of every `rotary_emb` submodule of `model`."""
    found = []
    for parent in model.modules():
        child = parent._modules.get("rotary_emb")
        if child is not None:
            found.append((parent, "rotary_emb", child))
    return found


def replace_rotary(model: nn.Module, encoding: RoPE | None = None, *,
                   stateful: bool = True) -> HFRotary:
    """Replace the rotary module(s) `rotary_emb` of an HF model by [`HFRotary`][mmpe.integrations.transformers.HFRotary] (in place).

    Args:
        model: an HF model whose rotary module is called `rotary_emb(x, position_ids)` and
            returns `(cos, sin)` (Llama, Qwen2, Mistral, Phi-3 … `model.model.rotary_emb`).
        encoding: the rotations; default [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope] of `model.config` (the same
            rotations as HF's, with float64 phases).
        stateful: dynamic NTK keeps HF's longest-length state across calls (default, as HF);
            False: each call's own length (see [`HFRotary`][mmpe.integrations.transformers.HFRotary]).

    Returns:
        the new module (one, shared if the model has several `rotary_emb`).

    Raises:
        ValueError: no `rotary_emb` submodule; the errors of [`from_hf_rope`][mmpe.integrations.transformers.from_hf_rope].
    """
    targets = _rotary_modules(model)
    if not targets:
        raise ValueError(f"replace_rotary: {type(model).__name__} has no 'rotary_emb' submodule")
    if encoding is None:
        encoding = from_hf_rope(model.config)
    rotary = HFRotary(encoding, stateful=stateful)
    for parent, name, _ in targets:
        setattr(parent, name, rotary)
    return rotary
