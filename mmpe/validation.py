"""Argument checks shared by every public constructor and function (one module, no copies).

Every check raises `ValueError` (a value of the right kind out of range: `0` heads, a NaN
base) or `TypeError` (a value of the wrong kind: `"8"` heads, a list where a tensor is
expected), and the message always names the argument: `"rope: head_dim must be an int >= 2,
got '8'"`.

[`check_options`][mmpe.validation.check_options] validates a registered encoding's constructor arguments from its
signature's annotations (`int`, `float`, `bool`, tuples of ints) and from the ranges
of [`OPTION_RANGES`][mmpe.validation.OPTION_RANGES] (by argument name: every shipped encoding uses a name with one
meaning); [`mmpe.register`][mmpe.registry.register] runs it before the constructor, so the constructor's own
checks (parities, sums, relations between arguments) see well-typed values.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmpe._scratch import positive_env

__all__ = [
    "CPU_FLOPS_PER_THREAD",
    "OPTION_RANGES",
    "AttentionTooLargeError",
    "available_memory",
    "check_attention_work",
    "check_bool",
    "check_finite_float",
    "check_int",
    "check_laplacian_normalization",
    "check_memory",
    "check_options",
    "check_positive_int",
    "check_tensor",
]


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(where: str, arg: str, value: object, minimum: int | None = 1,
              maximum: int | None = None) -> int:
    """`value` as an int in `[minimum, maximum]`; `TypeError`/`ValueError` naming `arg`."""
    if not _is_int(value):
        raise TypeError(f"{where}: {arg} must be an int, got {value!r} "
                        f"({type(value).__name__})")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = ("a positive int (>= 1)" if minimum == 1 and maximum is None else
                 f">= {minimum} (an int)" if maximum is None else
                 f"an int in [{minimum}, {maximum}]" if minimum is not None else
                 f"<= {maximum} (an int)")
        raise ValueError(f"{where}: {arg} must be {bound}, got {value!r}")
    return value


def check_positive_int(where: str, arg: str, value: object, minimum: int = 1) -> None:
    """Raise unless `value` is an int `>= minimum` (`ValueError` naming `arg`).

    Kept with its historic signature (`ValueError` for every bad value) for the encodings
    that call it; new code uses [`check_int`][mmpe.validation.check_int].
    """
    if not _is_int(value) or value < minimum:
        what = "a positive int (>= 1)" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{where}: {arg} must be {what}, got {value!r}")


def check_finite_float(where: str, arg: str, value: object, *, low: float | None = None,
                       low_open: bool = False, high: float | None = None) -> float:
    """`value` as a finite float, optionally `> low` (`low_open`) or `>= low`, `<= high`."""
    if not _is_real(value):
        raise TypeError(f"{where}: {arg} must be a real number, got {value!r} "
                        f"({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: {arg} must be finite, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{where}: {arg} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{where}: {arg} must be <= {high}, got {value!r}")
    return value


def check_bool(where: str, arg: str, value: object) -> bool:
    """`value` when it is a bool (numpy bools too), else `TypeError` naming `arg`."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: {arg} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_laplacian_normalization(where: str, value: object) -> None:
    """Raise `ValueError` unless `value` names a Laplacian normalization.

    Raise `ValueError` unless `value` names a Laplacian normalization: `"sym"` or None
    (combinatorial)."""
    if value not in ("sym", None):
        raise ValueError(f"{where}: normalization must be 'sym' or None, got {value!r}")


def check_tensor(where: str, arg: str, value: object, *, dims: tuple[int, ...] | None = None,
                 floating: bool | None = None, finite: bool = False,
                 convert: bool = True) -> Tensor:
    """`value` as a tensor (a list/tuple/array converted when `convert`), checked.

    Raises:
        TypeError: not a tensor (nor convertible), or not floating/integer as asked.
        ValueError: a rank not in `dims`, or non-finite entries when `finite`.
    """
    if not isinstance(value, Tensor):
        if not convert or isinstance(value, (str, bytes, Mapping)) or value is None:
            raise TypeError(f"{where}: {arg} must be a torch.Tensor, got {type(value).__name__}")
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{where}: {arg} must be a torch.Tensor (or convertible to one), "
                            f"got {type(value).__name__}: {err}") from None
    if floating is True and not value.is_floating_point():
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{where}: {arg} must be a real tensor, got {value.dtype}")
        value = value.float()
    if floating is False and (value.is_floating_point() or value.is_complex()
                              or value.dtype == torch.bool):
        raise TypeError(f"{where}: {arg} must be an integer tensor, got {value.dtype}")
    if dims is not None and value.dim() not in dims:
        raise ValueError(f"{where}: {arg} must have {' or '.join(map(str, dims))} dims, "
                         f"got shape {tuple(value.shape)}")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{where}: {arg} must be finite (it holds NaN or inf)")
    return value


# --------------------------------------------------------------------------------------------
# constructor options, by annotation and name
# --------------------------------------------------------------------------------------------

#: int options whose smallest valid value is not 1 (the default for an ``int`` option).
_INT_MINIMUM: dict[str, int | None] = {
    "prefix_tokens": 0,     # no cls/register tokens
    "seed": 0,              # a generator seed
    "max_offset": 0,        # Abacus: 0 disables the random training offset
    "head_dim": 2,          # rotary pairs / sin-cos pairs need two channels
    "npos_max": 2,
    "position_buckets": 2,
    "max_hops": 1,
    "num_buckets": 2,
}

#: float options: (lowest value, whether it is excluded, highest value). Options not listed
#: only need to be finite; an option listed as ``None`` may be any real (finite) number.
OPTION_RANGES: dict[str, tuple[float | None, bool, float | None]] = {
    "base": (1.0, True, None),
    "temperature": (1.0, True, None),
    "factor": (0.0, True, None),
    "distance_unit": (0.0, True, None),
    "eps": (0.0, True, None),
    "scale": (0.0, True, None),
    "sigma": (0.0, True, None),
    "init_L": (0.0, True, None),
    "init_c": (0.0, True, None),
    "max_freq": (0.0, True, None),
    "lat_fraction": (0.0, False, 1.0),
    "cutoff": (0.0, True, None),
    "gamma": (0.0, False, None),
    "w0": (0.0, True, None),
    "w0_initial": (0.0, True, None),
    "scale_base": (0.0, True, None),
    "beta_fast": (0.0, True, None),
    "beta_slow": (0.0, True, None),
    "low_freq_factor": (0.0, True, None),
    "high_freq_factor": (0.0, True, None),
    "attention_factor": (0.0, True, None),
    "min_radius": (0.0, True, None),
    "max_radius": (0.0, True, None),
    "init_std": (0.0, False, None),
    "init_range": (0.0, True, None),
    "length_scale": (0.0, True, None),
    "alpha": (0.0, False, None),  # Tab-PET: 0 switches the spectral code off
    "clip": (0.0, True, None),
    "init_scale": (0.0, True, None),
}


def _kind(annotation: object) -> tuple[str | None, bool]:
    """(`"int"`/`"float"`/`"bool"`/`"shape"`/`None`, whether `None` is allowed)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))
    text = str(text).replace(" ", "")
    optional = "None" in text.split("|") or text.startswith("Optional")
    base = [t for t in text.split("|") if t != "None"]
    if len(base) != 1:
        return None, optional
    t = base[0]
    if t in ("int", "float", "bool"):
        return t, optional
    if t.startswith("tuple[int"):
        return "shape", optional
    return None, optional


def check_option(where: str, arg: str, annotation: object, value: object) -> None:
    """Check one constructor option against its annotation and [`OPTION_RANGES`][mmpe.validation.OPTION_RANGES]."""
    kind, optional = _kind(annotation)
    if kind is None or (value is None and optional):
        return
    if kind == "int":
        check_int(where, arg, value, _INT_MINIMUM.get(arg, 1))
    elif kind == "float":
        low, open_, high = OPTION_RANGES.get(arg, (None, False, None))
        check_finite_float(where, arg, value, low=low, low_open=open_, high=high)
    elif kind == "bool":
        check_bool(where, arg, value)
    elif kind == "shape":
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{where}: {arg} must be a tuple of ints, got {value!r}")
        if not value or not all(_is_int(v) and v >= 1 for v in value):
            raise ValueError(f"{where}: {arg} must be a non-empty tuple of ints >= 1, "
                             f"got {value!r}")


def check_options(where: str, cls: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Check the arguments of `cls(*args, **kwargs)` by annotation (see [`check_option`][mmpe.validation.check_option])."""
    try:
        bound = inspect.signature(cls).bind(*args, **kwargs)
    except TypeError:
        return  # the constructor itself reports a missing/unknown argument
    params = inspect.signature(cls).parameters
    for arg, value in bound.arguments.items():
        p = params[arg]
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        check_option(where, arg, p.annotation, value)


#: A generous attention throughput of one CPU thread (floating-point operations per second):
#: the time estimate of `check_attention_work` divides by it, so the estimate is a lower bound
#: on ordinary hardware (measured: ~23 GFLOP/s per thread for biased SDPA at head_dim 16).
CPU_FLOPS_PER_THREAD = 50e9
#: default of ``MMPE_CPU_ATTENTION_SECONDS``: the longest one attention call on the CPU may be
#: estimated to take before it is refused.
CPU_ATTENTION_SECONDS = 60.0


class AttentionTooLargeError(RuntimeError):
    """An attention call on the CPU whose work alone would take longer than the limit."""


def cpu_attention_seconds() -> float:
    """The limit in seconds (`MMPE_CPU_ATTENTION_SECONDS`; `inf` turns the check off)."""
    return positive_env("MMPE_CPU_ATTENTION_SECONDS", CPU_ATTENTION_SECONDS, float,
                        "a number of seconds > 0 (or 'inf')")


def check_attention_work(where: str, *, batch: int | None, num_heads: int | None,
                         num_queries: int | None, num_keys: int | None, head_dim: int | None,
                         device: torch.device | str) -> None:
    """Refuse, before any work starts, an attention call on the CPU that cannot finish soon.

    Attention costs `4·b·n_h·n_q·n_k·h_d` floating-point operations (`q kᵀ` and the
    probabilities times `v`) whatever the memory layout: the block-wise CPU path bounds memory,
    not time, so ALiBi at `n = 200,000` would run for many minutes per layer. The estimate
    divides by `CPU_FLOPS_PER_THREAD` × `torch.get_num_threads()` (a lower bound on the
    time); above `MMPE_CPU_ATTENTION_SECONDS` (default 60) it raises. GPUs and traced code
    are not checked.

    Raises:
        AttentionTooLargeError: the estimate exceeds the limit; the message gives the sizes,
            the estimate and the ways out.
    """
    if torch.device(device).type != "cpu" or torch.compiler.is_compiling():
        return
    if None in (batch, num_heads, num_queries, num_keys, head_dim):
        return  # a size not known here (mmpe.functional's mods leave head_dim to the caller)
    flops = 4.0 * batch * num_heads * num_queries * num_keys * head_dim
    threads = max(1, torch.get_num_threads())
    seconds = flops / (CPU_FLOPS_PER_THREAD * threads)
    limit = cpu_attention_seconds()
    if seconds > limit:
        raise AttentionTooLargeError(
            f"{where}: attention over b={batch}, n_h={num_heads}, n_q={num_queries}, "
            f"n_k={num_keys}, head_dim={head_dim} is {flops:.2g} floating-point operations, "
            f"at least {seconds:.0f} s per call on this CPU ({threads} threads), more than the "
            f"limit of {limit:g} s; run it on a GPU, use shorter sequences or a smaller batch, "
            "or raise the limit with MMPE_CPU_ATTENTION_SECONDS (seconds, 'inf' for none)")


#: requests below this many bytes are not checked: a few /proc reads (≈ 50 µs) per attention
#: call would cost more than they guard (no machine running torch has under 64 MiB free)
MEMORY_CHECK_FROM = 1 << 26


def check_memory(where: str, needed: int, what: str, device: torch.device | str,
                 ways_out: str) -> None:
    """Refuse, before allocating, `needed` bytes this process cannot get now.

    Refuse, before allocating, `needed` bytes on the CPU that this process cannot get now
    ([available_memory][mmpe.validation.available_memory]): the one door every API that
    materialises an `n × n` tensor (the math route, `record_attention`, the dense bias,
    `mmpe.attention.dense_bias`) goes through, so a request too large fails with its size and the ways
    out instead of the allocator's `can't allocate memory` (or the OOM killer). GPUs, the meta
    device, traced code and requests under 64 MiB are not checked.

    Args:
        where: the API, named first in the message.
        needed: bytes the request allocates at its peak.
        what: what is allocated and its sizes (`"the bias [b=1, n_h=4, n_q=16000, n_k=16000]
            float32"`).
        device: where it would be allocated.
        ways_out: what the caller can do instead, as a clause.

    Raises:
        MemoryError: `needed` exceeds what this process can allocate now.
    """
    # traced first: a comparison of symbolic sizes would guard (and recompile) on them
    if torch.compiler.is_compiling() or needed < MEMORY_CHECK_FROM or \
            torch.device(device).type != "cpu":
        return
    free = available_memory()
    if free is not None and needed > free:
        raise MemoryError(f"{where}: {what} need {needed / 2**30:.1f} GiB, more than the "
                          f"{free / 2**30:.1f} GiB this process can allocate now; {ways_out}")


def available_memory() -> int | None:
    """Bytes this process can allocate now.

    Bytes this process can allocate now: the least of what the OS can give (Linux
    `MemAvailable`, else the physical memory), what its cgroup leaves (the limit minus the
    working set: usage less inactive file cache, which the kernel reclaims) and what its
    address-space limit leaves (`RLIMIT_AS` minus its virtual size: `ulimit -v`, where
    allocations fail long before the machine is full). None where nothing says."""
    limits = [_os_available(), _cgroup_available(), _address_space_available()]
    known = [v for v in limits if v is not None]
    return min(known) if known else None


def _os_available() -> int | None:
    """Linux `MemAvailable` (bytes), else the physical memory."""
    value = _read_kib("/proc/meminfo", "MemAvailable:")
    return value if value is not None else _physical_memory()


@functools.cache
def _physical_memory() -> int | None:
    """Bytes of physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _address_space_available() -> int | None:
    """`RLIMIT_AS` minus this process's virtual size (`VmSize`), or None without a limit."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    size = _read_kib("/proc/self/status", "VmSize:")
    return None if size is None else max(0, limit - size)


#: (limit file, usage file, the memory.stat key of inactive file cache) of cgroup v2, then v1
_CGROUP_FILES = (("memory.max", "memory.current", "inactive_file"),
                 ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))


def _cgroup_available() -> int | None:
    """The cgroup's memory limit minus its working set, or None without a (finite) limit.
    Reads the process's own cgroup (`/proc/self/cgroup`), v2 or v1."""
    for folder, (limit_file, usage_file, inactive_key) in _cgroup_folders():
        limit = _read_int(os.path.join(folder, limit_file))
        if limit is None:
            continue
        if limit >= 1 << 60:  # "max", or v1's 2^63 rounded to pages: no limit
            return None
        usage = _read_int(os.path.join(folder, usage_file))
        if usage is None:
            continue
        inactive = _read_kib(os.path.join(folder, "memory.stat"), inactive_key + " ", scale=1)
        return max(0, limit - (usage - (inactive or 0)))
    return None


@functools.cache
def _cgroup_folders() -> list[tuple[str, tuple[str, str, str]]]:
    paths = {"v2": "/", "v1": "/"}
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    paths["v2"] = path
                elif "memory" in controllers.split(","):
                    paths["v1"] = path
    except (OSError, ValueError):
        pass
    v2, v1 = _CGROUP_FILES
    return [("/sys/fs/cgroup" + paths["v2"].rstrip("/"), v2), ("/sys/fs/cgroup", v2),
            ("/sys/fs/cgroup/memory" + paths["v1"].rstrip("/"), v1), ("/sys/fs/cgroup/memory", v1)]


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return 1 << 62 if text == "max" else int(text) if text.isdigit() else None


def _read_kib(path: str, key: str, scale: int = 1024) -> int | None:
    """The number after `key` in the file (`/proc` lists kB: `scale` 1024), or None."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * scale
    except (OSError, ValueError, IndexError):
        pass
    return None
