"""Whether a figure's text reads where a page shows it: checked on the drawn figure.

A font size says little about what a reader sees: constrained layout may push a title out of
the canvas, two panels' titles may run into each other, and a wide PNG is scaled down to the
page's text column. [`text_problems`][mmpe.plot.legibility.text_problems] draws the figure
(Agg) and measures every text artist that was drawn (`get_window_extent`): each must lie inside
the figure, overlap no other, and be at least `min_px` pixels tall once the PNG is scaled to
the column. The docs' figures (docs/gen_figures.py) fail the site build on any problem; the
tests run it on every figure kind of `mmpe plot`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mmpe.plot.style import DPI

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["COLUMN_PX", "MIN_TEXT_PX", "text_problems"]

#: The width a figure is shown at: the text column of a docs page at a 1,400 px window.
COLUMN_PX = 688
#: The smallest text height, in pixels as shown in the column, that stays legible.
MIN_TEXT_PX = 10.0
#: Overlap (in PNG pixels, both ways) below which two boxes only touch.
_TOUCH_PX = 1.0


@contextmanager
def _recording_drawn_text(drawn: list[Any]):
    """Records every `Text` that draws itself (tick labels outside the view, empty or hidden
    texts are not drawn, and so not checked)."""
    from matplotlib.text import Text

    original = Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    Text.draw = draw
    try:
        yield
    finally:
        Text.draw = original


def text_problems(fig: Figure, *, dpi: float = DPI, column_px: float = COLUMN_PX,
                  min_px: float = MIN_TEXT_PX) -> list[str]:
    """What is wrong with the drawn text of `fig`, saved at `dpi` and shown `column_px` wide.

    Args:
        fig: a matplotlib figure (drawn here, with its own layout engine).
        dpi: the resolution the PNG is saved at (dots per inch).
        column_px: the width the page shows the PNG at (a wider PNG is scaled down).
        min_px: the smallest legible text height in shown pixels.

    Returns:
        `list[str]`, one line per problem naming the text (a box outside the figure, clipped;
            two boxes that overlap; a text under `min_px` at the column's width); `[]` when it
            reads.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    engine = fig.get_layout_engine()
    if engine is not None:  # constrained layout settles over two passes (the draw is the second)
        engine.execute(fig)
    drawn: list[Any] = []
    with _recording_drawn_text(drawn):
        canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    scale = min(1.0, column_px / width)
    boxes = [(t, t.get_window_extent(renderer)) for t in dict.fromkeys(drawn)]
    problems = []
    for text, box in boxes:
        name = repr(text.get_text()[:40])
        if box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width + 0.5 or box.y1 > height + 0.5:
            problems.append(f"{name} is cut off: box {_fmt(box)} outside the {width:.0f}×"
                            f"{height:.0f} px figure")
        shown = text.get_fontsize() * dpi / 72 * scale
        if shown < min_px - 1e-6:
            problems.append(f"{name} is {shown:.1f} px tall at the {column_px:.0f} px column "
                            f"(at least {min_px:g})")
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > _TOUCH_PX and dy > _TOUCH_PX:
                problems.append(f"{a.get_text()[:40]!r} overlaps {b.get_text()[:40]!r} "
                                f"({dx:.0f}×{dy:.0f} px)")
    return problems


def _fmt(box: Any) -> str:
    return f"[{box.x0:.0f}, {box.y0:.0f}, {box.x1:.0f}, {box.y1:.0f}]"
