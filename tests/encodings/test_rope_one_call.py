"""RoPE rotates `q` and `k` in one call (`rotate_qk`) from one gather of a cos/sin table kept
in the rotation's compute dtype: bit for bit what rotating each of them with its own freshly
built tables gives (`rope_cos_sin` + `apply_rotary`), on the CPU, for float32 and bfloat16,
both channel layouts, partial rotary, self-attention and a cached step; the table is built
once per dtype and reused."""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe.encodings.rope import apply_rotary, rope_cos_sin, rope_inv_freq, rotation_dtype


def _reference(rope, q, k, qpos, kpos):
    inv = rope_inv_freq(rope.rotary_dim, rope.base)
    out = []
    for x, pos in ((q, qpos), (k, kpos)):
        cos, sin = rope_cos_sin(pos, inv, 1.0, rotation_dtype(x.dtype))
        out.append(apply_rotary(x, cos, sin, rope.interleaved))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize("cached", [False, True])
def test_one_call_equals_separate_rotations(dtype, interleaved, rotary_dim, cached) -> None:
    rope = mmpe.build("rope", head_dim=16, rotary_dim=rotary_dim, interleaved=interleaved)
    n_q, past = (3, 5) if cached else (7, 0)
    coords = mmpe.Sequence(n_q, offset=past, causal=True)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, n_q, 16, generator=gen).to(dtype)
    k = torch.randn(2, 3, n_q + past, 16, generator=gen).to(dtype)
    want = _reference(rope, q, k, torch.arange(past, past + n_q), torch.arange(n_q + past))
    for _ in range(2):  # the first call builds the table, the second reads it
        got = rope(q, k, coords)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == dtype and torch.equal(a, b)
    assert list(rope._cache.tables) == [rotation_dtype(dtype)]  # the compute dtype only
    table = rope._cache.tables[rotation_dtype(dtype)]
    rope(q, k, coords)
    assert rope._cache.tables[rotation_dtype(dtype)] is table  # kept, not rebuilt


def test_one_call_under_autograd_matches_and_differentiates() -> None:
    rope = mmpe.build("rope", head_dim=8)
    coords = mmpe.Sequence(6)
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    k = torch.randn(1, 2, 6, 8, requires_grad=True)
    rq, rk = rope(q, k, coords)
    wq, wk = _reference(rope, q, k, torch.arange(6), torch.arange(6))
    torch.testing.assert_close(rq, wq, atol=0, rtol=0)
    torch.testing.assert_close(rk, wk, atol=0, rtol=0)
    (rq.square().sum() + rk.square().sum()).backward()
    # a rotation keeps norms: d‖Rx‖²/dx = 2x
    torch.testing.assert_close(q.grad, 2 * q.detach(), atol=1e-5, rtol=1e-5)
