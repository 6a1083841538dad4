"""NCCL's algorithms as ringcoll schedules: its ring over channels (all_reduce, all_gather,
reduce_scatter, broadcast, reduce) and its tree all-reduce on channel pairs; its PAT is
``nccl_pat`` (:mod:`.pat`).

NCCL (github.com/NVIDIA/nccl, read at commit 5067397c) runs a collective on **channels**:
the vector is cut into one part per channel and each part runs the algorithm on its own ring
or tree, so that every channel crosses the node boundary on its own GPU and NIC
(``src/graph/search.cc`` builds one ring per NIC; PXN sends over NVLink to the GPU beside
the NIC). Its **tree** (``src/graph/trees.cc``, ``connect.cc``) is a chain through the GPUs
of each node whose first GPU joins a double binary tree over the nodes; ``connectTrees``
gives search channel c's chain both trees, the first to channel c and the second to channel
c + nChannels, so each tree runs on half the channels. The ring kernels of all_gather,
reduce_scatter, broadcast and reduce (``src/device/all_gather.h`` ...) loop over chunks, a
whole ring pass (or chain) per chunk, ringcoll's segments; nccl_ring all_reduce keeps
ringcoll's step-major order (every segment of a step before the next step: the same
messages and flat-machine cost).
The protocols (LL, LL128, Simple) change what a byte costs on the wire, not which messages
go where: they are in NCCL's tuner model (:mod:`ringcoll.cost.nccl`), not here.

All read the node of every rank from ``layout[NODES]`` (:mod:`ringcoll.runtime.nodes`; on a
simulated GPU cluster the machine's nodes). A node's **members** are its ranks in rank order.
"""
from __future__ import annotations

import functools
from typing import Iterator, List, Optional, Sequence, Tuple

from . import all_reduce  # noqa: F401 - the classic algorithms register (and are listed) first
from .all_gather import _place_own
from .hierarchical import _nodes, _rows_period, members_of
from .reduce_scatter import _blocks
from .registry import Cost, register
from .trees import Phase, Tree, TreePipeline, nccl_dtree, pipeline, pipelined_tree_cost, port_split, \
    segment_count, segment_numel
from .vocabulary import NODES, ROOT, SEGMENT, Buf, Copy, Layout, Nodes, Step, chunks, needs_nodes, reduce, segmented, \
    segments, sendrecv, step


def channel_rings(nodes: Nodes) -> List[Tuple[int, ...]]:
    """NCCL's rings, one per channel: on one node a single ring in rank order; on several,
    as many channels as the largest node has ranks, channel c visiting the nodes in order and
    each node's members from its c-th on (``members[(c + j) % L]``), so each channel leaves a
    node from a different GPU (onto a different rail) and every GPU starts one channel."""
    members = members_of(nodes)
    if len(members) == 1:
        return [tuple(members[0])]
    count = max(len(m) for m in members)
    return [tuple(m[(c + j) % len(m)] for m in members for j in range(len(m))) for c in range(count)]


def _ring_channels(world: int, local_size: Optional[int]) -> int:
    local = local_size or world
    return 1 if local >= world else local


def _ring_period(world: int, layout: Layout):
    """``symmetry`` of nccl_ring: on one node the ring's rotation; on nodes of L consecutive
    ranks, all alike, a shift by whole nodes maps every channel's ring onto itself (period L);
    both when every channel's chunks are equal (numel a multiple of channels × world)."""
    nodes = layout.get(NODES) or (0,) * world
    channels = len(channel_rings(tuple(nodes)))
    if layout.numel % (world * channels):
        return None
    return _rows_period(nodes, world, layout.numel, True)


def _ring_messages(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> int:
    """The messages of one pass round NCCL's rings: p - 1 steps for each of the k segments of
    a channel's chunk (n / pC bytes), every step one message per channel: (p-1)kC."""
    channels = _ring_channels(world, local_size)
    return (world - 1) * segment_count(-(-nbytes // (world * channels)), segment) * channels


def _nccl_ring_cost(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> Cost:
    share = (world - 1) / world * nbytes
    return Cost(2 * _ring_messages(world, nbytes, segment, local_size), 2 * share, share)


@register("all_reduce", "nccl_ring", cost=_nccl_ring_cost, symmetry=_ring_period, auto=False, preference=60)
@needs_nodes
def all_reduce_nccl_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's ring all-reduce on channels: the vector cut into one part per channel
    (:func:`channel_rings`: one on a single node, as many as a node has ranks on several),
    each part a ring all-reduce around its channel's ring, one chunk per rank cut into
    segments (``layout[SEGMENT]`` elements at most) that are pipelined; a step carries
    every channel's segment, as NCCL's channels run side by side. Scatter-reduce: at step s
    the rank at ring position m sends chunk m - s to its right and reduces chunk m - s - 1,
    received from its left, into its own; all-gather: the reduced chunks travel p - 1 steps
    further. Every chunk is reduced once, in ring order, and copied: bitwise identical.

    Cost: C channels (C = 1 on one node, L on nodes of L ranks), k segments per channel's
    chunk: 2(p-1)kC·α + 2(p-1)/p·nβ + (p-1)/p·nγ on a flat machine (the channels share the
    rank's port there); on a GPU cluster each channel crosses the node boundary on its own
    rail, so the inter-node bytes per NIC fall by the channels per NIC.
    """
    if world == 1:
        return
    rings = channel_rings(_nodes(layout, world))
    parts = chunks("data", layout.numel, len(rings))
    segs = [segmented(chunks("data", part.numel, world, part.start), layout.get(SEGMENT)) for part in parts]
    count = max(len(s[0]) for s in segs)
    slot_size = max(s[0][0].numel for s in segs)
    where = [ring.index(rank) for ring in rings]
    slot = 0
    for phase in (0, 1):                                 # scatter-reduce, then all-gather
        for s in range(world - 1):
            for k in range(count):
                comms, local = [], []
                for c, (ring, m) in enumerate(zip(rings, where)):
                    if k >= len(segs[c][0]):
                        continue
                    send_idx, recv_idx = (m - s + phase) % world, (m - s - 1 + phase) % world
                    right, left = ring[(m + 1) % world], ring[(m - 1) % world]
                    target = segs[c][recv_idx][k]
                    recv_buf = target
                    if phase == 0:
                        start = (2 * c + slot) * slot_size
                        recv_buf = Buf("scratch", start, start + target.numel)
                        local.append(reduce(target, recv_buf))
                    comms.extend(sendrecv(right, segs[c][send_idx][k], left, recv_buf))
                slot = 1 - slot if phase == 0 else slot
                yield step(comms, local)


@functools.lru_cache(maxsize=64)
def nccl_trees(nodes: Nodes, channel: int = 0) -> Tuple[Tree, Tree]:
    """NCCL's two trees over ranks on ``nodes`` for one channel pair: inside each node a chain
    through its members from its ``channel``-th on (``members[(channel + j) % L]``: as
    :func:`channel_rings`, each channel enters a node at another GPU, the one beside its NIC);
    across nodes NCCL's double binary tree over the nodes
    (:func:`ringcoll.schedules.trees.nccl_dtree`), a node's chain head joining its parent
    node's head and its child nodes' heads."""
    members = [m[channel % len(m):] + m[:channel % len(m)] for m in members_of(nodes)]
    count, world = len(members), len(nodes)
    across = [nccl_dtree(count, n) for n in range(count)]
    trees = []
    for which in (0, 1):
        def node(rank: int, which=which) -> Tuple[Optional[int], Sequence[int]]:
            mine = members[nodes[rank]]
            i = mine.index(rank)
            below = [mine[i + 1]] if i + 1 < len(mine) else []
            if i:
                return mine[i - 1], below
            parent, children = across[nodes[rank]][which]
            return (None if parent is None else members[parent][0]), below + [members[c][0] for c in children]
        trees.append(Tree.build(world, node))
    return trees[0], trees[1]


@functools.lru_cache(maxsize=32)
def nccl_tree_pipeline(nodes: Nodes) -> TreePipeline:
    """The NCCL tree all-reduce's pipelines on C channel pairs (C as :func:`channel_rings`:
    one on one node, as many as the largest node has ranks on several): the first trees of
    channels 0 .. C-1 each up, then down from its top's step, then the second trees alike."""
    pairs = [nccl_trees(nodes, c) for c in range(len(channel_rings(nodes)))]
    return TreePipeline(tuple((tree, up, 0 if up else tree.height)
                              for which in (0, 1) for tree in (pair[which] for pair in pairs) for up in (True, False)))


def _nccl_tree_cost(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> Cost:
    local = local_size or world
    pipe = nccl_tree_pipeline(tuple(rank // local for rank in range(world)))
    return pipelined_tree_cost(pipe, nbytes, segment, parts=len(pipe.phases) // 2)


@register("all_reduce", "nccl_tree", cost=_nccl_tree_cost, auto=False, preference=61)
@needs_nodes
def all_reduce_nccl_tree(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's tree all-reduce on channel pairs: a chain through each node's ranks whose head
    joins NCCL's double binary tree over the nodes (:func:`nccl_trees`), on C channel pairs
    (one on one node, L on nodes of L: each channel's chain starts at another rank), the
    vector cut into 2C parts as NCCL cuts it over its channels, the first C on the channels'
    first trees, the others on their second trees; each part in segments pipelined up (a
    rank reduces its children's segment into its own, ``data (op) chain child (op) tree
    children``, and sends it up) then down from the top, all trees on one clock as
    ``double_binary_tree`` runs (:func:`ringcoll.schedules.trees.pipeline`). Each segment of
    the result is reduced once, at a top, and copied everywhere: bitwise identical.

    Cost: on one node a chain of p: ≈ (2k + 2p)(α + sβ) per tree pipeline; across N nodes of L
    the critical path is 2(L - 1 + lg N) message times for the first segment and each further
    one adds the busiest rank's messages, k = ⌈n / (2C·segment)⌉ segments of s = n/2Ck per
    tree, ≈ 2nβ + nγ for large k (``TreePipeline.time``: the clock's time on a flat machine).
    """
    if world == 1:
        return
    pipe = nccl_tree_pipeline(_nodes(layout, world))
    parts = chunks("data", layout.numel, len(pipe.phases) // 2)
    segs = [segments(part, segment_numel(layout)) for part in parts for _ in (0, 1)]     # up, then down
    slot = max(s.numel for part in segs for s in part)
    phases = [Phase(tree, part, up, offset, 3 * (i // 2)) for i, ((tree, up, offset), part)
              in enumerate(zip(pipe.phases, segs))]
    yield from pipeline(rank, phases, slot, port_split(pipe, layout))


# -- the ring for the other collectives (src/device/all_gather.h, reduce_scatter.h, broadcast.h, reduce.h)
def _channel_segments(blocks: Sequence[Buf], channels: int, c: int, segment: Optional[int]) -> Sequence[Sequence[Buf]]:
    """Channel c's part of every block (each block cut into one part per channel, as NCCL
    gives each channel a slice of every rank's block), each part cut into segments."""
    return segmented([chunks(b.name, b.numel, channels, b.start)[c] for b in blocks], segment)


def _all_gather_nccl_ring_cost(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> Cost:
    return Cost(_ring_messages(world, nbytes, segment, local_size), (world - 1) / world * nbytes, 0)


@register("all_gather", "nccl_ring", cost=_all_gather_nccl_ring_cost, symmetry=_ring_period, auto=False, preference=60)
@needs_nodes
def all_gather_nccl_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's ring all-gather on channels (:func:`channel_rings`): every block cut into one
    part per channel and each part into segments (``layout[SEGMENT]`` elements at most, NCCL's
    chunks); NCCL's loop runs a whole ring pass per segment, so for segment k, at step
    s = 0 .. p-2 the rank at ring position m sends part k of block ``ring[m - s]`` (its own at
    s = 0) to its right and receives block ``ring[m - s - 1]``'s from its left, straight into
    the output; a step carries every channel's segment. Blocks are only copied: bitwise
    identical everywhere.

    Cost: C channels (1 on one node, L on nodes of L ranks), k segments per channel's part:
    (p-1)kC·α + (p-1)/p·nβ on a flat machine (n: the gathered total).
    """
    output = chunks("output", layout.numel, world)
    yield from _place_own(rank, world, layout, output)
    if world == 1:
        return
    rings = channel_rings(_nodes(layout, world))
    segs = [_channel_segments(output, len(rings), c, layout.get(SEGMENT)) for c in range(len(rings))]
    where = [ring.index(rank) for ring in rings]
    for k in range(max(len(s[0]) for s in segs)):
        for s in range(world - 1):
            comms = []
            for c, (ring, m) in enumerate(zip(rings, where)):
                if k < len(segs[c][0]):
                    send_idx, recv_idx = ring[(m - s) % world], ring[(m - s - 1) % world]
                    comms.extend(sendrecv(ring[(m + 1) % world], segs[c][send_idx][k],
                                          ring[(m - 1) % world], segs[c][recv_idx][k]))
            yield step(comms)


def _reduce_scatter_nccl_ring_cost(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> Cost:
    share = (world - 1) / world * nbytes
    return Cost(_ring_messages(world, nbytes, segment, local_size), share, share)


@register("reduce_scatter", "nccl_ring", cost=_reduce_scatter_nccl_ring_cost, symmetry=_ring_period, auto=False,
          preference=60)
@needs_nodes
def reduce_scatter_nccl_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's ring reduce-scatter on channels, cut as :func:`all_gather_nccl_ring`: for each
    segment k, at step s = 0 .. p-2 the rank at ring position m sends its partial of block
    ``ring[m - s - 1]`` (at s = 0 its input) to its right and receives the partial of block
    ``ring[m - s - 2]`` from its left into a scratch slot (two per channel, alternating),
    reducing its own input into it; at the last step the partial of its own block arrives in
    the output and is finished there. Each block is reduced along one ring ending on its owner.

    Cost: (p-1)kC·α + (p-1)/p·n(β + γ) on a flat machine (n: the input total).
    """
    inputs, output = _blocks(world, layout)
    if world == 1:
        yield step(local=[Copy(output, inputs[0])])
        return
    rings = channel_rings(_nodes(layout, world))
    segs = [_channel_segments(inputs, len(rings), c, layout.get(SEGMENT)) for c in range(len(rings))]
    mine = [_channel_segments([output], len(rings), c, layout.get(SEGMENT))[0] for c in range(len(rings))]
    slot_size = max(s[0][0].numel for s in segs)
    where = [ring.index(rank) for ring in rings]
    for k in range(max(len(s[0]) for s in segs)):
        for s in range(world - 1):
            comms, local = [], []
            for c, (ring, m) in enumerate(zip(rings, where)):
                if k >= len(segs[c][0]):
                    continue
                own = segs[c][ring[(m - s - 2) % world]][k]
                slots = [Buf("scratch", (2 * c + j) * slot_size, (2 * c + j) * slot_size + own.numel) for j in (0, 1)]
                send_buf = segs[c][ring[(m - s - 1) % world]][k] if s == 0 else slots[(s - 1) % 2]
                recv_buf = mine[c][k] if s == world - 2 else slots[s % 2]
                comms.extend(sendrecv(ring[(m + 1) % world], send_buf, ring[(m - 1) % world], recv_buf))
                local.append(reduce(recv_buf, own))
            yield step(comms, local)


@functools.lru_cache(maxsize=32)
def nccl_chains(nodes: Nodes, root: int, up: bool) -> TreePipeline:
    """NCCL's rooted ring pipelines, one chain per channel's ring (:func:`channel_rings`), all
    from global step 0: broadcast (down) from the root around its ring to the rank on the
    root's left; reduce (up) from the rank on the root's right around to the root."""
    world = len(nodes)
    phases = []
    for ring in channel_rings(nodes):
        i = ring.index(root)
        order = [ring[(i - j if up else i + j) % world] for j in range(world)]      # the root on top
        phases.append((Tree.chain(order), up, 0))
    return TreePipeline(tuple(phases))


def _chain_cost(up: bool):
    def cost(world: int, nbytes: int, segment=None, local_size: Optional[int] = None) -> Cost:
        local = local_size or world
        pipe = nccl_chains(tuple(rank // local for rank in range(world)), 0, up)
        return pipelined_tree_cost(pipe, nbytes, segment, parts=len(pipe.phases))
    return cost


def _rooted_nccl_ring(rank: int, world: int, layout: Layout, up: bool) -> Iterator[Step]:
    """The steps of :func:`nccl_chains`' pipelines: the vector cut into one part per channel,
    each part into segments carried down (or reduced up) its channel's chain."""
    pipe = nccl_chains(_nodes(layout, world), layout[ROOT], up)
    parts = chunks("data", layout.numel, len(pipe.phases))
    phases = [Phase(tree, segments(part, segment_numel(layout)), up, 0, c)
              for c, ((tree, _, _), part) in enumerate(zip(pipe.phases, parts))]
    yield from pipeline(rank, phases, max(s.numel for p in phases for s in p.segs), port_split(pipe, layout))


@register("broadcast", "nccl_ring", cost=_chain_cost(False), auto=False, preference=60)
@needs_nodes
def broadcast_nccl_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's ring broadcast on channels: the vector cut into one part per channel, each
    part into segments pipelined down the channel's ring from the root (root -> its right ->
    ... -> its left, :func:`nccl_chains`): the rank at chain position v receives segment j
    at global step j + v - 1 and forwards it at j + v, every channel at once (a global step
    split by the colours of its messages on the one-port clock). Copies only: bitwise
    identical.

    Cost: on one node (C = 1) (p - 1 + k - 1)(α + nβ/k), k = ⌈n / segment⌉; with C channels
    k segments of n/(Ck) per channel and the busiest rank's C messages per global step
    (``TreePipeline.time``: the clock's time on a flat machine).
    """
    if world > 1:
        yield from _rooted_nccl_ring(rank, world, layout, False)


@register("reduce", "nccl_ring", cost=_chain_cost(True), auto=False, preference=60)
@needs_nodes
def reduce_nccl_ring(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's ring reduce on channels: the vector cut into one part per channel, each part
    into segments pipelined along the channel's ring toward the root (the root's right ->
    ... -> its left -> the root, :func:`nccl_chains`); a rank receives a segment from its
    predecessor into scratch, reduces it into its own (``data (op) received``) and passes
    it on at the next global step; the root's result is complete when the last segment lands.

    Cost: on one node (C = 1) (p - 1 + k - 1)(α + nβ/k + nγ/k), k = ⌈n / segment⌉; with C
    channels as :func:`broadcast_nccl_ring`, each message's segment also reduced.
    """
    if world > 1:
        yield from _rooted_nccl_ring(rank, world, layout, True)
