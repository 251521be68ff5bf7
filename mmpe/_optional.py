"""Optional dependencies: import them, or fail naming the extra that installs them."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
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
    "torchaudio": "recipes",
}

#: Top-level modules that import torchaudio when it is installed: a torchaudio whose compiled
#: library does not load against the installed torch breaks them too (transformers imports it
#: through `transformers.audio_utils`).
LOADS_TORCHAUDIO = ("torchaudio", "transformers")


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` or raise `ImportError` naming `purpose` and the pip extra.

    Raises:
        ModuleNotFoundError: `module` is not installed (an `ImportError`; `name` is the
            missing top-level module); the message gives `pip install 'mmpe[…]'`.
    """
    top = module.split(".")[0]
    if top in LOADS_TORCHAUDIO:
        check_torchaudio(purpose)
    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra = EXTRAS.get(top)
        how = f"pip install 'mmpe[{extra}]'" if extra else f"pip install {top}"
        raise ModuleNotFoundError(f"{purpose} needs {top!r}, which is not installed: {how}",
                                  name=top) from err


class TorchaudioMismatchError(ImportError):
    """torchaudio is installed but its compiled library does not load against the installed
    torch (a torchaudio of another torch release)."""


def check_torchaudio(purpose: str) -> None:
    """Raise in one line when an installed torchaudio cannot load against the installed torch.

    torchaudio's compiled library is built against one torch release; pip may pair it with
    another (torchaudio 2.11.1 needs a symbol torch 2.11.0 does not export), and the import
    then fails with an `OSError` about an undefined symbol, from inside whatever imported it.
    Nothing happens when torchaudio is absent (its users say so themselves) or loads.

    Args:
        purpose: what needs it, for the message (e.g. "the audio recipe").

    Raises:
        TorchaudioMismatchError: naming both versions and the install that fixes it.
    """
    if importlib.util.find_spec("torchaudio") is None:
        return
    try:
        importlib.import_module("torchaudio")
    except OSError as err:
        import torch

        audio = importlib.metadata.version("torchaudio")
        release = torch.__version__.split("+")[0]
        raise TorchaudioMismatchError(
            f"{purpose} needs torchaudio, but torchaudio {audio} does not load against torch "
            f"{torch.__version__} ({str(err).splitlines()[0][:120]}): install torchaudio of "
            f"torch's release, `pip install 'torchaudio=={release}'` (a checkout: "
            f"`pip install -c requirements/lock.txt torchaudio`)") from err
