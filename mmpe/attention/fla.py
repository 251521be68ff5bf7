"""The fla route: FoX, stick-breaking and PaTH on flash-linear-attention's Triton kernels.

flash-linear-attention (Yang, Zhang et al.; `pip install ".[fla]"`, never a hard dependency)
ships maintained Triton kernels for three of mmpe's data-dependent schemes:

| mmpe | fla kernel | what mmpe hands it |
| --- | --- | --- |
| `fox` (Lin et al. 2025) | `fla.ops.forgetting_attn.parallel_forgetting_attn` | `g = log f_t` per token and head |
| `stick_breaking` (Tan et al. 2024) | `fla.ops.stickbreaking_attn.parallel_stickbreaking_attn` | `attend_current` |
| `path`, `path_fox` (Yang et al. 2025) | `fla.ops.path_attn.parallel_path_attn` | the transforms' `w`, `β`; for `path_fox` `g = log f_t / scale` (the kernel scales its gate sums) |

Every kernel takes `[B, T, H, K]` tensors (mmpe's `[b, n_h, n, h_d]` transposed) and mmpe's
softmax scale. The route is forced (`route="fla"`); `route="auto"` never takes it until a
stored device row shows it pays. The Triton kernels do not run on a CPU (fla falls back to
nothing there): the CPU tests run this route with fla's pure-PyTorch reference functions in
the kernels' place, which checks the mapping and fla's definitions against mmpe's own math
route; the GPU tier compares the kernels themselves.

Refused (by name, [fla_refusal][mmpe.attention.fla.fla_refusal]): other encodings or more
than one; coordinates other than a causal `Sequence` with implicit positions; padding, packed
documents (fla's `cu_seqlens` wants a batch of one), local windows and KV caches.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from collections.abc import Sequence as Seq

from torch import Tensor

from mmpe.encodings.base import AttentionCall, KernelEncoding, ScoreEncoding

#: the kernel each scheme runs on: (module, function)
KERNELS = {
    "fox": ("fla.ops.forgetting_attn.parallel", "parallel_forgetting_attn"),
    "stick_breaking": ("fla.ops.stickbreaking_attn.parallel", "parallel_stickbreaking_attn"),
    "path": ("fla.ops.path_attn.parallel", "parallel_path_attn"),
}


def scheme_of(scores: Seq[ScoreEncoding], kernel: KernelEncoding | None) -> str | None:
    """Which fla kernel the encodings map to (a key of `KERNELS`), or None."""
    from mmpe.encodings.fox import ForgettingGate
    from mmpe.encodings.path import PaTH, PaTHFoX
    from mmpe.encodings.stick_breaking import StickBreaking

    if kernel is None or kernel.is_softmax:
        return "fox" if len(scores) == 1 and type(scores[0]) is ForgettingGate else None
    if scores:
        return None
    if type(kernel) is StickBreaking:
        return "stick_breaking"
    return "path" if type(kernel) in (PaTH, PaTHFoX) else None


def fla_refusal(scores: Seq[ScoreEncoding], kernel: KernelEncoding | None,
                ctx: AttentionCall) -> str | None:
    """Why the call cannot run on an fla kernel, or None where it can."""
    if scheme_of(scores, kernel) is None:
        names = [type(e).__name__ for e in [*scores, *([kernel] if kernel else [])]]
        return (f"fla runs fox alone, stick_breaking alone or path / path_fox alone; the "
                f"layer has {names}")
    from mmpe.coords.sequence import Sequence

    coords = ctx.coords
    if not isinstance(coords, Sequence) or not coords.causal:
        return f"fla's kernels are causal over a sequence; the coordinates are {coords!r}"
    if coords.explicit_positions or coords.padding_mask is not None:
        return "fla's kernels read token order only: no position_ids or padding_mask"
    if coords.document_ids is not None:
        return "packed documents map to fla's cu_seqlens only for a batch of one; not mapped"
    if getattr(coords, "local_window", None) is not None:
        return "a local window is not mapped to fla's kernels"
    if ctx.cache is not None or coords.offset:
        return "cached decoding is not mapped to fla's kernels; decode on 'auto'"
    return None


def kernel(scheme: str) -> Callable:
    """The fla function of `scheme`, imported on first use.

    Raises:
        ImportError: flash-linear-attention is not installed (`pip install ".[fla]"`).
    """
    module, name = KERNELS[scheme]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ImportError("attention: route='fla' needs flash-linear-attention: "
                          "pip install '.[fla]' (or flash-linear-attention)") from err


def run_fla(scores: Seq[ScoreEncoding], kern: KernelEncoding | None, ctx: AttentionCall,
            scale: float) -> Tensor:
    """The attention output `[b, n_h, n_q, h_d]` from the scheme's fla kernel.

    Raises:
        ValueError: a call the kernels do not take (the reason named).
        ImportError: flash-linear-attention is not installed.
    """
    reason = fla_refusal(scores, kern, ctx)
    if reason is not None:
        raise ValueError(f"attention: route='fla': {reason}; use 'auto'")
    scheme = scheme_of(scores, kern)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (ctx.q, ctx.k, ctx.v))  # [B, T, H, K]
    fn = kernel(scheme)
    if scheme == "fox":
        g = scores[0].log_forget(ctx.x)  # [b, n, n_h] float32
        out = fn(q, k, v, g, scale=scale)
    elif scheme == "stick_breaking":
        out, _ = fn(q, k, v, scale=scale, attend_current=kern.attend_current)
    else:
        w, beta, _ = kern.transforms(ctx.x, ctx)  # [b, n_h, n, h_d], [b, n_h, n]
        w = w.transpose(1, 2).to(q.dtype).contiguous()
        beta = beta.transpose(1, 2).to(q.dtype).contiguous()
        forget = getattr(kern, "forget", None)
        # the kernel multiplies its gate sums by the scale; PaTH-FoX adds them unscaled
        g = None if forget is None else forget.log_forget(ctx.x) / scale
        out, _ = fn(q, k, v, w, beta, g, scale=scale)
    return out.transpose(1, 2).to(ctx.q.dtype)
