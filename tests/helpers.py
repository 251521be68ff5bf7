"""Helpers shared by the tests (fixtures live in conftest.py): coordinates the attention tests
draw, the check that every route agrees, subprocess runs, Debian data, and the repository's
paths. Tolerances of path-against-path comparisons are `mmpe.testing.TOLERANCES`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import mmpe
from mmpe.context import coords_context
from mmpe.coords import Composite, Grid, Sequence, Sphere

#: the repository root and the tests' data folder
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def random_points(batch: int | None, n: int, seed: int, padded: bool = False,
                  dtype: torch.dtype = torch.float32,
                  grad: bool = False) -> tuple[mmpe.Points, torch.Tensor]:
    """`n` points uniform in `[0, 4)³` (`[n, 3]`, or `[batch, n, 3]`), with a random padding
    mask that keeps each example's first point where `padded`; and the positions tensor
    (`requires_grad` where `grad`)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, 3) if batch is None else (batch, n, 3)
    pos = (torch.rand(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
    pos.requires_grad_(grad)
    mask = None
    if padded and n > 1:
        mask = torch.rand(shape[:-1], generator=g) > 0.3
        mask[..., 0] = True
    return mmpe.Points(pos, mask), pos


def lattice(n: int, width: int = 4, batch: bool = False, virtual: bool = False) -> mmpe.Graph:
    """`n` nodes on a lattice `width` wide (edges right and down), hops capped at 3; with
    `batch`, two graphs (the first and second half, no edge between them); with `virtual`,
    Graphormer's virtual token."""
    i = torch.arange(n)
    right = torch.stack((i[(i + 1) % width != 0][:-1], i[(i + 1) % width != 0][:-1] + 1))
    down = torch.stack((i[: max(0, n - width)], i[: max(0, n - width)] + width))
    edges = torch.cat((right[:, right[1] < n], down), dim=1)
    graph_of = (torch.arange(n) >= n // 2).long() if batch else None
    if graph_of is not None:
        edges = edges[:, graph_of[edges[0]] == graph_of[edges[1]]]
    return mmpe.Graph(edges, num_nodes=n, max_distance=3, batch=graph_of, virtual_token=virtual)


def require_debian(package: str, path: str | None = None, command: str | None = None) -> None:
    """Skip unless a Debian package's file or command is present; under CI=true, fail instead.

    ``path``: a file the package installs; ``command``: a program it installs.
    """
    present = (path is None or os.path.exists(path)) and (command is None or shutil.which(command))
    if present:
        return
    message = f"needs the Debian package {package!r}: apt-get install {package}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: missing data is a failure)")
    pytest.skip(message)


def generic_bias(enc, ctx) -> torch.Tensor:
    """The term's generic form on every pair (`score_mod` on the index grid,
    `mmpe.attention.generic.pair_rows`): the definition the fast forms are held to."""
    from mmpe.attention.generic import pair_rows

    return pair_rows(enc, ctx, 0, ctx.coords.num_queries)


def assert_routes_agree(mha, x: torch.Tensor, coords, atol: float = 1e-5) -> None:
    """The flex, SDPA and math routes of ``mha`` give the same output on ``x`` (no grad)."""
    from mmpe.flex_compile import available

    outs = {}
    with torch.no_grad():
        for route in ("sdpa", "math", "flex") if available() else ("sdpa", "math"):
            mha.route = route
            outs[route] = mha(x, coords)
    assert torch.allclose(outs["math"], outs["sdpa"], atol=atol), "math vs sdpa"
    if "flex" in outs:  # torch >= 2.6 (mmpe.flex_compile.MIN_TORCH)
        assert torch.allclose(outs["flex"], outs["sdpa"], atol=atol), "flex vs sdpa"


def run_in_fresh_process(test_file: str, test_name: str) -> bool:
    """Run one test in a new interpreter and return True there; return False inside it.

    Fork-based DDP (``ddp_fork``) refuses a parent process in which autograd has already run
    (its worker threads cannot be forked), which is the case after any earlier test in the
    same session. Call as ``if run_in_fresh_process(__file__, "test_x"): return``.
    """
    if os.environ.get("MMPE_FRESH_PROCESS") == "1":
        return False
    run = subprocess.run(
        # (`-m`: the test's own markers, `train` say, must not deselect it there)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", "-m", "not gpu",
         f"{test_file}::{test_name}"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "MMPE_FRESH_PROCESS": "1"},
    )
    assert run.returncode == 0, (run.stdout[-4000:] + run.stderr[-4000:])
    print(run.stdout[-2000:])
    return True


def structured_score_cases(context: dict, options: dict, coords: dict) -> list[tuple[str, str]]:
    """`(encoding, kind)` for every registered additive score encoding with a hand-written fast
    form (`mmpe.attention.fast_forms.FAST_FORMS`) or a structure narrower than a pair, on every
    kind of `coords` (`{kind: Coordinates}`) it takes: the rows of the fast-path tests, drawn
    from the table and the registry rather than a hand list."""
    from mmpe.attention import fast_forms
    from mmpe.encodings.base import ScoreEncoding
    from mmpe.registry import available

    cases = []
    for entry in available():
        cls = entry.cls
        if not (issubclass(cls, ScoreEncoding) and cls.additive) or cls.needs_probs:
            continue
        if cls not in fast_forms.FAST_FORMS and cls.structure == "pair":
            continue
        enc = mmpe.build(entry.name, context=context, **options.get(entry.name, {}))
        for kind, c in coords.items():
            try:
                enc.check_coords(c)
            except (TypeError, ValueError):
                continue
            cases.append((entry.name, kind))
    return cases


D_MODEL, HEADS = 48, 2  # head_dim 24: divisible by 2·axes for 1, 2 and 3 axes, and by 4


def _graph(virtual_token: bool = False):
    # Two graphs (a 4-cycle with a chord, a 3-path) batched as PyG would batch them.
    edges = torch.tensor([[0, 1, 2, 3, 0, 4, 5], [1, 2, 3, 0, 2, 5, 6]])
    return mmpe.Graph(edges, num_nodes=7, batch=torch.tensor([0, 0, 0, 0, 1, 1, 1]),
                      edge_attr=torch.arange(7) % 3, virtual_token=virtual_token)


def _table():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(64, 2))
    x = np.concatenate([base, base @ rng.normal(size=(2, 3)) + 0.1 * rng.normal(size=(64, 3))], 1)
    return mmpe.Table.from_data(x, knn=2)


def _points():
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    return mmpe.Points(torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0)), mask=mask)


#: one small sample of every shipped coordinate type (the registry matrix's columns)
SAMPLE_COORDS = {
    "sequence": lambda: Sequence(6),
    "sequence_causal": lambda: Sequence(6, causal=True),
    "grid": lambda: Grid((2, 3), prefix_tokens=1),
    "composite": lambda: Composite([2, (2, 2), 2], causal=True),
    "sphere": lambda: Sphere(torch.tensor([10.0, -20.0, 45.0, 80.0, -60.0]),
                             torch.tensor([0.0, 90.0, -170.0, 30.0, 179.0])),
    "graph": _graph,
    "graph_virtual": lambda: _graph(virtual_token=True),
    "table": _table,
    "points": _points,
    # Two rows of images at their own resolutions, one cls each, padded (NaViT / NaFlex packing).
    "packed_grids": lambda: mmpe.PackedGrids([[(2, 3), (1, 2)], [(2, 2)]], prefix_tokens=1,
                                             max_tokens=11),
    # Digits 3, 1 | 4, 5 | 9: a Sequence whose tokens also know their place in a number (Abacus).
    "numbers": lambda: mmpe.Numbers.from_tokens(torch.tensor([3, 1, 12, 4, 5, 11, 9]), list(range(10)),
                                                causal=True),
}


def model_context(coords) -> dict:
    """The model-wide context every registered encoding is built from, for `coords`."""
    ctx = {"d_model": D_MODEL, "num_heads": HEADS, "head_dim": D_MODEL // HEADS, "max_len": 64,
           "original_max_position_embeddings": 4}
    return {**ctx, **coords_context(coords)}


def assert_bfloat16_and_autocast_follow_float32(mha, x, coords, rtol: float = 2e-2) -> None:
    """`mha` under CPU autocast to bf16 and cast to bf16 both give finite outputs within
    `rtol` (relative norm) of its float32 output on `x`, `coords`."""
    ref = mha(x, coords)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = mha(x, coords)
    half = mha.to(torch.bfloat16)(x.bfloat16(), coords)
    for out in (auto, half):
        assert torch.isfinite(out).all()
        assert (out.float() - ref).norm() / ref.norm() < rtol


class CapturedUses(TorchFunctionMode):
    """Records each use of a tensor that requires grad and was not made inside the call: as the
    tensor a `__getitem__` indexes (`reads`) or in any other op (`other`)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[torch.Tensor] = []  # kept alive so their ids are not reused
        self.made_ids: set[int] = set()
        self.reads: Counter[int] = Counter()
        self.other: set[tuple[tuple, str]] = set()
        self.shapes: dict[int, tuple] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        for t in tensors:
            if t.requires_grad and id(t) not in self.made_ids:
                self.shapes[id(t)] = tuple(t.shape)
                if func is torch.Tensor.__getitem__ and t is args[0]:
                    self.reads[id(t)] += 1
                else:
                    self.other.add((tuple(t.shape), getattr(func, "__name__", str(func))))
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.made.append(o)
                self.made_ids.add(id(o))
        return out
