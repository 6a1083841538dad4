"""reduce: the root ends with the element-wise reduction of every rank's ``data``.

Layout parameters: ``root`` (the root's rank in the group) and, for the pipelined
algorithms, ``segment`` (elements per segment; see :data:`trees.SEGMENT_BYTES`). Rooted
algorithms are written on vranks, ``vrank = (rank - root) % world``, the root being vrank 0.
Only the root's ``data`` is specified afterwards: the other ranks' ``data`` is used as the
working buffer and holds partial reductions (as torch's gloo leaves it).
"""
from __future__ import annotations

from typing import Iterator

from .registry import Cost, register
from .vocabulary import ROOT, Buf, Layout, Recv, Send, Step, ceil_log2, chunks, reduce, segments, span, step
from .fold import fold_in, folded_rank, halving, largest_pof2
from .trees import Phase, Tree, binomial, halves, pipeline, pipelined_tree_cost, port_split, relabel, rooted, \
    rooted_pipeline, segment_count, segment_numel


def _binomial_cost(world: int, nbytes: int) -> Cost:
    return Cost(ceil_log2(world), ceil_log2(world) * nbytes, ceil_log2(world) * nbytes)


@register("reduce", "binomial", cost=_binomial_cost, preference=0)
def reduce_binomial(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Binomial tree: vrank v (lowest set bit b) receives the partial results of v + 1,
    v + 2, ..., v + b/2 in that order (smallest subtree first, so the first to be ready),
    reducing each into its own vector, then sends the result to v - b. Latency-optimal.

    Cost: ⌈lg p⌉(α + nβ + nγ).
    """
    root = layout[ROOT]
    vrank = (rank - root) % world
    data = Buf("data", 0, layout.numel)
    scratch = Buf("scratch", 0, layout.numel)
    parent, children = binomial(vrank, world)
    steps = [step([Recv(child, scratch)], [reduce(data, scratch)]) for child in reversed(children)]
    if parent is not None:
        steps.append(step([Send(parent, data)]))
    yield from rooted(steps, root, world)


def _rabenseifner_cost(world: int, nbytes: int) -> Cost:
    pof2 = largest_pof2(world)
    share = (pof2 - 1) / pof2 * nbytes
    fold = Cost(1, nbytes, nbytes) if world != pof2 else Cost(0, 0, 0)
    return Cost(2 * ceil_log2(pof2), 2 * share, share).plus(fold)


@register("reduce", "rabenseifner", cost=_rabenseifner_cost, preference=1)
def reduce_rabenseifner(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Rabenseifner as MPICH runs it (``MPIR_Reduce_intra_reduce_scatter_gather``): a
    reduce-scatter by recursive halving with the distance doubling from 1 to pof2/2, then a
    binomial gather of the reduced chunks to the root with the distance halving back from
    pof2/2 to 1: the largest halves travel between neighbours, the single chunks farthest.

    The vector is cut into pof2 chunks. Reduce-scatter: at each distance a rank and its partner
    (folded rank xor distance) keep half of the chunks they still share (the lower half the
    lower rank), send the other half and reduce the half they keep; folded rank q ends with
    one chunk (the bit reversal of q) fully reduced. Gather: the same pairs in reverse order;
    at each distance the partner whose side (that distance's bit) differs from the root's
    sends all it holds and stops, the other receives it, so every subtree owns a contiguous
    block of chunks (its ranks share their low bits) and the last step moves half the vector.

    Ranks are counted from just after the root, ``w = (rank - root - 1) % p``, so that the root
    (w = p - 1) is never folded out: a non-power-of-two world first folds, each even w below
    2·rem handing its vector to w + 1 (MPICH folds odd ranks into rank - 1 and, when the root
    is folded out, has folded rank 0 forward the result; counting from the root avoids that
    extra message).

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus α + nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return _rooted_reduce_scatter_gather(rank, world, layout, [1 << k for k in range(ceil_log2(pof2))])


@register("reduce", "rabenseifner_far", cost=_rabenseifner_cost, auto=False, preference=2)
def reduce_rabenseifner_far(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Rabenseifner, far partner first: :func:`reduce_rabenseifner` with the distances of the
    reduce-scatter halving from pof2/2 to 1 (folded rank q ends with chunk q) and the gather
    doubling back from 1 to pof2/2, so the largest halves travel farthest (ringcoll's earlier
    order). Same α-β-γ cost and clock on a flat machine; about 6× the hop-bytes on a ring of
    64. Kept for comparison; ``auto`` never picks it.

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus α + nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return _rooted_reduce_scatter_gather(rank, world, layout, [pof2 >> (k + 1) for k in range(ceil_log2(pof2))])


def _rooted_reduce_scatter_gather(rank: int, world: int, layout: Layout, distances) -> Iterator[Step]:
    root = layout[ROOT]
    w = (rank - root - 1) % world
    yield from relabel(_reduce_scatter_gather(w, world, layout.numel, distances),
                       lambda peer: (peer + root + 1) % world)


def _reduce_scatter_gather(w: int, world: int, numel: int, distances) -> Iterator[Step]:
    """Fold in, then a reduce-scatter over pof2 chunks halving the shared range at each of
    ``distances``, then a gather to folded rank pof2 - 1 (the root, w = p - 1) over the same
    pairs in reverse order."""
    data = Buf("data", 0, numel)
    yield from fold_in(w, world, data, Buf("scratch", 0, numel))
    me = folded_rank(w, world)
    if me is None:
        return
    data_chunks = chunks("data", numel, largest_pof2(world))
    history = []
    # scatter-reduce
    for peer, keep, give in halving(me, world, distances):
        recv_buf = Buf("scratch", 0, span(data_chunks, *keep).numel)
        yield step([Send(peer, span(data_chunks, *give)), Recv(peer, recv_buf)],
                   [reduce(span(data_chunks, *keep), recv_buf)])
        history.append((peer, keep, give))
    # gather to the root's folded rank: before each reversed step this rank holds ``keep``
    root = folded_rank(world - 1, world)
    for distance, (peer, keep, give) in zip(reversed(distances), reversed(history)):
        if (me ^ root) & distance:
            yield step([Send(peer, span(data_chunks, *keep))])
            return
        yield step([Recv(peer, span(data_chunks, *give))])


def _ring_cost(world: int, nbytes: int, segment=None) -> Cost:
    k = segment_count(nbytes, segment=segment)
    hops = world - 1 + k - 1 if world > 1 else 0
    return Cost(hops, hops * nbytes / k, hops * nbytes / k)


@register("reduce", "ring", cost=_ring_cost, preference=3)
def reduce_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Pipelined ring toward the root (NCCL's ring reduce): the vector flows in segments along
    the ring root + 1 -> root + 2 -> ... -> root - 1 -> root; each rank reduces a segment
    from its left into its own and passes it on, so once the pipe is full every link carries
    one segment per step. (Not a reduce-scatter + gather: the chain moves n, not 2(p-1)/p·n,
    through each link, at the price of p - 1 hops of latency.)

    Cost: (p - 1 + k - 1)(α + nβ/k + nγ/k), k = ⌈n / segment⌉.
    """
    root = layout[ROOT]
    segs = segments(Buf("data", 0, layout.numel), segment_numel(layout))
    chain = Tree.chain([0] + list(range(world - 1, 0, -1)))    # vranks, the root on top
    yield from rooted(pipeline((rank - root) % world, [Phase(chain, segs, up=True)],
                               max(s.numel for s in segs)), root, world)


def _double_tree_cost(world: int, nbytes: int, segment=None) -> Cost:
    return pipelined_tree_cost(rooted_pipeline(world, up=True), nbytes, segment)


@register("reduce", "double_binary_tree", cost=_double_tree_cost, preference=4)
def reduce_double_binary_tree(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Double binary tree: NCCL's two binary trees over the p - 1 vranks other than the root,
    the root above the top of each; the first tree reduces the first half of the
    vector, the second the other half, each pipelined in segments up its tree. A rank at
    depth d receives segment j of both children at step j + height - d - 1 into scratch and
    reduces them into its own (``data (op) first child (op) second child``), then sends it up
    at step j + height - d. Each global step is split by the colours of its messages
    (``TreePipeline``: a proper edge colouring, up to 2 colours), so a rank sends and
    receives at most one message at a time, and reduces at its step's end; that is the
    simulator's clock (``ONE_PORT``), which the cost follows: a real group posts a global
    step's transfers together.

    Cost: ≈ (2k + 2 lg p)(α + sβ + sγ), k = ⌈n / (2·segment)⌉ segments of s = n/2k per tree:
    once the pipeline is full, each segment costs the busiest rank's two receives and their
    reduction; ≈ nβ + nγ + 2 lg p·α for large k (``TreePipeline.time``: the clock's time).
    """
    root = layout[ROOT]
    pipe = rooted_pipeline(world, up=True)
    segs_a, segs_b = halves(layout.numel, segment_numel(layout))
    slot = max(s.numel for s in segs_a + segs_b)
    phases = [Phase(tree, segs, up, offset, scratch) for (tree, up, offset), segs, scratch
              in zip(pipe.phases, (segs_a, segs_b), (0, 2))]
    yield from rooted(pipeline((rank - root) % world, phases, slot, port_split(pipe, layout)), root, world)
