"""The docs' figures and the attention gallery page, drawn at build time (mkdocs-gen-files).

`make docs` runs this before the pages are read: every PNG under `img/gen/` and the page
`gallery.md` exist only in the built site, drawn from the stored runs in `results/*.jsonl` and
from closed forms or freshly built encodings (seeded, no training), in about 15 s on one core.
A page shows a figure as `![...](img/gen/NAME.png)`; tests/package/test_docs_site.py checks that each
modality page has its figure.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path

import mkdocs_gen_files
import numpy as np
import torch
from matplotlib.image import imsave

import mmpe
from mmpe import registry
from mmpe.plot import gallery
from mmpe.plot.legibility import COLUMN_PX, text_problems
from mmpe.plot.results import draw_metric_lines
from mmpe.plot.style import DPI

ROOT = Path(__file__).resolve().parent.parent
#: What every encoding of a figure is built with (each takes the keys it declares).
CONTEXT = {"d_model": 96, "num_heads": 4, "head_dim": 24, "max_len": 1024}


def build(name: str, **context) -> object:
    """An encoding by registry name, seeded so that learned tables are the same every build."""
    torch.manual_seed(0)
    entry = registry.get(name)
    ctx = {k: v for k, v in {**CONTEXT, **context}.items() if k in entry.context}
    return registry.build(name, context=ctx)


#: Per figure: its PNG width, its panels and its smallest text in pixels as displayed in the
#: column; written to img/gen/label_sizes.json for tests/package/test_docs_site.py.
SIZES: dict[str, dict[str, float]] = {}


#: Per figure: what its drawn text gets wrong (`mmpe.plot.legibility.text_problems`); the build
#: fails on any, after every figure is drawn (so one build names them all).
PROBLEMS: dict[str, list[str]] = {}


def label_sizes(fig: object, png: bytes) -> dict[str, float]:
    """The figure's PNG width, its panels (axes with an image or lines, colour bars left out)
    and the height in display pixels of its smallest visible text (font size in points at
    the saving DPI, scaled to the column width)."""
    from matplotlib.text import Text

    width = int.from_bytes(png[16:20], "big")  # the PNG header's IHDR width
    scale = min(1.0, COLUMN_PX / width)
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_figure() is not None]
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    return {"width_px": width, "panels": len(panels),
            "min_label_px": round(min(sizes) * DPI / 72 * scale, 2) if sizes else 0.0}


#: The smallest font, in points, a figure keeps: 10 px at the column's width and DPI.
MIN_POINTS = 7.5


def fit_column(fig: object) -> None:
    """A figure wider than the column is redrawn at the column's width (same aspect ratio;
    constrained layout reflows the panels) and no text stays below `MIN_POINTS`, so labels
    are not scaled down below 10 px where the page shows them."""
    from matplotlib.text import Text

    width, height = fig.get_size_inches()
    column = COLUMN_PX / DPI
    if width > column:
        fig.set_size_inches(column, height * column / width)
    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_POINTS:
            text.set_fontsize(MIN_POINTS)


def write(name: str, draw: Callable[[], object]) -> None:
    """Draw a figure and store it as img/gen/NAME.png in the built site."""
    start = time.perf_counter()
    fig = draw()
    fit_column(fig)
    PROBLEMS[name] = text_problems(fig, dpi=DPI, column_px=COLUMN_PX)
    # the check drew the figure (Agg, at DPI): its pixels are the PNG (savefig would draw again,
    # a fifth of the figures' time)
    buf = io.BytesIO()
    imsave(buf, np.asarray(fig.canvas.buffer_rgba()), format="png", dpi=DPI)
    with mkdocs_gen_files.open(f"img/gen/{name}.png", "wb") as f:
        f.write(buf.getvalue())
    SIZES[name] = label_sizes(fig, buf.getvalue())
    print(f"gen_figures: img/gen/{name}.png in {time.perf_counter() - start:.1f} s "
          f"({SIZES[name]['min_label_px']} px labels at {COLUMN_PX} px)")


def _series(recipe: str, setting: str = "default") -> tuple[object, dict]:
    """The recipe's compare spec and `{encoding: [(mean, sd) per column]}` from results/."""
    from mmpe.recipes.compare import recipe_spec

    from mmpe.results.report import series

    spec = recipe_spec(recipe)
    records = [json.loads(line) for line in (ROOT / "results" / f"{recipe}.jsonl").open()]
    return spec, series(spec, records, setting)


def text_length() -> object:
    spec, rows = _series("text")
    return draw_metric_lines(spec.columns, rows, xlabel=spec.xlabel, bands=True,
                             ylabel=f"test {spec.metric} (lower is better)",
                             title=spec.title)


def multimodal_results() -> object:
    spec, rows = _series("multimodal")
    return draw_metric_lines(spec.columns, rows, xlabel=spec.xlabel, bands=True,
                             ylabel=f"{spec.metric} (higher is better)", title=spec.title)


def grid_bias() -> object:
    shape = (14, 14)
    encs = {n: build(n, grid_shape=shape) for n in ("alibi", "swin", "rope_axial", "sincos")}
    return gallery.plot_query_maps(encs, mmpe.Grid(shape))


def video_slices() -> object:
    shape = (4, 8, 8)
    encs = {n: build(n, grid_shape=shape) for n in ("sincos", "rope_axial", "alibi")}
    return gallery.plot_query_maps(encs, mmpe.Grid(shape))


def sphere_map() -> object:
    names = ("spherical_harmonics", "sphere_c_plus", "latlon_sincos", "fourier_sphere",
             "rope_sphere", "alibi")
    return gallery.plot_sphere_maps({n: build(n) for n in names})


def table() -> mmpe.Table:
    """Two groups of three correlated columns and two noise columns, as on the Tables page."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 1)), rng.normal(size=(300, 1))
    x = np.hstack([a + 0.1 * rng.normal(size=(300, 3)), b + 0.1 * rng.normal(size=(300, 3)),
                   rng.normal(size=(300, 2))])
    names = ["a1", "a2", "a3", "b1", "b2", "b3", "noise1", "noise2"]
    return mmpe.Table.from_data(x, method="pearson", knn=2, feature_names=names)


def table_feature_graph() -> object:
    return gallery.plot_feature_graph(table())


#: Coordinates of each type the gallery draws the score encodings on (small: a panel each).
def gallery_coordinates() -> dict[str, object]:
    from mmpe.molecules import DEFAULT_SMILES, molecule_graph

    torch.manual_seed(0)
    return {
        "sequence": mmpe.Sequence(24, causal=True),
        "grid": mmpe.Grid((5, 5)),
        "points": mmpe.Points(torch.randn(16, 3) * 1.5, units="Å"),
        "sphere": mmpe.Sphere.grid(4, 8),
        "graph": molecule_graph(DEFAULT_SMILES),
        "table": table(),
    }


def trained_attention() -> list[str]:
    """The gallery's first section: attention maps of the trained text models, drawn from
    `results/attention/text.npz` (written by `python -m mmpe.results.attention_maps`)."""
    path = ROOT / "results" / "attention" / "text.npz"
    data = np.load(path)
    meta = json.loads(str(data["meta"]))
    names = list(meta["runs"])
    heads = {n: meta["runs"][n]["heads"] for n in names}
    # A few encodings per figure, so that labels stay readable at the column's width.
    groups = [names[i:i + 3] for i in range(0, len(names), 3)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2:] = [groups[-2][:2], groups[-2][2:] + groups[-1]]
    figures = []
    for i, group in enumerate(groups, 1):
        write(f"gallery_trained_text_{i}", lambda g=group: gallery.plot_trained_attention(
            {n: data[n] for n in g}, heads={n: heads[n] for n in g}))
        figures += [f"![Attention of the trained {', '.join(group)} text models]"
                    f"(img/gen/gallery_trained_text_{i}.png)", ""]
    steps = sorted({meta["runs"][n]["step"] for n in names})
    return ["## Trained models: the text recipe", "",
            f"The seven main-job models of `make run` ({', '.join(f'`{n}`' for n in names)}; "
            f"seed {meta['seed']}, {', '.join(map(str, steps))} steps) read the same held-out "
            f"passage of {data[names[0]].shape[-1]} characters, the training context:", "",
            f"```text\n{str(data['text'])}\n```", "",
            "Each column is one encoding, each row a layer; in every layer the head shown is the "
            "one whose attention is most concentrated (lowest mean entropy over queries). Query "
            "down, key across; the colour scale is a square root, so weak long-range attention "
            "stays visible. Drawn at build time from `results/attention/text.npz`, which "
            "`python -m mmpe.results.attention_maps --seed 1` writes from the checkpoints of "
            "`mmpe compare text` (the recipe's stored runs).", "",
            *figures]


def _constant_bias(enc, coords) -> bool:
    """Whether the bias is one value on every allowed pair and head (a zero-initialised table)."""
    from mmpe.plot.figures import _score_terms

    heads = enc.num_heads if isinstance(getattr(enc, "num_heads", None), int) else 4
    bias, allowed = _score_terms("gallery", enc, coords, heads)
    values = bias[:, allowed]
    return values.size > 0 and float(values.max() - values.min()) == 0.0


def gallery_page() -> None:
    """gallery.md: trained attention maps, then a figure per coordinate type with every score
    encoding that runs on it."""
    lines = ["# Attention gallery", "", *trained_attention(), "## Content-free biases", "",
             "What each score encoding adds to the attention logits before any content is seen: "
             "the bias `[query, key]` (mean over 4 heads) of every registered score encoding, "
             "on each coordinate type it supports, as built (seed 0, untrained: learned tables "
             "such as T5's, Swin's or Graphormer's start near zero and random). Rows are "
             "queries, columns keys; blank cells are masked (causal sequences). Drawn at build "
             "time from the registry (`mmpe.available(coords=...)`), so a new encoding appears "
             "here by itself. Click a figure to enlarge it.", ""]
    for kind, coords in gallery_coordinates().items():
        names = [e.name for e in mmpe.available(hook="score", coords=coords)]
        encs, content, flat = {}, [], []
        for name in names:
            shape = {"grid_shape": coords.shape} if isinstance(coords, mmpe.Grid) else {}
            enc = build(name, **shape)
            if not gallery.has_position_bias(enc, coords):
                content.append(name)
            elif _constant_bias(enc, coords):
                flat.append(name)  # a table that starts at zero: one colour, nothing to see
            else:
                encs[name] = enc
        lines += [f"### {type(coords).__name__}", "", f"`{coords!r}`: {len(names)} score "
                  f"encodings, {len(encs)} drawn."
                  + (f" Not drawn: {', '.join(f'`{n}`' for n in content)}, whose term is "
                     "computed from the queries and keys (there is no bias without a model)."
                     if content else "")
                  + (f" Not drawn: {', '.join(f'`{n}`' for n in flat)}, whose learned table "
                     "starts at zero here (a constant bias until trained)." if flat else ""), ""]
        # six panels a figure (three columns): labels readable at the column's width
        # (balanced: seven panels are four and three, not six and a lone one)
        items = list(encs.items())
        parts = max(1, -(-len(items) // 6))
        size = -(-len(items) // parts)
        chunks = [dict(items[i:i + size]) for i in range(0, len(items), size)]
        for i, chunk in enumerate(chunks, 1):
            write(f"gallery_{kind}_{i}", lambda e=chunk, c=coords: gallery.plot_bias_gallery(
                e, c, cols=3))
            lines += [f"![Bias of {', '.join(chunk)} on {kind}](img/gen/gallery_{kind}_{i}.png)",
                      ""]
    lines += ["Rotary and input encodings have no bias matrix; what one query sees through them "
              "is on the modality pages ([grids](grids.md), [the sphere](sphere.md)).", ""]
    with mkdocs_gen_files.open("gallery.md", "w") as f:
        f.write("\n".join(lines))


FIGURES: dict[str, Callable[[], object]] = {
    "text_length": text_length,
    "grid_bias": grid_bias,
    "video_slices": video_slices,
    "graph_molecule": lambda: gallery.plot_molecule_positions(mmpe.plot.DEFAULT_SMILES),
    "table_feature_graph": table_feature_graph,
    "sphere_map": sphere_map,
    "geometry_kernels": gallery.plot_distance_kernels,
    "multimodal_results": multimodal_results,
}

for _name, _draw in FIGURES.items():
    write(_name, _draw)
gallery_page()
with mkdocs_gen_files.open("img/gen/label_sizes.json", "w") as _f:
    json.dump(SIZES, _f, indent=1, sort_keys=True)
_bad = {name: found for name, found in PROBLEMS.items() if found}
if _bad:
    raise RuntimeError("figures whose text does not read at the column's width:\n" + "\n".join(
        f"  img/gen/{name}.png: {line}" for name, found in _bad.items() for line in found))
