"""M-RoPE: multimodal rotary position embedding with a temporal/height/width section split (Qwen2-VL)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._positions import check_qk, newest_key_positions
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import apply_rotary, rope_inv_freq
from mmpe.registry import register


def default_mrope_section(head_dim: int) -> tuple[int, int, int]:
    """Qwen2-VL's split of the `h_d/2` frequencies: `(16, 24, 24)` at `h_d = 128`.

    Height and width get `3/8` of the pairs each (rounded down), time the rest.
    """
    half = head_dim // 2
    hw = (3 * half) // 8
    return (half - 2 * hw, hw, hw)


@register(
    "mrope", hook="rotary", needs=(Positioned,), learnable=False,
    family="rotary", aliases=("m_rope", "qwen2vl_rope"),
    paper="Wang et al. 2024, Qwen2-VL: Enhancing Vision-Language Model's Perception of the World "
          "at Any Resolution (arXiv:2409.12191), §2.1 Multimodal Rotary Position Embedding", context=("head_dim",))
class MRoPE(SavesSettings, RotaryEncoding):
    """Rotary embedding whose frequency bands are split into temporal, height and width sections.

    The `h_d/2` RoPE frequencies `θ_j = base^(−2j/h_d)` are cut into consecutive sections
    `(s_t, s_h, s_w)`; pair `j` of section `c` rotates by `p_c · θ_j` where `(p_t,
    p_h, p_w)` is the token's 3-component position id. Pairs are `(j, j + h_d/2)` (HF
    transformers' `rotate_half` layout). On [`Composite`][mmpe.coords.composite.Composite] coordinates the
    ids are Qwen2-VL's (text tokens `(p, p, p)` — plain 1D RoPE; vision patches
    `(s + t, s + h, s + w)`); on a 2D grid `(0, h, w)`, on a 3D grid `(t, h, w)`, on a
    sequence `(p, p, p)`. Grid positions must be whole numbers (integer scale).

    Args:
        head_dim: `h_d` (even).
        mrope_section: pairs per section `(s_t, s_h, s_w)` summing to `h_d/2`; default
            [`default_mrope_section`][mmpe.encodings.mrope.default_mrope_section] (`(16, 24, 24)` for `h_d = 128`, as Qwen2-VL).
        base: frequency base (Qwen2-VL uses `rope_theta = 1e6`; default 10000).

    Raises:
        ValueError: odd `head_dim`, a section that does not sum to `h_d/2` or has negative
            entries, grids of more than 3 axes.
    """

    saved_settings = ("mrope_section", "base")

    def __init__(self, head_dim: int, mrope_section: tuple[int, int, int] | None = None,
                 base: float = 10000.0) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"mrope: head_dim must be a positive even int, got {head_dim}")
        section = tuple(mrope_section) if mrope_section is not None else default_mrope_section(head_dim)
        if len(section) != 3 or any(s < 0 for s in section) or sum(section) != head_dim // 2:
            raise ValueError(f"mrope: mrope_section must be 3 non-negative ints summing to "
                             f"head_dim/2 = {head_dim // 2}, got {section}")
        if base <= 1:
            raise ValueError(f"mrope: base must be > 1, got {base}")
        self.head_dim, self.mrope_section, self.base = head_dim, section, float(base)
        axis = torch.cat([torch.full((s,), c) for c, s in enumerate(section)])
        self.register_buffer("axis", axis.long(), persistent=False)

    def position_ids(self, coords: Coordinates, keys: bool = False,
                     n_keys: int | None = None) -> Tensor:
        """`[n, 3]` (or `[b, n, 3]`) `(t, h, w)` position ids of the query (or key) tokens.

        Three axes are used as they are (`Composite`); one axis (text) is repeated,
        `(p, p, p)`; two axes (an image `(h, w)`) get `t = 0`.

        Raises:
            ValueError: more than 3 axes.
        """
        pos = newest_key_positions(coords, n_keys) if keys else coords.query_positions
        axes = pos.shape[-1]
        if axes == 1:
            return pos.expand(*pos.shape[:-1], 3)
        if axes > 3:
            raise ValueError(f"mrope: positions of at most 3 axes (t, h, w), got {axes}")
        pad = pos.new_zeros(*pos.shape[:-1], 3 - axes)
        return torch.cat((pad, pos), dim=-1)

    def phase(self, coords: Coordinates, keys: bool = False, n_keys: int | None = None) -> Tensor:
        """`[n, h_d/2]` (or `[b, n, h_d/2]`) rotation angles (float64, radians)."""
        ids = self.position_ids(coords, keys, n_keys).to(torch.float64)
        inv = rope_inv_freq(self.head_dim, self.base).to(ids.device)
        return ids[..., self.axis.to(ids.device)] * inv

    def _rotate(self, x: Tensor, phase: Tensor) -> Tensor:
        return apply_rotary(x, phase.cos().float(), phase.sin().float(), False)

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("mrope", q, k, self.head_dim, coords)
        return (self._rotate(q, self.phase(coords)),
                self._rotate(k, self.phase(coords, keys=True, n_keys=k.shape[-2])))
