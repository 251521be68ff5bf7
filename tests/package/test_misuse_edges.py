"""Misuse that used to pass silently or crash deep inside: each gets a clear error (or, for a
legitimate use, works)."""

import pytest
import torch
from test_bad_input import CATEGORIES

import mmpe

#: each test's category (the categories of tests/package/test_bad_input.py), counted by
#: tests/bad_input_counts.py; a test with several checks takes its main one's
CATEGORY = {
    "test_alibi_slopes_from_a_list_and_bad_slopes": "range",
    "test_hf_rope_dicts_that_would_be_misread": "dtype",
    "test_one_cache_per_model_and_one_mask_per_cache": "api-misuse",
    "test_generate_refuses_an_example_without_tokens": "api-misuse",
    "test_rope_mixed_on_a_sequence_says_how_to_build_it": "unsupported-combination",
    "test_non_hf_module_and_nan_laplacian_pe_are_named": "api-misuse",
    "test_a_str_cache_and_tokens_beyond_the_vocabulary_are_named": "api-misuse",
}


def test_alibi_slopes_from_a_list_and_bad_slopes():
    enc = mmpe.build("alibi", num_heads=2, slopes=[0.5, 0.25])
    torch.testing.assert_close(enc.slopes, torch.tensor([0.5, 0.25]))
    with pytest.raises(ValueError, match=r"slopes must be \[num_heads=2\]"):
        mmpe.build("alibi", num_heads=2, slopes=[0.5])
    with pytest.raises(ValueError, match="slopes must be finite"):
        mmpe.build("alibi", num_heads=2, slopes=[0.5, float("nan")])
    with pytest.raises(ValueError, match="numbers"):
        mmpe.build("alibi", num_heads=2, slopes=["a", "b"])


def test_hf_rope_dicts_that_would_be_misread():
    tr = pytest.importorskip("transformers")  # noqa: F841
    from mmpe.integrations.transformers import from_hf_rope

    base = dict(head_dim=16, hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                rope_theta=10000.0)
    with pytest.raises(ValueError, match="factor must be a finite number, got '4'"):
        from_hf_rope({**base, "rope_scaling": {"rope_type": "linear", "factor": "4"}})
    with pytest.raises(ValueError, match=r"partial_rotary_factor must lie in \(0, 1\]"):
        from_hf_rope({**base, "partial_rotary_factor": 0.0})
    with pytest.raises(ValueError, match="mrope_section"):
        from_hf_rope({**base, "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]}})
    assert from_hf_rope({**base, "partial_rotary_factor": 0.5}).rotary_dim == 8


def test_one_cache_per_model_and_one_mask_per_cache():
    m1, m2 = mmpe.Transformer(32, 4, 2, ["rope"]), mmpe.Transformer(32, 4, 2, ["rope"])
    cache = m1.make_cache()
    m1(torch.randn(1, 3, 32), mmpe.Sequence(3, causal=True), cache=cache)
    with pytest.raises(ValueError, match="another attention layer"):
        m2(torch.randn(1, 1, 32), mmpe.Sequence(1, offset=3, causal=True), cache=cache)
    with pytest.raises(ValueError, match="bidirectional step after causal"):
        m1(torch.randn(1, 1, 32), mmpe.Sequence(1, offset=3, causal=False), cache=cache)
    m1(torch.randn(1, 1, 32), mmpe.Sequence(1, offset=3, causal=True), cache=cache)  # legitimate
    cache.reset()
    m2(torch.randn(1, 2, 32), mmpe.Sequence(2, causal=True), cache=cache)  # reset: a new owner


def test_generate_refuses_an_example_without_tokens():
    lm = mmpe.CausalLM(vocab_size=20, d_model=32, num_heads=4, depth=2, encodings=["rope"])
    mask = torch.tensor([[True] * 3, [False] * 3])
    with pytest.raises(ValueError, match=r"no real token in example\(s\) \[1\]"):
        mmpe.generate(lm, torch.tensor([[1, 2, 3], [4, 5, 6]]), 3, padding_mask=mask)


def test_rope_mixed_on_a_sequence_says_how_to_build_it():
    """`available(coords=Sequence)` lists rope_mixed; a model built without the axis count
    (default 2) must say how to build it for one axis, and that build must run."""
    assert "rope_mixed" in [e.name for e in mmpe.available(coords=mmpe.Sequence(6))]
    with pytest.raises(ValueError, match=r"context=\{'num_axes': 1\}"):
        mmpe.Transformer(48, 2, 1, ["rope_mixed"])(torch.randn(1, 6, 48), mmpe.Sequence(6))
    model = mmpe.Transformer(48, 2, 1, ["rope_mixed"], context={"num_axes": 1})
    assert model(torch.randn(1, 6, 48), mmpe.Sequence(6)).shape == (1, 6, 48)


def test_non_hf_module_and_nan_laplacian_pe_are_named():
    pytest.importorskip("transformers")
    from mmpe.integrations.transformers import apply_score_encodings

    with pytest.raises(TypeError, match="must be an HF transformers model.*Linear"):
        apply_score_encodings(torch.nn.Linear(3, 3), "alibi")
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    pe = torch.randn(3, 2)
    pe[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"laplacian_pe has NaN or inf entries \(nodes \[1\]"):
        mmpe.Graph(edges, num_nodes=3, laplacian_pe=pe)


def test_a_str_cache_and_tokens_beyond_the_vocabulary_are_named():
    """Found by the bad-input probe: a str passed as cache was measured with len() ("cache
    has 5 layers"), and a token id past the vocabulary ended in nn.Embedding's IndexError."""
    model = mmpe.Transformer(32, 4, 2, ["rope"])
    with pytest.raises(TypeError, match="cache must be the ModelCache of model.make_cache"):
        model(torch.randn(1, 3, 32), mmpe.Sequence(3, causal=True), cache="cache")
    lm = mmpe.CausalLM(vocab_size=20, d_model=32, num_heads=4, depth=1, encodings=["rope"])
    with pytest.raises(ValueError, match=r"ids in \[0, vocab_size=20\), got ids in \[-1, 25\]"):
        lm(torch.tensor([[1, 25, -1]]))
    with pytest.raises(ValueError, match="vocab_size=20"):
        mmpe.generate(lm, torch.tensor([[1, 20]]), 2)
    assert lm(torch.tensor([[0, 19]])).shape == (1, 2, 20)  # both ends of the range are ids


def test_every_misuse_case_is_classified():
    tests = sorted(n for n in globals()
                   if n.startswith("test_") and n != "test_every_misuse_case_is_classified")
    assert sorted(CATEGORY) == tests
    assert set(CATEGORY.values()) <= set(CATEGORIES)
