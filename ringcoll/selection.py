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
    # all_gather / reduce_scatter / gather / scatter: nbytes is the gathered (scattered) total
    Rule("all_gather", 512 * KiB, "recursive_doubling",
         "first rule: MPICH's default (maint/tuning/coll/mpir/generic.json, ALGORITHMS.md): a "
         "power-of-two world and a total below 512 KiB take recursive doubling, lg p messages "
         "with no fold. To be re-measured by ringcoll-bench.",
         world=lambda world: world & (world - 1) == 0),
    Rule("all_gather", 80 * KiB, "bruck",
         "first rule: MPICH's default: other worlds below 80 KiB take Bruck, ⌈lg p⌉ messages at "
         "any p. To be re-measured by ringcoll-bench."),
    Rule("all_gather", None, "ring",
         "first rule: MPICH's default: the ring above, (p-1)/p·n on the wire with no rotation "
         "copy. To be re-measured by ringcoll-bench."),
    Rule("reduce_scatter", 512 * KiB, "recursive_halving",
         "first rule: MPICH's default for commutative ops (every ReduceOp): recursive halving "
         "below 512 KiB, lg p messages. To be re-measured by ringcoll-bench."),
    Rule("reduce_scatter", None, "pairwise",
         "first rule: MPICH's default above 512 KiB: pairwise exchange, every block straight to "
         "its owner, no fold. To be re-measured by ringcoll-bench."),
    Rule("gather", None, "binomial",
         "first rule: MPICH's default gather is the binomial tree at every size, ⌈lg p⌉ "
         "messages on the critical path. To be re-measured by ringcoll-bench."),
    Rule("scatter", None, "binomial",
         "first rule: MPICH's default scatter is the binomial tree at every size, ⌈lg p⌉ "
         "messages on the critical path. To be re-measured by ringcoll-bench."),
    # broadcast / reduce: nbytes is the vector. Measured 2026-12-02, gloo on 2 cores (heavily
    # shared: load 15), float32, root 1, median of 7, ms, p=4 / p=8. Broadcast 4 KiB: binomial
    # 5.1 / 6.3, pipelined_chain 4.3 / 8.1, scatter_allgather 10.6 / 32.2, double_binary_tree
    # 7.4 / 36.7; 256 KiB: 6.8 / 27.2, 13.0 / 27.9, 7.9 / 104, 19.6 / 64.3; 4 MiB: 18.2 / 50.8,
    # 119 / 440, 8.5 / 27.6, 41.8 / 253. Reduce 4 KiB: binomial 1.5 / 5.6, rabenseifner 3.2 /
    # 21.1, ring 2.3 / 8.3, double_binary_tree 4.2 / 8.2; 256 KiB: 2.0 / 10.3, 8.5 / 29.0, 5.1 /
    # 79.5, 8.4 / 25.1; 4 MiB: 9.9 / 29.5, 11.9 / 42.3, 116 / 381, 98 / 204. Here α is a process
    # wake-up (~1 ms), so the 64 KiB-segment pipelines pay it per segment and lose.
    Rule("broadcast", 256 * KiB, "binomial",
         "up to 256 KiB: lg p messages; measured 2026-12-02 (comment above): best or within 20% "
         "at p=4 and 8 for 4 KiB and 256 KiB (MPICH: binomial below 12 KiB or p < 8). To be "
         "re-measured by ringcoll-bench."),
    Rule("broadcast", None, "scatter_allgather",
         "above 256 KiB: 2(p-1)/p·n on the wire instead of lg p·n; measured 2026-12-02 at 4 MiB: "
         "8.5 ms vs binomial 18.2 at p=4, 27.6 vs 50.8 at p=8 (MPICH's long-message broadcast). "
         "To be re-measured by ringcoll-bench."),
    Rule("reduce", None, "binomial",
         "p <= 8: binomial measured fastest at every size; 2026-12-02 (comment above), 4 KiB to "
         "4 MiB, at p=4 and 8 (4 MiB: 9.9 ms vs rabenseifner 11.9 at p=4, 29.5 vs 42.3 at p=8). "
         "To be re-measured by ringcoll-bench.",
         world=lambda world: world <= 8),
    Rule("reduce", 64 * KiB, "binomial",
         "p > 8, up to 64 KiB: α-bound, lg p messages; the α-β-γ models cross between 12 and 64 "
         "KiB at α = 5 µs, 10 GB/s. Not measured (p > 8 needs more cores). To be re-measured by "
         "ringcoll-bench."),
    Rule("reduce", None, "rabenseifner",
         "p > 8, above 64 KiB: 2(p-1)/p·n on the wire and (p-1)/p·n reduced instead of lg p·n "
         "of each; MPICH's reduce_scatter_gather for long vectors. Not measured (p > 8 needs "
         "more cores). To be re-measured by ringcoll-bench."),
    # all_to_all: bytes = the largest block (what one rank sends to one peer), as MPICH's
    # thresholds. Bruck needs every rank to run it, so the builder skips its rule (taking the
    # next that matches) unless the call declares equal blocks (all_to_all_single, splits None).
    Rule("all_to_all", 256, "bruck",
         "blocks <= 256 B at p >= 8: ⌈lg p⌉ messages instead of p-1 (MPICH's short-message rule); "
         "measured 2026-12-02, gloo on 2 cores, p=8, median of 15: 8 B blocks bruck 11.8 ms vs "
         "linear 10.1 vs pairwise 31.4, 64 B 17.2 vs 18.4 vs 30.6 (a tie with linear here, where "
         "α is process wake-ups; the lg p advantage grows with p). To be re-measured by ringcoll-bench.",
         world=lambda world: world >= 8),
    Rule("all_to_all", 256 * KiB, "linear",
         "blocks <= 256 KiB: all p-1 exchanges in flight at once (MPICH's medium-message "
         "isend/irecv); measured 2026-12-02, gloo on 2 cores, median of 15: linear 1.2-3x faster "
         "than pairwise at p=4 and 8 for every block from 8 B to 256 KiB (p=8, 4 KiB: 19.8 ms vs "
         "33.3; 256 KiB: 15.4 vs 33.4). To be re-measured by ringcoll-bench."),
    Rule("all_to_all", None, "pairwise",
         "blocks > 256 KiB: one exchange in flight per step bounds the memory and contention "
         "(MPICH's long-message choice); measured 2026-12-02, gloo on 2 cores, median of 7, p=8: "
         "1 MiB blocks pairwise 57.8 ms vs linear 60.4, 4 MiB 147 vs 252 (at p=4 linear still led: "
         "35 vs 69 ms at 4 MiB). To be re-measured by ringcoll-bench."),
    Rule("barrier", None, "dissemination",
         "the only barrier: ⌈lg p⌉ steps at any p, no fold (Hensgen-Finkel-Manber; MPICH's default)."),
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


def choose(collective: str, algorithm: str, nbytes: int, world: int,
           exclude: tuple = ()) -> tuple[str, str]:
    """The algorithm to run and why: an explicit name (checked), the RINGCOLL_ALGO override,
    or the first matching rule of the table; ``auto`` never picks a name in ``exclude``
    (algorithms this call cannot run)."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str, got {type(algorithm).__name__} {algorithm!r}")
    if algorithm != "auto":
        registry.get(collective, algorithm)          # ValueError naming the choices
        return algorithm, "requested"
    forced = _override(collective)
    if forced is not None and forced not in exclude:
        return forced, "RINGCOLL_ALGO"
    names = [name for name in registry.algorithms(collective) if name not in exclude]
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


# -- segment sizes of the pipelined algorithms ------------------------------------------

@dataclass(frozen=True)
class SegmentRule:
    collective: str
    algorithm: str
    segment_bytes: int
    evidence: str


SEGMENTS = (
    SegmentRule("all_reduce", "ring", 1 * MiB,
                "gloo's own ring cuts ≤ 1 MiB segments (ALGORITHMS.md); to be re-measured."),
)

#: the pipelined algorithms' segment where no rule names one
DEFAULT_SEGMENT_BYTES = 1 * MiB


def segment_bytes(collective: Optional[str] = None, algorithm: Optional[str] = None) -> int:
    """The segment, in bytes, that ``collective``/``algorithm`` pipelines over: the
    ``RINGCOLL_SEGMENT`` environment variable (bytes), else the table, else the default."""
    forced = os.environ.get("RINGCOLL_SEGMENT")
    if forced:
        return max(1, int(forced))
    return next((rule.segment_bytes for rule in SEGMENTS
                 if rule.collective == collective and rule.algorithm == algorithm),
                DEFAULT_SEGMENT_BYTES)


def segment_elements(collective: str, algorithm: str, element_size: int) -> int:
    """:func:`segment_bytes` in elements of ``element_size`` bytes (at least one)."""
    return max(1, segment_bytes(collective, algorithm) // max(1, element_size))
