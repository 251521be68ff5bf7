"""The relation plan of the CPU attention (``mmpe.attention.plans.relation``) against the math route.

Content-free score terms on ``toeplitz`` sequences (implicit positions, or restarts per packed
document) run as block-wise SDPA over a per-offset table (ALiBi, T5, KERPLE) and FIRE's compact
form, with a hand-written backward pass that reduces the gradient of the scores onto those
tables. Every case compares the outputs and the gradients w.r.t. q, k, v and every encoding
parameter with the explicit math route (float32, 1e-5), over lengths, heads, batch, block sizes,
cached offsets, causal and bidirectional masks, documents and padding.
"""

from __future__ import annotations

import math
import os
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import MultiHeadAttention, Sequence
from mmpe.attention.masks import plain_causal
from mmpe.attention.plans import relation
from mmpe.attention.term_layouts import antidiagonal_buffer, antidiagonal_sums, toeplitz_rows
from mmpe.encodings.base import AttentionCall

NAMES = ["alibi", "t5", "fire", "kerple_log", "kerple_power"]


@pytest.fixture(autouse=True)
def _relation_path_at_every_size(monkeypatch):
    """These tests run the relation plan on small sequences (below its size threshold)."""
    monkeypatch.setattr("mmpe.attention.plans.relation.RELATION_MIN_BIAS_BYTES", 0)


def _encodings(names: list[str], heads: int, seed: int) -> list:
    """Built encodings with every learnable parameter moved off its initial value. FIRE's
    threshold L is a few tokens (not 512), so that its normaliser varies from query to query
    and piece boundaries cross blocks of queries (the per-pair part of its relation plan)."""
    torch.manual_seed(seed)
    options = {"fire": {"init_L": 1.0 + seed % 5, "init_c": 0.5}}
    encs = [mmpe.build(n, context={"num_heads": heads, "head_dim": 8, "d_model": 8 * heads},
                       **options.get(n, {})) for n in names]
    with torch.no_grad():
        for enc in encs:
            for p in enc.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
    return encs


def _coords(kind: str, n: int, offset: int, causal: bool, batch: int) -> Sequence:
    """Sequence coordinates of ``n`` queries and ``offset + n`` keys of one kind."""
    n_k = offset + n
    if kind == "plain":
        return Sequence(n, offset=offset, causal=causal)
    g = torch.Generator().manual_seed(n * 31 + offset)
    starts = torch.rand(batch, n_k, generator=g) < 0.2
    starts[:, 0] = True
    docs = starts.long().cumsum(-1)
    if kind == "documents":
        return Sequence(n, offset=offset, causal=causal, document_ids=docs)
    pad = torch.ones(batch, n_k, dtype=torch.bool)
    pad[0, : n_k // 3] = False  # left padding of the first example
    if kind == "documents+padding":
        return Sequence(n, offset=offset, causal=causal, document_ids=docs, padding_mask=pad)
    return Sequence(n, offset=offset, causal=causal, padding_mask=pad)  # not toeplitz


def _compare(names: list[str], coords: Sequence, heads: int, batch: int, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> None:
    """Outputs and gradients of the sdpa route (relation plan where it applies) and the math
    path agree to 1e-5."""
    encs = _encodings(names, heads, seed)
    fast = MultiHeadAttention(8 * heads, heads, encs, route="sdpa")
    slow = MultiHeadAttention(8 * heads, heads, encs, route="math")
    g = torch.Generator().manual_seed(seed + 1)
    n_q, n_k = coords.num_queries, coords.num_keys
    q, k, v = (torch.randn(batch, heads, n, 8, generator=g, dtype=torch.float64).to(dtype)
               for n in (n_q, n_k, n_k))
    weight = torch.randn(batch, heads, n_q, 8, generator=g, dtype=torch.float64).to(dtype)
    params = [p for e in encs for p in e.parameters() if p.requires_grad]
    results = []
    for attn in (fast, slow):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ctx = AttentionCall(coords, heads, 8, batch, None, *leaves)
        out = attn.attend(ctx)
        grads = torch.autograd.grad((out * weight).sum() / math.sqrt(out.numel()),
                                    leaves + params, allow_unused=True)
        results.append((out, grads))
    (out_fast, g_fast), (out_slow, g_slow) = results
    torch.testing.assert_close(out_fast.float(), out_slow.float(), atol=1e-5, rtol=1e-5)
    names_ = ["q", "k", "v"] + [f"{type(e).__name__}.{n}" for e in encs
                                for n, p in e.named_parameters() if p.requires_grad]
    for name, a, b in zip(names_, g_fast, g_slow, strict=True):
        if b is None:
            assert a is None or not a.any(), name
            continue
        tol = (1e-5, 1e-5)
        if name == "FIRE.c":
            # ∂/∂c is the difference of c's terms in ψ(d) and in the normaliser, each up to
            # ~2,000× larger than it where c is small, from float32 rows on both sides (the
            # tolerance of tests/attention/test_tiles_plan.py; c = 0.5 + 0.3·N comes near 0 here as on
            # the grid plan, where hypothesis found c = −2.7e-4)
            tol = (1e-4, 1e-3)
        torch.testing.assert_close(a.float(), b.float(), atol=tol[0], rtol=tol[1], msg=name)


def _takes_relation_path(names: list[str], coords: Sequence, heads: int, batch: int) -> bool:
    encs = _encodings(names, heads, 0)
    q = torch.zeros(batch, heads, coords.num_queries, 8)
    k = torch.zeros(batch, heads, coords.num_keys, 8)
    ctx = AttentionCall(coords, heads, 8, batch, None, q, k, k)
    return relation.applies(encs, ctx)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
    n=st.integers(1, 40),
    offset=st.integers(0, 6),
    heads=st.integers(1, 4),
    batch=st.integers(1, 2),
    causal=st.booleans(),
    kind=st.sampled_from(["plain", "documents", "documents+padding", "padding"]),
    block_rows=st.sampled_from([1, 3, 7, 16, None]),
    seed=st.integers(0, 2**16),
)
def test_relation_path_equals_math_path_with_gradients(names, n, offset, heads, batch, causal,
                                                       kind, block_rows, seed) -> None:
    coords = _coords(kind, n, offset, causal, batch)
    assert _takes_relation_path(names, coords, heads, batch) == (kind != "padding")
    env = {} if block_rows is None else {
        "MMPE_ATTN_BLOCK_BYTES": str(block_rows * batch * heads * coords.num_keys * 4)}
    with mock.patch.dict(os.environ, env):
        _compare(names, coords, heads, batch, seed)


@pytest.mark.parametrize("names", [["alibi"], ["t5"], ["fire"], ["kerple_log"],
                                   ["t5", "fire", "alibi"]])
@pytest.mark.parametrize("causal", [True, False])
def test_long_sequence_over_many_blocks(names, causal) -> None:
    # Enough queries for FIRE's normaliser to vary inside blocks (pieces split on some offsets)
    # and for many blocks of the default size.
    _compare(names, Sequence(300, causal=causal), heads=3, batch=1, seed=5)


def test_float64_runs_the_relation_path() -> None:
    coords = Sequence(29, causal=True)
    assert _takes_relation_path(["t5", "fire"], coords, 2, 1)
    _compare(["t5", "fire"], coords, heads=2, batch=1, dtype=torch.float64)


def test_without_the_fused_kernel(monkeypatch) -> None:
    # A torch without the CPU kernel's op: each block is computed explicitly, same numbers.
    monkeypatch.setattr("mmpe.attention.plans.flash._FLASH_CPU", None)
    _compare(["alibi", "fire"], Sequence(23, causal=True), heads=2, batch=2)


def test_layer_forward_backward_equals_math_path() -> None:
    encs = _encodings(["t5", "fire"], 4, 3)
    fast = MultiHeadAttention(32, 4, encs, num_kv_heads=2)
    slow = MultiHeadAttention(32, 4, encs, num_kv_heads=2, route="math")
    slow.load_state_dict(fast.state_dict())
    coords = Sequence(45, causal=True)
    x = torch.randn(2, 45, 32)
    outs = []
    for attn in (fast, slow):
        xx = x.clone().requires_grad_()
        out = attn(xx, coords)
        params = [p for p in attn.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out.square().mean(), [xx, *params])
        outs.append((out, grads))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["t5", "fire"])
def test_training_saves_no_pairwise_tensor(name: str) -> None:
    # The relation plan saves q, k, v, the output and the log-sum-exp: nothing of n_q × n_k.
    n = 256
    attn = MultiHeadAttention(32, 4, _encodings([name], 4, 0))
    sizes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    x = torch.randn(1, n, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attn(x, Sequence(n, causal=True))
    out.sum().backward()
    assert max(sizes) < n * n, f"a saved tensor has {max(sizes)} elements (n² = {n * n})"
    assert all(p.grad is not None for p in attn.parameters() if p.requires_grad)


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 12), extra=st.integers(0, 6), data=st.data())
def test_toeplitz_rows_and_antidiagonal_sums(n_q, extra, data) -> None:
    n_k = n_q + extra
    start = data.draw(st.integers(0, n_q - 1))
    stop = data.draw(st.integers(start + 1, n_q))
    keys = data.draw(st.integers(1, n_k))
    table = torch.randn(2, n_q + n_k - 1)
    block = toeplitz_rows(table, n_q, start, stop, keys)
    rows = torch.arange(stop - 1, start - 1, -1)[:, None]  # reversed queries
    cols = torch.arange(keys)[None, :]
    torch.testing.assert_close(block, table[:, cols - rows + n_q - 1])
    # The anti-diagonal buffer sums a block per offset (row r + key k), one entry per offset.
    d = torch.randn(2, stop - start, keys)
    buf, view = antidiagonal_buffer(tuple(d.shape), d)
    view.copy_(d)
    expected = torch.zeros(2, stop - start + keys - 1)
    expected.index_add_(1, (torch.arange(stop - start)[:, None] + cols).reshape(-1),
                        d.reshape(2, -1))
    torch.testing.assert_close(antidiagonal_sums(buf), expected)
    torch.testing.assert_close(antidiagonal_sums(buf[None].expand(3, -1, -1, -1), 1),
                               3 * expected)


def test_sequence_toeplitz_property() -> None:
    docs = torch.tensor([0, 0, 1, 1, 1])
    pad = torch.tensor([False, True, True, True, True])
    assert Sequence(5).toeplitz and Sequence(3, offset=2, causal=True).toeplitz
    assert Sequence(document_ids=docs).toeplitz
    assert Sequence(document_ids=docs, padding_mask=pad).toeplitz  # positions restart per doc
    assert not Sequence(padding_mask=pad).toeplitz  # positions count real tokens only
    assert not Sequence(position_ids=torch.arange(5)).toeplitz


def test_plain_causal_kernel_needs_implicit_positions() -> None:
    # Explicit, non-monotone positions whose maximum is n − 1: the causal mask is not SDPA's
    # is_causal triangle, even once max_position has been read.
    coords = Sequence(position_ids=torch.tensor([0, 2, 1, 3]), causal=True)
    assert coords.max_position == 3
    assert not plain_causal(coords)
    assert plain_causal(Sequence(4, causal=True))
    fast, slow = (MultiHeadAttention(16, 2, route=b) for b in ("sdpa", "math"))
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(1, 4, 16)
    torch.testing.assert_close(fast(x, coords), slow(x, coords), atol=1e-6, rtol=1e-6)


def test_not_taken_for_content_terms_grids_or_cross_attention() -> None:
    ctx_kw = dict(num_heads=2, head_dim=8, batch=1)
    q = torch.zeros(1, 2, 6, 8)
    fox = mmpe.build("fox", context={"num_heads": 2, "head_dim": 8, "d_model": 16})
    seq = AttentionCall(Sequence(6, causal=True), x=torch.zeros(1, 6, 16), q=q, k=q, v=q,
                           **ctx_kw)
    assert not relation.applies([fox], seq)  # reads the content
    grid = mmpe.Grid((2, 3))
    alibi = mmpe.build("alibi", context={"num_heads": 2})
    assert not relation.applies([alibi], AttentionCall(grid, q=q, k=q, v=q, **ctx_kw))
