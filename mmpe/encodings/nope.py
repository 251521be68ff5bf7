"""NoPE: no positional encoding (Kazemnejad et al. 2023)."""

from __future__ import annotations

from torch import Tensor

from mmpe.encodings.base import AttentionCall, KernelEncoding
from mmpe.registry import register


@register(
    "nope", hook="kernel", needs=(),
    learnable=False, family="none",
    paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length "
          "Generalization in Transformers (NeurIPS)",
)
class NoPE(KernelEncoding):
    """No position information at all: plain softmax attention, the empty choice.

    A causal decoder still infers position from its mask (Kazemnejad et al. 2023 show NoPE
    decoders length-generalise better than several explicit PEs); a bidirectional encoder
    without a PE is permutation-equivariant. The attention module treats this kernel as
    standard softmax and may use fused attention.
    """

    is_softmax = True

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionCall) -> Tensor:
        """`softmax(scores) @ v`: `[b, n_h, n_q, n_k]` × `[b, n_h, n_k, h_d]`."""
        return scores.softmax(dim=-1) @ v
