"""PyTorch's CUDA kernel-selection rules for `scaled_dot_product_attention`, stated as checks
that run on the CPU: given the arguments of one SDPA call, which rules of the memory-efficient,
flash and cuDNN kernels it breaks. A call that breaks a rule falls back (silently) to the next
kernel in the priority order, or to the math kernel; a mask that breaks the memory-efficient
kernel's alignment rule is copied into a padded buffer on every call. The dense route is meant
to reach the memory-efficient kernel with its bias, so the tests hold its calls to
`efficient_violations` (`tests/attention/test_sdpa_mask_rules.py`) and the GPU tier runs the
same calls under `sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])`, where a fallback raises.

Read from torch 2.11 (`aten/src/ATen/native/transformers/sdp_utils_cpp.h`,
`cuda/sdp_utils.cpp`, and `attention.cpp`'s `preprocess_mask`), for NVIDIA devices of sm80 or
newer (A100, H100, H200), dense (not nested) inputs:

memory-efficient (`can_use_mem_efficient_attention`)
    * q, k, v 4-D (`check_tensor_shapes`), nonzero sequence lengths
      (`check_nonzero_sequence_lengths_dense`);
    * head_dim: q's equals k's, q's and v's divisible by the minimum GEMM alignment, 8 elements
      in fp16/bf16 and 4 in fp32 on sm80+ (`check_head_dim_size_mem_efficient`,
      `minimum_gemm_alignment`);
    * q, k, v storage offsets aligned to that many elements
      (`check_data_ptr_alignment_mem_efficient`);
    * stride 1 on the last dimension of q, k, v *and the mask*
      (`check_last_dim_stride_equals_1_dense<false>`);
    * one batch size; the same number of heads, or with `enable_gqa` k's heads equal to v's
      and dividing q's (`check_batch_size_and_num_heads_dense<true, …>`,
      `check_grouped_query_attention`);
    * dtype fp16, bf16 or fp32, the same for q, k, v (`check_tensor_dtype`);
    * the mask bool (converted to q's dtype, a new tensor, before the kernel) or in q's dtype
      (the kernel checks the bias's dtype against the query's);
    * every stride of the mask but the last a multiple of 8 elements, else `preprocess_mask`
      pads a copy of the mask on each call (`aligned_tensor<8>`, `pad_bias<8>`): not a
      fallback, but the copy the dense route exists to avoid, so a violation here.
flash (`can_use_flash_attention`)
    * no mask at all (`check_for_attn_mask`); fp16/bf16; head_dim equal for q, k, v and at most
      256; `is_causal` only with square q/k lengths; last-dim stride 1; GQA as above.
cuDNN (`can_use_cudnn_attention`; first in the priority order on sm90/sm100 in 2.11)
    * fp16/bf16; a mask 2-D or 4-D with each dimension 1 or the call's, and *not requiring
      grad* (`check_attn_mask_shape`); head_dim a multiple of 8 and at most 128 (256 on
      sm90/sm100 with a recent cuDNN); key length not 1; last-dim stride 1; GQA as above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: the element multiple every non-last mask stride must be (`preprocess_mask`'s alignment)
MASK_ALIGNMENT = 8
#: dtypes of the kernels on sm80+
EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass
class Call:
    """What the selection rules read from one SDPA call (tensors kept by reference: the test
    that records them is small)."""

    q: Tensor
    k: Tensor
    v: Tensor
    attn_mask: Tensor | None
    is_causal: bool
    enable_gqa: bool


def record_calls(monkeypatch) -> list[Call]:
    """Every SDPA call made from now on, recorded (`monkeypatch` restores SDPA): the routes
    call `torch.nn.functional.scaled_dot_product_attention` by that name."""
    import torch.nn.functional as F

    calls: list[Call] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(record(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def record(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
           enable_gqa: bool = False) -> Call:
    """A `Call` from SDPA's own signature (so a wrapper can pass its arguments through)."""
    return Call(query, key, value, attn_mask, bool(is_causal), bool(enable_gqa))


def gemm_alignment(dtype: torch.dtype) -> int:
    """`minimum_gemm_alignment` on sm80+: 128 bits per tensor-core operand, at least 4."""
    return max(4, 128 // (16 if dtype in LOW_PRECISION else 32))


def _common(call: Call) -> list[str]:
    """Rules every fused kernel shares on dense inputs."""
    q, k, v = call.q, call.k, call.v
    out = []
    if not (q.dim() == k.dim() == v.dim() == 4):
        return [f"q, k, v must be 4-D, got {q.dim()}, {k.dim()}, {v.dim()}"]
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        out.append("a zero sequence length")
    if not (q.dtype == k.dtype == v.dtype):
        out.append(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            out.append(f"{name}.stride(-1) = {t.stride(-1)}, not 1")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        out.append(f"batch sizes differ: {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if call.enable_gqa:
        if hk != hv or hq % hk:
            out.append(f"GQA needs k's heads = v's heads dividing q's: {hq}, {hk}, {hv}")
    elif not (hq == hk == hv):
        out.append(f"heads differ without enable_gqa: {hq}, {hk}, {hv}")
    if call.attn_mask is not None and call.attn_mask.stride(-1) != 1:
        out.append(f"attn_mask.stride(-1) = {call.attn_mask.stride(-1)}, not 1 "
                   f"(strides {tuple(call.attn_mask.stride())})")
    return out


def mask_violations(call: Call) -> list[str]:
    """The memory-efficient kernel's rules on the mask alone: dtype, last-dim stride, the
    alignment of every other stride (see the module docstring)."""
    mask, q = call.attn_mask, call.q
    if mask is None:
        return []
    out = []
    if mask.dtype not in (torch.bool, q.dtype):
        out.append(f"attn_mask dtype {mask.dtype}, not q's ({q.dtype}) or bool")
    if mask.dtype == torch.bool:
        # converted to q's dtype (a new contiguous tensor) whose strides are then checked
        strides, label = torch.empty(mask.shape, dtype=q.dtype, device="meta").stride(), \
            "the converted bool mask's"
    else:
        strides, label = mask.stride(), "attn_mask"
    if mask.stride(-1) != 1:
        out.append(f"attn_mask.stride(-1) = {mask.stride(-1)}, not 1 (strides {mask.stride()})")
    bad = [s for s in strides[:-1] if s % MASK_ALIGNMENT]
    if bad:
        out.append(f"{label} strides {tuple(strides)} not multiples of {MASK_ALIGNMENT} "
                   f"elements: SDPA pads a copy on every call")
    return out


def efficient_violations(call: Call) -> list[str]:
    """Every rule of the memory-efficient kernel `call` breaks (empty: the kernel takes it as
    given, with no copy of the mask)."""
    out = _common(call)
    q, k, v = call.q, call.k, call.v
    if q.dtype not in EFFICIENT_DTYPES:
        out.append(f"dtype {q.dtype} not one of {EFFICIENT_DTYPES}")
    align = gemm_alignment(q.dtype)
    if q.shape[-1] != k.shape[-1]:
        out.append(f"q's head_dim {q.shape[-1]} differs from k's {k.shape[-1]}")
    for name, t in (("q", q), ("v", v)):
        if t.shape[-1] == 0 or t.shape[-1] % align:
            out.append(f"{name}'s head_dim {t.shape[-1]} not a positive multiple of {align}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() and t.storage_offset() % align:
            out.append(f"{name}'s storage offset {t.storage_offset()} not a multiple of {align}")
    out += [m for m in mask_violations(call) if "stride(-1)" not in m]  # (_common has it)
    return out


def flash_violations(call: Call) -> list[str]:
    """Every rule of the flash kernel `call` breaks."""
    out = _common(call)
    q, k, v = call.q, call.k, call.v
    if call.attn_mask is not None:
        out.append("flash takes no attn_mask")
    if q.dtype not in LOW_PRECISION:
        out.append(f"dtype {q.dtype} not fp16/bf16")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or q.shape[-1] > 256:
        out.append(f"head_dims {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}: equal, <= 256")
    if call.is_causal and q.shape[-2] != k.shape[-2]:
        out.append("is_causal with seqlen_q != seqlen_k")
    return out


def cudnn_violations(call: Call, head_dim_limit: int = 128) -> list[str]:
    """Every rule of the cuDNN kernel `call` breaks (`head_dim_limit`: 256 on sm90/sm100 with
    cuDNN > 9.22, else 128)."""
    out = _common(call)
    q, k, v = call.q, call.k, call.v
    if q.dtype not in LOW_PRECISION:
        out.append(f"dtype {q.dtype} not fp16/bf16")
    mask = call.attn_mask
    if mask is not None:
        if mask.requires_grad:
            out.append("cuDNN takes no attn_mask that requires grad")
        shape_ok = mask.shape[-2] in (1, q.shape[-2]) and mask.shape[-1] in (1, k.shape[-2]) and (
            mask.dim() == 2 or (mask.dim() == 4 and mask.shape[0] in (1, q.shape[0])
                                and mask.shape[1] in (1, q.shape[1])))
        if not shape_ok:
            out.append(f"attn_mask shape {tuple(mask.shape)}: 2-D or 4-D broadcastable")
    for name, t in (("q", q), ("v", v)):
        if t.shape[-1] % 8 or t.shape[-1] > head_dim_limit:
            out.append(f"{name}'s head_dim {t.shape[-1]}: a multiple of 8, <= {head_dim_limit}")
    if k.shape[-2] == 1:
        out.append("key length 1")
    return out
