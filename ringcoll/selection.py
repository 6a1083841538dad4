"""``algorithm="auto"``: the one table that picks an algorithm by collective, size and world.

Each rule is (collective, largest message in bytes or None for any, world-size condition,
algorithm, evidence). The first rule of a collective that matches wins. ``RINGCOLL_ALGO``
overrides the table: ``RINGCOLL_ALGO=ring`` picks ``ring`` wherever the collective has one;
``RINGCOLL_ALGO=all_reduce=rabenseifner,broadcast=binomial`` names it per collective.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from . import registry

log = logging.getLogger("ringcoll")


def _any_world(world: int) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    collective: str
    max_bytes: Optional[int]
    algorithm: str
    evidence: str
    world: Callable[[int], bool] = _any_world


KiB, MiB = 1024, 1024 * 1024

RULES = (
    Rule("all_reduce", 64 * KiB, "recursive_doubling",
         "first rule: α-bound below ~64 KiB, where lg p messages beat 2(p-1) (ALGORITHMS.md cost "
         "table; MPICH uses recursive doubling for short vectors). To be re-measured by ringcoll-bench."),
    Rule("all_reduce", None, "ring",
         "first rule: β-bound above 64 KiB; the ring moves 2(p-1)/p·n at any p without the fold's "
         "extra 2n that Rabenseifner pays at non-powers of two. To be re-measured by ringcoll-bench."),
)


def _override(collective: str) -> Optional[str]:
    setting = os.environ.get("RINGCOLL_ALGO", "").strip()
    if not setting:
        return None
    names = registry.algorithms(collective)
    for entry in setting.split(","):
        entry = entry.strip()
        if "=" in entry:
            coll, name = (part.strip() for part in entry.split("=", 1))
            if coll == collective:
                if name not in names:
                    raise ValueError(f"RINGCOLL_ALGO names {collective}={name!r}; {collective} has {names}")
                return name
        elif entry in names:
            return entry
    return None


def choose(collective: str, algorithm: str, nbytes: int, world: int) -> tuple[str, str]:
    """The algorithm to run and why: an explicit name (checked), the RINGCOLL_ALGO override,
    or the first matching rule of the table."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str, got {type(algorithm).__name__} {algorithm!r}")
    if algorithm != "auto":
        registry.get(collective, algorithm)          # ValueError naming the choices
        return algorithm, "requested"
    forced = _override(collective)
    if forced is not None:
        return forced, "RINGCOLL_ALGO"
    names = registry.algorithms(collective)
    for rule in RULES:
        if rule.collective == collective and rule.world(world) and (
                rule.max_bytes is None or nbytes <= rule.max_bytes) and rule.algorithm in names:
            return rule.algorithm, f"auto: {rule.evidence.split(';')[0]}"
    return names[0], "auto: no rule, first registered"


def configure_logging() -> None:
    """``RINGCOLL_DEBUG=INFO`` (or DEBUG, WARNING ...) logs each call's choice to stderr."""
    level = os.environ.get("RINGCOLL_DEBUG")
    if level and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ringcoll %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(level.upper())
