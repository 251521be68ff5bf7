"""Figures of positional encodings: look at an encoding instead of reading its formula.

One function per kind of figure; each takes built encodings (or registry names) and
coordinates, returns a `matplotlib.figure.Figure` and, given `path`, writes a PNG there.
Figures are drawn with matplotlib's object API (no `pyplot`, no global backend: PNGs are
rendered by Agg), and matplotlib is imported inside the functions, so `import mmpe` does not
need it.

| function | figure | encodings |
| --- | --- | --- |
| [`plot_input_matrix`][mmpe.plot.figures.plot_input_matrix] | `P` as a heatmap, positions × dims | input |
| [`plot_similarity`][mmpe.plot.figures.plot_similarity] | cosine similarity of position vectors (on a grid: one map per patch, ViT Fig. 7) | input; on a 2D grid one small map per patch |
| [`plot_bias_vs_distance`][mmpe.plot.figures.plot_bias_vs_distance] | the bias against distance, a line per head | score (ALiBi, T5, KERPLE, FIRE …) |
| [`plot_bias_row`][mmpe.plot.figures.plot_bias_row] | the bias of one query against every key (FIRE's figure of learned biases) | score, e.g. read from a trained checkpoint ([`load_encoding`][mmpe.checkpoints.load_encoding]) |
| [`plot_rotary_decay`][mmpe.plot.figures.plot_rotary_decay] | rotated `q·k` against relative distance (RoPE's long-range decay) | rotary, several overlaid |
| [`plot_sphere`][mmpe.plot.sphere.plot_sphere] | components on a world map | input on the sphere |
| [`plot_graph_eigenvectors`][mmpe.plot.graph.plot_graph_eigenvectors] | a molecule coloured by its Laplacian eigenvectors | graphs (LapPE) |

[`plot_command`][mmpe.plot.command.plot_command] is `mmpe plot NAME`: it picks the figures from the encoding's hook and
the capabilities it needs, builds coordinates, and writes the PNGs.
[`metric_lines`][mmpe.plot.results.metric_lines] and [`metric_points`][mmpe.plot.results.metric_points] draw stored experiment results instead.

The package, by idea (each name is importable from `mmpe.plot` itself):

| module | holds |
| --- | --- |
| [`mmpe.plot.style`][mmpe.plot.style] | the one figure layer: new figures, saving PNGs, colours, `show` |
| [`mmpe.plot.figures`][mmpe.plot.figures] | the matrix, similarity, bias, bias-row and rotary-decay figures |
| [`mmpe.plot.sphere`][mmpe.plot.sphere] | world maps of sphere encodings |
| [`mmpe.plot.graph`][mmpe.plot.graph] | graphs coloured by their Laplacian eigenvectors |
| [`mmpe.plot.gallery`][mmpe.plot.gallery] | what one query sees of every key (the docs' modality figures, the attention gallery) |
| [`mmpe.plot.results`][mmpe.plot.results] | stored experiment results: a metric `mean ± sd` per encoding |
| [`mmpe.plot.command`][mmpe.plot.command] | `mmpe plot`: its options, the figures and coordinates it picks |
| [`mmpe.plot.legibility`][mmpe.plot.legibility] | whether a drawn figure's text reads: inside, not overlapping, tall enough |

Encodings from training checkpoints come from [`mmpe.checkpoints`][mmpe.checkpoints]
([`load_encoding`][mmpe.checkpoints.load_encoding]), molecules from SMILES from [`mmpe.molecules`][mmpe.molecules]
([`molecule_graph`][mmpe.molecules.molecule_graph]).

    >>> import mmpe
    >>> from mmpe import plot
    >>> fig = plot.plot_similarity(mmpe.build("sinusoidal", d_model=128), mmpe.Sequence(128),
    ...                            path="sinusoidal_similarity.png")           # doctest: +SKIP
"""

from mmpe.checkpoints import load_encoding
from mmpe.molecules import DEFAULT_SMILES, molecule_graph
from mmpe.plot.command import KINDS, parse_option, plot_command
from mmpe.plot.figures import (
    plot_bias_row,
    plot_bias_vs_distance,
    plot_input_matrix,
    plot_rotary_decay,
    plot_similarity,
)
from mmpe.plot.gallery import (
    plot_bias_gallery,
    plot_distance_kernels,
    plot_feature_graph,
    plot_molecule_positions,
    plot_query_maps,
    plot_sphere_maps,
    query_values,
)
from mmpe.plot.graph import plot_graph_eigenvectors
from mmpe.plot.legibility import text_problems
from mmpe.plot.results import (
    draw_metric_lines,
    draw_metric_points,
    metric_lines,
    metric_points,
)
from mmpe.plot.sphere import plot_sphere
from mmpe.plot.style import DPI, show

__all__ = [
    "DEFAULT_SMILES", "DPI", "KINDS", "draw_metric_lines", "draw_metric_points", "load_encoding",
    "metric_lines", "metric_points", "molecule_graph", "parse_option", "plot_bias_gallery",
    "plot_bias_row", "plot_bias_vs_distance", "plot_command", "plot_distance_kernels",
    "plot_feature_graph", "plot_graph_eigenvectors", "plot_input_matrix",
    "plot_molecule_positions", "plot_query_maps", "plot_rotary_decay", "plot_similarity",
    "plot_sphere", "plot_sphere_maps", "query_values", "show", "text_problems",
]
