"""barrier: no rank leaves before every rank has entered.

A barrier moves no data, only one-byte **tokens**: the caller's ``token`` buffer holds one
element per step plus one. Step k sends ``token[k]`` and receives into ``token[k + 1]``,
which step k + 1 then sends on: the data dependency orders the steps for any executor (one
that overlaps independent steps must still wait for step k's receive before step k + 1's
send). A send completes only once its receive is posted, and a step's transfers are waited
on together, so a rank that finishes step k has heard, directly or through others, from the
2^(k+1) - 1 ranks behind it.
"""
from __future__ import annotations

from typing import Iterator

from .vocabulary import Buf, Layout, Recv, Send, Step, ceil_log2, step
from .registry import Cost, register


def _dissemination_cost(world: int, nbytes: int) -> Cost:
    return Cost(ceil_log2(world), ceil_log2(world), 0)     # one one-byte token per step


def _rotation(world: int, layout: Layout) -> str:
    """Every rank sends and receives one-element tokens at the same distances: symmetric by
    rotation at any p (the token's size does not depend on the world)."""
    return "rotation"


@register("barrier", "dissemination", cost=_dissemination_cost, symmetry=_rotation, preference=0)
def barrier_dissemination(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Dissemination (Hensgen, Finkel and Manber 1988): at step k each rank sends the token
    to (rank + 2^k) % p and receives one from (rank - 2^k) % p. After ⌈lg p⌉ steps every rank
    has heard from all the others, at any p, power of two or not.

    Cost: ⌈lg p⌉(α + β): one-byte tokens.
    """
    for k in range(ceil_log2(world)):
        distance = 1 << k
        yield step([Send((rank + distance) % world, Buf("token", k, k + 1)),
                    Recv((rank - distance) % world, Buf("token", k + 1, k + 2))])


def token_numel(world: int) -> int:
    """The elements of the ``token`` buffer the dissemination barrier needs."""
    return ceil_log2(world) + 1
