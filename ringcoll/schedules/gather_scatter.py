"""gather and scatter: blocks between every rank and one root, ``layout[ROOT]``.

Words: ``layout.numel`` is the total, world × block. gather: every rank's ``input`` is one
block; the root's ``output`` holds them in rank order. scatter: the root's ``input`` holds
one block per rank; every rank's ``output`` is its block. Trees work in *relative* ranks,
``rel = (rank - root) % world``; a non-root rank keeps its subtree's blocks in relative order
in the scratch buffer ``subtree``; the root keeps them in rank order, so the one message
between the root and a child whose relative blocks wrap past the last rank goes as two.
"""
from __future__ import annotations

from typing import Iterator, List, Tuple

from .registry import Cost, register
from .vocabulary import ROOT, Buf, Copy, Layout, Recv, Send, Step, ceil_log2, chunks, span, step
from .trees import binomial, binomial_span


def _linear_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) / world * nbytes, 0)


def _binomial_cost(world: int, nbytes: int) -> Cost:
    return Cost(ceil_log2(world), (world - 1) / world * nbytes, 0)


def _block_runs(lo: int, hi: int, root: int, world: int) -> List[Tuple[int, int]]:
    """Relative blocks [lo, hi) cut where rank order wraps from world - 1 to 0."""
    wrap = world - root
    if lo < wrap < hi:
        return [(lo, wrap), (wrap, hi)]
    return [(lo, hi)]


def _at_root(blocks: List[Buf], lo: int, hi: int, root: int, world: int) -> List[Buf]:
    """Relative blocks [lo, hi) as chunks of the root's rank-ordered buffer."""
    return [span(blocks, (a + root) % world, (a + root) % world + b - a) for a, b in _block_runs(lo, hi, root, world)]


def _in_subtree(subtree: List[Buf], base: int, lo: int, hi: int, root: int, world: int) -> List[Buf]:
    """Relative blocks [lo, hi) of a subtree starting at relative block ``base``, cut as the
    root cuts them (when talking to the root) -- the same messages on both ends."""
    return [span(subtree, a - base, b - base) for a, b in _block_runs(lo, hi, root, world)]


@register("gather", "linear", cost=_linear_cost, preference=0)
def gather_linear(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Linear gather: every rank sends its block to the root, which posts all p - 1 receives
    at once, straight into their places in the output.

    Cost: (p-1)α + (p-1)/p·nβ, all through the root's link.
    """
    root = layout[ROOT]
    output = chunks("output", layout.numel, world)
    mine = Buf("input", 0, output[0].numel)
    if rank == root:
        yield step(local=[Copy(output[root], mine)])
        yield step([Recv(peer, output[peer]) for peer in range(world) if peer != root])
    else:
        yield step([Send(root, mine)])


def _binomial_place(rank: int, world: int, layout: Layout):
    """This rank's place in the binomial tree of relative ranks rooted at ``layout[ROOT]``:
    the root, its relative rank rel, its parent's relative rank, its children's subtrees as
    block spans (lo, hi) smallest first, and the blocks of its own subtree."""
    root = layout[ROOT]
    rel = (rank - root) % world
    parent, kids = binomial(rel, world)
    lo, hi = binomial_span(rel, world)
    return root, rel, parent, [binomial_span(child, world) for child in reversed(kids)], hi - lo


@register("gather", "binomial", cost=_binomial_cost, preference=1)
def gather_binomial(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Binomial-tree gather (MPICH): the rank with relative rank rel receives, at once, the
    subtrees of its children rel + 2^k (for each 2^k below rel's lowest set bit), each of
    min(2^k, p - rel - 2^k) blocks, then sends its whole subtree to rel - (lowest set bit).
    Leaves send their input; the root receives straight into the output.

    Cost: ⌈lg p⌉α + (p-1)/p·nβ.
    """
    root, rel, parent_rel, children, size = _binomial_place(rank, world, layout)
    output = chunks("output", layout.numel, world)
    subtree = chunks("subtree", layout.numel, world)
    mine = Buf("input", 0, output[0].numel)
    if rank == root:
        yield step(local=[Copy(output[root], mine)])
        yield step([Recv((lo + root) % world, buf) for lo, hi in children
                    for buf in _at_root(output, lo, hi, root, world)])
        return
    parent = (parent_rel + root) % world
    if not children:
        yield step([Send(parent, mine)])
        return
    yield step([Recv((lo + root) % world, span(subtree, lo - rel, hi - rel)) for lo, hi in children],
               [Copy(subtree[0], mine)])
    sends = _in_subtree(subtree, rel, rel, rel + size, root, world) if parent_rel == 0 \
        else [span(subtree, 0, size)]
    yield step([Send(parent, buf) for buf in sends])


@register("scatter", "linear", cost=_linear_cost, preference=0)
def scatter_linear(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Linear scatter: the root posts p - 1 sends at once, one block straight from its input
    to each rank, then copies its own block.

    Cost: (p-1)α + (p-1)/p·nβ, all through the root's link.
    """
    root = layout[ROOT]
    inputs = chunks("input", layout.numel, world)
    output = Buf("output", 0, inputs[0].numel)
    if rank == root:
        # the own block last: the caller's output may overlap another rank's block
        yield step([Send(peer, inputs[peer]) for peer in range(world) if peer != root],
                   [Copy(output, inputs[root])])
    else:
        yield step([Recv(root, output)])


@register("scatter", "binomial", cost=_binomial_cost, preference=1)
def scatter_binomial(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Binomial-tree scatter (MPICH): the rank with relative rank rel receives its subtree's
    blocks [rel, rel + lowest set bit) from rel - (lowest set bit), then hands each child
    rel + 2^k, largest first, the blocks of its subtree, one send per step so the largest
    subtree starts forwarding first. Leaves receive straight into their output.

    Cost: ⌈lg p⌉α + (p-1)/p·nβ.
    """
    root, rel, parent_rel, children, size = _binomial_place(rank, world, layout)
    inputs = chunks("input", layout.numel, world)
    subtree = chunks("subtree", layout.numel, world)
    output = Buf("output", 0, inputs[0].numel)
    if rank != root:
        parent = (parent_rel + root) % world
        if not children:
            yield step([Recv(parent, output)])
            return
        recvs = _in_subtree(subtree, rel, rel, rel + size, root, world) if parent_rel == 0 \
            else [span(subtree, 0, size)]
        yield step([Recv(parent, buf) for buf in recvs], [Copy(output, subtree[0])])
    for lo, hi in reversed(children):
        child = (lo + root) % world
        if rank == root:
            yield step([Send(child, buf) for buf in _at_root(inputs, lo, hi, root, world)])
        else:
            yield step([Send(child, span(subtree, lo - rel, hi - rel))])
    if rank == root:
        # the own block last: the caller's output may overlap another rank's block
        yield step(local=[Copy(output, inputs[root])])
