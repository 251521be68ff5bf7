"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer)."""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._positions import check_qk, position_bound, rotary_positions
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import CachedDecodingError, RotaryEncoding
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int


def rope_inv_freq(rotary_dim: int, base: float = 10000.0) -> Tensor:
    """`θ_i = base^(−2i/d)` for `i = 0 … d/2−1`, float64 (radians per token).

    Raises:
        TypeError/ValueError: `rotary_dim` not a positive even int, `base` not a finite
            number > 1.
    """
    if not torch.compiler.is_compiling():  # checked eagerly; a traced base may be symbolic
        check_int("rope_inv_freq", "rotary_dim", rotary_dim, 2)
        if rotary_dim % 2:
            raise ValueError(f"rope_inv_freq: rotary_dim must be even (channel pairs), got "
                             f"{rotary_dim}")
        check_finite_float("rope_inv_freq", "base", base, low=1.0, low_open=True)
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, scale: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """`cos(m·θ_i)` and `sin(m·θ_i)` for positions `m`, each `[*positions.shape, d/2]`.

    The phase `m·θ` is formed and reduced modulo 2π in float64, then cos/sin (times
    `scale`) are rounded once to `dtype` (float32 by default; [`rotation_dtype`][mmpe.encodings.rope.rotation_dtype] gives
    the one [`RoPE`][mmpe.encodings.rope.RoPE] uses for a given input). Building positions in the input's dtype
    would round them (bf16 turns 257 into 256), and a float32 phase is off by ~0.5 rad at
    m = 10⁷.
    """
    phase = positions.to(torch.float64).unsqueeze(-1) * inv_freq.to(positions.device)
    phase = torch.remainder(phase, 2 * math.pi)
    return (phase.cos() * scale).to(dtype), (phase.sin() * scale).to(dtype)


#: Input dtypes rotated in their own dtype, with cos/sin tables rounded to it (see
#: `rotation_dtype`); every other dtype is rotated in float32 (float64 in float64).
LOW_PRECISION = (torch.bfloat16, torch.float16)


def rotation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the cos/sin tables with which RoPE rotates a tensor of `dtype`.

    The dtype of the cos/sin tables (and so of the arithmetic, see [`apply_rotary`][mmpe.encodings.rope.apply_rotary]) with
    which RoPE rotates a tensor of `dtype`.

    bfloat16 and float16 are rotated in their own dtype: the output is rounded to that dtype
    anyway, and rotating in it reads and writes half the bytes with no float32 copy of
    `q`/`k` (HF transformers does the same). The price is two more roundings (the table's
    and one product's). Measured against a float64 rotation of the same input values
    (`tests/encodings/test_rope_dtype.py`, which bounds it by 1.0 and 0.5; `benchmarks/bench_text.py`
    prints it): max |error| / (eps · max |x|) 0.67–0.81 and ‖error‖ / (eps · ‖out‖) ≤ 0.36 for
    bf16, fp16 and float32 alike, against 0.29–0.56 and ~0.2 when bf16/fp16 are rotated in
    float32 and rounded once (still what [`apply_rotary`][mmpe.encodings.rope.apply_rotary] does given float32 tables).
    float64 stays float64; float32 and every other dtype use float32. The phases are always
    formed in float64 ([`rope_cos_sin`][mmpe.encodings.rope.rope_cos_sin]), so positions far out lose nothing.
    """
    if dtype in LOW_PRECISION or dtype == torch.float64:
        return dtype
    return torch.float32


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                 layout: str = "bhsd") -> Tensor:
    """Rotate the first `2·cos.shape[-1]` channels of `x` pairwise.

    `x` is `[b, n_h, s, h_d]` (`layout="bhsd"`, PyTorch's SDPA/FlexAttention layout) or
    `[b, s, n_h, h_d]` (`layout="bshd"`, flash-attn's and HF's projection layout);
    `cos`/`sin` are `[s, r/2]` or `[b, s, r/2]` (or already broadcastable to `x`'s
    rank). With `interleaved` the pairs are channels `(2i, 2i+1)` (RoFormer, GPT-J);
    otherwise `(i, i + r/2)` (GPT-NeoX, Llama, HF). Returns a new tensor of `x`'s shape and
    dtype (the channels past `r` copied unchanged).

    Arithmetic dtype: the wider of `x.dtype` and the tables' dtype, then cast back to
    `x.dtype`. float32 tables (what [`rope_cos_sin`][mmpe.encodings.rope.rope_cos_sin] returns by default) therefore rotate
    bf16/fp16 inputs in float32, as before; tables in the input's own dtype (what
    [`RoPE`][mmpe.encodings.rope.RoPE] passes, see [`rotation_dtype`][mmpe.encodings.rope.rotation_dtype]) rotate it in that dtype, without a float32
    copy. Same results either way up to rounding in the arithmetic dtype.

    Paths (same formula `(x₁ cos − x₂ sin, x₂ cos + x₁ sin)`): interleaved float32/float64
    inputs multiply by `cos + i·sin` as complex numbers (one pass, differentiable); without
    autograd the products are written into one output tensor (no temporaries); under autograd,
    under `torch.compile` (inductor fuses it) and when the tables are wider than `x` the
    plain out-of-place formula is used.

    Raises:
        ValueError: an unknown `layout`, `x` not rank 4, or more rotated channels than
            `x` has.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"apply_rotary: layout must be 'bhsd' or 'bshd', got {layout!r}")
    if x.dim() != 4:
        raise ValueError(f"apply_rotary: x must be rank 4 ({layout}), got {tuple(x.shape)}")
    half = cos.shape[-1]
    if 2 * half > x.shape[-1]:
        raise ValueError(f"apply_rotary: cos/sin rotate {2 * half} channels but x has "
                         f"{x.shape[-1]}")
    if cos.dim() == 3:  # per-example positions [b, s, r/2]: insert the head axis
        axis = 1 if layout == "bhsd" else 2
        cos, sin = cos.unsqueeze(axis), sin.unsqueeze(axis)
    elif cos.dim() == 2 and layout == "bshd":  # [s, r/2] against [b, s, n_h, r]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    work = torch.promote_types(x.dtype, torch.promote_types(cos.dtype, sin.dtype))
    cos, sin = cos.to(work), sin.to(work)  # no-ops for tables of the arithmetic dtype
    if work == x.dtype and not torch.compiler.is_compiling():
        if interleaved and work in (torch.float32, torch.float64) and _complex_view_ok(x, half):
            return _rotate_complex(x, cos, sin, half)
        grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad
                                            or sin.requires_grad)
        if not grad:  # out= arguments do not record autograd
            return _rotate_into(x, cos, sin, half, interleaved)
    return _rotate_functional(x, cos, sin, half, interleaved, work)


def rotate_qk(q: Tensor, k: Tensor, qcos: Tensor, qsin: Tensor, kcos: Tensor, ksin: Tensor,
              interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """[`apply_rotary`][mmpe.encodings.rope.apply_rotary] of `q` and of `k` (layout `bhsd`).

    On CUDA, outside `torch.compile`, both rotations run as one compiled function (inductor
    fuses each into a single read and write of the tensor, forward and backward): eagerly a
    rotation is several small kernels (halves, products, casts, a concatenation), 1.4 ms
    against a 13 µs bandwidth floor at n = 4,096 on an H200. Elsewhere, and where compiling
    fails, the eager functions.
    """
    if q.device.type != "cuda" or torch.compiler.is_compiling():
        return apply_rotary(q, qcos, qsin, interleaved), apply_rotary(k, kcos, ksin, interleaved)
    from mmpe import flex_compile

    family = ("rotate_qk", interleaved, q.dtype, k.dtype, qcos.dtype, qcos.dim(), kcos.dim())
    fn = flex_compile.compiled(_rotate_qk_eager, family)
    try:
        with flex_compile.compile_config():
            return fn(q, k, qcos, qsin, kcos, ksin, interleaved)
    except Exception as err:  # noqa: BLE001 - the eager rotation is exact; the event is counted
        flex_compile.stats.eager_rotations += 1
        if flex_compile.strict():
            raise
        flex_compile.log.warning("compiled RoPE failed (%s); rotating eagerly",
                                 type(err).__name__)
        return _rotate_qk_eager(q, k, qcos, qsin, kcos, ksin, interleaved)


def _rotate_qk_eager(q: Tensor, k: Tensor, qcos: Tensor, qsin: Tensor, kcos: Tensor,
                     ksin: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    return apply_rotary(q, qcos, qsin, interleaved), apply_rotary(k, kcos, ksin, interleaved)


def _complex_view_ok(x: Tensor, half: int) -> bool:
    """Whether `x[..., :2·half]` can be viewed as `half` complex numbers per row
    (`view_as_complex` needs unit channel stride, even other strides and an even offset)."""
    outer = [st for st, n in zip(x.stride()[:-1], x.shape[:-1], strict=True) if n > 1]
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(st % 2 == 0 for st in outer)


def _rotate_complex(x: Tensor, cos: Tensor, sin: Tensor, half: int) -> Tensor:
    """Interleaved pairs `(2i, 2i+1)` as complex numbers times `cos + i·sin`: one read and
    one write of `x` (float32/float64 only: complex32 kernels are missing on the CPU)."""
    rot = x[..., : 2 * half]
    pairs = torch.view_as_complex(rot.unflatten(-1, (half, 2)))
    out = torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)
    if 2 * half == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 2 * half :]), dim=-1)


def _rotate_into(x: Tensor, cos: Tensor, sin: Tensor, half: int, interleaved: bool) -> Tensor:
    """The rotation written into one new tensor (no autograd): `o₁ = x₁ cos`, then
    `o₁ −= x₂ sin` (the second product and the difference rounded once, in the arithmetic
    dtype), likewise `o₂`; no concatenation.

    Half-split pairs work on the two contiguous halves. Interleaved pairs would be read with a
    stride of 2, which the CPU kernels do not vectorise (4× slower in bf16), so they use
    full-width tables instead: `o = x·[c, c] + swap(x)·[−s, s]` with `swap` exchanging
    the channels of each pair (one copy) — the same two roundings per element.
    """
    out = torch.empty_like(x)
    r = 2 * half
    if r < x.shape[-1]:
        out[..., r:] = x[..., r:]
    if interleaved:
        rot, dst = x[..., :r], out[..., :r]
        swapped = rot.unflatten(-1, (half, 2)).flip(-1).flatten(-2)
        torch.mul(rot, cos.repeat_interleave(2, dim=-1), out=dst)
        dst.addcmul_(swapped, torch.stack((-sin, sin), dim=-1).flatten(-2))
        return out
    x1, x2, o1, o2 = x[..., :half], x[..., half:r], out[..., :half], out[..., half:r]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out


def _rotate_functional(x: Tensor, cos: Tensor, sin: Tensor, half: int, interleaved: bool,
                       work: torch.dtype) -> Tensor:
    """Out-of-place form (autograd, `torch.compile`, tables wider than `x`)."""
    rot = x[..., : 2 * half].to(work)
    if interleaved:
        pairs = rearrange(rot, "... (r two) -> ... r two", two=2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleaved:
        out = rearrange(torch.stack((y1, y2), dim=-1), "... r two -> ... (r two)")
    else:
        out = torch.cat((y1, y2), dim=-1)
    out = out.to(x.dtype)
    if 2 * half == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 2 * half :]), dim=-1)


def same_positions(a: Tensor, b: Tensor) -> bool:
    """Whether `a` and `b` are views of the same memory with the same layout.

    Whether `a` and `b` are views of the same memory with the same shape and strides
    (so hold the same values) — e.g. a grid's or an uncached sequence's query and key
    positions. Compares metadata only (no device read); always False under `torch.compile`,
    where fake tensors have no addresses (the compiler shares the work itself)."""
    if torch.compiler.is_compiling():
        return False
    return a is b or (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
                      and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


@register(
    "rope", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    paper="Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding "
          "(arXiv:2104.09864), eq. 34", context=("head_dim",))
class RoPE(SavesSettings, RotaryEncoding):
    """Rotary position embedding (Su et al. 2021, eq. 34).

    Each channel pair `(x_{2i}, x_{2i+1})` of a query at position `m` is rotated by the angle
    `m·θ_i` with `θ_i = base^(−2i/d)` (radians per token), keys likewise at `n`; the score
    `q_mᵀ k_n` then depends on positions only through `m − n`.

    Args:
        head_dim: `h_d` of the queries and keys.
        base: frequency base (10000 in the paper; 500000 in Llama 3).
        rotary_dim: channels rotated (even, ≤ `head_dim`; partial rotary as in GPT-NeoX);
            defaults to `head_dim`.
        interleaved: pair adjacent channels as in the paper (True) or split halves as in
            GPT-NeoX / Llama / HF transformers (False, default).

    Shapes: `forward(q [b, n_h, n_q, h_d], k [b, n_h, n_k, h_d], coords) -> (q, k)` in the
    inputs' dtype. Queries use `coords.query_positions`, keys `coords.key_positions` (so a
    cached decoder rotates new queries at `offset + i`).

    Raises:
        ValueError: odd `rotary_dim`/`head_dim`, `rotary_dim > head_dim`, `base <= 1`,
            or q/k that are not rank 4 with `h_d = head_dim`.

    Subclasses (position interpolation, NTK, YaRN …) override [`inv_freq`][mmpe.encodings.rope.RoPE.inv_freq] and
    `attention_scaling`.
    """

    #: what changes the rotation without being a tensor: saved in the state_dict and checked
    #: on load (`mmpe.encodings._state`); the scalings extend it.
    saved_settings = ("base", "rotary_dim", "interleaved")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rope: head_dim must be a positive even int, got {head_dim}")
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(
                f"rope: rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}"
            )
        if base <= 1:
            raise ValueError(f"rope: base must be > 1, got {base}")
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, float(base)
        self.interleaved = interleaved
        #: multiplies cos and sin (so the logits by its square); YaRN's temperature uses it.
        self.attention_scaling = 1.0
        # cos/sin tables for positions 0..size-1, phases in float64, one pair per table dtype.
        self._cache: RopeTables | None = None

    def inv_freq(self, seq_len: int) -> Tensor:
        """Angular frequencies `θ_i` (radians per token), float64, `[rotary_dim/2]`.

        `seq_len` (tokens seen by this call) lets dynamic scaling methods adapt.
        """
        return rope_inv_freq(self.rotary_dim, self.base)  # rotary_dim/2 values: not worth a cache

    #: positions up to this many are served from the cached table; larger ones are computed.
    cache_limit = 1 << 16

    def freq_key(self, seq_len: int) -> object:
        """What the frequencies depend on besides the constructor's arguments.

        What the frequencies depend on besides the constructor's arguments: nothing for
        fixed-frequency RoPE; dynamic scalings return the length they adapt to. Part of the
        cos/sin table's key (with the frequencies themselves, the scaling and the device)."""
        return None

    def cos_sin(self, positions: Tensor, inv_freq: Tensor, top: int,
                dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """`cos`/`sin` of integer `positions`, gathered from a cached table.

        `cos`/`sin` `[*positions.shape, rotary_dim/2]` in `dtype` of integer
        `positions` (`top` = max position + 1), gathered from a cached table.

        The table covers positions `0 … size−1` (a power of two ≥ `top`, ≥ 256), is built
        by [`rope_cos_sin`][mmpe.encodings.rope.rope_cos_sin] (float64 phases, one rounding to `dtype`) and is kept per
        `dtype`. It is rebuilt when anything it depends on changes: the frequencies
        `inv_freq` (compared by value, so every setting that changes them — `base`,
        `rotary_dim`, a scaling's factors, a dynamic length — invalidates it),
        [`freq_key`][mmpe.encodings.rope.RoPE.freq_key], `attention_scaling`, the device, or a larger `top`.
        Float positions, positions past `cache_limit` and compiled graphs (no side
        effects there) compute cos/sin directly, bit-identical to the table.
        """
        scale = self.attention_scaling
        if positions.is_floating_point() or top > self.cache_limit or \
                torch.compiler.is_compiling():
            return rope_cos_sin(positions, inv_freq, scale, dtype)
        cos_sin = self._table(inv_freq, top, positions.device, dtype)[:, positions]
        return cos_sin[0], cos_sin[1]

    def _table(self, inv_freq: Tensor, top: int, device: torch.device,
               dtype: torch.dtype) -> Tensor:
        """The cached `[2, size, rotary_dim/2]` table of cos and sin in `dtype` (see
        [`cos_sin`][mmpe.encodings.rope.RoPE.cos_sin]), rebuilt when what it depends on changes."""
        key = (self.freq_key(top), self.attention_scaling, device)
        cache = self._cache
        if cache is None or not cache.serves(key, inv_freq, top):
            size = max(256, 1 << (top - 1).bit_length())
            cache = self._cache = RopeTables(key, inv_freq.detach().clone(), size)
        return cache.get(dtype, device)

    def qk_cos_sin(self, qpos: Tensor, kpos: Tensor, inv_freq: Tensor, top: int,
                   qdtype: torch.dtype, kdtype: torch.dtype) -> tuple[Tensor, ...]:
        """The cos/sin tables of the query and key positions.

        `(qcos, qsin, kcos, ksin)` for query and key positions in the dtypes that rotate
        them: one gather of cos and sin together from the cached table, shared by `q` and `k`
        where they have the same positions and dtype (self-attention without a cache); the
        numbers of
        [`cos_sin`][mmpe.encodings.rope.RoPE.cos_sin]."""
        if qdtype == kdtype and same_positions(qpos, kpos):
            cos, sin = self.cos_sin(qpos, inv_freq, top, qdtype)
            return cos, sin, cos, sin
        return (*self.cos_sin(qpos, inv_freq, top, qdtype),
                *self.cos_sin(kpos, inv_freq, top, kdtype))

    def _check_cached(self, coords: Coordinates, top: int) -> None:
        """Refuse cached steps past the length where a length-dependent scaling switches on:
        its frequencies then depend on the total length, so the hidden states of earlier
        tokens (computed at a shorter length) differ from a full recomputation's."""
        limit = getattr(self, "original_max_position_embeddings", None)
        # more keys than queries is a cached step only where the coordinates can describe one
        # (a context-parallel shard also has more keys: every token, so the length is exact)
        cached_step = coords.num_keys > coords.num_queries and coords.supports_cache
        if self.length_dependent and limit is not None and top > limit and cached_step:
            name = getattr(self, "registry_name", type(self).__name__)
            raise CachedDecodingError(
                f"{name}: cached decoding past original_max_position_embeddings={limit} "
                f"tokens (now {top}) is not exact: the rotation of every token depends on the "
                "total length; decode without a cache (generate(..., use_cache=False))")

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope", q, k, self.head_dim, coords)
        qpos, kpos = (p[..., 0] for p in rotary_positions(coords, k))
        top = position_bound(coords)
        self._check_cached(coords, top)
        inv_freq = self.inv_freq(top)
        tables = self.qk_cos_sin(qpos, kpos, inv_freq, top, rotation_dtype(q.dtype),
                                 rotation_dtype(k.dtype))
        return rotate_qk(q, k, *tables, self.interleaved)


class RopeTables:
    """One RoPE cos/sin table (positions `0 … size−1`), materialised per dtype on demand.

    `key` and `inv_freq` (float64 `[r/2]`) identify what the table was built from;
    [`serves`][mmpe.encodings.rope.RopeTables.serves] says whether it is still valid, `get` returns cos and sin stacked,
    `[2, size, r/2]`, in a dtype (the compute dtype of the rotation, so no cast per call),
    built from float64 phases the first time that dtype is asked for (so bf16 tables are
    rounded once from float64, not from float32); one gather then serves both.
    """

    __slots__ = ("key", "inv_freq", "size", "scale", "tables")

    def __init__(self, key: tuple, inv_freq: Tensor, size: int) -> None:
        self.key, self.inv_freq, self.size = key, inv_freq, size
        self.scale = key[1]
        self.tables: dict[torch.dtype, Tensor] = {}

    def serves(self, key: tuple, inv_freq: Tensor, top: int) -> bool:
        """Whether the table holds positions `< top` for `key` and these frequencies."""
        return (self.key == key and self.size >= top and self.inv_freq.shape == inv_freq.shape
                and self.inv_freq.device == inv_freq.device
                and torch.equal(self.inv_freq, inv_freq))

    def get(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        table = self.tables.get(dtype)
        if table is None:
            table = self.tables[dtype] = torch.stack(rope_cos_sin(
                torch.arange(self.size, device=device), self.inv_freq, self.scale, dtype))
        return table
