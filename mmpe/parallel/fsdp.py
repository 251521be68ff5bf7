"""FSDP2 on an mmpe `Transformer`.

FSDP2 (`torch.distributed.fsdp.fully_shard`) on an mmpe `Transformer`: every block, then the
root, with the encodings the blocks share sharded once, by the root.

A `Transformer` shares one set of score and rotary encodings across its blocks by default
(`share_encodings=True`: T5's table, ALiBi's slopes, learned FIRE are one module). FSDP2's
per-block recipe (`fully_shard(block)` for each block, then `fully_shard(model)`: torchtitan)
would shard the shared modules with the first block and meet them again, already DTensors, in
the second (`TypeError: Invariant encountered: value was None` from torch). They belong to the
model, not to a block: [`fully_shard_transformer`][mmpe.parallel.fsdp.fully_shard_transformer]
leaves them out of every block's unit and gives them to the root's, which gathers them at the
start of the model's forward, keeps them through every block and reduce-scatters their
gradient once.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

SHARED = "shared_encodings"


def shared_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that more than one of `model.blocks` holds (shared encodings), in order."""
    seen: dict[int, int] = {}
    order: list[nn.Module] = []
    for block in getattr(model, "blocks", ()):
        for sub in {id(m): m for m in block.modules() if m is not block}.values():
            seen[id(sub)] = seen.get(id(sub), 0) + 1
            if seen[id(sub)] == 2:
                order.append(sub)
    # only the outermost shared modules (an encoding, not also its own submodules)
    inner = {id(m) for s in order for m in s.modules() if m is not s}
    return [m for m in order if id(m) not in inner]


def fully_shard_transformer(model: nn.Module, mesh: Any = None, **fsdp_options: Any) -> nn.Module:
    """Shard `model` (an mmpe `Transformer`) with FSDP2 over `mesh`.

    Shard `model` (an mmpe `Transformer`) with FSDP2 over `mesh`: each block, then the root
    (embeddings, the final norm and the encodings the blocks share).

    Build the model on `meta`, call this, then `model.to_empty(device=...)` and
    `model.reset_parameters()` (every rank from the same seed: each fills its shard).
    `mesh` is the data-parallel mesh (a 1-D `DeviceMesh`, e.g. `mesh["data"]` of a 2-D data ×
    context mesh; context parallelism runs over the other dimension with
    [`shard`][mmpe.parallel.coords.shard]). `fsdp_options` go to every `fully_shard` call
    (`reshard_after_forward`, `mp_policy`, …).

    The shared encodings are also registered on the root as `shared_encodings` (FSDP2 reaches a
    module through the root's children); the state dict leaves that path out, so checkpoints
    keep the unsharded model's keys.

    Returns:
        `model`, sharded in place.

    Raises:
        TypeError: `model` without `blocks` (not an mmpe `Transformer`).
        RuntimeError: shared encodings on a torch whose `fully_shard` has no `ignored_params`
            (torch < 2.7): build the model with `share_encodings=False` there.
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.5: FSDP2 lived under _composable
        from torch.distributed._composable.fsdp import fully_shard
    if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise TypeError(f"fully_shard_transformer: model must be an mmpe Transformer (with "
                        f"blocks), got {type(model).__name__}")
    shared = shared_modules(model)
    ignored = {p for m in shared for p in m.parameters()}
    if ignored and "ignored_params" not in inspect.signature(fully_shard).parameters:
        names = sorted({getattr(m, "registry_name", type(m).__name__) for m in shared})
        raise RuntimeError(f"fully_shard_transformer: the blocks share encodings {names}, which "
                           "need fully_shard(ignored_params=...) (torch >= 2.7) to be sharded "
                           "once; build the model with share_encodings=False on this torch")
    for block in model.blocks:
        options = {**fsdp_options, **({"ignored_params": ignored} if ignored else {})}
        fully_shard(block, mesh=mesh, **options)
    if shared:
        model.add_module(SHARED, nn.ModuleList(shared))
        model._register_state_dict_hook(_drop_shared_keys)
        model.register_load_state_dict_post_hook(_forgive_shared_keys)
    fully_shard(model, mesh=mesh, **fsdp_options)
    return model


def _drop_shared_keys(module: nn.Module, state_dict: dict, prefix: str, _meta: Any) -> None:
    for key in [k for k in state_dict if k.startswith(f"{prefix}{SHARED}.")]:
        del state_dict[key]


def _forgive_shared_keys(module: nn.Module, incompatible: Any) -> None:
    # the shared encodings load through the blocks' paths, which hold the same tensors
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys
                                    if not k.startswith(f"{SHARED}.")]
