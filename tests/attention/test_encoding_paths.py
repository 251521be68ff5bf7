"""`mmpe.testing.assert_encoding_paths`, the plugin author's check, on every registered class
with a hand-written fast form or a structure narrower than a pair (rows drawn from
`mmpe.attention.fast_forms.FAST_FORMS` and the registry, not a hand list), on a distance bias
written only against the plugin protocol, and its control: a fast form off by a little fails.
"""

from __future__ import annotations

import pytest
import torch
from helpers import structured_score_cases
from torch import nn

import mmpe
from mmpe.attention import fast_forms
from mmpe.coords.capabilities import Metric
from mmpe.encodings.base import ScoreEncoding
from mmpe.registry import available
from mmpe.testing import TOLERANCES, assert_encoding_paths

CONTEXT = {"num_heads": 2, "head_dim": 12, "d_model": 24, "grid_shape": (3, 4)}
OPTIONS = {"fire": {"init_L": 2.0, "init_c": 0.5},
           "gaussian_distance": {"num_kernels": 8, "mlp_width": 8}}


def _coords():
    gen = torch.Generator().manual_seed(0)
    chain = torch.arange(9)
    return {
        "sequence": mmpe.Sequence(10, causal=True),
        "grid": mmpe.Grid((3, 4), prefix_tokens=1),
        "points": mmpe.Points(torch.rand(2, 11, 3, generator=gen) * 4),
        "graph": mmpe.Graph(torch.stack((chain, chain + 1)), num_nodes=10,
                            edge_attr=(chain % 3)[:, None]),
    }


CASES = structured_score_cases(CONTEXT, OPTIONS, _coords())


def test_the_cases_cover_every_registered_fast_form() -> None:
    covered = {type(mmpe.build(n, context=CONTEXT, **OPTIONS.get(n, {}))) for n, _ in CASES}
    registered = {e.cls for e in available()}
    assert {c for c in fast_forms.FAST_FORMS if c in registered} <= covered


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_every_path_equals_the_math_path(name: str, kind: str) -> None:
    torch.manual_seed(0)
    enc = mmpe.build(name, context=CONTEXT, **OPTIONS.get(name, {}))
    checked = assert_encoding_paths(enc, _coords()[kind], block_bytes=2048)
    assert "auto" in checked and any(p.startswith("sdpa:") for p in checked)


class QuadraticDistance(ScoreEncoding):
    """`score − w_h · d²`: a new distance bias written only against the plugin protocol."""

    needs = (Metric,)
    structure = "distance"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.linspace(0.05, 0.5, num_heads))

    def distance_term(self, ctx):
        weight = self.weight

        def term(dist, h):
            return -weight[h] * dist * dist

        return term


@pytest.mark.parametrize("kind", ["sequence", "grid", "points", "graph"])
def test_a_new_distance_bias_runs_on_every_path(kind: str) -> None:
    checked = assert_encoding_paths(QuadraticDistance(2), _coords()[kind], block_bytes=2048)
    plans = {"sequence": "sdpa:relation", "grid": "sdpa:grid", "points": "sdpa:tiles",
             "graph": "sdpa:tiles"}
    assert plans[kind] in checked and "sdpa:dense" in checked and "dense" in checked


def test_a_wrong_fast_form_fails_the_check(monkeypatch) -> None:
    # The control: ALiBi's rows off by 1 % fail the check, naming the path.
    from mmpe.encodings.alibi import ALiBi

    real = fast_forms.FAST_FORMS[ALiBi]["rows"]
    monkeypatch.setitem(fast_forms.FAST_FORMS[ALiBi], "rows",
                        lambda *args: real(*args) * 1.01)
    with pytest.raises(AssertionError, match="differs from the math route"):
        assert_encoding_paths(mmpe.build("alibi", num_heads=2), _coords()["points"],
                              block_bytes=2048)


def test_tolerances_cover_both_float_dtypes() -> None:
    assert set(TOLERANCES) == {torch.float32, torch.float64}
    for dtype, tol in TOLERANCES.items():
        assert set(tol) == {"output", "gradient"}, dtype
