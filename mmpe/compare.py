"""Deprecated: `mmpe.compare` moved to `mmpe.recipes.compare` in 0.2; kept until 0.3.

Importing it warns (`FutureWarning`) and re-exports the functions 0.1 had there, from their new
home (which needs the recipes extra: `pip install 'mmpe[recipes]'`). 0.1's `plot` is gone:
`mmpe report` renders the results figures.
"""

from __future__ import annotations

import warnings

warnings.warn("mmpe.compare moved to mmpe.recipes.compare in 0.2; the old module is kept "
              "until 0.3", FutureWarning, stacklevel=2)

from mmpe.recipes.compare import (  # noqa: E402  (after the warning, on purpose)
    CompareSpec,
    compare,
    format_table,
    load_recipe,
    resolve_encodings,
)

__all__ = ["CompareSpec", "compare", "format_table", "load_recipe", "resolve_encodings"]
