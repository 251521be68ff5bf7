"""Fast forms are keyed by exact class, and a subclass's structure follows its `score_mod`.

The attention paths read a term through faster forms than `score_mod` (a relation table on
sequences, an offset table on grids, head rows and tiles on points and graphs), chosen from the
term's declared structure or from `mmpe.attention.fast_forms.FAST_FORMS`. A subclass that
overrides `score_mod` gets neither its parent's fast forms nor its parent's structure, so every
path gives its own numbers; the control of each row gives it its parent's forms back and must
fail the same comparison. The rows are drawn from the table and the registry, not a hand list.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import structured_score_cases

import mmpe
from mmpe.attention import fast_forms
from mmpe.attention.plans import grid as grid_path
from mmpe.encodings.base import ScoreEncoding
from mmpe.registry import available

HEADS, D_MODEL = 2, 24
CONTEXT = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL,
           "grid_shape": (4, 4)}
OPTIONS = {"fire": {"init_L": 2.0, "init_c": 0.5},
           "gaussian_distance": {"num_kernels": 8, "mlp_width": 8}}

KINDS = ("sequence", "grid", "points", "graph")


def _cases() -> list[tuple[str, str, str | None]]:
    """(encoding, coordinates, budget): points and graphs also with a tiny block budget (the
    tiles plan)."""
    pairs = structured_score_cases(CONTEXT, OPTIONS, {k: _coords(k) for k in KINDS})
    return [(name, kind, budget) for name, kind in pairs
            for budget in ((None, "tiles") if kind in ("points", "graph") else (None,))]


@pytest.fixture
def fast_paths(monkeypatch):
    """Small grids take the grid plan, short sequences the relation plan."""
    monkeypatch.setattr("mmpe.attention.plans.relation.RELATION_MIN_BIAS_BYTES", 0)
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
    return mmpe.Graph(torch.stack((chain, chain + 1)), num_nodes=12,
                      edge_attr=(chain % 3)[:, None])


def _doubled(cls: type) -> type:
    """A subclass whose `score_mod` adds twice its parent's term and a term of the query's
    index (not a function of the cell offset: a grid's offset table would miss it)."""

    class Doubled(cls):
        def score_mod(self, ctx):
            inner = super().score_mod(ctx)

            def mod(score, b, h, q_idx, kv_idx):
                term = 2 * (inner(score, b, h, q_idx, kv_idx) - score)
                return score + term + 0.05 * q_idx

            return mod

    return Doubled


def _stale(cls: type, parent: type, monkeypatch) -> None:
    """The control: `cls` given its parent's fast forms and structure back."""
    monkeypatch.setitem(fast_forms.FAST_FORMS, cls, fast_forms.FAST_FORMS.get(parent, {}))
    monkeypatch.setattr(cls, "structure", parent.structure)


class _Plain(ScoreEncoding):
    """Another term's `score_mod` and nothing else: every path evaluates it on the pairs."""

    def __init__(self, inner: ScoreEncoding) -> None:
        super().__init__()
        self.inner = inner
        self.content_free = inner.content_free

    def score_mod(self, ctx):
        return self.inner.score_mod(ctx)

    def check_call(self, ctx) -> None:
        self.inner.check_call(ctx)


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


def test_the_cases_cover_every_fast_form() -> None:
    names = {type(mmpe.build(n, context=CONTEXT, **OPTIONS.get(n, {}))) for n, _, _ in CASES}
    registered = {e.cls for e in available()}
    assert {c for c in fast_forms.FAST_FORMS if c in registered} <= names
    assert len(CASES) >= 19


CASES = _cases()


def _case(name, kind, budget, monkeypatch) -> tuple[bool, bool]:
    """Whether the subclass's layer equals its plain `score_mod` on every path, and whether
    the control (the parent's forms put back) differs."""
    with monkeypatch.context() as mp:
        if budget == "tiles":
            mp.setenv("MMPE_ATTN_BLOCK_BYTES", "100")
        torch.manual_seed(0)
        parent = mmpe.build(name, context=CONTEXT, **OPTIONS.get(name, {}))
        coords = _coords(kind)
        x = torch.randn(1, coords.num_queries, D_MODEL,
                        generator=torch.Generator().manual_seed(2))
        enc = copy.deepcopy(parent)
        enc.__class__ = _doubled(type(parent))
        assert enc.structure == "pair" and not fast_forms.FAST_FORMS.get(type(enc))
        want = _step(_Plain(enc), list(enc.parameters()), coords, x)
        same = _close(_step(enc, list(enc.parameters()), coords, x), want)
        _stale(type(enc), type(parent), mp)
        return same, not _close(_step(enc, list(enc.parameters()), coords, x), want)


@pytest.mark.parametrize("name", sorted({n for n, _, _ in CASES}))
def test_a_subclass_score_mod_reaches_every_path(name, fast_paths, monkeypatch) -> None:
    caught = False
    for _, kind, budget in [c for c in CASES if c[0] == name]:
        same, differs = _case(name, kind, budget, monkeypatch)
        assert same, f"{name} on {kind} ({budget}): the subclass's paths disagree"
        caught |= differs
    # the control: with its parent's forms the subclass gets its parent's numbers somewhere
    assert caught, f"{name}: no path read the parent's forms"


def test_structure_follows_score_mod() -> None:
    from mmpe.encodings.alibi import ALiBi
    from mmpe.encodings.t5 import T5RelativeBias

    class Own(T5RelativeBias):
        def score_mod(self, ctx):
            return super().score_mod(ctx)

    class Declared(Own):
        structure = "relation"

    class Same(T5RelativeBias):
        pass

    class OwnTerm(ALiBi):  # a new distance term: the derived score_mod follows it
        def distance_term(self, ctx):
            term = super().distance_term(ctx)
            return lambda d, h: 3 * term(d, h)

    assert Own.structure == "pair" and Declared.structure == "relation"
    assert Same.structure == "relation" and OwnTerm.structure == "distance"
    assert fast_forms.get(Same(2), "dense") is None  # exact class only
    with pytest.raises(TypeError, match="structure must be one of"):
        type("Bad", (ScoreEncoding,), {"structure": "diagonal"})
