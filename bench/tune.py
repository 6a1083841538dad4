"""``ringcoll-bench --tune``: the measured medians as a tuning table for ``algorithm="auto"``.

The table is a CSV in the spirit of NCCL's tuner-plugin config, one row per collective, world
size and size band (bytes inclusive)::

    collective,nranks,min_bytes,max_bytes,algorithm,device
    all_reduce,4,0,65535,recursive_doubling,cuda
    all_reduce,4,65536,67108864,ring,cuda

The device column is the run's tensors' device: a table measured on CUDA tensors overrides only
the CUDA decisions, one measured on CPU tensors only gloo's.

``RINGCOLL_TUNING=table.csv`` makes ``auto`` follow it (ringcoll/selection/__init__.py reads it). At each
measured size the algorithm is the argmin of the median times of ringcoll's algorithms (``auto``
and the built-in are not candidates; a row with an error or a wrong element is not either),
on the collective's first variant (out-of-place where there are two), with hysteresis: going
up the sizes, the table leaves the algorithm it holds (the incumbent) only for one faster
beyond the measured spread, whose rounds' p90 is below the incumbent's p10 (:func:`beats`;
on a 2-core host the p10-p90 of one size spans 2-4x, so a bare argmin of medians switched at
7 of 8 band boundaries on noise). Each choice holds from its size up to the next measured
size, the first from 0 bytes, the last up to its own size; neighbouring sizes with the same
choice merge into one band. The bytes are the ones the
selection table sees: the message of all_reduce, broadcast and reduce, the total of
all_gather, reduce_scatter, gather and scatter, the largest block of all_to_all.
"""
from __future__ import annotations

import csv
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


def beats(challenger: Row, incumbent: Row) -> bool:
    """Whether ``challenger`` is faster than ``incumbent`` beyond the measured spread: the
    slowest tenth of its rounds (p90) is faster than the fastest tenth of the incumbent's
    (p10), so the middle 80 % of their rounds do not overlap. Rows without a spread (one
    round, or an old run) compare by their medians."""
    if challenger.p90_us and incumbent.p10_us:
        return challenger.p90_us < incumbent.p10_us
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
    band (:func:`steady_choices`: the fastest, switching only beyond the spread)."""
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
