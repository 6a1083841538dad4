"""Lower bounds of Chan, Heimlich, Purkayastha & van de Geijn (CCPE 19(13), 2007, Table I) in
the single-port α-β-γ model, and an algorithm's ratios to them.

For p ranks and n bytes (the cost model's n: the vector, or the total of all blocks):

============================  =============  ==============  ===============
collective                    latency        bandwidth       compute
============================  =============  ==============  ===============
broadcast                     ⌈lg p⌉ α       n β             —
reduce                        ⌈lg p⌉ α       n β             (p-1)/p · n γ
scatter, gather, all_gather   ⌈lg p⌉ α       (p-1)/p · n β   —
reduce_scatter                ⌈lg p⌉ α       (p-1)/p · n β   (p-1)/p · n γ
all_reduce                    ⌈lg p⌉ α       2(p-1)/p · n β  (p-1)/p · n γ
all_to_all (n: one rank's)    ⌈lg p⌉ α       (p-1)/p · n β   —
barrier                       ⌈lg p⌉ α       —               —
============================  =============  ==============  ===============

No algorithm meets the latency and the bandwidth bound at once, so the three ratios are
reported apart: critical-path steps ÷ ⌈lg p⌉; the most bytes one rank sends or receives ÷
the bandwidth bound; the most bytes one rank reduces ÷ the compute bound. A ratio of 1 is
optimal; below 1 means the model's assumption is broken (a linear algorithm posting p - 1
messages in one step: its latency is in its port time, which the clock counts).
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

from ..schedules.vocabulary import ceil_log2

_FAMILY = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
           "all_to_all_single": "all_to_all"}


class Bounds(NamedTuple):
    steps: int                      # ⌈lg p⌉
    bytes_moved: float              # bandwidth bound, bytes through one rank's port
    bytes_reduced: float            # compute bound, bytes one rank reduces


def lower_bounds(collective: str, world: int, nbytes: float) -> Bounds:
    family = _FAMILY.get(collective, collective)
    lg = ceil_log2(world)
    share = (world - 1) / world * nbytes if world else 0.0
    bandwidth = {"broadcast": nbytes, "reduce": nbytes, "all_reduce": 2 * share, "barrier": 0.0}.get(family, share)
    compute = share if family in ("reduce", "reduce_scatter", "all_reduce") else 0.0
    return Bounds(lg, bandwidth, compute)


def ratios(collective: str, world: int, nbytes: float, stats) -> Dict[str, Optional[float]]:
    """The simulated run's ratios to the bounds (None where a bound is 0: nothing to move)."""
    bound = lower_bounds(collective, world, nbytes)
    moved = max(stats.max_bytes_sent, stats.max_bytes_received)

    def ratio(value, limit):
        return value / limit if limit else None

    return {"latency": ratio(stats.steps, bound.steps), "bandwidth": ratio(moved, bound.bytes_moved),
            "compute": ratio(stats.max_bytes_reduced, bound.bytes_reduced)}
