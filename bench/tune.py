"""``ringcoll-bench --tune``: the measured medians as a tuning table for ``algorithm="auto"``.

The table is a CSV in the spirit of NCCL's tuner-plugin config, one row per collective, world
size and size band (bytes inclusive)::

    collective,nranks,min_bytes,max_bytes,algorithm,device
    all_reduce,4,0,65535,recursive_doubling,cuda
    all_reduce,4,65536,67108864,ring,cuda

The device column is the run's tensors' device: a table measured on CUDA tensors overrides only
the CUDA decisions, one measured on CPU tensors only gloo's.

``RINGCOLL_TUNING=table.csv`` makes ``auto`` follow it (ringcoll/selection/__init__.py reads it).
Each measured size decides its own band from that size's repeated, paired rounds (the
harness times every contestant once per round, the order rotated, so a round's load is
shared by all of them): going up the sizes the table keeps the algorithm it holds (the
incumbent) unless another one beats it there, i.e. is faster in so many of the size's paired
rounds that a fair coin would give as many with probability at most :data:`LEVEL` (a
one-sided sign test, :func:`beats`); then the fastest median of those that beat it takes
over. At the first size, and where the incumbent has no row, the fastest median. Candidates
are ringcoll's algorithms that ``auto`` weighs (``auto`` and the built-in are not; a row with an
error or a wrong element is not either), on the collective's first variant (out-of-place
where there are two). Why paired rounds: on a 2-core shared host one size's rounds span
2-4x, so a bare argmin of medians switched at 7 of 8 band boundaries on noise, while asking
the spreads to part (the earlier rule: p90 below the other's p10) held the noisy 1 KiB
winner at every size even where another algorithm was faster in every round. Each choice
holds from its size up to the next measured size, the first from 0 bytes, the last up to
its own size; neighbouring sizes with the same choice merge into one band. The bytes are the
ones the selection table sees: the message of all_reduce, broadcast and reduce, the total
of all_gather, reduce_scatter, gather and scatter, the largest block of all_to_all.
"""
from __future__ import annotations

import csv
import math
from dataclasses import astuple, dataclass
from typing import Dict, List, Optional, Sequence

from .harness import BUILTIN, OURS, Row
from .specs import P2P_FLOOR, SPECS

HEADER = ("collective", "nranks", "min_bytes", "max_bytes", "algorithm")
_NOT_CANDIDATES = (BUILTIN, OURS, "auto", P2P_FLOOR)


@dataclass(frozen=True)
class Band:
    collective: str         # the registry collective (all_reduce, all_gather, ...)
    nranks: int
    min_bytes: int
    max_bytes: int          # inclusive
    algorithm: str


def selection_bytes(family: str, size: int, world: int) -> int:
    """The bytes ``auto`` chooses by, for a benchmark row of ``size`` bytes."""
    return size // world if family == "all_to_all" else size


def _candidates(rows: Sequence[Row]) -> Dict[int, Dict[str, Row]]:
    """Benchmark size -> algorithm -> its row, for the rows that may be chosen (ringcoll's
    algorithms that ran without an error or a wrong element)."""
    found: Dict[int, Dict[str, Row]] = {}
    for row in rows:
        if row.algorithm in _NOT_CANDIDATES or row.error or row.wrong or not row.time_us \
                or not _auto_may_take(row):
            continue
        found.setdefault(row.size, {})[row.algorithm] = row
    return dict(sorted(found.items()))


def _auto_may_take(row: Row) -> bool:
    """Whether ``auto`` weighs ``row``'s algorithm (registered with ``auto=True``): a table row
    naming one it never weighs (``rabenseifner_far``, ``bine_near``, a loaded MSCCL program)
    would be skipped by ``auto`` (ringcoll.selection reads only the rows of its candidates)."""
    from ..schedules import registry

    spec = SPECS.get(row.collective)
    family = spec.family if spec is not None and spec.family else row.collective
    try:
        return registry.get(family, row.algorithm).auto
    except (KeyError, ValueError):
        return False


def fastest(rows: Sequence[Row]) -> Dict[int, str]:
    """Benchmark size -> the algorithm with the least median time there."""
    return {size: min(by.values(), key=lambda row: row.time_us).algorithm
            for size, by in _candidates(rows).items()}


#: a challenger beats the incumbent when winning as many paired rounds as it did has at
#: most this probability for two equally fast algorithms (a fair coin each round)
LEVEL = 0.01
#: the fewest paired rounds a sign test can decide at LEVEL (7 of 7: 1/128)
MIN_ROUNDS = 7


def sign_test(wins: int, rounds: int) -> float:
    """One-sided sign test: the probability of ``wins`` or more heads in ``rounds`` tosses of
    a fair coin."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2 ** rounds


def beats(challenger: Row, incumbent: Row) -> bool:
    """Whether ``challenger`` is faster than ``incumbent`` beyond the noise of their paired
    rounds: round by round (the same round of the same run: the same load), it is strictly
    faster in enough of them that :func:`sign_test` gives at most :data:`LEVEL`. Rows
    without :data:`MIN_ROUNDS` paired rounds (an old run, or a run cut short) compare by
    their medians."""
    rounds = len(challenger.times_us)
    if rounds >= MIN_ROUNDS and rounds == len(incumbent.times_us):
        wins = sum(c < i for c, i in zip(challenger.times_us, incumbent.times_us))
        return sign_test(wins, rounds) <= LEVEL
    return challenger.time_us < incumbent.time_us


def steady_choices(rows: Sequence[Row]) -> Dict[int, str]:
    """Benchmark size -> the algorithm the table takes there, going up the sizes: the
    fastest median at the first size (or wherever the one held before has no row), then
    the one held before unless another :func:`beats` it, in which case the fastest median
    of those that do."""
    chosen: Dict[int, str] = {}
    incumbent = None
    for size, by in _candidates(rows).items():
        held = by.get(incumbent)
        if held is None:
            incumbent = min(by.values(), key=lambda row: row.time_us).algorithm
        else:
            better = [row for row in by.values() if row is not held and beats(row, held)]
            if better:
                incumbent = min(better, key=lambda row: row.time_us).algorithm
        chosen[size] = incumbent
    return chosen


def tuning_rows(rows: Sequence[Row], world: int) -> List[Band]:
    """The tuning table of a run's rows: per collective family (from its first benchmarked
    function, e.g. all_gather_single before the list all_gather), the algorithm of each size
    band (:func:`steady_choices`: the fastest, switching only beyond the paired rounds' noise)."""
    chosen: Dict[str, str] = {}         # family -> the function whose rows decide
    for row in rows:
        spec = SPECS.get(row.collective)
        if spec is not None and spec.family and spec.sized:
            chosen.setdefault(spec.family, row.collective)
    bands: List[Band] = []
    for family, name in chosen.items():
        variant = SPECS[name].variants[0]
        measured = [r for r in rows if r.collective == name and r.variant == variant]
        picks = list(steady_choices(measured).items())
        for index, (size, algorithm) in enumerate(picks):
            low = 0 if index == 0 else selection_bytes(family, size, world)
            high = selection_bytes(family, picks[index + 1][0], world) - 1 if index + 1 < len(picks) \
                else selection_bytes(family, size, world)
            if bands and bands[-1].collective == family and bands[-1].algorithm == algorithm:
                bands[-1] = Band(family, world, bands[-1].min_bytes, high, algorithm)
            else:
                bands.append(Band(family, world, low, high, algorithm))
    return bands


def write_tuning(path: str, bands: Sequence[Band], device: Optional[str] = None) -> str:
    """Write ``bands`` as a tuning table; with ``device`` (``"cpu"`` or ``"cuda"``, the
    tensors' device of the run), a sixth column marks every row with it, so that ``auto``
    follows the rows only on that device (ringcoll.selection: CUDA's table and gloo's)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER + (("device",) if device else ()))
        for band in bands:
            writer.writerow(astuple(band) + ((device,) if device else ()))
    return path
