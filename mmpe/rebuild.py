"""Initialising a module built on the `meta` device: `reset_parameters` by rebuilding.

Large models are built without memory first (`with torch.device("meta")`: torchtitan,
Lightning's `ModelParallelStrategy`, HF's empty weights), sharded (FSDP2's `fully_shard`),
moved with `to_empty(device=...)` — which leaves every parameter and buffer uninitialised —
and then initialised in place. An encoding's tensors are not all drawn at random: ALiBi's
slopes, RoPE's frequencies, a grid's index tables are derived from its settings, and a module
whose `reset_parameters` forgot one would run on uninitialised memory and give plausible
numbers.

mmpe's `reset_parameters` therefore rebuilds the module from the arguments it was constructed
with (recorded by [`records_arguments`][mmpe.rebuild.records_arguments]) on the parameters'
device and copies every parameter, buffer and derived tensor into the module in place:
whatever its constructor computes, the reset computes, and with the same RNG state it draws
the same numbers as a normal build. FSDP2's sharded parameters (DTensors) receive their own
shard of the rebuilt tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

_INIT = "_mmpe_init_arguments"
#: attributes every nn.Module has: the module's own, never copied from the rebuilt twin
_MODULE_STATE = frozenset(nn.Module().__dict__) | {_INIT}


def records_arguments(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate an `__init__` to record its arguments for a later rebuild.

    Decorate an `__init__` to keep its arguments for
    [`reset_in_place`][mmpe.rebuild.reset_in_place] (the outermost call's, in a chain of
    `super().__init__`)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _INIT not in self.__dict__:
            object.__setattr__(self, _INIT, (args, dict(kwargs)))
        init(self, *args, **kwargs)

    return wrapper


def record_arguments(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Keep `module`'s constructor arguments (where no outer constructor kept its own)."""
    if _INIT not in module.__dict__:
        object.__setattr__(module, _INIT, (tuple(args), dict(kwargs)))


def tensor_device(module: nn.Module) -> torch.device:
    """Where `module`'s parameters and buffers live (CPU when it has none).

    Raises:
        ValueError: they are on `meta` (move them with `to_empty(device=...)` first).
    """
    for t in [*module.parameters(), *module.buffers()]:
        device = _local(t).device
        if device.type == "meta":
            raise ValueError(f"{type(module).__name__}.reset_parameters: the module is on the "
                             "meta device; move it with module.to_empty(device=...) first")
        return device
    return torch.device("cpu")


def reset_in_place(module: nn.Module) -> None:
    """Rebuild `module` from its recorded constructor arguments, in place.

    Rebuild `module` from its recorded constructor arguments on its own device and copy
    every parameter, buffer and derived tensor into it (see the module docstring).

    Raises:
        TypeError: a module whose constructor arguments were not recorded.
        ValueError: a module still on `meta`.
    """
    recorded = module.__dict__.get(_INIT)
    if recorded is None:
        raise TypeError(f"{type(module).__name__}.reset_parameters: its constructor arguments "
                        "were not recorded (build it through mmpe.build or an mmpe class)")
    device = tensor_device(module)
    args, kwargs = recorded
    # built modules handed to the constructor (an attention layer's encodings) are the
    # module's own: reset first, in the order a normal build made them; those it shares with
    # other layers (`shared_encodings`) are the model's, reset by the model
    theirs = {id(m) for m in _flat([kwargs.get("shared_encodings", ())])}
    for value in _flat([*args, *kwargs.values()]):
        if isinstance(value, nn.Module) and id(value) not in theirs \
                and callable(getattr(value, "reset_parameters", None)):
            value.reset_parameters()
    with torch.device(device):
        fresh = _built_class(module)(*args, **kwargs)
    _copy_from(module, fresh, device)


def _built_class(module: nn.Module) -> type:
    """The module's own class (FSDP2's `fully_shard` swaps in a subclass made at run time)."""
    for cls in type(module).__mro__:
        if not cls.__module__.startswith("torch.distributed"):
            return cls
    return type(module)


def _flat(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(list(v)))
        else:
            out.append(v)
    return out


def _copy_from(module: nn.Module, fresh: nn.Module, device: torch.device) -> None:
    mine, theirs = dict(module.named_modules()), dict(fresh.named_modules())
    # extra paths may only re-register modules already held (FSDP2's shared encodings)
    if not theirs.keys() <= mine.keys():
        raise ValueError(f"{type(module).__name__}.reset_parameters: the module's submodules "
                         "changed since it was built; build it again instead")
    with torch.no_grad():
        for name, twin in theirs.items():
            sub = mine[name]
            for store in ("_parameters", "_buffers"):
                own, new = getattr(sub, store), getattr(twin, store)
                for key, t in own.items():
                    if t is not None and new.get(key) is not None:
                        _fill(t, new[key])
            # derived tensors and tables kept outside the state dict (caches, index tables);
            # not the modules a layer reads without registering (the model's shared
            # encodings): the twin's are its own copies
            for key, value in twin.__dict__.items():
                if key not in _MODULE_STATE and not _holds_modules(value):
                    sub.__dict__[key] = _moved(value, device)


def _holds_modules(value: Any) -> bool:
    return isinstance(value, nn.Module) or (isinstance(value, (list, tuple))
                                            and any(isinstance(v, nn.Module) for v in value))


def _fill(target: Tensor, value: Tensor) -> None:
    """`target` (a tensor or an FSDP2 DTensor shard) set to `value`, in target's dtype."""
    try:
        from torch.distributed.tensor import DTensor, distribute_tensor
    except ImportError:  # torch without DTensor
        DTensor = ()  # noqa: N806
    if isinstance(target, DTensor):
        value = _distribute(distribute_tensor, value.to(target.dtype), target)
        target.to_local().copy_(value.to_local())
        return
    target.copy_(value)


def _distribute(distribute_tensor: Any, value: Tensor, like: Any) -> Any:
    """`value` (the same on every rank) laid out as `like`, without a broadcast where torch
    can (every rank rebuilt the same tensor from the same seed)."""
    try:
        return distribute_tensor(value, like.device_mesh, like.placements, src_data_rank=None)
    except TypeError:  # torch < 2.6: no src_data_rank
        return distribute_tensor(value, like.device_mesh, like.placements)


def _local(t: Tensor) -> Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    return value
