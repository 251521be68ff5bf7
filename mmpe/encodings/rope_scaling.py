"""RoPE context-extension methods used by real LLM checkpoints.

Each class is [`mmpe.encodings.rope.RoPE`][mmpe.encodings.rope.RoPE] with other inverse frequencies
([`inv_freq`][mmpe.encodings.rope.RoPE.inv_freq]) and, for YaRN and LongRoPE, an attention scaling
that multiplies `cos` and `sin` (so the logits by its square). Frequencies and scalings
equal those of HF transformers' `modeling_rope_utils.ROPE_INIT_FUNCTIONS` for the same
settings (tested). `original_max_position_embeddings` is the *original* training context (HF's
`original_max_position_embeddings`; `max_position_embeddings` for dynamic NTK). Notation:
`d` = `rotary_dim`, `θ_i = base^(−2i/d)` (radians per token), `s` = `factor`.

The scaling is applied at every length, as in a checkpoint fine-tuned with it (HF semantics);
dynamic NTK and LongRoPE switch on lengths past `original_max_position_embeddings` by themselves.

Every setting that defines the rotations (`factor`, `original_max_position_embeddings`, the
per-method ones, and RoPE's `base`, `rotary_dim`, `interleaved`) is saved in the
state_dict and checked on load (`SavesSettings`): a checkpoint
built for another length or scaling does not load silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._precision import KeepDtype
from mmpe.encodings.rope import RoPE, rope_inv_freq
from mmpe.registry import register
from mmpe.validation import check_finite_float


def _check_factor(name: str, factor: float) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"{name}: factor (the scaling factor s) must be > 0, got {factor!r}")
    return float(factor)


def _check_len(name: str, length: int) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"{name}: original_max_position_embeddings (the training context, "
                         f"tokens) must be an int >= 1, got {length!r}")
    return length


#: RoPE's own settings (rope.py saves none of them itself).
_ROPE_SETTINGS = ("base", "rotary_dim", "interleaved")


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor `0.1·mscale·ln(s) + 1` (1 for `s ≤ 1`)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@register(
    "rope_pi", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("rope_linear", "position_interpolation"),
    paper="Chen, Wong, Chen & Tian 2023, Extending Context Window of Large Language Models via "
          "Positional Interpolation (arXiv:2306.15595), eq. 4", context=("head_dim",))
class RoPEPositionInterpolation(RoPE):
    """Position interpolation: positions divided by `s`, i.e. `θ'_i = θ_i / s` (Chen et al. 2023).

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (> 0; 4 by default).

    Raises:
        ValueError: `factor ≤ 0`, and RoPE's errors (odd rotary dimension …).
    """

    saved_settings = ("factor", *_ROPE_SETTINGS)

    def __init__(self, head_dim: int, factor: float = 4.0, base: float = 10000.0,
                 rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_pi", factor)

    def inv_freq(self, seq_len: int) -> Tensor:
        return rope_inv_freq(self.rotary_dim, self.base) / self.factor


@register(
    "rope_ntk", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("rope_ntk_aware",),
    paper="bloc97 2023, NTK-Aware Scaled RoPE (r/LocalLLaMA); as formalised in Peng et al. "
          "2023, YaRN (arXiv:2309.00071), §3.1 eq. 14", context=("head_dim",))
class RoPENTK(RoPE):
    """NTK-aware scaling: a larger base `b' = b·s^{d/(d−2)}` (bloc97 2023; YaRN §3.1).

    High frequencies are kept (local order stays sharp) while the lowest one is divided by
    exactly `s`, as position interpolation would.

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (> 0; 4 by default).

    Raises:
        ValueError: `factor ≤ 0`, `rotary_dim < 4`, and RoPE's errors.
    """

    saved_settings = ("factor", *_ROPE_SETTINGS)

    def __init__(self, head_dim: int, factor: float = 4.0, base: float = 10000.0,
                 rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_ntk", factor)
        if self.rotary_dim < 4:
            raise ValueError(f"rope_ntk: rotary_dim must be >= 4, got {self.rotary_dim}")

    def inv_freq(self, seq_len: int) -> Tensor:
        d = self.rotary_dim
        return rope_inv_freq(d, self.base * self.factor ** (d / (d - 2)))


@register(
    "rope_dynamic_ntk", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("rope_dynamic",),
    paper="emozilla 2023, Dynamically Scaled RoPE (r/LocalLLaMA); Peng et al. 2023, YaRN "
          "(arXiv:2309.00071), §3.3", context=("head_dim", "original_max_position_embeddings"))
class RoPEDynamicNTK(RoPE):
    """Dynamic NTK: plain RoPE up to `original_max_position_embeddings`, then the NTK base grows with the length.

    For `n = max(seq_len, original_max_position_embeddings)`: `b' = b·(s·n/original_max_position_embeddings − (s − 1))^{d/(d−2)}`
    (HF `_compute_dynamic_ntk_parameters`; `seq_len` = largest key position + 1).

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (> 0; 4 by default).
        original_max_position_embeddings: the training context (tokens).

    Raises:
        ValueError: `factor ≤ 0`, `original_max_position_embeddings < 1`, `rotary_dim < 4`, and RoPE's errors.
    """

    length_dependent = True  # rotations change with the number of tokens
    saved_settings = ("factor", "original_max_position_embeddings", *_ROPE_SETTINGS)

    def __init__(self, head_dim: int, factor: float = 4.0, original_max_position_embeddings: int = 2048,
                 base: float = 10000.0, rotary_dim: int | None = None,
                 interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_dynamic_ntk", factor)
        self.original_max_position_embeddings = _check_len("rope_dynamic_ntk", original_max_position_embeddings)
        if self.rotary_dim < 4:
            raise ValueError(f"rope_dynamic_ntk: rotary_dim must be >= 4, got {self.rotary_dim}")

    def freq_key(self, seq_len: int) -> object:
        return max(seq_len, self.original_max_position_embeddings)

    def inv_freq(self, seq_len: int) -> Tensor:
        d, n = self.rotary_dim, max(seq_len, self.original_max_position_embeddings)
        base = self.base * ((self.factor * n / self.original_max_position_embeddings) - (self.factor - 1)) ** (d / (d - 2))
        return rope_inv_freq(d, base)


@register(
    "rope_yarn", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("yarn",),
    paper="Peng, Quesnelle, Fan & Shippole 2023, YaRN: Efficient Context Window Extension of "
          "Large Language Models (arXiv:2309.00071), §3.2-3.4, eqs. 17-20", context=("head_dim", "original_max_position_embeddings"))
class RoPEYaRN(RoPE):
    """YaRN: "NTK-by-parts" interpolation plus an attention temperature (Peng et al. 2023).

    Per frequency, with `r_i = L/λ_i` rotations over the original context `L`: a ramp
    `γ_i` goes from 0 (dimensions with `r < β` = `beta_slow`: interpolate, `θ_i/s`) to 1
    (`r > α` = `beta_fast`: keep `θ_i`), `θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i` (eq. 18).
    The boundaries are the dimensions `d·ln(L/(2π·r))/(2·ln b)` (floored/ceiled when
    `truncate`), clamped to `[0, d − 1]`. The temperature `√(1/t) = 0.1·ln(s) + 1`
    (eq. 20) multiplies cos and sin (`attention_scaling`); `mscale`/`mscale_all_dim`
    give DeepSeek's ratio form, `attention_factor` overrides it.

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (> 0; 4 by default).
        original_max_position_embeddings: original context `L` (tokens).
        beta_fast, beta_slow: `α = 32`, `β = 1` rotations (the paper's Llama values).
        attention_factor, mscale, mscale_all_dim, truncate: as HF `_compute_yarn_parameters`.

    Raises:
        ValueError: `factor ≤ 0`, `original_max_position_embeddings < 1`, `beta_fast ≤ beta_slow` or
            `beta_slow ≤ 0`, `attention_factor ≤ 0`, and RoPE's errors.
    """

    saved_settings = {"factor": "factor",
                      "original_max_position_embeddings": "original_max_position_embeddings",
                      "beta_fast": "beta_fast", "beta_slow": "beta_slow", "truncate": "truncate",
                      "attention_factor": "attention_scaling",  # from mscale, mscale_all_dim
                      **{name: name for name in _ROPE_SETTINGS}}

    def __init__(self, head_dim: int, factor: float = 4.0, original_max_position_embeddings: int = 2048,
                 base: float = 10000.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: float | None = None, mscale: float | None = None,
                 mscale_all_dim: float | None = None, truncate: bool = True,
                 rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_yarn", factor)
        self.original_max_position_embeddings = _check_len("rope_yarn", original_max_position_embeddings)
        if not 0 < beta_slow < beta_fast:
            raise ValueError(f"rope_yarn: need 0 < beta_slow < beta_fast, got {beta_slow}, {beta_fast}")
        self.beta_fast, self.beta_slow, self.truncate = float(beta_fast), float(beta_slow), truncate
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = yarn_get_mscale(self.factor, mscale) / yarn_get_mscale(self.factor, mscale_all_dim)
            else:
                attention_factor = yarn_get_mscale(self.factor)
        if attention_factor <= 0:
            raise ValueError(f"rope_yarn: attention_factor must be > 0, got {attention_factor}")
        self.attention_scaling = float(attention_factor)

    def correction_range(self) -> tuple[float, float]:
        """Dimension indices where the ramp starts and ends (YaRN eq. 17 inverted)."""
        d, b, L = self.rotary_dim, self.base, self.original_max_position_embeddings

        def dim_of(rotations: float) -> float:
            return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(b))

        low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, d - 1)

    def inv_freq(self, seq_len: int) -> Tensor:
        theta = rope_inv_freq(self.rotary_dim, self.base)
        low, high = self.correction_range()
        if low == high:
            high += 0.001  # as the reference code: avoid a zero-width ramp
        ramp = ((torch.arange(self.rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # γ: 1 keeps θ (fast, high-frequency dims), 0 interpolates
        return theta / self.factor * (1 - keep) + theta * keep


@register(
    "rope_longrope", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("longrope",),
    paper="Ding et al. 2024, LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens "
          "(ICML), §3, eq. 4; the Phi-3 'su/longrope' scaling", context=("head_dim", "original_max_position_embeddings"))
class RoPELongRoPE(KeepDtype, RoPE):
    """LongRoPE: a searched rescale factor per frequency, short and long sets (Ding et al. 2024).

    `θ'_i = θ_i / λ_i` with `λ = short_factor` while `seq_len ≤ original_max_position_embeddings` and
    `long_factor` beyond; cos and sin are multiplied by
    `√(1 + ln(s)/ln(original_max_position_embeddings))` (1 when `s ≤ 1`) or `attention_factor`.

    Without searched factors (the paper finds them by evolutionary search per checkpoint), the
    defaults are `short = 1` and `long = s^{2i/(d−2)}` — the NTK-aware member of the
    search's initial population, rising monotonically from 1 to `s`.

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (> 0; 4 by default).
        original_max_position_embeddings: original context (tokens).
        short_factor, long_factor: `d/2` positive rescale factors each.
        attention_factor: overrides the cos/sin scaling.

    Raises:
        ValueError: `factor ≤ 0`, factor lists of the wrong length or with values ≤ 0,
            and RoPE's errors.
    """

    length_dependent = True  # rotations change with the number of tokens
    keep_dtype = ("short_factor", "long_factor")  # float64 rescale factors in bf16 models too
    saved_settings = {"factor": "factor",
                      "original_max_position_embeddings": "original_max_position_embeddings",
                      "short_factor": "short_factor", "long_factor": "long_factor",
                      "attention_factor": "attention_scaling",
                      **{name: name for name in _ROPE_SETTINGS}}

    def __init__(self, head_dim: int, factor: float = 4.0, original_max_position_embeddings: int = 2048,
                 short_factor: Seq[float] | None = None, long_factor: Seq[float] | None = None,
                 attention_factor: float | None = None, base: float = 10000.0,
                 rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_longrope", factor)
        self.original_max_position_embeddings = _check_len("rope_longrope", original_max_position_embeddings)
        half = self.rotary_dim // 2
        if short_factor is None:
            short_factor = [1.0] * half
        if long_factor is None:
            long_factor = [self.factor ** (2 * i / max(self.rotary_dim - 2, 1)) for i in range(half)]
        for arg, vals in (("short_factor", short_factor), ("long_factor", long_factor)):
            if isinstance(vals, (str, bytes)) or not hasattr(vals, "__len__"):
                raise TypeError(f"rope_longrope: {arg} must be a sequence of floats, got {vals!r}")
            vals = [float(check_finite_float("rope_longrope", arg, v)) for v in vals]
            if len(vals) != half or any(not v > 0 for v in vals):
                raise ValueError(f"rope_longrope: {arg} must hold rotary_dim/2={half} values > 0, "
                                 f"got {len(vals)} values")
        self.register_buffer("short_factor", torch.tensor(list(short_factor), dtype=torch.float64),
                             persistent=False)
        self.register_buffer("long_factor", torch.tensor(list(long_factor), dtype=torch.float64),
                             persistent=False)
        if attention_factor is None and self.factor > 1 and self.original_max_position_embeddings == 1:
            # The default attention factor divides by ln L (HF's formula): undefined at L = 1.
            raise ValueError("rope_longrope: original_max_position_embeddings must be >= 2 for "
                             "the default attention_factor √(1 + ln s / ln L) (ln 1 = 0), got 1; "
                             "or give attention_factor")
        if attention_factor is None:
            attention_factor = (1.0 if self.factor <= 1
                                else math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings)))
        if attention_factor <= 0:
            raise ValueError(f"rope_longrope: attention_factor must be > 0, got {attention_factor}")
        self.attention_scaling = float(attention_factor)

    def freq_key(self, seq_len: int) -> object:
        return seq_len > self.original_max_position_embeddings

    def inv_freq(self, seq_len: int) -> Tensor:
        ext = self.long_factor if seq_len > self.original_max_position_embeddings else self.short_factor
        return rope_inv_freq(self.rotary_dim, self.base) / ext.cpu()


@register(
    "rope_llama3", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    aliases=("llama3",),
    paper="Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783); frequency scaling of the "
          "Llama 3.1 reference code (apply_scaling)", context=("head_dim", "original_max_position_embeddings"))
class RoPELlama3(RoPE):
    """Llama-3.1 frequency scaling: wavelength-dependent interpolation.

    With wavelength `λ_i = 2π/θ_i` and `L` = `original_max_position_embeddings`: `λ < L/high_freq_factor` keeps
    `θ_i`; `λ > L/low_freq_factor` uses `θ_i/s`; between, `θ'_i = (1 − γ)θ_i/s + γθ_i`
    with `γ = (L/λ − low_freq_factor)/(high_freq_factor − low_freq_factor)`.

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        factor: `s` (8 in Llama 3.1, whose `base` is 500000; the default base here is
            10000 like the other RoPE variants).
        low_freq_factor, high_freq_factor: 1 and 4 in Llama 3.1 (`0 < low < high`).
        original_max_position_embeddings: original context `L` (8192 in Llama 3.1).

    Raises:
        ValueError: `factor ≤ 0`, `original_max_position_embeddings < 1`, `low_freq_factor ≥ high_freq_factor`
            or `low_freq_factor ≤ 0`, and RoPE's errors.
    """

    saved_settings = ("factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings", *_ROPE_SETTINGS)

    def __init__(self, head_dim: int, factor: float = 8.0, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192, base: float = 10000.0,
                 rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        self.factor = _check_factor("rope_llama3", factor)
        self.original_max_position_embeddings = _check_len("rope_llama3", original_max_position_embeddings)
        if not 0 < low_freq_factor < high_freq_factor:
            raise ValueError(f"rope_llama3: need 0 < low_freq_factor < high_freq_factor, got "
                             f"{low_freq_factor}, {high_freq_factor}")
        self.low_freq_factor, self.high_freq_factor = float(low_freq_factor), float(high_freq_factor)

    def inv_freq(self, seq_len: int) -> Tensor:
        theta = rope_inv_freq(self.rotary_dim, self.base)
        L, lo, hi, s = self.original_max_position_embeddings, self.low_freq_factor, self.high_freq_factor, self.factor
        wavelen = 2 * math.pi / theta
        scaled = torch.where(wavelen > L / lo, theta / s, theta)
        smooth = (L / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / s + smooth * scaled
        medium = (wavelen >= L / hi) & (wavelen <= L / lo)
        return torch.where(medium, smoothed, scaled)
