"""reduce_scatter: rank r ends with block r of the element-wise reduction of all ranks' input.

Words: ``input`` holds one block per rank (``layout.numel`` is its total, world × block) and
is only ever read, never written: partial results live in scratch (``acc``, ``scratch``) and
in ``output`` (this rank's block). ``output`` must not overlap ``input``; the collective stages
it when the caller's does.

Each block is reduced by one chain or tree that ends on its owner, so no two ranks compute
the same value and there is no cross-rank identity to keep.
"""
from __future__ import annotations

from typing import Iterator, Sequence, Tuple

from .registry import Cost, register, rotation_when_even, xor_when_even
from .vocabulary import (SEGMENT, Buf, Copy, Layout, Recv, Send, Step, ceil_log2, chunks, reduce, segmented,
                         sendrecv, span, step)
from .all_gather import _powers
from .trees import segment_count
from .fold import folded_rank, halving, largest_pof2


def _share_cost(world: int, nbytes: int) -> Cost:
    share = (world - 1) / world * nbytes
    return Cost(world - 1, share, share)


def _ring_cost(world: int, nbytes: int, segment=None) -> Cost:
    k = segment_count(-(-nbytes // world), segment)
    share = (world - 1) / world * nbytes
    return Cost((world - 1) * k, share, share)


def _blocks(world: int, layout: Layout) -> Tuple[Sequence[Buf], Buf]:
    """The input cut into one block per rank, and this rank's output block (one block's size;
    alone, a rank's reduce-scatter copies its one block there)."""
    inputs = chunks("input", layout.numel, world)
    return inputs, Buf("output", 0, inputs[0].numel)


@register("reduce_scatter", "ring", cost=_ring_cost, symmetry=rotation_when_even, preference=0)
def reduce_scatter_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Ring reduce-scatter: at step s each rank sends its partial of block (rank - s - 1) to
    its right and receives the partial of block (rank - s - 2) from its left, reducing its
    own input block into it; the partials alternate between two scratch slots. At the last
    step the partial of block rank arrives straight in the output and is finished there.
    Blocks are cut into segments (``layout[SEGMENT]`` elements at most), so the reduction
    of one segment overlaps the transfer of the next.

    Cost: (p-1)α·k + (p-1)/p·n(β + γ) (n: the input total; k segments per block).
    """
    inputs, output = _blocks(world, layout)
    if world == 1:
        yield step(local=[Copy(output, inputs[0])])
        return
    right, left = (rank + 1) % world, (rank - 1) % world
    block = output.numel
    segs = segmented(inputs, layout.get(SEGMENT))
    count = len(segs[0])
    slots = [chunks("scratch", block, count, slot * block) for slot in (0, 1)]
    partial = None
    for s in range(world - 1):
        send_idx, recv_idx = (rank - s - 1) % world, (rank - s - 2) % world
        sends = segs[send_idx] if s == 0 else partial
        recvs = chunks("output", block, count) if s == world - 2 else slots[s % 2]
        for send_seg, recv_seg, own in zip(sends, recvs, segs[recv_idx]):
            yield step(sendrecv(right, send_seg, left, recv_seg), [reduce(recv_seg, own)])
        partial = recvs


@register("reduce_scatter", "pairwise", cost=_share_cost, symmetry=rotation_when_even, preference=1)
def reduce_scatter_pairwise(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Pairwise exchange (MPICH's long-message algorithm): at step s = 1 .. p-1 each rank sends
    its input block for rank + s to rank + s and receives rank - s's input block for itself,
    reducing it into the output (the first one arrives in the output and takes in the rank's
    own block). Every message goes straight to the block's owner.

    Cost: (p-1)α + (p-1)/p·n(β + γ).
    """
    inputs, output = _blocks(world, layout)
    if world == 1:
        yield step(local=[Copy(output, inputs[0])])
        return
    for s in range(1, world):
        peer_to, peer_from = (rank + s) % world, (rank - s) % world
        if s == 1:
            yield step(sendrecv(peer_to, inputs[peer_to], peer_from, output), [reduce(output, inputs[rank])])
        else:
            recv_buf = Buf("scratch", 0, output.numel)
            yield step(sendrecv(peer_to, inputs[peer_to], peer_from, recv_buf), [reduce(output, recv_buf)])


def _recursive_halving_cost(world: int, nbytes: int) -> Cost:
    pof2 = largest_pof2(world)
    rem, block = world - pof2, nbytes / world
    # folded rank 0 receives the most at every step: d blocks of its half plus min(d, rem) doubles
    kept = sum(d + min(d, rem) for d in _powers(pof2)) * block
    cost = Cost(ceil_log2(pof2), kept, kept)
    if world != pof2:
        cost = cost.plus(Cost(2, nbytes + block, nbytes))
    return cost


@register("reduce_scatter", "recursive_halving", cost=_recursive_halving_cost, symmetry=xor_when_even, preference=2)
def reduce_scatter_recursive_halving(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Recursive halving (MPICH, commutative ops): with the distance halving from pof2/2 to 1,
    a rank and its partner (folded rank xor distance) each keep the half of the blocks they
    still share that holds their own, send the other half and reduce what they receive into
    the half they keep; after lg pof2 steps each holds its own blocks fully reduced. Far
    first is MPICH's own order here (``MPIR_Reduce_scatter_intra_recursive_halving``: mask
    from pof2/2 down): block q must end on rank q, which distance doubling would leave on
    the bit reversal of q (all_reduce's and reduce's Rabenseifner run distance doubling, as
    MPICH's do, since their blocks go on moving).

    A non-power-of-two world folds first: each even rank below 2·rem hands its whole input to
    rank + 1 and sits out; folded rank q stands for blocks [first(q), first(q + 1)) with
    first(q) = 2q for q < rem and q + rem after (each half is one contiguous range); at the
    end each odd rank below 2·rem hands block rank - 1 back.

    Cost: lg p α + (p-1)/p·n(β + γ); when p is not a power of two (rem = p - pof2) ⌊lg p⌋α +
    Σ_d (d + min(d, rem))·(n/p)(β + γ) over d = pof2/2 .. 1 (folded rank 0 receives the
    most), plus 2α + (n + n/p)β + nγ for the fold.
    """
    inputs, output = _blocks(world, layout)
    if world == 1:
        yield step(local=[Copy(output, inputs[0])])
        return
    pof2 = largest_pof2(world)
    rem = world - pof2
    me = folded_rank(rank, world)
    if me is None:                  # even rank below 2·rem: hand over the input, get block back
        yield step([Send(rank + 1, span(inputs, 0, world))])
        yield step([Recv(rank + 1, output)])
        return
    acc = chunks("acc", layout.numel, world)
    current = inputs                # where this rank's partial sums are: its input until the first reduction
    if rank < 2 * rem:
        yield step([Recv(rank - 1, span(acc, 0, world))], [reduce(span(acc, 0, world), span(inputs, 0, world))])
        current = acc

    def first(q: int) -> int:
        return 2 * q if q < rem else q + rem

    for peer, keep, give in halving(me, world):
        keep_lo, keep_hi = first(keep[0]), first(keep[1])
        send_buf = span(current, first(give[0]), first(give[1]))
        if keep_hi - keep_lo == 1:                          # the last step, own block only
            yield step(sendrecv(peer, send_buf, peer, output), [reduce(output, current[keep_lo])])
        elif current is inputs:                              # first reduction: into acc, input untouched
            recv_buf = span(acc, keep_lo, keep_hi)
            yield step(sendrecv(peer, send_buf, peer, recv_buf), [reduce(recv_buf, span(inputs, keep_lo, keep_hi))])
            current = acc
        else:
            kept = span(acc, keep_lo, keep_hi)
            recv_buf = Buf("scratch", 0, kept.numel)
            yield step(sendrecv(peer, send_buf, peer, recv_buf), [reduce(kept, recv_buf)])
    if rank < 2 * rem:                                      # holds blocks rank - 1 and rank
        yield step([Send(rank - 1, acc[rank - 1])], [Copy(output, acc[rank])])
