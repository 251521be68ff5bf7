"""RoPE rotates bf16/fp16 inputs in their own dtype: the error that accepts, measured.

The cos/sin tables always come from float64 phases reduced mod 2π (:func:`rope_cos_sin`) and
are rounded once to the rotation dtype (:func:`rotation_dtype`: bf16 and fp16 keep their
dtype, float32 and float64 theirs). The reference rotates the *same* input values (converted
to float64) with float64 tables, so what is measured is the rotation's own error, in units of
the dtype's eps (``torch.finfo(dtype).eps``: 2⁻⁷ bf16, 2⁻¹⁰ fp16, 2⁻²³ fp32):

* ``max_err`` = max |out − ref| / (eps · max |x|)
* ``norm_err`` = ‖out − ref‖ / (eps · ‖ref‖)

Measured (torch 2.11, CPU; ``x`` ~ 3·N(0, 1), [2, 4, 1024, 64], 5 seeds, positions 0 … 1023 and
10⁶ + 997·i, both pair layouts): max_err ≤ 0.75 and norm_err ≤ 0.36 for all three dtypes
(``benchmarks/bench_text.py``'s inputs: 0.81 float32, 0.77 bf16, 0.67 fp16);
rotating bf16/fp16 in float32 and rounding once (the previous behaviour, still what
``apply_rotary`` does with float32 tables) gives max_err 0.29–0.56, norm_err ~0.2. Bounds
tested: max_err ≤ 1.0, norm_err ≤ 0.5 — i.e. bf16 output within one bf16 eps of the largest
input, about one extra rounding. A phase error would be far outside: HF's float32 phases
give max_err 240 in float32 already at positions 0 … 1023 (``benchmarks/bench_text.py``).
"""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe import Grid, Sequence
from mmpe.encodings.rope import (
    RoPE,
    apply_rotary,
    rope_cos_sin,
    rope_inv_freq,
    rotation_dtype,
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_ERR, NORM_ERR = 1.0, 0.5
POSITIONS = {"near": torch.arange(1024), "far": torch.arange(1024) * 997 + 10**6}


def _errors(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    eps = torch.finfo(x.dtype).eps
    diff = out.double() - ref
    return (float(diff.abs().max()) / (eps * float(x.double().abs().max())),
            float(diff.norm() / ref.norm()) / eps)


def _reference(x: torch.Tensor, positions: torch.Tensor, interleaved: bool) -> torch.Tensor:
    cos, sin = rope_cos_sin(positions, rope_inv_freq(x.shape[-1]), dtype=torch.float64)
    return apply_rotary(x.double(), cos, sin, interleaved)


def test_rotation_dtype() -> None:
    assert rotation_dtype(torch.bfloat16) == torch.bfloat16
    assert rotation_dtype(torch.float16) == torch.float16
    assert rotation_dtype(torch.float32) == torch.float32
    assert rotation_dtype(torch.float64) == torch.float64


@pytest.mark.parametrize("where", list(POSITIONS))
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_rope_error_per_dtype(dtype: torch.dtype, interleaved: bool, where: str) -> None:
    positions = POSITIONS[where]
    coords = Sequence(position_ids=positions)
    rope = RoPE(64, interleaved=interleaved)
    worst = (0.0, 0.0)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        x = (3 * torch.randn(2, 4, positions.numel(), 64, generator=g)).to(dtype)
        out, _ = rope(x, x, coords)
        assert out.dtype == dtype
        err = _errors(out, _reference(x, positions, interleaved), x)
        worst = (max(worst[0], err[0]), max(worst[1], err[1]))
    assert worst[0] <= MAX_ERR, f"max error {worst[0]:.3f} eps·max|x| > {MAX_ERR}"
    assert worst[1] <= NORM_ERR, f"norm error {worst[1]:.3f} eps > {NORM_ERR}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_tables_still_rotate_in_float32(dtype: torch.dtype) -> None:
    """``apply_rotary`` with float32 tables (``rope_cos_sin``'s default) keeps the old rule:
    float32 arithmetic, one rounding — at most half an ulp of the largest output."""
    positions = POSITIONS["far"]
    x = (3 * torch.randn(2, 4, 1024, 64, generator=torch.Generator().manual_seed(0))).to(dtype)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(64))
    out = apply_rotary(x, cos, sin)
    max_err, _ = _errors(out, _reference(x, positions, False), x)
    assert out.dtype == dtype and max_err <= 0.6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bf16_positions_far_out_keep_their_phase(dtype: torch.dtype) -> None:
    """Positions 10⁷ apart still score alike in bf16/fp16 (phases in float64): the score
    change is of the order of the dtype's rounding, not of a phase error (radians)."""
    rope = RoPE(64)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)

    def score(m: int, n: int) -> float:
        rq, _ = rope(q.to(dtype), q.to(dtype), Sequence(position_ids=torch.tensor([m])))
        rk, _ = rope(k.to(dtype), k.to(dtype), Sequence(position_ids=torch.tensor([n])))
        return float((rq.double() * rk.double()).sum())

    exact = score(12, 5)
    eps = torch.finfo(dtype).eps
    assert abs(score(12 + 10**7, 5 + 10**7) - exact) <= 4 * eps * float(q.norm() * k.norm())


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grid_rotary_error_per_dtype(name: str, dtype: torch.dtype) -> None:
    """The grid rotaries rotate bf16/fp16 in their own dtype too; same bound."""
    grid = Grid((14, 14), prefix_tokens=1)
    torch.manual_seed(0)
    enc = mmpe.build(name, context={"head_dim": 64, "num_heads": 4})
    x = (3 * torch.randn(2, 4, grid.num_tokens, 64)).to(dtype)
    with torch.no_grad():
        out, _ = enc(x, x, grid)
        ref, _ = enc.double()(x.double(), x.double(), grid)
    max_err, norm_err = _errors(out, ref, x)
    assert out.dtype == dtype
    assert max_err <= MAX_ERR and norm_err <= NORM_ERR, (max_err, norm_err)
