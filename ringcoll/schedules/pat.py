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

from typing import Iterator, List, Optional

from .registry import Cost, register, rotation_when_even
from .vocabulary import (DEFAULT_SEGMENT_BYTES, IN_PLACE, SEGMENT, Buf, Copy, Layout, Recv, Send, Step, chunks,
                         reduce, step)


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


def _cost(world: int, nbytes: int, collective: str, segment: Optional[int] = None) -> Cost:
    block = nbytes / world if world else 0
    per_message = max(1, int((segment or DEFAULT_SEGMENT_BYTES) // block)) if block else 1 << 62
    messages = sum(-(-len(_offsets(world, d)) // per_message) for d in _distances(world))
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
    block = output[0].numel
    per_message = _per_message(layout, block)
    own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, block)
    placed = [] if own == output[rank] else [Copy(output[rank], own)]
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
    block = inputs[0].numel
    per_message = _per_message(layout, block)
    acc = chunks("acc", layout.numel, world)
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
    yield step(local=[Copy(Buf("output", 0, block), partial[rank])])
