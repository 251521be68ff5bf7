import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.attention import dense_bias
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.t5 import t5_bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (8, 20)])
def test_buckets_match_hf_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-600, 600)[None, :] - torch.arange(0, 1)[:, None]
    ref = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(t5_bucket(rel, bidirectional, num_buckets, max_distance), ref)


def test_published_bucket_values():
    # 32 buckets, bidirectional: 0..7 exact, log-spaced up to 128, keys after query +16.
    rel = torch.tensor([0, -1, -7, -8, -12, -127, -128, -1000, 1, 8, 1000])
    assert t5_bucket(rel).tolist() == [0, 1, 7, 8, 9, 15, 15, 15, 17, 24, 31]


def test_bias_reads_table_by_bucket_and_is_causal_aware():
    t5 = mmpe.build("t5", num_heads=2)
    with torch.no_grad():
        t5.table.copy_(torch.arange(64.0).view(32, 2))
    causal = dense_bias([t5], AttentionCall(Sequence(5, causal=True), 2, 8, 1))
    # causal: unidirectional buckets of the distance, 32 of them
    assert causal[0, 1, 4, 0].item() == t5.table[4, 1].item()
    bi = dense_bias([t5], AttentionCall(Sequence(5), 2, 8, 1))
    assert bi[0, 0, 0, 3].item() == t5.table[16 + 3, 0].item()  # key after query
    assert bi[0, 0, 3, 0].item() == t5.table[3, 0].item()


@pytest.mark.parametrize("kwargs, match", [
    ({"num_buckets": 1}, "num_buckets must be >= 2"),
    ({"num_buckets": 7, "bidirectional": True}, "even"),
    ({"max_distance": 4}, "max_distance"),
    ({"distance_unit": -1}, "distance_unit"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mmpe.build("t5", num_heads=2, **kwargs)


@pytest.mark.parametrize("coords", [
    Sequence(40), Sequence(40, causal=True), Sequence(3, offset=37),
    Sequence(position_ids=torch.tensor([[0, 5, 9, 400], [3, 2, 1, 0]])),
    Sequence(position_ids=torch.tensor([0, 10**6, 2 * 10**6])),  # sparse: direct bucketing
])
def test_eager_offset_lookup_equals_score_mod(coords):
    from mmpe.coords.base import index_grid

    t5 = mmpe.build("t5", num_heads=3)
    torch.nn.init.normal_(t5.table)
    ctx = AttentionCall(coords, 3, 8, 1)
    b, h, q, k = index_grid(coords.batch_size or 1, 3, coords.num_queries, coords.num_keys)
    via_mod = t5.score_mod(ctx)(torch.zeros(()), b, h, q, k)
    assert torch.equal(dense_bias([t5], ctx), via_mod.expand_as(dense_bias([t5], ctx)))
