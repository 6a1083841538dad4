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

Steps where a rank has nothing to do are left out. With colours (:func:`port_colors`) a
global step is split into one step per colour of the trees' edges, so that a rank sends and
receives at most one message at a time; without, its transfers are posted together, tree by
tree, phase by phase. Either way both ends of every pair post in the same order, so messages
match.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..schedule import Buf, Layout, Recv, Send, Step, reduce, segments, step
from ..selection import segment_bytes

def segment_numel(layout: Layout, itemsize: int = 4) -> int:
    """The segment size in elements: the layout's ``"segment"`` (the builders take it from
    the segment table, ringcoll.selection.SEGMENTS), else the default segment of
    ``itemsize``-byte elements (4 when the builder does not say)."""
    segment = layout.get("segment")
    return segment if segment else max(1, segment_bytes() // itemsize)


def segment_count(nbytes: float, collective: Optional[str] = None, algorithm: Optional[str] = None,
                  segment: Optional[int] = None) -> int:
    """How many segments ``nbytes`` makes (at least one), for the cost models: segments of
    ``segment`` bytes, else of the segment table's for ``collective``/``algorithm``."""
    return max(1, -(-int(nbytes) // (segment or segment_bytes(collective, algorithm))))


def pipelined_tree_cost(shape: "PipelineShape", nbytes: float, segment: Optional[int]):
    """α-β-γ cost of a coloured tree pipeline (:func:`pipeline` with :func:`tree_colors`) whose
    trees carry n/2 each in k segments of s = n/2k bytes, on the simulator's clock: split by
    colour, a global step asks each rank for at most one send and one receive at a time, so
    nothing queues on a port, and the cost is ``shape.time(k)`` message times (α + sβ) and
    segments reduced (sγ) on the critical path."""
    from ..registry import Cost

    if shape.world == 1:
        return Cost(0, 0, 0)
    k = segment_count(nbytes / 2, segment=segment)
    seg = nbytes / 2 / k
    messages, reduced = shape.time(k)
    return Cost(messages, messages * seg, reduced * seg)


class PipelineShape:
    """The critical path of a coloured tree pipeline, from its trees (built once per world).
    ``phases``: (tree, up, offset) as in :class:`Phase`; ``colors`` as :func:`tree_colors`
    gives them. Times are pairs (message times, segments reduced), compared message times
    first.

    Until the pipeline is full (k ≤ ``span``, the global steps one segment takes) the path
    is :meth:`filled`'s. Once it is full, each further segment adds one global step of the
    busiest rank: one message time per colour it uses (4 for the all-reduce, whose interior
    rank sends to its parent and two children in one tree and to its parent in the other;
    2 for broadcast and reduce) and the child segments it reduces (2)."""

    def __init__(self, phases: Sequence[Tuple[Tree, bool, int]], colors: Sequence[Sequence[int]]):
        world = len(phases[0][0].parent)
        colours: List[set] = [set() for _ in range(world)]
        units = [0] * world
        #: the first segment's messages by (global step, colour), its reductions by global step
        self.messages: Dict[Tuple[int, int], List[Tuple[int, int]]] = defaultdict(list)
        self.reductions: Dict[int, List[Tuple[int, int]]] = defaultdict(list)
        for i, (tree, up, offset) in enumerate(phases):
            for rank, parent in enumerate(tree.parent):
                d = tree.depth[rank]
                if parent is not None:
                    at, colour = offset + (tree.height - d if up else d - 1), colors[i][rank]
                    colours[rank].add(colour)
                    colours[parent].add(colour)
                    self.messages[at, colour].append((rank, parent) if up else (parent, rank))
                if up and tree.children[rank]:
                    units[rank] += len(tree.children[rank])
                    self.reductions[offset + tree.height - d - 1].append((rank, len(tree.children[rank])))
        self.world = world
        self.span = 1 + max([at for at, _ in self.messages] + list(self.reductions), default=-1)
        self.per_segment = max(zip(map(len, colours), units))        # (0, 0) alone

    def time(self, k: int) -> Tuple[int, int]:
        """(message times, segments reduced) on the critical path of k segments."""
        full = min(k, self.span)
        messages, reduced = self.filled(full)
        return messages + (k - full) * self.per_segment[0], reduced + (k - full) * self.per_segment[1]

    @functools.lru_cache(maxsize=64)
    def filled(self, k: int) -> Tuple[int, int]:
        """The critical path of k segments with nothing queued: a message of step (global
        step, colour) starts when both its ranks are done with their earlier steps and takes
        one message time; a rank's reductions follow its global step's last message."""
        ready = [(0, 0)] * self.world
        colours = sorted({c for _, c in self.messages})
        for at in range(self.span + k - 1):
            for colour in colours:
                pairs = [pair for first in range(max(0, at - k + 1), at + 1)
                         for pair in self.messages.get((first, colour), ())]
                ends: Dict[int, Tuple[int, int]] = {}
                for sender, receiver in pairs:
                    start = max(ready[sender], ready[receiver])
                    end = (start[0] + 1, start[1])
                    for rank in (sender, receiver):
                        ends[rank] = max(end, ends.get(rank, end))
                for rank, end in ends.items():
                    ready[rank] = end
            for first in range(max(0, at - k + 1), at + 1):
                for rank, units in self.reductions.get(first, ()):
                    ready[rank] = (ready[rank][0], ready[rank][1] + units)
        return max(ready)


def lg(world: int) -> int:
    """ceil(log2(world))."""
    return (world - 1).bit_length()


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
    low = vrank & -vrank if vrank else 1 << lg(world)
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
    low = vrank & -vrank if vrank else 1 << lg(world)
    return vrank, min(vrank + low, world)


# -- NCCL's double binary tree --------------------------------------------------------------
def nccl_btree(world: int, rank: int) -> Tuple[Optional[int], List[int]]:
    """NCCL's binary tree (``ncclGetBtree``): the in-order tree on the bits of the rank. A rank
    whose lowest set bit is b has parent ``(rank ^ b) | 2b`` (``rank ^ b`` when that is past the
    end) and children ``rank - b/2`` and ``rank + b/2`` (the latter halved until it fits).
    Rank 0 is the top, with one child: the largest power of two below world. Odd ranks are
    leaves."""
    if rank == 0:
        return None, ([1 << (lg(world) - 1)] if world > 1 else [])
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
def all_reduce_phases(world: int) -> Tuple[Tuple[Tree, bool, int], ...]:
    """The tree all-reduce's four pipelines as (tree, up, offset): the first tree up, then
    down from its top's step on, the second tree likewise."""
    first, second = all_reduce_trees(world)
    return (first, True, 0), (first, False, first.height), (second, True, 0), (second, False, second.height)


@functools.lru_cache(maxsize=32)
def rooted_phases(world: int, up: bool) -> Tuple[Tuple[Tree, bool, int], ...]:
    """The rooted double tree's two pipelines, both up (reduce) or both down (broadcast)."""
    return tuple((tree, up, 0) for tree in rooted_trees(world))


# colours and cost shapes keyed by world, not by the trees: hashing a tree costs O(world),
# paid by every rank's schedule
@functools.lru_cache(maxsize=16)
def all_reduce_colors(world: int) -> Tuple[Tuple[int, ...], ...]:
    """:func:`tree_colors` of :func:`all_reduce_phases`, once per world."""
    return tree_colors([(tree, up) for tree, up, _ in all_reduce_phases(world)])


@functools.lru_cache(maxsize=32)
def rooted_colors(world: int, up: bool) -> Tuple[Tuple[int, ...], ...]:
    """:func:`tree_colors` of :func:`rooted_phases`, once per world."""
    return tree_colors([(tree, up) for tree, up, _ in rooted_phases(world, up)])


@functools.lru_cache(maxsize=16)
def all_reduce_shape(world: int) -> "PipelineShape":
    return PipelineShape(all_reduce_phases(world), all_reduce_colors(world))


@functools.lru_cache(maxsize=32)
def rooted_shape(world: int, up: bool) -> "PipelineShape":
    return PipelineShape(rooted_phases(world, up), rooted_colors(world, up))


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


def port_colors(edges: Sequence[Sequence[Tuple[int, int]]]) -> List[Dict[Tuple[int, int], int]]:
    """A colour for every message edge ``(sender, receiver)`` of each phase, such that no rank
    sends two messages of one colour nor receives two of one colour: a proper edge colouring
    of the bipartite graph senders -> receivers (all phases together), with as many colours
    as the busiest rank has messages to send or to receive (König's theorem; Kempe-chain
    flips, as in the classic proof). A pipeline step split into one step per colour thus asks
    each rank for at most one send and one receive at a time, which one send and one receive
    port carry without queueing."""
    at_sender: Dict[int, Dict[int, Tuple[int, int]]] = defaultdict(dict)    # rank: colour -> edge
    at_receiver: Dict[int, Dict[int, Tuple[int, int]]] = defaultdict(dict)
    colour_of: Dict[Tuple[int, int, int], int] = {}

    def free(used: Dict[int, Tuple[int, int]]) -> int:
        colour = 0
        while colour in used:
            colour += 1
        return colour

    def paint(edge, colour):
        phase, sender, receiver = edge
        colour_of[edge] = colour
        at_sender[sender][colour] = edge
        at_receiver[receiver][colour] = edge

    for phase, pairs in enumerate(edges):
        for sender, receiver in pairs:
            a, b = free(at_sender[sender]), free(at_receiver[receiver])
            if a not in at_receiver[receiver]:
                paint((phase, sender, receiver), a)
                continue
            # the path from the receiver alternating colours a and b never reaches the
            # sender (bipartite); swapping a and b along it frees a at the receiver
            path, side, rank, colour = [], at_receiver, receiver, a
            while colour in side[rank]:
                edge = side[rank][colour]
                path.append(edge)
                rank = edge[1] if side is at_receiver else edge[2]
                side = at_receiver if side is at_sender else at_sender
                colour = b if colour == a else a
            for edge in path:
                del at_sender[edge[1]][colour_of[edge]], at_receiver[edge[2]][colour_of[edge]]
            for edge in path:
                paint(edge, b if colour_of[edge] == a else a)
            paint((phase, sender, receiver), a)
    colours = [dict() for _ in edges]
    for (phase, sender, receiver), colour in colour_of.items():
        colours[phase][sender, receiver] = colour
    return colours


def tree_colors(phases: Sequence[Tuple[Tree, bool]]) -> Tuple[Tuple[int, ...], ...]:
    """:func:`port_colors` of pipelined trees: for each ``(tree, up)``, the colour of the
    message between each rank and its parent (child -> parent when up, parent -> child when
    down), indexed by the child; 0 at a top."""
    edges = [[(r, p) if up else (p, r) for r, p in enumerate(tree.parent) if p is not None]
             for tree, up in phases]
    colours = port_colors(edges)
    return tuple(tuple(colours[i].get((r, p) if up else (p, r), 0) for r, p in enumerate(tree.parent))
                 for i, (tree, up) in enumerate(phases))


def pipeline(rank: int, phases: Sequence[Phase], scratch_numel: int,
             colors: Optional[Sequence[Sequence[int]]] = None) -> Iterator[Step]:
    """The steps of ``rank`` for pipelined phases on one global clock (module docstring).
    An up phase reduces children's segments received into scratch slots of
    ``scratch_numel`` elements (slot ``phase.scratch + i`` for child i).

    ``colors[i][c]``: the colour of phase i's message between rank c and its parent
    (:func:`tree_colors`); a global step is then split into one step per colour, in colour
    order, the same order on both ends of every message. A reduction runs in the step of the
    last child's colour. Without colours every global step is one step."""
    comms = defaultdict(list)
    local = defaultdict(list)
    for i, phase in enumerate(phases):
        tree, d = phase.tree, phase.tree.depth[rank]
        parent, children = tree.parent[rank], tree.children[rank]
        colour = colors[i] if colors is not None else None
        mine = colour[rank] if colour is not None else 0
        theirs = [colour[c] for c in children] if colour is not None else [0] * len(children)
        for j, seg in enumerate(phase.segs):
            if seg.numel == 0:
                continue
            if phase.up:
                at = phase.offset + j + tree.height - d
                if children:
                    slots = [Buf("scratch", (phase.scratch + i) * scratch_numel,
                                 (phase.scratch + i) * scratch_numel + seg.numel)
                             for i in range(len(children))]
                    for c, s, col in zip(children, slots, theirs):
                        comms[at - 1, col].append(Recv(c, s))
                    local[at - 1].append(reduce(seg, *slots))
                if parent is not None:
                    comms[at, mine].append(Send(parent, seg))
            else:
                at = phase.offset + j + d
                if parent is not None:
                    comms[at - 1, mine].append(Recv(parent, seg))
                for c, col in zip(children, theirs):
                    comms[at, col].append(Send(c, seg))
    last = {}                         # global step -> its last colour on this rank
    for at, colour in comms:
        last[at] = max(colour, last.get(at, colour))
    for at, colour in sorted(comms):
        st = step(comms[at, colour], local.pop(at, ()) if colour == last[at] else ())
        if st.comms or st.local:
            yield st
    assert not local, "a reduction without receives"
