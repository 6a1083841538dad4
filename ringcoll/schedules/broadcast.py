"""broadcast: every rank ends with the root's ``data``.

Layout parameters: ``root`` (the root's rank in the group) and, for the pipelined
algorithms, ``segment`` (elements per segment, from ringcoll.selection.SEGMENTS). Every
algorithm is written on vranks, ``vrank = (rank - root) % world``, the root being vrank 0.
Data is only copied, never computed, so every rank ends with the root's bits.
"""
from __future__ import annotations

from typing import Iterator

from .registry import Cost, register
from .vocabulary import ROOT, Buf, Layout, Recv, Send, Step, ceil_log2, chunk_table, segments, span, step
from .trees import Phase, Tree, binomial, binomial_span, halves, pipeline, pipelined_tree_cost, port_split, \
    rooted, rooted_pipeline, segment_count, segment_numel


def _binomial_cost(world: int, nbytes: int) -> Cost:
    return Cost(ceil_log2(world), ceil_log2(world) * nbytes, 0)


@register("broadcast", "binomial", cost=_binomial_cost, preference=0)
def broadcast_binomial(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Binomial tree: vrank v (lowest set bit b) receives the vector from v - b, then sends it
    to v + b/2, v + b/4, ..., v + 1 (the root to v + 2^k for every 2^k < p), the largest
    subtree first, one send per step. Latency-optimal; each byte crosses lg p links in turn.

    Cost: ⌈lg p⌉(α + nβ).
    """
    root = layout[ROOT]
    yield from rooted(_binomial(((rank - root) % world), world, Buf("data", 0, layout.numel)), root, world)


def _binomial(vrank: int, world: int, data: Buf) -> Iterator[Step]:
    parent, children = binomial(vrank, world)
    if parent is not None:
        yield step([Recv(parent, data)])
    for child in children:
        yield step([Send(child, data)])


def _linear_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) * nbytes, 0)


@register("broadcast", "linear", cost=_linear_cost, preference=1)
def broadcast_linear(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Flat tree: the root posts its p - 1 sends at once and every other rank receives in a
    single step. One step instead of lg p dependent ones, at the price of the root sending
    every byte p - 1 times: for short vectors, where a step costs a process wake-up.

    Cost: (p-1)α + (p-1)nβ, the latencies overlapped (≈ α + (p-1)nβ).
    """
    root = layout[ROOT]
    data = Buf("data", 0, layout.numel)
    if rank == root:
        yield step([Send(peer, data) for peer in range(world) if peer != root])
    else:
        yield step([Recv(root, data)])


def _chain_cost(world: int, nbytes: int, segment=None) -> Cost:
    k = segment_count(nbytes, segment=segment)
    hops = world - 1 + k - 1 if world > 1 else 0
    return Cost(hops, hops * nbytes / k, 0)


@register("broadcast", "pipelined_chain", cost=_chain_cost, preference=2)
def broadcast_pipelined_chain(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Pipelined chain: the ranks in ring order from the root, root -> root + 1 -> ... ->
    root - 1, the vector cut into k segments. Vrank v receives segment j from its left at step
    j + v - 1 and forwards it to its right at step j + v, so after the pipe fills every link
    carries one segment per step. Bandwidth-optimal at large n (each rank sends n once).

    Cost: (p - 1 + k - 1)(α + nβ/k), k = ⌈n / segment⌉.
    """
    root = layout[ROOT]
    segs = segments(Buf("data", 0, layout.numel), segment_numel(layout))
    chain = Tree.chain(list(range(world)))
    yield from rooted(pipeline((rank - root) % world, [Phase(chain, segs, up=False)], 0), root, world)


def _scatter_allgather_cost(world: int, nbytes: int) -> Cost:
    share = (world - 1) / world * nbytes
    return Cost(ceil_log2(world) + world - 1, 2 * share, 0)


@register("broadcast", "scatter_allgather", cost=_scatter_allgather_cost, preference=3)
def broadcast_scatter_allgather(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Scatter then ring all-gather (van de Geijn; MPICH's long-message broadcast). The vector
    is cut into one chunk per vrank. Scatter: down the binomial tree, vrank v receives the
    chunks of its subtree [v, v + lowbit(v)) and hands each child its subtree's chunks.
    All-gather: at step s vrank v sends chunk (v - s) to its right and receives chunk
    (v - s - 1) from its left, skipping the chunks the receiver already holds from the
    scatter (both ends know which).

    Cost: (⌈lg p⌉ + p - 1)α + 2(p-1)/p·nβ.
    """
    root = layout[ROOT]
    yield from rooted(_scatter_allgather((rank - root) % world, world, layout.numel), root, world)


def _scatter_allgather(vrank: int, world: int, numel: int) -> Iterator[Step]:
    if world == 1:
        return
    data = chunk_table("data", numel, world)
    filled = min(numel, world)            # the chunks that hold elements: 0 .. filled - 1

    # scatter
    parent, children = binomial(vrank, world)
    if parent is not None:
        yield step([Recv(parent, span(data, *binomial_span(vrank, world)))])
    for child in children:
        yield step([Send(child, span(data, *binomial_span(child, world)))])
    # allgather: one Step per step with a transfer, built directly (its chunks are not empty)
    right, left = (vrank + 1) % world, (vrank - 1) % world
    right_lo, right_hi = binomial_span(right, world)      # the chunks each already holds
    own_lo, own_hi = binomial_span(vrank, world)
    for s in range(world - 1):
        send_idx, recv_idx = (vrank - s) % world, (vrank - s - 1) % world
        sends = send_idx < filled and not right_lo <= send_idx < right_hi
        if recv_idx < filled and not own_lo <= recv_idx < own_hi:
            received = Recv(left, data[recv_idx])
            yield Step((Send(right, data[send_idx]), received) if sends else (received,))
        elif sends:
            yield Step((Send(right, data[send_idx]),))


def _double_tree_cost(world: int, nbytes: int, segment=None) -> Cost:
    return pipelined_tree_cost(rooted_pipeline(world, up=False), nbytes, segment)


@register("broadcast", "double_binary_tree", cost=_double_tree_cost, preference=4)
def broadcast_double_binary_tree(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Double binary tree (Sanders-Speck-Träff two-tree; NCCL's trees): NCCL's two binary trees
    over the p - 1 vranks other than the root, the root above the top of each. The first
    tree carries the first half of the vector, the second the other half, each pipelined in
    segments down its tree (a rank at depth d receives segment j at step j + d - 1 and sends
    it to its children at step j + d). A rank is interior in at most one tree, so it sends
    at most two segments per step, and the root sends each byte once. Each global step is
    split by the colours of its messages (``TreePipeline``: a proper edge colouring, up to 2
    colours), so a rank sends and receives at most one message at a time; that is the
    simulator's clock (``ONE_PORT``), which the cost follows: a real group posts a global
    step's transfers together.

    Cost: ≈ (2k + 2 lg p)(α + sβ), k = ⌈n / (2·segment)⌉ segments of s = n/2k per tree (one
    segment: ≈ 2 lg p message times; once the pipeline is full each segment costs the
    busiest rank's two sends): ≈ nβ + 2 lg p·α for large k (``TreePipeline.time``: the
    clock's time).
    """
    root = layout[ROOT]
    pipe = rooted_pipeline(world, up=False)
    segs_a, segs_b = halves(layout.numel, segment_numel(layout))
    phases = [Phase(tree, segs, up, offset)
              for (tree, up, offset), segs in zip(pipe.phases, (segs_a, segs_b))]
    yield from rooted(pipeline((rank - root) % world, phases, 0, port_split(pipe, layout)), root, world)
