"""Bine trees (De Sensi et al., "Bine Trees: Enhancing Collective Operations by Optimizing
Communication Locality", SC'25, arXiv 2508.17311): binomial trees and butterflies whose
partners follow negabinary distances, so that they sit close together in modulo distance.

``bine`` broadcast and reduce run the tree as the authors' MPICH code does
(``MPIR_Bcast_intra_bine_lat``): distance halving, far partner first. On vranks (``vrank =
(rank - root) % p``, the root vrank 0) of the largest power of two pof2 ≤ p, with nb(v) the
negabinary digits of v: at step s = 0 .. lg pof2 - 1, with mask = pof2 / 2^(s+1), vrank v's
partner is nb⁻¹(nb(v) xor (2·mask - 1)) mod pof2; a vrank that holds the data sends to it,
and a vrank that does not receives from it when its nb(v)'s low lg(2·mask) digits are all 0
or all 1. At p = 64 the root serves 43, 11, 59, 3, 63, 1, and the parent-child ring
distances sum to 135 (binomial: 192). A world that is not a power of two ends with one
round more: vrank pof2 + v receives from vrank v once v's tree sends are done (MPICH's).

``bine_near`` keeps ringcoll's earlier order (the same negabinary distances run near first:
step s pairs vrank v with v ± ρ(s), ρ = 1, -1, 3, -5 ..., Swing's pairs; vranks left over
hang below their partner of step ⌊lg p⌋); its parent-child distances sum to 903 at p = 64.

The Bine butterfly all-reduce exchanges with the very pairs of Swing's bandwidth-optimal
all-reduce; ringcoll runs that one schedule for both names.
"""
from __future__ import annotations

import functools
from typing import Iterator, List, Optional, Tuple

from .registry import Cost, register
from .vocabulary import ROOT, Buf, Layout, Recv, Send, Step, reduce, step
from .swing import _rabenseifner_cost, butterfly, even_odd_rotation_when_even, swing_peer
from .trees import rooted


def negabinary(value: int) -> int:
    """The negabinary digits of ``value`` (base -2) as the bits of an int."""
    mask = 0xAAAAAAAAAAAAAAAA
    return (value + mask) ^ mask


def from_negabinary(digits: int) -> int:
    """The value of negabinary ``digits`` (the inverse of :func:`negabinary`)."""
    mask = 0xAAAAAAAAAAAAAAAA
    return (digits ^ mask) - mask


@functools.lru_cache(maxsize=64)
def bine_tree(world: int) -> Tuple[Tuple[Optional[int], ...], Tuple[Tuple[int, ...], ...]]:
    """(parent, children) of every vrank in the distance-halving Bine tree rooted at vrank 0
    (module docstring, ``MPIR_Bcast_intra_bine_lat``), each vrank's children in the order it
    serves them: far partner first, and vrank pof2 + v, when there is one, last."""
    pof2 = 1 << (world.bit_length() - 1) if world else 0
    parent: List[Optional[int]] = [None] * world
    children: List[List[int]] = [[] for _ in range(world)]
    for vrank in range(min(pof2, world)):
        digits = negabinary(vrank)
        held = vrank == 0
        mask = pof2 >> 1
        while mask:
            low = (mask << 1) - 1
            partner = from_negabinary(digits ^ low) % pof2
            if held:
                children[vrank].append(partner)
            elif digits & low in (0, low):
                parent[vrank], held = partner, True
            mask >>= 1
    for vrank in range(pof2, world):
        parent[vrank] = vrank - pof2
        children[vrank - pof2].append(vrank)
    for vrank in range(1, world):
        if parent[vrank] is None or vrank not in children[parent[vrank]]:
            raise AssertionError(f"bine: vrank {vrank} is not served by its parent at world {world}")
    return tuple(parent), tuple(tuple(c) for c in children)


@functools.lru_cache(maxsize=64)
def bine_tree_near(world: int) -> Tuple[Tuple[Optional[int], ...], Tuple[Tuple[int, ...], ...]]:
    """(parent, children) of every vrank in the near-first tree of ``bine_near`` (module
    docstring). The parity rule needs an even p (modulo an odd p, r and r + p differ in
    parity and the rounds collide): for odd p the tree is built over the first p - 1 vranks,
    and vrank p - 1, the root's neighbour on the ring, becomes the root's last child. For even
    p the ⌊lg p⌋ rounds reach 2^⌊lg p⌋ distinct vranks (checked for every even p up to 4096);
    each vrank left over hangs below its partner of step ⌊lg p⌋."""
    if world % 2 and world > 1:
        parent, children = bine_tree_near(world - 1)
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


def distance_sum(tree, world: int) -> int:
    """Sum over the tree's edges of the ring distance between parent and child."""
    parent, _ = tree
    return sum(min((v - u) % world, (u - v) % world) for v, u in enumerate(parent) if u is not None)


@functools.lru_cache(maxsize=128)
def _rounds(tree_of, world: int, reducing: bool) -> int:
    """The critical path of a tree in messages under one send and one receive port: a vrank
    serves its children one after the other (broadcast), or takes its children's results one
    after the other, last served first, once each is ready (reduce)."""
    parent, children = tree_of(world)
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


def _broadcast_cost(world: int, nbytes: int, tree_of=bine_tree) -> Cost:
    rounds = _rounds(tree_of, world, False) if world > 1 else 0
    return Cost(rounds, rounds * nbytes, 0)


def _reduce_cost(world: int, nbytes: int, tree_of=bine_tree) -> Cost:
    rounds = _rounds(tree_of, world, True) if world > 1 else 0
    return Cost(rounds, rounds * nbytes, rounds * nbytes)


def _tree_broadcast(tree_of, rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Receive the vector from the tree parent, then send it to the children in order, one
    send per step; data is only copied, so every rank ends with the root's bits."""
    root = layout[ROOT]
    vrank = (rank - root) % world
    parent, children = tree_of(world)
    data = Buf("data", 0, layout.numel)
    steps = [step([Recv(parent[vrank], data)])] if parent[vrank] is not None else []
    steps += [step([Send(child, data)]) for child in children[vrank]]
    yield from rooted(steps, root, world)


def _tree_reduce(tree_of, rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """The broadcast's tree run backwards: receive the children's partial results, the last
    served (smallest subtree, ready first) first, reducing each into the own vector, then
    send the result to the parent."""
    root = layout[ROOT]
    vrank = (rank - root) % world
    parent, children = tree_of(world)
    data = Buf("data", 0, layout.numel)
    scratch = Buf("scratch", 0, layout.numel)
    steps = [step([Recv(child, scratch)], [reduce(data, scratch)]) for child in reversed(children[vrank])]
    if parent[vrank] is not None:
        steps.append(step([Send(parent[vrank], data)]))
    yield from rooted(steps, root, world)


@register("broadcast", "bine", cost=_broadcast_cost, preference=20)
def broadcast_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine-tree broadcast as its authors wrote it (``MPIR_Bcast_intra_bine_lat``, module
    docstring): distance halving, far partner first. A vrank receives the vector from its
    parent, then sends it to its children, one send per step, partners at negabinary masks
    halving from pof2/2 to 1; when p is not a power of two, vrank v < p - pof2 then sends it
    to vrank pof2 + v. Data is only copied: every rank ends with the root's bits. Any p.

    Cost: ⌈lg p⌉(α + nβ) (lg pof2 rounds, one more when p is not a power of two).
    """
    return _tree_broadcast(bine_tree, rank, world, layout)


@register("reduce", "bine", cost=_reduce_cost, preference=20)
def reduce_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine-tree reduce: :func:`broadcast_bine`'s tree run backwards. A vrank first takes
    vrank pof2 + v's vector (when p is not a power of two), then its tree children's partial
    results from the nearest partner (mask 1) to the farthest, reducing each into its own,
    then sends the result to its parent. Any p.

    Cost: ⌈lg p⌉(α + nβ + nγ).
    """
    return _tree_reduce(bine_tree, rank, world, layout)


def _near_broadcast_cost(world: int, nbytes: int) -> Cost:
    return _broadcast_cost(world, nbytes, bine_tree_near)


def _near_reduce_cost(world: int, nbytes: int) -> Cost:
    return _reduce_cost(world, nbytes, bine_tree_near)


@register("broadcast", "bine_near", cost=_near_broadcast_cost, auto=False, preference=21)
def broadcast_bine_near(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine-tree broadcast, near partner first (ringcoll's earlier order, module docstring):
    at step s a vrank that holds the data sends it to vrank ± ρ(s) (Swing's pairs, distances
    1, 1, 3, 5 ...); a vrank reached at step s starts sending at step s + 1; vranks left over
    hang below their partner of step ⌊lg p⌋. Kept for comparison with ``bine``; ``auto``
    never picks it. Any p.

    Cost: ⌈lg p⌉(α + nβ) for powers of two; otherwise r(α + nβ) with r the tree's critical
    path in messages (⌊lg p⌋ + 1 or + 2: a few vranks take a last child).
    """
    return _tree_broadcast(bine_tree_near, rank, world, layout)


@register("reduce", "bine_near", cost=_near_reduce_cost, auto=False, preference=21)
def reduce_bine_near(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """:func:`broadcast_bine_near`'s tree run backwards: a vrank receives its children's
    partial results, the last-reached child first, reducing each into its own vector, then
    sends the result to its parent. ``auto`` never picks it. Any p.

    Cost: ⌈lg p⌉(α + nβ + nγ) for powers of two; otherwise r(α + nβ + nγ) with r the tree's
    critical path in messages.
    """
    return _tree_reduce(bine_tree_near, rank, world, layout)


@register("all_reduce", "bine", cost=_rabenseifner_cost, symmetry=even_odd_rotation_when_even, preference=20)
def all_reduce_bine(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bine butterfly all-reduce: a reduce-scatter with partners at negabinary distances
    (1, 1, 3, 5 ... doubling), then an all-gather on the same pairs in reverse order
    (halving), blocks numbered so that every message is one contiguous chunk. These are
    exactly Swing's bandwidth-optimal pairs and blocks, so this runs
    :func:`.swing.all_reduce_swing_bandwidth`'s schedule. Non-powers of two fold first (MPICH).

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not a power of two.
    """
    return butterfly(rank, world, layout)
