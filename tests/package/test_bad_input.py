"""Malformed inputs to the public API end in a clear ``ValueError``/``TypeError`` naming the
argument: never an internal error (AttributeError, IndexError, ZeroDivisionError, a torch
RuntimeError …), never a silent result.

Three parts: (1) every registered encoding's constructor, each int/float/bool/tuple option
driven with malformed values (hypothesis samples them per option); (2) coordinate
constructors; (3) forwards of the attention modules, rotary encodings and ``mmpe.functional``.
The distinct cases are counted from the case lists (``tests/bad_input_counts.py``), and a test
holds them above a floor (``MIN_CASES``) so the coverage cannot silently shrink: 2,868 at the
time of writing (2,753 (encoding, option, value) triples, 25 coordinate, 31 forward and 59
newer-API cases). A count of what ran would depend on which tests an xdist worker drew.
A fourth part, (4), drives the newer APIs: caches and generation, cross-attention, the
integrations, plugins and the registry, geometry, sphere time, and resource limits.

Every case has a category (`CATEGORIES`): a constructor option's from its value
(`option_category`), every other case's stated with it. `python tests/bad_input_counts.py`
prints the counts per category and per part, this module's and tests/package/test_misuse_edges.py's.
"""

from __future__ import annotations

import inspect
import warnings
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import functional as Fn
from mmpe.validation import AttentionTooLargeError, _kind

#: what is wrong with a malformed input:
#: shape — a tensor or tuple of the wrong rank, length or size;
#: dtype — a value of the wrong type (a str for an int, a float tensor for token ids);
#: range — the right type, a value out of range (0 heads, NaN, a latitude of 95°);
#: unsupported-combination — each argument valid, together not (an encoding on coordinates
#:   without its capability, two unrelated coordinate systems, deprecated and new names);
#: resource — more memory or time than the machine has;
#: api-misuse — the API used against its contract (a cache of another model, a str as cache).
CATEGORIES = ("shape", "dtype", "range", "unsupported-combination", "resource", "api-misuse")


def case(label: str, fn, names: tuple, category: str, *, needs: str | None = None):
    """One malformed input: ``fn()`` must raise an error naming one of ``names``."""
    assert category in CATEGORIES, category
    marks = [pytest.mark.skipif(not _importable(needs), reason=f"needs {needs}")] if needs else []
    return pytest.param(fn, names, category, id=f"{category}: {label}", marks=marks)


def _importable(module: str) -> bool:
    import importlib.util
    import os

    hidden = os.environ.get("MMPE_HIDE_EXTRAS") == "1"  # core-only mode: extras count as absent
    return not hidden and importlib.util.find_spec(module) is not None


def option_category(kind: str, value) -> str:
    """A malformed constructor option's category, from its value: a number (not a bool) for a
    number is out of range, and so is a tuple of wrong entries for a shape; anything else has
    the wrong type."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "float" and number:
        return "range"
    if kind == "int" and number:
        return "range" if float(value).is_integer() else "dtype"
    if kind == "shape" and isinstance(value, tuple):
        return "shape"
    return "dtype"

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
    ("maglap", "q", 0.0),          # magnetic Laplacian at q = 0: the symmetrised graph's Laplacian
    ("abacus", "max_offset", 0),   # documented: 0 disables the random training offset
}

MIN_CASES = 2800


def _options():
    out = []
    for e in mmpe.available():
        for p in inspect.signature(e.cls).parameters.values():
            kind, optional = _kind(p.annotation)
            if kind is None:
                continue
            bad = [v for v in BAD[kind] if not (v is None and optional)]
            out.append(pytest.param(e.name, p.name, kind, bad, id=f"{e.name}-{p.name}"))
    return out


def _expect_named(fn, names: tuple, category: str) -> None:
    """``fn()`` raises ValueError/TypeError (a resource case: MemoryError or
    AttentionTooLargeError) whose message names one of ``names``."""
    errors = (MemoryError, AttentionTooLargeError) if category == "resource" else (
        ValueError, TypeError, KeyError)  # KeyError: an unknown registry name, by contract
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn()
        except errors as err:
            assert any(n in str(err) for n in names), f"{names}: message {err}"
            return
    raise AssertionError(f"no error for a malformed {names[0]}")


@pytest.mark.parametrize(("name", "arg", "kind", "bad"), _options())
def test_constructor_options(name: str, arg: str, kind: str, bad: list) -> None:
    @settings(max_examples=len(bad) * 2, deadline=None, derandomize=True)
    @given(st.sampled_from(bad))
    def check(value):
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


COORDINATES = [
    case("Sequence length str", lambda: mmpe.Sequence("6"), ("length",), "dtype"),
    case("Sequence length negative", lambda: mmpe.Sequence(-3), ("length",), "range"),
    case("Sequence offset negative", lambda: mmpe.Sequence(6, offset=-1), ("offset",), "range"),
    case("Sequence offset float", lambda: mmpe.Sequence(6, offset=1.5), ("offset",), "dtype"),
    case("Sequence position_ids list", lambda: mmpe.Sequence(6, position_ids=list(range(6))),
         ("position_ids",), "dtype"),
    case("Sequence position_ids length", lambda: mmpe.Sequence(6, position_ids=torch.arange(5)),
         ("position_ids",), "shape"),
    case("Sequence causal str", lambda: mmpe.Sequence(6, causal="yes"), ("causal",), "dtype"),
    case("Grid negative axis", lambda: mmpe.Grid((2, -3)), ("shape",), "shape"),
    case("Grid shape str", lambda: mmpe.Grid("23"), ("shape",), "dtype"),
    case("Grid prefix_tokens negative", lambda: mmpe.Grid((2, 3), prefix_tokens=-1),
         ("prefix_tokens",), "range"),
    case("Points NaN", lambda: mmpe.Points(torch.tensor([[0.0, NAN], [1.0, 2.0]])),
         ("positions",), "range"),
    case("Points rank 4", lambda: mmpe.Points(torch.zeros(2, 3, 4, 5)), ("positions",), "shape"),
    case("Points str", lambda: mmpe.Points("abc"), ("positions",), "dtype"),
    case("Sphere lat NaN", lambda: mmpe.Sphere(torch.tensor([NAN, 0.0]), torch.zeros(2)),
         ("lat",), "range"),
    case("Sphere lat/lon lengths", lambda: mmpe.Sphere(torch.zeros(3), torch.zeros(2)),
         ("lat", "lon"), "shape"),
    case("Graph edges list", lambda: mmpe.Graph([[0, 2], [1, 3]], 4), ("graph", "edge_index"),
         "dtype"),
    case("Graph num_nodes negative", lambda: mmpe.Graph(EI, -1), ("num_nodes",), "range"),
    case("Graph batch gap", lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0, 0, 2, 2])),
         ("batch",), "range"),
    case("Graph batch from 1", lambda: mmpe.Graph(EI, 4, batch=torch.tensor([1, 1, 2, 2])),
         ("batch",), "range"),
    case("Graph batch float", lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0.0, 0, 1, 1])),
         ("batch",), "dtype"),
    case("Graph batch length", lambda: mmpe.Graph(EI, 4, batch=torch.tensor([0, 0, 1])),
         ("batch",), "shape"),
    case("Table adjacency str", lambda: mmpe.Table("adjacency"), ("adjacency",), "dtype"),
    case("Composite no segments", lambda: mmpe.Composite([]), ("segments",), "shape"),
    case("Latents 0", lambda: mmpe.Latents(0), ("n",), "range"),
    case("Latents str", lambda: mmpe.Latents("4"), ("n",), "dtype"),
]


@pytest.mark.parametrize(("fn", "names", "category"), COORDINATES)
def test_coordinates(fn, names, category) -> None:
    _expect_named(fn, names, category)


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
    case("mha x int", lambda: _mha()(_x(2, 6, 32).long(), S(6)), ("x",), "dtype"),
    case("mha x float64", lambda: _mha()(_x(2, 6, 32, dtype=torch.float64), S(6)), ("x",),
         "dtype"),
    case("mha x bool", lambda: _mha()(_x(2, 6, 32) > 0, S(6)), ("x",), "dtype"),
    case("mha x list", lambda: _mha()(_x(2, 6, 32).tolist(), S(6)), ("x",), "dtype"),
    case("mha x rank 2", lambda: _mha()(_x(6, 32), S(6)), ("x",), "shape"),
    case("mha x width", lambda: _mha()(_x(2, 6, 16), S(6)), ("x",), "shape"),
    case("mha batch mismatch", lambda: _mha()(_x(2, 6, 32),
                                              S(6, position_ids=torch.arange(6).repeat(3, 1))),
         ("batch",), "shape"),
    case("mha more queries", lambda: _mha()(_x(2, 6, 32), S(8)), ("x",), "shape"),
    case("mha offset no cache", lambda: _mha()(_x(2, 6, 32), S(6, offset=4)), ("offset", "cache"),
         "api-misuse"),
    case("mha head_dim str", lambda: mmpe.MultiHeadAttention(32, 4, [], head_dim="8"),
         ("head_dim",), "dtype"),
    case("mha d_model float", lambda: mmpe.MultiHeadAttention(32.5, 4, []), ("d_model",),
         "dtype"),
    case("mha num_heads 0", lambda: mmpe.MultiHeadAttention(32, 0, []), ("num_heads",), "range"),
    case("transformer x float64", lambda: mmpe.Transformer(32, 4, 1, encodings=["rope"])(
        _x(2, 6, 32, dtype=torch.float64), S(6)), ("x",), "dtype"),
    case("transformer x int", lambda: mmpe.Transformer(32, 4, 1, encodings=["sinusoidal"])(
        _x(2, 6, 32).long(), S(6)), ("x",), "dtype"),
    case("cross x float64", lambda: mmpe.CrossAttention(32, 4, [])(
        _x(1, 4, 32, dtype=torch.float64), mmpe.Latents(4), _x(1, 5, 32), S(5)), ("x",), "dtype"),
    case("cross memory int", lambda: mmpe.CrossAttention(32, 4, [])(
        _x(1, 4, 32), mmpe.Latents(4), _x(1, 5, 32).long(), S(5)), ("memory",), "dtype"),
    case("input encoding wrong capability", lambda: mmpe.build("sinusoidal", d_model=32).combine(
        _x(1, 4, 32), mmpe.Graph(EI, 4)), ("Positioned",), "unsupported-combination"),
    case("rope q rank 3", lambda: _rope(Q[0], Q[0], S(6)), ("q",), "shape"),
    case("rope heads mismatch", lambda: _rope(Q, Q[:, :3], S(6)), ("heads",), "shape"),
    case("rope k beyond keys", lambda: _rope(Q, torch.randn(2, 4, 9, 8), S(6)), ("k",), "shape"),
    case("rope q head_dim", lambda: _rope(Q[..., :4], Q[..., :4], S(6)), ("h_d",), "shape"),
    case("t5_bucket 2 buckets bidirectional",
         lambda: Fn.t5_bucket(torch.arange(5), num_buckets=2, bidirectional=True),
         ("num_buckets",), "unsupported-combination"),
    case("t5_bucket float buckets", lambda: Fn.t5_bucket(torch.arange(5), num_buckets=2.5),
         ("num_buckets",), "dtype"),
    case("t5_bucket max_distance", lambda: Fn.t5_bucket(torch.arange(5), max_distance=0),
         ("max_distance",), "range"),
    case("t5_bucket list", lambda: Fn.t5_bucket([0, 1, 2]), ("relative_position",), "dtype"),
    case("alibi_slopes True", lambda: Fn.alibi_slopes(True), ("num_heads",), "dtype"),
    case("alibi_slopes 0", lambda: Fn.alibi_slopes(0), ("num_heads",), "range"),
    case("rope_inv_freq odd", lambda: Fn.rope_inv_freq(7), ("rotary_dim",), "range"),
    case("rope_inv_freq negative", lambda: Fn.rope_inv_freq(-4), ("rotary_dim",), "range"),
    case("rope_inv_freq str", lambda: Fn.rope_inv_freq("8"), ("rotary_dim",), "dtype"),
    case("rope_inv_freq base nan", lambda: Fn.rope_inv_freq(8, NAN), ("base",), "range"),
]


@pytest.mark.parametrize(("fn", "names", "category"), FORWARD)
def test_forward(fn, names, category) -> None:
    _expect_named(fn, names, category)


# ---------------------------------------------------------------------------------------------
# (4) newer APIs: caches and generation, cross-attention, integrations, plugins and the
# registry, geometry, sphere time, resource limits
# ---------------------------------------------------------------------------------------------

def _model(depth: int = 2):
    return mmpe.Transformer(32, 4, depth, ["rope"])


def _cached(steps):
    """Run ``steps`` — (batch, tokens, offset, causal) — on one model with one cache."""
    model = _model()
    cache = model.make_cache()
    for b, n, offset, causal in steps:
        model(_x(b, n, 32), S(n, offset=offset, causal=causal), cache=cache)


def _other_models_cache():
    m1, m2 = _model(), _model()
    cache = m1.make_cache()
    m1(_x(1, 3, 32), S(3, causal=True), cache=cache)
    m2(_x(1, 1, 32), S(1, offset=3, causal=True), cache=cache)


def _lm():
    torch.manual_seed(0)
    return mmpe.CausalLM(vocab_size=20, d_model=32, num_heads=4, depth=1, encodings=["rope"])


def _cross(name: str, queries, keys, **options):
    enc = mmpe.build(name, context={"num_heads": 4, "head_dim": 8, **options})
    attn = mmpe.CrossAttention(32, 4, [enc])
    return attn(_x(1, queries.num_queries, 32), queries, _x(1, keys.num_keys, 32), keys)


SPHERE = lambda: mmpe.Sphere(torch.tensor([0.0, 30.0]), torch.tensor([0.0, 90.0]))  # noqa: E731
HF = dict(head_dim=16, hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
          rope_theta=10000.0)
#: Unix nanoseconds 1 ns apart: beyond 2^53, float64 would merge them
UNIX_NS = torch.tensor([1_700_000_000_000_000_001, 1_700_000_000_000_000_002])


def _hf_api():
    from mmpe.integrations import transformers

    return transformers


def _hf(**changes):
    return _hf_api().from_hf_rope({**HF, **changes})


def _timm(encoding, model=None):
    import timm

    from mmpe.integrations.timm import apply_encoding

    if model is None:
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0,
                                  img_size=32)
    return apply_encoding(model, encoding)


def _register(**kwargs):
    from mmpe.encodings.base import ScoreEncoding

    return mmpe.register("bad_input_probe", learnable=False, paper="a probe",
                         **kwargs)(type("Probe", (ScoreEncoding,), {}))


NEWER = [
    # caches and generation
    case("cache a str", lambda: _model()(_x(1, 3, 32), S(3, causal=True), cache="cache"),
         ("cache",), "api-misuse"),
    case("cache of another model", _other_models_cache, ("another attention layer",),
         "api-misuse"),
    case("cache step with a gap", lambda: _cached([(1, 3, 0, True), (1, 1, 5, True)]),
         ("offset",), "api-misuse"),
    case("cache step without its offset", lambda: _cached([(1, 3, 0, True), (1, 1, 0, True)]),
         ("offset",), "api-misuse"),
    case("cache bidirectional after causal",
         lambda: _cached([(1, 3, 0, True), (1, 1, 3, False)]), ("bidirectional",), "api-misuse"),
    case("cache batch changes", lambda: _cached([(1, 3, 0, True), (2, 1, 3, True)]),
         ("batch",), "shape"),
    case("cache num_layers str", lambda: mmpe.cache.ModelCache("2"), ("num_layers",), "dtype"),
    case("generate max_new_tokens -1", lambda: mmpe.generate(_lm(), torch.tensor([[1, 2]]), -1),
         ("max_new_tokens",), "range"),
    case("generate float prompt", lambda: mmpe.generate(_lm(), torch.tensor([[1.0, 2.0]]), 2),
         ("prompt",), "dtype"),
    case("generate prompt rank 1", lambda: mmpe.generate(_lm(), torch.tensor([1, 2]), 2),
         ("prompt",), "shape"),
    case("generate token beyond the vocabulary",
         lambda: mmpe.generate(_lm(), torch.tensor([[1, 25]]), 2), ("vocab_size",), "range"),
    case("generate padding_mask shape", lambda: mmpe.generate(
        _lm(), torch.tensor([[1, 2]]), 2, padding_mask=torch.tensor([[True]])),
         ("padding_mask",), "shape"),
    case("generate example without a token", lambda: mmpe.generate(
        _lm(), torch.tensor([[1, 2], [3, 4]]), 2,
        padding_mask=torch.tensor([[True, True], [False, False]])), ("no real token",),
         "api-misuse"),
    # cross-attention
    case("Cross queries str", lambda: mmpe.Cross("text", S(3)), ("queries",), "dtype"),
    case("Cross batch mismatch", lambda: mmpe.Cross(mmpe.Points(torch.randn(2, 3, 3)),
                                                    mmpe.Points(torch.randn(3, 3, 3))),
         ("batch",), "shape"),
    case("rope sphere radians to points in metres", lambda: _cross(
        "rope_axial", SPHERE(), mmpe.Points(torch.randn(3, 2), units="m"), num_axes=2),
         ("Sphere queries and Points keys",), "unsupported-combination"),
    case("rope grid patches to the sphere", lambda: _cross(
        "rope_axial", mmpe.Grid((2, 2)), SPHERE(), num_axes=2),
         ("Grid queries and Sphere keys",), "unsupported-combination"),
    case("rope token positions to metres", lambda: _cross(
        "rope", S(4), mmpe.Points(torch.randn(3, 1), units="m")),
         ("Sequence queries and Points keys",), "unsupported-combination"),
    case("rope points in other units", lambda: _cross(
        "rope_axial", mmpe.Points(torch.randn(3, 2), units="m"),
        mmpe.Points(torch.randn(3, 2), units="km"), num_axes=2),
         ("not in one position space",), "unsupported-combination"),
    case("alibi across grids of another scale", lambda: _cross(
        "alibi", mmpe.Grid((2, 2)), mmpe.Grid((2, 2), scale=(2.0, 2.0))),
         ("not in one space",), "unsupported-combination"),
    case("cross memory rank 2", lambda: mmpe.CrossAttention(32, 4)(
        _x(1, 2, 32), S(2), _x(3, 32), S(3)), ("memory",), "shape"),
    case("cross kv_dim 0", lambda: mmpe.CrossAttention(32, 4, kv_dim=0), ("kv_dim",), "range"),
    # integrations
    case("hf rope_type unknown", lambda: _hf(rope_scaling={"rope_type": "spiral", "factor": 2.0}),
         ("rope_type",), "range", needs="transformers"),
    case("hf factor a str", lambda: _hf(rope_scaling={"rope_type": "linear", "factor": "4"}),
         ("factor",), "dtype", needs="transformers"),
    case("hf rope_theta a str", lambda: _hf(rope_theta="1e4"), ("rope_theta",), "dtype",
         needs="transformers"),
    case("hf partial_rotary_factor 0", lambda: _hf(partial_rotary_factor=0.0),
         ("partial_rotary_factor",), "range", needs="transformers"),
    case("hf mrope_section on rope_type default", lambda: _hf(
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}), ("mrope_section",),
         "unsupported-combination", needs="transformers"),
    case("hf config a list", lambda: _hf_api().from_hf_rope([1, 2]), ("config",), "dtype",
         needs="transformers"),
    case("to_hf_rope of ALiBi", lambda: _hf_api().to_hf_rope(
        mmpe.build("alibi", num_heads=4)), ("rope_type",), "unsupported-combination",
         needs="transformers"),
    case("apply_score_encodings on a Linear", lambda: _hf_api().apply_score_encodings(
        torch.nn.Linear(2, 2), ["alibi"]), ("model",), "api-misuse", needs="transformers"),
    case("replace_rotary on a Linear", lambda: _hf_api().replace_rotary(
        torch.nn.Linear(2, 2)),
         ("rotary_emb",), "api-misuse", needs="transformers"),
    case("timm apply_encoding on a Linear", lambda: _timm("rope_axial", torch.nn.Linear(2, 2)),
         ("model",), "api-misuse", needs="timm"),
    case("timm a sequence-only encoding on patches", lambda: _timm("rope_yarn"),
         ("apply_encoding: rope_yarn", "Positioned1D"), "unsupported-combination", needs="timm"),
    # plugins and the registry
    case("register hook 'bias'", lambda: _register(hook="bias"), ("hook",), "range"),
    case("register needs a str", lambda: _register(hook="score", needs=("Metric",)), ("needs",),
         "dtype"),
    case("register an unknown context key", lambda: _register(hook="score", context=("width",)),
         ("context key",), "range"),
    case("register a taken name", lambda: mmpe.register("rope", hook="rotary", learnable=False,
                                                         paper="x")(type("X", (), {})),
         ("already registered",), "api-misuse"),
    case("build an unknown name", lambda: mmpe.build("ropee"), ("Did you mean 'rope'",),
         "api-misuse"),
    case("build a config without a name", lambda: mmpe.build({"head_dim": 8}), ("'name'",),
         "api-misuse"),
    case("build a name that is an int", lambda: mmpe.build(5), ("name_or_config",), "dtype"),
    case("build context a list", lambda: mmpe.build("rope", context=[1]), ("context",), "dtype"),
    case("build for coordinates without the capability", lambda: mmpe.build(
        "rope", coords=mmpe.Grid((2, 2)), head_dim=8), ("Positioned1D",),
         "unsupported-combination"),
    # geometry
    case("Points units an int", lambda: mmpe.Points(torch.randn(3, 2), units=3), ("units",),
         "dtype"),
    case("Points mask shape", lambda: mmpe.Points(torch.randn(2, 3, 2),
                                                  mask=torch.ones(2, 4, dtype=torch.bool)),
         ("mask",), "shape"),
    case("Points mask float", lambda: mmpe.Points(torch.randn(2, 3, 2), mask=torch.ones(2, 3)),
         ("mask",), "dtype"),
    case("Points inf", lambda: mmpe.Points(torch.tensor([[0.0, INF]])), ("positions",), "range"),
    case("fourier_features for fewer axes", lambda: mmpe.build(
        "fourier_features", d_model=32, num_axes=2).combine(_x(1, 4, 32),
                                                            mmpe.Points(torch.randn(4, 3))),
         ("num_axes",), "unsupported-combination"),
    case("rope_frame_averaged head_dim and axes", lambda: mmpe.build(
        "rope_frame_averaged", head_dim=8, num_axes=3), ("head_dim",), "unsupported-combination"),
    case("spherical_harmonics on points", lambda: mmpe.build(
        "spherical_harmonics", d_model=32).combine(_x(1, 4, 32), mmpe.Points(torch.randn(4, 2))),
         ("Spherical",), "unsupported-combination"),
    # sphere time
    case("Sphere time integers float64 cannot hold", lambda: mmpe.Sphere(
        torch.zeros(2), torch.zeros(2), time=UNIX_NS), ("time", "2^53"), "range"),
    case("Sphere.grid times integers float64 cannot hold",
         lambda: mmpe.Sphere.grid(2, 2, times=UNIX_NS), ("times", "2^53"), "range"),
    case("Sphere time length", lambda: mmpe.Sphere(torch.zeros(2), torch.zeros(2),
                                                   time=torch.tensor([1.0, 2.0, 3.0])),
         ("time",), "shape"),
    case("Sphere time NaN", lambda: mmpe.Sphere(torch.zeros(2), torch.zeros(2),
                                                time=torch.tensor([1.0, NAN])), ("time",), "range"),
    case("Sphere time a str", lambda: mmpe.Sphere(torch.zeros(2), torch.zeros(2), time="now"),
         ("time",), "dtype"),
    case("Sphere lat 95°", lambda: mmpe.Sphere(torch.tensor([95.0, 0.0]), torch.zeros(2)),
         ("lat",), "range"),
    case("Sphere units 'grad'", lambda: mmpe.Sphere(torch.zeros(2), torch.zeros(2), units="grad"),
         ("units",), "range"),
    # resource limits: refused at once, before any work
    case("alibi at n = 200,000 on the CPU", lambda: mmpe.MultiHeadAttention(
        64, 4, [mmpe.build("alibi", num_heads=4)])(_x(1, 200_000, 64), S(200_000)),
         ("n_q=200000",), "resource"),
    case("t5 at n = 200,000 on flex", lambda: _with_route(mmpe.MultiHeadAttention(
        64, 4, [mmpe.build("t5", num_heads=4)]), "flex")(_x(1, 200_000, 64), S(200_000)),
         ("n_q=200000",), "resource"),
    case("stick-breaking scores at n = 200,000", lambda: mmpe.MultiHeadAttention(
        8, 1, [mmpe.build("stick_breaking")])(_x(1, 200_000, 8), S(200_000, causal=True)),
         ("GiB",), "resource"),
]


def _with_route(module, route: str):
    module.route = route
    return module


@pytest.mark.parametrize(("fn", "names", "category"), NEWER)
def test_newer_apis(fn, names, category) -> None:
    with torch.no_grad():
        _expect_named(fn, names, category)


def test_counts_script_sees_every_category() -> None:
    """`python tests/bad_input_counts.py` (the issue's closing count) reads these case lists:
    every category is exercised, and this module's cases stay above the floor."""
    from bad_input_counts import counts

    parts = counts()
    total = sum(parts.values(), start=Counter())
    assert set(total) == set(CATEGORIES) and all(total[c] > 0 for c in CATEGORIES), total
    here = sum(sum(c.values()) for part, c in parts.items() if part != "misuse edges")
    assert here >= MIN_CASES, here
