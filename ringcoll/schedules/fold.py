"""Non-power-of-two worlds, MPICH style: fold the remainder ranks in first.

With ``pof2`` the largest power of two <= world and ``rem = world - pof2``: among ranks below
``2 * rem`` each even rank hands its whole vector to ``rank + 1`` and sits out, each odd rank
reduces it and takes the new rank ``rank // 2``; ranks from ``2 * rem`` on take
``rank - rem``. The power-of-two algorithm runs on new ranks, then each odd rank hands the
result back to ``rank - 1``. Extra cost: 2α + 2nβ + nγ.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Tuple

from .vocabulary import Buf, Recv, Send, Step, reduce, step


def largest_pof2(world: int) -> int:
    return 1 << (world.bit_length() - 1)


def folded_rank(rank: int, world: int) -> Optional[int]:
    """This rank's rank in the power-of-two world, or None if it sits the algorithm out."""
    rem = world - largest_pof2(world)
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else None
    return rank - rem


def real_rank(folded: int, world: int) -> int:
    """The world rank that plays ``folded`` in the power-of-two world."""
    rem = world - largest_pof2(world)
    return 2 * folded + 1 if folded < rem else folded + rem


def halving(me: int, world: int, distances: Optional[Iterable[int]] = None) \
        -> Iterator[Tuple[int, Tuple[int, int], Tuple[int, int]]]:
    """Recursive halving on folded rank ``me``: the pof2 block indices shared with the
    partner start as [0, pof2); at each distance (pof2/2 down to 1 unless ``distances`` are
    given) the partner is folded rank ``me xor distance``, and this rank keeps the half of the
    shared range holding its own side (the lower half when the distance bit is clear) and
    gives the other; the kept half is the next shared range. Yields ``(peer, keep, give)``,
    ``peer`` a world rank, ``keep`` and ``give`` ``(lo, hi)`` index ranges."""
    pof2 = largest_pof2(world)
    if distances is None:
        distances = [pof2 >> (k + 1) for k in range(pof2.bit_length() - 1)]
    lo, hi = 0, pof2
    for distance in distances:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me & distance == 0 else ((mid, hi), (lo, mid))
        yield real_rank(me ^ distance, world), keep, give
        lo, hi = keep


def fold_partner(rank: int, world: int) -> Optional[int]:
    """The partner of ``rank`` in the fold of the 2·rem ranks beyond the largest power of two
    (rem = world − 2^⌊lg world⌋): even ranks below 2·rem pair with rank + 1, odd ones with
    rank − 1; None for a rank that is not folded."""
    rem = world - largest_pof2(world)
    if rank >= 2 * rem:
        return None
    return rank + 1 if rank % 2 == 0 else rank - 1


def fold_in(rank: int, world: int, data: Buf, scratch: Buf) -> Iterator[Step]:
    """Even ranks below 2·rem hand their vector to rank + 1, which reduces it."""
    partner = fold_partner(rank, world)
    if partner is not None:
        yield step([Send(partner, data)]) if rank % 2 == 0 else \
            step([Recv(partner, scratch)], [reduce(data, scratch)])


def fold_out(rank: int, world: int, data: Buf) -> Iterator[Step]:
    """Odd ranks below 2·rem hand the result back to rank - 1."""
    partner = fold_partner(rank, world)
    if partner is not None:
        yield step([Recv(partner, data)]) if rank % 2 == 0 else step([Send(partner, data)])


def folded(rank: int, world: int, numel: int, steps_of: Callable[[int], Iterable[Step]]) -> Iterator[Step]:
    """A power-of-two all-reduce on any world: fold in (``data[0:numel]``, the fold's own
    receive in ``scratch[0:numel]``), then ``steps_of(me)``'s steps on this rank's folded
    rank ``me`` (a rank that sits out takes none), then fold out."""
    data = Buf("data", 0, numel)
    yield from fold_in(rank, world, data, Buf("scratch", 0, numel))
    me = folded_rank(rank, world)
    if me is not None:
        yield from steps_of(me)
    yield from fold_out(rank, world, data)
