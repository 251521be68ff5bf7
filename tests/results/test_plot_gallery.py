"""mmpe.plot.gallery: what one query sees, and the docs' figures drawn from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

import mmpe
from mmpe.plot import gallery
from mmpe.plot.figures import _score_terms


@pytest.mark.parametrize("coords", [mmpe.Sequence(12, causal=True), mmpe.Grid((4, 5)),
                                    mmpe.Sphere.grid(4, 6)], ids=["sequence", "grid", "sphere"])
def test_bias_row_equals_the_full_matrix_row(coords) -> None:
    enc = mmpe.build("alibi", num_heads=4)
    bias, allowed = _score_terms("test", enc, coords, 4)
    for query in (0, coords.num_keys // 2, coords.num_keys - 1):
        want = np.where(allowed[query], bias[:, query].mean(0), np.nan)
        np.testing.assert_allclose(gallery.query_values(enc, coords, query), want, atol=1e-6)


def test_alibi_row_is_minus_mean_slope_times_distance() -> None:
    enc = mmpe.build("alibi", num_heads=8)
    row = gallery.query_values(enc, mmpe.Grid((5, 5)), 12)  # the middle cell
    slope = float(enc.slopes.mean())
    assert row[12] == 0
    assert math.isclose(row[0], -slope * math.hypot(2, 2), rel_tol=1e-5)


def test_causal_mask_leaves_future_keys_blank() -> None:
    row = gallery.query_values(mmpe.build("alibi", num_heads=4), mmpe.Sequence(6, causal=True), 2)
    assert np.isnan(row[3:]).all() and not np.isnan(row[:3]).any()


def test_rotary_and_input_values_peak_at_the_query() -> None:
    grid = mmpe.Grid((6, 6))
    rope = mmpe.build("rope_axial", head_dim=16)
    sincos = mmpe.build("sincos", d_model=32)
    for enc in (rope, sincos):
        values = gallery.query_values(enc, grid, 14)
        assert math.isclose(values[14], 1.0, rel_tol=1e-5)  # cos 0 / unit cosine
        assert values.max() <= 1.0 + 1e-5


def test_kernel_encodings_are_refused() -> None:
    entry = mmpe.available(hook="kernel")[0]
    enc = mmpe.build(entry.name, context={k: 4 for k in ("num_heads", "head_dim")
                                          if k in entry.context})
    with pytest.raises(ValueError, match="replaces the softmax"):
        gallery.query_values(enc, mmpe.Sequence(4, causal=True), 0)


def test_query_maps_panels(tmp_path) -> None:
    encs = {n: mmpe.build(n, num_heads=4) for n in ("alibi", "t5")}
    fig = gallery.plot_query_maps(encs, mmpe.Grid((3, 4, 4)), path=tmp_path / "v.png")
    assert len([ax for ax in fig.axes if ax.images]) == 2 * 3  # a row per encoding, a frame each
    assert (tmp_path / "v.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="prefix tokens"):
        gallery.plot_query_maps(encs, mmpe.Grid((4, 4), prefix_tokens=1))


def test_bias_gallery_marks_content_dependent_encodings() -> None:
    encs = {"alibi": mmpe.build("alibi", num_heads=4),
            "shaw": mmpe.build("shaw", head_dim=8, max_relative_position=4)}
    fig = gallery.plot_bias_gallery(encs, mmpe.Sequence(6, causal=True))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["needs queries\nand keys"]


def test_distance_kernels_vanish_past_the_cutoff() -> None:
    fig = gallery.plot_distance_kernels(cutoff=4.0)
    for ax in fig.axes[1:]:  # radial_gaussian, radial_bessel: smooth cutoff at 4 Å
        for line in ax.lines[:-1]:  # the last line is the cutoff marker
            x, y = line.get_data()
            assert np.abs(y[x > 4.0]).max() < 1e-6


@pytest.mark.parametrize("name", ["t5", "fire", "kerple_log", "swin"])
def test_a_query_row_is_the_door_s_bias_row(name) -> None:
    """The map of one query reads the bias the attention layers add (`dense_bias`'s row,
    mean over heads), not its own evaluation of `score_mod` (issue 56)."""
    coords = mmpe.Grid((4, 5)) if name == "swin" else mmpe.Sequence(12)
    context = {"num_heads": 3, "max_len": 32, **mmpe.context.coords_context(coords)}
    enc = mmpe.build(name, context=context)
    ctx = mmpe.encodings.base.AttentionCall(coords, 3, 8, 1)
    with torch.no_grad():
        want = mmpe.attention.dense_bias([enc], ctx)[0, :, 7].double().mean(0).numpy()
    np.testing.assert_allclose(gallery.query_values(enc, coords, 7), want, rtol=0, atol=1e-6)


def test_a_content_dependent_term_has_no_query_row() -> None:
    enc = mmpe.build("cope", context={"num_heads": 2, "head_dim": 8})
    with pytest.raises(ValueError, match="computed from the queries and keys"):
        gallery.query_values(enc, mmpe.Sequence(6, causal=True), 2)
