"""FSDP2 on an mmpe `Transformer`.

FSDP2 (`torch.distributed.fsdp.fully_shard`) on an mmpe `Transformer`: every block, then the
root, the torchtitan recipe.

A `Transformer` shares one set of score and rotary encodings across its blocks by default
(`share_encodings=True`: T5's table, ALiBi's slopes, learned FIRE are one module). They are
the model's modules (`model.shared_encodings`), which the blocks read without holding them as
submodules: a `fully_shard` per block leaves them out, and the root's gathers them at the start
of the model's forward, keeps them through every block and reduce-scatters their gradient
once. [`fully_shard_transformer`][mmpe.parallel.fsdp.fully_shard_transformer] is that recipe
in one call; the same loop written by hand gives the same run.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def fully_shard_transformer(model: nn.Module, mesh: Any = None, **fsdp_options: Any) -> nn.Module:
    """Shard `model` (an mmpe `Transformer`) with FSDP2 over `mesh`.

    Shard `model` (an mmpe `Transformer`) with FSDP2 over `mesh`: each block, then the root
    (embeddings, the final norm and the encodings the blocks share).

    Build the model on `meta`, call this, then `model.to_empty(device=...)` and
    `model.reset_parameters()` (every rank from the same seed: each fills its shard).
    `mesh` is the data-parallel mesh (a 1-D `DeviceMesh`, e.g. `mesh["data"]` of a 2-D data ×
    context mesh; context parallelism runs over the other dimension with
    [`shard`][mmpe.parallel.coords.shard]). `fsdp_options` go to every `fully_shard` call
    (`reshard_after_forward`, `mp_policy`, …). Checkpoints keep the unsharded model's keys.

    Returns:
        `model`, sharded in place.

    Raises:
        TypeError: `model` without `blocks` (not an mmpe `Transformer`).
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.5: FSDP2 lived under _composable
        from torch.distributed._composable.fsdp import fully_shard
    if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise TypeError(f"fully_shard_transformer: model must be an mmpe Transformer (with "
                        f"blocks), got {type(model).__name__}")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **fsdp_options)
    fully_shard(model, mesh=mesh, **fsdp_options)
    return model
