"""Every API that materialises an `n × n` tensor on request — the math route, `record_attention`
(the attention maps), `dense_bias` (the dense-bias export) — refuses before allocating what
this process cannot hold, through one door (`mmpe.validation.check_memory`), naming the size and
its own ways out; the budget is what the OS, the cgroup and the address-space limit leave."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import validation
from mmpe.attention import dense_bias, record_attention
from mmpe.encodings.base import AttentionCall

GIB = 2**30


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # set anew each example
@given(needed=st.integers(0, 1 << 40), free=st.one_of(st.none(), st.integers(0, 1 << 40)),
       device=st.sampled_from(["cpu", "meta"]))
def test_the_door_refuses_exactly_what_does_not_fit(needed, free, device, monkeypatch):
    monkeypatch.setattr(validation, "available_memory", lambda: free)
    refuse = device == "cpu" and free is not None and needed > free \
        and needed >= validation.MEMORY_CHECK_FROM
    if refuse:
        with pytest.raises(MemoryError, match=rf"^api: the thing \[3\] need {needed / GIB:.1f} "
                                              rf"GiB, more than the {free / GIB:.1f} GiB .*; do less$"):
            validation.check_memory("api", needed, "the thing [3]", device, "do less")
    else:
        validation.check_memory("api", needed, "the thing [3]", device, "do less")


def test_the_budget_is_the_least_of_the_os_the_cgroup_and_the_address_space(monkeypatch):
    for os_free, cgroup, space in [(8, None, None), (8, 3, None), (8, 3, 2), (8, None, 5)]:
        monkeypatch.setattr(validation, "_os_available", lambda v=os_free: v)
        monkeypatch.setattr(validation, "_cgroup_available", lambda v=cgroup: v)
        monkeypatch.setattr(validation, "_address_space_available", lambda v=space: v)
        assert validation.available_memory() == min(v for v in (os_free, cgroup, space) if v)
    real = validation._os_available()
    assert real is None or real > 0


def _mha(heads=4):
    return mmpe.MultiHeadAttention(32, heads, [mmpe.build("alibi", num_heads=heads)])


@pytest.mark.parametrize("heads", [1, 4])
def test_record_attention_is_refused_with_its_size_and_its_ways_out(heads, monkeypatch):
    n = 2048  # 5 copies of [1, n_h, n, n] float32: 80 MiB per head
    needed = 5 * heads * n * n * 4
    monkeypatch.setattr(validation, "available_memory", lambda: needed - 1)
    with torch.no_grad(), record_attention() as weights, pytest.raises(
            MemoryError, match=rf"attention: the math route's scores \(recorded\) for b=1, "
                               rf"n_h={heads}, n_q={n}, n_k={n} need {needed / GIB:.1f} GiB.*"
                               r"keeps 0.0 GiB from 0 calls.*calls=.*query_stride="):
        _mha(heads)(torch.randn(1, n, 32), mmpe.Sequence(n))
    assert weights == []


def test_dense_bias_is_refused_with_its_size_and_its_ways_out(monkeypatch):
    n, heads = 3000, 2  # one term, 72 MB: above the 64 MiB the door starts at
    coords = mmpe.Sequence(n)
    ctx = AttentionCall(coords, heads, 16, 1)
    terms = [mmpe.build("alibi", num_heads=heads), mmpe.build("t5", num_heads=heads)]
    needed = 2 * heads * n * n * 4
    monkeypatch.setattr(validation, "available_memory", lambda: needed - 1)
    with pytest.raises(MemoryError, match=rf"dense_bias: the bias \[b, n_h, n_q, n_k\] = "
                                          rf"\[1, {heads}, {n}, {n}\] float32 and the term added"
                                          r".*forms.rows"):
        dense_bias(terms, ctx)
    monkeypatch.setattr(validation, "available_memory", lambda: needed // 2)
    assert dense_bias(terms[:1], ctx).shape == (1, heads, n, n)  # one term: one copy


def test_the_math_path_outside_a_recording_names_the_other_paths(monkeypatch):
    monkeypatch.setattr(validation, "available_memory", lambda: 1 << 26)
    mha = mmpe.MultiHeadAttention(32, 4, [mmpe.build("stick_breaking")])  # math route only
    needed = 4 * 4 * 2048 * 2048 * 4  # scores, modded, masked, probabilities
    with torch.no_grad(), pytest.raises(MemoryError, match=rf"need {needed / GIB:.1f} GiB.*"
                                                           r"route='flex'"):
        mha(torch.randn(1, 2048, 32), mmpe.Sequence(2048, causal=True))


def test_a_subset_of_calls_and_a_strided_map_keep_less():
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 2, 3, ["alibi"])
    x, coords = torch.randn(2, 12, 32), mmpe.Sequence(12, causal=True)
    with torch.no_grad(), record_attention() as every:
        model(x, coords)
    with torch.no_grad(), record_attention(calls={0, 2}, query_stride=5) as some:
        model(x, coords)
    assert len(every) == 3 and len(some) == 2
    for kept, full in zip(some, (every[0], every[2]), strict=True):
        assert kept.shape == (2, 2, 3, 12) and kept.is_contiguous()  # rows 0, 5, 10
        torch.testing.assert_close(kept, full[:, :, ::5])
        torch.testing.assert_close(kept.sum(-1), torch.ones(2, 2, 3))
    with pytest.raises(ValueError, match="query_stride must be a positive int"):
        with record_attention(query_stride=0):
            pass
    with pytest.raises(ValueError, match="calls must be >= 0"), record_attention(calls=[-1]):
        pass
    with pytest.raises(ValueError, match="calls must be a collection"), record_attention(calls=3):
        pass


@pytest.mark.subprocess
def test_under_an_address_space_limit_the_recording_is_refused_not_the_allocator():
    """The issue's case: 16,000 tokens, 4 heads (4 GiB a copy) in a process capped at 8 GiB of
    address space, on a machine whose MemAvailable would say yes."""
    code = textwrap.dedent("""
        import resource, torch, mmpe
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        mha = mmpe.MultiHeadAttention(32, 4, [mmpe.build("alibi", num_heads=4)])
        try:
            with torch.no_grad(), mmpe.attention.record_attention():
                mha(torch.randn(1, 16_000, 32), mmpe.Sequence(16_000))
        except MemoryError as err:
            print("refused:", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "refused: attention: the math route's scores (recorded)" in out.stdout, out.stderr
    assert "need 19.1 GiB" in out.stdout and "query_stride" in out.stdout


@pytest.mark.parametrize("coords", [
    mmpe.Sequence(3000, causal=True),
    mmpe.Sequence(3000, padding_mask=torch.arange(3000) < torch.tensor([[3000], [17]])),
    mmpe.Sequence(3000, document_ids=torch.arange(3000) // 700)], ids=["causal", "padded", "docs"])
def test_a_dense_mask_is_refused_whole_and_given_in_blocks_of_rows(coords, monkeypatch):
    """`Coordinates.dense_mask()` of every query is an `n × n` request like the others: refused
    with its size and the way out (rows in blocks), which then fits."""
    batch = coords.batch_size or 1
    needed = batch * 3000 * 3000 * 9  # a bool per pair, an int64 index at the peak
    monkeypatch.setattr(validation, "available_memory", lambda: needed - 1)
    with pytest.raises(MemoryError, match=rf"^Coordinates.dense_mask: the mask's rows \[b={batch}, "
                                          rf"1, rows=3000, n_k=3000\] bool need "
                                          rf"{needed / GIB:.1f} GiB.*start=, stop="):
        coords.dense_mask()
    block = coords.dense_mask(0, 1000)
    assert block.shape == (batch, 1, 1000, 3000) and block.dtype == torch.bool


def test_a_bias_figure_is_refused_before_it_is_drawn(monkeypatch):
    """The plotted bias is `[n_h, n, n]`: past the memory there is, refused by name."""
    pytest.importorskip("matplotlib")
    from mmpe import plot

    needed = 8 * 3000 * 3000 * 16
    monkeypatch.setattr(validation, "available_memory", lambda: needed - 1)
    with pytest.raises(MemoryError, match=r"^plot_bias_vs_distance: the bias \[n_h=8, n_q=3000, "
                                          r"n_k=3000\] float32 need .*--length"):
        plot.plot_bias_vs_distance(mmpe.build("alibi", num_heads=8), mmpe.Sequence(3000))
