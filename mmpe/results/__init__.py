"""Stored results and what is rendered from them: `mmpe report`.

* [`mmpe.results.store`][mmpe.results.store]: the results store, one JSON line per finished
  run (`<store>/<recipe>.jsonl`), and the one writer of every store (runs, benchmark tables).
* [`mmpe.results.report`][mmpe.results.report]: mean ± sd tables, noise-aware winners and
  plots from a store; rewrites the `<!-- mmpe:report … -->` blocks of README.md and the docs.
* [`mmpe.results.bench_report`][mmpe.results.bench_report]: the benchmark tables
  (`<!-- mmpe:bench … -->` blocks) from `results/bench/`.
* [`mmpe.results.attention_maps`][mmpe.results.attention_maps]: attention maps of trained
  text models, stored for the docs' gallery (`python -m mmpe.results.attention_maps`; not
  imported here, so that `-m` runs it once).

Rendering needs no Lightning: a block's recipe spec comes from the caller (`specs=`), so
nothing here imports `mmpe.recipes`.
"""

from mmpe.results import bench_report, report, store
from mmpe.results.bench_report import BenchBlock
from mmpe.results.report import Block, Cell, render_table, rewrite, stale, summarise
from mmpe.results.store import KEY_FIELDS, append, append_lines, make_record, read, setting_name

__all__ = ["KEY_FIELDS", "BenchBlock", "Block", "Cell", "append", "append_lines", "bench_report",
           "make_record", "read", "render_table", "report", "rewrite", "setting_name", "stale",
           "store", "summarise"]
