"""The HF bridge's eager path (`route="math"`, kernels, value-side terms) is mmpe's math route.

Its numbers equal the sdpa route's for additive encodings under padding and causality, its
weights are probabilities over the keys each query may see, dropout is HF's, and a padding
query that sees no key stays finite.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from mmpe.integrations.transformers import apply_score_encodings  # noqa: E402

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()


def llama(seed=0, **kw):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=0, **kw)
    return LlamaForCausalLM(config).eval()


def prepared(ref, name, route="auto"):
    model = apply_score_encodings(copy.deepcopy(ref), name, route=route)
    torch.manual_seed(1)
    with torch.no_grad():  # T5's table starts at 0: give the terms values that show
        for p in model.mmpe_encodings.parameters():
            p.normal_()
    return model


IDS = torch.tensor([[5, 7, 9, 11, 13, 15, 17, 19], [0, 0, 0, 21, 22, 23, 24, 25]])
MASK = torch.tensor([[1] * 8, [0, 0, 0] + [1] * 5])  # left padding


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_eager_path_equals_sdpa_path_and_gives_probabilities(name):
    ref = llama()
    fast = prepared(ref, name)
    eager = prepared(ref, name, route="math")
    eager.load_state_dict(fast.state_dict())
    with torch.no_grad():
        a = fast(IDS, attention_mask=MASK).logits
        b = eager(IDS, attention_mask=MASK, output_attentions=True)
    real = MASK.bool()
    torch.testing.assert_close(b.logits[real], a[real], rtol=1e-5, atol=1e-5)
    assert len(b.attentions) == 2
    n = IDS.shape[1]
    sees = torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, :]  # [b, q, k]
    for weights in b.attentions:
        assert weights.shape == (2, 4, n, n)
        assert torch.isfinite(weights).all()  # padding queries too: uniform, as HF's eager
        torch.testing.assert_close(weights[1, :, :3], torch.full((4, 3, n), 1 / n))
        w = weights.permute(0, 2, 1, 3)[real]  # real queries: [tokens, heads, keys]
        s = sees[real][:, None, :].expand_as(w)
        assert w[~s].abs().max() == 0  # no weight on padding or future keys
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))


def test_eager_padded_batch_equals_the_prompt_alone():
    model = prepared(llama(), "t5", route="math")
    with torch.no_grad():
        batched = model(IDS, attention_mask=MASK).logits
        alone = model(IDS[1:, 3:]).logits
    torch.testing.assert_close(batched[1, 3:], alone[0], rtol=1e-5, atol=1e-5)


def test_eager_dropout_is_hf_dropout():
    """`attention_dropout` drops weights in training only; at 0 a training forward is the
    evaluation forward, draw for draw."""
    ref = llama(attention_dropout=0.0)
    model = prepared(ref, "alibi", route="math")
    with torch.no_grad():
        evaluated = model(IDS, attention_mask=MASK).logits
        model.train()
        trained = [model(IDS, attention_mask=MASK).logits for _ in range(2)]
    assert torch.equal(trained[0], trained[1])
    torch.testing.assert_close(trained[0], evaluated)

    dropped = prepared(llama(attention_dropout=0.5), "alibi", route="math")
    dropped.load_state_dict(model.state_dict())
    with torch.no_grad():
        dropped.train()
        torch.manual_seed(0)
        first = dropped(IDS, attention_mask=MASK).logits
        torch.manual_seed(0)
        again = dropped(IDS, attention_mask=MASK).logits
        torch.manual_seed(1)
        other = dropped(IDS, attention_mask=MASK).logits
        dropped.eval()
        off = dropped(IDS, attention_mask=MASK).logits
    assert torch.equal(first, again) and not torch.allclose(first, other)
    torch.testing.assert_close(off, evaluated)


def test_bidirectional_eager_path_equals_sdpa_path_with_right_padding():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, pad_token_id=0,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = BertModel(config).eval()
    fast = prepared(ref, "alibi")
    eager = prepared(ref, "alibi", route="math")
    eager.load_state_dict(fast.state_dict())
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    with torch.no_grad():
        a = fast(IDS.flip(-1), attention_mask=mask).last_hidden_state
        b = eager(IDS.flip(-1), attention_mask=mask).last_hidden_state
    assert torch.isfinite(b).all()
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the name transformers 5.13 still has
def test_layers_share_content_free_biases_without_gradients_only(monkeypatch):
    """The door's per-forward memo: one T5 bias for both layers of a forward without
    gradients (generation); with gradients one per layer, which HF's non-reentrant gradient
    checkpointing needs (its recomputed layer must compute what the forward computed)."""
    import mmpe.attention.forms as forms

    computed = []
    real = forms._dense
    monkeypatch.setattr(forms, "_dense", lambda enc, ctx: computed.append(1) or real(enc, ctx))
    model = prepared(llama(), "t5")
    with torch.no_grad():
        model(IDS, attention_mask=MASK)
    assert len(computed) == 1
    computed.clear()
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model(IDS, attention_mask=MASK, labels=IDS).loss.backward()
    assert len(computed) == 2 * 2  # each layer, and again in its recomputation
    assert model.mmpe_encodings[0].table.grad.abs().sum() > 0


@pytest.mark.parametrize("route", ["auto", "math"])
def test_one_check_per_attention_call(monkeypatch, route):
    """The bridge checks each term's context once per call, as mmpe's layers do; the paths
    after it (the dense bias's sum, run_math's score mods) trust the checked context."""
    model = prepared(llama(), "t5", route=route)
    enc = model.mmpe_encodings[0]
    checks = []
    real = type(enc).check_call
    monkeypatch.setattr(type(enc), "check_call", lambda self, ctx: checks.append(1) or real(self, ctx))
    with torch.no_grad():
        model(IDS, attention_mask=MASK)
    assert len(checks) == 2  # two layers, one call each
