import pytest
import torch

from mmpe import Sequence


def test_positions_offset_and_relation():
    s = Sequence(4, offset=3)
    assert s.num_queries == 4 and s.num_keys == 7
    assert s.query_positions[:, 0].tolist() == [3, 4, 5, 6]
    assert s.key_positions[:, 0].tolist() == list(range(7))
    q, k = torch.arange(4)[:, None], torch.arange(7)[None, :]
    assert torch.equal(s.relation(q, k), (q + 3) - k)
    assert torch.equal(s.distance(q, k), ((q + 3) - k).abs().float())


def test_causal_mask_respects_offset():
    mask = Sequence(2, offset=2, causal=True).dense_mask()[0, 0]
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_documents_restart_positions_and_block_attention():
    docs = torch.tensor([0, 0, 0, 1, 1, 2])
    s = Sequence(document_ids=docs, causal=True)
    assert s.query_positions[:, 0].tolist() == [0, 1, 2, 0, 1, 0]
    mask = s.dense_mask()[0, 0]
    assert not mask[3, 2] and mask[4, 3] and not mask[1, 2]


def test_batched_position_ids():
    ids = torch.tensor([[0, 1, 2], [5, 6, 7]])
    s = Sequence(position_ids=ids)
    assert s.batch_size == 2
    b = torch.tensor([1])
    assert s.relation(torch.tensor([2]), torch.tensor([0]), b).item() == 2
    assert s.query_index(torch.tensor([0]), b).item() == 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"length": -3}, "positive int"),
        ({"length": 0}, "positive int"),
        ({}, "give length"),
        ({"length": 3, "offset": -1}, "offset"),
        ({"position_ids": torch.tensor([0.0, 1.0])}, "integers"),
        ({"length": 3, "position_ids": torch.tensor([0, 1])}, r"\[n_k\] or \[b, n_k\] with n_k=3"),
        ({"position_ids": torch.zeros(1, 2, 3, dtype=torch.long)}, "shape"),
        ({"position_ids": torch.tensor([0, -1])}, ">= 0"),
        ({"length": 2, "offset": 2, "position_ids": torch.tensor([0, 1])}, "n_k=4"),
        ({"length": 2, "padding_mask": torch.ones(2, dtype=torch.long)}, "bool"),
        ({"length": 2, "padding_mask": torch.ones(3, dtype=torch.bool)}, "padding_mask"),
        ({"position_ids": torch.zeros(2, 3, dtype=torch.long),
          "padding_mask": torch.ones(3, 3, dtype=torch.bool)}, "batch size"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sequence(**kwargs)


def test_offset_with_explicit_ids_and_left_padding():
    # Left-padded batch of two prompts (3 and 5 real tokens) plus one cached decoding step.
    pad = torch.tensor([[False, False, True, True, True, True],
                        [True, True, True, True, True, True]])
    s = Sequence(1, offset=5, padding_mask=pad, causal=True)
    assert s.num_queries == 1 and s.num_keys == 6 and s.batch_size == 2
    assert s.key_positions[..., 0].tolist() == [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert s.query_positions[..., 0].tolist() == [[3], [5]]
    mask = s.dense_mask()[:, 0, 0]
    assert mask.tolist() == [[False, False, True, True, True, True], [True] * 6]
    # A padded query still sees itself (a finite row); padded keys stay hidden from real ones.
    full = Sequence(6, padding_mask=pad, causal=True).dense_mask()[0, 0]
    assert full[0, 0] and not full[2:, :2].any()
    assert full[3].tolist() == [False, False, True, True, False, False]
    docs = Sequence(2, offset=2, document_ids=torch.tensor([0, 0, 1, 1]), causal=True)
    assert docs.dense_mask()[0, 0].tolist() == [[False, False, True, False],
                                                [False, False, True, True]]
