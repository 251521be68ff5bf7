"""The GPU tier's check that the dense route reaches the kernel its rule names (issue 57; skips
without a CUDA device): every registered additive score encoding on every sample coordinate
type it takes runs a dense step (forward and backward, fp32 and bf16) under
`sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])`, where a call the memory-efficient kernel
refuses raises instead of falling back to the math kernel (the numbers-only tests would pass on
the math kernel); each call is also held to `sdpa_rules.efficient_violations`, which names the
per-call mask copy that the kernel makes silently. `tests/attention/test_sdpa_mask_rules.py`
checks the same rules on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu  # (tests/conftest.py skips the tier without a CUDA device)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))  # sdpa_rules
from helpers import D_MODEL, HEADS, SAMPLE_COORDS, model_context  # noqa: E402
from sdpa_rules import efficient_violations, record_calls  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import mmpe  # noqa: E402


def _cases() -> list:
    out = []
    for cname, make in SAMPLE_COORDS.items():
        coords = make()
        for entry in mmpe.available(hook="score"):
            if entry.supports(coords):
                enc = mmpe.build(entry.name, context=model_context(coords))
                if enc.additive and not enc.needs_probs:
                    out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("name", "cname"), _cases())
def test_each_dense_step_runs_on_the_memory_efficient_kernel(
        name: str, cname: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    coords = SAMPLE_COORDS[cname]()
    coords = coords.to("cuda") if hasattr(coords, "to") else coords
    torch.manual_seed(0)
    enc = mmpe.build(name, context=model_context(coords))
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route="dense").to("cuda", dtype)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL, device="cuda",
                    dtype=dtype, requires_grad=True)
    calls = record_calls(monkeypatch)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # a fallback raises here
        mha(x, coords).float().square().mean().backward()
    assert calls
    for call in calls:
        broken = efficient_violations(call)
        assert not broken, f"{name} on {cname}: " + "; ".join(broken)
