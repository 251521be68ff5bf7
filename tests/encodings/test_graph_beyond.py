"""RRWP (GRIT), SignNet, SPE and the magnetic Laplacian (issue 22, part 5).

Numbers against closed forms (walks on a cycle, the magnetic spectrum of a directed cycle),
invariances with hypothesis over random graphs, signs and rotations, and PyG where it
implements the same thing (random-walk return probabilities, GIN); each check has a control
that fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import laplacian
from scipy.special import comb

import mmpe
from mmpe.attention import dense_bias
from mmpe.coords.graph_structure import (
    dense_adjacency,
    laplacian_eigenpairs,
    magnetic_laplacian,
    magnetic_laplacian_pe,
    random_walk_powers,
    rrwp,
)
from mmpe.encodings.base import AttentionCall

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


def cycle(n: int) -> torch.Tensor:
    src = torch.arange(n)
    return torch.stack([torch.cat([src, (src + 1) % n]), torch.cat([(src + 1) % n, src])])


def directed_cycle(n: int) -> torch.Tensor:
    src = torch.arange(n)
    return torch.stack([src, (src + 1) % n])


def path(n: int, directed: bool = False) -> torch.Tensor:
    src = torch.arange(n - 1)
    one = torch.stack([src, src + 1])
    return one if directed else torch.cat([one, one.flip(0)], dim=1)


def complete(n: int) -> torch.Tensor:
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    keep = i != j
    return torch.stack([i[keep], j[keep]])


def random_edges(seed: int, n: int, p: float = 0.35, directed: bool = False,
                 loops: bool = False) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) < p
    if not loops:
        np.fill_diagonal(a, False)
    if not directed:
        a = np.triu(a, 1)
        a = a | a.T
    return torch.from_numpy(np.stack(np.nonzero(a))).long()


def ctx(coords, heads: int = 2) -> AttentionCall:
    return AttentionCall(coords=coords, num_heads=heads, head_dim=4, batch=coords.batch_size)


graphs = st.tuples(st.integers(0, 10_000), st.integers(2, 9))


# ------------------------------------------------------------------------------------ RRWP
@SETTINGS
@given(graphs)
def test_rrwp_rows_of_every_power_sum_to_one(g) -> None:
    seed, n = g
    ei = random_edges(seed, n)
    p = random_walk_powers(ei, n, 6)  # [n, n, 6]
    has_out = np.bincount(ei[0].numpy(), minlength=n) > 0
    rows = p.sum(axis=1)  # [n, 6]
    np.testing.assert_allclose(rows[:, 0], 1.0)  # M⁰ = I
    np.testing.assert_allclose(rows[has_out, 1:], 1.0, atol=1e-12)
    np.testing.assert_allclose(rows[~has_out, 1:], 0.0)  # an isolated node's walk stops
    # control: powers of A (no D⁻¹) are not stochastic
    a = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0].numpy(), ei[1].numpy())), shape=(n, n)).toarray()
    if (a.sum(1) > 1).any():
        assert not np.allclose((a @ a).sum(1)[has_out], 1.0)


def test_rrwp_on_a_cycle_is_the_binomial_walk() -> None:
    """On `C_n`, `[M^t]_0j = 2^{-t} Σ_m C(t, m)` over `m` with `2m − t ≡ j (mod n)`."""
    n, k = 7, 9
    p = rrwp(mmpe.Graph(cycle(n), n), k)[0]  # [n, n, k]
    want = np.zeros((n, k))
    for t in range(k):
        for m in range(t + 1):
            want[(2 * m - t) % n, t] += comb(t, m) / 2 ** t
    np.testing.assert_allclose(p[0].numpy(), want, atol=1e-6)
    assert not np.allclose(p[0].numpy(), np.roll(want, 1, axis=0), atol=1e-3)  # control


@SETTINGS
@given(graphs, st.booleans(), st.booleans())
def test_rrwp_diagonal_is_rwse(g, directed: bool, loops: bool) -> None:
    seed, n = g
    ei = random_edges(seed, n, directed=directed, loops=loops)
    graph = mmpe.Graph(ei, n)
    diag = rrwp(graph, 9).diagonal(dim1=1, dim2=2).transpose(1, 2)  # [1, n, 9]
    torch.testing.assert_close(diag[..., 0], torch.ones(1, n))
    torch.testing.assert_close(diag[..., 1:], graph.rwse(8))
    if bool((ei[0] != ei[1]).any()):  # control: one step off (t = 0 … 7) is not RWSE
        assert not torch.allclose(diag[..., :8], graph.rwse(8))


def test_rrwp_diagonal_equals_pyg_random_walk_pe() -> None:
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.transforms import AddRandomWalkPE

    ei = random_edges(3, 9)
    data = AddRandomWalkPE(walk_length=6, attr_name="rw")(pyg.data.Data(edge_index=ei, num_nodes=9))
    diag = rrwp(mmpe.Graph(ei, 9), 7)[0].diagonal(dim1=0, dim2=1).t()  # [n, 7]
    torch.testing.assert_close(diag[:, 1:], data.rw, atol=1e-6, rtol=0)
    assert not torch.allclose(diag[:, :6], data.rw, atol=1e-3)  # control: shifted by one step


def _two_graphs():
    a, b = random_edges(1, 5), random_edges(2, 4)
    return torch.cat([a, b + 5], dim=1), torch.tensor([0] * 5 + [1] * 4), (a, 5), (b, 4)


@pytest.mark.parametrize("virtual", [False, True])
def test_rrwp_batches_per_graph(virtual: bool) -> None:
    ei, batch, (a, na), (b, nb) = _two_graphs()
    both = rrwp(mmpe.Graph(ei, 9, batch=batch, virtual_token=virtual), 5)
    v = int(virtual)
    alone = [rrwp(mmpe.Graph(e, n, virtual_token=virtual), 5)[0] for e, n in ((a, na), (b, nb))]
    torch.testing.assert_close(both[0, :na + v, :na + v], alone[0])
    torch.testing.assert_close(both[1, :nb + v, :nb + v], alone[1])
    assert both[1, nb + v:].abs().sum() == 0 and both[1, :, nb + v:].abs().sum() == 0  # padding
    if virtual:
        assert both[:, 0].abs().sum() == 0 and both[:, :, 0].abs().sum() == 0
    # control: the same nodes as ONE graph joined by an edge have walks across the two parts
    joined = torch.cat([ei, torch.tensor([[0, 5], [5, 0]])], dim=1)
    one = rrwp(mmpe.Graph(joined, 9), 5)[0]
    assert one[:5, 5:].abs().sum() > 0


def test_rrwp_bias_is_a_linear_map_per_head_and_attention_is_per_graph() -> None:
    ei, batch, (a, na), (b, nb) = _two_graphs()
    torch.manual_seed(0)
    enc = mmpe.build("rrwp", num_heads=2, k=5)
    graph = mmpe.Graph(ei, 9, batch=batch)
    bias = dense_bias([enc], ctx(graph))
    want = torch.einsum("bijt,ht->bhij", rrwp(graph, 5), enc.weight)
    torch.testing.assert_close(bias, want)
    model = mmpe.Transformer(16, 2, 1, [enc, mmpe.build("rrwp_node", d_model=16, k=5)]).eval()
    x = torch.randn(9, 16)
    out = graph.unpad_nodes(model(graph.pad_nodes(x), graph))
    for e, n, rows in ((a, na, slice(0, 5)), (b, nb, slice(5, 9))):
        single = mmpe.Graph(e, n)
        torch.testing.assert_close(single.unpad_nodes(model(single.pad_nodes(x[rows]), single)),
                                   out[rows], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ SignNet
SPECTRAL = {"cycle6": (cycle(6), 6), "cycle8": (cycle(8), 8), "complete5": (complete(5), 5),
            "random": (random_edges(7, 8, p=0.5), 8)}


@pytest.mark.parametrize("name", list(SPECTRAL))
@SETTINGS
@given(signs=st.lists(st.sampled_from([-1.0, 1.0]), min_size=4, max_size=4))
def test_signnet_is_invariant_to_eigenvector_signs(name: str, signs) -> None:
    ei, n = SPECTRAL[name]
    base = mmpe.Graph(ei, n)
    vecs, _ = base.laplacian_pe(4)
    flip = torch.tensor(signs)
    flipped = mmpe.Graph(ei, n, laplacian_pe=vecs[0] * flip)
    same = mmpe.Graph(ei, n, laplacian_pe=vecs[0])
    torch.manual_seed(0)
    signnet = mmpe.build("signnet", d_model=16, k=4).eval()
    torch.testing.assert_close(signnet(flipped), signnet(same), atol=1e-5, rtol=1e-5)
    # control: plain LapPE (no random flips) changes under the same flip
    lappe = mmpe.build("lappe", d_model=16, k=4, sign_flip=False).eval()
    if (flip < 0).any():
        assert not torch.allclose(lappe(flipped), lappe(same), atol=1e-4)


def test_signnet_phi_is_pygs_gin() -> None:
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GINConv

    from mmpe.encodings.signnet import DenseGIN

    torch.manual_seed(0)
    ei, n = random_edges(4, 7, p=0.5), 7
    gin = DenseGIN(1, 8, layers=1)
    with torch.no_grad():
        gin.eps.fill_(0.3)
    conv = GINConv(gin.mlps[0], eps=0.3)
    x = torch.randn(n, 1)
    adj = dense_adjacency(mmpe.Graph(ei, n))
    ours = gin(x[None, :, None, :], adj)[0, :, 0]  # [n, 8]
    torch.testing.assert_close(ours, conv(x, ei), atol=1e-5, rtol=1e-5)
    dropped = ei[:, 1:]  # control: another graph's aggregation differs
    if dropped.shape[1] and not torch.equal(dropped, ei):
        assert not torch.allclose(ours, conv(x, dropped), atol=1e-4)


# ------------------------------------------------------------------------------------ SPE
def _eigenspace_rotation(vals: torch.Tensor, seed: int) -> torch.Tensor:
    """A random orthogonal `Q [k, k]`, block diagonal over equal eigenvalues."""
    rng = np.random.default_rng(seed)
    k = vals.numel()
    q = np.zeros((k, k))
    i = 0
    while i < k:
        j = i
        while j + 1 < k and abs(float(vals[j + 1] - vals[i])) < 1e-6:
            j += 1
        block, _ = np.linalg.qr(rng.normal(size=(j - i + 1, j - i + 1)))
        q[i:j + 1, i:j + 1] = block
        i = j + 1
    return torch.from_numpy(q).float()


@pytest.mark.parametrize("name", ["cycle6", "cycle8", "complete5"])
@SETTINGS
@given(seed=st.integers(0, 10_000))
def test_spe_is_invariant_to_rotations_within_eigenspaces(name: str, seed: int) -> None:
    ei, n = SPECTRAL[name]
    graph = mmpe.Graph(ei, n)
    vecs, vals, mask = laplacian_eigenpairs(graph, n - 1)  # the whole non-trivial spectrum
    q = _eigenspace_rotation(vals[0], seed)
    assert (torch.diff(vals[0]).abs() < 1e-6).any()  # these graphs have repeated eigenvalues
    torch.manual_seed(0)
    spe = mmpe.build("spe", num_heads=2, k=n - 1)
    z = spe.pair_bias(vecs, vals, mask)
    torch.testing.assert_close(spe.pair_bias(vecs @ q, vals, mask), z, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dense_bias([spe], ctx(graph)), z)
    # control: a rotation that mixes different eigenvalues changes SPE, and LapPE's raw
    # eigenvectors change under the in-eigenspace rotation itself
    mix, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n - 1, n - 1)))
    mixed = spe.pair_bias(vecs @ torch.from_numpy(mix).float(), vals, mask)
    if (torch.diff(vals[0]).abs() > 1e-6).any():  # K_5 has one eigenspace: nothing to mix
        assert not torch.allclose(mixed, z, atol=1e-4)
    if not torch.allclose(q.abs(), torch.eye(n - 1), atol=1e-6):
        assert not torch.allclose(vecs @ q, vecs, atol=1e-4)


def test_spe_with_constant_phi_is_the_eigenspace_projector() -> None:
    """`φ ≡ c` gives `Z = c V Vᵀ = c (I − u₀u₀ᵀ)` over the whole non-trivial spectrum."""
    ei, n = cycle(6), 6
    spe = mmpe.build("spe", num_heads=1, k=n - 1)
    with torch.no_grad():
        for p in spe.phi.parameters():
            p.zero_()
        spe.phi[2].bias.fill_(2.0)
    z = dense_bias([spe], ctx(mmpe.Graph(ei, n), heads=1))[0, 0]
    u0 = torch.full((n,), n ** -0.5)  # a cycle's degrees are equal: the trivial vector is constant
    torch.testing.assert_close(z, 2.0 * (torch.eye(n) - torch.outer(u0, u0)), atol=1e-5, rtol=0)
    assert not torch.allclose(z, 2.0 * torch.eye(n), atol=1e-3)  # control


@pytest.mark.parametrize("extra", [1, 5, 40])
def test_spe_past_the_spectrum_gives_the_same_numbers(extra: int) -> None:
    # A k past every graph's spectrum adds columns that are masked out: the bias must be the
    # one of a k that just covers it, bit for bit (the zero columns once entered the sums and
    # changed their last bits on an AVX-512 CPU), in a batch of graphs of different sizes too.
    both = torch.cat((cycle(5), cycle(7) + 5), dim=1)
    for graph in (mmpe.Graph(cycle(5), 5), mmpe.Graph(cycle(7), 7),
                  mmpe.Graph(both, 12, batch=torch.tensor([0] * 5 + [1] * 7))):
        width = graph.num_queries - 1 if graph.batch_size in (None, 1) else 6
        torch.manual_seed(0)
        exact = mmpe.build("spe", num_heads=3, k=width, hidden=8)
        more = mmpe.build("spe", num_heads=3, k=width + extra, hidden=8)
        more.phi.load_state_dict(exact.phi.state_dict())  # the weights only: k is saved
        heads = ctx(graph, heads=3)
        assert torch.equal(dense_bias([more], heads), dense_bias([exact], heads))
        smaller = mmpe.build("spe", num_heads=3, k=width - 1, hidden=8)  # control
        smaller.phi.load_state_dict(exact.phi.state_dict())
        assert not torch.allclose(dense_bias([smaller], heads), dense_bias([exact], heads), atol=1e-4)


# ------------------------------------------------------------------------------------ MagLap
@SETTINGS
@given(graphs, st.floats(0.0, 0.5), st.sampled_from(["sym", None]))
def test_magnetic_laplacian_is_hermitian(g, q: float, norm) -> None:
    seed, n = g
    lap = magnetic_laplacian(random_edges(seed, n, directed=True), n, q, norm)
    np.testing.assert_allclose(lap, lap.conj().T, atol=1e-12)
    assert np.linalg.eigvalsh(lap).min() > -1e-9  # positive semi-definite


@SETTINGS
@given(graphs, st.sampled_from(["sym", None]))
def test_magnetic_laplacian_at_q0_is_the_symmetrised_laplacian(g, norm) -> None:
    seed, n = g
    ei = random_edges(seed, n, directed=True)
    a = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0].numpy(), ei[1].numpy())), shape=(n, n)).toarray()
    a = np.minimum(np.maximum(a, a.T), 1.0)
    np.testing.assert_allclose(magnetic_laplacian(ei, n, 0.0, norm),
                               laplacian(a, normed=norm == "sym"), atol=1e-12)


@pytest.mark.parametrize("norm", ["sym", None])
def test_maglap_at_q0_reduces_to_lappe(norm) -> None:
    # Directed paths (distinct eigenvalues): maglap drops the direction at q = 0 and its
    # eigenvectors after the trivial one are LapPE's, with the same canonical signs.
    ei = torch.cat([path(6, directed=True), path(5, directed=True) + 6], dim=1)
    graph = mmpe.Graph(ei, 11, batch=torch.tensor([0] * 6 + [1] * 5))
    vecs, vals, mask = magnetic_laplacian_pe(graph, 5, 0.0, norm)
    lap, lap_mask = graph.laplacian_pe(4, norm)
    assert vecs.imag.abs().max() == 0
    torch.testing.assert_close(vecs.real[..., 1:], lap, atol=1e-5, rtol=0)
    assert torch.equal(mask[:, 1:], lap_mask)
    assert not torch.allclose(vecs.real[..., :4], lap, atol=1e-3)  # control: without the drop


def test_maglap_on_a_directed_cycle_matches_the_closed_form() -> None:
    """`L_q` (combinatorial) of a directed `C_n`: eigenvalues `2 − 2 cos(2π(j/n + q))`."""
    n, q = 7, 0.2
    got = np.linalg.eigvalsh(magnetic_laplacian(directed_cycle(n), n, q, None))
    want = np.sort(2 - 2 * np.cos(2 * np.pi * (np.arange(n) / n + q)))
    np.testing.assert_allclose(got, want, atol=1e-10)
    control = np.sort(2 - 2 * np.cos(2 * np.pi * np.arange(n) / n))  # q = 0's spectrum
    assert not np.allclose(got, control, atol=1e-3)


@SETTINGS
@given(graphs, st.floats(0.05, 0.45))
def test_maglap_is_direction_sensitive_only_at_positive_q(g, q: float) -> None:
    seed, n = g
    ei = random_edges(seed, n, directed=True)
    one_way = (ei.shape[1] > 0) and not torch.equal(
        torch.sort(ei[0] * n + ei[1]).values, torch.sort(ei[1] * n + ei[0]).values)
    fwd, rev = mmpe.Graph(ei, n), mmpe.Graph(ei.flip(0), n)
    lap_f, lap_r = (magnetic_laplacian(e, n, q) for e in (ei, ei.flip(0)))
    np.testing.assert_allclose(lap_r, lap_f.conj(), atol=1e-12)  # reversing conjugates L_q
    enc = mmpe.build("maglap", d_model=8, k=3, q=q)
    at_zero = mmpe.build("maglap", d_model=8, k=3, q=0.0)
    torch.testing.assert_close(at_zero.features(fwd), at_zero.features(rev))  # q = 0: blind
    if one_way and np.abs(lap_f.imag).max() > 1e-6:
        assert not torch.allclose(enc.features(fwd), enc.features(rev), atol=1e-4)


def test_maglap_on_a_directed_cycle_is_complex_and_runs_in_a_model() -> None:
    graph = mmpe.Graph(directed_cycle(6), 6)
    feats = mmpe.build("maglap", d_model=8, k=3).features(graph)
    assert feats.shape == (1, 6, 6) and feats[..., 3:].abs().max() > 0.1
    model = mmpe.Transformer(16, 2, 1, ["maglap", "spe", "signnet"])
    assert model(torch.randn(1, 6, 16), graph).shape == (1, 6, 16)


@pytest.mark.parametrize(("name", "kwargs"), [("maglap", {"q": -0.5}), ("maglap", {"q": math.inf}),
                                             ("spe", {"normalization": "rw"}),
                                             ("signnet", {"normalization": "rw"})])
def test_bad_options_name_the_argument(name: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        mmpe.build(name, context={"d_model": 8, "num_heads": 2}, **kwargs)


class LayoutOnly(mmpe.coords.Coordinates):
    """GraphLayout's members only (no `graph_edges`)."""

    def __init__(self, graph: mmpe.Graph) -> None:
        self._g = graph
        self.virtual_token = graph.virtual_token

    num_queries = property(lambda self: self._g.n_max)
    batch_size = property(lambda self: self._g.num_graphs)
    spd = property(lambda self: self._g.spd)
    node_mask = property(lambda self: self._g.node_mask)
    in_degree = property(lambda self: self._g.in_degree)
    out_degree = property(lambda self: self._g.out_degree)

    def laplacian_pe(self, k: int, normalization: str | None = "sym"):
        return self._g.laplacian_pe(k, normalization)

    def rwse(self, k: int):
        return self._g.rwse(k)


def test_the_encodings_need_the_edge_list() -> None:
    from mmpe.coords.capabilities import GraphLayout
    from mmpe.coords.graph_structure import GraphAdjacency

    graph = mmpe.Graph(cycle(5), 5)
    toy = LayoutOnly(graph)
    assert isinstance(toy, GraphLayout) and not isinstance(toy, GraphAdjacency)
    assert isinstance(graph, GraphAdjacency) and GraphAdjacency in mmpe.get("rrwp").needs
    for name in ("rrwp_node", "signnet", "maglap"):
        with pytest.raises(TypeError, match="GraphAdjacency"):
            mmpe.build(name, d_model=8)(toy)
        assert mmpe.build(name, d_model=8)(graph).shape == (1, 5, 8)  # control
    for name in ("rrwp", "spe"):
        with pytest.raises(TypeError, match="GraphAdjacency"):
            dense_bias([mmpe.build(name, num_heads=2)], ctx(toy))


@SETTINGS
@given(graphs, st.floats(0.05, 0.45))
def test_maglap_is_lappe_like_where_every_edge_has_its_reverse(g, q: float) -> None:
    """Θ = 0 on an undirected edge list (a PyG molecule): real eigenvectors, the same as q = 0."""
    seed, n = g
    graph = mmpe.Graph(random_edges(seed, n), n)
    at_q = mmpe.build("maglap", d_model=8, k=4, q=q).features(graph)
    assert at_q[..., 4:].abs().max() == 0
    torch.testing.assert_close(at_q, mmpe.build("maglap", d_model=8, k=4, q=0.0).features(graph))
    one_way = mmpe.Graph(random_edges(seed, n, directed=True), n)  # control: direction seen
    lap = magnetic_laplacian(one_way.graph_edges(0), n, q)
    if np.abs(lap.imag).max() > 1e-6:
        assert mmpe.build("maglap", d_model=8, k=4, q=q).features(one_way)[..., 4:].abs().max() > 0


def test_the_graph_recipe_compares_them() -> None:
    pytest.importorskip("lightning")
    from mmpe.recipes.graph import COMPARE, expand_encoding

    assert expand_encoding("rrwp", {"rrwp": {"k": 8}}) == [{"name": "rrwp", "k": 8},
                                                           {"name": "rrwp_node"}]
    assert expand_encoding("spe") == [{"name": "spe"}]  # control: a plain registry name
    assert {"rrwp", "signnet", "spe", "maglap"} <= set(COMPARE.default_encodings)
