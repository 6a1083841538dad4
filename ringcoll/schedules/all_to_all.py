"""all_to_all: rank r sends its block for each peer and ends with every peer's block for r.

Words: a **block** is what one rank sends to one peer (``send_blocks[peer]``) or receives
from one peer (``recv_blocks[peer]``). The layout carries this rank's own blocks, as chunks
of whatever caller buffers the collective names (one flat ``input``/``output`` pair for
``all_to_all_single``, one buffer per list entry for ``all_to_all``), so the blocks may
differ in size from peer to peer and from rank to rank: a transfer's two ends agree because
rank r's ``send_blocks[d]`` and rank d's ``recv_blocks[r]`` are the same split, seen from
either side. ``layout.numel`` is what this rank sends in all (the n of the cost models).

Every algorithm moves each block exactly once from its sender's input to its receiver's
output and never writes the input, so the result is the same bits whatever the algorithm.
``pairwise`` and ``linear`` exchange exactly one message per (source, destination) pair and
so even interoperate; ``bruck`` forwards blocks through other ranks and needs every block
of the call to have the same size.
"""
from __future__ import annotations

from typing import Iterator, Sequence

from .vocabulary import Buf, Copy, Layout, Recv, Send, Step, ceil_log2, step
from .registry import Cost, register, rotation_when_even


def _blocks(layout: Layout, world: int) -> tuple[Sequence[Buf], Sequence[Buf]]:
    send_blocks, recv_blocks = layout["send_blocks"], layout["recv_blocks"]
    if len(send_blocks) != world or len(recv_blocks) != world:
        raise ValueError(f"all_to_all layout needs {world} send and receive blocks, got "
                         f"{len(send_blocks)} and {len(recv_blocks)}")
    return send_blocks, recv_blocks


def _pairwise_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) / world * nbytes, 0)


@register("all_to_all", "pairwise", cost=_pairwise_cost, symmetry=rotation_when_even)
def all_to_all_pairwise(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Pairwise exchange: at step s (1 .. p-1) each rank sends its block for
    (rank + s) % p to that peer and receives the block of (rank - s) % p from that peer; its
    own block is copied locally. One message in and one out per step, so it suits large
    blocks and any block sizes.

    Cost: (p-1)α + (p-1)/p·nβ (n: what one rank sends).
    """
    send_blocks, recv_blocks = _blocks(layout, world)
    own = Copy(recv_blocks[rank], send_blocks[rank])
    if world == 1:
        yield step((), [own])
        return
    for s in range(1, world):
        send_peer, recv_peer = (rank + s) % world, (rank - s) % world
        yield step([Send(send_peer, send_blocks[send_peer]), Recv(recv_peer, recv_blocks[recv_peer])],
                   [own] if s == 1 else [])


def _linear_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) / world * nbytes, 0)


@register("all_to_all", "linear", cost=_linear_cost, symmetry=rotation_when_even)
def all_to_all_linear(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Linear (MPICH's isend/irecv all-to-all): one step that posts every send and every
    receive at once, peers in the pairwise order, then copies the own block. The p-1
    messages are in flight together, so their latencies overlap; any block sizes.

    Cost: (p-1)α + (p-1)/p·nβ with one port; about α + (p-1)/p·nβ when the messages overlap.
    """
    send_blocks, recv_blocks = _blocks(layout, world)
    comms = []
    for s in range(1, world):
        send_peer, recv_peer = (rank + s) % world, (rank - s) % world
        comms += [Send(send_peer, send_blocks[send_peer]), Recv(recv_peer, recv_blocks[recv_peer])]
    yield step(comms, [Copy(recv_blocks[rank], send_blocks[rank])])


def _bruck_moves(world: int) -> list[list[int]]:
    """For each step k, the block positions i < world that move (bit k of i is set)."""
    return [[i for i in range(world) if i >> k & 1] for k in range(ceil_log2(world))]


def _bruck_cost(world: int, nbytes: int) -> Cost:
    block = nbytes / world
    return Cost(ceil_log2(world), sum(len(moved) for moved in _bruck_moves(world)) * block, 0)


@register("all_to_all", "bruck", cost=_bruck_cost, symmetry=rotation_when_even)
def all_to_all_bruck(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Bruck: ⌈lg p⌉ steps for equal blocks, the latency-optimal all-to-all.

    Position i of rank r holds the block that r sends to (r + i) % p. At step k every
    position whose bit k is set moves 2^k ranks on: the rank packs those blocks into one
    message to (rank + 2^k) % p and unpacks the message of (rank - 2^k) % p into the same
    positions. A block at position i has then travelled i ranks and reached its receiver,
    so position i of rank d holds the block from (d - i) % p. Blocks are packed straight
    from the input and unpacked straight into the output on their last move (scratch holds
    those still travelling), so none is copied more than needed.

    Cost: ⌈lg p⌉α + (n/p)·Σ_k #{i < p : bit k of i}·β ≈ ⌈lg p⌉α + (n/2)·lg p·β.
    """
    send_blocks, recv_blocks = _blocks(layout, world)
    block = send_blocks[0].numel
    if any(b.numel != block for b in (*send_blocks, *recv_blocks)):
        raise ValueError(f"all_to_all/bruck needs equal blocks, got send blocks "
                         f"{[b.numel for b in send_blocks]} and receive blocks {[b.numel for b in recv_blocks]}")
    moves = _bruck_moves(world)
    # where[i]: where the block at position i is now
    where = {i: send_blocks[(rank + i) % world] for i in range(world)}

    def packed(name: str, k: int) -> dict[int, Buf]:
        return {i: Buf(name, j * block, (j + 1) * block) for j, i in enumerate(moves[k])}

    def pack(k: int) -> list[Copy]:
        return [Copy(dst, where[i]) for i, dst in packed("send_buf", k).items()] if k < len(moves) else []

    yield step((), [Copy(recv_blocks[rank], send_blocks[rank]), *pack(0)])
    for k, moved in enumerate(moves):
        distance = 1 << k
        send_peer, recv_peer = (rank + distance) % world, (rank - distance) % world
        unpack = []
        for i, src in packed("recv_buf", k).items():
            last_move = i >> (k + 1) == 0
            where[i] = recv_blocks[(rank - i) % world] if last_move else Buf("scratch", i * block, (i + 1) * block)
            unpack.append(Copy(where[i], src))
        size = len(moved) * block
        yield step([Send(send_peer, Buf("send_buf", 0, size)), Recv(recv_peer, Buf("recv_buf", 0, size))],
                   [*unpack, *pack(k + 1)])
