"""Pure functions of positional encoding, and FlexAttention mods for people who call attention.

Everything here is stateless: tensors in, tensors out, no `nn.Module`. The functions are the
ones mmpe's encodings are built from, re-exported under one roof (their home module is named in
brackets), plus [`sincos_grid`][mmpe.functional.sincos_grid] and the three FlexAttention helpers at the bottom. Shapes
use torchtune's notation: `b` batch, `s` tokens, `n_h` heads, `h_d` head dimension,
`n_q` / `n_k` query / key tokens, `r` rotary channels.

Rotary (Su et al. 2021, RoFormer)

* [`rope_inv_freq`][mmpe.encodings.rope.rope_inv_freq] — `θ_i = base^(−2i/r)`, `[r/2]` float64, radians per token
  [`mmpe.encodings.rope`].
* [`rope_cos_sin`][mmpe.encodings.rope.rope_cos_sin] — `cos(m·θ)`, `sin(m·θ)` for positions `m` (tokens), each
  `[*positions.shape, r/2]` float32 (phase formed in float64) [`mmpe.encodings.rope`].
* [`apply_rotary`][mmpe.encodings.rope.apply_rotary] — rotate the first `r` channels of `x [b, n_h, s, h_d]` by a
  cos/sin table `[s, r/2]` or `[b, s, r/2]`; half-split (NeoX/Llama) or interleaved
  (GPT-J) pairs [`mmpe.encodings.rope`].
* [`yarn_get_mscale`][mmpe.encodings.rope_scaling.yarn_get_mscale] — YaRN's attention temperature `0.1·mscale·ln(scale) + 1`
  (Peng et al. 2024) [`mmpe.encodings.rope_scaling`].

Absolute tables (Vaswani et al. 2017; MAE / DETR / timm for grids)

* [`sinusoidal_table`][mmpe.encodings.sinusoidal.sinusoidal_table] — `[*positions.shape, d]` float32, interleaved `sin`/`cos`
  of positions in tokens [`mmpe.encodings.sinusoidal`].
* [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed] — 2D/3D/… sin-cos embedding of positions `[n, A]` (grid units),
  `[n, d]` float32, layouts `"mae"`/`"timm"`/`"detr"` [`mmpe.encodings.sincos`].
* [`sincos_grid`][mmpe.functional.sincos_grid] — the same for every cell of a grid `shape` (row-major),
  `[prod(shape), d]` float32 (new here).

Score biases

* [`alibi_slopes`][mmpe.encodings.alibi.alibi_slopes] — ALiBi's per-head slopes `[n_h]` float32 (Press et al. 2022)
  [`mmpe.encodings.alibi`].
* [`t5_bucket`][mmpe.encodings.t5.t5_bucket] — T5's log-spaced bucket of `key − query` offsets (tokens), int64 in
  `[0, num_buckets)` (Raffel et al. 2020); equals HF `T5Attention._relative_position_bucket`
  [`mmpe.encodings.t5`].
* [`log_bucket_position`][mmpe.encodings.deberta.log_bucket_position] — DeBERTa-v2's log-bucketed signed offset, int64; equals HF
  `make_log_bucket_position` (He et al. 2021) [`mmpe.encodings.deberta`].

Sphere (Rußwurm et al. 2024 for the harmonics)

* [`real_spherical_harmonics`][mmpe.encodings.spherical_harmonics.real_spherical_harmonics] — real orthonormal `Y_l^m` of latitude/longitude
  (radians), `[..., (L+1)²]` [`mmpe.encodings.spherical_harmonics`].
* [`great_circle`][mmpe.coords.sphere.great_circle] — great-circle angle (radians) between points in radians
  [`mmpe.coords.sphere`].
* [`haversine`][mmpe.coords.sphere.haversine] — great-circle distance `radius·angle` between points in degrees or
  radians, float64 [`mmpe.coords.sphere`].

Graphs (numpy / scipy; Dwivedi & Bresson 2020, Dwivedi et al. 2022, Ying et al. 2021)

* [`laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors] — the `k` smallest non-trivial Laplacian eigenpairs:
  `eigvals [k]`, `eigvecs [n, k]` float64, canonical signs [`mmpe.coords.spectral`].
* [`random_sign_flip`][mmpe.graph_maths.random_sign_flip] — LapPE's random ±1 per eigenvector (training augmentation)
  [`mmpe.coords.spectral`].
* [`random_walk_pe`][mmpe.graph_maths.random_walk_pe] — RWSE: return probabilities `[(D⁻¹A)^t]_ii`, `t = 1 … k`,
  `[n, k]` float64 [`mmpe.coords.graph`].
* [`shortest_path_hops`][mmpe.graph_maths.shortest_path_hops] — all-pairs hop counts `[n, n]` float64, `inf` where
  unreachable [`mmpe.coords.graph`].

FlexAttention

* [`score_mod`][mmpe.functional.score_mod] — one `score_mod(score, b, h, q_idx, kv_idx)` for any score encoding (or
  a list of them, or a registry name / config) on given coordinates, to pass to
  `torch.nn.attention.flex_attention.flex_attention`.
* [`mask_mod`][mmpe.functional.mask_mod] — the coordinates' `mask_mod(b, h, q_idx, kv_idx) -> bool` (True = may
  attend), or None.
* [`block_mask`][mmpe.functional.block_mask] — a `BlockMask` from that `mask_mod`
  (`create_block_mask`), or None when the coordinates mask nothing.

    >>> import torch, mmpe
    >>> from mmpe import functional as F
    >>> from torch.nn.attention.flex_attention import flex_attention
    >>> coords = mmpe.Sequence(16, causal=True)
    >>> q = k = v = torch.randn(2, 8, 16, 32)                            # [b, n_h, s, h_d]
    >>> out = flex_attention(q, k, v, score_mod=F.score_mod("alibi", coords, num_heads=8),
    ...                      block_mask=F.block_mask(coords))               # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import Tensor

from mmpe.attention import compose_score_mods
from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.graph import random_walk_pe, shortest_path_hops
from mmpe.coords.spectral import laplacian_eigenvectors, random_sign_flip
from mmpe.coords.sphere import great_circle, haversine
from mmpe.encodings._content import ContentScoreEncoding
from mmpe.encodings.alibi import alibi_slopes
from mmpe.encodings.base import AttentionCall, Encoding, ScoreEncoding, ScoreMod
from mmpe.encodings.deberta import log_bucket_position
from mmpe.encodings.rope import apply_rotary, rope_cos_sin, rope_inv_freq
from mmpe.encodings.rope_scaling import yarn_get_mscale
from mmpe.encodings.sincos import sincos_grid_embed
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.encodings.spherical_harmonics import real_spherical_harmonics
from mmpe.encodings.t5 import t5_bucket

__all__ = [
    # rotary
    "apply_rotary", "rope_cos_sin", "rope_inv_freq", "yarn_get_mscale",
    # absolute tables
    "sincos_grid", "sincos_grid_embed", "sinusoidal_table",
    # score biases
    "alibi_slopes", "log_bucket_position", "t5_bucket",
    # sphere
    "great_circle", "haversine", "real_spherical_harmonics",
    # graphs
    "laplacian_eigenvectors", "random_sign_flip", "random_walk_pe", "shortest_path_hops",
    # FlexAttention
    "block_mask", "mask_mod", "score_mod",
]


# -- tables ------------------------------------------------------------------------------
def sincos_grid(
    shape: Seq[int],
    d_model: int,
    temperature: float = 10000.0,
    layout: str = "mae",
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """2D / 3D sine-cosine table of every cell of a grid, `[prod(shape), d_model]` float32.

    Cell `(i_0, …, i_{A−1})` (row-major order, grid units: `0 … shape_a − 1` per axis) gets
    [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed] of its position: per axis `F = d_model / (2A)` frequencies
    `ω_k = temperature^(−k/F)` and `sin(i·ω_k)`, `cos(i·ω_k)`. With `layout="mae"` and
    `shape = (H, W)` this is MAE's `get_2d_sincos_pos_embed(d_model, ·)` for an `H×W`
    grid (He et al. 2022); `(T, H, W)` gives the 3D (video) table. For DETR's 1-based,
    normalised positions call [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed] on your own positions.

    Args:
        shape: cells per axis, e.g. `(H, W)` or `(T, H, W)`: positive ints.
        d_model: channels `d`, divisible by `2·len(shape)`.
        temperature: wavelength base (10000).
        layout: `"mae"`, `"timm"` or `"detr"` (see [`sincos_grid_embed`][mmpe.encodings.sincos.sincos_grid_embed]).
        device: where the table is built.

    Raises:
        TypeError: `shape` not a sequence of ints.
        ValueError: an empty `shape` or a non-positive entry; `d_model` not divisible by
            `2·len(shape)`, an unknown `layout`, `temperature <= 0`.
    """
    if not isinstance(shape, Seq) or isinstance(shape, str):
        raise TypeError(f"sincos_grid: shape must be a sequence of ints, got {type(shape).__name__}")
    if not shape:
        raise ValueError("sincos_grid: shape must have at least one axis")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"sincos_grid: shape must hold ints, got {tuple(shape)!r}")
        if n < 1:
            raise ValueError(f"sincos_grid: shape entries must be >= 1, got {tuple(shape)}")
    axes = [torch.arange(n, dtype=torch.float64, device=device) for n in shape]
    positions = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(shape))
    return sincos_grid_embed(positions, d_model, temperature, layout)


# -- FlexAttention -----------------------------------------------------------------------
def score_mod(
    encoding: ScoreEncoding | str | Mapping[str, Any] | Seq[ScoreEncoding | str | Mapping[str, Any]],
    coords: Coordinates,
    *,
    num_heads: int,
    head_dim: int | None = None,
    q: Tensor | None = None,
    k: Tensor | None = None,
    v: Tensor | None = None,
    x: Tensor | None = None,
) -> ScoreMod:
    """A FlexAttention `score_mod(score, b, h, q_idx, kv_idx)` for score encodings on `coords`.

    Pass the result to `torch.nn.attention.flex_attention.flex_attention(q, k, v,
    score_mod=..., block_mask=block_mask(coords))`; it is the same function mmpe's
    [`MultiHeadAttention`][mmpe.attention.MultiHeadAttention] uses on its flex route, so the numbers match its math and
    SDPA paths. It builds the [`AttentionCall`][mmpe.encodings.base.AttentionCall] for one attention
    call and calls `encoding.score_mod(ctx)`; a list is applied in order
    ([`mmpe.attention.compose_score_mods`][mmpe.attention.compose_score_mods]).

    The returned function also carries two attributes:

    * `encodings` — the tuple of encodings it applies (those built from names included: their
      parameters are fresh and untrained; train or load them through this tuple);
    * `softmax_scale` — the logit scale an encoding prescribes instead of `1/√h_d` (DeBERTa's
      `1/√(3·h_d)`, TENER's 1), or None; pass it as `flex_attention(..., scale=...)`.

    Kinds of score encoding:

    * position-only additive terms (`alibi`, `t5`, `fire`, `kerple_*`, `swin` …)
      need only `coords` and `num_heads`; the mod adds to `score`.
    * content-dependent terms (`shaw`, `deberta`, `cope`, `transformer_xl`, `tener`,
      `huang_3`/`huang_4`; `fox` also reads `x`) precompute from the layer's `q`/`k`:
      pass the very tensors (after any rotary encoding) that go to `flex_attention`.
    * rescaling terms (`huang_1`/`huang_2`, `da_transformer`) multiply `score` rather than
      add to it; in a list their place in the order matters, as in `MultiHeadAttention`.
    * value-side terms (`shaw` with `values=True`) add `Σ_j α_ij a^V_ij` to the output,
      which needs the probabilities FlexAttention never exposes: refused (ValueError); use
      `MultiHeadAttention(..., route="math")`.

    Args:
        encoding: a built [`ScoreEncoding`][mmpe.encodings.base.ScoreEncoding], a registry name
            (`"alibi"`) or config dict (`{"name": "t5", "num_buckets": 16}`) built with
            `mmpe.build(..., context={"num_heads", "head_dim", "d_model"})` (`d_model` from
            `x`) and moved to the device of `q`/`k`/`x`/coords, or a non-empty list
            (or `nn.ModuleList`) of these. Encodings you pass built are used as they are:
            their parameters must already be on the attention's device.
        coords: the tokens' [`Coordinates`][mmpe.coords.base.Coordinates] (`n_q` queries, `n_k`
            keys).
        num_heads: `n_h` (>= 1).
        head_dim: `h_d` (>= 1); inferred from `q`/`k` when omitted. Position-only encodings
            do not read it (it stays None in the context when nothing gives it).
        q: queries `[b, n_h, n_q, h_d]` (after rotary encodings).
        k: keys `[b, n_h, n_k, h_d]` (after rotary encodings; repeat grouped KV heads first).
        v: values `[b, n_h, n_k, h_dv]`.
        x: the attention layer's input `[b, n_k, d_model]` (forget gates read it).

    Returns:
        `fn(score, b, h, q_idx, kv_idx) -> Tensor`: scalar indices inside FlexAttention; it
            also evaluates eagerly on broadcast index grids ([`mmpe.coords.base.index_grid`][mmpe.coords.base.index_grid]).

    Raises:
        TypeError: `encoding` not a score encoding, name, config or list of them (a rotary,
            input or kernel encoding is named as such); `coords` not Coordinates; a
            non-tensor `q`/`k`/`v`/`x`; `num_heads`/`head_dim` not ints; the
            encoding does not support `coords` (from its capability check).
        ValueError: `num_heads`/`head_dim` < 1; an empty list; `q`/`k`/`v`/`x` of
            the wrong rank, heads, token count, batch or `h_d`; a content-dependent encoding
            without `q`/`k` (or `x`), naming what is missing; a value-side encoding; an
            encoding built for another `num_heads` / `head_dim`.
        KeyError: an unknown registry name.
    """
    _check_coords("score_mod", coords)
    _check_int("num_heads", num_heads)
    if head_dim is not None:
        _check_int("head_dim", head_dim)
    batch, head_dim = _check_tensors(coords, num_heads, head_dim, q, k, v, x)
    device = next((t.device for t in (q, k, x, v) if t is not None), coords.device)

    specs = (list(encoding) if isinstance(encoding, (list, tuple, torch.nn.ModuleList))
             else [encoding])
    if not specs:
        raise ValueError("score_mod: encoding is an empty list; give at least one score encoding")
    context = {"num_heads": num_heads}
    if head_dim is not None:
        context["head_dim"] = head_dim
    if x is not None:
        context["d_model"] = x.shape[-1]
    given = {arg for arg, t in (("q", q), ("k", k), ("x", x)) if t is not None}
    encodings = tuple(_resolve(spec, context, device, given) for spec in specs)

    ctx = AttentionCall(coords, num_heads, head_dim, batch, x, q, k, v)  # type: ignore[arg-type]
    mods = [_encoding_mod(enc, ctx) for enc in encodings]
    if len(mods) == 1:
        fn = mods[0]
    else:
        composed = compose_score_mods(mods)
        assert composed is not None

        def fn(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return composed(score, b, h, q_idx, kv_idx)

    scales = (enc.softmax_scale(head_dim) for enc in encodings) if head_dim is not None else ()
    fn.encodings = encodings  # type: ignore[attr-defined]
    fn.softmax_scale = next((s for s in scales if s is not None), None)  # type: ignore[attr-defined]
    return fn


def mask_mod(coords: Coordinates) -> MaskMod | None:
    """The FlexAttention `mask_mod(b, h, q_idx, kv_idx) -> bool` of `coords`, or None.

    True where the query may attend to the key: causal sequences, packed documents, padded
    graph nodes … (`coords.mask_mod()`). None when every pair is allowed (a bidirectional
    sequence, a grid). Pass it to `create_block_mask` yourself, or use [`block_mask`][mmpe.functional.block_mask].

    Raises:
        TypeError: `coords` is not an mmpe Coordinates object.
    """
    _check_coords("mask_mod", coords)
    return coords.mask_mod()


def block_mask(coords: Coordinates, device: torch.device | str | None = None):
    """A FlexAttention `BlockMask` for `coords`, or None when they mask nothing.

    Built by `torch.nn.attention.flex_attention.create_block_mask(mask_mod(coords), B, None,
    n_q, n_k, device=...)` with `B = coords.batch_size` (None, i.e. broadcast over the
    batch, when positions are shared by the batch) and the mask shared by all heads.

    Args:
        coords: the tokens' coordinates.
        device: where the mask is built; defaults to `coords.device` (`create_block_mask`'s
            own default is CUDA). Must be the device of `q`/`k`/`v`.

    Raises:
        TypeError: `coords` is not an mmpe Coordinates object.
        FlexUnavailableError: (a `ValueError`) torch older than 2.6, whose `create_block_mask`
            indexes the mask past the sequence (an `IndexError` deep inside torch).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    from mmpe import flex_compile

    if not flex_compile.available():
        raise flex_compile.FlexUnavailableError(
            f"block_mask: FlexAttention needs torch >= 2.6 (this is {torch.__version__}); "
            "use mmpe.MultiHeadAttention with route='auto' or 'sdpa'")
    mod = mask_mod(coords)
    if mod is None:
        return None
    device = coords.device if device is None else torch.device(device)
    return create_block_mask(mod, coords.batch_size, None, coords.num_queries, coords.num_keys,
                             device=device)


# -- helpers -----------------------------------------------------------------------------
def _check_coords(where: str, coords: object) -> None:
    if not isinstance(coords, Coordinates):
        raise TypeError(f"{where}: coords must be an mmpe Coordinates object (mmpe.Sequence, "
                        f"mmpe.Grid …), got {type(coords).__name__}")


def _check_int(arg: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"score_mod: {arg} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"score_mod: {arg} must be >= 1, got {value}")


def _check_tensors(coords: Coordinates, num_heads: int, head_dim: int | None,
                   q: Tensor | None, k: Tensor | None, v: Tensor | None,
                   x: Tensor | None) -> tuple[int, int | None]:
    """Validate the content tensors; return the batch size and the (inferred) head dim."""
    n_q, n_k = coords.num_queries, coords.num_keys
    expected = {"q": (4, n_q, "[b, n_h, n_q, h_d]"), "k": (4, n_k, "[b, n_h, n_k, h_d]"),
                "v": (4, n_k, "[b, n_h, n_k, h_dv]"), "x": (3, n_k, "[b, n_k, d_model]")}
    batches: dict[str, int] = {}
    for arg, t in (("q", q), ("k", k), ("v", v), ("x", x)):
        if t is None:
            continue
        rank, tokens, shape = expected[arg]
        if not isinstance(t, Tensor):
            raise TypeError(f"score_mod: {arg} must be a torch.Tensor {shape}, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"score_mod: {arg} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != rank:
            raise ValueError(f"score_mod: {arg} must be {shape} (rank {rank}), got {tuple(t.shape)}")
        token_axis = 2 if rank == 4 else 1
        if t.shape[token_axis] != tokens:
            raise ValueError(f"score_mod: {arg} {tuple(t.shape)} has {t.shape[token_axis]} tokens "
                             f"but the coordinates have {tokens} {'queries' if arg == 'q' else 'keys'}")
        if rank == 4 and t.shape[1] != num_heads:
            raise ValueError(f"score_mod: {arg} {tuple(t.shape)} has {t.shape[1]} heads, "
                             f"num_heads={num_heads}" + (" (repeat grouped KV heads first)"
                                                         if arg in "kv" else ""))
        batches[arg] = t.shape[0]
    if len(set(batches.values())) > 1:
        raise ValueError(f"score_mod: q/k/v/x must share the batch size, got {batches}")
    dims = {arg: t.shape[-1] for arg, t in (("q", q), ("k", k)) if t is not None}
    if len(set(dims.values())) > 1:
        raise ValueError(f"score_mod: q and k must share h_d, got {dims}")
    if head_dim is not None and dims and head_dim not in dims.values():
        raise ValueError(f"score_mod: head_dim={head_dim} but q/k have h_d={next(iter(dims.values()))}")
    if head_dim is None and dims:
        head_dim = next(iter(dims.values()))
    coords_batch = coords.batch_size
    batch = next(iter(batches.values()), coords_batch or 1)
    if coords_batch is not None and batches and coords_batch != batch:
        raise ValueError(f"score_mod: the coordinates hold {coords_batch} examples but q/k/v/x "
                         f"have batch {batch}")
    return batch, head_dim


def _resolve(spec: object, context: dict[str, int], device: torch.device,
             given: set[str]) -> ScoreEncoding:
    """A built score encoding from an encoding, a registry name or a config dict."""
    if isinstance(spec, (str, Mapping)):
        spec = _build(spec, context, device, given)
    if isinstance(spec, ScoreEncoding):
        return spec
    if isinstance(spec, Encoding):
        raise TypeError(_hook_message(getattr(spec, "registry_name", type(spec).__name__),
                                      spec.hook))
    raise TypeError("score_mod: encoding must be a ScoreEncoding, a registry name, a config dict "
                    f"or a list of them, got {type(spec).__name__}")


def _build(spec: str | Mapping[str, Any], context: dict[str, int], device: torch.device,
           given: set[str]) -> object:
    """`mmpe.build(spec, context=context)` on `device`, refusing what cannot be a score mod."""
    from mmpe.registry import build, get

    name = spec if isinstance(spec, str) else spec.get("name")
    content = False
    if isinstance(name, str):  # else build raises its own KeyError/TypeError
        entry = get(name)
        if entry.hook != "score":
            raise TypeError(_hook_message(entry.name, entry.hook))
        content = isinstance(entry.cls, type) and issubclass(entry.cls, ContentScoreEncoding)
        if content:
            missing = [arg for arg in ("q", "k") if arg not in given]
            if missing:  # before building: its constructor may want h_d, which q gives
                raise ValueError(_content_message(entry.name, missing))
    try:
        built = build(spec, context=context)
    except TypeError as err:
        if content and "x" not in given and "d_model" in str(err):
            raise ValueError(f"score_mod: {name} is content-dependent and needs d_model to be "
                             "built: pass x=[b, n_k, d_model], the attention layer's input (its "
                             "width gives d_model), or a config dict with 'd_model'") from err
        raise
    return built.to(device) if isinstance(built, torch.nn.Module) else built


def _hook_message(name: str, hook: str) -> str:
    hint = {
        "rotary": "rotate q and k before flex_attention (its forward(q, k, coords), or "
                  "mmpe.functional.apply_rotary)",
        "input": "add it to the token embeddings (its combine(x, coords))",
        "kernel": "it replaces the softmax, which flex_attention cannot; use "
                  "mmpe.MultiHeadAttention",
    }.get(hook, "")
    return (f"score_mod: {name} is a {hook} encoding, not a score encoding"
            + (f"; {hint}" if hint else ""))


def _encoding_mod(enc: ScoreEncoding, ctx: AttentionCall) -> ScoreMod:
    """`enc.score_mod(ctx)`, with clear errors for what flex_attention cannot do or lacks."""
    name = getattr(enc, "registry_name", type(enc).__name__)
    if getattr(enc, "needs_probs", False):
        raise ValueError(f"score_mod: {name} adds a value-side term computed from the attention "
                         "probabilities, which flex_attention does not expose; use "
                         "mmpe.MultiHeadAttention(..., route='math') (or build it without "
                         "the value term, e.g. values=False)")
    if isinstance(enc, ContentScoreEncoding):
        missing = [arg for arg in ("q", "k") if getattr(ctx, arg) is None]
        if missing:
            raise ValueError(_content_message(name, missing))
    try:
        return enc.score_mod(ctx)
    except ValueError as err:
        text = str(err)
        if "needs the layer input x" in text:
            raise ValueError(_content_message(name, ["x"])) from err
        if "needs the layer's q and k" in text:
            raise ValueError(_content_message(
                name, [arg for arg in ("q", "k") if getattr(ctx, arg) is None] or ["q", "k"]
            )) from err
        raise


def _content_message(name: str, missing: list[str]) -> str:
    what = {"q": "q=[b, n_h, n_q, h_d]", "k": "k=[b, n_h, n_k, h_d]",
            "x": "x=[b, n_k, d_model], the attention layer's input"}
    tail = ("; q and k must be the tensors (after rotary encodings) that go to flex_attention"
            if "q" in missing or "k" in missing else "")
    return (f"score_mod: {name} is content-dependent and needs {' and '.join(missing)}: pass "
            f"{', '.join(what[m] for m in missing)}{tail}")
