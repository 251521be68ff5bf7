"""Context parallelism: sequences longer than one device holds, sharded over a process group
with their **global** positions.

```python
sharded = mmpe.parallel.shard(coords, group, layout="balanced")  # this rank's queries
out = model(sharded.take(x), sharded)         # MultiHeadAttention gathers K, V itself
full = mmpe.parallel.unshard(out, sharded)    # every rank's rows, in sequence order
```

See `docs/long_sequences.md` for the layouts, what each kind of encoding needs and the
memory per rank.
"""

from mmpe.parallel.attention import REFUSED, ContextParallelError, sharded_attention, unshard
from mmpe.parallel.collectives import gather_tokens
from mmpe.parallel.coords import ShardedCoords, shard
from mmpe.parallel.layout import LAYOUTS, gather_order, shard_index

__all__ = ["LAYOUTS", "REFUSED", "ContextParallelError", "ShardedCoords", "gather_order",
           "gather_tokens", "shard", "shard_index", "sharded_attention", "unshard"]
