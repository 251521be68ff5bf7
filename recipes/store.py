"""Deprecated: `mmpe.recipes.store` moved to [`mmpe.results.store`][mmpe.results.store] in 0.2;
kept until 0.3.

Importing it warns (`FutureWarning`); every name resolves to the new module's.
"""

from __future__ import annotations

import warnings
from typing import Any

from mmpe.results import store as _moved

warnings.warn("mmpe.recipes.store moved to mmpe.results.store in 0.2; the old module is kept "
              "until 0.3", FutureWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
