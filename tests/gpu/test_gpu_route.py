"""The GPU tier's check of the CUDA route (issue 49; skips without a CUDA device): the route a
call logs is the one `which_route` names for the device, and the dense route (SDPA's kernel
with the bias, broadcast over the batch) gives the math route's output and gradients on the
device, fp32 and bf16, for learned tables on a grid with a prefix token, a sequence and a
graph batch."""

from __future__ import annotations

import copy

import pytest
import torch

import mmpe
from mmpe.attention import log_routes, which_route

pytestmark = pytest.mark.gpu
D_MODEL, HEADS = 256, 4
CASES = {"t5": lambda: mmpe.Sequence(300), "swin": lambda: mmpe.Grid((12, 14), prefix_tokens=1),
         "kerple_log": lambda: mmpe.Sequence(257, causal=True),
         "graphormer_spatial": lambda: mmpe.Graph(
             torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]]), 6,
             torch.tensor([0, 0, 0, 1, 1, 1]))}
#: relative Frobenius error against the math route on the device (as tests/gpu/test_gpu.py)
TOL = {torch.float32: (1e-5, 1e-4, 1e-3), torch.bfloat16: (2e-2, 5e-2, 1e-1)}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-2)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_dense_route_on_cuda_equals_the_math_path(name: str, dtype: torch.dtype) -> None:
    coords = CASES[name]()
    coords = coords.to("cuda") if hasattr(coords, "to") else coords
    context = {"num_heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL}
    options = {"grid_shape": (12, 14)} if name == "swin" else {}
    torch.manual_seed(0)
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [mmpe.build(name, context=context, **options)])
    with torch.no_grad():
        for p in mha.scores.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mha = mha.to("cuda", dtype)
    batch = coords.batch_size or 3
    assert which_route(mha, coords, batch=batch, device="cuda", dtype=dtype) == "dense"
    x = torch.randn(batch, coords.num_queries, D_MODEL, device="cuda", dtype=dtype)

    def step(layer, route):
        layer.route = route
        xs = x.clone().requires_grad_(True)
        with log_routes() as routes:
            out = layer(xs, coords)
        out.float().square().mean().backward()
        grads = [p.grad for p in layer.scores.parameters()]
        return routes, [out, xs.grad, *grads]

    routes, got = step(copy.deepcopy(mha), "auto")
    assert list(routes.values()) == [["dense"]]
    _, want = step(mha, "math")
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        tol = TOL[dtype][min(i, 2)]
        assert _relative(a, b) <= tol, (i, _relative(a, b))
