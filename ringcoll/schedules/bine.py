"""Bine trees (De Sensi et al., "Bine Trees: Enhancing Collective Operations by Optimizing
Communication Locality", SC'25, arXiv 2508.17311): binomial trees and butterflies whose
partners follow negabinary distances, so that they sit close together in modulo distance.

The Bine tree on vranks (``vrank = (rank - root) % p``, the root vrank 0): at step
s = 0 .. ⌊lg p⌋ - 1 every vrank that holds the data sends it to its step-s partner, vrank +
(-1)^s·d_s when the vrank is even and vrank - (-1)^s·d_s when odd, with d = 1, 1, 3, 5, 11,
21 ... = |ρ(s)| (Swing's distances, :func:`.swing.swing_peer`); a vrank reached at step s
starts sending at step s + 1. For even p these steps reach 2^⌊lg p⌋ distinct vranks
(checked for every even p up to 4096 by :func:`bine_tree`); when p is not a power of two
each vrank left over hangs below its partner of step ⌊lg p⌋, which therefore gets a last
child (so a few ranks may send twice in the last round). Odd p: the tree of p - 1 vranks,
and vrank p - 1 (the root's ring neighbour) the root's last child. Same number of rounds as the binomial tree, with partners
at distances 1, 1, 3, 5 ... instead of 1, 2, 4, 8 ... (the binomial tree's far-first order
reversed: here the near partners come first).

The Bine butterfly all-reduce exchanges with the very pairs of Swing's bandwidth-optimal
all-reduce; ringcoll runs that one schedule for both names.
"""
from __future__ import annotations

import functools
from typing import Iterator, List, Optional, Tuple

from . import broadcast, reduce  # noqa: F401 - the classic algorithms register (and are listed) first
from .registry import Cost, register
from .vocabulary import Buf, Layout, Recv, Send, Step, reduce, step
from .swing import _rabenseifner_cost, butterfly, swing_peer
from .trees import rooted


@functools.lru_cache(maxsize=64)
def bine_tree(world: int) -> Tuple[Tuple[Optional[int], ...], Tuple[Tuple[int, ...], ...]]:
    """(parent, children) of every vrank in the Bine tree rooted at vrank 0 (module
    docstring); each vrank's children in the order it serves them. The parity rule needs an
    even p (modulo an odd p, r and r + p differ in parity and the rounds collide): for odd
    p the tree is built over the first p - 1 vranks, and vrank p - 1, the root's neighbour
    on the ring, becomes the root's last child."""
    if world % 2 and world > 1:
        parent, children = bine_tree(world - 1)
        return parent + (0,), (children[0] + (world - 1,),) + children[1:] + ((),)
    parent: List[Optional[int]] = [None] * world
    children: List[List[int]] = [[] for _ in range(world)]
    full = world.bit_length() - 1            # ⌊lg p⌋ rounds reach 2^full vranks
    reached = [False] * world
    reached[0] = True
    frontier = [0]
    for s in range(full):
        for vrank in list(frontier):
            peer = swing_peer(vrank, s, world)
            if reached[peer]:
                raise AssertionError(f"bine: vrank {peer} reached twice at world {world}")
            reached[peer] = True
            parent[peer] = vrank
            children[vrank].append(peer)
            frontier.append(peer)
    for vrank in range(world):
        if not reached[vrank]:
            peer = swing_peer(vrank, full, world)
            if not reached[peer]:
                raise AssertionError(f"bine: vrank {vrank}'s last partner {peer} is not in the tree")
            parent[vrank] = peer
            children[peer].append(vrank)
    return tuple(parent), tuple(tuple(c) for c in children)


@functools.lru_cache(maxsize=64)
def _rounds(world: int, reducing: bool) -> int:
    """The critical path of the Bine tree in messages under one send and one receive port:
    a vrank serves its children one after the other (broadcast), or takes its children's
    results one after the other, last served first, once each is ready (reduce)."""
    parent, children = bine_tree(world)
    if not reducing:
        arrive = [0] * world
        for vrank in _top_down(children):
            for i, child in enumerate(children[vrank], 1):
                arrive[child] = arrive[vrank] + i
        return max(arrive)
    ready = [0] * world
    for vrank in reversed(_top_down(children)):
        t = 0
        for child in reversed(children[vrank]):
            t = max(t, ready[child]) + 1
        ready[vrank] = t
    return ready[0]


def _top_down(children) -> List[int]:
    order, i = [0], 0
    while i < len(order):
        order.extend(children[order[i]])
        i += 1
    return order


def _broadcast_cost(world: int, nbytes: int) -> Cost:
    rounds = _rounds(world, False) if world > 1 else 0
    return Cost(rounds, rounds * nbytes, 0)


@register("broadcast", "bine", cost=_broadcast_cost)
def broadcast_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine-tree broadcast: a vrank receives the vector from its Bine parent, then sends it
    to its children in the order they were reached (module docstring), one send per step.
    Data is only copied: every rank ends with the root's bits. Any p.

    Cost: ⌈lg p⌉(α + nβ) for powers of two; otherwise r(α + nβ) with r the tree's critical
    path in messages (⌊lg p⌋ + 1 or + 2: a few vranks take a last child).
    """
    root = layout["root"]
    yield from rooted(_broadcast((rank - root) % world, world, Buf("data", 0, layout.numel)), root, world)


def _broadcast(vrank: int, world: int, data: Buf) -> Iterator[Step]:
    parent, children = bine_tree(world)
    if parent[vrank] is not None:
        yield step([Recv(parent[vrank], data)])
    for child in children[vrank]:
        yield step([Send(child, data)])


def _reduce_cost(world: int, nbytes: int) -> Cost:
    rounds = _rounds(world, True) if world > 1 else 0
    return Cost(rounds, rounds * nbytes, rounds * nbytes)


@register("reduce", "bine", cost=_reduce_cost)
def reduce_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine-tree reduce, the broadcast's tree run backwards: a vrank receives its children's
    partial results, the last-reached child (smallest subtree, ready first) first, reducing
    each into its own vector, then sends the result to its parent. Any p.

    Cost: ⌈lg p⌉(α + nβ + nγ) for powers of two; otherwise r(α + nβ + nγ) with r the tree's
    critical path in messages.
    """
    root = layout["root"]
    vrank = (rank - root) % world
    parent, children = bine_tree(world)
    data = Buf("data", 0, layout.numel)
    scratch = Buf("scratch", 0, layout.numel)
    steps = [step([Recv(child, scratch)], [reduce(data, scratch)]) for child in reversed(children[vrank])]
    if parent[vrank] is not None:
        steps.append(step([Send(parent[vrank], data)]))
    yield from rooted(steps, root, world)


@register("all_reduce", "bine", cost=_rabenseifner_cost)
def all_reduce_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine butterfly all-reduce: a reduce-scatter with partners at negabinary distances
    (1, 1, 3, 5 ... doubling), then an all-gather on the same pairs in reverse order
    (halving), blocks numbered so that every message is one contiguous chunk. These are
    exactly Swing's bandwidth-optimal pairs and blocks, so this runs
    :func:`.swing.all_reduce_swing_bandwidth`'s schedule. Non-powers of two fold first (MPICH).

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not a power of two.
    """
    return butterfly(rank, world, layout)
