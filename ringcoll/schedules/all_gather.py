"""all_gather: every rank ends with every rank's block, in rank order, in ``output``.

Words: ``input`` is this rank's block; ``output`` holds one block per rank (block ``r`` is rank
r's ``input``), so ``layout.numel`` is the gathered total, world × block. With
``layout[IN_PLACE]`` the input already lies in this rank's block of the output.

Every algorithm first places the rank's own block (a local copy), so the caller's input is
read only at the first step and may alias any part of the output. Blocks are only ever
copied, never combined, so the result is bitwise identical on every rank.
"""
from __future__ import annotations

from typing import Iterator, List

from .registry import Cost, register, rotation_when_even, xor_when_even
from .vocabulary import (IN_PLACE, SEGMENT, Buf, Copy, Layout, Recv, Send, Step, ceil_log2, chunks, segmented,
                         sendrecv, span, step)
from .fold import folded_rank, largest_pof2, real_rank
from .trees import segment_count


def _place_own(rank: int, world: int, layout: Layout, output: List[Buf]) -> Iterator[Step]:
    """Copy this rank's input into its block of the output, unless it is already there."""
    if not layout.get(IN_PLACE, False):
        yield step(local=[Copy(output[rank], Buf("input", 0, output[rank].numel))])


def _ring_cost(world: int, nbytes: int, segment=None) -> Cost:
    k = segment_count(-(-nbytes // world), segment)
    return Cost((world - 1) * k, (world - 1) / world * nbytes, 0)


@register("all_gather", "ring", cost=_ring_cost, symmetry=rotation_when_even, preference=0)
def all_gather_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Ring all-gather: at step s each rank sends block (rank - s) to its right and receives
    block (rank - s - 1) from its left, straight into the output; after world - 1 steps every
    block has gone round. Blocks are cut into segments (``layout[SEGMENT]`` elements at
    most), so a block's first segment moves on while its last is still arriving.
    Bandwidth-optimal, latency linear in p.

    Cost: (p-1)k·α + (p-1)/p·nβ (n: the gathered total; k segments per block).
    """
    output = chunks("output", layout.numel, world)
    yield from _place_own(rank, world, layout, output)
    segs = segmented(output, layout.get(SEGMENT))
    right, left = (rank + 1) % world, (rank - 1) % world
    for s in range(world - 1):
        send_idx, recv_idx = (rank - s) % world, (rank - s - 1) % world
        for send_seg, recv_seg in zip(segs[send_idx], segs[recv_idx]):
            yield step(sendrecv(right, send_seg, left, recv_seg))


def _recursive_doubling_cost(world: int, nbytes: int) -> Cost:
    pof2 = largest_pof2(world)
    rem, block = world - pof2, nbytes / world
    # folded rank 0 holds the most blocks at every step: m of its group plus min(m, rem) doubles
    held = sum(m + min(m, rem) for m in _powers(pof2))
    cost = Cost(ceil_log2(pof2), held * block, 0)
    if world != pof2:
        cost = cost.plus(Cost(2, block + nbytes, 0))
    return cost


def _powers(pof2: int):
    """1, 2, 4 ... pof2 / 2: the distances of a butterfly over pof2 ranks."""
    return [1 << k for k in range(pof2.bit_length() - 1)]


@register("all_gather", "recursive_doubling", cost=_recursive_doubling_cost, symmetry=xor_when_even, preference=1)
def all_gather_recursive_doubling(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Recursive doubling: at step k each rank swaps everything it holds with the rank whose
    (folded) rank differs in bit k, doubling what it holds. Latency-optimal.

    A non-power-of-two world folds first (the fold of :mod:`.fold`, not MPICH's tree
    fix-up): each even rank below 2·rem hands its block to rank + 1 and sits out; folded rank
    q then stands for blocks [first(q), first(q + 1)) with first(q) = 2q for q < rem and
    q + rem after, so any run of folded ranks is one contiguous range of the output and each
    swap is one message. At the end each odd rank below 2·rem hands the whole output back.

    Cost: lg p α + (p-1)/p·nβ; when p is not a power of two (rem = p - pof2) ⌊lg p⌋α +
    Σ_m (m + min(m, rem))·(n/p)β over m = 1, 2 .. pof2/2 (folded rank 0 holds the most),
    plus 2α + (n/p + n)β for the fold.
    """
    output = chunks("output", layout.numel, world)
    whole = span(output, 0, world)
    pof2 = largest_pof2(world)
    rem = world - pof2
    me = folded_rank(rank, world)
    if me is None:                      # even rank below 2·rem: hand over the block, get all back
        own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, output[rank].numel)
        yield step([Send(rank + 1, own)])
        yield step([Recv(rank + 1, whole)])
        return
    yield from _place_own(rank, world, layout, output)
    if rank < 2 * rem:
        yield step([Recv(rank - 1, output[rank - 1])])

    def first(q: int) -> int:
        return 2 * q if q < rem else q + rem

    mask = 1
    while mask < pof2:
        peer = me ^ mask
        mine, theirs = me // mask * mask, peer // mask * mask
        yield step(sendrecv(real_rank(peer, world), span(output, first(mine), first(mine + mask)),
                            real_rank(peer, world), span(output, first(theirs), first(theirs + mask))))
        mask <<= 1
    if rank < 2 * rem:
        yield step([Send(rank - 1, whole)])


def _bruck_cost(world: int, nbytes: int) -> Cost:
    return Cost(ceil_log2(world), (world - 1) / world * nbytes, 0)


@register("all_gather", "bruck", cost=_bruck_cost, symmetry=rotation_when_even, preference=2)
def all_gather_bruck(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bruck: blocks gather in a scratch buffer in rotated order (slot i holds the block of
    rank + i). At the step with distance d = 1, 2, 4 ... each rank sends its first
    min(d, p - d) slots to rank - d and receives as many into slots [d, 2d) from rank + d. A
    final local rotation puts block (rank + i) at output position rank + i. ⌈lg p⌉ steps at
    any p, no fold.

    Cost: ⌈lg p⌉α + (p-1)/p·nβ, plus a local copy of n.
    """
    output = chunks("output", layout.numel, world)
    slots = chunks("scratch", layout.numel, world)
    own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, output[rank].numel)
    if world == 1:
        yield from _place_own(rank, world, layout, output)
        return
    yield step(local=[Copy(slots[0], own)])
    distance = 1
    while distance < world:
        count = min(distance, world - distance)
        yield step(sendrecv((rank - distance) % world, span(slots, 0, count),
                            (rank + distance) % world, span(slots, distance, distance + count)))
        distance <<= 1
    # rotate: slot i -> block (rank + i) % world
    yield step(local=[Copy(span(output, rank, world), span(slots, 0, world - rank)),
                      Copy(span(output, 0, rank), span(slots, world - rank, world))])
