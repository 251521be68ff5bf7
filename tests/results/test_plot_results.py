"""mmpe.plot.results: figures of stored results are written as PNGs, and what they plot is
exactly the (mean, sd) cells they were given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmpe.plot import results

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

COLUMNS = ["1x", "2x", "4x", "8x"]
SERIES = {
    "rope": [(3.1, 0.1), (3.4, None), (None, None), (5.2, 0.4)],  # a missing mean, missing sds
    "alibi": [(3.0, 0.05), (3.1, 0.1), (3.15, 0.1), (3.2, 0.2)],
    "nope": [(3.3, 0.0), (4.0, 0.3), (4.8, 0.3), (6.0, 1.0)],
}


def plotted(ax) -> dict[str, tuple[np.ndarray, list[tuple[float, float, float]]]]:
    """``{label: (points [n, 2], bars [(x, low, high)])}`` of each errorbar of ``ax``."""
    out = {}
    for c in ax.containers:
        data, _, barcols = c.lines
        bars = [(s[0, 0], s[0, 1], s[1, 1]) for lc in barcols for s in map(np.asarray,
                                                                            lc.get_segments())
                if len(s)]
        out[c.get_label()] = (np.asarray(data.get_xydata()).reshape(-1, 2), bars)
    return out


def expected(cells, x_of=lambda j: j) -> tuple[np.ndarray, list[tuple[float, float, float]]]:
    points = np.array([(x_of(j), m) for j, (m, _) in enumerate(cells) if m is not None],
                      dtype=float).reshape(-1, 2)
    bars = [(x_of(j), m - s, m + s) for j, (m, s) in enumerate(cells)
            if m is not None and s is not None]
    return points, bars


def assert_png(path: Path, size: tuple[int, int]) -> None:
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rgb = imread(path)[..., :3]
    assert rgb.shape[:2] == size
    assert rgb.std() > 0.05  # not blank
    assert ((rgb.max(-1) - rgb.min(-1)) > 0.2).mean() > 0.001  # coloured lines and markers


def test_metric_lines_plots_the_cells_given():
    fig = results.draw_metric_lines(COLUMNS, SERIES, xlabel="eval / train length",
                                    ylabel="loss (lower is better)", title="length")
    (ax,) = fig.axes
    got = plotted(ax)
    assert list(got) == list(SERIES)  # one line per series, in order
    for name, cells in SERIES.items():
        points, bars = expected(cells)
        np.testing.assert_allclose(got[name][0], points)
        np.testing.assert_allclose(got[name][1], bars, atol=1e-12)
    assert got["rope"][0][:, 0].tolist() == [0, 1, 3]  # the missing mean is left out
    assert len(got["rope"][1]) == 2  # and so are the missing sds' bars
    assert [t.get_text() for t in ax.get_xticklabels()] == COLUMNS
    assert list(ax.get_xticks()) == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(SERIES)
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "eval / train length", "loss (lower is better)", "length")
    assert ax.xaxis.get_gridlines()[0].get_visible()
    assert ax.xaxis.get_gridlines()[0].get_alpha() == pytest.approx(0.3)
    assert tuple(fig.get_size_inches()) == (7, 4.5) and fig.dpi == results.RESULT_DPI


def test_metric_lines_writes_the_png(tmp_path):
    path = tmp_path / "docs" / "img" / "lengths.png"  # the folders are made
    out = results.metric_lines(COLUMNS, SERIES, str(path), xlabel="x", ylabel="loss")
    assert out == path
    assert_png(path, (675, 1050))  # 7 × 4.5 inches at 150 dpi
    # From mmpe.plot too, a series without any mean and without any sd, no title.
    from mmpe.plot import metric_lines

    metric_lines(["a"], {"empty": [(None, None)], "one": [(1.0, None)]}, tmp_path / "one.png",
                 xlabel="x", ylabel="y")
    assert (tmp_path / "one.png").is_file()


def test_metric_points_one_panel_per_metric():
    panels = ["accuracy", "loss"]
    series = {"rope": [(0.91, 0.01), (0.30, 0.02)],
              "alibi": [(0.88, None), (None, None)],
              "learned": [(0.85, 0.03), (0.41, 0.05)]}
    fig = results.draw_metric_points(panels, series, ylabels=["accuracy (higher is better)",
                                                              "loss (lower is better)"],
                                     title="vision")
    assert len(fig.axes) == 2
    assert fig.get_suptitle() == "vision"
    for p, ax in enumerate(fig.axes):
        assert ax.get_title() == panels[p]
        got = plotted(ax)
        shown = [n for n, cells in series.items() if cells[p][0] is not None]
        assert list(got) == shown
        for i, (name, cells) in enumerate(series.items()):
            if name in got:
                points, bars = expected([cells[p]], x_of=lambda _, i=i: i)  # x = series index
                np.testing.assert_allclose(got[name][0], points)
                np.testing.assert_allclose(got[name][1], bars, atol=1e-12)
        assert [t.get_text() for t in ax.get_xticklabels()] == list(series)
        assert list(ax.get_xticks()) == [0, 1, 2]
    assert fig.axes[1].get_ylabel() == "loss (lower is better)"
    assert "alibi" not in plotted(fig.axes[1])  # its loss is unknown


def test_metric_points_writes_the_png(tmp_path):
    out = results.metric_points(["acc", "loss", "time"],
                                {"rope": [(1, 0.1), (2, 0.2), (3, None)],
                                 "alibi": [(1.2, 0.1), (float("nan"), None), (2.5, 0.3)]},
                                tmp_path / "sub" / "points.png", ylabels=["a", "b", "c"])
    assert out == tmp_path / "sub" / "points.png"
    assert_png(out, (540, 3 * 420))  # 3 panels of 2.8 × 3.6 inches at 150 dpi


def test_bad_results_are_named():
    with pytest.raises(ValueError, match="'rope' has 2 cells, one per column \\(3\\)"):
        results.draw_metric_lines(["a", "b", "c"], {"rope": [(1, 0), (2, 0)]}, xlabel="",
                                  ylabel="")
    with pytest.raises(ValueError, match="sd must be >= 0"):
        results.draw_metric_lines(["a"], {"rope": [(1, -0.1)]}, xlabel="", ylabel="")
    with pytest.raises(ValueError, match="each cell must be \\(mean, sd\\)"):
        results.draw_metric_lines(["a"], {"rope": [1.0]}, xlabel="", ylabel="")
    with pytest.raises(ValueError, match="at least one column"):
        results.draw_metric_lines([], {}, xlabel="", ylabel="")
    with pytest.raises(ValueError, match="one label per panel"):
        results.draw_metric_points(["a", "b"], {"rope": [(1, 0), (2, 0)]}, ylabels=["a"])
    with pytest.raises(ValueError, match="one per panel"):
        results.draw_metric_points(["a", "b"], {"rope": [(1, 0)]}, ylabels=["a", "b"])


def test_results_figures_need_no_pyplot():
    """Drawing and saving go through mmpe.plot.style's Figure objects: no pyplot state."""
    code = ("import sys; from mmpe.plot import results\n"
            "assert 'matplotlib' not in sys.modules\n"
            "fig = results.draw_metric_lines(['a'], {'x': [(1, 0.1)]}, xlabel='', ylabel='')\n"
            "assert 'matplotlib.pyplot' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_metric_lines_bands_replace_error_bars() -> None:
    """`bands=True`: the sd is a shaded band per series (a PolyCollection), no error bars."""
    from mmpe.plot.results import draw_metric_lines

    series = {"rope": [(3.0, 0.1), (3.5, 0.2)], "alibi": [(3.0, None), (3.1, None)]}
    fig = draw_metric_lines(["1x", "2x"], series, xlabel="x", ylabel="y", bands=True)
    ax = fig.axes[0]
    assert len(ax.collections) == 1  # rope's band; alibi has no sd
    assert all(not c.has_yerr for c in ax.containers)
    lower = ax.collections[0].get_paths()[0].vertices[:, 1].min()
    assert abs(lower - 2.9) < 1e-9
