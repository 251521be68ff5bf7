"""Grid and Composite coordinates: positions, offsets, prefix tokens, reshape, 1D methods on grids."""

from __future__ import annotations

import math

import pytest
import torch

import mmpe
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.coords import Composite, Grid, index_grid
from mmpe.encodings.base import AttentionCall


def test_positions_row_major_with_prefix():
    g = Grid((2, 3), prefix_tokens=2, scale=(2.0, 0.5))
    assert g.num_tokens == g.num_queries == g.num_keys == 8
    pos = g.query_positions
    assert pos.shape == (8, 2) and pos.dtype == torch.float32
    assert pos[:2].abs().sum() == 0  # prefix tokens sit at 0
    expected = torch.tensor([[i * 2.0, j * 0.5] for i in range(2) for j in range(3)])
    torch.testing.assert_close(pos[2:], expected)
    torch.testing.assert_close(g.grid_positions, expected)
    assert g.grid_index.tolist() == [[i, j] for i in range(2) for j in range(3)]
    assert g.prefix_mask.tolist() == [True, True] + [False] * 6
    idx = torch.arange(8)
    assert g.cell_index(idx, 1).tolist() == [0, 0, 0, 1, 2, 0, 1, 2]
    assert g.axes == ("h", "w") and Grid((2, 2, 2)).axes == ("t", "h", "w")


def test_offsets_distance_extent_closed_form():
    g = Grid((3, 4, 5), prefix_tokens=1, scale=(2.0, 1.0, 1.0))
    n = g.num_tokens
    q, k = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    pos = g.query_positions
    diff = pos[:, None, :] - pos[None, :, :]
    diff[0, :] = 0
    diff[:, 0] = 0
    for a, name in enumerate(g.axes):
        torch.testing.assert_close(g.offset(q, k, a), diff[..., a])
        torch.testing.assert_close(g.offset(q, k, name), diff[..., a])
    torch.testing.assert_close(g.offsets(q, k), diff)
    dist = g.distance(q, k)
    torch.testing.assert_close(dist, diff.norm(dim=-1))
    assert dist[0].abs().sum() == 0 and dist[:, 0].abs().sum() == 0
    assert not hasattr(g, "relation")  # a grid has no single direction: not Directed
    # anti-symmetric offsets, symmetric distances
    torch.testing.assert_close(g.offset(q, k, 0), -g.offset(k, q, 0))
    diag = math.sqrt((2 * 2.0) ** 2 + 3**2 + 4**2)
    assert g.diagonal == pytest.approx(diag)
    assert torch.allclose(g.extent(q), torch.full((n, 1), diag))
    # cell (2,3,4) to cell (0,0,0) is the diagonal
    assert g.distance(torch.tensor(n - 1), torch.tensor(1)).item() == pytest.approx(diag)
    assert Grid((2, 2), prefix_tokens=1, prefix_distance=3.0).distance(
        torch.tensor(0), torch.tensor(3)).item() == 3.0


def test_with_shape_and_from_image():
    g = Grid.from_image(224, 160, 16, prefix_tokens=1, scale=(1.0, 2.0))
    assert g.shape == (14, 10) and g.num_tokens == 141
    h = g.with_shape((28, 20))
    assert h.shape == (28, 20) and h.prefix_tokens == 1 and h.scale == (1.0, 2.0)
    assert h.num_tokens == 561 and g.shape == (14, 10)
    assert Grid.from_image(32, 48, (8, 16)).shape == (4, 3)
    with pytest.raises(ValueError, match="not divisible by patch size 16x16"):
        Grid.from_image(225, 224, 16)
    with pytest.raises(ValueError, match="3 axes"):
        Grid((2, 2, 2)).with_shape((4, 4))


@pytest.mark.parametrize("kwargs,match", [
    ({"shape": ()}, "shape"), ({"shape": (2, 0)}, "shape"), ({"shape": (2, 1.5)}, "shape"),
    ({"shape": (2, 2), "prefix_tokens": -1}, "prefix_tokens"),
    ({"shape": (2, 2), "scale": (1.0,)}, "scale"), ({"shape": (2, 2), "scale": (1.0, 0.0)}, "scale"),
    ({"shape": (2, 2), "axes": ("x", "x")}, "axes"),
])
def test_bad_grid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Grid(**kwargs)


def test_check_tokens():
    g = Grid((4, 4), prefix_tokens=1)
    g.check_tokens(torch.zeros(2, 17, 8))
    g.check_tokens(17)
    with pytest.raises(ValueError, match="16 tokens but the grid"):
        g.check_tokens(torch.zeros(2, 16, 8))
    with pytest.raises(ValueError, match="token count"):
        g.check_tokens(torch.zeros(5))


def _bias(enc, coords, heads=4):
    return dense_bias([enc], AttentionCall(coords, heads, 8, 1))


def test_alibi_on_grid_is_slope_times_euclidean():
    g = Grid((3, 4), prefix_tokens=1)
    enc = mmpe.build("alibi", num_heads=4)
    bias = _bias(enc, g)
    _, _, q, k = index_grid(1, 1, g.num_tokens, g.num_tokens)
    dist = g.distance(q, k)[0, 0]
    torch.testing.assert_close(bias[0], -enc.slopes.view(4, 1, 1) * dist)
    assert bias[0, :, 0].abs().sum() == 0  # prefix token: zero bias


def test_t5_and_fire_on_grid():
    g = Grid((4, 4))
    t5 = mmpe.build("t5", num_heads=4, num_buckets=8, max_distance=8)
    with torch.no_grad():
        t5.table.copy_(torch.arange(32.0).view(8, 4))
    bias = _bias(t5, g)
    # Unidirectional buckets of the rounded Euclidean distance: exact below num_buckets/2.
    d = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 2.0], [2.0, 2.0], [3.0, 3.0]])
    dist = d.norm(dim=-1).round().long()  # 0, 1, 1, 2, 3, 4
    q = 0
    for (i, j), r in zip(d.long().tolist(), dist.tolist(), strict=True):
        kidx = i * 4 + j
        exact = r if r < 4 else None
        if exact is not None:
            torch.testing.assert_close(bias[0, :, q, kidx], t5.table[exact])
    fire = mmpe.build("fire", num_heads=4, init_L=1.0)
    b = _bias(fire, g)
    assert b.shape == (1, 4, 16, 16) and torch.isfinite(b).all()
    # FIRE's input is psi(dist)/psi(diagonal): pairs at the diagonal get x = 1 exactly
    ctx = AttentionCall(g, 4, 8, 1)
    x = fire.normalised_distance(ctx, torch.tensor(0), torch.tensor(15), torch.tensor(0))
    assert x.item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_1d_methods_run_in_attention_on_grid(name):
    g = Grid((2, 3, 3), prefix_tokens=1)
    enc = mmpe.build(name, num_heads=2)
    attn = MultiHeadAttention(16, 2, [enc], route="sdpa")
    ref = MultiHeadAttention(16, 2, [enc], route="math")
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, g.num_tokens, 16)
    torch.testing.assert_close(attn(x, g), ref(x, g), atol=1e-5, rtol=1e-4)


def test_grid_indices_work_with_flex_attention():
    import warnings
    warnings.filterwarnings("ignore", message="flex_attention called without")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    g = Grid((3, 3), prefix_tokens=1)
    enc = mmpe.build("alibi", num_heads=2)
    q, k, v = torch.randn(3, 1, 2, g.num_tokens, 8).unbind(0)
    ctx = AttentionCall(g, 2, 8, 1, q=q, k=k, v=v)
    out = flex.flex_attention(q, k, v, score_mod=enc.score_mod(ctx))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias([enc], ctx))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_composite_matches_qwen2vl_rope_index():
    c = Composite([2, (2, 3), 1, (2, 2, 2), 2])
    ids = c.position_ids
    assert ids.shape == (3, 2 + 6 + 1 + 8 + 2)
    # Qwen2-VL get_rope_index by hand: text 0,1; image at start 2; text after max+1 ...
    text0 = [[0, 1]] * 3
    img = [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    text1 = [[5]] * 3
    vid = [[6, 6, 6, 6, 7, 7, 7, 7], [6, 6, 7, 7, 6, 6, 7, 7], [6, 7, 6, 7, 6, 7, 6, 7]]
    text2 = [[8, 9]] * 3
    expected = torch.tensor([sum(rows, []) for rows in zip(text0, img, text1, vid, text2, strict=True)])
    assert ids.tolist() == expected.tolist()
    assert c.is_vision.sum() == 14 and c.segment_ids.max() == 4
    assert c.relation(torch.tensor(18), torch.tensor(0)).item() == 9
    assert c.relation(torch.tensor(9), torch.tensor(8)).item() == 1
    assert Composite([2, Grid((1, 2))], causal=True).dense_mask()[0, 0].tolist() == [
        [True, False, False, False], [True, True, False, False],
        [True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="segment 1"):
        Composite([2, (2, 0)])
    with pytest.raises(ValueError, match="prefix tokens"):
        Composite([Grid((2, 2), prefix_tokens=1)])


@pytest.mark.parametrize("metric,reduce", [("manhattan", lambda d: d.abs().sum(-1)),
                                           ("chebyshev", lambda d: d.abs().amax(-1))])
def test_per_axis_metrics(metric, reduce):
    g = Grid((3, 4), prefix_tokens=1, scale=(2.0, 1.0), metric=metric)
    q, k = torch.arange(13).view(-1, 1), torch.arange(13).view(1, -1)
    torch.testing.assert_close(g.distance(q, k), reduce(g.offsets(q, k)))
    assert g.diagonal == reduce(torch.tensor([4.0, 3.0])).item()
    assert g.with_shape((5, 5)).metric == metric
    bias = dense_bias([mmpe.build("alibi", num_heads=2)], AttentionCall(g, 2, 8, 1))
    torch.testing.assert_close(bias[0, 0], -0.0625 * reduce(g.offsets(q, k)))
    with pytest.raises(ValueError, match="metric"):
        Grid((2, 2), metric="cosine")
