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

Steps where a rank has nothing to do are left out; the transfers of one global step are
posted in a fixed order (tree by tree, phase by phase), the same order on both ends of every
pair, so messages match.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

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


def rooted_tree_fill(world: int) -> int:
    """Message times for the first segment to cross the rooted double binary tree (root
    above NCCL's trees over the other p - 1 ranks), measured on the clock."""
    return max(2, 2 * lg(world) - (1 if (world - 1) & (world - 2) == 0 else 0))


#: message times per further segment on the clock's ports, by world (2 ideally: an interior
#: rank has two children in one tree; the port queues pack the trees' steps less well at
#: most worlds); 3 above 16 ranks
_ROOTED_PER_SEGMENT = {
    "broadcast": {2: 2, 3: 2, 4: 2, 5: 2, 6: 3, 7: 2.5, 8: 2, 9: 3, 10: 3, 11: 2.5, 12: 2.3, 13: 2.6,
                  14: 3, 15: 2.9, 16: 3},
    "reduce": {2: 2, 3: 2, 4: 2, 5: 2, 6: 3, 7: 2.5, 8: 2.4, 9: 2.7, 10: 3, 11: 2.5, 12: 3, 13: 2.4,
               14: 3, 15: 3, 16: 3},
}


def rooted_tree_per_segment(collective: str, world: int) -> float:
    return _ROOTED_PER_SEGMENT[collective].get(world, 3)


def pipelined_tree_cost(world: int, nbytes: float, segment: Optional[int], *, fill: int,
                        per_segment: float, reduced_fill: int = 0, reduced_per_segment: float = 0):
    """α-β-γ cost of the double-binary-tree pipelines on the simulator's clock: the two trees
    carry n/2 each in k segments of s = n/2k bytes; the first segment crosses the trees in
    ``fill`` message times and each further one adds ``per_segment`` (the busiest port's
    messages per global step); the γ term likewise, in segments reduced."""
    from ..registry import Cost

    if world == 1:
        return Cost(0, 0, 0)
    k = segment_count(nbytes / 2, segment=segment)
    seg = nbytes / 2 / k
    messages = fill + per_segment * (k - 1)
    return Cost(messages, messages * seg, (reduced_fill + reduced_per_segment * (k - 1)) * seg)


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


def pipeline(rank: int, phases: Sequence[Phase], scratch_numel: int) -> Iterator[Step]:
    """The steps of ``rank`` for pipelined phases on one global clock (module docstring).
    An up phase reduces children's segments received into scratch slots of
    ``scratch_numel`` elements (slot ``phase.scratch + i`` for child i)."""
    comms = defaultdict(list)
    local = defaultdict(list)
    for phase in phases:
        tree, d = phase.tree, phase.tree.depth[rank]
        parent, children = tree.parent[rank], tree.children[rank]
        for j, seg in enumerate(phase.segs):
            if seg.numel == 0:
                continue
            if phase.up:
                at = phase.offset + j + tree.height - d
                if children:
                    slots = [Buf("scratch", (phase.scratch + i) * scratch_numel,
                                 (phase.scratch + i) * scratch_numel + seg.numel)
                             for i in range(len(children))]
                    comms[at - 1].extend(Recv(c, s) for c, s in zip(children, slots))
                    local[at - 1].append(reduce(seg, *slots))
                if parent is not None:
                    comms[at].append(Send(parent, seg))
            else:
                at = phase.offset + j + d
                if parent is not None:
                    comms[at - 1].append(Recv(parent, seg))
                comms[at].extend(Send(c, seg) for c in children)
    for at in sorted(set(comms) | set(local)):
        st = step(comms.get(at, ()), local.get(at, ()))
        if st.comms or st.local:
            yield st
