"""Mixed precision: every encoding × every coordinate sample it supports, in bf16 and fp16.

Driven by the registry like ``tests/package/test_registry_matrix.py`` (same coordinate samples and
model-wide context, plus three samples where precision bites: 128 causal tokens, 8 tokens at
positions up to 4000, and a (3, 4) grid for encodings built for (2, 3), whose tables are
resized). For each (encoding, coordinates) pair the float32 module is the reference; then

* ``cast_bf16`` / ``cast_fp16``: the module and the inputs ``x`` cast with ``.to(dtype)``
  (coordinates stay as they are: positions are never rounded);
* ``autocast_bf16`` / ``autocast_fp16``: the float32 module under
  ``torch.autocast("cpu", dtype)``.

Attention encodings run in :class:`mmpe.MultiHeadAttention` on the math and SDPA paths (flex is
slow on the CPU and computes what the math route does); input encodings through ``combine``.
The registry matrix's samples run all four modes; the three extra samples (long, far, resized
grid), there to catch precision bugs that grow with the length, run the two bf16 modes (a bf16
error there is 8× the fp16 one, so bf16 is the mode that fails first).
Every output must be finite, of the expected dtype (the cast dtype; under autocast the
attention's output projection gives the autocast dtype, an input encoding returns ``x``'s
float32), and close to the float32 output:

    relative error ``‖out − ref‖ / ‖ref‖`` ≤ ``TOLERANCE[dtype]``

==========  ==========  ==============================  ==========================================
dtype       tolerance   max measured (cast / autocast)  largest cases
==========  ==========  ==============================  ==========================================
bfloat16    2e-2        6.4e-3 / 7.1e-3                 TENER on 128 tokens (unscaled logits);
                                                        RoPE family ≤ 5.2e-3, swin / swinv2_cpb
                                                        ≤ 4.7e-3 (cast)
float16     3e-3        6.9e-4 / 8.9e-4                 TENER; RoPE family ≤ 7.1e-4
==========  ==========  ==============================  ==========================================

(torch 2.11, CPU, the seeds below; ``pytest -s`` prints the maxima of a run; earlier versions
of the library measured up to 8.7e-3 / 9.1e-3 bf16, swinv2_cpb on SDPA.) The
tolerances leave a 2.8-3.4× margin; a precision bug is far outside them: FoX's bf16 cumulative
sum of log-forget gates gave 5.2e-2 at 128 tokens (6.1e-3 in fp16) and 0.54 at 2048, a bf16
phase at position 3000 is off by radians.

The rotary encodings rotate bf16/fp16 queries and keys in their own dtype (cos/sin from
float64 phases, rounded once; :func:`mmpe.encodings.rope.rotation_dtype`), whose error alone
``tests/encodings/test_rope_dtype.py`` measures and bounds (≤ 0.81 eps of the largest input, bound 1.0).
Here that moved the RoPE family's errors by under ±10% (bf16 max 4.7e-3 → 5.2e-3, fp16
6.2e-4 → 7.1e-4, against rotating in float32 and rounding once).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_registry_matrix import COORDS, D_MODEL, HEADS, _context

import mmpe
from mmpe.coords import Grid, Sequence
from mmpe.encodings.base import InputEncoding

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3}
MODES = {
    "cast_bf16": (torch.bfloat16, False),
    "cast_fp16": (torch.float16, False),
    "autocast_bf16": (torch.bfloat16, True),
    "autocast_fp16": (torch.float16, True),
}
SAMPLES = {
    **COORDS,
    "sequence_long": lambda: Sequence(128, causal=True),
    "sequence_far": lambda: Sequence(
        position_ids=torch.tensor([0, 1, 2, 999, 1000, 2047, 3000, 4000]), causal=True),
    "grid_resized": lambda: Grid((3, 4), prefix_tokens=1),  # tables resized from (2, 3)
}
# Learned tables must hold every position of the 1D samples.
EXTRA_CONTEXT = {"sequence_long": {"max_len": 128}, "sequence_far": {"max_len": 4096},
                 "grid_resized": {"grid_shape": (2, 3)}}

def _cases() -> list:
    out = []
    for cname, make in SAMPLES.items():
        coords = make()
        for entry in mmpe.available():
            if entry.supports(coords):
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


def _build(name: str, cname: str):
    coords = SAMPLES[cname]()
    context = {**_context(coords), **EXTRA_CONTEXT.get(cname, {})}
    torch.manual_seed(1)
    enc = mmpe.build(name, context=context)
    return coords, enc


def _runner(enc, coords):
    """(module, run(module, x, path), paths) for an input or an attention encoding."""
    if isinstance(enc, InputEncoding):
        def run_input(module, x, path):
            if getattr(module, "width", None) and not getattr(module, "project", True):
                x = x[..., : D_MODEL - module.width]  # Tab-PET concatenates its own channels
            return module.combine(x, coords)

        return enc, run_input, ["input"]

    def run_attention(module, x, path):
        module.route = path
        return module(x, coords)

    kernel_only = getattr(enc, "hook", "") == "kernel" and not getattr(enc, "is_softmax", False)
    math_only = kernel_only or getattr(enc, "needs_probs", False)
    return (mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc]), run_attention,
            ["math"] if math_only else ["math", "sdpa"])


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


#: the largest relative error seen per (dtype, autocast), printed by ``-s`` runs of this module.
MEASURED: dict[str, tuple[float, str]] = {}


@pytest.mark.parametrize(("name", "cname"), _cases())
def test_low_precision_matches_float32(name: str, cname: str) -> None:
    coords, enc = _build(name, cname)
    module, run, paths = _runner(enc, coords)
    module.eval()  # no dropout, no random sign flips (LapPE)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL,
                    generator=torch.Generator().manual_seed(2))
    failures = []
    modes = {m: v for m, v in MODES.items() if cname in COORDS or v[0] == torch.bfloat16}
    cast = {m: copy.deepcopy(module).to(dtype) for m, (dtype, auto) in modes.items() if not auto}
    for path in paths:
        with torch.no_grad():
            ref = run(module, x, path)
        for mode, (dtype, autocast) in modes.items():
            try:
                with torch.no_grad():
                    if autocast:
                        with torch.autocast("cpu", dtype=dtype):
                            out = run(module, x, path)
                    else:
                        out = run(cast[mode], x.to(dtype), path)
            except Exception as err:  # noqa: BLE001 - reported with the mode below
                failures.append(f"{mode}/{path}: {type(err).__name__}: {err}")
                continue
            expected = torch.float32 if autocast and path == "input" else dtype
            err = relative_error(out, ref)
            if err > MEASURED.get(mode, (0.0, ""))[0]:
                MEASURED[mode] = (err, f"{name}-{cname}/{path}")
            if out.dtype != expected:
                failures.append(f"{mode}/{path}: output dtype {out.dtype}, expected {expected}")
            elif not torch.isfinite(out).all():
                failures.append(f"{mode}/{path}: output is not finite")
            elif err > TOLERANCE[dtype]:
                failures.append(f"{mode}/{path}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e}")
    assert not failures, "; ".join(failures)


def test_every_encoding_is_checked() -> None:
    """Every registered encoding has at least one coordinate sample here."""
    covered = {p.values[0] for p in _cases()}
    assert covered == {e.name for e in mmpe.available()}


def teardown_module() -> None:
    for mode, (err, where) in sorted(MEASURED.items()):
        print(f"\nmax relative error {mode}: {err:.2e} ({where})", end="")
