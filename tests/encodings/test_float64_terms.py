"""A float64 module builds its score term in float64: no learned additive term rounds its
parameters or its distances to float32 inside (the float32 floor of `term_dtype` is for bf16
and fp16 modules). Float32 rounding inside a float64 module made a float64 comparison of two
attention paths fail by 2e-4 (test_flex_compile, gaussian_distance); this is the whole class."""

from __future__ import annotations

import pytest
import torch
from helpers import SAMPLE_COORDS, generic_bias, model_context
from torch.func import functional_call

import mmpe
from mmpe.encodings.base import AttentionCall


def _cases() -> list:
    out, seen = [], set()
    for cname, make in SAMPLE_COORDS.items():
        coords = make()
        for entry in mmpe.available(hook="score"):
            if entry.name in seen or not entry.supports(coords):
                continue
            enc = mmpe.build(entry.name, context=model_context(coords))
            learned = [p for p in enc.parameters() if p.requires_grad]
            if enc.additive and enc.content_free and not enc.needs_probs and learned:
                seen.add(entry.name)
                out.append(pytest.param(entry.name, cname, id=f"{entry.name}-{cname}"))
    return out


class _Bias(torch.nn.Module):
    """The term on every pair as a module's forward, for `functional_call`."""

    def __init__(self, enc, att) -> None:
        super().__init__()
        self.enc, self.att = enc, att

    def forward(self) -> torch.Tensor:
        return generic_bias(self.enc, self.att)


def _term(name: str, cname: str):
    coords = SAMPLE_COORDS[cname]()
    torch.manual_seed(0)
    enc = mmpe.build(name, context=model_context(coords)).double()
    with torch.no_grad():  # away from zero-initialised tables, where a term is flat
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ctx = model_context(coords)
    batch = coords.batch_size or 1
    q = torch.randn(batch, ctx["num_heads"], coords.num_queries, ctx["head_dim"],
                    dtype=torch.float64)
    att = AttentionCall(coords, ctx["num_heads"], ctx["head_dim"], batch, None, q, q, q)
    names = [n for n, p in enc.named_parameters() if p.requires_grad]
    params = tuple(dict(enc.named_parameters())[n].detach().requires_grad_() for n in names)
    bias = _Bias(enc, att)

    def term(*values: torch.Tensor) -> torch.Tensor:
        return functional_call(bias, {f"enc.{n}": v for n, v in zip(names, values, strict=True)}, ())

    return term, params


@pytest.mark.parametrize(("name", "cname"), _cases())
def test_a_float64_module_builds_its_term_in_float64(name: str, cname: str) -> None:
    term, params = _term(name, cname)
    out = term(*params)
    assert out.dtype == torch.float64, f"{name}: a float64 module's term is {out.dtype}"
    # Finite differences at 1e-6 see float32 rounding (1e-7 relative) as a wrong gradient.
    assert torch.autograd.gradcheck(term, params, eps=1e-6, atol=1e-6, rtol=1e-4,
                                    fast_mode=True)


def test_the_check_fails_on_a_term_rounded_to_float32() -> None:
    """Control: the same gradcheck fails once the term goes through float32."""
    term, params = _term("t5", "sequence")

    def rounded(*values: torch.Tensor) -> torch.Tensor:
        return term(*values).float().double()

    # (raise_exception=False: a failing fast check would redo the slow one for its message)
    assert not torch.autograd.gradcheck(rounded, params, eps=1e-6, atol=1e-6, rtol=1e-4,
                                        fast_mode=True, raise_exception=False)
