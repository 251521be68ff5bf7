"""A score encoding's `check_context` does its work once per attention call, whichever plan
runs it and however many blocks, forms and fast forms of the call ask again (issue 48: it ran
up to five times on one call's route, once per block on the blocked plans)."""

from __future__ import annotations

import pytest
import torch

import mmpe
import mmpe.encodings.base as base
from mmpe.attention.dispatch import force_plan

COORDS = {
    "sequence": lambda: mmpe.Sequence(40, causal=True),
    "grid": lambda: mmpe.Grid((5, 6), prefix_tokens=1),
    "points": lambda: mmpe.Points(torch.randn(2, 40, 2)),
}
#: (encoding, coordinates, plans that can run it); every content-free kind of term the CPU
#: plans take: a distance, a relation, a grid offset table, a compact form (FIRE), a learned
#: distance term on points
CASES = [("alibi", "sequence", ("relation", "blocked", "blocks", "dense")),
         ("t5", "sequence", ("relation", "blocked", "blocks", "dense")),
         ("fire", "sequence", ("relation", "blocked", "blocks", "dense")),
         ("swin", "grid", ("grid", "blocked", "blocks", "dense")),
         ("kerple_log", "points", ("blocked", "blocks", "dense"))]


def _counting(monkeypatch) -> list:
    calls: list = []
    real = base.check_attention_work

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(base, "check_attention_work", spy)
    return calls


@pytest.mark.parametrize(("name", "kind", "plans"), CASES, ids=[c[0] for c in CASES])
def test_one_check_per_call_on_every_plan(name, kind, plans, monkeypatch) -> None:
    monkeypatch.setattr("mmpe.attention.memory.block_bytes", lambda: 8192)  # many blocks
    monkeypatch.setattr("mmpe.attention.cpu.blocked.block_bytes", lambda: 8192)
    coords = COORDS[kind]()
    context = {"num_heads": 4, "d_model": 32, "head_dim": 8, "max_len": 128,
               **mmpe.context.coords_context(coords)}
    enc = mmpe.build(name, context=context)
    torch.manual_seed(0)
    for plan in plans:
        for backend in ("sdpa", "math"):
            if backend == "math" and plan != plans[0]:
                continue
            attn = mmpe.MultiHeadAttention(32, 4, encodings=[enc], backend=backend)
            x = torch.randn(2, coords.num_queries, 32, requires_grad=True)
            calls = _counting(monkeypatch)
            with force_plan(plan if backend == "sdpa" else None):
                attn(x, coords).sum().backward()
            assert len(calls) == 1, (plan, backend, len(calls))


def test_a_new_context_is_checked_again() -> None:
    """The memo is the call's context: a context of another attention (more heads than the
    encoding was built for) is refused, even after the encoding passed on another one."""
    enc = mmpe.build("alibi", num_heads=4)
    coords = mmpe.Sequence(8)
    q = torch.randn(1, 4, 8, 8)
    enc.check_context(base.AttentionContext(coords, 4, 8, 1, q=q, k=q, v=q))
    q6 = torch.randn(1, 6, 8, 8)
    with pytest.raises(ValueError, match="built for num_heads=4, attention has 6"):
        enc.check_context(base.AttentionContext(coords, 6, 8, 1, q=q6, k=q6, v=q6))
