"""Whether a figure's text reads where a page shows it: checked on the drawn figure.

A font size says little about what a reader sees: constrained layout may push a title out of
the canvas, two panels' titles may run into each other, and a wide PNG is scaled down to the
page's text column. [`text_problems`][mmpe.plot.legibility.text_problems] draws the figure
(Agg) and measures every text artist that was drawn (`get_window_extent`): each must lie inside
the figure, overlap no other text and no other axes than its own (a title under a colorbar),
be at least `min_px` pixels tall once the PNG is scaled to the column, and stand out from what
is drawn under it: on the figure drawn once more without its text, at most
`MAX_LOW_CONTRAST` of the text's box may have a contrast ratio with the text's colour below
`MIN_CONTRAST` (WCAG 2's relative-luminance ratio; 3:1 is its bar for large text). The docs' figures (docs/gen_figures.py) fail the site build on any problem; the
tests run it on every figure kind of `mmpe plot`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mmpe.plot.style import DPI, relative_luminance

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["COLUMN_PX", "MAX_LOW_CONTRAST", "MIN_CONTRAST", "MIN_TEXT_PX", "text_problems"]

#: The width a figure is shown at: the text column of a docs page at a 1,400 px window.
COLUMN_PX = 688
#: The smallest text height, in pixels as shown in the column, that stays legible.
MIN_TEXT_PX = 10.0
#: Overlap (in PNG pixels, both ways) below which two boxes only touch.
_TOUCH_PX = 1.0
#: The contrast ratio (WCAG 2, `(L_1 + 0.05) / (L_2 + 0.05)`) below which text is hard to read.
MIN_CONTRAST = 3.0
#: The share of a text's box that may lie on a background below `MIN_CONTRAST`.
MAX_LOW_CONTRAST = 0.25


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
    background = _drawn_without_text(fig, canvas)  # ends with the whole figure drawn again
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
            dx, dy = _overlap(box_a, box_b)
            if dx > _TOUCH_PX and dy > _TOUCH_PX:
                problems.append(f"{a.get_text()[:40]!r} overlaps {b.get_text()[:40]!r} "
                                f"({dx:.0f}×{dy:.0f} px)")
    problems += _over_other_axes(fig, boxes, renderer)
    problems += _low_contrast(background, boxes)
    return problems


def _overlap(a: Any, b: Any) -> tuple[float, float]:
    return min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)


def _over_other_axes(fig: Figure, boxes: list, renderer: Any) -> list[str]:
    """Texts that run over the plotting area of an axes they do not belong to (a colorbar)."""
    problems = []
    areas = [(ax, ax.get_window_extent(renderer)) for ax in fig.axes
             if ax.get_visible() and ax.axison]
    for text, box in boxes:
        own = text.axes
        for ax, area in areas:
            if ax is own or (own is not None and ax in getattr(own, "child_axes", ())):
                continue
            dx, dy = _overlap(box, area)
            if dx > _TOUCH_PX and dy > _TOUCH_PX:
                label = ax.get_label() or ax.get_title() or type(ax).__name__
                problems.append(f"{text.get_text()[:40]!r} runs over another axes ({label!r}, "
                                f"{dx:.0f}×{dy:.0f} px)")
    return problems


def _drawn_without_text(fig: Figure, canvas: Any) -> Any:
    """The luminance `[h, w]` of the figure drawn with every text hidden, in the layout it was
    just drawn in (the layout engine is held while the text is away)."""
    import numpy as np
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_visible()]
    engine = fig.get_layout_engine()
    if engine is not None:  # the layout as drawn: without its text it would spread the axes
        fig.set_layout_engine("none")
    try:
        for t in texts:
            t.set_visible(False)
        try:
            canvas.draw()
            image = np.asarray(canvas.buffer_rgba())[..., :3] / 255.0
        finally:
            for t in texts:
                t.set_visible(True)
        canvas.draw()  # the canvas holds the whole figure again (docs/gen_figures.py saves it)
    finally:
        if engine is not None:
            fig.set_layout_engine(engine)
    return relative_luminance(image)


def _low_contrast(background: Any, boxes: list) -> list[str]:
    """Texts whose box lies mostly on colours too close to their own."""
    import numpy as np
    from matplotlib.colors import to_rgb

    height, width = background.shape
    problems = []
    for text, box in boxes:
        x0, x1 = max(0, int(np.floor(box.x0))), min(width, int(np.ceil(box.x1)))
        y0, y1 = max(0, height - int(np.ceil(box.y1))), min(height, height - int(np.floor(box.y0)))
        if x1 <= x0 or y1 <= y0:
            continue
        fg = relative_luminance(np.asarray(to_rgb(text.get_color())))
        under = background[y0:y1, x0:x1]
        ratio = (np.maximum(under, fg) + 0.05) / (np.minimum(under, fg) + 0.05)
        low = float((ratio < MIN_CONTRAST).mean())
        if low > MAX_LOW_CONTRAST:
            problems.append(f"{text.get_text()[:40]!r} has contrast below {MIN_CONTRAST:g}:1 on "
                            f"{low:.0%} of its box (its colour on what is drawn under it)")
    return problems


def _fmt(box: Any) -> str:
    return f"[{box.x0:.0f}, {box.y0:.0f}, {box.x1:.0f}, {box.y1:.0f}]"
