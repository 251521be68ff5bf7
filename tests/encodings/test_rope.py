import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.coords.base import Coordinates
from mmpe.encodings.rope import RoPE


class _At(Sequence):
    """A sequence whose explicit positions start at ``start``."""

    def __init__(self, start: int, n: int):
        super().__init__(position_ids=torch.arange(start, start + n))


def _score(rope: RoPE, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    rq, _ = rope(q, q, _At(m, 1))
    rk, _ = rope(k, k, _At(n, 1))
    return (rq * rk).sum()


def test_scores_depend_only_on_relative_position():
    rope = RoPE(32)
    q, k = torch.randn(1, 1, 1, 32, dtype=torch.float64), torch.randn(1, 1, 1, 32, dtype=torch.float64)
    ref = _score(rope, q, k, 7, 3)
    for m, n in [(4, 0), (104, 100), (5007, 5003)]:
        assert torch.allclose(_score(rope, q, k, m, n), ref, atol=1e-9)
    assert not torch.allclose(_score(rope, q, k, 8, 3), ref, atol=1e-3)


@pytest.mark.parametrize("delta", [10**3, 10**5, 10**6, 10**7])
def test_float32_precision_at_large_offsets(delta):
    """Target of the foundation issue: within 1e-5·|q|·|k| for shifts up to 1e7 (float32)."""
    rope = RoPE(64)
    q, k = torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64)
    base = _score(rope, q, k, 12, 5)
    shifted = _score(rope, q, k, 12 + delta, 5 + delta)
    assert (shifted - base).abs() <= 1e-5 * q.norm() * k.norm()


def test_bfloat16_positions_are_not_rounded():
    rope = RoPE(16)
    q = torch.randn(1, 1, 1, 16)
    a, _ = rope(q.bfloat16(), q.bfloat16(), _At(257, 1))
    b, _ = rope(q.bfloat16(), q.bfloat16(), _At(256, 1))
    ref, _ = rope(q.double(), q.double(), _At(257, 1))
    assert a.dtype == torch.bfloat16
    assert not torch.equal(a, b)
    assert (a.double() - ref).abs().max() < 0.05 * q.abs().max()


def test_matches_hf_llama_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=4)
    hf = LlamaRotaryEmbedding(cfg)
    q, k = torch.randn(2, 4, 50, 32), torch.randn(2, 4, 50, 32)
    pos = torch.arange(50).expand(2, 50)
    cos, sin = hf(q, pos)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    base = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    mq, mk = RoPE(32, base=base)(q, k, Sequence(50))
    assert torch.allclose(mq, hq, atol=1e-5) and torch.allclose(mk, hk, atol=1e-5)


def test_matches_rotary_embedding_torch_interleaved():
    from rotary_embedding_torch import RotaryEmbedding

    ref = RotaryEmbedding(dim=32)
    q = torch.randn(2, 4, 40, 32)
    out_ref = ref.rotate_queries_or_keys(q)
    out, _ = RoPE(32, interleaved=True)(q, q, Sequence(40))
    assert torch.allclose(out, out_ref, atol=1e-5)


def test_partial_rotary_leaves_tail_untouched():
    q = torch.randn(1, 2, 6, 32)
    out, _ = RoPE(32, rotary_dim=16)(q, q, Sequence(6))
    assert torch.equal(out[..., 16:], q[..., 16:])
    assert not torch.allclose(out[..., :16], q[..., :16])


def test_cached_decoding_matches_full_sequence():
    rope = RoPE(16)
    q = torch.randn(1, 2, 10, 16)
    full_q, full_k = rope(q, q, Sequence(10))
    step_q, step_k = rope(q[:, :, 7:], q, Sequence(3, offset=7))
    assert torch.allclose(step_q, full_q[:, :, 7:], atol=1e-6)
    assert torch.allclose(step_k, full_k, atol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="head_dim must be a positive even"):
        mmpe.build("rope", head_dim=15)
    with pytest.raises(ValueError, match="rotary_dim"):
        RoPE(16, rotary_dim=18)
    with pytest.raises(ValueError, match="base"):
        RoPE(16, base=1.0)
    rope = RoPE(16)
    with pytest.raises(ValueError, match=r"\[b, n_h, s, h_d\] \(rank 4\)"):
        rope(torch.randn(2, 5, 16), torch.randn(2, 5, 16), Sequence(5))
    with pytest.raises(ValueError, match="h_d=16"):
        rope(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8), Sequence(5))
    with pytest.raises(TypeError, match="Coordinates"):
        rope(torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16), "sequence")
    assert issubclass(Sequence, Coordinates)


def test_apply_rotary_layouts_agree_and_refuse_bad_input():
    import pytest

    from mmpe.encodings.rope import apply_rotary, rope_cos_sin, rope_inv_freq

    x = torch.randn(2, 4, 7, 16)  # [b, n_h, s, h_d]
    cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(16))
    ref = apply_rotary(x, cos, sin)
    out = apply_rotary(x.transpose(1, 2), cos, sin, layout="bshd").transpose(1, 2)
    torch.testing.assert_close(out, ref)
    bcos, bsin = rope_cos_sin(torch.arange(7).expand(2, 7), rope_inv_freq(16))
    torch.testing.assert_close(apply_rotary(x.transpose(1, 2), bcos, bsin, layout="bshd")
                               .transpose(1, 2), ref)
    with pytest.raises(ValueError, match="layout"):
        apply_rotary(x, cos, sin, layout="sbhd")
    with pytest.raises(ValueError, match="rank 4"):
        apply_rotary(x[0], cos, sin)
