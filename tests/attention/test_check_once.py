"""Every term is checked once per attention call, at the door (`_Attention.attend`), whichever
plan runs it and however many blocks, forms and fast forms read it (issue 48: it ran up to five
times on one call's route; issue 56: the forms and `score_mod` trust their caller, so no memo
on the context is needed)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import mmpe
import mmpe.attention.modules as modules
import mmpe.encodings.base as base
from mmpe.attention import fast_forms, forms
from mmpe.attention.dispatch import force_plan

COORDS = {
    "sequence": lambda: mmpe.Sequence(40, causal=True),
    "grid": lambda: mmpe.Grid((5, 6), prefix_tokens=1),
    "points": lambda: mmpe.Points(torch.randn(2, 40, 2)),
}
#: (encoding, coordinates, plans that can run it); every content-free kind of term the CPU
#: plans take: a distance, a relation, a grid offset table, a compact form (FIRE), a learned
#: distance term on points
CASES = [("alibi", "sequence", ("relation", "tiles", "checkpointed", "dense")),
         ("t5", "sequence", ("relation", "tiles", "checkpointed", "dense")),
         ("fire", "sequence", ("relation", "tiles", "checkpointed", "dense")),
         ("swin", "grid", ("grid", "tiles", "checkpointed", "dense")),
         ("kerple_log", "points", ("tiles", "checkpointed", "dense"))]


def _counting(monkeypatch, enc) -> tuple[list, list]:
    """Spies on the call's work guard and on the encoding's own check."""
    work: list = []
    checks: list = []
    real_work, real_check = modules.check_attention_work, type(enc).check_call

    def spy_work(*args, **kwargs):
        work.append(args)
        return real_work(*args, **kwargs)

    def spy_check(self, ctx):
        checks.append(ctx)
        return real_check(self, ctx)

    monkeypatch.setattr(modules, "check_attention_work", spy_work)
    monkeypatch.setattr(type(enc), "check_call", spy_check)
    return work, checks


@pytest.mark.parametrize(("name", "kind", "plans"), CASES, ids=[c[0] for c in CASES])
def test_one_check_per_call_on_every_plan(name, kind, plans, monkeypatch) -> None:
    monkeypatch.setattr("mmpe.attention.memory.block_bytes", lambda: 8192)  # many blocks
    monkeypatch.setattr("mmpe.attention.plans.tiles.block_bytes", lambda: 8192)
    coords = COORDS[kind]()
    context = {"num_heads": 4, "d_model": 32, "head_dim": 8, "max_len": 128,
               **mmpe.context.coords_context(coords)}
    enc = mmpe.build(name, context=context)
    torch.manual_seed(0)
    for plan in plans:
        for route in ("sdpa", "math"):
            if route == "math" and plan != plans[0]:
                continue
            attn = mmpe.MultiHeadAttention(32, 4, encodings=[enc], route=route)
            x = torch.randn(2, coords.num_queries, 32, requires_grad=True)
            work, checks = _counting(monkeypatch, enc)
            with force_plan(plan if route == "sdpa" else None):
                attn(x, coords).sum().backward()
            monkeypatch.undo()
            assert (len(work), len(checks)) == (1, 1), (plan, route, len(work), len(checks))


def test_a_new_context_is_checked_again() -> None:
    """Nothing is remembered between contexts: a context of another attention (more heads
    than the encoding was built for) is refused, even after the encoding passed on another."""
    enc = mmpe.build("alibi", num_heads=4)
    coords = mmpe.Sequence(8)
    q = torch.randn(1, 4, 8, 8)
    enc.check_call(base.AttentionCall(coords, 4, 8, 1, q=q, k=q, v=q))
    q6 = torch.randn(1, 6, 8, 8)
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        enc.check_call(base.AttentionCall(coords, 6, 8, 1, q=q6, k=q6, v=q6))


def _form_sources() -> list[tuple[str, str]]:
    """Every form's source (the public `dense_bias` door aside)."""
    out = [(f"forms.{name}", inspect.getsource(fn)) for name, fn in vars(forms).items()
           if inspect.isfunction(fn) and fn.__module__ == forms.__name__
           and name != "dense_bias"]
    out += [(name, inspect.getsource(mod)) for name, mod in vars(fast_forms).items()
            if inspect.ismodule(mod) and mod.__name__.startswith(fast_forms.__name__)]
    return out


def test_forms_trust_their_caller() -> None:
    """No form checks the context again: the check is the door's."""
    offenders = [name for name, src in _form_sources() if ".check_call(" in src]
    assert offenders == []


def test_score_mods_check_only_a_context_no_layer_checked() -> None:
    """A registered encoding's own `score_mod` checks a context only where `ctx.checked` is
    False (a direct call); inside a layer call the door has checked it."""
    offenders = []
    for entry in mmpe.available():
        cls = entry.cls
        if not (isinstance(cls, type) and issubclass(cls, base.ScoreEncoding)):
            continue
        src = inspect.getsource(cls.score_mod)
        calls = len(re.findall(r"\.check_call\(ctx\)", src))
        if calls != len(re.findall(r"if not ctx\.checked:.*\n\s+self\.check_call\(ctx\)",
                                   src)):
            offenders.append(entry.name)
    assert offenders == []


def test_the_doors_refuse_a_context_the_term_cannot_serve() -> None:
    """The doors where a context enters refuse more heads than the encoding was built for:
    the layer, `mmpe.functional.score_mod`, `dense_bias` and a direct `score_mod` call."""
    enc = mmpe.build("alibi", num_heads=4)
    coords = mmpe.Sequence(8)
    q6 = torch.randn(1, 6, 8, 8)
    ctx = base.AttentionCall(coords, 6, 8, 1, q=q6, k=q6, v=q6)
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        mmpe.attention.dense_bias([enc], ctx)
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        mmpe.functional.score_mod(enc, coords, num_heads=6)
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        enc.score_mod(ctx)
    attn = mmpe.MultiHeadAttention(48, 6, encodings=[enc])
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        attn(torch.randn(1, 8, 48), coords)
