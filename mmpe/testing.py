"""Test helpers for users who write their own coordinate classes and encodings.

[`assert_encoding_paths`][mmpe.testing.assert_encoding_paths] runs an encoding through every
attention path that can run it (the dispatcher's choice, each SDPA plan, FlexAttention) and
holds each to the math route, outputs and gradients, with the tolerances of
`TOLERANCES` (the table mmpe's own tests use)::

    from mmpe.testing import assert_encoding_paths

    def test_my_bias_on_every_path():
        assert_encoding_paths(MyBias(num_heads=2), mmpe.Points(torch.rand(1, 40, 3)))

[`assert_coordinates_contract`][mmpe.testing.assert_coordinates_contract] checks that a coordinate object keeps the promises every
encoding relies on ([`mmpe.coords.capabilities`][mmpe.coords.capabilities]). Run it in your test suite on a few
instances of your class (small ones: it evaluates every pair)::

    import torch
    import mmpe
    from mmpe.testing import assert_coordinates_contract

    class Ring(mmpe.Coordinates):
        '''n tokens on a ring; distance = steps along the shorter arc.'''

        def __init__(self, n):
            self.n = n

        @property
        def num_queries(self):
            return self.n

        def distance(self, q_idx, kv_idx, b=None):
            d = (q_idx - kv_idx).abs()
            return torch.minimum(d, self.n - d).to(torch.float32)

        def extent(self, q_idx, b=None):
            return torch.full(q_idx.shape, float(self.n // 2))

    def test_ring_contract():
        assert_coordinates_contract(Ring(7))

A violation raises `AssertionError` whose message names the member (`distance`,
`extent`, `relation`, `mask_mod` …) and the property it broke.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import Tensor

from mmpe.coords.base import index_grid
from mmpe.coords.capabilities import Directed, Metric, Positioned

__all__ = ["TOLERANCES", "assert_coordinates_contract", "assert_encoding_paths"]

#: Scalar (FlexAttention-style) index triples checked per coordinate object, besides corners.
_SCALAR_SAMPLES = 24


def assert_coordinates_contract(coords: Any, *, atol: float = 1e-6) -> None:
    """Check the coordinate contract on `coords`; raise `AssertionError` on a violation.

    Checked for every object:

    * `num_queries` / `num_keys` are positive ints; `batch_size` is None or a positive
      int; `device` is a `torch.device`.
    * `mask_mod` (when not None) is well formed: `dense_mask()` is bool
      `[b or 1, 1, n_q, n_k]` and every query may attend to at least one key.

    And for each capability the object provides (`isinstance(coords, Metric)` …):

    * `Metric` — `distance` is a float tensor of the broadcast index shape, finite and
      non-negative on every pair; symmetric (`d(i, j) = d(j, i)`) when queries and keys are
      one token set (`n_q == n_k`) and the coordinates are not `Directed` (a directed
      distance may be asymmetric); `d(i, i) = 0` on the diagonal of such a set where the mask
      allows the pair; `extent` finite and `extent(q) >= distance(q, k)` on every pair the
      mask allows (tolerance `atol + 1e-5·extent`).
    * `Directed` — `distance == |relation|` on every pair (in float); `causal` is a
      `bool`; when causal there is a `mask_mod` and it allows no pair with
      `relation < 0` (it may mask more: documents, token order).
    * `Positioned` — `query_positions` / `key_positions` are tensors `[n, a]` or
      `[b, n, a]` with `a == num_axes`, `n_q` / `n_k` rows and finite entries.

    Scalar (flex) evaluation equals broadcast (eager) evaluation: `distance`, `relation`,
    `extent` and `mask_mod` are evaluated on the full [`index_grid`][mmpe.coords.base.index_grid]
    and on a sample of 0-d index tensors `torch.tensor(i)` (as FlexAttention calls them),
    and the two must agree.

    Args:
        coords: any coordinate object (an [`mmpe.Coordinates`][mmpe.coords.base.Coordinates] subclass, mmpe's or yours).
        atol: absolute tolerance of the float comparisons.

    Raises:
        AssertionError: `"<Class>.<member>: violates the contract: <property>"`, naming the
            member and the violated property.
    """
    try:
        _check_contract(coords, atol)
    except AssertionError as err:
        raise AssertionError(f"{type(coords).__name__}.{err}") from err.__cause__


def _check_contract(coords: Any, atol: float) -> None:
    n_q, n_k, batch = _check_sizes(coords)
    grid = index_grid(batch, 1, n_q, n_k, coords.device)
    bg, _, qg, kg = grid
    mask = _check_mask(coords, batch, n_q, n_k)
    allowed = mask if mask is not None else torch.ones(batch, 1, n_q, n_k, dtype=torch.bool,
                                                         device=coords.device)
    samples = _scalar_samples(batch, n_q, n_k, coords.device)
    directed = isinstance(coords, Directed)

    if mask is not None:
        mod = coords.mask_mod()
        for b, q, k in samples:
            got = _call("mask_mod", mod, b, torch.tensor(0), q, k)
            _require(got.dtype == torch.bool and got.numel() == 1, "mask_mod",
                     f"must return a bool scalar on scalar indices, got {_describe(got)}")
            want = bool(mask[int(b), 0, int(q), int(k)])
            _require(bool(got) == want, "mask_mod",
                     f"scalar evaluation must equal the broadcast one at (b={int(b)}, q={int(q)}, "
                     f"k={int(k)}): scalar {bool(got)}, broadcast {want}")

    if directed:
        causal = coords.causal
        _require(isinstance(causal, bool), "causal", f"must be a bool, got {type(causal).__name__}")
        rel = _pairwise(coords, "relation", coords.relation, qg, kg, bg, (batch, 1, n_q, n_k))
        if causal:
            _require(mask is not None, "mask_mod",
                     "must not be None on causal coordinates (causal=True needs a mask)")
            leak = mask & (rel < 0)
            _require(not bool(leak.any()), "mask_mod",
                     f"must allow only relation >= 0 on causal coordinates: pair "
                     f"{_argmax(leak.int())} has relation < 0 but is allowed")
        for b, q, k in samples:
            r = _call("relation", coords.relation, q, k, b)
            _scalar_equal("relation", r, rel[int(b), 0, int(q), int(k)], (b, q, k), atol)

    if isinstance(coords, Metric):
        dist = _pairwise(coords, "distance", coords.distance, qg, kg, bg, (batch, 1, n_q, n_k))
        _require(dist.dtype.is_floating_point, "distance",
                 f"must be a float tensor, got {dist.dtype}")
        _require(bool(torch.isfinite(dist).all()), "distance", "must be finite on every pair")
        _require(bool((dist >= 0).all()), "distance",
                 f"must be non-negative (smallest value {float(dist.min()):g})")
        if n_q == n_k and not directed:
            asym = (dist - dist.transpose(-1, -2)).abs()
            worst = _argmax(asym)
            _require(bool((asym <= atol + 1e-6 * dist.abs()).all()), "distance",
                     f"must be symmetric d(i, j) == d(j, i) (undirected coordinates): at {worst} "
                     f"differs by {float(asym.max()):g}")
        if n_q == n_k:
            diag = dist.diagonal(dim1=-2, dim2=-1)
            diag_ok = allowed.diagonal(dim1=-2, dim2=-1)
            bad = diag_ok & (diag.abs() > atol)
            _require(not bool(bad.any()), "distance",
                     f"must be 0 on the diagonal d(i, i) (allowed pairs): largest "
                     f"{float(torch.where(diag_ok, diag.abs(), 0).max()):g}")
        ext = _pairwise(coords, "extent", lambda q, k, b: coords.extent(q, b), qg, kg, bg,
                        (batch, 1, n_q, 1))
        _require(ext.dtype.is_floating_point, "extent", f"must be a float tensor, got {ext.dtype}")
        _require(bool(torch.isfinite(ext).all()), "extent", "must be finite for every query")
        excess = torch.where(allowed, dist.float() - ext.float() - atol - 1e-5 * ext.float().abs(),
                             torch.zeros((), device=dist.device))
        if bool((excess > 0).any()):
            b, _, q, k = _argmax(excess)
            raise AssertionError(
                f"extent: violates the contract: extent(q) >= distance(q, k) must hold on "
                f"every pair the mask allows; at (b={b}, q={q}, k={k}) distance "
                f"{float(dist[b, 0, q, k]):g} > extent {float(ext[b, 0, q, 0]):g}")
        for b, q, k in samples:
            d = _call("distance", coords.distance, q, k, b)
            _scalar_equal("distance", d, dist[int(b), 0, int(q), int(k)], (b, q, k), atol)
            e = _call("extent", coords.extent, q, b)
            _scalar_equal("extent", e, ext[int(b), 0, int(q), 0], (b, q, k), atol)

    if directed and isinstance(coords, Metric):
        gap = (dist.float() - rel.abs().float()).abs()
        _require(bool((gap <= atol + 1e-6 * dist.float().abs()).all()), "relation",
                 f"must be consistent with distance (distance == |relation|): at {_argmax(gap)} "
                 f"they differ by {float(gap.max()):g}")

    if isinstance(coords, Positioned):
        axes = coords.num_axes
        _require(isinstance(axes, int) and not isinstance(axes, bool) and axes >= 1, "num_axes",
                 f"must be a positive int, got {axes!r}")
        for member, rows in (("query_positions", n_q), ("key_positions", n_k)):
            pos = getattr(coords, member)
            _require(isinstance(pos, Tensor), member, f"must be a tensor, got {type(pos).__name__}")
            shape = tuple(pos.shape)
            ok = pos.dim() in (2, 3) and shape[-1] == axes and shape[-2] == rows
            _require(ok, member, f"must have shape [n, a] or [b, n, a] with n={rows}, "
                                 f"a=num_axes={axes}; got {shape}")
            if pos.dim() == 3 and coords.batch_size is not None:
                _require(shape[0] == coords.batch_size, member,
                         f"must have batch_size={coords.batch_size} rows in dim 0, got {shape[0]}")
            _require(bool(torch.isfinite(pos.float()).all()), member, "must be finite")


# -- helpers -------------------------------------------------------------------------------
def _require(ok: bool, member: str, prop: str) -> None:
    if not ok:
        raise AssertionError(f"{member}: violates the contract: {prop}")


def _check_sizes(coords: Any) -> tuple[int, int, int]:
    for member in ("num_queries", "num_keys"):
        val = getattr(coords, member)
        _require(isinstance(val, int) and not isinstance(val, bool) and val > 0, member,
                 f"must be a positive int, got {val!r}")
    batch = coords.batch_size
    positive = isinstance(batch, int) and not isinstance(batch, bool) and batch > 0
    _require(batch is None or positive, "batch_size",
             f"must be None or a positive int, got {batch!r}")
    _require(isinstance(coords.device, torch.device), "device",
             f"must be a torch.device, got {type(coords.device).__name__}")
    return coords.num_queries, coords.num_keys, batch or 1


def _check_mask(coords: Any, batch: int, n_q: int, n_k: int) -> Tensor | None:
    if coords.mask_mod() is None:
        return None
    mask = coords.dense_mask()
    _require(isinstance(mask, Tensor) and mask.dtype == torch.bool, "dense_mask",
             f"must be a bool tensor, got {_describe(mask)}")
    _require(tuple(mask.shape) == (batch, 1, n_q, n_k), "dense_mask",
             f"must have shape [b or 1, 1, n_q, n_k] = {(batch, 1, n_q, n_k)}, "
             f"got {tuple(mask.shape)}")
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        b, _, q = (int(i) for i in torch.nonzero(empty)[0])
        raise AssertionError(f"mask_mod: violates the contract: every query must attend to at "
                             f"least one key; query {q} of example {b} attends to none")
    return mask


def _call(member: str, fn, *args):
    try:
        out = fn(*args)
    except Exception as err:  # the message names the member
        shapes = [tuple(a.shape) for a in args if a is not None]
        raise AssertionError(f"{member}: violates the contract: raised {type(err).__name__}: "
                             f"{err} on index tensors of shapes {shapes}") from err
    _require(isinstance(out, Tensor), member, f"must return a tensor, got {type(out).__name__}")
    return out


def _pairwise(coords: Any, member: str, fn, q: Tensor, k: Tensor, b: Tensor,
              shape: tuple[int, ...]) -> Tensor:
    out = _call(member, fn, q, k, b)
    try:
        return out.expand(shape)
    except RuntimeError as err:
        raise AssertionError(f"{member}: violates the contract: must return a result that "
                             f"broadcasts to {shape} on the index grid, got {tuple(out.shape)}"
                             ) from err


def _scalar_samples(batch: int, n_q: int, n_k: int, device) -> list[tuple[Tensor, Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(0)
    triples = {(0, 0, 0), (batch - 1, n_q - 1, n_k - 1), (0, n_q - 1, 0), (batch - 1, 0, n_k - 1)}
    for _ in range(_SCALAR_SAMPLES):
        triples.add(tuple(int(torch.randint(n, (), generator=gen)) for n in (batch, n_q, n_k)))
    return [tuple(torch.tensor(i, device=device) for i in t) for t in sorted(triples)]


def _scalar_equal(member: str, got: Tensor, want: Tensor, idx, atol: float) -> None:
    b, q, k = (int(i) for i in idx)
    _require(got.numel() == 1, member,
             f"must return one value on scalar (flex) indices (b={b}, q={q}, k={k}), got shape "
             f"{tuple(got.shape)}")
    g, w = float(got), float(want)
    _require(abs(g - w) <= atol + 1e-6 * abs(w), member,
             f"must be equal on scalar (flex) and broadcast (eager) indices at (b={b}, q={q}, "
             f"k={k}): scalar {g:g}, broadcast {w:g}")


def _argmax(t: Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(t.flatten().float().argmax(), t.shape))


def _describe(t: Any) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


#: what every attention path is held to against the math route, by dtype: `(atol, rtol)` for the
#: output and for each gradient. float32 sums the scores in another order on each path (a fused
#: kernel, a table read by offset, tiles): a few ulps of a score of size 10 move an output by
#: ~1e-6 and a gradient summed over n pairs by up to n times that.
TOLERANCES: dict[torch.dtype, dict[str, tuple[float, float]]] = {
    torch.float32: {"output": (2e-5, 1e-4), "gradient": (1e-4, 1e-3)},
    torch.float64: {"output": (1e-10, 1e-8), "gradient": (1e-9, 1e-7)},
}


def assert_encoding_paths(encoding: Any, coords: Any, *, num_heads: int | None = None,
                          head_dim: int = 8, batch: int | None = None,
                          dtype: torch.dtype = torch.float32, seed: int = 0,
                          grad: bool = True, block_bytes: int = 4096) -> list[str]:
    """Check `encoding` on every attention path that can run it against the math route.

    One `MultiHeadAttention(num_heads · head_dim, num_heads, [encoding])` with the same
    projections per path; the paths are the dispatcher's own choice (`"auto"`), each plan of
    the sdpa route that can run the call ([`SDPA_PLANS`][mmpe.attention.dispatch.SDPA_PLANS]:
    the relation, grid, tiles, checkpointed and dense plans, with a block budget of
    `block_bytes` so that blocks are small), the dense route (`route="dense"`, what CUDA
    takes for learned terms), and FlexAttention where this torch has it (on the
    CPU forward only where its backward is missing). Compared: the output and, with `grad`, the
    gradients of `Σ out²` w.r.t. the input and every parameter of `encoding`.

    Args:
        encoding: any mmpe encoding (score encodings are the ones with several paths).
        coords: coordinates it supports (small: the math route holds every score).
        num_heads: `n_h` (default: the encoding's `num_heads`, else 2).
        head_dim: `h_d` (the encoding's `head_dim` where it has one).
        batch: `b` (default: the coordinates' batch size, else 2).
        dtype: float32 or float64 (the tolerances of `TOLERANCES`).
        seed: seeds the projections and the input.

    Returns:
        the names of the paths checked (`"auto"`, `"sdpa:relation"`, …, `"dense"`, `"flex"`).

    Raises:
        AssertionError: a path's output or gradient differs, naming the path and the tensor.
    """
    from mmpe import flex_compile
    from mmpe.attention import MultiHeadAttention
    from mmpe.attention.dispatch import SDPA_PLANS, force_plan

    heads = num_heads or getattr(encoding, "num_heads", None) or 2
    head_dim = getattr(encoding, "head_dim", None) or head_dim
    batch = batch or getattr(coords, "batch_size", None) or 2
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, coords.num_queries, heads * head_dim, generator=gen, dtype=dtype)
    params = [p for p in encoding.parameters() if p.requires_grad] if grad else []

    def step(route: str, forward_only: bool = False) -> list[Tensor]:
        torch.manual_seed(seed)
        attn = MultiHeadAttention(heads * head_dim, heads, [encoding], head_dim=head_dim,
                                  route=route).to(dtype)
        xs = x.clone().requires_grad_(grad and not forward_only)
        for p in params:
            p.grad = None
        with torch.set_grad_enabled(grad and not forward_only):
            out = attn(xs, coords)
            if forward_only or not grad:
                return [out]
            out.square().sum().backward()
        return [out.detach(), xs.grad, *(p.grad if p.grad is not None else torch.zeros_like(p)
                                         for p in params)]

    want = step("math")
    checked = []
    runs: list[tuple[str, str, str | None]] = [("auto", "auto", None)]
    runs += [(f"sdpa:{plan}", "sdpa", plan) for plan in SDPA_PLANS]
    runs.append(("dense", "dense", None))  # the CUDA route of learned terms, on this device
    runs.append(("flex", "flex", None))
    old_budget = os.environ.get("MMPE_ATTN_BLOCK_BYTES")
    os.environ["MMPE_ATTN_BLOCK_BYTES"] = str(block_bytes)
    try:
        for name, route, plan in runs:
            try:
                with force_plan(plan):
                    got = step(route)
            except ValueError as err:  # a plan that cannot run this call
                if any(why in str(err) for why in ("cannot run this call", "cannot run a non-softmax",
                                                   "needs additive score terms")):
                    continue
                raise
            except NotImplementedError:  # FlexAttention without a backward on the CPU
                if route != "flex" or not grad:
                    raise
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "called without torch.compile"
                    got = step(route, forward_only=True)
                name = "flex (forward)"
            except flex_compile.FlexUnavailableError:
                continue
            _compare(name, got, want, dtype, params)
            checked.append(name)
    finally:
        if old_budget is None:
            os.environ.pop("MMPE_ATTN_BLOCK_BYTES", None)
        else:
            os.environ["MMPE_ATTN_BLOCK_BYTES"] = old_budget
    return checked


def _compare(path: str, got: list[Tensor], want: list[Tensor], dtype: torch.dtype,
             params: list[Tensor]) -> None:
    names = ["output", "input gradient", *(f"gradient of parameter {i} {tuple(p.shape)}"
                                          for i, p in enumerate(params))]
    for name, a, b in zip(names, got, want, strict=False):
        atol, rtol = TOLERANCES[dtype]["output" if name == "output" else "gradient"]
        if a is None or b is None:
            if (a is None) != (b is None):
                raise AssertionError(f"{path}: {name} is None on one path only")
            continue
        if not torch.allclose(a.to(b.dtype), b, atol=atol, rtol=rtol):
            diff = (a.to(b.dtype) - b).abs().max().item()
            raise AssertionError(f"{path}: {name} differs from the math route by {diff:.3g} "
                                 f"(atol {atol}, rtol {rtol})")
