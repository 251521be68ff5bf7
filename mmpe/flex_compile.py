"""Compiled FlexAttention with a bounded number of compilations and no silent fallback.

`torch.compile(flex_attention)` keeps its compiled variants on the code object of
`flex_attention`, and torch stops compiling a code object after `recompile_limit` (8)
variants: every later call then runs FlexAttention *unfused*, materialising the `n × n`
scores, with one warning per process. Each score-mod family (a distinct composition of
encodings), sequence length, batch size, dtype and grad mode is a variant, so a process that
trains and evaluates a few encodings — `mmpe compare`, a test session — used to fall off the
compiled path part-way without saying so.

Here:

* every *family* (the code of its `score_mod` terms and `mask_mod`, the dtype and head
  dims) gets its own copy of the function, so families do not share one limit;
* a family's first `STATIC_SHAPES` shapes (with the grad mode: a training shape and an
  evaluation shape) compile with static shapes, the fastest kernel; every later shape shares
  one dynamic-shape compile per grad mode, so lengths and batch sizes stop recompiling. A
  recipe run compiles a family about four times (two static, two dynamic), once more for a
  batch of one or a sequence within one 128-token block. Measured on an H200 (torch 2.11,
  causal ALiBi, 4,096 tokens, 12 heads of 64, bf16): the static forward kernel took 0.38 ms,
  the dynamic one 0.71 ms (`results/gpu/h200-run4-probe.jsonl`);
* `fullgraph=True` turns torch's silent fallback into `FailOnRecompileLimitHit` (torch
  ≥ 2.6), which is counted in `stats`, logged once per family, and raised when
  `MMPE_FLEX_STRICT=1` (the GPU test tier sets it) — otherwise the call runs unfused, as
  torch would have;
* a kernel that needs more shared memory than the card has (`No valid triton configs …
  out of resource`: head_dim 64, bf16, a score_mod that captures several tensors) is compiled
  again with smaller tiles (`KERNEL_OPTIONS`), and the family keeps the first that fits;
  a family's first training call runs its backward once on copies of the inputs, so that a
  backward kernel's failure is seen here too.
"""

from __future__ import annotations

import functools
import logging
import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

log = logging.getLogger("mmpe.flex")

#: Tile sizes tried in order when a kernel does not fit in shared memory. Block sizes divide
#: the BlockMask's 128-token blocks; the backward kernels need ``N1 % M1 == 0`` and
#: ``M2 % N2 == 0``.
KERNEL_OPTIONS: tuple[dict | None, ...] = (
    None,
    # The default tiles with one pipeline stage fewer: T5's forward at head_dim 64, bf16 asked
    # for 247,808 bytes of an H200's 232,448 at the default three stages.
    {"fwd_num_stages": 2, "bwd_num_stages": 2},
    {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_stages": 2,
     "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
     "bwd_num_stages": 1},
    {"fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32, "fwd_num_stages": 1,
     "bwd_BLOCK_M1": 16, "bwd_BLOCK_N1": 32, "bwd_BLOCK_M2": 32, "bwd_BLOCK_N2": 16,
     "bwd_num_stages": 1},
)
#: Shapes compiled with static shapes per family before later ones share a dynamic compile.
STATIC_SHAPES = 2


def _mode_from_env() -> str:
    """`MMPE_FLEX_DYNAMIC`: unset or `auto` (static for a family's first `STATIC_SHAPES` shapes,
    then dynamic), `1` (always dynamic) or `0` (always static: one compile per shape).

    Raises:
        ValueError: any other value.
    """
    value = os.environ.get("MMPE_FLEX_DYNAMIC", "auto").lower()
    if value in ("auto", ""):
        return "auto"
    if value in ("1", "true", "yes"):
        return "dynamic"
    if value in ("0", "false", "no"):
        return "static"
    raise ValueError(f"MMPE_FLEX_DYNAMIC={value!r}: expected auto, 1 (dynamic) or 0 (static)")


#: Compiled variants allowed per family (torch's default, 8, is per code object; each family
#: here has its own): 2 grad modes × (any size, batch of one, one block, both) is 8.
RECOMPILE_LIMIT = 16
_RESOURCE_ERRORS = ("out of resource", "No valid triton configs", "OutOfResources")


@dataclass
class FlexStats:
    """Counts of this process's compiled FlexAttention calls (read them; `reset`)."""

    families: int = 0  #: compiled copies made (one per score-mod family)
    unfused: int = 0  #: calls that ran unfused after a family reached torch's recompile limit
    smaller_tiles: int = 0  #: families that needed `KERNEL_OPTIONS` beyond the first
    eager_rotations: int = 0  #: RoPE calls that ran eagerly because compiling failed
    unfused_families: set = field(default_factory=set)

    def reset(self) -> None:
        self.families = self.unfused = self.smaller_tiles = self.eager_rotations = 0
        self.unfused_families = set()


stats = FlexStats()

#: The first torch whose FlexAttention mmpe uses: torch 2.5's differentiates no captured tensor
#: that requires grad (every learned score term) and calls a ``score_mod`` on the padding of a
#: length that is not a multiple of 128 (out-of-range indices into exact-size tables).
MIN_TORCH = (2, 6)


class FlexUnavailableError(ValueError):
    """FlexAttention was asked for on a torch older than `MIN_TORCH`."""


def available() -> bool:
    """Whether this torch is recent enough for mmpe's FlexAttention path."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= MIN_TORCH
_copies: dict[tuple, Callable] = {}
_tiles: dict[tuple, int] = {}


def strict() -> bool:
    """Whether an unfused fallback raises (`MMPE_FLEX_STRICT=1`) instead of being counted."""
    return os.environ.get("MMPE_FLEX_STRICT", "") not in ("", "0")


def _fresh(fn: Callable, tag: str) -> Callable:
    """`fn` with a code object of its own, so that torch.compile keeps a separate cache (and
    recompile count) for it."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}__{tag}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def compiled(fn: Callable, family: tuple, backend: str = "inductor",
             fullgraph: bool = True, dynamic: bool = True) -> Callable:
    """The compiled copy of `fn` for `family` with static or dynamic shapes (made on first use)."""
    key = (fn, family, backend, dynamic)
    if key not in _copies:
        stats.families += 1
        tag = f"mmpe{len(_copies)}"
        _copies[key] = torch.compile(_fresh(fn, tag), dynamic=dynamic, fullgraph=fullgraph,
                                     backend=backend)
    return _copies[key]


_static_shapes: dict[tuple, set] = {}
_static_full: set[tuple] = set()


def _static_for(family: tuple, q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether this call takes the family's static-shape copy: always, never, or (`auto`) for
    the first `STATIC_SHAPES` shapes it meets, until that copy reaches its recompile limit."""
    mode = _mode_from_env()
    if mode != "auto":
        return mode == "static"
    if family in _static_full:
        return False
    shape = (tuple(q.shape), tuple(k.shape), tuple(v.shape), torch.is_grad_enabled())
    seen = _static_shapes.setdefault(family, set())
    if shape in seen:
        return True
    if len(seen) < STATIC_SHAPES:
        seen.add(shape)
        return True
    return False


def compile_counts() -> list[int]:
    """Compiled variants held by each family's copy of `flex_attention` in this process."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return [len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
            for (base, *_), fn in _copies.items() if base.__name__ == "flex_attention"]


def _code(fn: Callable | None) -> object:
    return getattr(fn, "__code__", fn)


def family_of(mods: list[Callable], block_mask, q: Tensor, v: Tensor, kinds: tuple = ()) -> tuple:
    """What decides a compiled variant besides shapes.

    What decides a compiled variant besides shapes: the terms' code, the mask's, dtype and
    head dims, and `kinds` (the encodings' classes: subclasses can share a `score_mod`'s
    code and differ in what it calls)."""
    mask_mod = getattr(block_mask, "mask_mod", None)
    return (tuple(_code(m) for m in mods), _code(mask_mod), q.dtype, q.shape[-1], v.shape[-1],
            kinds)


def flex(q: Tensor, k: Tensor, v: Tensor, mods: list[Callable], score_mod: Callable | None,
         block_mask, scale: float, backend: str = "inductor", kinds: tuple = ()) -> Tensor:
    """`flex_attention` compiled per family.

    `flex_attention(q, k, v, score_mod, block_mask, scale)` compiled per family
    ([`family_of`][mmpe.flex_compile.family_of]; `mods` are the terms `score_mod` composes).

    Raises:
        RuntimeError: the family reached torch's recompile limit and `MMPE_FLEX_STRICT` is
            set; or every tile size in `KERNEL_OPTIONS` failed to compile.
    """
    from torch.nn.attention.flex_attention import flex_attention

    family = family_of(mods, block_mask, q, v, kinds)
    static = _static_for(family, q, k, v)
    fn = compiled(flex_attention, family, backend, dynamic=not static)
    level = _tiles.get(family, 0)
    while True:
        try:
            with compile_config():
                _probe_backward(fn, family, level, q, k, v, score_mod, block_mask, scale)
                return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          kernel_options=KERNEL_OPTIONS[level])
        except _limit_errors() as err:
            if static and _mode_from_env() == "auto":
                # Shapes the key does not see (a captured table's) filled the static copy.
                _static_full.add(family)
                return flex(q, k, v, mods, score_mod, block_mask, scale, backend, kinds)
            return _unfused(family, err, q, k, v, score_mod, block_mask, scale)
        except Exception as err:  # inductor wraps the Triton resource error in several types
            if not any(s in str(err) for s in _RESOURCE_ERRORS):
                raise
            if level + 1 >= len(KERNEL_OPTIONS):
                raise RuntimeError(f"FlexAttention: no tile size in mmpe.flex_compile."
                                   f"KERNEL_OPTIONS fits this kernel ({err})") from err
            level += 1
            if _tiles.get(family, 0) == 0:
                stats.smaller_tiles += 1
            _tiles[family] = level
            log.info("FlexAttention kernel did not fit in shared memory; retrying with %s",
                     KERNEL_OPTIONS[level])


def compile_config():
    """Configure the compiler for the flex families.

    Allow `RECOMPILE_LIMIT` variants per family; do not assume that sizes which
    happen to be equal stay equal (duck sizing: each would be another compile of the same
    family); and specialise Python floats (the softmax scale, an encoding's constants): symbolic floats inside a `score_mod` whose captured tensors need
    gradients fail to trace (`PendingUnbackedSymbolNotFound`, torch 2.11, FIRE).

    Not used, measured on an H200 with torch 2.11: `backed_size_oblivious` (no 0/1
    specialisation; it breaks the lowering of slices, `KeyError: 'unbacked_bindings'`) and
    `force_non_lazy_backward_lowering` (its backward kept the first call's strides and failed
    at the next length). Sizes of 1 (a batch of one, one 128-token block) therefore still
    compile once more each.
    """
    return _Config()


class _Config:
    """The context of [`compile_config`][mmpe.flex_compile.compile_config]: it sets and
    restores the three values directly. It is entered on every compiled call (attention and
    RoPE, each layer, each forward): around a compiled call torch's `config.patch` added about
    40 µs of CPU time, this about 13 µs (measured on the CPU; a GPU step of a small layer is
    bound by such launch-side time)."""

    __slots__ = ("_old",)

    def __enter__(self) -> None:
        settings = _config_settings()
        self._old = [(module, name, getattr(module, name)) for module, name, _ in settings]
        for module, name, value in settings:
            setattr(module, name, value)

    def __exit__(self, *exc) -> bool:
        for module, name, value in reversed(self._old):
            setattr(module, name, value)
        return False


@functools.cache
def _config_modules() -> tuple[object, str, object]:
    import torch.fx.experimental._config as fx_config

    dynamo = torch._dynamo.config
    # torch < 2.6 names the limit cache_size_limit and keeps use_duck_shape in dynamo's config.
    limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    duck = fx_config if hasattr(fx_config, "use_duck_shape") else dynamo
    return dynamo, limit, duck


def _config_settings() -> list[tuple[object, str, object]]:
    dynamo, limit, duck = _config_modules()
    return [(dynamo, "specialize_float", True), (dynamo, limit, RECOMPILE_LIMIT),
            (duck, "use_duck_shape", False)]


def _limit_errors() -> tuple[type[BaseException], ...]:
    """What torch raises at the recompile limit under `fullgraph=True` (torch ≥ 2.6; older
    versions fall back as torch does, uncounted)."""
    from torch._dynamo import exc

    names = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
    return tuple(e for e in (getattr(exc, n, None) for n in names) if e is not None)


_probed: set[tuple] = set()


def _probe_backward(fn: Callable, family: tuple, level: int, q: Tensor, k: Tensor, v: Tensor,
                    score_mod, block_mask, scale: float) -> None:
    """On a family's first call with gradients, run its backward once on copies of the inputs
    (gradients w.r.t. the copies only: nothing accumulates into parameters), so that a backward
    kernel too large for shared memory fails here, where a smaller tile can be chosen, and not
    inside `loss.backward()`."""
    key = (family, level, id(fn))
    if key in _probed or not torch.is_grad_enabled() or not any(
            t.requires_grad for t in (q, k, v)):
        return
    copies = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
    out = fn(*copies, score_mod=score_mod, block_mask=block_mask, scale=scale,
             kernel_options=KERNEL_OPTIONS[level])
    torch.autograd.grad(out.float().sum(), [t for t in copies if t.requires_grad])
    _probed.add(key)


def _unfused(family: tuple, err: Exception, q, k, v, score_mod, block_mask, scale) -> Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    stats.unfused += 1
    message = ("FlexAttention recompiled more than its recompile limit "
               f"({RECOMPILE_LIMIT}) times for one score-mod family; "
               "this call runs unfused (O(n²) memory). Past a family's first shapes, shapes are "
               "dynamic, so this means many dtypes, grad modes or head sizes in one process.")
    if strict():
        raise RuntimeError(message + " (MMPE_FLEX_STRICT is set)") from err
    if family not in stats.unfused_families:
        stats.unfused_families.add(family)
        log.warning(message)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def block_mask(mask_mod: Callable, batch: int | None, n_q: int, n_k: int,
               device: torch.device):
    """`create_block_mask` compiled per `mask_mod` code on CUDA (eager elsewhere)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if device.type != "cuda":
        return create_block_mask(mask_mod, batch, None, n_q, n_k, device=device)
    # Graph breaks are allowed here: past the limit torch builds the mask eagerly, which is
    # exact (an n_q × n_k boolean mask, then blocks), only slower.
    fn = compiled(create_block_mask, (_code(mask_mod),), fullgraph=False,
                  dynamic=_mode_from_env() != "static")
    with compile_config():
        return fn(mask_mod, batch, None, n_q, n_k, device=device)
