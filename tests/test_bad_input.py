"""Malformed inputs to the public API end in a clear ``ValueError``/``TypeError`` naming the
argument: never an internal error (AttributeError, IndexError, ZeroDivisionError, a torch
RuntimeError …), never a silent result.

Three parts: (1) every registered encoding's constructor, each int/float/bool/tuple option
driven with malformed values (hypothesis samples them per option); (2) coordinate
constructors; (3) forwards of the attention modules, rotary encodings and ``mmpe.functional``.
The number of malformed inputs tried is counted at run time (``TRIED``) and the last test
asserts a floor (``MIN_TRIED``) so the coverage cannot silently shrink: 2,271 in all at the
time of writing (hypothesis draws each option's malformed values 2 × their number, over
1,000 distinct (encoding, option, value) triples, plus 25 coordinate and 31 forward cases).
"""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import functional as Fn
from mmpe.validation import _kind

CTX = {"d_model": 32, "num_heads": 4, "head_dim": 8, "max_len": 16,
       "original_max_position_embeddings": 16, "grid_shape": (2, 3), "num_axes": 2}
NAN, INF = float("nan"), float("inf")

#: malformed values per annotated kind (``_kind`` of mmpe.validation reads the annotation)
BAD = {
    "int": [-1, 0, 2.5, "8", None, True, NAN, INF, (1, 2, 3), []],
    "float": [-1.0, 0.0, "8", None, True, NAN, INF, -INF, (1, 2, 3), []],
    "bool": ["yes", None, 2.5, (1, 2, 3), []],
    "shape": [-1, "8", (), (0, 3), (2.5, 3), (-1, 2), None, []],
}

#: values from BAD that are genuinely valid for an option (decided from its docstring)
ALLOWED = {
    ("*", "seed", 0),              # any non-negative generator seed
    ("*", "prefix_tokens", 0),     # no cls/register tokens
    ("*", "init_std", 0.0),        # zero-initialised table
    ("tabpet", "alpha", 0),        # Tab-PET with alpha 0: the spectral code switched off
    ("tabpet", "alpha", 0.0),
    ("rope_yarn", "mscale", -1.0),  # HF YaRN: any real (0.1·mscale·ln s + 1)
    ("rope_yarn", "mscale", 0.0),
    ("rope_yarn", "mscale_all_dim", -1.0),
    ("rope_yarn", "mscale_all_dim", 0.0),
}

TRIED: list[str] = []
MIN_TRIED = 2000


def _options():
    out = []
    for e in mmpe.available():
        for p in inspect.signature(e.cls).parameters.values():
            kind, optional = _kind(p.annotation)
            if kind is None:
                continue
            bad = [v for v in BAD[kind] if not (v is None and optional)]
            out.append(pytest.param(e.name, p.name, bad, id=f"{e.name}-{p.name}"))
    return out


def _expect_named(fn, *names: str) -> None:
    """``fn()`` raises ValueError/TypeError whose message names one of ``names``."""
    TRIED.append(names[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn()
        except (ValueError, TypeError) as err:
            assert any(n in str(err) for n in names), f"{names}: message {err}"
            return
    raise AssertionError(f"no error for a malformed {names[0]}")


@pytest.mark.parametrize(("name", "arg", "bad"), _options())
def test_constructor_options(name: str, arg: str, bad: list) -> None:
    @settings(max_examples=len(bad) * 2, deadline=None, derandomize=True)
    @given(st.sampled_from(bad))
    def check(value):
        TRIED.append(f"{name}.{arg}={value!r}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mmpe.build(name, context=CTX, **{arg: value})
            except (ValueError, TypeError) as err:
                assert arg in str(err), f"{name}({arg}={value!r}): message does not name it: {err}"
                return
        allowed = (name, arg, value) in ALLOWED or ("*", arg, value) in ALLOWED
        # a 3-axis grid is valid for encodings that take any number of axes
        allowed |= arg == "grid_shape" and value == (1, 2, 3)
        assert allowed, f"{name}({arg}={value!r}) was accepted silently"

    check()


# ---------------------------------------------------------------------------------------------
# coordinates
# ---------------------------------------------------------------------------------------------

EI = torch.tensor([[0, 2], [1, 3]])


@pytest.mark.parametrize(("fn", "names"), [
    (lambda: mmpe.Sequence("6"), ("length",)),
    (lambda: mmpe.Sequence(-3), ("length",)),
    (lambda: mmpe.Sequence(6, offset=-1), ("offset",)),
    (lambda: mmpe.Sequence(6, offset=1.5), ("offset",)),
    (lambda: mmpe.Sequence(6, position_ids=list(range(6))), ("position_ids",)),
    (lambda: mmpe.Sequence(6, position_ids=torch.arange(5)), ("position_ids",)),
    (lambda: mmpe.Sequence(6, causal="yes"), ("causal",)),
    (lambda: mmpe.Grid((2, -3)), ("shape",)),
    (lambda: mmpe.Grid("23"), ("shape",)),
    (lambda: mmpe.Grid((2, 3), prefix_tokens=-1), ("prefix_tokens",)),
    (lambda: mmpe.Points(torch.tensor([[0.0, NAN], [1.0, 2.0]])), ("positions",)),
    (lambda: mmpe.Points(torch.zeros(2, 3, 4, 5)), ("positions",)),
    (lambda: mmpe.Points("abc"), ("positions",)),
    (lambda: mmpe.Sphere(torch.tensor([NAN, 0.0]), torch.zeros(2)), ("lat",)),
    (lambda: mmpe.Sphere(torch.zeros(3), torch.zeros(2)), ("lat", "lon")),
    (lambda: mmpe.Graph([[0, 2], [1, 3]], 4), ("graph", "edge_index")),
    (lambda: mmpe.Graph(EI, -1), ("num_nodes",)),
    (lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0, 0, 2, 2])), ("batch",)),
    (lambda: mmpe.Graph(EI, 4, batch=torch.tensor([1, 1, 2, 2])), ("batch",)),
    (lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0.0, 0, 1, 1])), ("batch",)),
    (lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0, 0, 1])), ("batch",)),
    (lambda: mmpe.Table("adjacency"), ("adjacency",)),
    (lambda: mmpe.Composite([]), ("segments",)),
    (lambda: mmpe.Latents(0), ("n",)),
    (lambda: mmpe.Latents("4"), ("n",)),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_coordinates(fn, names) -> None:
    _expect_named(fn, *names)


# ---------------------------------------------------------------------------------------------
# forwards
# ---------------------------------------------------------------------------------------------

def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _mha():
    return mmpe.MultiHeadAttention(32, 4, [mmpe.build("rope", head_dim=8)])


def _rope(q, k, coords):
    return mmpe.build("rope", head_dim=8)(q, k, coords)


S = mmpe.Sequence
Q = torch.randn(2, 4, 6, 8)

FORWARD = [
    ("mha x int", lambda: _mha()(_x(2, 6, 32).long(), S(6)), ("x",)),
    ("mha x float64", lambda: _mha()(_x(2, 6, 32, dtype=torch.float64), S(6)), ("x",)),
    ("mha x bool", lambda: _mha()(_x(2, 6, 32) > 0, S(6)), ("x",)),
    ("mha x list", lambda: _mha()(_x(2, 6, 32).tolist(), S(6)), ("x",)),
    ("mha x rank 2", lambda: _mha()(_x(6, 32), S(6)), ("x",)),
    ("mha x width", lambda: _mha()(_x(2, 6, 16), S(6)), ("x",)),
    ("mha batch mismatch", lambda: _mha()(_x(2, 6, 32),
                                          S(6, position_ids=torch.arange(6).repeat(3, 1))),
     ("batch",)),
    ("mha more queries", lambda: _mha()(_x(2, 6, 32), S(8)), ("x",)),
    ("mha offset no cache", lambda: _mha()(_x(2, 6, 32), S(6, offset=4)), ("offset", "cache")),
    ("mha head_dim str", lambda: mmpe.MultiHeadAttention(32, 4, [], head_dim="8"), ("head_dim",)),
    ("mha d_model float", lambda: mmpe.MultiHeadAttention(32.5, 4, []), ("d_model",)),
    ("mha num_heads 0", lambda: mmpe.MultiHeadAttention(32, 0, []), ("num_heads",)),
    ("transformer x float64", lambda: mmpe.Transformer(32, 4, 1, encodings=["rope"])(
        _x(2, 6, 32, dtype=torch.float64), S(6)), ("x",)),
    ("transformer x int", lambda: mmpe.Transformer(32, 4, 1, encodings=["sinusoidal"])(
        _x(2, 6, 32).long(), S(6)), ("x",)),
    ("cross x float64", lambda: mmpe.CrossAttention(32, 4, [])(
        _x(1, 4, 32, dtype=torch.float64), mmpe.Latents(4), _x(1, 5, 32), S(5)), ("x",)),
    ("cross memory int", lambda: mmpe.CrossAttention(32, 4, [])(
        _x(1, 4, 32), mmpe.Latents(4), _x(1, 5, 32).long(), S(5)), ("memory",)),
    ("input encoding wrong capability", lambda: mmpe.build("sinusoidal", d_model=32).combine(
        _x(1, 4, 32), mmpe.Graph(EI, 4)), ("Positioned",)),
    ("rope q rank 3", lambda: _rope(Q[0], Q[0], S(6)), ("q",)),
    ("rope heads mismatch", lambda: _rope(Q, Q[:, :3], S(6)), ("heads",)),
    ("rope k beyond keys", lambda: _rope(Q, torch.randn(2, 4, 9, 8), S(6)), ("k",)),
    ("rope q head_dim", lambda: _rope(Q[..., :4], Q[..., :4], S(6)), ("h_d",)),
    ("t5_bucket 2 buckets bidirectional",
     lambda: Fn.t5_bucket(torch.arange(5), num_buckets=2, bidirectional=True), ("num_buckets",)),
    ("t5_bucket float buckets", lambda: Fn.t5_bucket(torch.arange(5), num_buckets=2.5),
     ("num_buckets",)),
    ("t5_bucket max_distance", lambda: Fn.t5_bucket(torch.arange(5), max_distance=0),
     ("max_distance",)),
    ("t5_bucket list", lambda: Fn.t5_bucket([0, 1, 2]), ("relative_position",)),
    ("alibi_slopes True", lambda: Fn.alibi_slopes(True), ("num_heads",)),
    ("alibi_slopes 0", lambda: Fn.alibi_slopes(0), ("num_heads",)),
    ("rope_inv_freq odd", lambda: Fn.rope_inv_freq(7), ("rotary_dim",)),
    ("rope_inv_freq negative", lambda: Fn.rope_inv_freq(-4), ("rotary_dim",)),
    ("rope_inv_freq str", lambda: Fn.rope_inv_freq("8"), ("rotary_dim",)),
    ("rope_inv_freq base nan", lambda: Fn.rope_inv_freq(8, NAN), ("base",)),
]


@pytest.mark.parametrize(("label", "fn", "names"), FORWARD, ids=[f[0] for f in FORWARD])
def test_forward(label, fn, names) -> None:
    _expect_named(fn, *names)


def test_zz_count() -> None:
    """The number of malformed inputs driven (runs last in this module: ``zz``)."""
    if len(TRIED) < 100:  # run on its own (-k): nothing to count
        pytest.skip("count only meaningful when the whole module runs")
    print(f"malformed inputs tried: {len(TRIED)}")
    assert len(TRIED) >= MIN_TRIED, len(TRIED)
    assert math.isfinite(len(TRIED))
