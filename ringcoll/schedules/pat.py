"""PAT, NCCL's Parallel Aggregated Trees (NCCL 2.23; arXiv 2506.20252): all-gather and
reduce-scatter as Bruck's algorithm with the distances reversed, far partner first, and the
blocks of a step aggregated into messages of bounded size.

All-gather, as p binomial broadcast trees (one per rank's block) run at once: with
k = ⌈lg p⌉, at the step of distance d = 2^(k-1), ..., 2, 1 rank x sends every block it holds
whose holder offset o (rank x holds block x + o) is a multiple of 2d with o + d < p, to rank
x - d; it receives from x + d the blocks x + d + o. Before the step x holds the offsets
that are multiples of 2d, after it the multiples of d: every block reaches every rank once,
in ⌈lg p⌉ steps, at any p (no fold, no final rotation: blocks land in place). The
reduce-scatter is the transpose: distances 1, 2, ..., 2^(k-1), each rank sending the
partials of offsets o + d to rank x + d, which reduces them into its own partials of x + o.

Aggregation: a step carries c_d = ⌈(p - d) / 2d⌉ blocks; they are packed into one buffer
and sent as messages of at most A blocks, A = ⌊segment / block⌋ (at least 1; the segment of
the segment table, 1 MiB by default), as NCCL bounds PAT's aggregation by its buffer space.
Short blocks go in ⌈lg p⌉ messages, blocks of a segment or more one block per message.
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Sequence

from .registry import Cost, register, rotation_when_even
from .trees import segment_count
from .vocabulary import (DEFAULT_SEGMENT_BYTES, IN_PLACE, SEGMENT, Buf, Copy, Layout, Recv, Send, Step, chunks,
                         reduce, segmented, step)


def _distances(world: int) -> List[int]:
    """2^(k-1), ..., 2, 1 for k = ⌈lg p⌉ (none at p = 1)."""
    return [1 << j for j in reversed(range((world - 1).bit_length()))]


def _offsets(world: int, d: int) -> List[int]:
    """The holder offsets that send at the step of distance d: multiples of 2d with o + d < p."""
    return list(range(0, world - d, 2 * d))


def _aggregate(count: int, per_message: int) -> List[tuple]:
    """Block ranges [lo, hi) of the messages that carry ``count`` blocks, at most ``per_message`` each."""
    return [(lo, min(lo + per_message, count)) for lo in range(0, count, per_message)]


def _per_message(layout: Layout, block: int) -> int:
    segment = layout.get(SEGMENT)
    return max(1, segment // block) if segment and block else 1 << 62


def _cost(world: int, nbytes: int, collective: str, segment: Optional[int] = None, nccl: bool = False) -> Cost:
    """PAT's cost; ``nccl``: NCCL's chunking (:func:`all_gather_nccl_pat`), k rounds over
    slices of a block of at most a segment, A the largest power of two ≤ segment / slice."""
    block = nbytes / world if world else 0
    segment = segment or DEFAULT_SEGMENT_BYTES
    rounds = segment_count(-(-nbytes // world), segment) if nccl and world else 1
    piece = block / rounds
    per_message = max(1, int(segment // piece)) if piece else 1 << 62
    if nccl:
        per_message = 1 << (per_message.bit_length() - 1)
    messages = rounds * sum(-(-len(_offsets(world, d)) // per_message) for d in _distances(world))
    share = (world - 1) * block
    return Cost(messages, share, share if collective == "reduce_scatter" else 0)


def _all_gather_cost(world: int, nbytes: int, segment: Optional[int] = None) -> Cost:
    return _cost(world, nbytes, "all_gather", segment)


def _packed(name: str, block: int, count: int) -> List[Buf]:
    return chunks(name, block * count, count) if count else []


def _messages(peer: int, packed: List[Buf], per_message: int, kind) -> list:
    """The transfers of ``packed`` blocks (consecutive in one buffer) to or from ``peer``."""
    return [kind(peer, Buf(packed[lo].name, packed[lo].start, packed[hi - 1].stop))
            for lo, hi in _aggregate(len(packed), per_message)]


@register("all_gather", "pat", cost=_all_gather_cost, symmetry=rotation_when_even, preference=50)
def all_gather_pat(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """PAT all-gather (module docstring): at distances d = 2^(k-1) .. 1, pack the held blocks
    of offsets o ≡ 0 (mod 2d), o + d < p, send them to rank - d in messages of at most A
    blocks, receive as many from rank + d and copy each into its place in the output. Blocks
    are only copied: bitwise identical everywhere. Any p.

    Cost: Σ_d ⌈c_d / A⌉·α + (p-1)/p·nβ (n: the gathered total): ⌈lg p⌉α + (p-1)/p·nβ while
    a step's blocks fit one segment.
    """
    output = chunks("output", layout.numel, world)
    per_message = _per_message(layout, output[0].numel)
    yield from _all_gather_round(rank, world, output, per_message, _own(rank, layout, output))


def _own(rank: int, layout: Layout, output: Sequence[Buf]) -> list:
    """The copy that places this rank's input in its block of the output (none in place)."""
    own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, output[rank].numel)
    return [] if own == output[rank] else [Copy(output[rank], own)]


def _all_gather_round(rank: int, world: int, output: Sequence[Buf], per_message: int, placed: list) -> Iterator[Step]:
    """One PAT all-gather over ``output`` (one block, or one slice of each, per rank), the
    local copies ``placed`` in its first step."""
    block = output[0].numel
    distances = _distances(world)

    def pack(d: int) -> list:
        offsets = _offsets(world, d)
        return [Copy(slot, output[(rank + o) % world]) for slot, o in zip(_packed("scratch", block, len(offsets)), offsets)]

    if not distances:
        yield step(local=placed)
        return
    yield step(local=placed + pack(distances[0]))
    for i, d in enumerate(distances):
        offsets = _offsets(world, d)
        sending, arriving = _packed("scratch", block, len(offsets)), _packed("scratch1", block, len(offsets))
        unpack = [Copy(output[(rank + d + o) % world], slot) for slot, o in zip(arriving, offsets)]
        comms = _messages((rank - d) % world, sending, per_message, Send) + \
            _messages((rank + d) % world, arriving, per_message, Recv)
        yield step(comms, unpack + (pack(distances[i + 1]) if i + 1 < len(distances) else []))


def _reduce_scatter_cost(world: int, nbytes: int, segment: Optional[int] = None) -> Cost:
    return _cost(world, nbytes, "reduce_scatter", segment)


@register("reduce_scatter", "pat", cost=_reduce_scatter_cost, symmetry=rotation_when_even, preference=50)
def reduce_scatter_pat(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """PAT reduce-scatter, the all-gather's trees run backwards (module docstring): at
    distances d = 1, 2, .., 2^(k-1), pack the partials of blocks rank + o + d (o ≡ 0 mod 2d,
    o + d < p), send them to rank + d in messages of at most A blocks, receive rank - d's
    partials of blocks rank + o and reduce them into this rank's. A partial lives in the
    input until its first reduction writes it to scratch (the input is never written); the
    last one left, block ``rank``, is copied to the output. Each block is reduced along one
    tree ending on its owner. Any p.

    Cost: Σ_d ⌈c_d / A⌉·α + (p-1)/p·n(β + γ) (n: the input total).
    """
    inputs = chunks("input", layout.numel, world)
    per_message = _per_message(layout, inputs[0].numel)
    yield from _reduce_scatter_round(rank, world, inputs, chunks("acc", layout.numel, world),
                                     Buf("output", 0, inputs[0].numel), per_message)


def _reduce_scatter_round(rank: int, world: int, inputs: Sequence[Buf], acc: Sequence[Buf], output: Buf,
                          per_message: int) -> Iterator[Step]:
    """One PAT reduce-scatter over ``inputs`` (one block, or one slice of each, per rank),
    partials in ``acc``, this rank's result in ``output``."""
    block = inputs[0].numel
    partial: List[Buf] = list(inputs)       # where each block's partial lives now
    distances = list(reversed(_distances(world)))

    def pack(d: int) -> list:
        offsets = _offsets(world, d)
        return [Copy(slot, partial[(rank + o + d) % world])
                for slot, o in zip(_packed("scratch", block, len(offsets)), offsets)]

    first: list = pack(distances[0]) if distances else []
    if first:
        yield step(local=first)
    for i, d in enumerate(distances):
        offsets = _offsets(world, d)
        sending, arriving = _packed("scratch", block, len(offsets)), _packed("scratch1", block, len(offsets))
        local = []
        for slot, o in zip(arriving, offsets):
            b = (rank + o) % world
            if partial[b] == inputs[b]:         # first contribution: into scratch, input untouched
                local.append(reduce(slot, inputs[b], out=acc[b]))
                partial[b] = acc[b]
            else:
                local.append(reduce(partial[b], slot))
        comms = _messages((rank + d) % world, sending, per_message, Send) + \
            _messages((rank - d) % world, arriving, per_message, Recv)
        yield step(comms, local + (pack(distances[i + 1]) if i + 1 < len(distances) else []))
    yield step(local=[Copy(output, partial[rank])])


# -- NCCL's PAT (src/device/all_gather.h, reduce_scatter.h; src/include/collectives.h PatAGAlgorithm, PatRSAlgorithm)
def _nccl_rounds(layout: Layout, blocks: Sequence[Buf]) -> tuple:
    """NCCL's chunking of PAT: every block cut into slices of at most a segment (NCCL's chunk,
    whose loop runs the whole algorithm once per slice of every block), and the slices a
    message aggregates, the largest power of two ≤ segment / slice (PatAGAlgorithm's
    aggFactor, which also stops at ⌈p/2⌉'s power of two: never fewer than a step's c_d)."""
    slices = segmented(blocks, layout.get(SEGMENT))
    per_message = _per_message(layout, slices[0][0].numel if len(slices) else 0)
    return slices, 1 << (per_message.bit_length() - 1)


def _nccl_pat_cost(collective: str):
    def cost(world: int, nbytes: int, segment: Optional[int] = None) -> Cost:
        return _cost(world, nbytes, collective, segment, nccl=True)
    return cost


@register("all_gather", "nccl_pat", cost=_nccl_pat_cost("all_gather"), symmetry=rotation_when_even, auto=False,
          preference=62)
def all_gather_nccl_pat(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's PAT all-gather (NCCL 2.23+, run where a node has one GPU): :func:`all_gather_pat`'s
    trees with NCCL's chunking: every block cut into slices of a segment at most (NCCL's
    chunk), one PAT all-gather over slice j of every block for each j, a message carrying A
    slices, the largest power of two ≤ segment / slice (PatAGAlgorithm's aggregation).
    Not modelled: the order in which NCCL's PatAGAlgorithm interleaves the distances of
    consecutive aggregated steps (it moves the same blocks over the same distances); NCCL's
    chunk size itself (512 KiB halved down to 64 KiB for small calls, enqueue.cc: the segment
    table's segment stands for it); its channels (one GPU per node, where ringcoll's
    nccl_ring has a single channel too).

    Cost: k slices per block, k·Σ_d ⌈c_d / A⌉·α + (p-1)/p·nβ (n: the gathered total).
    """
    output = chunks("output", layout.numel, world)
    slices, per_message = _nccl_rounds(layout, output)
    placed = _own(rank, layout, output)
    for j in range(len(slices[0]) if world > 1 else 1):
        yield from _all_gather_round(rank, world, [s[j] for s in slices], per_message, placed if j == 0 else [])


@register("reduce_scatter", "nccl_pat", cost=_nccl_pat_cost("reduce_scatter"), symmetry=rotation_when_even,
          auto=False, preference=62)
def reduce_scatter_nccl_pat(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """NCCL's PAT reduce-scatter: :func:`reduce_scatter_pat`'s trees with NCCL's chunking as
    :func:`all_gather_nccl_pat`'s, one PAT reduce-scatter per slice j of the blocks, A slices a
    message; what is not modelled as there.

    Cost: k·Σ_d ⌈c_d / A⌉·α + (p-1)/p·n(β + γ) (n: the input total).
    """
    inputs = chunks("input", layout.numel, world)
    slices, per_message = _nccl_rounds(layout, inputs)
    acc = segmented(chunks("acc", layout.numel, world), layout.get(SEGMENT))
    output = segmented([Buf("output", 0, inputs[0].numel)], layout.get(SEGMENT))[0]
    for j in range(len(slices[0])):
        yield from _reduce_scatter_round(rank, world, [s[j] for s in slices], [a[j] for a in acc], output[j],
                                         per_message)
