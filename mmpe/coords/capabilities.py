"""Coordinate capabilities: the questions an encoding may ask its coordinates.

An encoding never asks *which* data type it runs on; it declares the capabilities it needs
(`register(..., needs=(Metric,))`) and any coordinate object that provides them qualifies,
including a class written outside mmpe. A capability is a small structural protocol: an object
provides it when its class (or the instance) defines every member the capability lists.
`isinstance(coords, Metric)` performs that check without calling anything, and
[`missing`][mmpe.coords.capabilities.missing] names what is absent, which is what the "unsupported coordinates" error prints.

| capability | members | read by |
| --- | --- | --- |
| `Metric` | `distance(q_idx, kv_idx, b)`, `extent(q_idx, b)` DA-Transformer | ALiBi, T5 (undirected), FIRE, KERPLE, |
| `Directed` | `relation(q_idx, kv_idx, b)` (signed), `causal` | Shaw, Transformer-XL, DeBERTa, T5 buckets |
| `Causal` | `Directed` with `causal` true | CoPE, FoX, stick-breaking |
| `Positioned` | `query_positions`, `key_positions`, `num_axes` M-RoPE | 2D/3D sincos, axial and mixed RoPE, |
| `Positioned1D` `Positioned` with `num_axes == 1` | sinusoidal, learned, RoPE family, xPos |  |
| `GridLayout` | `shape`, `prefix_tokens`, `grid_index` | learned ViT tables, factorized, Swin, SwinV2 |
| `GraphLayout` `spd`, `node_mask`, degrees, spectra | Graphormer, LapPE, RWSE |  |
| `Spherical` | `lat`, `lon` (radians) | spherical harmonics, Sphere2Vec, lat/lon |
| `FeatureGraph` `spectral_positions` | Tab-PET |  |

Conventions every implementation follows (`mmpe.testing.assert_coordinates_contract` checks
them): pairwise members take integer *index tensors that broadcast* — scalars inside
FlexAttention, `index_grid` tensors on the eager path — and use only tensor indexing and
elementwise operations. `distance` is a non-negative float (the coordinates' unit: tokens,
cells, hops, radians, ångström …) and `extent` bounds it. `relation` is `pos_q − pos_k`:
positive when the key lies *before* the query, so a causal mask is `relation >= 0`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

__all__ = [
    "Capability", "Causal", "Directed", "FeatureGraph", "GraphLayout", "GridLayout", "Metric", "Positioned",
    "Positioned1D", "Spherical", "defines", "missing", "provides",
]


def defines(obj_or_cls: Any, member: str) -> bool:
    """Whether `member` is defined without evaluating it (properties are not called)."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    for klass in cls.__mro__:
        if klass is object:
            continue
        if member in vars(klass) or member in vars(klass).get("__annotations__", {}):
            return True
    return not isinstance(obj_or_cls, type) and member in getattr(obj_or_cls, "__dict__", {})


class _CapabilityMeta(type):
    members: tuple[str, ...]

    def __instancecheck__(cls, obj: Any) -> bool:
        return not missing(obj, cls)

    def __subclasscheck__(cls, sub: type) -> bool:
        if not isinstance(sub, type):
            raise TypeError("issubclass() arg 1 must be a class")
        return not missing(sub, cls)

    def __repr__(cls) -> str:
        return cls.__name__


class Capability(metaclass=_CapabilityMeta):
    """Base of the capability protocols. `members` lists what a provider must define."""

    members: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        """Conditions beyond the members that `coords` fails (none for a plain protocol)."""
        return []


def missing(coords: Any, capability: type[Capability]) -> list[str]:
    """What `coords` lacks to provide `capability`.

    What `coords` (an object or a class) lacks to provide `capability`: absent members,
    then unmet conditions (e.g. `"num_axes == 1"`)."""
    absent = [m for m in capability.members if not defines(coords, m)]
    return absent or capability.unmet(coords)


def provides(coords: Any, needs: tuple[type[Capability], ...] | list[type[Capability]]) -> bool:
    """Whether `coords` (object or class) provides every capability in `needs`."""
    return all(not missing(coords, cap) for cap in needs)


class Metric(Capability):
    """A distance between any query and any key, and a bound on it.

    `distance(q_idx, kv_idx, b=None) -> Tensor`: non-negative float32, the broadcast shape of
    the indices, in the coordinates' unit. `extent(q_idx, b=None) -> Tensor`: how far keys can
    lie from the query (float32; FIRE's normaliser): the query's position on a causal sequence,
    the diameter of the set elsewhere.
    """

    members = ("distance", "extent")

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor: ...

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor: ...


class Directed(Capability):
    """A signed relative position and a causal flag.

    `relation(q_idx, kv_idx, b=None) -> Tensor`: `pos_q − pos_k` (int64 for integer
    positions): positive when the key lies before the query. `causal`: `True` when a query
    may only attend to keys with `relation >= 0`.
    """

    members = ("relation", "causal")
    causal: bool

    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor: ...


class Causal(Directed):
    """`Directed` coordinates with `causal` true: each query sees only keys at or before it.

    Decoder-only methods (CoPE, FoX, stick-breaking) need it. A class qualifies when it
    provides the members (`causal` is set per object); an object when `causal` is True.
    """

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        if isinstance(coords, type):
            return []
        return [] if getattr(coords, "causal", False) is True else ["causal == True"]


class Positioned(Capability):
    """Per-token coordinates on `num_axes` axes.

    `query_positions` `[n_q, a]` or `[b, n_q, a]`, `key_positions` `[n_k, a]` or
    `[b, n_k, a]`, in the coordinates' unit (int64 for integer positions, else float).
    Tokens without a coordinate (cls, registers) sit at 0.
    """

    members = ("query_positions", "key_positions", "num_axes")
    num_axes: int
    query_positions: Tensor
    key_positions: Tensor


class Positioned1D(Positioned):
    """`Positioned` on exactly one axis: a line of tokens (text, a 1D signal, a time axis).

    The 1D encodings (sinusoidal, learned, RoPE and its scalings, xPos) read
    `query_positions[..., 0]`. A class qualifies when `num_axes` is the class constant 1;
    an object when its `num_axes` is 1.
    """

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        if isinstance(coords, type):
            value = next((vars(k)["num_axes"] for k in coords.__mro__ if "num_axes" in vars(k)), None)
        else:
            value = getattr(coords, "num_axes", None)
        return [] if isinstance(value, int) and value == 1 else ["num_axes == 1"]


class GridLayout(Capability):
    """A regular grid of cells after `prefix_tokens` coordinate-free tokens (row-major).

    `shape` (cells per axis), `prefix_tokens`, `grid_index` `[prod(shape), a]` int64
    cell indices, `is_prefix(idx)`, `cell_index(idx, axis)`, `offset(q_idx, kv_idx, axis)`.
    """

    members = ("shape", "prefix_tokens", "grid_index", "is_prefix", "cell_index", "offset")
    shape: tuple[int, ...]
    prefix_tokens: int


class GraphLayout(Capability):
    """Graphs padded to `[b, n_max]` token slots with hop tables and spectra.

    `spd` `[b, n, n]` hop codes, `node_mask` `[b, n]`, `in_degree`/`out_degree`
    `[b, n]`, `laplacian_pe(k)`, `rwse(k)`, `virtual_token`.
    """

    members = ("spd", "node_mask", "in_degree", "out_degree", "laplacian_pe", "rwse",
               "virtual_token")


class Spherical(Capability):
    """Points on the sphere: `lat` and `lon` `[n]` or `[b, n]`, radians."""

    members = ("lat", "lon")
    lat: Tensor
    lon: Tensor


class FeatureGraph(Capability):
    """The feature columns of a table: `spectral_positions` `[n, k]` of its feature graph."""

    members = ("spectral_positions",)
    spectral_positions: Tensor


class GraphEdges(Capability):
    """Edge features along shortest paths (Graphormer's edge encoding, Ying et al. 2021 eq. 7).

    `path_edge_attr(max_hops) -> (attr, valid)`: for every token pair `(i, j)` the features
    of the first `max_hops` edges of one shortest path `i → j`, `attr [b, n, n, max_hops,
    F]` (integer categories or floats; zeros where no edge) and `valid [b, n, n, max_hops]`
    bool. Raises `ValueError` when the graph carries no edge features.
    """

    members = ("path_edge_attr",)

    def path_edge_attr(self, max_hops: int) -> tuple[Tensor, Tensor]: ...

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        # An object may say it has no edge features (``has_edge_features``); a class may.
        if isinstance(coords, type) or getattr(coords, "has_edge_features", True):
            return []
        return ["has_edge_features == True"]


class VirtualNode(GraphLayout):
    """`GraphLayout` with Graphormer's virtual graph token in slot 0 (`virtual_token` true)."""

    @classmethod
    def unmet(cls, coords: Any) -> list[str]:
        if isinstance(coords, type) or getattr(coords, "virtual_token", False) is True:
            return []
        return ["virtual_token == True"]


class Prefixed(Capability):
    """Leading tokens without a coordinate: `prefix_tokens` (int; `[CLS]`, registers).

    Tokens `0 … prefix_tokens − 1` come before the positioned ones (`GridLayout` providers
    have the member too). An encoding that treats them apart (Tab-PET standardises its
    positions over the feature tokens only) checks `isinstance(coords, Prefixed)`.
    """

    members = ("prefix_tokens",)
    prefix_tokens: int


__all__ += ["GraphEdges", "Prefixed", "VirtualNode"]
