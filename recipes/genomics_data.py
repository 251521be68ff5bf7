"""Real DNA and real transcription-factor motifs for the genomics recipe, and its task rules.

**Background sequence**: the complete genome of Enterobacteria phage lambda (NCBI RefSeq
NC_001416.1, 48,502 bp), as shipped in Debian's `bowtie2-examples` package
(`/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz`; `apt-get install
bowtie2-examples`). Debian's copyright file for the package puts its files under
GPL-3.0-or-later (© 2009-2016 Ben Langmead et al.); the sequence itself is a public NCBI record.

**Motifs**: position frequency matrices (PFMs) of the JASPAR 2024 CORE collection (Rauluseviciute
et al. 2024, Nucleic Acids Res. 52:D174, doi:10.1093/nar/gkad1059), read from the SQLite file that
the `pyjaspar` package bundles (`pip install pyjaspar`; the package is MIT-licensed, the JASPAR
data is open access — JASPAR's pages say it "can be used with no restrictions"). `pyjaspar`
opens its bundled file with `sqlite3` and never goes to the network.

Both are read once per process; nothing is downloaded. The task rules live here so that tests
can check them on constructed examples (see :func:`periodic_label`, :func:`local_label`).
"""

from __future__ import annotations

import functools
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mmpe.recipes.common import MissingDataError, require

LAMBDA_FASTA = Path("/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz")
LAMBDA_LENGTH = 48_502
INSTALL_FASTA = "apt-get install bowtie2-examples"
INSTALL_JASPAR = "pip install pyjaspar"
JASPAR_RELEASE = "JASPAR2024"
#: The motifs planted by the tasks (JASPAR 2024 CORE matrix ids).
#: MYCN's E-box (8 bp, 13 bits) for the periodic array; SOX2 and POU5F1 (7 bp each) for the
#: local task: their sites sit side by side in the Sox–Oct composite element (JASPAR MA0142.1),
#: a dependency that is local by nature.
MOTIF_IDS = {"periodic": "MA0104.3", "local_a": "MA0143.5", "local_b": "MA1115.2"}
NUCLEOTIDES = "ACGT"


def read_fasta(path: str | Path) -> str:
    """The concatenated, upper-cased sequence of a (gzipped) single-record FASTA file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return "".join(line.strip() for line in f if not line.startswith(">")).upper()


@functools.cache
def lambda_genome() -> np.ndarray:
    """The lambda phage genome as nucleotide indices 0-3 (A, C, G, T), ``int64 [48502]``.

    Raises:
        MissingDataError: `bowtie2-examples` is not installed (names the install command).
        ValueError: the file holds a symbol other than A, C, G, T.
    """
    if not LAMBDA_FASTA.is_file():
        raise MissingDataError(f"the lambda phage genome ({LAMBDA_FASTA}) is missing: run "
                               f"`{INSTALL_FASTA}`")
    return encode(read_fasta(LAMBDA_FASTA))


def encode(seq: str) -> np.ndarray:
    """A, C, G, T → 0, 1, 2, 3.

    Raises:
        ValueError: any other symbol (an N would be a fifth letter the tasks never plant).
    """
    lut = np.full(256, -1, dtype=np.int64)
    lut[[ord(c) for c in NUCLEOTIDES]] = np.arange(4)
    out = lut[np.frombuffer(seq.encode("ascii"), dtype=np.uint8)]
    if (out < 0).any():
        bad = sorted({seq[i] for i in np.flatnonzero(out < 0)[:10]})
        raise ValueError(f"DNA sequence holds symbols other than ACGT: {bad}")
    return out


def split_genome(genome: np.ndarray, test_fraction: float) -> dict[str, np.ndarray]:
    """Split by coordinate: the first ``1 - test_fraction`` of the genome trains, the rest
    tests (contiguous regions, so no test window overlaps a training one)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"genomics: data.test_fraction must be in (0, 1), got {test_fraction}")
    cut = int(round(len(genome) * (1 - test_fraction)))
    return {"train": genome[:cut], "test": genome[cut:]}


@functools.cache
def load_pfm(matrix_id: str, release: str = JASPAR_RELEASE) -> np.ndarray:
    """The PFM of `matrix_id` as per-position nucleotide frequencies ``float64 [length, 4]``
    (columns A, C, G, T; rows sum to 1).

    Raises:
        MissingDataError: `pyjaspar` is not installed.
        ValueError: no such matrix in the release.
    """
    pyjaspar = require("pyjaspar", INSTALL_JASPAR)
    motif = pyjaspar.jaspardb(release=release).fetch_motif_by_id(matrix_id)
    if motif is None:
        raise ValueError(f"no JASPAR matrix {matrix_id!r} in {release}")
    counts = np.array([motif.counts[b] for b in NUCLEOTIDES], dtype=np.float64).T
    return counts / counts.sum(1, keepdims=True)


def sample_site(pfm: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One binding site drawn from the PFM, each position independently (indices 0-3)."""
    u = rng.random(len(pfm))[:, None]
    return (u > np.cumsum(pfm, axis=1)).sum(1).clip(max=3)


# --- task rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskRules:
    """The arrangements the two classification tasks plant, per block of ``L`` nucleotides.

    periodic: ``sites`` copies of the periodic motif; class 1 spaces consecutive sites exactly
        ``period`` bp apart (start to start: helical phasing, about 10 bp a turn), class 0 at
        spacings drawn from ``jitter`` (none equal to the period, the same mean span).
    local: one SOX2 site followed by one POU5F1 site on the same strand; class 1 with a gap of
        0 … ``near_gap`` bp between them (the composite element), class 0 with a gap in
        ``far_gaps``.
    """

    period: int = 10
    sites: int = 5
    jitter: tuple[int, ...] = (8, 9, 11, 12)
    near_gap: int = 2
    far_gaps: tuple[int, int] = (16, 32)

    def __post_init__(self) -> None:
        if self.period in self.jitter:
            raise ValueError(f"genomics: the jittered spacings {self.jitter} must exclude the "
                             f"period {self.period}")
        if self.far_gaps[0] <= self.near_gap:
            raise ValueError("genomics: far gaps must be larger than the near gap")


def periodic_label(starts: list[list[int]], period: int) -> bool:
    """The periodic rule: true iff, in every group, consecutive sites start exactly
    ``period`` bp apart."""
    return all(b - a == period
               for group in starts for a, b in zip(group[:-1], group[1:], strict=True))


def local_label(pairs: list[tuple[int, int]], len_a: int, near_gap: int) -> bool:
    """The local rule: true iff in every (first, second) pair the second site starts within
    ``near_gap`` bp after the first site ends."""
    return all(0 <= b - (a + len_a) <= near_gap for a, b in pairs)


def periodic_spacings(rules: TaskRules, positive: bool, rng: np.random.Generator) -> list[int]:
    if positive:
        return [rules.period] * (rules.sites - 1)
    return [int(s) for s in rng.choice(rules.jitter, rules.sites - 1)]


def local_gap(rules: TaskRules, positive: bool, rng: np.random.Generator) -> int:
    low, high = (0, rules.near_gap) if positive else rules.far_gaps
    return int(rng.integers(low, high + 1))


def plant(background: np.ndarray, sites: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """A copy of `background` with each ``(start, site)`` written over it."""
    out = background.copy()
    for start, site in sites:
        out[start:start + len(site)] = site
    return out


def group_span(offsets: list[int], last_length: int) -> int:
    """Nucleotides from the first site's start to the last site's end."""
    return sum(offsets) + last_length


def periodic_example(background: np.ndarray, block: int, positive: bool, rules: TaskRules,
                     pfm: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, list[list[int]]]:
    """`background` (``m`` blocks of `block` bp) with one group of sites per block, periodic
    or jittered; returns the sequence and each group's site starts."""
    groups, sites = [], []
    for b in range(len(background) // block):
        gaps = periodic_spacings(rules, positive, rng)
        span = group_span(gaps, len(pfm))
        start = b * block + int(rng.integers(0, block - span + 1))
        starts = [start + int(s) for s in np.cumsum([0, *gaps])]
        groups.append(starts)
        sites += [(s, sample_site(pfm, rng)) for s in starts]
    return plant(background, sites), groups


def local_example(background: np.ndarray, block: int, positive: bool, rules: TaskRules,
                  pfm_a: np.ndarray, pfm_b: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """`background` with one (first motif, second motif) pair per block, adjacent or far
    apart; returns the sequence and each pair's two starts."""
    pairs, sites = [], []
    for b in range(len(background) // block):
        gap = local_gap(rules, positive, rng)
        span = len(pfm_a) + gap + len(pfm_b)
        a = b * block + int(rng.integers(0, block - span + 1))
        pairs.append((a, a + len(pfm_a) + gap))
        sites += [(a, sample_site(pfm_a, rng)), (pairs[-1][1], sample_site(pfm_b, rng))]
    return plant(background, sites), pairs


def longest_span(rules: TaskRules, motif_lengths: dict[str, int]) -> int:
    """The longest arrangement a block must hold (the block length must be at least this)."""
    periodic = group_span([max(rules.period, *rules.jitter)] * (rules.sites - 1),
                          motif_lengths["periodic"])
    local = motif_lengths["local_a"] + rules.far_gaps[1] + motif_lengths["local_b"]
    return max(periodic, local)
