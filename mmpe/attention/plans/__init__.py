"""The sdpa route's plans: where a score term's declared structure becomes a fast kernel call.

| file | what |
| --- | --- |
| `relation.py` | terms of the signed offset on `toeplitz` sequences: tables over the offsets |
| `grid.py` | terms of the cell offset on grids: block-Toeplitz offset tables, forward pass |
| `grid_backward.py` | the grid plan's backward pass onto the offset table |
| `tiles.py` | content-free terms on points, graphs, explicit positions, block by block |
| `flash.py` | the one door to SDPA's private CPU kernel that returns the log-sum-exp |

What they read from a term besides its `score_mod` (rows head by head, tiles, compact terms)
is [mmpe.attention.term_layouts][]; hand-written fast forms of single encoding classes live
in [mmpe.attention.fast_forms][].
"""
