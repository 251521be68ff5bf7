"""What context parallelism refuses, and why.

What context parallelism refuses: each encoding declares it
([`shard_refusal`][mmpe.encodings.base.Encoding.shard_refusal], a plugin's too), and a shard
raises it by name with the reason."""

from __future__ import annotations


class ContextParallelError(ValueError):
    """An encoding or a layer setting that context parallelism cannot run (names it and why)."""


def refused_encodings() -> dict[str, str]:
    """Every registered encoding that declares a `shard_refusal`: registry name -> the reason."""
    from mmpe.registry import available

    out = {}
    for entry in available():
        reason = getattr(entry.cls, "shard_refusal", None)
        if reason:
            out[entry.name] = reason
    return out
