"""A score term's eager forms follow its `score_mod` (`ScoreEncoding.__init_subclass__`).

The attention paths read a term through faster forms than `score_mod` (a relation table on
sequences, an offset table on grids, head rows and tiles on points and graphs). A subclass that
overrides `score_mod` or `bias_rows` and inherited its parent's forms got its parent's numbers
on those paths, and its own under FlexAttention: the rows below were wrong before the rule
(the control of each test restores the inherited forms and must fail the same comparison).
"""

from __future__ import annotations

import copy

import pytest
import torch

import mmpe
from mmpe.attention import grid as grid_path
from mmpe.encodings.base import EAGER_FORMS, ScoreEncoding
from mmpe.registry import available

HEADS, D_MODEL = 2, 8
CONTEXT = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL,
           "grid_shape": (4, 4)}
OPTIONS = {"fire": {"init_L": 2.0, "init_c": 0.5},
           "gaussian_distance": {"num_kernels": 8, "mlp_width": 8}}

#: (encoding, coordinates, budget): every eager form of each encoding is read on some row
CASES = [
    ("alibi", "sequence", None), ("t5", "sequence", None), ("kerple_log", "sequence", None),
    ("fire", "sequence", None),
    ("alibi", "grid", None), ("t5", "grid", None), ("kerple_log", "grid", None),
    ("fire", "grid", None), ("swin", "grid", None), ("swinv2_cpb", "grid", None),
    ("gaussian_distance", "grid", None),
    ("alibi", "points", "blocked"), ("kerple_log", "points", "blocked"),
    ("fire", "points", "blocked"), ("gaussian_distance", "points", "blocked"),
    ("kerple_log", "points", None), ("gaussian_distance", "points", None),
    ("graphormer_spatial", "graph", "blocked"), ("graphormer_spatial", "graph", None),
]


@pytest.fixture
def fast_paths(monkeypatch):
    """Small grids take the grid path."""
    monkeypatch.setattr(grid_path, "GRID_MIN_BIAS_BYTES", 0)
    monkeypatch.setattr(grid_path, "GRID_MIN_LEARNED_BIAS_BYTES", 0)


def _coords(kind: str):
    gen = torch.Generator().manual_seed(0)
    if kind == "sequence":
        return mmpe.Sequence(12, causal=True)
    if kind == "grid":
        return mmpe.Grid((4, 4), prefix_tokens=1)
    if kind == "points":
        return mmpe.Points(torch.rand(1, 14, 3, generator=gen) * 4)
    chain = torch.arange(11)
    return mmpe.Graph(torch.stack((chain, chain + 1)), num_nodes=12)


def _doubled(cls: type, inherit: bool = False) -> type:
    """A subclass whose `score_mod` adds twice its parent's term and a term of the query's
    index (not a function of the cell offset: a grid's offset table would miss it); with
    `inherit`, the parent's eager forms put back (the subclass as it was before the rule)."""

    class Doubled(cls):
        def score_mod(self, ctx):
            inner = super().score_mod(ctx)

            def mod(score, b, h, q_idx, kv_idx):
                term = 2 * (inner(score, b, h, q_idx, kv_idx) - score)
                return score + term + 0.05 * q_idx

            return mod

    if inherit:
        for form in EAGER_FORMS:
            if form in vars(Doubled):
                setattr(Doubled, form, getattr(cls, form))
    return Doubled


class _Plain(ScoreEncoding):
    """Another term's `score_mod` and nothing else: every path evaluates it on the pairs."""

    def __init__(self, inner: ScoreEncoding) -> None:
        super().__init__()
        self.inner = inner

    def score_mod(self, ctx):
        return self.inner.score_mod(ctx)

    def check_context(self, ctx) -> None:
        self.inner.check_context(ctx)


def _step(enc: ScoreEncoding, params: list, coords, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, input gradient and the term's parameter gradients of one attention layer."""
    torch.manual_seed(1)  # the same projections for every layer
    attn = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_()
    out = attn(x, coords)
    out.square().sum().backward()
    return [out.detach(), x.grad, *(p.grad if p.grad is not None else torch.zeros_like(p)
                                    for p in params)]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(s, t, rtol=1e-4, atol=1e-5) for s, t in zip(a, b, strict=True))


@pytest.mark.parametrize(("name", "kind", "budget"), CASES)
def test_a_subclass_score_mod_reaches_every_path(name, kind, budget, fast_paths,
                                                 monkeypatch) -> None:
    if budget == "blocked":
        monkeypatch.setenv("MMPE_ATTN_BLOCK_BYTES", "100")
    torch.manual_seed(0)
    parent = mmpe.build(name, context=CONTEXT, **OPTIONS.get(name, {}))
    coords = _coords(kind)
    x = torch.randn(1, coords.num_queries, D_MODEL, generator=torch.Generator().manual_seed(2))
    enc, stale = copy.deepcopy(parent), copy.deepcopy(parent)
    enc.__class__, stale.__class__ = _doubled(type(parent)), _doubled(type(parent), True)
    want = _step(_Plain(enc), list(enc.parameters()), coords, x)
    got = _step(enc, list(enc.parameters()), coords, x)
    assert _close(got, want), f"{name} on {kind}: the subclass's paths disagree"
    # the control: with its parent's forms the subclass gets its parent's numbers
    assert not _close(_step(stale, list(stale.parameters()), coords, x), want)


def test_forms_follow_score_mod() -> None:
    from mmpe.encodings.t5 import T5RelativeBias

    class Own(T5RelativeBias):
        def score_mod(self, ctx):
            return super().score_mod(ctx)

    class Declared(Own):
        relation_bias = T5RelativeBias.relation_bias
        grid_offset_only = True

    class Same(T5RelativeBias):
        pass

    assert Own.bias_rows is ScoreEncoding.bias_rows
    assert Own.relation_bias is ScoreEncoding.relation_bias
    assert Own.grid_offset_only is False
    assert Declared.relation_bias is T5RelativeBias.relation_bias and Declared.grid_offset_only
    assert Declared.bias_rows is ScoreEncoding.bias_rows  # (inherited from Own)
    for form in EAGER_FORMS:
        assert getattr(Same, form, None) is getattr(T5RelativeBias, form, None)


def test_forms_follow_bias_rows() -> None:
    from mmpe.encodings.kerple import KerpleLog

    class Rows(KerpleLog):
        def bias_rows(self, ctx, start, stop):
            return 2 * super().bias_rows(ctx, start, stop)

    assert Rows.head_rows is ScoreEncoding.head_rows
    assert Rows.bias_tiles is None and Rows.bias_rows_vjp is None
    # the relation table reads score_mod, which Rows keeps
    assert Rows.relation_bias is KerpleLog.relation_bias and Rows.grid_offset_only


def _generic(form: str):
    return vars(ScoreEncoding).get(form, False if form == "grid_offset_only" else None)


def test_no_builtin_encoding_loses_a_form() -> None:
    """Every registered score encoding keeps the forms its ancestors define (the rule only
    touches subclasses that override what a form reads)."""
    checked = 0
    for entry in available():
        cls = entry.cls
        if not issubclass(cls, ScoreEncoding):
            continue
        for form in EAGER_FORMS:
            ancestors = [vars(c)[form] for c in cls.__mro__[1:]
                         if form in vars(c) and c is not ScoreEncoding]
            if ancestors and vars(cls).get(form, ancestors[0]) is _generic(form):
                raise AssertionError(f"{cls.__name__} lost its parent's {form}")
            checked += bool(ancestors)
    assert checked > 0
