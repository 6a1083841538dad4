"""One-step algorithms: every rank exchanges with every other rank in a single step.

For small p and short messages, where one rendezvous costs less than lg p dependent ones
(ASTRA-sim's ``direct``; MPICH's isend/irecv all-to-all pattern applied to the reducing
collectives). A rank posts its p - 1 sends in the order rank + 1, rank + 2, ... and its
p - 1 receives in the order rank - 1, rank - 2, ..., so that under a one-send-port,
one-receive-port machine the j-th message of every rank goes out at the same time: the
p - 1 messages of the step take (p-1)(α + mβ) for m bytes each.

Reductions run after the step, over the p operands in rank order (rank 0's first), so every
rank that computes a value computes it from the same operands in the same order: the
results are bitwise identical on every rank. Any world size; no fold.
"""
from __future__ import annotations

from typing import Iterator

from .registry import Cost, register, rotation_when_even
from .vocabulary import IN_PLACE, Buf, Copy, Layout, Recv, Send, Step, chunk_table, reduce, step


def _exchange(rank: int, world: int, send_for, recv_from) -> list:
    """The step's transfers, shifted pairwise: to rank + j and from rank - j, j = 1 .. p-1."""
    comms = []
    for j in range(1, world):
        to, frm = (rank + j) % world, (rank - j) % world
        comms += [Send(to, send_for(to)), Recv(frm, recv_from(frm))]
    return comms


def _all_reduce_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) * nbytes, (world - 1) * nbytes)


@register("all_reduce", "direct", cost=_all_reduce_cost, symmetry=rotation_when_even, preference=30)
def all_reduce_direct(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Direct all-reduce: in one step each rank sends its whole vector to every other rank
    and receives every other rank's into a scratch slot (slot q for rank q), then reduces the
    p vectors in rank order, ``data_0 (op) data_1 (op) ... (op) data_{p-1}``, into its data.
    Every rank computes the same reduction from the same operands in the same order, so the
    result is bitwise identical everywhere. One rendezvous instead of lg p, at the price of
    (p-1)n bytes sent and reduced per rank: for small p and short vectors.

    Cost: (p-1)(α + nβ) + (p-1)nγ under one send and one receive port per rank.
    """
    if world == 1:
        return
    data = Buf("data", 0, layout.numel)
    slots = chunk_table("scratch", world * layout.numel, world)      # one table for every rank
    operands = [data if q == rank else slots[q] for q in range(world)]
    # reduced into the first operand (rank 0's), the result also written to data
    yield step(_exchange(rank, world, lambda to: data, lambda frm: slots[frm]),
               [reduce(operands[0], *operands[1:], out=None if rank == 0 else data)])


def _reduce_scatter_cost(world: int, nbytes: int) -> Cost:
    share = (world - 1) / world * nbytes
    return Cost(world - 1, share, share)


@register("reduce_scatter", "direct", cost=_reduce_scatter_cost, symmetry=rotation_when_even, preference=30)
def reduce_scatter_direct(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Direct reduce-scatter: in one step each rank sends input block q straight to rank q,
    for every other q, and receives block ``rank`` of every other rank's input into scratch
    slot q (for rank q); then it reduces the p contributions in rank order into its output
    (its own input block read in place, never written).

    Cost: (p-1)(α + n/p·β) + (p-1)/p·nγ (n: the input total).
    """
    inputs = chunk_table("input", layout.numel, world)
    block = inputs[0].numel
    output = Buf("output", 0, block)
    slots = chunk_table("scratch", world * block, world)
    # the first operand (rank 0's) is copied into the output, which accumulates the rest
    operands = [inputs[rank] if q == rank else slots[q] for q in range(world)]
    local = [Copy(output, operands[0])]
    if world > 1:
        local.append(reduce(output, *operands[1:]))
    yield step(_exchange(rank, world, lambda to: inputs[to], lambda frm: slots[frm]), local)


def _all_gather_cost(world: int, nbytes: int) -> Cost:
    return Cost(world - 1, (world - 1) / world * nbytes, 0)


@register("all_gather", "direct", cost=_all_gather_cost, symmetry=rotation_when_even, preference=30)
def all_gather_direct(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Direct all-gather: in one step each rank sends its block to every other rank and
    receives every other rank's block straight into its place in the output; its own block
    is copied in (unless it is already there). Blocks are only copied: bitwise identical.

    Cost: (p-1)(α + n/p·β) (n: the gathered total).
    """
    output = chunk_table("output", layout.numel, world)
    own = output[rank] if layout.get(IN_PLACE, False) else Buf("input", 0, output[rank].numel)
    # the builder hands a separate input unless it is this rank's block, so the receives
    # never write what the sends read
    yield step(_exchange(rank, world, lambda to: own, lambda frm: output[frm]),
               [] if own == output[rank] else [Copy(output[rank], own)])

