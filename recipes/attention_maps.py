"""Deprecated: `mmpe.recipes.attention_maps` moved to
[`mmpe.results.attention_maps`][mmpe.results.attention_maps] in 0.2 (it trains nothing); kept
until 0.3.

Importing it warns (`FutureWarning`); every name resolves to the new module's, and
`python -m mmpe.recipes.attention_maps ...` still writes the maps (run
`python -m mmpe.results.attention_maps ...` instead).
"""

from __future__ import annotations

import warnings
from typing import Any

from mmpe.results import attention_maps as _moved

warnings.warn("mmpe.recipes.attention_maps moved to mmpe.results.attention_maps in 0.2; the old "
              "module is kept until 0.3", FutureWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)


if __name__ == "__main__":
    raise SystemExit(_moved.main())
