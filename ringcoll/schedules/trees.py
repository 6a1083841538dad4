"""Trees and pipelines shared by the rooted collectives and the tree all-reduce.

Words: a **vrank** is a rank counted from the root, ``vrank = (rank - root) % world``;
rooted algorithms are written on vranks (the root is vrank 0) and :func:`relabel` turns
their peers back into ranks. A **tree** gives every rank its parent (None at the top) and its
children; its **depth** is a rank's distance from the top and its **height** the largest
depth.

A pipelined tree runs on one clock shared by every rank, so that any two ranks that exchange
a segment do it in the same global step, whatever trees they share (a rank near the top of
one tree may be near the bottom of the other, and the two trees must not wait on each other):

- down (broadcast): a rank at depth d receives segment j from its parent at step
  ``j + d - 1`` and sends it to its children at step ``j + d``;
- up (reduce): a rank at depth d receives segment j from each child at step
  ``j + height - d - 1``, reduces them into its own (children in a fixed order), and sends
  the result to its parent at step ``j + height - d``.

Steps where a rank has nothing to do are left out. For the simulator's port-limited clock
(the layout's ``ONE_PORT``, the default) the double trees (:class:`TreePipeline`) split each
global step into one step per colour of a proper colouring of its messages
(:func:`port_colors`), so that a rank sends and receives at most one message at a time and
nothing queues on a port; on a real group (``ONE_PORT`` False, set by the P2P executor) and
for the chains, each global step's transfers are posted together, as one step. Either way
both ends of every pair post in the same order (colour order, else phase order), so messages
match.
"""
from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .vocabulary import (DEFAULT_SEGMENT_BYTES, ONE_PORT, SEGMENT, Buf, Layout, Recv, Send, Step, ceil_log2, reduce,
                         segments, step)

def segment_numel(layout: Layout, itemsize: int = 4) -> int:
    """The segment size in elements: the layout's :data:`~.vocabulary.SEGMENT` (the builders take it from
    the segment table, ringcoll.selection.SEGMENTS), else the default segment of
    ``itemsize``-byte elements (4 when the builder does not say)."""
    segment = layout.get(SEGMENT)
    return segment if segment else max(1, DEFAULT_SEGMENT_BYTES // itemsize)


def segment_count(nbytes: float, segment: Optional[int] = None) -> int:
    """How many segments ``nbytes`` makes (at least one), for the cost models: segments of
    ``segment`` bytes (the plan's, which :func:`ringcoll.schedules.registry.model`'s caller
    gives), else of :data:`DEFAULT_SEGMENT_BYTES`."""
    return max(1, -(-int(nbytes) // (segment or DEFAULT_SEGMENT_BYTES)))


def relabel(steps: Iterable[Step], rank_of: Callable[[int], int]) -> Iterator[Step]:
    """The same steps with every peer ``p`` replaced by ``rank_of(p)``."""
    for st in steps:
        yield Step(tuple(type(c)(rank_of(c.peer), c.buf) for c in st.comms), st.local)


def rooted(steps: Iterable[Step], root: int, world: int) -> Iterator[Step]:
    """Steps written on vranks (root = vrank 0), with their peers turned into ranks."""
    if root == 0:
        return iter(steps)                  # vranks are ranks
    return relabel(steps, lambda vrank: (vrank + root) % world)


# -- binomial tree ----------------------------------------------------------------------------
def binomial(vrank: int, world: int) -> Tuple[Optional[int], List[int]]:
    """A vrank's parent and children in the binomial tree rooted at vrank 0, children
    largest subtree first: vrank v's subtree is ``[v, v + lowbit(v))`` (vrank 0's: all)."""
    low = vrank & -vrank if vrank else 1 << ceil_log2(world)
    parent = vrank - low if vrank else None
    children = []
    mask = low >> 1
    while mask:
        if vrank + mask < world:
            children.append(vrank + mask)
        mask >>= 1
    return parent, children


def binomial_span(vrank: int, world: int) -> Tuple[int, int]:
    """The vranks ``[lo, hi)`` of vrank's binomial subtree."""
    low = vrank & -vrank if vrank else 1 << ceil_log2(world)
    return vrank, min(vrank + low, world)


# -- NCCL's double binary tree --------------------------------------------------------------
def nccl_btree(world: int, rank: int) -> Tuple[Optional[int], List[int]]:
    """NCCL's binary tree (``ncclGetBtree``): the in-order tree on the bits of the rank. A rank
    whose lowest set bit is b has parent ``(rank ^ b) | 2b`` (``rank ^ b`` when that is past the
    end) and children ``rank - b/2`` and ``rank + b/2`` (the latter halved until it fits).
    Rank 0 is the top, with one child: the largest power of two below world. Odd ranks are
    leaves."""
    if rank == 0:
        return None, ([1 << (ceil_log2(world) - 1)] if world > 1 else [])
    bit = rank & -rank
    parent = (rank ^ bit) | (bit << 1)
    if parent >= world:
        parent = rank ^ bit
    children = []
    low = bit >> 1
    if low:
        children.append(rank - low)
        while low and rank + low >= world:
            low >>= 1
        if low:
            children.append(rank + low)
    return parent, children


def nccl_dtree(world: int, rank: int) -> Tuple[Tuple[Optional[int], List[int]], Tuple[Optional[int], List[int]]]:
    """NCCL's double binary tree (``ncclGetDtree``): the binary tree, and the same tree mirrored
    (``world - 1 - rank``) when world is even or shifted by one (``rank - 1``) when it is odd,
    so that every rank is interior in at most one of the two (rank 0, the first tree's top with
    one child, excepted when world is odd)."""
    first = nccl_btree(world, rank)
    if world % 2:
        to, back = (lambda r: (r - 1) % world), (lambda r: (r + 1) % world)
    else:
        to = back = (lambda r: world - 1 - r)
    parent, children = nccl_btree(world, to(rank))
    second = (None if parent is None else back(parent), [back(c) for c in children])
    return first, second


@dataclass(frozen=True)
class Tree:
    """A tree over ``world`` ranks: each rank's parent (None at the top), children and depth."""

    parent: Tuple[Optional[int], ...]
    children: Tuple[Tuple[int, ...], ...]
    depth: Tuple[int, ...]

    @functools.cached_property
    def height(self) -> int:
        return max(self.depth)

    @staticmethod
    def build(world: int, node: Callable[[int], Tuple[Optional[int], Sequence[int]]]) -> "Tree":
        """The tree whose rank r has ``node(r) = (parent, children)``."""
        nodes = [node(r) for r in range(world)]
        parent = tuple(p for p, _ in nodes)
        depth = []
        for r in range(world):
            d, up = 0, parent[r]
            while up is not None:
                d, up = d + 1, parent[up]
                if d > world:
                    raise ValueError(f"the tree over {world} ranks has a cycle through rank {r}")
            depth.append(d)
        return Tree(parent, tuple(tuple(c) for _, c in nodes), tuple(depth))

    @staticmethod
    def chain(order: Sequence[int]) -> "Tree":
        """The chain ``order[0] -> order[1] -> ...`` (order[0] at the top) over ranks 0..len-1
        (built once per order: every rank of a simulated world asks for the same one)."""
        return _chain(tuple(order))


@functools.lru_cache(maxsize=16)
def _chain(order: Tuple[int, ...]) -> Tree:
    world = len(order)
    parent: List[Optional[int]] = [None] * world
    children: List[Tuple[int, ...]] = [()] * world
    depth = [0] * world
    for d, r in enumerate(order):
        depth[r] = d
        if d:
            parent[r] = order[d - 1]
            children[order[d - 1]] = (r,)
    return Tree(tuple(parent), tuple(children), tuple(depth))


@functools.lru_cache(maxsize=16)
def all_reduce_trees(world: int) -> Tuple[Tree, Tree]:
    """NCCL's two trees over all ranks (for the unrooted all-reduce), built once per world:
    each rank's schedule reads its own node and the trees' heights, so rebuilding them per
    rank would cost O(world) per rank in a simulated world."""
    trees = [nccl_dtree(world, r) for r in range(world)]
    return Tree.build(world, lambda r: trees[r][0]), Tree.build(world, lambda r: trees[r][1])


@functools.lru_cache(maxsize=16)
def rooted_trees(world: int) -> Tuple[Tree, Tree]:
    """Two trees on vranks for a rooted collective: NCCL's double binary tree over the
    world - 1 vranks other than the root (vrank i + 1 plays NCCL rank i), and the root, vrank
    0, above the top of each. The root thus has one child per tree and every other vrank is
    interior in at most one tree, except, as in NCCL, NCCL's rank 0 (vrank 1) when world - 1
    is odd: the top of the first tree, with one child there. Built once per world."""
    if world == 1:
        single = Tree((None,), ((),), (0,))
        return single, single
    rest = world - 1
    nodes = [nccl_dtree(rest, i) for i in range(rest)]
    trees = []
    for which in (0, 1):
        def node(vrank: int, which=which):
            if vrank == 0:
                top = next(i for i in range(rest) if nodes[i][which][0] is None)
                return None, [top + 1]
            parent, children = nodes[vrank - 1][which]
            return (0 if parent is None else parent + 1), [c + 1 for c in children]
        trees.append(Tree.build(world, node))
    return trees[0], trees[1]


@functools.lru_cache(maxsize=16)
def all_reduce_pipeline(world: int) -> "TreePipeline":
    """The tree all-reduce's four pipelines, once per world: the first tree up, then down
    from its top's step on, the second tree likewise."""
    first, second = all_reduce_trees(world)
    return TreePipeline(((first, True, 0), (first, False, first.height),
                         (second, True, 0), (second, False, second.height)))


@functools.lru_cache(maxsize=32)
def rooted_pipeline(world: int, up: bool) -> "TreePipeline":
    """The rooted double tree's two pipelines, both up (reduce) or both down (broadcast),
    once per world."""
    return TreePipeline(tuple((tree, up, 0) for tree in rooted_trees(world)))


def halves(numel: int, segment: int, name: str = "data") -> Tuple[List[Buf], List[Buf]]:
    """The vector cut in two halves (the first one element longer when numel is odd), each
    cut into segments: what the two trees carry."""
    mid = (numel + 1) // 2
    return segments(Buf(name, 0, mid), segment), segments(Buf(name, mid, numel), segment)


# -- pipelines over trees --------------------------------------------------------------------
@dataclass(frozen=True)
class Phase:
    """One tree carrying ``segs`` in one direction, starting at global step ``offset``;
    ``scratch`` is the first slot of the scratch this phase receives into (up only)."""

    tree: Tree
    segs: Sequence[Buf]
    up: bool
    offset: int = 0
    scratch: int = 0


def port_colors(pairs: Sequence[Tuple[int, int]]) -> List[int]:
    """A colour for every message ``(sender, receiver)`` such that no rank sends two messages
    of one colour nor receives two: a proper edge colouring of the bipartite graph senders ->
    receivers, with as many colours as the busiest rank has messages to send or to receive
    (König's theorem; Kempe-chain flips, as in the classic proof). Messages are coloured
    in order, each with the earliest colour free at both ends where there is one, so earlier
    messages tend to go in earlier steps. Steps split by colour
    thus ask each rank for at most one send and one receive at a time, which one send and
    one receive port carry without queueing."""
    colour_of = [-1] * len(pairs)
    at_sender: Dict[int, Dict[int, int]] = defaultdict(dict)      # rank: colour -> message
    at_receiver: Dict[int, Dict[int, int]] = defaultdict(dict)

    def free(used: Dict[int, int]) -> int:
        colour = 0
        while colour in used:
            colour += 1
        return colour

    def paint(message: int, colour: int) -> None:
        sender, receiver = pairs[message]
        colour_of[message] = colour
        at_sender[sender][colour] = message
        at_receiver[receiver][colour] = message

    degree = max(max(Counter(s for s, _ in pairs).values(), default=0),
                 max(Counter(r for _, r in pairs).values(), default=0))
    for message, (sender, receiver) in enumerate(pairs):
        shared = next((c for c in range(degree)
                       if c not in at_sender[sender] and c not in at_receiver[receiver]), None)
        if shared is not None:          # the earliest colour free at both ends
            paint(message, shared)
            continue
        a, b = free(at_sender[sender]), free(at_receiver[receiver])
        if a in at_receiver[receiver]:
            # the path from the receiver alternating colours a and b never reaches the
            # sender (bipartite); swapping a and b along it frees a at the receiver
            path, at_a_receiver, rank, colour = [], True, receiver, a
            while colour in (at_receiver if at_a_receiver else at_sender)[rank]:
                other = (at_receiver if at_a_receiver else at_sender)[rank][colour]
                path.append(other)
                rank = pairs[other][0] if at_a_receiver else pairs[other][1]
                at_a_receiver, colour = not at_a_receiver, (b if colour == a else a)
            for other in path:
                del at_sender[pairs[other][0]][colour_of[other]]
                del at_receiver[pairs[other][1]][colour_of[other]]
            for other in path:
                paint(other, b if colour_of[other] == a else a)
        paint(message, a)
    return colour_of


class TreePipeline:
    """Pipelines over trees on one global clock (module docstring), each global step split
    into one step per colour of the messages it holds (:func:`port_colors` of that step's
    messages alone), so that a rank sends and receives at most one message at a time; a
    rank reduces at its global step's end. With k segments, global step t holds the message
    of every edge whose first segment's message is at a step in [t - k + 1, t], so its
    colouring depends only on that window of first steps: computed once per window, most
    urgent messages first (they take the earlier colours).

    ``phases``: (tree, up, offset) as in :class:`Phase`. ``time(k)`` is the critical path of
    k segments per tree (message times, segments reduced), compared message times first."""

    def __init__(self, phases: Sequence[Tuple[Tree, bool, int]]):
        self.phases = tuple(phases)
        self.world = len(phases[0][0].parent)
        #: per phase, each child's edge (to or from its parent) as an index into pairs
        self.edge: List[List[int]] = []
        self.pairs: List[Tuple[int, int]] = []                    # (sender, receiver)
        #: per edge, what colouring it early gains: down, the message times its receiver needs
        #: to pass a segment on to its subtree; up, minus those its sender needed to gather it
        #: (the children ready first are received first)
        self.urgency: List[int] = []
        self.by_first: Dict[int, List[Tuple[int, int]]] = defaultdict(list)   # (phase, edge)
        self.reductions: Dict[int, List[Tuple[int, int, int]]] = defaultdict(list)
        for i, (tree, up, offset) in enumerate(phases):
            ids = [-1] * self.world
            # message times for a rank to pass a segment on to its whole subtree, sending to
            # the slowest child first
            below = [0] * self.world
            for rank in sorted(range(self.world), key=tree.depth.__getitem__, reverse=True):
                later = sorted((below[c] for c in tree.children[rank]), reverse=True)
                below[rank] = max((n + 1 + t for n, t in enumerate(later)), default=0)
            for child, parent in enumerate(tree.parent):
                d = tree.depth[child]
                if parent is not None:
                    ids[child] = len(self.pairs)
                    self.urgency.append(-below[child] if up else below[child])
                    first = offset + (tree.height - d if up else d - 1)
                    self.by_first[first].append((i, len(self.pairs)))
                    self.pairs.append((child, parent) if up else (parent, child))
                if up and tree.children[child]:
                    self.reductions[offset + tree.height - d - 1].append((i, child, len(tree.children[child])))
            self.edge.append(ids)
        self.span = 1 + max([*self.by_first, *self.reductions], default=-1)

    def window(self, at: int, counts: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
        """Per phase of ``counts[i]`` segments, the first steps [lo, hi] of the edges that
        have a message at global step ``at``."""
        return tuple((max(0, at - count + 1), min(at, self.span - 1)) if count else (1, 0)
                     for count in counts)

    @staticmethod
    def _within(window: Tuple[Tuple[int, int], ...], by_first: Dict[int, list]) -> Iterator:
        """The entries of ``by_first`` (phase first) whose first step is in their phase's window."""
        for first in range(min(lo for lo, _ in window), max(hi for _, hi in window) + 1):
            for entry in by_first.get(first, ()):
                if window[entry[0]][0] <= first <= window[entry[0]][1]:
                    yield entry

    def active(self, window: Tuple[Tuple[int, int], ...]) -> List[int]:
        """The edges with a message in a global step of ``window``."""
        return [edge for _, edge in self._within(window, self.by_first)]

    @functools.lru_cache(maxsize=128)  # noqa: B019 - a tree object lives as long as its schedule; the cache is its own
    def colours(self, window: Tuple[Tuple[int, int], ...]) -> bytes:
        """Each edge's colour in the global steps of ``window`` (255: no message)."""
        active = sorted(self.active(window), key=lambda edge: -self.urgency[edge])
        colour = bytearray(b"\xff" * len(self.pairs))
        for edge, c in zip(active, port_colors([self.pairs[edge] for edge in active])):
            colour[edge] = c
        return bytes(colour)

    def time(self, k: int) -> Tuple[int, int]:
        """(message times, segments reduced) on the critical path of k segments per tree:
        exact until the pipeline is full (k ≤ span, :meth:`filled`); each further segment
        adds one full global step, as long as its busiest rank needs (:meth:`per_segment`)."""
        full = min(k, self.span)
        messages, reduced = self.filled(full)
        more_messages, more_reduced = self.per_segment
        return messages + (k - full) * more_messages, reduced + (k - full) * more_reduced

    @functools.cached_property
    def per_segment(self) -> Tuple[int, int]:
        """A full global step: the busiest rank's colours (4 for the all-reduce, whose
        interior rank sends to its parent and two children in one tree and to its parent in
        the other; 2 for broadcast and reduce) and the child segments it reduces."""
        colour = self.colours(self.window(self.span - 1, [self.span] * len(self.phases)))
        used: List[set] = [set() for _ in range(self.world)]
        for edge, (sender, receiver) in enumerate(self.pairs):
            used[sender].add(colour[edge])
            used[receiver].add(colour[edge])
        units = [0] * self.world
        for reductions in self.reductions.values():
            for _, rank, count in reductions:
                units[rank] += count
        return max(zip(map(len, used), units))

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a tree object lives as long as its schedule; the cache is its own
    def filled(self, k: int) -> Tuple[int, int]:
        """The critical path of k segments per tree, nothing queued: a message of step
        (global step, colour) starts when both its ranks are done with their earlier steps
        and takes one message time; a rank's reductions follow its global step's last
        message."""
        ready = [(0, 0)] * self.world
        counts = [k] * len(self.phases)
        for at in range(self.span + k - 1):
            window = self.window(at, counts)
            colour = self.colours(window)
            by_colour: Dict[int, List[int]] = defaultdict(list)
            for edge in self.active(window):
                by_colour[colour[edge]].append(edge)
            for c in sorted(by_colour):
                ends: Dict[int, Tuple[int, int]] = {}
                for edge in by_colour[c]:
                    sender, receiver = self.pairs[edge]
                    start = max(ready[sender], ready[receiver])
                    end = (start[0] + 1, start[1])
                    for rank in (sender, receiver):
                        ends[rank] = max(end, ends.get(rank, end))
                for rank, end in ends.items():
                    ready[rank] = end
            for _, rank, count in self._within(window, self.reductions):
                ready[rank] = (ready[rank][0], ready[rank][1] + count)
        return max(ready)


def port_split(pipe: TreePipeline, layout: Layout) -> Optional[TreePipeline]:
    """What :func:`pipeline` splits a global step by: ``pipe``'s colours when the layout's
    executor carries one message in and one out at a time (``ONE_PORT``, the default: the
    simulator, whose clock the cost models follow), else nothing (the P2P executor, which
    posts a global step's transfers together: measured faster on gloo, docs/design.md,
    Decisions)."""
    return pipe if layout.get(ONE_PORT, True) else None


def pipelined_tree_cost(pipe: TreePipeline, nbytes: float, segment: Optional[int], parts: int = 2):
    """α-β-γ cost of a :class:`TreePipeline` whose trees carry n/parts each (two trees by
    default) in k segments of s = n/(parts·k) bytes, on the simulator's clock: nothing queues
    on a port, so the cost is ``pipe.time(k)`` message times (α + sβ) and segments reduced (sγ)."""
    from .registry import Cost

    if pipe.world == 1:
        return Cost(0, 0, 0)
    k = segment_count(nbytes / parts, segment=segment)
    seg = nbytes / parts / k
    messages, reduced = pipe.time(k)
    return Cost(messages, messages * seg, reduced * seg)


def pipeline(rank: int, phases: Sequence[Phase], scratch_numel: int,
             coloured: Optional[TreePipeline] = None) -> Iterator[Step]:
    """The steps of ``rank`` for pipelined phases on one global clock (module docstring).
    An up phase reduces children's segments received into scratch slots of
    ``scratch_numel`` elements (slot ``phase.scratch + i`` for child i).

    ``coloured``: the :class:`TreePipeline` of these phases' trees; each global step is then
    split into one step per colour, in colour order (the same order on both ends of every
    message), and a rank's reductions run in its global step's last. Without it every
    global step is one step."""
    comms = defaultdict(list)
    local = defaultdict(list)
    counts = [sum(1 for seg in phase.segs if seg.numel) for phase in phases]

    def colour(at: int, i: int, child: int) -> int:
        if coloured is None:
            return 0
        return coloured.colours(coloured.window(at, counts))[coloured.edge[i][child]]

    for i, phase in enumerate(phases):
        tree, d = phase.tree, phase.tree.depth[rank]
        parent, children = tree.parent[rank], tree.children[rank]
        for j, seg in enumerate(phase.segs):
            if seg.numel == 0:
                continue
            if phase.up:
                at = phase.offset + j + tree.height - d
                if children:
                    slots = [Buf("scratch", (phase.scratch + n) * scratch_numel,
                                 (phase.scratch + n) * scratch_numel + seg.numel)
                             for n in range(len(children))]
                    for c, slot in zip(children, slots):
                        comms[at - 1, colour(at - 1, i, c)].append(Recv(c, slot))
                    local[at - 1].append(reduce(seg, *slots))
                if parent is not None:
                    comms[at, colour(at, i, rank)].append(Send(parent, seg))
            else:
                at = phase.offset + j + d
                if parent is not None:
                    comms[at - 1, colour(at - 1, i, rank)].append(Recv(parent, seg))
                for c in children:
                    comms[at, colour(at, i, c)].append(Send(c, seg))
    last = {}                         # global step -> its last colour on this rank
    for at, c in comms:
        last[at] = max(c, last.get(at, c))
    for at, c in sorted(comms):
        st = step(comms[at, c], local.pop(at, ()) if c == last[at] else ())
        if st.comms or st.local:
            yield st
    assert not local, "a reduction without receives"
