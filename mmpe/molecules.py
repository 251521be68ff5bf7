"""Molecules given as SMILES strings: their graph and a 2D layout (RDKit).

RDKit is imported inside the functions (`pip install rdkit`, in the `data` extra), so
`import mmpe` does not need it. [`molecule_graph`][mmpe.molecules.molecule_graph] gives the [`Graph`][mmpe.coords.graph.Graph]
coordinates graph encodings read; [`molecule_layout`][mmpe.molecules.molecule_layout] adds the 2D depiction that
[`mmpe.plot.plot_graph_eigenvectors`][mmpe.plot.graph.plot_graph_eigenvectors] draws.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mmpe.coords.graph import Graph

__all__ = ["DEFAULT_SMILES", "molecule_graph", "molecule_layout"]

#: the molecule ``mmpe plot`` draws for graph encodings (caffeine).
DEFAULT_SMILES = "Cn1cnc2c1c(=O)n(C)c(=O)n2C"
#: integer edge feature of each RDKit bond order (single, double, triple, aromatic).
_BOND_CODES = {1.0: 0, 2.0: 1, 3.0: 2, 1.5: 3}


def molecule_layout(smiles: str, fn: str = "molecule_layout"
                    ) -> tuple[Tensor, int, np.ndarray, list[str], list[float]]:
    """A molecule's graph and RDKit 2D depiction.

    Args:
        smiles: the molecule.
        fn: the name errors start with.

    Returns:
        `(edge_index [2, 2E], n, xy [n, 2], labels, orders [E])`: both directions of each
            bond (the `E` bonds first, then reversed), the number of atoms, their 2D coordinates,
            their element symbols and the bond orders (1, 2, 3, 1.5 for aromatic).

    Raises:
        ImportError: RDKit is not installed. ValueError: an invalid or empty SMILES string.
    """
    try:
        from rdkit import Chem
        from rdkit.Chem import rdDepictor
    except ImportError as err:
        raise ImportError("drawing a molecule from SMILES needs RDKit: pip install rdkit") from err
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        raise ValueError(f"{fn}: {smiles!r} is not a valid SMILES string")
    rdDepictor.Compute2DCoords(mol)
    xy = np.asarray(mol.GetConformer().GetPositions())[:, :2]
    pairs, orders = [], []
    for bond in mol.GetBonds():
        pairs.append((bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()))
        orders.append(bond.GetBondTypeAsDouble())
    src = [a for a, _ in pairs] + [b for _, b in pairs]
    dst = [b for _, b in pairs] + [a for a, _ in pairs]
    edge_index = torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)
    labels = [a.GetSymbol() for a in mol.GetAtoms()]
    return edge_index, mol.GetNumAtoms(), xy, labels, orders


def molecule_graph(smiles: str, *, virtual_token: bool = False) -> Graph:
    """The graph coordinates of a molecule given as SMILES.

    [`Graph`][mmpe.coords.graph.Graph] coordinates of a molecule given as SMILES (RDKit; atoms = nodes),
    with the bond type as an integer edge feature (0 single, 1 double, 2 triple, 3 aromatic).

    Raises:
        ImportError: RDKit is not installed. ValueError: an invalid or empty SMILES string.
    """
    edge_index, n, _, _, orders = molecule_layout(smiles, "molecule_graph")
    kind = torch.tensor([_BOND_CODES.get(o, 0) for o in orders] * 2, dtype=torch.long)
    return Graph(edge_index, num_nodes=n, edge_attr=kind.reshape(-1, 1),
                 virtual_token=virtual_token)
