"""The blocked CPU path head by head (``HeadRows``, ``BlockedPlan.head_biases``).

Where every term of a layer gives its rows one head at a time (ALiBi, KERPLE-log, FIRE,
Graphormer's spatial bias), the blocked path's forward pass and its fused backward pass call
SDPA's fused kernel once per batch entry and head, on larger blocks of queries. Checked: each
term's head rows are bit for bit its ``bias_rows`` (any block, batch, padding, a wider sum dtype,
written or added), with a control that a head off by one fails; the path is taken; and it gives
the outputs and gradients of the all-heads path it stands in for.
"""

from __future__ import annotations

import pytest
import torch
from helpers import lattice, random_points, without_head_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

import mmpe
import mmpe.attention.cpu.blocked as blocked
from mmpe import MultiHeadAttention
from mmpe.attention import forms
from mmpe.attention.fast_forms import fire_tiles as _fire_tiles
from mmpe.attention.term_layouts import HeadRows
from mmpe.encodings.base import AttentionContext

HEAD_NAMES = ["alibi", "kerple_log", "fire", "graphormer_spatial"]
OPTIONS = {"fire": {"init_L": 2.0, "init_c": 0.5}}


def _encoding(name: str, heads: int, seed: int, **options):
    torch.manual_seed(seed)
    enc = mmpe.build(name, context={"num_heads": heads, "head_dim": 4, "d_model": 4 * heads},
                     **{**OPTIONS.get(name, {}), **options})
    with torch.no_grad():  # every learnable parameter off its initial value
        for p in enc.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return enc


def _points(batch: int | None, n: int, seed: int, padded: bool) -> mmpe.Points:
    return random_points(batch, n, seed, padded)[0]


def _coords(name: str, batch, n: int, seed: int, padded: bool):
    if name == "graphormer_spatial":  # (`padded`: a virtual token, codes −2 and −1 both)
        return lattice(n, batch=batch is not None, virtual=padded)
    return _points(batch, n, seed, padded)


def _written(rows: HeadRows, shape, heads: int, batch: int, dtype, base: Tensor | None):
    """Every entry's and head's rows as `write` gives them, `[b, n_h, R, n_k]`."""
    out = torch.empty(batch, heads, *shape, dtype=dtype)
    for i in range(batch):
        for head in range(heads):
            buf = torch.empty(shape, dtype=dtype) if base is None else base[i, head].clone()
            rows.write(buf, i, head, add=base is not None)
            out[i, head] = buf
    return out



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(HEAD_NAMES), heads=st.integers(1, 4),
       batch=st.sampled_from([None, 1, 2]), padded=st.booleans(), n=st.integers(2, 14),
       wide=st.booleans(), add=st.booleans(), seed=st.integers(0, 999), data=st.data())
def test_head_rows_equal_bias_rows(name, heads, batch, padded, n, wide, add, seed, data) -> None:
    # FIRE in both of its forms (ramps, gathered pieces); ALiBi also with a distance unit
    limit = data.draw(st.sampled_from([-1, 64]))
    unit = data.draw(st.sampled_from([1.0, 0.7])) if name == "alibi" else None
    enc = _encoding(name, heads, seed, **({} if unit is None else {"distance_unit": unit}))
    coords = _coords(name, batch, n, seed, padded)
    ctx = AttentionContext(coords, heads, 4, coords.batch_size or 1)
    start = data.draw(st.integers(0, coords.num_queries - 1))
    stop = data.draw(st.integers(start + 1, coords.num_queries))
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(_fire_tiles, "RAMP_MAX_CUTS", limit)
        ref = forms.rows(enc, ctx, start, stop).clone()
        rows = forms.head_rows(enc, ctx, start, stop)
    b = coords.batch_size or 1
    dtype = torch.float64 if wide else rows.dtype
    assert rows.dtype == ref.dtype
    base = torch.randn(b, heads, stop - start, coords.num_keys, dtype=dtype) if add else None
    got = _written(rows, (stop - start, coords.num_keys), heads, b, dtype, base)
    want = ref.to(dtype).expand(b, heads, -1, -1)
    assert torch.equal(got, want if base is None else base + want)


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_head_rows_comparison_catches_a_wrong_head(name) -> None:
    # The control of the test above: rows written for the next head fail it.
    enc = _encoding(name, 3, 5)
    coords = _coords(name, 2, 12, 5, False)
    ctx = AttentionContext(coords, 3, 4, coords.batch_size)
    stop = min(9, coords.num_queries)
    with torch.no_grad():
        ref = forms.rows(enc, ctx, 2, stop).clone()
        rows = forms.head_rows(enc, ctx, 2, stop)
    fill = rows.fill
    rows.fill = lambda out, i, head, offset: fill(out, i, (head + 1) % 3, offset)
    got = _written(rows, (stop - 2, coords.num_keys), 3, 2, rows.dtype, None)
    assert not torch.equal(got, ref.expand(2, 3, -1, -1))


def _step(encs, coords, heads: int, dtype, seed: int):
    """Output and gradients (x, every learnable parameter) of one blocked step."""
    torch.manual_seed(seed)
    attn = MultiHeadAttention(4 * heads, heads, encs).to(dtype)
    batch = coords.batch_size or 2
    x = torch.randn(batch, coords.num_queries, 4 * heads, dtype=dtype, requires_grad=True)
    out = attn(x, coords)
    params = [p for e in encs for p in e.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * torch.cos(out)).sum(), [x, *params], allow_unused=True)
    return [out.detach(), *(g for g in grads if g is not None)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(st.sampled_from(["alibi", "kerple_log", "fire"]), min_size=1, max_size=2,
                      unique=True),
       heads=st.integers(1, 3), batch=st.sampled_from([None, 2]), padded=st.booleans(),
       n=st.integers(3, 20), float64=st.booleans(), fixed=st.booleans(),
       seed=st.integers(0, 999))
def test_head_path_equals_all_heads_path(names, heads, batch, padded, n, float64, fixed,
                                          seed) -> None:
    # `fixed`: no parameter needs a gradient, so the fused kernel's backward runs head by head
    # too; otherwise the backward is the tiled one of both paths.
    dtype = torch.float64 if float64 else torch.float32
    coords = _points(batch, n, seed, padded)
    encs = [_encoding(name, heads, seed) for name in names]
    if fixed:
        for p in (p for e in encs for p in e.parameters()):
            p.requires_grad_(False)
    taken = []
    real = blocked.BlockedPlan.head_biases

    def spy(self, q):
        taken.append(self.head_block)
        yield from real(self, q)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MMPE_ATTN_BLOCK_BYTES", "1")  # blocks of one query
        mp.setattr(blocked.BlockedPlan, "head_biases", spy)
        by_head = _step(encs, coords, heads, dtype, seed)
        assert taken, "the head-by-head path was not taken"
        mp.setattr(forms, "offers", without_head_rows(forms.offers))
        taken.clear()
        all_heads = _step(encs, coords, heads, dtype, seed)
        assert not taken
    tol = 1e-12 if float64 else 1e-6
    for a, b in zip(by_head, all_heads, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("fixed", [False, True])
def test_graph_head_path_equals_all_heads_path(monkeypatch, fixed) -> None:
    # two graphs of a batch (padded to one size), Graphormer's table learned or fixed
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "1")  # blocks of one query
    coords = lattice(15, batch=True)
    encs = [_encoding("graphormer_spatial", 2, 1), _encoding("alibi", 2, 2)]
    encs[0].table.requires_grad_(not fixed)
    by_head = _step(encs, coords, 2, torch.float32, 3)
    monkeypatch.setattr(forms, "offers", without_head_rows(forms.offers))
    all_heads = _step(encs, coords, 2, torch.float32, 3)
    for a, b in zip(by_head, all_heads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_one_term_without_head_rows_keeps_the_all_heads_path(monkeypatch) -> None:
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "1")  # blocks of one query
    coords = _points(None, 10, 0, False)
    attn = MultiHeadAttention(8, 2, [_encoding("alibi", 2, 0), _encoding("kerple_power", 2, 0)])
    called = []
    monkeypatch.setattr(blocked.BlockedPlan, "head_biases",
                        lambda self, q: called.append(True) or iter(()))
    with torch.no_grad():
        out = attn(torch.randn(1, 10, 8), coords)
    assert not called and torch.isfinite(out).all()


def test_head_block_follows_the_budget_and_threads(monkeypatch) -> None:
    # 1,024 queries a block by default, at least 256 per thread, fewer where the budget is small
    coords = _points(None, 8, 0, False)
    q = torch.randn(1, 2, 8, 4)
    ctx = AttentionContext(coords, 2, 4, 1, q=q, k=q, v=q)
    enc = [_encoding("alibi", 2, 0)]
    assert blocked.BlockedPlan(enc, ctx, 0.5).head_block == blocked.BLOCKED_HEAD_ROWS
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert blocked.BlockedPlan(enc, ctx, 0.5).head_block == 2048
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", str(3 * 8 * 8 * 5))
    assert blocked.BlockedPlan(enc, ctx, 0.5).head_block == 5


def test_a_subclass_with_its_own_score_mod_keeps_the_all_heads_path(monkeypatch) -> None:
    # ALiBi's head rows are ALiBi's numbers: a subclass that changes score_mod must not get
    # them (fast forms are keyed by exact class); its layer equals the math path.
    from mmpe.encodings.alibi import ALiBi

    class Doubled(ALiBi):
        def score_mod(self, ctx):
            mod = super().score_mod(ctx)
            return lambda score, b, h, q, k: 2 * mod(score, b, h, q, k) - score

    assert Doubled.structure == "pair"  # its formula is no longer ALiBi's distance term
    assert not forms.offers(Doubled(2), "head_rows")
    assert forms.offers(ALiBi(2), "head_rows")
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "1")  # blocks of one query
    coords = _points(None, 9, 0, False)
    x = torch.randn(1, 9, 8)

    def layer(enc, **kwargs):
        torch.manual_seed(0)
        return MultiHeadAttention(8, 2, [enc], **kwargs)

    with torch.no_grad():
        fast = layer(Doubled(2))(x, coords)
        slow = layer(Doubled(2), backend="math")(x, coords)
        plain = layer(ALiBi(2))(x, coords)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(fast, plain, atol=1e-4)


def test_head_rows_that_return_none_raise(monkeypatch) -> None:
    from mmpe.attention import fast_forms
    from mmpe.encodings.alibi import ALiBi

    class NoRows(ALiBi):
        pass

    monkeypatch.setitem(fast_forms.FAST_FORMS, NoRows, {"head_rows": lambda *args: None})
    monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "1")  # blocks of one query
    with pytest.raises(TypeError, match="NoRows: its fast head_rows form returned None"), \
            torch.no_grad():
        MultiHeadAttention(8, 2, [NoRows(2)])(torch.randn(1, 9, 8), _points(None, 9, 0, False))
