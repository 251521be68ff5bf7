"""Tables: the feature columns of a dataset as tokens, placed on a feature graph (Tab-PET).

A tabular transformer (FT-Transformer, Gorishniy et al. 2021) reads one token per feature
column, plus an optional `[CLS]` token. The columns have no natural order, so Tab-PET
(Leng, Ghosh & Motani 2025, "Tab-PET: Graph-Based Positional Encodings for Tabular
Transformers", AAAI 2026) gives them a geometry: a **feature graph** estimated from the
*training rows only*, whose nodes are the columns and whose edge weights measure how strongly
two columns depend on each other. From that graph [`Table`][mmpe.coords.table.Table] holds

* **positions** — Laplacian eigenvectors of the feature graph (`spectral_positions`, Tab-PET's
  PE, read by the `tabpet` input encoding, which scales them by `alpha` and concatenates
  them), and
* **distances** — shortest-path hops in the (sparsified) feature graph, so that every score
  encoding written for sequences (ALiBi, T5 buckets, FIRE) also runs on tables.

The maths are functions of [`mmpe.table_maths`][mmpe.table_maths] (re-exported here): [`feature_graph`][mmpe.table_maths.feature_graph]
(|Pearson|, |Spearman| or mutual information), [`sparsify_graph`][mmpe.table_maths.sparsify_graph] (k-NN or threshold),
[`feature_spectrum`][mmpe.table_maths.feature_spectrum] (low/high-frequency Laplacian eigenvectors) and [`feature_hops`][mmpe.table_maths.feature_hops].
[`Table.from_data`][mmpe.coords.table.Table.from_data] chains them on training rows; [`Table`][mmpe.coords.table.Table] itself lays the results
out as tokens (`[CLS]` first) and answers the `Metric` and `FeatureGraph` protocols.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.table_maths import (
    GRAPH_METHODS,
    abs_pearson,
    abs_spearman,
    feature_graph,
    feature_hops,
    feature_spectrum,
    mutual_information,
    sparsify_graph,
)

__all__ = ["GRAPH_METHODS", "Table", "abs_pearson", "abs_spearman", "feature_graph",
           "feature_hops", "feature_spectrum", "mutual_information", "sparsify_graph"]


class Table(Coordinates):
    """Feature columns as tokens on a feature graph (units: positions dimensionless, hops).

    Tokens are `[CLS]` (index 0, when `cls_token`) followed by the `f` feature columns in
    the order of the table. One graph serves every row, so positions are shared across the
    batch (`batch_size` is None).

    * `spectral_positions`: `[n_tokens, a]` float32 with
      `a = k + k_high`: the feature's entries in the `k` smallest non-trivial and the
      `k_high` largest Laplacian eigenvectors (sign convention of
      [`mmpe.graph_maths.canonical_sign`][mmpe.graph_maths.canonical_sign]); the `[CLS]` row is zero. Unscaled: the
      `tabpet` encoding applies `alpha`.
    * `distance(q, k)`: hops between the two features in the sparsified
      graph (float32); features in different components are `f` hops apart (one more than any
      path can be, its own value); `[CLS]` is `cls_distance` from every token (0 from
      itself).
    * `extent`: the graph diameter (largest finite hop count, at least 1), FIRE's normaliser.
    * `prefix_tokens`: 1 with `[CLS]`, else 0.
    * Capabilities: `Metric`, `FeatureGraph` and `Prefixed`. Eigenvector entries are not
      a geometry (their signs are a convention), so a table is not `Positioned`.

    Build it from training rows with [`from_data`][mmpe.coords.table.Table.from_data], or from a ready adjacency.

    Args:
        adjacency: `[f, f]` symmetric non-negative feature-graph weights (numpy, torch or
            scipy.sparse).
        k: low-frequency eigenvectors (`>= 0`).
        k_high: high-frequency eigenvectors (`>= 0`); `1 <= k + k_high <= f − 1`.
        normalization: `"sym"` (`I − D^-½ A D^-½`, Tab-PET) or `None` (`D − A`).
        cls_token: prepend a `[CLS]` token.
        cls_distance: hops between `[CLS]` and any feature (`>= 0`).
        feature_names: optional column names (length `f`), for reports.
        device: where the tensors live.

    Raises:
        ValueError: bad adjacency (see [`mmpe.graph_maths.laplacian_eigenvectors`][mmpe.graph_maths.laplacian_eigenvectors]),
            `k`/`k_high` out of range, negative `cls_distance`, wrong number of names.
    """

    kind = "table"

    def __init__(
        self,
        adjacency: object,
        *,
        k: int = 4,
        k_high: int = 0,
        normalization: str | None = "sym",
        cls_token: bool = False,
        cls_distance: float = 0.0,
        feature_names: Seq[str] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        import scipy.sparse as sp

        a = adjacency.toarray() if sp.issparse(adjacency) else adjacency
        a = np.array(a.detach().cpu().numpy() if isinstance(a, Tensor) else a, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"Table: adjacency must be square [f, f], got {a.shape}")
        f = a.shape[0]
        if f < 2:
            raise ValueError(f"Table: a table needs at least 2 feature columns, got {f}")
        if cls_distance < 0:
            raise ValueError(f"Table: cls_distance must be >= 0 (hops), got {cls_distance}")
        if feature_names is not None and len(feature_names) != f:
            raise ValueError(f"Table: feature_names must have {f} names, got {len(feature_names)}")
        np.fill_diagonal(a, 0.0)
        vals, vecs = feature_spectrum(a, k, k_high, normalization)
        self.k, self.k_high, self.normalization = int(k), int(k_high), normalization
        self.cls_token, self.cls_distance = bool(cls_token), float(cls_distance)
        self.num_features = f
        self.feature_names = list(feature_names) if feature_names is not None else None
        hops = feature_hops(a)
        finite = np.isfinite(hops)
        self.diameter = float(max(1.0, hops[finite].max()))
        hops = np.where(finite, hops, float(f))
        c = int(self.cls_token)
        full = np.full((f + c, f + c), self.cls_distance)
        full[c:, c:] = hops
        if c:
            full[0, 0] = 0.0
        pos = np.zeros((f + c, vecs.shape[1]))
        pos[c:] = vecs
        self.adjacency = torch.as_tensor(a, dtype=torch.float32, device=device)
        self.eigenvalues = torch.as_tensor(vals, dtype=torch.float32, device=device)
        self.hops = torch.as_tensor(full, dtype=torch.float32, device=device)
        self._positions = torch.as_tensor(pos, dtype=torch.float32, device=device)

    @classmethod
    def from_data(
        cls,
        X_train: object,
        *,
        method: str = "spearman",
        categorical: Seq[int] = (),
        sparsify: str | None = "knn",
        knn: int = 4,
        threshold: float = 0.3,
        random_state: int = 0,
        **options: object,
    ) -> Table:
        """Estimate the feature graph from training rows and build the coordinates.

        `X_train` must hold the training rows only (no validation/test rows: the encoding is
        then a function of the training data alone). Column names are taken from a pandas
        `DataFrame`. `method`/`categorical`/`random_state` go to [`feature_graph`][mmpe.table_maths.feature_graph],
        `sparsify`/`knn`/`threshold` to [`sparsify_graph`][mmpe.table_maths.sparsify_graph], the other `options`
        (`k`, `k_high`, `normalization`, `cls_token`, `cls_distance`, `device`) to
        [`Table`][mmpe.coords.table.Table].
        """
        if "feature_names" not in options and hasattr(X_train, "columns"):
            options["feature_names"] = [str(c) for c in X_train.columns]
        weights = feature_graph(X_train, method, categorical=categorical, random_state=random_state)
        adjacency = sparsify_graph(weights, sparsify, knn=knn, threshold=threshold)
        return cls(adjacency, **options)  # type: ignore[arg-type]

    def to(self, device: torch.device | str) -> Table:
        """The same coordinates with every tensor on `device` (a shallow copy)."""
        new = object.__new__(Table)
        new.__dict__.update(self.__dict__)
        for name in ("adjacency", "eigenvalues", "hops", "_positions"):
            setattr(new, name, getattr(self, name).to(device))
        return new

    @property
    def num_tokens(self) -> int:
        """`f` plus one for `[CLS]`."""
        return self.num_features + int(self.cls_token)

    @property
    def num_queries(self) -> int:
        return self.num_tokens

    @property
    def prefix_tokens(self) -> int:
        """Tokens before the features: 1 with `[CLS]`, else 0 (the `Prefixed` capability)."""
        return int(self.cls_token)

    @property
    def device(self) -> torch.device:
        """Where the coordinates' tensors live."""
        return self.hops.device

    @property
    def spectral_positions(self) -> Tensor:
        """`[n_tokens, k + k_high]` Laplacian-eigenvector entries (`[CLS]` row zero)."""
        return self._positions

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hops between the tokens in the feature graph, float32 (see the class docstring)."""
        return self.hops[q_idx, kv_idx]

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The feature graph's diameter in hops (same for every query), float32."""
        return torch.full(q_idx.shape, self.diameter, dtype=torch.float32, device=q_idx.device)

    def __repr__(self) -> str:
        return (f"Table(features={self.num_features}, k={self.k}, k_high={self.k_high}, "
                f"normalization={self.normalization!r}, cls_token={self.cls_token}, "
                f"edges={int((self.adjacency > 0).sum()) // 2})")
