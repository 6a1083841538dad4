"""Node-aware algorithms: work inside each node first, cross nodes with less, finish inside.

Horovod's hierarchical all-reduce (local ncclReduceScatter, MPI all-reduce of the shard
across nodes, local ncclAllGather; ``nccl_operations.cc``), the 2-D torus all-reduce (Sony
on ABCI, arXiv 1811.05233; Google on TPU v3, arXiv 1811.06992) and leader-based rooted and
gathering collectives (MPICH's SMP-aware collectives).

The node of every rank comes in ``layout["nodes"]`` (:mod:`ringcoll.topology`: the
simulator's ``local_size``, ``RINGCOLL_LOCAL_SIZE``, torchrun's ``LOCAL_WORLD_SIZE`` or the
hostnames). Nodes may differ in size and need not hold consecutive ranks. A node's
**members** are its ranks in rank order; its **leader** is its first member (for rooted
collectives, the root leads its own node).
"""
from __future__ import annotations

import os
from typing import Iterator, List, Sequence, Tuple

from ..registry import Cost, register
from ..schedule import Buf, Copy, Layout, Recv, Send, Step, chunk_bounds, chunks, reduce, sendrecv, step
from ..topology import Nodes, needs_nodes
from .all_gather import span
from .trees import binomial, relabel


def members_of(nodes: Nodes) -> List[List[int]]:
    """The ranks of each node, in rank order."""
    members: List[List[int]] = [[] for _ in range(max(nodes, default=-1) + 1)]
    for rank, node in enumerate(nodes):
        members[node].append(rank)
    return members


def _nodes(layout: Layout, world: int) -> Nodes:
    nodes = tuple(layout.get("nodes") or (0,) * world)
    if len(nodes) != world:
        raise ValueError(f"layout['nodes'] must give the node of each of the {world} ranks, got {len(nodes)}")
    return nodes


# -- rings over a subset of the ranks ---------------------------------------------------------
def ring_reduce_scatter(ring: Sequence[int], me: int, pieces: List[Buf], slot: int) -> Iterator[Step]:
    """Reduce-scatter of ``pieces`` (one per ring position) around ``ring`` (ranks in ring
    order; ``me`` this rank's position): at step s position m sends its partial of piece
    m - s - 1 to the right and reduces the partial of piece m - s - 2 from the left into its
    own, alternating two scratch slots of ``slot`` elements (``slot`` on: the first slot's
    offset); after len - 1 steps position m holds piece m fully reduced."""
    size = len(ring)
    right, left = ring[(me + 1) % size], ring[(me - 1) % size]
    width = max(p.numel for p in pieces)
    for s in range(size - 1):
        send, target = pieces[(me - s - 1) % size], pieces[(me - s - 2) % size]
        start = slot + (s % 2) * width
        recv_buf = Buf("scratch", start, start + target.numel)
        yield step(sendrecv(right, send, left, recv_buf), [reduce(target, recv_buf)])


def ring_all_gather(ring: Sequence[int], me: int, pieces: List[Buf]) -> Iterator[Step]:
    """All-gather of ``pieces`` around ``ring``, position m starting with piece m: at step s
    it sends piece m - s to the right and receives piece m - s - 1 from the left in place."""
    size = len(ring)
    right, left = ring[(me + 1) % size], ring[(me - 1) % size]
    for s in range(size - 1):
        yield step(sendrecv(right, pieces[(me - s) % size], left, pieces[(me - s - 1) % size]))


def two_level_all_reduce(rank: int, world: int, nodes: Nodes, numel: int) -> Iterator[Step]:
    """Reduce-scatter inside each node, all-reduce of each shard across nodes, all-gather
    inside each node, every phase a ring (see :func:`all_reduce_hierarchical`)."""
    members = members_of(nodes)
    mine = members[nodes[rank]]
    local = mine.index(rank)
    bounds = [chunk_bounds(numel, len(m)) for m in members]
    own = chunks("data", numel, len(mine))
    # 1. reduce-scatter inside the node: local rank l ends with chunk l of its node's cut
    yield from ring_reduce_scatter(mine, local, own, 0)
    # 2. across nodes: the pieces where all nodes' cuts agree, each all-reduced by a ring of
    # its owners, one per node, in node order; pieces in ascending order, so that ranks that
    # own several (uneven nodes) meet their partners in the same order
    cuts = sorted({b for node_bounds in bounds for b in node_bounds})
    for lo, hi in zip(cuts, cuts[1:]):
        if lo == hi:
            continue
        owners = [m[_owner(b, lo)] for m, b in zip(members, bounds)]
        if rank in owners and len(owners) > 1:
            me = owners.index(rank)
            pieces = chunks("data", hi - lo, len(owners), lo)
            yield from ring_reduce_scatter(owners, me, pieces, 0)
            yield from ring_all_gather(owners, me, pieces)
    # 3. all-gather inside the node
    yield from ring_all_gather(mine, local, own)


def _owner(bounds: List[int], element: int) -> int:
    """The chunk of a node's cut that holds ``element``."""
    return next(i for i in range(len(bounds) - 1) if bounds[i] <= element < bounds[i + 1])


def _two_level_cost(world: int, nbytes: int, local: int) -> Cost:
    """Even nodes of ``local`` ranks, N = p / local of them."""
    local = max(1, min(local, world))
    count = -(-world // local)
    inner = (local - 1) / local * nbytes
    outer = (count - 1) / (count * local) * nbytes
    return Cost(2 * (local - 1) + 2 * (count - 1), 2 * inner + 2 * outer, inner + outer)


def _env_local_size(world: int) -> int:
    for name in ("RINGCOLL_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return world


def _all_reduce_cost(world: int, nbytes: int) -> Cost:
    return _two_level_cost(world, nbytes, _env_local_size(world))


@register("all_reduce", "hierarchical", cost=_all_reduce_cost)
@needs_nodes
def all_reduce_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical all-reduce (Horovod's): (1) a ring reduce-scatter among the L ranks of
    each node, local rank l ending with chunk l of the node's L chunks; (2) each chunk
    all-reduced across the N nodes by a ring (reduce-scatter then all-gather) of the ranks
    that own it, one per node; (3) a ring all-gather inside each node. Inter-node bytes per
    rank fall by L. Uneven nodes cut the vector differently: phase 2 then runs on the
    pieces where all the cuts agree, a rank that owns several pieces taking them in order.
    Every element is reduced once, along chains, then copied: bitwise identical.

    Cost: with N nodes of L ranks (p = NL), 2(L-1)α + 2(L-1)/L·nβ + (L-1)/L·nγ (inside) +
    2(N-1)α + 2(N-1)/(NL)·nβ + (N-1)/(NL)·nγ (across) = 2(L+N-2)α + 2(p-1)/p·nβ +
    (p-1)/p·nγ; L read from RINGCOLL_LOCAL_SIZE or LOCAL_WORLD_SIZE (else one node: the
    ring's cost).
    """
    return two_level_all_reduce(rank, world, _nodes(layout, world), layout.numel)


def torus_grid(world: int) -> Tuple[int, int]:
    """(X, Y) with X·Y = p and Y the largest divisor of p not above √p: rows of X ranks."""
    y = max(d for d in range(1, int(world ** 0.5) + 1) if world % d == 0) if world else 1
    return world // y, y


def _torus_cost(world: int, nbytes: int) -> Cost:
    return _two_level_cost(world, nbytes, torus_grid(world)[0])


@register("all_reduce", "torus2d", cost=_torus_cost)
def all_reduce_torus2d(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """2-D torus all-reduce on an X × Y grid, X·Y = p (rows of X consecutive ranks, Y the
    largest divisor of p not above √p): a ring reduce-scatter along each row, a ring
    all-reduce of each row chunk along its column, a ring all-gather along each row. Every
    ring runs between grid neighbours. A prime p has only the 1 × p grid, where this is the
    ring all-reduce (run as such, not refused). Same schedule as the hierarchical
    all-reduce with the rows as nodes.

    Cost: 2(X+Y-2)α + 2(p-1)/p·nβ + (p-1)/p·nγ.
    """
    x, _ = torus_grid(world)
    return two_level_all_reduce(rank, world, tuple(r // x for r in range(world)), layout.numel)
