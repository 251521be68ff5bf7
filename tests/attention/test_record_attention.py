"""`record_attention` (softmax weights of every attention call) and the stored attention maps
of the trained text models that the gallery draws."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import mmpe
from mmpe.attention import record_attention

STORED = Path(__file__).resolve().parents[2] / "results" / "attention" / "text.npz"


@pytest.mark.parametrize("encoding", ["alibi", "rope", "t5", "sinusoidal"])
def test_one_weight_tensor_per_layer_that_is_the_attention(encoding: str) -> None:
    torch.manual_seed(0)
    model = mmpe.Transformer(32, 2, 3, [encoding], context={"max_len": 64})
    x, coords = torch.randn(2, 12, 32), mmpe.Sequence(12, causal=True)
    plain = model(x, coords)
    with record_attention() as weights:
        recorded = model(x, coords)
    torch.testing.assert_close(recorded, plain, rtol=1e-5, atol=1e-5)
    assert len(weights) == 3
    for w in weights:
        assert w.shape == (2, 2, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 12))
        assert torch.all(w.triu(1) == 0)  # causal: nothing on future keys


def test_the_recorded_weights_are_softmax_of_the_scores() -> None:
    """One layer, no encoding: the weights equal softmax(q kᵀ / √d) from the projections."""
    torch.manual_seed(0)
    mha = mmpe.MultiHeadAttention(16, 2, [])
    x = torch.randn(1, 5, 16)
    with record_attention() as weights:
        mha(x, mmpe.Sequence(5))
    q, k, _ = mha.qkv(x).view(1, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    want = (q @ k.transpose(-1, -2) / math.sqrt(8)).softmax(-1)
    torch.testing.assert_close(weights[0], want, rtol=1e-5, atol=1e-6)


def test_nothing_is_recorded_outside_a_block_and_a_non_softmax_kernel_says_so() -> None:
    mha = mmpe.MultiHeadAttention(16, 2, [mmpe.build("stick_breaking")])
    x, coords = torch.randn(1, 5, 16), mmpe.Sequence(5, causal=True)
    with record_attention() as outer:
        pass
    mha(x, coords)
    assert outer == []
    with pytest.raises(ValueError, match="record_attention: StickBreaking.*no softmax weights"), \
            record_attention():
        mha(x, coords)


def test_the_plot_refuses_maps_that_are_not_layers_by_queries_by_keys() -> None:
    from mmpe.plot.gallery import plot_trained_attention

    with pytest.raises(ValueError, match=r"maps\['rope'\] must be \[layers, n_q, n_k\]"):
        plot_trained_attention({"rope": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="maps is empty"):
        plot_trained_attention({})


def test_entropy_is_zero_for_one_key_and_log_n_for_all() -> None:
    from mmpe.results.attention_maps import entropy

    one_hot = torch.zeros(1, 3, 8)
    one_hot[..., 2] = 1
    uniform = torch.full((1, 3, 8), 1 / 8)
    torch.testing.assert_close(entropy(one_hot), torch.zeros(1))
    torch.testing.assert_close(entropy(uniform), torch.tensor([math.log(8)]))


def test_a_missing_checkpoint_names_the_command(tmp_path: Path) -> None:
    from mmpe.results.attention_maps import checkpoint_of

    with pytest.raises(FileNotFoundError, match="no checkpoint for 'rope' seed 0.*mmpe compare text"):
        checkpoint_of(tmp_path, "rope", 0)


def test_the_stored_maps_are_causal_attention_of_every_main_job_model() -> None:
    data = np.load(STORED)
    meta = json.loads(str(data["meta"]))
    from mmpe.results.attention_maps import MAIN_JOB

    assert list(meta["runs"]) == list(MAIN_JOB)
    n = len(str(data["text"]))
    for name in MAIN_JOB:
        maps = data[name].astype(np.float32)
        assert maps.shape == (3, n, n)
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=2e-2)  # float16 storage
        assert np.all(np.triu(maps, 1) == 0)
        assert len(meta["runs"][name]["heads"]) == 3
