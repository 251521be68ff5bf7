"""Optional dependencies: import them, or fail naming the extra that installs them."""

from __future__ import annotations

import importlib
from types import ModuleType

#: Which ``pip install 'mmpe[EXTRA]'`` brings each optional top-level module.
EXTRAS = {
    "timm": "timm",
    "torch_geometric": "pyg",
    "transformers": "hf",
    "lightning": "recipes",
    "jsonargparse": "recipes",
    "matplotlib": "recipes",
    "sklearn": "data",
    "networkx": "recipes",
    "rdkit": "data",
    "cartopy": "data",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` or raise `ImportError` naming `purpose` and the pip extra.

    Raises:
        ModuleNotFoundError: `module` is not installed (an `ImportError`; `name` is the
            missing top-level module); the message gives `pip install 'mmpe[…]'`.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'mmpe[{extra}]'" if extra else f"pip install {top}"
        raise ModuleNotFoundError(f"{purpose} needs {top!r}, which is not installed: {how}",
                                  name=top) from err
