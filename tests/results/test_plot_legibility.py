"""The drawn-text check (`mmpe.plot.legibility.text_problems`, issue 52): it finds clipped,
overlapping and too-small text on figures built to have them, and every figure kind `mmpe plot`
draws passes it. (The docs' figures are checked as the site is built: docs/gen_figures.py.)"""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe import plot
from mmpe.plot.legibility import text_problems
from mmpe.plot.style import DPI, new_figure, readable_on

pytest.importorskip("matplotlib")


def test_it_finds_overlapping_clipped_and_small_text() -> None:
    fig = new_figure(6.88, 2.0)
    ax = fig.add_subplot(1, 2, 1)
    ax.set_title("a long title that runs into the next panel's own title")
    fig.add_subplot(1, 2, 2).set_title("the next panel's title")
    fig.text(0.98, 0.5, "past the right edge")
    fig.text(0.02, 0.02, "tiny", fontsize=5)
    found = "\n".join(text_problems(fig))
    assert "overlaps" in found and "runs into" in found
    assert "'past the right edge' is cut off" in found
    assert "'tiny' is 6.9 px tall" in found


def test_a_wide_png_is_measured_at_the_column() -> None:
    """At 13 inches (1,300 px, shown at 688), 10-point text is 7.4 px: too small."""
    fig = new_figure(13, 2.0)
    fig.add_subplot(1, 1, 1).set_title("ten points", fontsize=10)
    assert any("'ten points' is 7.4 px" in p for p in text_problems(fig))
    fig = new_figure(6.88, 2.0)
    fig.add_subplot(1, 1, 1).set_title("ten points", fontsize=10)
    assert text_problems(fig) == []


def test_it_finds_text_over_a_colorbar_and_text_without_contrast() -> None:
    fig = new_figure(6.88, 2.4)
    fig.set_layout_engine("none")  # placed by hand: a colorbar that rises past the title
    ax = fig.add_axes((0.1, 0.1, 0.3, 0.6))
    image = ax.imshow([[0.0, 1.0], [1.0, 0.0]], cmap="Reds")
    fig.colorbar(image, cax=fig.add_axes((0.42, 0.1, 0.03, 0.85)))
    ax.set_title("a title wider than the image beside it")
    ax.text(1, 0, "dark", color="#400000", ha="center", va="center")  # on the dark cell
    found = "\n".join(text_problems(fig))
    assert "runs over another axes" in found
    assert "'dark' has contrast below 3:1" in found


def test_readable_text_on_a_dark_disc_passes() -> None:
    """Control: the same dark cell with white text, and a short title, pass."""
    fig = new_figure(6.88, 2.4)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow([[0.0, 1.0], [1.0, 0.0]], cmap="Reds")
    fig.colorbar(image, ax=ax)
    ax.set_title("short")
    ax.text(1, 0, "dark", color=readable_on(image.to_rgba(1.0)), ha="center", va="center")
    assert text_problems(fig) == []


def _table():
    """Two groups of three correlated columns and two noise columns (the docs' figure)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 1)), rng.normal(size=(300, 1))
    x = np.hstack([a + 0.1 * rng.normal(size=(300, 3)), b + 0.1 * rng.normal(size=(300, 3)),
                   rng.normal(size=(300, 2))])
    names = ["a1", "a2", "a3", "b1", "b2", "b3", "noise1", "noise2"]
    return mmpe.Table.from_data(x, method="pearson", knn=2, feature_names=names)


def _figures() -> dict[str, object]:
    torch.manual_seed(0)
    seq, grid = mmpe.Sequence(32), mmpe.Grid((6, 6))
    return {
        "matrix": lambda: plot.plot_input_matrix(mmpe.build("sinusoidal", d_model=32), seq),
        "similarity": lambda: plot.plot_similarity(mmpe.build("sinusoidal", d_model=32), seq),
        "grid similarity": lambda: plot.plot_similarity(
            mmpe.build("sincos", context={"d_model": 32, "grid_shape": (6, 6)}), grid),
        "bias": lambda: plot.plot_bias_vs_distance(mmpe.build("alibi", num_heads=4), seq),
        "bias row": lambda: plot.plot_bias_row(mmpe.build("alibi", num_heads=4), grid, 14),
        "decay": lambda: plot.plot_rotary_decay([mmpe.build("rope", head_dim=32)], 256),
        "query maps": lambda: plot.plot_query_maps(
            {n: mmpe.build(n, num_heads=4, grid_shape=(6, 6)) if n != "alibi" else
             mmpe.build(n, num_heads=4) for n in ("alibi", "swin", "alibi")}, grid),
        "distance kernels": plot.plot_distance_kernels,
    }


@pytest.mark.parametrize("kind", list(_figures()))
def test_every_figure_kind_reads(kind: str) -> None:
    """As `mmpe plot` writes them: shown at full size (the docs' figures, shown in the page's
    column, are checked at its width as the site is built)."""
    fig = _figures()[kind]()
    assert text_problems(fig, column_px=fig.get_size_inches()[0] * DPI) == [], kind


@pytest.mark.parametrize("kind", ["sphere maps", "feature graph"])
def test_the_map_and_graph_figures_keep_their_text_off_colorbars_and_dark_discs(kind) -> None:
    """The docs' sphere maps (a title ran under its colorbar) and feature graph (black names on
    dark discs, a name wider than its disc) at the docs' column (their sizes are checked as
    the site is built)."""
    draw = {"sphere maps": lambda: plot.plot_sphere_maps(
                {"spherical_harmonics": mmpe.build("spherical_harmonics", d_model=32),
                 "alibi": mmpe.build("alibi", num_heads=4)}),
            "feature graph": lambda: plot.plot_feature_graph(_table())}[kind]
    found = [p for p in text_problems(draw()) if "contrast" in p or "runs over" in p]
    assert found == [], kind
