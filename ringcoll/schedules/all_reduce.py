"""all_reduce: every rank ends with the element-wise reduction of all ranks' ``data``.

Each chunk of the result is computed once, by one rank, in one fixed order, and then copied
(or, in recursive doubling, computed by both partners from the same two operands, and IEEE
addition, multiplication, min and max are commutative), so the result is bitwise identical on
every rank.
"""
from __future__ import annotations

from typing import Iterator

from .vocabulary import SEGMENT, Buf, Layout, Step, ceil_log2, chunks, reduce, segmented, sendrecv, span, step
from .registry import Cost, register, rotation_when_even, xor_when_even
from .fold import folded, halving, largest_pof2, real_rank
from .trees import Phase, all_reduce_pipeline, halves, pipeline, pipelined_tree_cost, port_split, \
    segment_count, segment_numel


def _fold_cost(world: int, nbytes: int) -> Cost:
    return Cost(2, 2 * nbytes, nbytes) if world != largest_pof2(world) else Cost(0, 0, 0)


def _ring_cost(world: int, nbytes: int, segment=None) -> Cost:
    share = (world - 1) / world * nbytes
    k = segment_count(-(-nbytes // world), segment)
    return Cost(2 * (world - 1) * k, 2 * share, share)


@register("all_reduce", "ring", cost=_ring_cost, symmetry=rotation_when_even, preference=0)
def all_reduce_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Ring all-reduce: a reduce-scatter then an all-gather around the ring, one chunk per rank,
    each chunk cut into segments (``layout[SEGMENT]`` elements at most) that are pipelined.

    Scatter-reduce: at step s each rank sends chunk (rank - s) to its right and reduces chunk
    (rank - s - 1), received from its left, into its own, segment by segment; after world - 1
    steps it owns chunk (rank + 1) fully reduced. All-gather: the owned chunks travel world - 1
    steps further to the right, received in place. Received segments land in two scratch
    slots used in turn, so the executor can move segment k + 1 while reducing segment k (as
    gloo's ring does). Bandwidth-optimal.

    Cost: 2(p-1)k·α + 2(p-1)/p·nβ + (p-1)/p·nγ with k segments per chunk (a segment's
    reduction follows its transfer on the simulator's clock, one step per segment).
    """
    if world == 1:
        return
    segs = segmented(chunks("data", layout.numel, world), layout.get(SEGMENT))
    count = len(segs[0])
    right, left = (rank + 1) % world, (rank - 1) % world
    slot_size = segs[0][0].numel
    slot = 0
    # scatter-reduce
    for s in range(world - 1):
        send_idx, recv_idx = (rank - s) % world, (rank - s - 1) % world
        for k in range(count):
            target = segs[recv_idx][k]
            recv_buf = Buf("scratch", slot * slot_size, slot * slot_size + target.numel)
            slot = 1 - slot
            yield step(sendrecv(right, segs[send_idx][k], left, recv_buf), [reduce(target, recv_buf)])
    # allgather
    for s in range(world - 1):
        send_idx, recv_idx = (rank - s + 1) % world, (rank - s) % world
        for k in range(count):
            yield step(sendrecv(right, segs[send_idx][k], left, segs[recv_idx][k]))


def _recursive_doubling_cost(world: int, nbytes: int) -> Cost:
    steps = ceil_log2(largest_pof2(world))
    return Cost(steps, steps * nbytes, steps * nbytes).plus(_fold_cost(world, nbytes))


@register("all_reduce", "recursive_doubling", cost=_recursive_doubling_cost, symmetry=xor_when_even, preference=1)
def all_reduce_recursive_doubling(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Recursive doubling: at step k each rank exchanges its whole vector with the rank whose
    (folded) rank differs in bit k and reduces it in. Latency-optimal. A non-power-of-two
    world folds its remainder ranks in first and hands them the result at the end.

    Cost: lg p (α + nβ + nγ), plus 2α + 2nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return whole_vector_exchanges(rank, world, layout, [lambda me, bit=bit: me ^ bit for bit in
                                                        (1 << k for k in range(ceil_log2(pof2)))])


def whole_vector_exchanges(rank: int, world: int, layout: Layout, partners) -> Iterator[Step]:
    """Fold in (non-powers of two), then at each step exchange the whole vector with
    ``partners[step](folded rank)`` (a folded rank) and reduce it in, then fold out: the
    latency-optimal butterflies (recursive doubling, Swing's latency form)."""
    data, scratch = Buf("data", 0, layout.numel), Buf("scratch", 0, layout.numel)

    def exchanges(me: int) -> Iterator[Step]:
        for partner in partners:
            peer = real_rank(partner(me), world)
            yield step(sendrecv(peer, data, peer, scratch), [reduce(data, scratch)])
    return folded(rank, world, layout.numel, exchanges)


def _rabenseifner_cost(world: int, nbytes: int) -> Cost:
    pof2 = largest_pof2(world)
    share = (pof2 - 1) / pof2 * nbytes
    return Cost(2 * ceil_log2(pof2), 2 * share, share).plus(_fold_cost(world, nbytes))


@register("all_reduce", "rabenseifner", cost=_rabenseifner_cost, symmetry=xor_when_even, preference=2)
def all_reduce_rabenseifner(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Rabenseifner as MPICH runs it (``MPIR_Allreduce_intra_reduce_scatter_allgather``): a
    reduce-scatter by vector halving and distance doubling, then an all-gather by vector
    doubling and distance halving.

    The vector is cut into pof2 chunks. Reduce-scatter: at each step, with the distance
    doubling from 1 to pof2/2, a rank and its partner (folded rank xor distance) each keep half
    of the chunks they still share (the lower half the lower rank), send the other half and
    reduce the half they keep: the largest halves travel between neighbours, the smallest
    pieces farthest. All-gather: the same pairs in reverse order swap what they own, doubling
    it each step. A non-power-of-two world folds in first (MPICH).

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return halving_doubling(rank, world, layout, [1 << k for k in range(ceil_log2(pof2))])


@register("all_reduce", "rabenseifner_far", cost=_rabenseifner_cost, symmetry=xor_when_even, auto=False, preference=3)
def all_reduce_rabenseifner_far(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Rabenseifner, far partner first: :func:`all_reduce_rabenseifner` with the distances
    of the reduce-scatter halving from pof2/2 to 1 (and doubling back in the all-gather), so
    the largest halves travel farthest. Same α-β-γ cost; on a ring of 64 about 10× the
    hop-bytes. Kept for comparison (ringcoll's earlier order); ``auto`` never picks it.

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return halving_doubling(rank, world, layout, [pof2 >> (k + 1) for k in range(ceil_log2(pof2))])


def halving_doubling(rank: int, world: int, layout: Layout, distances) -> Iterator[Step]:
    """Fold in, then a reduce-scatter over pof2 chunks that halves the shared range at each
    of ``distances`` (partner: folded rank xor distance; the lower rank keeps the lower
    half), then an all-gather over the same pairs in reverse order; then fold out."""
    data_chunks = chunks("data", layout.numel, largest_pof2(world))

    def halving_then_doubling(me: int) -> Iterator[Step]:
        history = []
        # scatter-reduce
        for peer, keep, give in halving(me, world, distances):
            recv_buf = Buf("scratch", 0, span(data_chunks, *keep).numel)
            yield step(sendrecv(peer, span(data_chunks, *give), peer, recv_buf),
                       [reduce(span(data_chunks, *keep), recv_buf)])
            history.append((peer, keep, give))
        # allgather
        for peer, keep, give in reversed(history):
            yield step(sendrecv(peer, span(data_chunks, *keep), peer, span(data_chunks, *give)))
    return folded(rank, world, layout.numel, halving_then_doubling)


def _double_binary_tree_cost(world: int, nbytes: int, segment=None) -> Cost:
    return pipelined_tree_cost(all_reduce_pipeline(world), nbytes, segment)


@register("all_reduce", "double_binary_tree", cost=_double_binary_tree_cost, preference=4)
def all_reduce_double_binary_tree(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Double binary tree (NCCL): two binary trees over all ranks, the second the mirror
    (p even) or a one-rank shift (p odd) of the first, so a rank is interior in at most one.
    The first tree carries the first half of the vector, the second the other half, each in
    segments pipelined up then down its tree on one clock: a rank at depth d (height h of the
    tree) receives segment j of its children at step j + h - d - 1 and reduces them into its
    own (``data (op) first child (op) second child``), sends it up at step j + h - d; the top
    has the result at step j + h - 1 and from step j + h it flows down, a rank at depth d
    receiving it at step j + h + d - 1 and passing it on at step j + h + d. Every segment of
    the result is reduced once, at a top, and copied everywhere: bitwise identical. Each
    global step is split by the colours of its messages (``TreePipeline``: a proper edge
    colouring, up to 4 colours), so a rank sends and receives at most one message at a time,
    and reduces at its step's end; that is the simulator's clock (``ONE_PORT``), which the
    cost follows: a real group posts a global step's transfers together.

    Cost: one segment crosses in 4 lg p - 2 message times (≈ at other p); once the pipeline
    is full, each further segment adds the busiest rank's 4(α + sβ) + 2sγ (parent and two
    children in one tree, parent in the other): ≈ (4k + 3.5 lg p)(α + sβ) + (2k + 1.7 lg p)·sγ
    for large k, k = ⌈n / (2·segment)⌉ segments of s = n/2k per tree, ≈ 2nβ + nγ
    (``TreePipeline.time``: the clock's time).
    """
    if world == 1:
        return
    segs_a, segs_b = halves(layout.numel, segment_numel(layout))
    slot = max(s.numel for s in segs_a + segs_b)
    pipe = all_reduce_pipeline(world)
    phases = [Phase(tree, segs, up, offset, scratch) for (tree, up, offset), segs, scratch
              in zip(pipe.phases, (segs_a, segs_a, segs_b, segs_b), (0, 0, 2, 2))]
    yield from pipeline(rank, phases, slot, port_split(pipe, layout))
