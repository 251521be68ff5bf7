"""The one figure layer of [`mmpe.plot`][mmpe.plot]: every figure is made and written through here.

matplotlib is imported inside these functions (`import mmpe.plot` does not need it).
Figures are matplotlib `Figure` objects made without `pyplot`, so
drawing one neither selects a backend nor registers the figure with `pyplot`; PNGs are
rendered by Agg when they are saved. [`pyplot`][mmpe.plot.style.pyplot] is for code that wants `pyplot` itself
(it selects Agg first); [`show`][mmpe.plot.style.show] opens written PNGs on a display (`mmpe plot --show`).

No other module of [`mmpe.plot`][mmpe.plot] calls `matplotlib.use` or `savefig`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["DIVERGING", "DPI", "finish", "head_colors", "legend", "new_figure", "pyplot",
           "save", "show", "subplots", "symmetric_limit"]

#: resolution of the encoding figures (dots per inch).
DPI = 100
#: colour map of signed values centred on 0 (encoding matrices, sphere maps).
DIVERGING = "RdBu_r"


def pyplot() -> Any:
    """`matplotlib.pyplot` with the Agg backend (files only, no display).

    Agg is selected when `pyplot` is not imported yet; a process that already imported it
    keeps its backend (switching would close its open figures).

    Raises:
        ModuleNotFoundError: matplotlib is not installed (`pip install 'mmpe[recipes]'`).
    """
    from mmpe._optional import require

    matplotlib = require("matplotlib", "drawing figures")
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(width: float, height: float, *, dpi: float = DPI,
               layout: str | None = "constrained") -> Figure:
    """An empty `width × height` inch figure (constrained layout), not known to `pyplot`.

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
    """
    from mmpe._optional import require

    require("matplotlib", "drawing figures")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=dpi, layout=layout)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] = (6.4, 4.8),
             dpi: float = DPI, squeeze: bool = True, **kwargs: Any) -> tuple[Figure, Any]:
    """`(figure, axes)` like `pyplot.subplots`, made with [`new_figure`][mmpe.plot.style.new_figure].

    `axes` is one `Axes` for a single panel (with `squeeze`), else
    an array of them; `kwargs` go to `matplotlib.figure.Figure.subplots`.
    """
    fig = new_figure(*figsize, dpi=dpi)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze, **kwargs)


def save(fig: Figure, path: str | os.PathLike, *, dpi: float = DPI) -> Path:
    """Write `fig` to `path` and close it.

    Write `fig` to `path` (a PNG, or the format of its suffix), making the parent
    folder, and close it in `pyplot` if it was opened there. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)
    return path


def finish(fig: Figure, path: str | os.PathLike | None, *, dpi: float = DPI) -> Figure:
    """[`save`][mmpe.plot.style.save] `fig` when `path` is given; return `fig` either way."""
    if path is not None:
        save(fig, path, dpi=dpi)
    return fig


def symmetric_limit(values: np.ndarray) -> float:
    """The colour limit of a diverging map centred on 0.

    `max |value|` over the finite values (1 when there is none or it is 0): the colour
    limits `±lim` of a diverging map centred on 0."""
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def relative_luminance(rgb: Any) -> Any:
    """WCAG 2's relative luminance of sRGB colours in [0, 1] (`[..., 3]` → `[...]`)."""
    rgb = np.asarray(rgb, dtype=float)[..., :3]
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def readable_on(rgb: Any) -> str:
    """`"black"` or `"white"`, whichever has the higher contrast ratio on the colour `rgb`."""
    lum = float(relative_luminance(rgb))
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def head_colors(n: int) -> list:
    """`n` colours from viridis, one per attention head."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1) * 0.9) for i in range(n)]


def legend(ax: Axes, n: int) -> None:
    """A small frameless legend for `n` lines, or none past 16 (a line per head)."""
    if n <= 16:
        ax.legend(fontsize=8, ncols=2 if n > 8 else 1, loc="best", frameon=False)


def show(paths: Sequence[str | os.PathLike]) -> bool:
    """Open the PNGs in windows when a display exists (`mmpe plot --show`); False without."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        return False
    import matplotlib.pyplot as plt  # the display's backend, not Agg

    for p in paths:
        fig = plt.figure(figsize=(8, 6))
        ax = fig.add_subplot()
        ax.imshow(plt.imread(p))
        ax.set_axis_off()
        if fig.canvas.manager is not None:
            fig.canvas.manager.set_window_title(Path(p).name)
    plt.show()
    return True
