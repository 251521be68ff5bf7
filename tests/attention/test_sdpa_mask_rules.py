"""The dense route's SDPA calls meet the memory-efficient kernel's rules (issue 57): for every
registered score encoding on every sample coordinate type it takes, run on the CPU with
`route="dense"`, each mask the route hands `scaled_dot_product_attention` is in q's dtype (or
bool), has stride 1 on its last dimension and every other stride a multiple of 8 elements —
the conditions under which CUDA's memory-efficient kernel takes it as given instead of falling
back to the math kernel or padding a copy on every call (`sdpa_rules`, read from torch 2.11's
`sdp_utils`). Driven by the registry: a new encoding adds its rows here with no edit. The GPU
tier runs the same steps under `sdpa_kernel([EFFICIENT_ATTENTION])` (tests/gpu/)."""

from __future__ import annotations

import pytest
import torch
from helpers import D_MODEL, HEADS, SAMPLE_COORDS, model_context
from sdpa_rules import (
    Call,
    cudnn_violations,
    efficient_violations,
    flash_violations,
    mask_violations,
    record,
    record_calls,
)

import mmpe


def _cases() -> list:
    out = []
    for cname, make in SAMPLE_COORDS.items():
        coords = make()
        for entry in mmpe.available(hook="score"):
            if not entry.supports(coords):
                continue
            enc = mmpe.build(entry.name, context=model_context(coords))
            # the dense route serves additive terms with the softmax (route.choose_route)
            if enc.additive and not enc.needs_probs:
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every SDPA call made while the test runs."""
    return record_calls(monkeypatch)


def _run(name: str, cname: str, dtype: torch.dtype) -> None:
    coords = SAMPLE_COORDS[cname]()
    torch.manual_seed(0)
    enc = mmpe.build(name, context=model_context(coords))
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route="dense").to(dtype)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL,
                    generator=torch.Generator().manual_seed(2)).to(dtype)
    mha(x, coords).float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("name", "cname"), _cases())
def test_dense_route_masks_meet_the_efficient_kernels_rules(name: str, cname: str,
                                                            dtype: torch.dtype,
                                                            sdpa_calls: list[Call]) -> None:
    _run(name, cname, dtype)
    assert sdpa_calls, "the dense route made no SDPA call"
    for call in sdpa_calls:
        assert call.attn_mask is not None or call.is_causal, "a dense call without its bias"
        broken = efficient_violations(call)
        assert not broken, f"{name} on {cname}: " + "; ".join(broken)


def _single_graph() -> mmpe.Graph:
    i = torch.arange(8)  # a ring of 8 nodes: one graph, no padding, so no boolean mask
    return mmpe.Graph(torch.stack((i, (i + 1) % 8)), num_nodes=8, edge_attr=i % 3)


#: lengths that are multiples of 8 and no mask to lay over the bias: only the bias's own layout
#: can break a rule (before issue 57 T5 and Graphormer gathered channel-last, stride(-1) = n_h)
ALIGNED = {"t5": lambda: mmpe.Sequence(8), "graphormer": _single_graph,
           "graphormer_spatial": _single_graph}


@pytest.mark.parametrize("name", sorted(ALIGNED))
def test_gathered_tables_come_out_head_major(name: str, sdpa_calls: list[Call]) -> None:
    from mmpe.attention import forms
    from mmpe.encodings.base import AttentionCall

    coords = ALIGNED[name]()
    enc = mmpe.build(name, context=model_context(coords))
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route="dense")
    mha(torch.randn(coords.batch_size or 2, 8, D_MODEL), coords)
    (call,) = sdpa_calls
    assert call.attn_mask.stride(-1) == 1 and not efficient_violations(call)
    q = torch.zeros(1, HEADS, 8, D_MODEL // HEADS)
    term = forms.dense(enc, AttentionCall(coords, HEADS, D_MODEL // HEADS, 1, q=q, k=q, v=q))
    assert term.is_contiguous(), f"{name}'s dense form: strides {term.stride()}"


def test_a_mask_only_call_meets_them_too(sdpa_calls: list[Call]) -> None:
    """Padding without a term: the boolean mask would be converted to q's dtype with strides
    n_k = 5 (a padded copy per call); the route hands SDPA an aligned additive mask instead."""
    coords = SAMPLE_COORDS["points"]()
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [], route="dense")
    x = torch.randn(2, coords.num_queries, D_MODEL)
    want = mmpe.MultiHeadAttention(D_MODEL, HEADS, [], route="math")
    want.load_state_dict(mha.state_dict())
    got = mha(x, coords)
    assert sdpa_calls and not any(efficient_violations(c) for c in sdpa_calls)
    torch.testing.assert_close(got, want(x, coords), atol=1e-6, rtol=1e-5)


# The rules themselves, on hand-made calls: each flags what torch's selection refuses.

def _qkv(n: int = 6, d: int = 24, dtype: torch.dtype = torch.bfloat16):
    q, k, v = (torch.randn(2, 2, n, d, dtype=dtype) for _ in range(3))
    return q, k, v


def test_the_rules_flag_a_permuted_or_unaligned_mask() -> None:
    q, k, v = _qkv()
    table = torch.randn(6, 6, 2, dtype=torch.bfloat16)
    permuted = table[None].permute(0, 3, 1, 2)  # [1, H, n, n] with stride(-1) = H
    assert any("stride(-1)" in m for m in efficient_violations(record(q, k, v, permuted)))
    packed = torch.randn(1, 2, 6, 6, dtype=torch.bfloat16)  # strides (72, 36, 6, 1)
    assert any("multiples of 8" in m for m in mask_violations(record(q, k, v, packed)))
    buf = torch.empty(1, 2, 6, 8, dtype=torch.bfloat16)
    assert efficient_violations(record(q, k, v, buf[..., :6])) == []
    wrong_dtype = torch.zeros(1, 2, 6, 8)[..., :6]
    assert any("dtype" in m for m in efficient_violations(record(q, k, v, wrong_dtype)))
    as_bool = torch.ones(1, 1, 6, 6, dtype=torch.bool)  # converted with strides of 6
    assert any("converted" in m for m in mask_violations(record(q, k, v, as_bool)))


def test_the_rules_of_head_dim_gqa_flash_and_cudnn() -> None:
    q, k, v = _qkv(d=12)
    assert any("head_dim" in m for m in efficient_violations(record(q, k, v)))  # 12 % 8
    assert efficient_violations(record(*_qkv(d=12, dtype=torch.float32))) == []  # fp32: 4
    q, k, v = _qkv()
    k2, v2 = k[:, :1], v[:, :1]
    assert any("heads" in m for m in efficient_violations(record(q, k2, v2)))
    assert efficient_violations(record(q, k2, v2, enable_gqa=True)) == []
    mask = torch.zeros(1, 2, 6, 8, dtype=torch.bfloat16)[..., :6]
    assert flash_violations(record(q, k, v, mask)) == ["flash takes no attn_mask"]
    assert flash_violations(record(q, k, v, is_causal=True)) == []
    assert cudnn_violations(record(q, k, v, mask)) == []
    learned = mask.detach().requires_grad_(True)
    assert cudnn_violations(record(q, k, v, learned)) == [
        "cuDNN takes no attn_mask that requires grad"]
