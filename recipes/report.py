"""Deprecated: `mmpe.recipes.report` moved to [`mmpe.results.report`][mmpe.results.report] in
0.2; kept until 0.3.

Importing it warns (`FutureWarning`); every name resolves to the new module's. The new
`render_block`, `rewrite` and `stale` take the recipes' specs as `specs=`; here they default to
the recipes of `mmpe.recipes.RECIPES`, as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mmpe.recipes.compare import recipe_spec

from mmpe.results import report as _moved

warnings.warn("mmpe.recipes.report moved to mmpe.results.report in 0.2; the old module is kept "
              "until 0.3", FutureWarning, stacklevel=2)


def render_block(block: _moved.Block, store: str | Path, specs: Any = recipe_spec) -> str:
    return _moved.render_block(block, store, specs=specs)


def rewrite(text: str, store: str | Path, plots: bool = False, root: str | Path = ".",
            specs: Any = recipe_spec) -> str:
    return _moved.rewrite(text, store, plots, root, specs=specs)


def stale(paths: Iterable[str | Path], store: str | Path, specs: Any = recipe_spec) -> list[str]:
    return _moved.stale(paths, store, specs=specs)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
