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

from mmpe.parallel.attention import sharded_attention
from mmpe.parallel.collectives import gather_tokens, reduce_gradients
from mmpe.parallel.coords import ShardedCoords, shard, unshard
from mmpe.parallel.layout import LAYOUTS, gather_order, shard_index
from mmpe.parallel.refusals import REFUSED, ContextParallelError, check_encodings

__all__ = ["LAYOUTS", "REFUSED", "ContextParallelError", "ShardedCoords", "check_encodings", "gather_order",
           "gather_tokens", "reduce_gradients", "shard", "shard_index", "sharded_attention", "unshard"]
