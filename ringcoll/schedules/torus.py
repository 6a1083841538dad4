"""Torus algorithms: all-reduce on the rows and columns of a grid, or on every port of a torus.

The 2-D torus all-reduce (Sony on ABCI, arXiv 1811.05233; Google on TPU v3, arXiv 1811.06992)
is the two-level all-reduce of :mod:`ringcoll.schedules.hierarchical` with the grid's rows as
nodes; the bucket all-reduce on every port of a D-dimensional torus runs rings along each
dimension in turn (Jain and Sabharwal; Sack and Gropp's multiport form, the Swing paper's
baseline). The torus comes in ``layout[GRID]`` where the group's or simulator's machine is a
torus or mesh (:func:`~ringcoll.schedules.vocabulary.needs_grid`), else the X × Y grid of
:func:`~ringcoll.schedules.vocabulary.torus_grid`.
"""
from __future__ import annotations

import functools
import itertools
from typing import Iterator, List, Optional, Sequence, Tuple

from .hierarchical import ring_all_gather, ring_reduce_scatter, two_level_all_reduce, two_level_cost
from .registry import Cost, register
from .vocabulary import GRID, Layout, Step, chunks, grid_of, needs_grid, torus_grid


def _torus_cost(world: int, nbytes: int) -> Cost:
    return two_level_cost(world, nbytes, torus_grid(world)[0])


def torus_period(world: int, layout: Layout) -> Optional[object]:
    """``symmetry`` of the 2-D torus all-reduce: the two-level rings with the rows (X
    consecutive ranks) as nodes, a rotation of period X (period 1 on the 1 × p grid)."""
    if layout.numel % world:
        return None
    x, _ = torus_grid(world)
    return "rotation" if x == world else x


@register("all_reduce", "torus2d", cost=_torus_cost, symmetry=torus_period, preference=41)
def all_reduce_torus2d(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """2-D torus all-reduce on an X × Y grid, X·Y = p (rows of X consecutive ranks, Y the
    largest divisor of p not above √p): a ring reduce-scatter along each row, a ring
    all-reduce of each row chunk along its column, a ring all-gather along each row. Every
    ring runs between grid neighbours. A prime p has only the 1 × p grid, where this is the
    ring all-reduce (run as such, not refused). Same schedule as the hierarchical
    all-reduce with the rows as nodes.

    Cost: 2(X+Y-2)α + 2(p-1)/p·nβ + (p-1)/p·nγ.
    """
    return two_level_all_reduce(rank, world, _rows(world), layout.numel)


@functools.lru_cache(maxsize=8)
def _rows(world: int) -> Tuple[int, ...]:
    """Each rank's row of the torus grid (:func:`torus_grid`), the nodes of torus2d."""
    x, _ = torus_grid(world)
    return tuple(r // x for r in range(world))


# -- the bucket algorithm on every port of a torus ---------------------------------------------
def bucket_grid(world: int, given: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
    """The torus the bucket algorithm runs on (:func:`~.vocabulary.grid_of`): ``given``
    (``layout[GRID]``) of any sizes, else torus2d's X × Y grid."""
    return grid_of(world, given)


def bucket_lines(rank: int, dims: Sequence[int]) -> List[Tuple[List[int], int]]:
    """Per dimension: the ranks on ``rank``'s line along it, in the order of their coordinate
    there, and ``rank``'s place among them."""
    lines, stride = [], 1
    for d in dims:
        coord = (rank // stride) % d
        base = rank - coord * stride
        lines.append(([base + k * stride for k in range(d)], coord))
        stride *= d
    return lines


def _bucket_torus_cost(world: int, nbytes: int) -> Cost:
    dims = bucket_grid(world)
    parts = 2 * len(dims)
    return Cost(2 * parts * sum(d - 1 for d in dims), 2 * (world - 1) / world * nbytes, (world - 1) / world * nbytes)


def bucket_rotation(world: int, layout: Layout) -> Optional[int]:
    """``symmetry`` of bucket_torus: moving a rank by one along the grid's last dimension (a
    rotation by p / d_last ranks) moves every ring it is on alike; where every ring's chunks
    are equal (``numel`` a multiple of 2D·p), its sizes are its representative's."""
    dims = bucket_grid(world, layout.get(GRID))
    if not dims or layout.numel % (2 * len(dims) * world):
        return None
    return world // dims[-1]


@register("all_reduce", "bucket_torus", cost=_bucket_torus_cost, symmetry=bucket_rotation, preference=42)
@needs_grid
def all_reduce_bucket_torus(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """The bucket algorithm on every port of a D-dimensional torus (Jain and Sabharwal's
    bucket all-reduce; Sack and Gropp's multiport form, the baseline of the Swing paper's
    Section 2.3.4): the vector is cut into 2D parts and 2D bucket all-reduces run at once,
    one per part. Part c takes the dimensions in turn from dimension c mod D, a ring
    reduce-scatter along each (its block cut into d chunks, the rank keeping the one of its
    coordinate), then ring all-gathers back in reverse order; parts c >= D run their rings
    the other way round. So at every step each rank's 2D messages go to its 2D neighbours,
    one per link, and no link carries two. The parts move from one dimension to the next
    together (the paper's synchronised form: on a rectangular torus the phase lasts as long
    as the longest ring). Every element is reduced along one chain per ring, then copied:
    bitwise identical on every rank. Any world, no fold.

    The torus is ``layout[GRID]`` (the group's or simulator's torus or mesh machine, any
    dimensions), else torus2d's X × Y grid; on a one-dimensional grid (a prime p) it is the
    bidirectional ring all-reduce. ``machine.ports`` of 2D lets a step's 2D messages go at
    once; on one port they queue.

    Cost (one port): 4D·Σ(d_i - 1)α + 2(p-1)/p·nβ + (p-1)/p·nγ.
    """
    dims = bucket_grid(world, layout.get(GRID))
    if not dims:
        return
    lines = bucket_lines(rank, dims)
    count = len(dims)
    parts = chunks("data", layout.numel, 2 * count)
    plans = []                  # per part: (ring, place, the blocks it cuts) per dimension in its order
    for c, part in enumerate(parts):
        block, phases = part, []
        for i in range(count):
            ring, place = lines[(c + i) % count]
            if c >= count:      # the other way round: the ring reversed
                ring, place = ring[::-1], len(ring) - 1 - place
            cut = chunks("data", block.numel, len(ring), block.start)
            phases.append((ring, place, cut))
            block = cut[place]
        plans.append(phases)
    # each part's scratch: two slots of at most ceil(part / 2) elements from part.start + c
    for i in range(count):
        yield from _together([ring_reduce_scatter(*plan[i], slot=part.start + c)
                              for c, (part, plan) in enumerate(zip(parts, plans))])
    for i in reversed(range(count)):
        yield from _together([ring_all_gather(*plan[i]) for plan in plans])


def _together(runs: Sequence[Iterator[Step]]) -> Iterator[Step]:
    """The runs' steps side by side: step k holds every run's k-th step (the runs that have
    one), their transfers posted in the runs' order."""
    for steps in itertools.zip_longest(*runs):
        present = [st for st in steps if st is not None]
        yield Step(tuple(c for st in present for c in st.comms), tuple(op for st in present for op in st.local))
