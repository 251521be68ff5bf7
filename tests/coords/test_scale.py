"""Every shipped coordinate type builds at n = 100,000 tokens in O(n) memory.

The clouds, graphs and sequences the block-wise attention paths exist for are long; building
their coordinates must not form anything pairwise (a float64 `[n, n]` table at 100,000 is 80
GB). The builds run in a fresh interpreter whose address space is capped at what it already
maps plus 3 GiB: an O(n²) allocation fails there at once instead of swapping the machine.
Pairwise quantities asked for afterwards (a point cloud's diameter) are checked too.
"""

from __future__ import annotations

import pytest
from helpers import run_in_fresh_process

N = 100_000

pytestmark = pytest.mark.subprocess

#: coordinate kinds whose input is itself pairwise: a `Table`'s columns come with an
#: `[n, n]` adjacency (or data whose column correlations are one), so O(n²) is its input size
PAIRWISE_INPUT = {"table"}


def _builders():
    import torch

    import mmpe
    from mmpe.coords import V2PESequence
    from mmpe.coords.vlm import VideoRoPEComposite

    g = torch.Generator().manual_seed(0)
    ring = torch.stack((torch.arange(N), (torch.arange(N) + 1) % N))
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[1, : N // 3] = False
    return {
        "sequence": lambda: mmpe.Sequence(N, causal=True, padding_mask=pad),
        "grid": lambda: mmpe.Grid((316, 316), prefix_tokens=1),
        "points": lambda: mmpe.Points(torch.randn(2, N // 2, 3, generator=g)).diameter,
        "sphere": lambda: mmpe.Sphere(torch.rand(N, generator=g) * 180 - 90,
                                      torch.rand(N, generator=g) * 360 - 180),
        "graph": lambda: mmpe.Graph(ring, num_nodes=N),
        "composite": lambda: mmpe.Composite([1000, (10, 90, 100), 9000]),
        "packed_grids": lambda: mmpe.PackedGrids([[(200, 200), (200, 240)]], prefix_tokens=1),
        "numbers": lambda: mmpe.Numbers(torch.rand(N, generator=g) > 0.5, causal=True),
        "latents": lambda: mmpe.Latents(N),
        "cross": lambda: mmpe.Cross(mmpe.Points(torch.randn(N, 3, generator=g)),
                                    mmpe.Points(torch.randn(N, 3, generator=g))),
        "v2pe": lambda: V2PESequence([1000, (300, 330)], delta=0.5),
        "videorope_composite": lambda: VideoRoPEComposite([1000, (10, 90, 110)]),
    }


def _cap_address_space(extra: int) -> None:
    import resource

    with open("/proc/self/status", encoding="ascii") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, hard))


def test_every_coordinate_type_builds_at_100k_in_linear_memory() -> None:
    if run_in_fresh_process(__file__, "test_every_coordinate_type_builds_at_100k_in_linear_memory"):
        return
    from mmpe.coords.base import coordinate_types

    builders = _builders()
    shipped = set(coordinate_types()) - PAIRWISE_INPUT
    assert shipped <= set(builders), f"coordinate types without a 100k build: {shipped - set(builders)}"
    _cap_address_space(3 << 30)
    for kind in sorted(shipped):
        builders[kind]()
