"""Content-free and gate-derived score encodings (DA-Transformer, FoX, KERPLE) and the
stick-breaking kernel."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_routes_agree

import mmpe
from mmpe import MultiHeadAttention, Sequence, Transformer
from mmpe.attention import dense_bias
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.stick_breaking import stable_softplus

warnings.filterwarnings("ignore")
H, D, N = 2, 8, 7
CTX = {"num_heads": H, "head_dim": D, "d_model": H * D, "max_len": 8}
SCORE = ["da_transformer", "fox", "kerple_log", "kerple_power"]


def context(coords, b=2):
    n = coords.num_keys
    return AttentionCall(coords, H, D, b, torch.randn(b, n, H * D), torch.randn(b, H, n, D),
                            torch.randn(b, H, n, D), torch.randn(b, H, n, D))


def dist(n):
    i = torch.arange(n).float()
    return (i[:, None] - i[None, :]).abs()


def test_kerple_formulas():
    log = mmpe.build("kerple_log", num_heads=H)
    power = mmpe.build("kerple_power", num_heads=H)
    with torch.no_grad():
        log.r1.copy_(torch.tensor([0.5, 2.0]))
        log.r2.copy_(torch.tensor([1.5, 0.1]))
        power.r1.copy_(torch.tensor([0.5, 2.0]))
        power.r2.copy_(torch.tensor([1.5, 3.0]))  # 3 is clamped to the bound 2
    ctx = context(Sequence(N))
    d = dist(N)
    exp_log = torch.stack([-0.5 * torch.log(1 + 1.5 * d), -2.0 * torch.log(1 + 0.1 * d)])
    exp_pow = torch.stack([-0.5 * d ** 1.5, -2.0 * d ** 2])
    assert torch.allclose(dense_bias([log], ctx)[0], exp_log, atol=1e-5)
    assert torch.allclose(dense_bias([power], ctx)[0], exp_pow, atol=1e-4)
    assert dense_bias([log], ctx)[0, 1, 3, 5].item() == pytest.approx(-2.0 * math.log(1.2), rel=1e-5)


def test_da_transformer_rescales_relu_scores():
    enc = mmpe.build("da_transformer", num_heads=H)
    with torch.no_grad():
        enc.w.copy_(torch.tensor([0.3, -0.2]))
        enc.v.copy_(torch.tensor([1.0, -0.5]))
    ctx = context(Sequence(N))
    b, h, q, k = index_grid(1, H, N, N)
    score = torch.randn(2, H, N, N)
    out = enc.score_mod(ctx)(score, b, h, q, k)
    w, v = enc.w.detach()[:, None, None], enc.v.detach()[:, None, None]
    expected = score.relu() * (1 + torch.exp(v)) / (1 + torch.exp(v - w * dist(N)))
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.allclose(out[:, :, 2, 2], score[:, :, 2, 2].relu())  # R̂ = 1 at distance 0
    assert not enc.additive


def test_fox_term_is_the_sum_of_log_forget_gates():
    enc = mmpe.build("fox", context=CTX)
    ctx = context(Sequence(N, causal=True))
    log_f = F.logsigmoid(enc.gate(ctx.x))  # [b, n, h]
    bias = dense_bias([enc], ctx)
    for i, j in ((4, 1), (6, 6), (5, 0)):
        expected = log_f[:, j + 1:i + 1].sum(1)  # Σ_{l=j+1}^{i}
        assert torch.allclose(bias[:, :, i, j], expected, atol=1e-5)


def test_fox_with_all_gates_one_equals_no_encoding():
    torch.manual_seed(1)
    fox = mmpe.build("fox", context=CTX)
    with torch.no_grad():
        fox.gate.weight.zero_()
        fox.gate.bias.fill_(100.0)  # σ(100) = 1: log f = 0
    with_fox, plain = MultiHeadAttention(H * D, H, [fox]), MultiHeadAttention(H * D, H, [])
    plain.load_state_dict(with_fox.state_dict(), strict=False)
    x = torch.randn(2, N, H * D)
    coords = Sequence(N, causal=True)
    assert torch.allclose(with_fox(x, coords), plain(x, coords), atol=1e-6)
    with torch.no_grad():
        fox.gate.bias.fill_(0.0)
    assert not torch.allclose(with_fox(x, coords), plain(x, coords), atol=1e-3)


def test_fox_needs_causal_coordinates_and_uncached_input():
    fox = mmpe.build("fox", context=CTX)
    with pytest.raises(ValueError, match="causal"):
        fox.score_mod(context(Sequence(N)))
    ctx = context(Sequence(3, offset=4, causal=True))
    ctx.x, ctx.q = ctx.x[:, :3], ctx.q[:, :, :3]
    with pytest.raises(ValueError, match="cache"):
        fox.score_mod(ctx)


def direct_stick_breaking(z, attend_current=False):
    """A_ij = σ(z_ij) Π_{j<k<i} (1 − σ(z_ik)), loops over every (i, j)."""
    n = z.shape[-1]
    beta = torch.sigmoid(z.double())
    out = torch.zeros_like(beta)
    for i in range(n):
        last = i if attend_current else i - 1
        for j in range(last + 1):
            prod = beta[..., i, j]
            for k in range(j + 1, last + 1):
                prod = prod * (1 - beta[..., i, k])
            out[..., i, j] = prod
    return out


@pytest.mark.parametrize("attend_current", [False, True])
def test_stick_breaking_matches_direct_product_and_sums_to_at_most_one(attend_current):
    enc = mmpe.build("stick_breaking", attend_current=attend_current)
    coords = Sequence(N, causal=True)
    z = torch.randn(2, H, N, N) * 3
    masked = z.masked_fill(~coords.dense_mask(), float("-inf"))
    a = enc.weights(masked, context(coords))
    assert torch.allclose(a.double(), direct_stick_breaking(z, attend_current), atol=1e-6)
    sums = a.sum(-1)
    assert (sums <= 1 + 1e-6).all() and (a >= 0).all()
    if not attend_current:
        assert torch.equal(sums[..., 0], torch.zeros_like(sums[..., 0]))  # nothing before token 0
    ctx = context(coords)
    assert torch.allclose(enc.attend(masked, ctx.v, ctx), a @ ctx.v, atol=1e-6)


def test_stick_breaking_is_stable_for_large_logits():
    x = torch.tensor([-float("inf"), -30.0, 0.0, 14.9, 15.1, 80.0, 1e4], requires_grad=True)
    sp = stable_softplus(x)
    assert torch.allclose(sp[1:], F.softplus(x[1:].detach()), rtol=1e-6)
    assert sp[0] == 0 and sp[-1] == 1e4
    sp.sum().backward()
    assert torch.isfinite(x.grad).all()
    enc = mmpe.build("stick_breaking")
    coords = Sequence(5, causal=True)
    z = torch.full((1, 1, 5, 5), 60.0).masked_fill(~coords.dense_mask(), float("-inf"))
    a = enc.weights(z, context(coords, b=1))
    assert torch.isfinite(a).all() and torch.allclose(a[0, 0, 4, 3], torch.tensor(1.0))
    with pytest.raises(ValueError, match="causal"):
        enc.weights(torch.zeros(1, 1, 5, 5), context(Sequence(5), b=1))


@pytest.mark.parametrize("name", SCORE)
def test_flex_sdpa_and_math_paths_agree(name):
    enc = mmpe.build(name, context=CTX)
    mha = MultiHeadAttention(H * D, H, [enc])
    x = torch.randn(2, 6, H * D)
    coords_list = [Sequence(document_ids=torch.tensor([[0] * 4 + [1] * 2, [0] * 5 + [1]]), causal=True)]
    if name != "fox":
        coords_list.append(Sequence(6))
    for coords in coords_list:
        assert_routes_agree(mha, x, coords)


@pytest.mark.parametrize("name", SCORE + ["stick_breaking"])
def test_gradients_reach_every_parameter(name):
    model = Transformer(H * D, H, 2, [name])
    model(torch.randn(2, 10, H * D), Sequence(10, causal=True)).square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


def test_stick_breaking_documents_restart_the_stick():
    enc = mmpe.build("stick_breaking")
    coords = Sequence(document_ids=torch.tensor([[0, 0, 0, 1, 1, 1]]), causal=True)
    z = torch.randn(1, 1, 6, 6).masked_fill(~coords.dense_mask(), float("-inf"))
    a = enc.weights(z, context(coords, b=1))
    assert torch.equal(a[0, 0, 3:, :3], torch.zeros(3, 3))
    assert torch.allclose(a[0, 0, 5, 3:].double(), direct_stick_breaking(z[..., 3:, 3:])[0, 0, 2])


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "da_transformer", "fox"])
def test_bad_head_count(name):
    with pytest.raises(ValueError, match="num_heads"):
        mmpe.build(name, context={**CTX, "num_heads": 0})


def test_distance_methods_read_any_coordinates_distance():
    from mmpe.coords import Grid

    grid = Grid((3, 4))
    log = mmpe.build("kerple_log", num_heads=H)
    ctx = AttentionCall(grid, H, D, 1)
    b, h, q, k = index_grid(1, H, 12, 12)
    d = grid.distance(q, k, b)
    r1, r2 = log.constrained()
    assert torch.allclose(dense_bias([log], ctx), -r1[:, None, None] * torch.log1p(r2[:, None, None] * d), atol=1e-6)
    assert torch.isclose(d[0, 0, 0, 7], torch.tensor(math.hypot(1, 3)))  # cell (0,0) to (1,3)
