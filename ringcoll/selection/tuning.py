"""The tuning table (``RINGCOLL_TUNING``, written by ``ringcoll-bench --tune``): its rows,
read and checked, and the row that decides a call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..schedules import registry
from ..config import read_cached, settings

from .tables import table


# -- the tuning table (RINGCOLL_TUNING) ------------------------------------------------------

TUNING_HEADER = ("collective", "nranks", "min_bytes", "max_bytes", "algorithm")
#: the optional sixth column: the device the row was measured on (empty: any device)
TUNING_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TuningRow:
    collective: str
    nranks: int
    min_bytes: int
    max_bytes: int          # inclusive
    algorithm: str
    where: str              # path:line, for the reason
    device: str = ""        # "cpu" or "cuda": decides only that device's calls; "": any


_tuning_cache: dict = {}


def load_tuning(path: str) -> tuple:
    """The rows of a tuning table: a CSV with the header
    ``collective,nranks,min_bytes,max_bytes,algorithm`` and optionally ``device``
    (``ringcoll-bench --tune`` writes it; bytes inclusive, counted as ``auto`` counts them; the
    device ``cpu`` or ``cuda``, or empty for any). ValueError naming the file, line and field
    of anything wrong, an unregistered algorithm included."""
    return read_cached(_tuning_cache, "RINGCOLL_TUNING", path, _read_tuning)


def _read_tuning(path: str) -> tuple:
    import csv

    rows = []
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = tuple(field.strip() for field in next(reader, ()))
        if header[:5] != TUNING_HEADER:
            raise ValueError(f"{path}: line 1 must be the header {','.join(TUNING_HEADER)}, got {','.join(header)!r}")
        for line, fields in enumerate(reader, 2):
            if not fields or not "".join(fields).strip():
                continue
            if len(fields) < 5:
                raise ValueError(f"{path}:{line}: needs 5 fields ({','.join(TUNING_HEADER)}), got {fields!r}")
            collective = registry.collective_of(fields[0].strip())
            numbers = []
            for name, text in zip(TUNING_HEADER[1:4], fields[1:4]):
                try:
                    numbers.append(int(text))
                except ValueError:
                    raise ValueError(f"{path}:{line}: {name} must be an integer, got {text!r}") from None
            algorithm = fields[4].strip()
            if algorithm not in registry.algorithms(collective):       # ValueError for a bad collective
                raise ValueError(f"{path}:{line}: {collective} has no algorithm {algorithm!r}; "
                                 f"it has {registry.algorithms(collective)}")
            device = fields[5].strip() if len(fields) > 5 else ""
            if device and device not in TUNING_DEVICES:
                raise ValueError(f"{path}:{line}: device must be one of {TUNING_DEVICES} or "
                                 f"empty, got {device!r}")
            rows.append(TuningRow(collective, *numbers, algorithm, f"{path}:{line}", device))
    return tuple(rows)


def tuning_choice(collective: str, nbytes: int, world: int, names,
                  device=None) -> Optional[tuple[str, str]]:
    """The first row of the RINGCOLL_TUNING table for this collective, world, size and device
    (a row naming another device is skipped) whose algorithm the call can run, or None (no
    table, or no row covers the call)."""
    path = settings().tuning
    if not path:
        return None
    device = table(device).device
    for row in load_tuning(path):
        if row.collective == collective and row.nranks == world and row.device in ("", device) \
                and row.min_bytes <= nbytes <= row.max_bytes and row.algorithm in names:
            return row.algorithm, f"auto: tuning table {row.where}"
    return None
