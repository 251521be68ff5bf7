"""The GPU tier's check of the fla route (skips without a CUDA device or flash-linear-attention):
fla's Triton kernels for FoX, stick-breaking, PaTH and PaTH-FoX give mmpe's math route's
output and gradients on the device, bf16 (the CPU tests hold the mapping with fla's
pure-PyTorch references in the kernels' place: tests/attention/test_fla_route.py)."""

from __future__ import annotations

import pytest
import torch

import mmpe

pytestmark = pytest.mark.gpu
pytest.importorskip("fla")
D_MODEL, HEADS, N = 256, 4, 512
#: relative Frobenius error in bf16 (output, gradients), as tests/gpu/test_gpu_route.py
TOL = (2e-2, 5e-2)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-2)).item()


@pytest.mark.parametrize("name", ["fox", "stick_breaking", "path", "path_fox"])
def test_the_fla_kernel_equals_the_math_route_on_the_device(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(0)
    enc = mmpe.build(name, context={"d_model": D_MODEL, "num_heads": HEADS,
                                    "head_dim": D_MODEL // HEADS})
    layers = [mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route=r).cuda().bfloat16()
              for r in ("fla", "math")]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(2, N, D_MODEL, device="cuda", dtype=torch.bfloat16)
    coords = mmpe.Sequence(N, causal=True, device="cuda")
    results = []
    for layer in layers:
        xi = x.clone().requires_grad_()
        out = layer(xi, coords)
        (gx,) = torch.autograd.grad(out.float().square().sum(), [xi])
        results.append((out, gx))
    (a, ga), (b, gb) = results
    assert _relative(a, b) < TOL[0], name
    assert _relative(ga, gb) < TOL[1], name
