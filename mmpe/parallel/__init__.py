"""Context parallelism over a process group.

Context parallelism: sequences longer than one device holds, sharded over a process group
with their **global** positions.

```python
sharded = mmpe.parallel.shard(coords, group, layout="balanced")  # this rank's queries
out = model(sharded.take(x), sharded)         # MultiHeadAttention gathers K, V itself
full = mmpe.parallel.unshard(out, sharded)    # every rank's rows, in sequence order
```

The attention layers need no other change: a shard answers the coordinates' own members that
attention asks of every call (`gather_keys`, `row_blocks`, `check_encodings`). See
`docs/long_sequences.md` for the layouts, what each kind of encoding needs and the memory per
rank.
"""

from mmpe.parallel.collectives import gather_tokens, reduce_gradients
from mmpe.parallel.coords import ShardedCoords, shard, unshard, unshard_for_loss
from mmpe.parallel.fsdp import fully_shard_transformer
from mmpe.parallel.layout import LAYOUTS, gather_order, shard_index
from mmpe.parallel.refusals import ContextParallelError, refused_encodings

__all__ = ["LAYOUTS", "ContextParallelError", "ShardedCoords", "fully_shard_transformer", "gather_order", "gather_tokens",
           "reduce_gradients", "refused_encodings", "shard", "shard_index", "unshard", "unshard_for_loss"]
