"""Tab-PET: graph-based positional encodings for tabular transformers (Leng et al. 2025)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import FeatureGraph, Prefixed
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register


def tabpet_table(eigvecs: Tensor, alpha: float, *, standardize: bool = True,
                 clip: float | None = 10.0) -> Tensor:
    """`α · clip(z(V))`: Tab-PET's fixed encoding of the feature columns.

    `z` standardises every eigenvector (column of `V`) over the features to zero mean and
    unit (unbiased) standard deviation, a column of zero spread left unscaled; `clip` bounds
    the entries to `[−clip, clip]` (both as in the authors' reference code, Leng et al. 2025).

    Args:
        eigvecs: `V [f, a]`: the features' entries in `a` Laplacian eigenvectors.
        alpha: scale `α >= 0` (`α = 0` is the no-PE baseline with the same width).
        standardize: apply `z`.
        clip: bound (`None`: no clipping).

    Returns:
        `[f, a]` float32.
    """
    v = eigvecs.to(torch.float32)
    if standardize and v.shape[0] > 1:
        std = v.std(dim=0, keepdim=True)
        v = (v - v.mean(dim=0, keepdim=True)) / torch.where(std > 0, std, torch.ones_like(std))
    if clip is not None:
        v = v.clamp(-clip, clip)
    return alpha * v


@register(
    "tabpet", hook="input", needs=(FeatureGraph,), learnable=False, family="spectral",
    aliases=("tab_pet",),
    paper="Leng, Ghosh & Motani 2025, Tab-PET: Graph-Based Positional Encodings for Tabular "
          "Transformers (AAAI 2026, arXiv:2511.13338)", context=("d_model",))
class TabPET(SavesSettings, InputEncoding):
    """Feature-graph Laplacian eigenvectors, scaled by `α` and concatenated to the tokens.

    Tab-PET (Leng et al. 2025) estimates a graph over the feature columns from the training
    rows (|Spearman| works best in the paper), takes eigenvectors `V` of its normalised
    Laplacian `L = I − D^-½ A D^-½` (the [`mmpe.coords.Table`][mmpe.coords.table.Table] coordinates hold them:
    `k` low- and optionally `k_high` high-frequency ones) and feeds every feature token

        `h_j = [ e_j  ‖  α · clip(z(V)_j) ‖ 0 ]`

    — its embedding `e_j` concatenated with its fixed, scaled PE row (`"concat_fixed"` in
    the reference code; [`tabpet_table`][mmpe.encodings.tabpet.tabpet_table]), zero-padded to `width` channels. The
    `[CLS]` token gets zeros in the PE channels. The paper's analysis: the PE lowers the
    effective rank of the token embeddings, which helps generalisation on small tables.

    Width: the model runs at `d_model`; the token embeddings must have
    `input_width = d_model − width` channels (a FT-Transformer tokenizer of that width) and
    [`combine`][mmpe.encodings.tabpet.TabPET.combine] returns `[b, s, d_model]` with the PE in the last `width` channels.
    With `project=True` the embeddings keep `d_model` channels instead and a learned
    `Linear(d_model + width → d_model)` maps the concatenation back (then the encoding has
    parameters).

    Args:
        d_model: model width.
        width: PE channels `>= a` (the coordinates' `k + k_high`); extra channels are zero.
            Choose `d_model − width` as the tokenizer width (the reference pads so that the
            total divides the number of heads).
        alpha: scale `α >= 0` (the paper sweeps 0.05 … 10; 0 gives the baseline).
        standardize: z-score each eigenvector over the features (reference code).
        clip: bound of the standardised entries (10 in the reference code), or `None`.
        project: learn a projection back to `d_model` instead of narrowing the embeddings.

    Shapes: `forward(coords) -> [s, width]`; `combine(x [b, s, input_width], coords) ->
    [b, s, d_model]`.

    Raises:
        ValueError: `width` not in `[1, d_model − 1]`, negative `alpha`; at forward, more
            eigenvectors than `width`; in [`combine`][mmpe.encodings.tabpet.TabPET.combine], `x` of the wrong shape.
        TypeError: coordinates without the `FeatureGraph` capability (`spectral_positions`).
    """

    saved_settings = ("width", "alpha", "standardize", "clip")

    def __init__(self, d_model: int, width: int = 8, alpha: float = 1.0, standardize: bool = True,
                 clip: float | None = 10.0, project: bool = False) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model < 2:
            raise ValueError(f"tabpet: d_model must be an int >= 2, got {d_model!r}")
        if not isinstance(width, int) or not 1 <= width <= (d_model if project else d_model - 1):
            raise ValueError(f"tabpet: width must be an int in [1, {d_model - 1}] (PE channels), "
                             f"got {width!r}")
        if alpha < 0:
            raise ValueError(f"tabpet: alpha must be >= 0, got {alpha}")
        if clip is not None and clip <= 0:
            raise ValueError(f"tabpet: clip must be > 0 or None, got {clip}")
        self.d_model, self.width, self.alpha = d_model, width, float(alpha)
        self.standardize, self.clip, self.project = bool(standardize), clip, bool(project)
        self.proj = nn.Linear(d_model + width, d_model) if project else None

    @property
    def input_width(self) -> int:
        """Channels the token embeddings must have before [`combine`][mmpe.encodings.tabpet.TabPET.combine]."""
        return self.d_model if self.project else self.d_model - self.width

    def forward(self, coords: Coordinates) -> Tensor:
        """The PE channels of every token, `[s, width]`.

        Reads `spectral_positions` (`FeatureGraph`); when the coordinates are also
        `Prefixed`, their `prefix_tokens` leading rows (`[CLS]`) get zeros and the
        standardisation runs over the feature rows only.
        """
        self.check_coords(coords)
        pos = coords.spectral_positions
        a = pos.shape[-1]
        if a > self.width:
            raise ValueError(f"tabpet: the table has {a} eigenvectors (k + k_high) but width={self.width}; "
                             "build the encoding with width >= k + k_high")
        c = int(coords.prefix_tokens) if isinstance(coords, Prefixed) else 0
        out = torch.zeros(pos.shape[0], self.width, device=pos.device, dtype=torch.float32)
        out[c:, :a] = tabpet_table(pos[c:], self.alpha, standardize=self.standardize, clip=self.clip)
        return out

    def combine(self, x: Tensor, coords: Coordinates) -> Tensor:
        """Concatenate the PE to token embeddings `x [b, s, input_width]` → `[b, s, d_model]`."""
        pe = self(coords)
        if x.dim() != 3 or x.shape[1] != pe.shape[0] or x.shape[2] != self.input_width:
            raise ValueError(f"tabpet: x must be [b, {pe.shape[0]}, {self.input_width}] "
                             f"(d_model − width unless project=True), got {tuple(x.shape)}")
        out = torch.cat([x, pe.to(x.dtype).expand(x.shape[0], -1, -1)], dim=-1)
        return self.proj(out) if self.proj is not None else out
