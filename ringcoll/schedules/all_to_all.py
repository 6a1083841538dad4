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

from .vocabulary import RECV_BLOCKS, SEND_BLOCKS, Buf, Copies, Copy, Layout, Recv, Send, Step, ceil_log2, step
from .registry import Cost, register, rotation_when_even


def _blocks(layout: Layout, world: int) -> tuple[Sequence[Buf], Sequence[Buf]]:
    send_blocks, recv_blocks = layout[SEND_BLOCKS], layout[RECV_BLOCKS]
    if len(send_blocks) != world or len(recv_blocks) != world:
        raise ValueError(f"all_to_all layout needs {world} send and receive blocks, got "
                         f"{len(send_blocks)} and {len(recv_blocks)}")
    return send_blocks, recv_blocks


def _pairwise_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) / world * nbytes, 0)


@register("all_to_all", "pairwise", cost=_pairwise_cost, symmetry=rotation_when_even, preference=0)
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


@register("all_to_all", "linear", cost=_linear_cost, symmetry=rotation_when_even, preference=1)
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


def _bruck_moved(world: int, k: int) -> int:
    """How many positions i < world have bit k set: the blocks that move at step k."""
    period, half = 2 << k, 1 << k
    return (world // period) * half + max(0, world % period - half)


def _bruck_cost(world: int, nbytes: int) -> Cost:
    block = nbytes / world
    return Cost(ceil_log2(world), sum(_bruck_moved(world, k) for k in range(ceil_log2(world))) * block, 0)


@register("all_to_all", "bruck", cost=_bruck_cost, symmetry=rotation_when_even, preference=2)
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
    steps = ceil_log2(world)
    for k in range(-1, steps):
        comms = ()
        if k >= 0 and block:
            distance, size = 1 << k, _bruck_moved(world, k) * block
            comms = (Send((rank + distance) % world, Buf("send_buf", 0, size)),
                     Recv((rank - distance) % world, Buf("recv_buf", 0, size)))
        yield Step(comms, _BruckCopies(rank, world, k, steps, block, send_blocks, recv_blocks) if block else ())


class _BruckCopies(Copies):
    """The local copies of Bruck's step k (k = -1: the one before the first transfer): the
    blocks received at step k unpacked to where they now live, then those that move at step
    k + 1 packed into its message, positions in ascending order; the own block is copied
    first at k = -1. After steps 0 .. d - 1 the block at position i (moved at the steps of
    its set bits) is still in the input if none of its bits is below d, in its receiver's
    output if all are, else in scratch at position i."""

    __slots__ = ("rank", "world", "k", "steps", "block", "send_blocks", "recv_blocks")

    def __init__(self, rank, world, k, steps, block, send_blocks, recv_blocks):
        self.rank, self.world, self.k, self.steps, self.block = rank, world, k, steps, block
        self.send_blocks, self.recv_blocks = send_blocks, recv_blocks

    def _where(self, i: int, done: int) -> Buf:
        if not i & ((1 << done) - 1):
            return self.send_blocks[(self.rank + i) % self.world]
        if i >> done == 0:
            return self.recv_blocks[(self.rank - i) % self.world]
        return Buf("scratch", i * self.block, (i + 1) * self.block)

    def __len__(self) -> int:
        k, world = self.k, self.world
        unpacked = _bruck_moved(world, k) if k >= 0 else 1
        return unpacked + (_bruck_moved(world, k + 1) if k + 1 < self.steps else 0)

    def __iter__(self):
        rank, world, k, block = self.rank, self.world, self.k, self.block
        done = k + 1
        if k < 0:
            yield Copy(self.recv_blocks[rank], self.send_blocks[rank])
        else:
            bit = 1 << k
            for j, i in enumerate(i for i in range(bit, world) if i & bit):
                yield Copy(self._where(i, done), Buf("recv_buf", j * block, (j + 1) * block))
        if done < self.steps:
            bit = 1 << done
            for j, i in enumerate(i for i in range(bit, world) if i & bit):
                yield Copy(Buf("send_buf", j * block, (j + 1) * block), self._where(i, done))
