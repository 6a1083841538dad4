"""Node-aware algorithms: work inside each node first, cross nodes with less, finish inside.

Horovod's hierarchical all-reduce (local ncclReduceScatter, MPI all-reduce of the shard
across nodes, local ncclAllGather; ``nccl_operations.cc``) and leader-based rooted and gathering
collectives (MPICH's SMP-aware collectives). The rings and the two-level all-reduce here also
serve the torus algorithms (:mod:`ringcoll.schedules.torus`).

The node of every rank comes in ``layout[NODES]`` (:mod:`ringcoll.runtime.nodes`: the
simulator's ``local_size``, else the placement the group's ranks agreed on by exchange, from
``RINGCOLL_LOCAL_SIZE``, torchrun's ``GROUP_RANK`` or the hostnames). Nodes may differ in size
and need not hold consecutive ranks. A node's
**members** are its ranks in rank order; its **leader** is its first member (for rooted
collectives, the root leads its own node).
"""
from __future__ import annotations

import bisect
import functools
from typing import Iterator, List, Optional, Sequence, Tuple

from .registry import Cost, register
from .vocabulary import (IN_PLACE, NODES, ROOT, Buf, Copy, Layout, Nodes, Recv, Send, Step, ceil_log2, chunk_bounds,
                         chunks, needs_nodes, reduce, span, step)
from .trees import binomial


def members_of(nodes: Nodes) -> List[List[int]]:
    """The ranks of each node, in rank order."""
    members: List[List[int]] = [[] for _ in range(max(nodes, default=-1) + 1)]
    for rank, node in enumerate(nodes):
        members[node].append(rank)
    return members


def _nodes(layout: Layout, world: int) -> Nodes:
    nodes = tuple(layout.get(NODES) or (0,) * world)
    if len(nodes) != world:
        raise ValueError(f"layout['nodes'] must give the node of each of the {world} ranks, got {len(nodes)}")
    return nodes


# -- rings and trees over a subset of the ranks ----------------------------------------------
Block = Tuple[Buf, ...]          # what one ring position owns: one chunk, or several (a node's ranks' blocks)


def _as_block(block) -> Block:
    return block if isinstance(block, tuple) else (block,)


def ring_reduce_scatter(ring: Sequence[int], me: int, blocks: Sequence, slot: int = 0) -> Iterator[Step]:
    """Reduce-scatter of ``blocks`` (one per ring position; a block is a chunk or a tuple of
    chunks) around ``ring`` (ranks in ring order; ``me`` this rank's position): at step s
    position m sends its partial of block m - s - 1 to the right and reduces the partial of
    block m - s - 2 from the left into its own, receiving into two scratch slots used in
    turn (from element ``slot`` on); after len - 1 steps position m holds block m reduced."""
    size = len(ring)
    right, left = ring[(me + 1) % size], ring[(me - 1) % size]
    blocks = [_as_block(p) for p in blocks]
    width = max(sum(b.numel for b in p) for p in blocks)
    for s in range(size - 1):
        send, target = blocks[(me - s - 1) % size], blocks[(me - s - 2) % size]
        start = slot + (s % 2) * width
        comms = [Send(right, b) for b in send]
        local = []
        for b in target:
            recv_buf = Buf("scratch", start, start + b.numel)
            start += b.numel
            comms.append(Recv(left, recv_buf))
            local.append(reduce(b, recv_buf))
        yield step(comms, local)


def ring_all_gather(ring: Sequence[int], me: int, blocks: Sequence) -> Iterator[Step]:
    """All-gather of ``blocks`` around ``ring``, position m starting with block m: at step s
    it sends block m - s to the right and receives block m - s - 1 from the left in place."""
    size = len(ring)
    right, left = ring[(me + 1) % size], ring[(me - 1) % size]
    for s in range(size - 1):
        yield step([Send(right, b) for b in _as_block(blocks[(me - s) % size])] +
                   [Recv(left, b) for b in _as_block(blocks[(me - s - 1) % size])])


def tree_broadcast(order: Sequence[int], me: int, data: Buf) -> Iterator[Step]:
    """Binomial broadcast of ``data`` over the ranks ``order`` (order[0] the root; ``me``
    this rank's index), largest subtree first."""
    parent, children = binomial(me, len(order))
    if parent is not None:
        yield step([Recv(order[parent], data)])
    for child in children:
        yield step([Send(order[child], data)])


def tree_reduce(order: Sequence[int], me: int, data: Buf, scratch: Buf) -> Iterator[Step]:
    """Binomial reduce into ``data`` over the ranks ``order`` (order[0] the root), the
    smallest subtree (ready first) taken first."""
    parent, children = binomial(me, len(order))
    for child in reversed(children):
        yield step([Recv(order[child], scratch)], [reduce(data, scratch)])
    if parent is not None:
        yield step([Send(order[parent], data)])


def runs(blocks: Sequence[Buf]) -> Block:
    """Blocks of one buffer merged where they touch: the fewest chunks that cover them."""
    merged: List[Buf] = []
    for b in blocks:
        if merged and merged[-1].stop == b.start:
            merged[-1] = Buf(b.name, merged[-1].start, b.stop)
        else:
            merged.append(b)
    return tuple(merged)


def node_period(world: int, layout: Layout) -> Optional[int]:
    """``symmetry`` of the two-level schedules: nodes of L consecutive ranks, all alike, and
    equal chunks (numel a multiple of the world) make rank r's schedule rank r % L's moved by
    a whole number of nodes, a rotation of period L."""
    return _rows_period(layout.get(NODES), world, layout.numel, False)


def _all_reduce_period(world: int, layout: Layout) -> Optional[object]:
    """``symmetry`` of the hierarchical all-reduce: :func:`node_period`, and on one node of
    every rank the ring all-reduce, the same on every rank up to a rotation (period 1). (The
    hierarchical reduce-scatter and all-gather order a node's ring so that each rank ends with
    its own block: not a rotation inside one node.)"""
    return _rows_period(layout.get(NODES), world, layout.numel, True)


def _rows_period(nodes, world: int, numel: int, whole_ring: bool) -> Optional[object]:
    """The rotation period of the two-level rings over ``nodes`` (see :func:`node_period`);
    one node of every rank: "rotation" with ``whole_ring``, else None."""
    if not nodes or numel % world:
        return None
    local = sum(1 for node in nodes if node == nodes[0])
    if world % local or any(node != rank // local for rank, node in enumerate(nodes)):
        return None
    if local == world:
        return "rotation" if whole_ring else None
    return local


def two_level_all_reduce(rank: int, world: int, nodes: Nodes, numel: int) -> Iterator[Step]:
    """Reduce-scatter inside each node, all-reduce of each shard across nodes, all-gather
    inside each node, every phase a ring (see :func:`all_reduce_hierarchical`)."""
    members, owned = _two_level_blocks(tuple(nodes), numel)
    mine = members[nodes[rank]]
    local = mine.index(rank)
    own = chunks("data", numel, len(mine))
    # 1. reduce-scatter inside the node: local rank l ends with chunk l of its node's cut
    yield from ring_reduce_scatter(mine, local, own)
    # 2. across nodes: the blocks this rank owns, each all-reduced by a ring of its owners
    for lo, hi, owners, me in owned.get(rank, ()):
        blocks = chunks("data", hi - lo, len(owners), lo)
        yield from ring_reduce_scatter(owners, me, blocks)
        yield from ring_all_gather(owners, me, blocks)
    # 3. all-gather inside the node
    yield from ring_all_gather(mine, local, own)


@functools.lru_cache(maxsize=8)
def _two_level_blocks(nodes: Tuple[int, ...], numel: int):
    """The members of each node, and per rank the blocks it all-reduces across nodes, found
    once per (nodes, numel) for every rank: the blocks where all nodes' cuts agree, in
    ascending order (so that ranks that own several, on uneven nodes, meet their partners in
    the same order), each with its owners, one per node in node order, and the rank's place
    among them (``(lo, hi, owners, me)``); a block's owner on a node is the one whose chunk
    of the node's cut holds it."""
    members = members_of(nodes)
    bounds = [chunk_bounds(numel, len(m)) for m in members]
    cuts = sorted({b for node_bounds in bounds for b in node_bounds})
    owned: dict = {}
    if len(members) < 2:
        return members, owned
    for lo, hi in zip(cuts, cuts[1:]):
        owners = [m[bisect.bisect_right(b, lo) - 1] for m, b in zip(members, bounds)]
        for me, owner in enumerate(owners):
            owned.setdefault(owner, []).append((lo, hi, owners, me))
    return members, owned


def two_level_cost(world: int, nbytes: int, local: int) -> Cost:
    """Even nodes of ``local`` ranks, N = p / local of them."""
    local = max(1, min(local, world))
    count = -(-world // local)
    inner = (local - 1) / local * nbytes
    outer = (count - 1) / (count * local) * nbytes
    return Cost(2 * (local - 1) + 2 * (count - 1), 2 * inner + 2 * outer, inner + outer)


def _local_size(world: int, local_size: Optional[int] = None) -> int:
    """Ranks per node for the cost models: ``local_size`` as the caller gives it (the
    simulator's ``local_size=``; :func:`ringcoll.schedules.registry.model` gives
    RINGCOLL_LOCAL_SIZE's when its caller gives none), else one node of all."""
    return local_size or world


def _all_reduce_cost(world: int, nbytes: int, local_size: Optional[int] = None) -> Cost:
    return two_level_cost(world, nbytes, _local_size(world, local_size))


@register("all_reduce", "hierarchical", cost=_all_reduce_cost, symmetry=_all_reduce_period, preference=40)
@needs_nodes
def all_reduce_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical all-reduce (Horovod's): (1) a ring reduce-scatter among the L ranks of
    each node, local rank l ending with chunk l of the node's L chunks; (2) each chunk
    all-reduced across the N nodes by a ring (reduce-scatter then all-gather) of the ranks
    that own it, one per node; (3) a ring all-gather inside each node. Inter-node bytes per
    rank fall by L. Uneven nodes cut the vector differently: phase 2 then runs on the
    blocks where all the cuts agree, a rank that owns several blocks taking them in order.
    Every element is reduced once, along chains, then copied: bitwise identical.

    Cost: with N nodes of L ranks (p = NL), 2(L-1)α + 2(L-1)/L·nβ + (L-1)/L·nγ (inside) +
    2(N-1)α + 2(N-1)/(NL)·nβ + (N-1)/(NL)·nγ (across) = 2(L+N-2)α + 2(p-1)/p·nβ +
    (p-1)/p·nγ; L the caller's (simulate's nodes), else RINGCOLL_LOCAL_SIZE's (else one
    node: the ring's cost).
    """
    return two_level_all_reduce(rank, world, _nodes(layout, world), layout.numel)


# -- rooted and gathering collectives: leaders (MPICH's SMP-aware collectives) ----------------
def _levels(world: int, local_size: Optional[int] = None) -> Tuple[int, int]:
    """(L, N): ranks per node and nodes, for the cost models (even nodes; L given, else from
    the environment)."""
    local = max(1, min(_local_size(world, local_size), world))
    return local, -(-world // local)


def _rooted(rank: int, world: int, layout: Layout) -> Tuple[List[int], List[int]]:
    """The leaders, the root's node first and the root leading it, and this rank's node in
    tree order (its leader first)."""
    nodes = _nodes(layout, world)
    members = members_of(nodes)
    root = layout[ROOT]
    order = [nodes[root]] + [i for i in range(len(members)) if i != nodes[root]]
    leaders = [root if i == nodes[root] else members[i][0] for i in order]
    mine = members[nodes[rank]]
    lead = root if nodes[rank] == nodes[root] else mine[0]
    return leaders, [lead] + [r for r in mine if r != lead]


def _broadcast_cost(world: int, nbytes: int, local_size: Optional[int] = None) -> Cost:
    local, count = _levels(world, local_size)
    rounds = ceil_log2(count) + ceil_log2(local)
    return Cost(rounds, rounds * nbytes, 0)


@register("broadcast", "hierarchical", cost=_broadcast_cost, preference=40)
@needs_nodes
def broadcast_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical broadcast: a binomial broadcast among the node leaders (the root leading
    its node), then a binomial broadcast inside each node from its leader. Each byte
    crosses between nodes ⌈lg N⌉ times in all instead of up to ⌈lg p⌉. Any nodes.

    Cost: with N nodes of L ranks, (⌈lg N⌉ + ⌈lg L⌉)(α + nβ).
    """
    leaders, local = _rooted(rank, world, layout)
    data = Buf("data", 0, layout.numel)
    if rank in leaders:
        yield from tree_broadcast(leaders, leaders.index(rank), data)
    yield from tree_broadcast(local, local.index(rank), data)


def _reduce_cost(world: int, nbytes: int, local_size: Optional[int] = None) -> Cost:
    local, count = _levels(world, local_size)
    rounds = ceil_log2(count) + ceil_log2(local)
    return Cost(rounds, rounds * nbytes, rounds * nbytes)


@register("reduce", "hierarchical", cost=_reduce_cost, preference=40)
@needs_nodes
def reduce_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical reduce: a binomial reduce inside each node to its leader (the root
    leading its own node), then a binomial reduce of the leaders' results to the root.
    Any nodes.

    Cost: with N nodes of L ranks, (⌈lg L⌉ + ⌈lg N⌉)(α + nβ + nγ).
    """
    leaders, local = _rooted(rank, world, layout)
    data, scratch = Buf("data", 0, layout.numel), Buf("scratch", 0, layout.numel)
    yield from tree_reduce(local, local.index(rank), data, scratch)
    if rank in leaders:
        yield from tree_reduce(leaders, leaders.index(rank), data, scratch)


def _gathering(rank: int, world: int, layout: Layout, name: str):
    """The leaders (each node's first member), this rank's node, and the blocks of ``name``
    that each node's ranks own, merged into runs."""
    members = members_of(_nodes(layout, world))
    blocks = chunks(name, layout.numel, world)
    leaders = [m[0] for m in members]
    node_blocks = [runs([blocks[r] for r in m]) for m in members]
    return leaders, members[_nodes(layout, world)[rank]], blocks, node_blocks


def _all_gather_cost(world: int, nbytes: int, local_size: Optional[int] = None) -> Cost:
    local, count = _levels(world, local_size)
    block = nbytes / world
    return Cost(local - 1 + count - 1 + ceil_log2(local),
                (local - 1) * block + (count - 1) * local * block + ceil_log2(local) * nbytes, 0)


@register("all_gather", "hierarchical", cost=_all_gather_cost, symmetry=node_period, preference=40)
@needs_nodes
def all_gather_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical all-gather (MPICH's SMP all-gather): each node's leader (its first rank)
    receives its members' blocks straight into place in one step; the leaders pass their
    nodes' blocks around a ring (a node's blocks merged into as few chunks as they allow);
    each leader broadcasts the whole output inside its node down a binomial tree. Blocks
    are only copied: bitwise identical. Any nodes.

    Cost: with N nodes of L ranks, (L-1)(α + n/p·β) + (N-1)(α + L·n/p·β) + ⌈lg L⌉(α + nβ)
    (n: the gathered total).
    """
    leaders, mine, output, node_blocks = _gathering(rank, world, layout, "output")
    own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, output[rank].numel)
    place = [] if own == output[rank] else [Copy(output[rank], own)]
    leader = mine[0]
    if rank == leader:
        yield step([Recv(m, output[m]) for m in mine[1:]], place)
        yield from ring_all_gather(leaders, leaders.index(rank), node_blocks)
    else:
        yield step([Send(leader, own)])
    yield from tree_broadcast(mine, mine.index(rank), span(output, 0, world))


def _reduce_scatter_cost(world: int, nbytes: int, local_size: Optional[int] = None) -> Cost:
    local, count = _levels(world, local_size)
    block = nbytes / world
    inner, across = ceil_log2(local) * nbytes, (count - 1) * local * block
    return Cost(ceil_log2(local) + count - 1 + local - 1, inner + across + (local - 1) * block, inner + across)


@register("reduce_scatter", "hierarchical", cost=_reduce_scatter_cost, symmetry=node_period, preference=40)
@needs_nodes
def reduce_scatter_hierarchical(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Hierarchical reduce-scatter: each node reduces its members' whole inputs to its leader
    down a binomial tree (in scratch: the inputs are never written); the leaders run a ring
    reduce-scatter of the nodes' blocks (node i's block: the blocks of its ranks); each
    leader hands every member its block in one step. Each block is reduced along one tree
    ending on its owner. Any nodes.

    Cost: with N nodes of L ranks, ⌈lg L⌉(α + nβ + nγ) + (N-1)(α + L·n/p·(β + γ)) +
    (L-1)(α + n/p·β) (n: the input total).
    """
    leaders, mine, acc, node_blocks = _gathering(rank, world, layout, "acc")
    whole = span(acc, 0, world)
    yield step(local=[Copy(whole, Buf("input", 0, layout.numel))])
    yield from tree_reduce(mine, mine.index(rank), whole, Buf("scratch", 0, layout.numel))
    output = Buf("output", 0, acc[rank].numel)
    if rank == mine[0]:
        yield from ring_reduce_scatter(leaders, leaders.index(rank), node_blocks)
        yield step([Send(m, acc[m]) for m in mine[1:]], [Copy(output, acc[rank])])
    else:
        yield step([Recv(mine[0], output)])
