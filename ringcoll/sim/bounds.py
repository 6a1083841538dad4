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

With k send and k receive ports per rank (``Machine(ports=k)``) the latency bound is
⌈log_(1+k) p⌉ α and the bandwidth bounds are divided by k (:func:`lower_bounds`'s ``ports``).

No algorithm meets the latency and the bandwidth bound at once, so the three ratios are
reported apart: critical-path steps ÷ ⌈lg p⌉; the most bytes one rank sends or receives ÷
the bandwidth bound; the most bytes one rank reduces ÷ the compute bound. A ratio of 1 is
optimal; below 1 means the model's assumption is broken (a linear algorithm posting p - 1
messages in one step: its latency is in its port time, which the clock counts).
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Sequence

from ..schedules.registry import collective_of



class Bounds(NamedTuple):
    steps: int                      # ⌈lg p⌉ (⌈log_(1+k) p⌉ with k ports)
    bytes_moved: float              # bandwidth bound, bytes through one port
    bytes_reduced: float            # compute bound, bytes one rank reduces


def lower_bounds(collective: str, world: int, nbytes: float, ports: int = 1) -> Bounds:
    """The table's bounds; with ``ports`` k send and k receive ports per rank, the bytes
    through one port are the rank's ÷ k, and in one α a rank that knows a piece sends it to k
    others, so the ranks that know it grow at most (1 + k)-fold: ⌈log_(1+k) p⌉ steps (⌈lg p⌉
    at k = 1). The compute bound does not depend on ports."""
    family = collective_of(collective)
    share = (world - 1) / world * nbytes if world else 0.0
    bandwidth = {"broadcast": nbytes, "reduce": nbytes, "all_reduce": 2 * share, "barrier": 0.0}.get(family, share)
    compute = share if family in ("reduce", "reduce_scatter", "all_reduce") else 0.0
    return Bounds(_rounds(world, ports), bandwidth / ports, compute)


def node_bounds(collective: str, world: int, nbytes: float, nodes: Sequence[int], nic_ports: int = 1) -> Bounds:
    """The bounds across the node boundary of a 2-level machine, ranks on ``nodes[rank]``:
    what some node's NIC must carry, and the inter-node rounds. Each node is one process of
    the same collective among the N nodes (its ranks' data pre-combined for free), so the
    bounds above hold with N for p: all_reduce 2(N-1)/N·n through a NIC (Patarasuk & Yuan's
    bound for N processes); all_gather and reduce_scatter (p - L_k)/p·n into (out of) node k
    of L_k ranks; broadcast and reduce n; gather and scatter (p - L_root)/p·n, at least
    (p - L_max)/p·n whatever the root; all_to_all L_k(p - L_k)/p·n. In one inter-node α a NIC of
    k ports sends k messages, so the nodes that know a piece grow at most (1 + k)-fold:
    ⌈log_(1+k) N⌉ rounds. No compute bound (the flat one holds). A single node: zero."""
    family = collective_of(collective)
    sizes: Dict[int, int] = {}
    for node in nodes[:world]:
        sizes[node] = sizes.get(node, 0) + 1
    count = len(sizes)
    if count < 2 or family == "barrier":
        return Bounds(0 if count < 2 else _rounds(count, nic_ports), 0.0, 0.0)
    outside = max(world - size for size in sizes.values()) / world * nbytes
    moved = {"all_reduce": 2 * (count - 1) / count * nbytes, "broadcast": nbytes, "reduce": nbytes,
             "gather": (world - max(sizes.values())) / world * nbytes,
             "scatter": (world - max(sizes.values())) / world * nbytes,
             "all_to_all": max(size * (world - size) for size in sizes.values()) / world * nbytes,
             }.get(family, outside)
    return Bounds(_rounds(count, nic_ports), moved / nic_ports, 0.0)


def _rounds(count: int, ports: int) -> int:
    rounds, reach = 0, 1
    while reach < count:
        reach, rounds = reach * (1 + ports), rounds + 1
    return rounds


def ratios(collective: str, world: int, nbytes: float, stats) -> Dict[str, Optional[float]]:
    """The simulated run's ratios to the bounds (None where a bound is 0: nothing to move)."""
    bound = lower_bounds(collective, world, nbytes)
    moved = max(stats.max_bytes_sent, stats.max_bytes_received)

    def ratio(value, limit):
        return value / limit if limit else None

    return {"latency": ratio(stats.steps, bound.steps), "bandwidth": ratio(moved, bound.bytes_moved),
            "compute": ratio(stats.max_bytes_reduced, bound.bytes_reduced)}
