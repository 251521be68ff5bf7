"""Learned terms with tiles take the tiles plan below the block budget (`prefers_tiles`).

Where every term of a layer has `bias_tiles` (KERPLE-log, FIRE, Graphormer's spatial bias) and
the layer trains one of them, the tiles plan's hand-written backward beats autograd through
the dense bias from `TILES_MIN_TILED_PAIRS` pairs per entry and head up (and holds about the
unbiased layer's memory instead of 6–7×). Elsewhere the dense path stays.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mmpe
from mmpe.attention.plans import tiles
from mmpe.encodings.kerple import KerpleLog

HEADS, D_MODEL = 2, 8
CONTEXT = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL}
#: tokens of the cases: 400² pairs per head, above the threshold (384²); SMALL below it
LARGE, SMALL = 400, 300


def _points(n: int, batch: int = 1, grad: bool = False) -> mmpe.Points:
    pos = torch.rand(batch, n, 3, generator=torch.Generator().manual_seed(n)) * 4
    return mmpe.Points(pos.requires_grad_(grad))


def _graph(n: int) -> mmpe.Graph:
    chain = torch.arange(n - 1)
    return mmpe.Graph(torch.stack((chain, chain + 1)), num_nodes=n, max_distance=16)


def _encoding(name: str) -> mmpe.encodings.base.ScoreEncoding:
    torch.manual_seed(0)
    enc = mmpe.build(name, context=CONTEXT)
    with torch.no_grad():  # off the initial values, so that each term changes the output
        for p in enc.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return enc


def _tiles_runs(encodings, coords, grad: bool = True) -> int:
    """How many times one layer's forward took the tiles plan."""
    calls = []
    real = tiles.TilesPlan.run

    def spy(self, *args):
        calls.append(1)
        return real(self, *args)

    torch.manual_seed(1)
    attn = mmpe.MultiHeadAttention(D_MODEL, HEADS, encodings)
    x = torch.randn(coords.batch_size or 1, coords.num_queries, D_MODEL)
    with pytest.MonkeyPatch.context() as mp, torch.set_grad_enabled(grad):
        mp.setattr(tiles.TilesPlan, "run", spy)
        attn(x.requires_grad_(grad), coords)
    return len(calls)


@pytest.mark.parametrize(("names", "coords"), [
    (["kerple_log"], lambda: _points(LARGE)),
    (["fire"], lambda: _points(LARGE, batch=2)),
    (["kerple_log", "fire"], lambda: _points(LARGE)),
    (["graphormer_spatial"], lambda: _graph(LARGE)),
])
def test_learned_tiled_terms_take_the_tiles_plan(names, coords) -> None:
    assert _tiles_runs([_encoding(n) for n in names], coords()) == 1


def _frozen(name: str):
    enc = _encoding(name)
    enc.requires_grad_(False)
    return enc


class _OwnRows(KerpleLog):
    """A subclass with its own formula: no tiles (fast forms are keyed by exact class)."""

    def distance_term(self, ctx):
        term = super().distance_term(ctx)
        return lambda dist, h: 2 * term(dist, h)


@pytest.mark.parametrize(("case", "encodings", "coords", "grad"), [
    ("below the threshold", lambda: [_encoding("kerple_log")], lambda: _points(SMALL), True),
    ("no gradient", lambda: [_encoding("kerple_log")], lambda: _points(LARGE), False),
    ("frozen parameters", lambda: [_frozen("fire")], lambda: _points(LARGE), True),
    ("positions with a gradient (a force field)", lambda: [_encoding("kerple_log")],
     lambda: _points(LARGE, grad=True), True),
    ("a term without tiles", lambda: [_encoding("kerple_log"), _encoding("gaussian_distance")],
     lambda: _points(LARGE), True),
    ("a subclass's own formula", lambda: [_OwnRows(HEADS)], lambda: _points(LARGE), True),
    ("ALiBi (no parameter)", lambda: [_encoding("alibi")], lambda: _points(LARGE), True),
    ("a grid", lambda: [_encoding("kerple_log")],
     lambda: mmpe.Grid((20, 20), prefix_tokens=1), True),
])
def test_the_dense_path_stays(case, encodings, coords, grad) -> None:
    assert _tiles_runs(encodings(), coords(), grad) == 0, case


def _step(enc, coords, route: str) -> list[torch.Tensor]:
    torch.manual_seed(1)
    attn = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route=route)
    x = torch.randn(coords.batch_size or 1, coords.num_queries, D_MODEL,
                    generator=torch.Generator().manual_seed(2)).requires_grad_()
    out = attn(x, coords)
    out.square().sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in enc.parameters() if p.requires_grad)]


@pytest.mark.parametrize(("name", "coords"), [
    ("kerple_log", lambda: _points(LARGE, batch=2)),
    ("fire", lambda: _points(LARGE)),
    ("graphormer_spatial", lambda: _graph(LARGE)),
])
def test_the_tiles_plan_equals_the_math_route(name, coords) -> None:
    coords = coords()
    enc = _encoding(name)
    fast = _step(enc, coords, "sdpa")
    want = _step(copy.deepcopy(enc), coords, "math")
    for a, b in zip(fast, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    # the control: another term's parameters fail the same comparison
    other = copy.deepcopy(enc)
    with torch.no_grad():
        next(p for p in other.parameters() if p.requires_grad).mul_(1.5)
    moved = _step(other, coords, "math")
    assert not all(torch.allclose(a, b, atol=2e-5, rtol=1e-4)
                   for a, b in zip(fast[:2], moved[:2], strict=True))
