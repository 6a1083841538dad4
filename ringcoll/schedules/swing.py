"""Swing all-reduce (De Sensi et al., "Swing: Short-cutting Rings for Higher Bandwidth
Allreduce", NSDI'24, arXiv 2401.09356) and the butterfly it shares with Bine (SC'25).

At step s rank r pairs with ``r + ρ(s)`` if r is even and ``r - ρ(s)`` if r is odd (mod p),
where ρ(s) = Σ_{i≤s} (-2)^i = 1, -1, 3, -5, 11, -21 ...: peer distances 1, 1, 3, 5, 11, 21
instead of recursive doubling's 1, 2, 4, 8. On a torus or a ring the partners are fewer hops
apart; in the flat α-β-γ model the cost is that of recursive doubling (latency form) or
Rabenseifner (bandwidth form). Two forms, one name each:

- ``swing_latency``: lg p steps exchanging the whole vector;
- ``swing_bandwidth``: a reduce-scatter then an all-gather on the same pairs.

The pairs are a perfect matching at every step, and the set of ranks reachable from r over
steps s+1 .. lg p - 1 is the same for every member of that set (checked for p up to 2^20 by
:func:`swing_blocks`), so these sets nest like the halves of recursive halving. Numbering
the p blocks of the vector depth-first along that nesting makes every set one contiguous
range of blocks: each message of the bandwidth form is one contiguous chunk (libswing
reaches the same by remapping block indices).

A world that is not a power of two folds its remainder in first (MPICH's fold,
:mod:`.fold`): the algorithm runs on the pof2 folded ranks, with peers taken modulo pof2,
and costs 2α + 2nβ + nγ more.

Against the paper (checked in tests/test_orders.py): the peers are the paper's ρ(s), even
ranks adding and odd ones subtracting, mod p, and ``swing_bandwidth`` runs the paper's order
(reduce-scatter s = 0 .. lg p - 1, all-gather the reverse). Where ringcoll departs:

- ``swing_latency`` runs the steps far partner first (s = lg p - 1 .. 0), not s = 0 first,
  so every rank reduces the same operands in the same order (bitwise-identical floats);
  the pairs and the cost are the paper's;
- a non-power-of-two p takes MPICH's fold, not the paper's own scheme for such p;
- the paper's multi-dimensional (torus) form, one Swing per dimension and direction at once
  on a share of the vector, is ``swing_torus_bandwidth`` and ``swing_torus_latency`` (below;
  the latency form far partner first, as ``swing_latency``); on a torus whose dimensions are
  not powers of two they take the default 2-D grid;
- blocks are numbered depth-first along the nested reach sets rather than by libswing's
  remapping (the same messages, each one contiguous chunk).
"""
from __future__ import annotations

import functools
import math
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np

from .registry import Cost, register
from .vocabulary import GRID, Buf, Layout, Step, chunks, grid_of, needs_grid, reduce, sendrecv, span, step
from .all_reduce import _rabenseifner_cost, _recursive_doubling_cost, whole_vector_exchanges
from .fold import folded, largest_pof2, real_rank


def rho(s: int) -> int:
    """ρ(s) = Σ_{i≤s} (-2)^i = (1 - (-2)^{s+1}) / 3."""
    return (1 - (-2) ** (s + 1)) // 3


def swing_peer(rank: int, s: int, world: int) -> int:
    """Rank's partner at step s: rank + ρ(s) for even ranks, rank - ρ(s) for odd ones."""
    return (rank + rho(s)) % world if rank % 2 == 0 else (rank - rho(s)) % world


class SwingBlocks:
    """``blocks[r][s]``: the range [lo, hi) of block positions rank r keeps after step s of
    the reduce-scatter (:func:`swing_blocks`); ``starts[s, r]`` its lo, hi = lo + p / 2^(s+1)."""

    def __init__(self, starts: np.ndarray):
        self.starts = starts
        self.world = starts.shape[1] if starts.ndim == 2 else 1

    def __len__(self) -> int:
        return self.world

    def __getitem__(self, rank: int) -> Tuple[Tuple[int, int], ...]:
        if not 0 <= rank < self.world:
            raise IndexError(rank)
        return tuple((int(lo), int(lo) + (self.world >> (s + 1))) for s, lo in enumerate(self.starts[:, rank]))

    def __iter__(self):
        return (self[rank] for rank in range(self.world))


@functools.lru_cache(maxsize=8)
def swing_blocks(world: int) -> SwingBlocks:
    """For a power-of-two world: ``blocks[r][s]`` is the range [lo, hi) of block positions
    that rank r keeps after step s of the reduce-scatter, i.e. the blocks of the ranks it
    reaches over steps s+1 .. lg p - 1 (the last step leaves it one block). Positions are
    given depth-first: the set a step splits is cut into the half of its smallest member,
    then the other half (:func:`nested_blocks` on Swing's pairs)."""
    ranks = np.arange(world, dtype=np.int64)
    even = ranks % 2 == 0
    return nested_blocks(tuple(np.where(even, ranks + rho(s), ranks - rho(s)) % world
                               for s in range(world.bit_length() - 1)), "swing")


def nested_blocks(partners: Sequence[np.ndarray], name: str) -> SwingBlocks:
    """The block ranges of a reduce-scatter whose step s pairs rank r with ``partners[s][r]``
    (a perfect matching of a power-of-two world per step, lg p steps), as :func:`swing_blocks`
    describes them.

    Computed for all ranks at once in O(p lg p) array operations (a million ranks in about a
    second): the smallest member of the set rank r reaches over steps s+1 .. is the smaller of
    the smallest members its own and its step-(s+1) partner's sets reach over steps s+2 ..;
    rank r's half at step s is the first one iff its set's smallest member is its parent
    set's. Checked as built: every step pairs each rank with one in the other half of the
    same parent set, and the sets halve (AssertionError naming ``name`` otherwise)."""
    steps = len(partners)
    world = 1 << steps
    ranks = np.arange(world, dtype=np.int64)
    smallest = [ranks]                       # smallest[i]: over steps k - i .. (k = steps)
    for s in range(steps - 1, 0, -1):
        smallest.append(np.minimum(smallest[-1], smallest[-1][partners[s]]))
    smallest.reverse()                       # smallest[s]: the set reached over steps s+1 ..
    starts = np.zeros((steps, world), dtype=np.int64)
    parent, lo = np.zeros(world, dtype=np.int64), np.zeros(world, dtype=np.int64)
    for s in range(steps):
        peer = partners[s]
        lo = lo + np.where(smallest[s] == parent, 0, world >> (s + 1))
        sizes = np.bincount(smallest[s], minlength=world)
        sizes = sizes[sizes > 0]
        if np.any(peer[peer] != ranks) or np.any(parent[peer] != parent) or np.any(lo[peer] == lo) \
                or np.any(sizes != world >> (s + 1)):
            raise AssertionError(f"{name}: step {s} does not halve the sets of step {s - 1} at world {world}")
        starts[s], parent = lo, smallest[s]
    return SwingBlocks(starts)


def even_odd_rotation(world: int, layout: Layout):
    """``symmetry`` of the Swing pairs (period 2): on a power-of-two world, even rank r's
    partners are rank 0's moved by r, odd rank r's are rank 1's moved by r - 1 (ρ(s) is added
    by the even, subtracted by the odd ranks), and every message has the same size as its
    representative's."""
    return 2 if world >= 2 and world & (world - 1) == 0 else None


def even_odd_rotation_when_even(world: int, layout: Layout):
    """:func:`even_odd_rotation` where the pof2 blocks are equal (``numel`` a multiple of the
    world), as the butterfly's messages then are."""
    return even_odd_rotation(world, layout) if layout.numel % world == 0 else None


@register("all_reduce", "swing_latency", cost=_recursive_doubling_cost, symmetry=even_odd_rotation, preference=10)
def all_reduce_swing_latency(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Swing, latency-optimal: lg p steps, at each of which a rank exchanges its whole vector
    with its Swing partner (rank ± ρ(s), module docstring) and reduces it in. The steps run
    in the order s = lg p - 1 .. 0, far partner first: then the ranks combined so far are
    the set reached over the remaining steps, and these sets nest, so partners reduce the
    same two operands (commutative ops) and every rank ends with the same bits. (In the
    paper's order, s = 0 first, they do not nest from p = 8 on: float sums would differ
    across ranks.) Same pairs, same cost. Non-powers of two fold first (MPICH).

    Cost: lg p (α + nβ + nγ), plus 2α + 2nβ + nγ when p is not a power of two.
    """
    pof2 = largest_pof2(world)
    return whole_vector_exchanges(rank, world, layout, [lambda me, s=s: swing_peer(me, s, pof2)
                                                        for s in reversed(range(pof2.bit_length() - 1))])


def butterfly(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """The Swing / Bine butterfly all-reduce (see :func:`all_reduce_swing_bandwidth`): one
    part, the whole vector, on Swing's pairs (:func:`_reduce_scatter_all_gather`)."""
    pof2 = largest_pof2(world)
    whole = Buf("data", 0, layout.numel)
    return folded(rank, world, layout.numel, lambda me: _reduce_scatter_all_gather(
        me, world, [(whole, [swing_peer(me, s, pof2) for s in range(pof2.bit_length() - 1)], swing_blocks(pof2))]))


@register("all_reduce", "swing_bandwidth", cost=_rabenseifner_cost, symmetry=even_odd_rotation_when_even, preference=11)
def all_reduce_swing_bandwidth(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Swing, bandwidth-optimal: a reduce-scatter then an all-gather on Swing's pairs. The
    vector is cut into pof2 blocks numbered depth-first along the nested reach sets
    (:func:`swing_blocks`). Reduce-scatter: at step s each rank sends its partner the
    blocks the partner reaches from then on, keeps those it reaches itself and reduces
    the partner's copy of them in; after lg p steps it owns one block, fully reduced (each
    block is reduced once, by one chain, so the result is bitwise identical everywhere).
    All-gather: the same pairs in reverse order swap what they own. Non-powers of two fold
    first (MPICH).

    Cost: 2 lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not a power of
    two (Rabenseifner's).
    """
    return butterfly(rank, world, layout)


# -- Swing on a torus: one Swing per dimension and direction at once (the paper's Section 4) --
def swing_grid(world: int, given: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
    """The torus Swing runs on for a power-of-two ``world`` (:func:`~.vocabulary.grid_of`):
    ``given`` (``layout[GRID]``) when its dimensions are powers of two, else the 2-D grid of
    torus2d (X × Y, X·Y = p, on a power of two Y = 2^⌊lg p / 2⌋: rows of X consecutive ranks)."""
    return grid_of(world, given, lambda dims: all(d & (d - 1) == 0 for d in dims))


def grid_steps(dims: Sequence[int], start: int) -> Tuple[Tuple[int, int], ...]:
    """``(dimension, step within it)`` of each of the lg p steps of the Swing that starts on
    dimension ``start``: the dimensions taken in turn (start, start + 1, ... mod D), one step
    each, skipping those whose lg d_i steps are done (libswing's ``compute_step_info``)."""
    done = [0] * len(dims)
    left = [d.bit_length() - 1 for d in dims]
    out, dim = [], start % len(dims)
    for _ in range(sum(left)):
        while done[dim] >= left[dim]:
            dim = (dim + 1) % len(dims)
        out.append((dim, done[dim]))
        done[dim] += 1
        dim = (dim + 1) % len(dims)
    return tuple(out)


def grid_peers(ranks, dims: Sequence[int], dim: int, k: int, mirrored: bool):
    """The partners of ``ranks`` (an int or an array) at a step on ``dim`` that is the k-th
    on it: the coordinate on ``dim`` moves by ρ(k), + from an even coordinate and - from an
    odd one (the other way round when ``mirrored``), mod d_dim; the others stay."""
    stride = math.prod(dims[:dim])
    coord = (ranks // stride) % dims[dim]
    sign = 1 - 2 * (coord % 2)
    if mirrored:
        sign = -sign
    return ranks + ((coord + sign * rho(k)) % dims[dim] - coord) * stride


@functools.lru_cache(maxsize=16)
def grid_plan(dims: Tuple[int, ...]):
    """Per sub-collective c = 0 .. 2D - 1 (D = len(dims)): its steps (:func:`grid_steps`
    from dimension c mod D), whether it is mirrored (c >= D) and its blocks
    (:func:`nested_blocks` on its pairs)."""
    world = math.prod(dims)
    ranks = np.arange(world, dtype=np.int64)
    subs = []
    for c in range(2 * len(dims)):
        steps, mirrored = grid_steps(dims, c), c >= len(dims)
        partners = tuple(grid_peers(ranks, dims, d, k, mirrored) for d, k in steps)
        subs.append((steps, mirrored, nested_blocks(partners, f"Swing {c} on the {dims} torus")))
    return tuple(subs)


def _in_parts(base: Cost, world: int) -> Cost:
    """``base``, a butterfly's cost with one message per step (and its fold), with each step's
    message cut into 2D, one per part (D: the dimensions of the default grid,
    :func:`swing_grid`), all through the one port of the flat machine."""
    pof2 = largest_pof2(world)
    parts = 2 * len(swing_grid(pof2)) if pof2 > 1 else 1
    folds = 2 if pof2 < world else 0
    return Cost((base.alpha - folds) * parts + folds, base.beta, base.gamma)


def _swing_torus_bandwidth_cost(world: int, nbytes: int) -> Cost:
    return _in_parts(_rabenseifner_cost(world, nbytes), world)


def _swing_torus_latency_cost(world: int, nbytes: int) -> Cost:
    return _in_parts(_recursive_doubling_cost(world, nbytes), world)


def _grid_rotation(world: int, layout: Layout, per_part: int):
    """Moving a rank by two along the last dimension of the grid (a rotation by 2·p / d_last
    ranks) keeps the parity of every coordinate, so its pairs are its representative's moved
    alike: the period, on a power-of-two world whose 2D parts hold ``per_part`` equal pieces
    each (None otherwise)."""
    if world < 2 or world & (world - 1):
        return None
    dims = swing_grid(world, layout.get(GRID))
    if layout.numel % (2 * len(dims) * per_part):
        return None
    return 2 * world // dims[-1]


def grid_rotation(world: int, layout: Layout):
    """``symmetry`` of swing_torus_bandwidth: :func:`_grid_rotation` where every part's pof2
    blocks are equal."""
    return _grid_rotation(world, layout, world)


def grid_rotation_parts(world: int, layout: Layout):
    """``symmetry`` of swing_torus_latency: :func:`_grid_rotation` where the 2D parts are equal."""
    return _grid_rotation(world, layout, 1)


@register("all_reduce", "swing_torus_bandwidth", cost=_swing_torus_bandwidth_cost, symmetry=grid_rotation, preference=12)
@needs_grid
def all_reduce_swing_torus_bandwidth(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Swing on a D-dimensional torus, as the paper runs it on every port (De Sensi et al.
    NSDI '24, Section 4; libswing's multi-port form): the vector is cut into 2D parts and 2D
    bandwidth-optimal Swings run at once, one per part; Swing c starts on dimension c mod D
    and takes the dimensions in turn (a dimension whose steps are done is skipped), its step
    on a dimension moving the coordinate there by ρ(k) (k: the step's rank on that
    dimension), + from an even coordinate and - from an odd one; Swings c >= D are the
    mirrored ones (the signs swapped). So at every step each rank's 2D messages leave on 2D
    different links, one per direction of each dimension. Each Swing is a reduce-scatter then an all-gather over its part's pof2
    blocks (:func:`nested_blocks`), so every block is reduced once, along one chain:
    bitwise identical on every rank.

    The torus is ``layout[GRID]`` (the dimensions of the group's or simulator's machine when
    it is a torus or a mesh of one host per rank, placed linearly, with dimensions powers of
    two), else the 2-D grid of torus2d (:func:`swing_grid`). A world that is not a power of
    two folds first (MPICH), the folded ranks on the grid. ``machine.ports`` of 2D lets the
    2D Swings' messages of a step go at once; on one port they queue.

    Cost (one port): 4D lg p α + 2(p-1)/p·nβ + (p-1)/p·nγ, plus 2α + 2nβ + nγ when p is not
    a power of two.
    """
    return _on_the_grid(rank, world, layout, _reduce_scatter_all_gather)


def _reduce_scatter_all_gather(me: int, world: int, swings) -> Iterator[Step]:
    """The bandwidth form's steps of folded rank ``me``: each Swing's reduce-scatter over its
    part's pof2 blocks (keeping the blocks of the ranks it still reaches), then its all-gather
    on the same pairs in reverse (swapping what they own). ``swings[c]``: Swing c's part of
    the data, its partners by step (folded ranks) and its blocks."""
    pof2 = largest_pof2(world)
    mine = [(chunks("data", part.numel, pof2, part.start), partners, blocks, part.start)
            for part, partners, blocks in swings]
    count = len(swings[0][1])
    for s in range(count):                      # reduce-scatter
        comms, local = [], []
        for part_chunks, partners, blocks, start in mine:
            q = partners[s]
            keep, give = span(part_chunks, *blocks[me][s]), span(part_chunks, *blocks[q][s])
            recv_buf = Buf("scratch", start, start + keep.numel)
            comms += sendrecv(real_rank(q, world), give, real_rank(q, world), recv_buf)
            local.append(reduce(keep, recv_buf))
        yield step(comms, local)
    for s in reversed(range(count)):            # all-gather, the same pairs in reverse
        comms = []
        for part_chunks, partners, blocks, _ in mine:
            q = partners[s]
            comms += sendrecv(real_rank(q, world), span(part_chunks, *blocks[me][s]),
                              real_rank(q, world), span(part_chunks, *blocks[q][s]))
        yield step(comms)


def _on_the_grid(rank: int, world: int, layout: Layout, body) -> Iterator[Step]:
    """``body(me, world, swings)``'s steps on the folded ranks' grid (:func:`swing_grid`),
    folded (:func:`~.fold.folded`): ``swings[c]`` is Swing c's part of the data, its partners
    by step (folded ranks) and its blocks (:func:`grid_plan`)."""
    pof2 = largest_pof2(world)

    def on_the_grid(me: int) -> Iterator[Step]:
        if pof2 == 1:
            return
        dims = swing_grid(pof2, layout.get(GRID))
        subs = grid_plan(dims)
        swings = [(part, [int(grid_peers(me, dims, d, k, mirrored)) for d, k in steps], blocks)
                  for part, (steps, mirrored, blocks) in zip(chunks("data", layout.numel, len(subs)), subs)]
        yield from body(me, world, swings)
    return folded(rank, world, layout.numel, on_the_grid)


@register("all_reduce", "swing_torus_latency", cost=_swing_torus_latency_cost, symmetry=grid_rotation_parts, preference=13)
@needs_grid
def all_reduce_swing_torus_latency(rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Swing's latency-optimal form on a D-dimensional torus, as libswing runs it on every
    port: the vector is cut into 2D parts and, at each of the lg p steps, each part is
    exchanged whole with the partner of its Swing (the pairs of
    :func:`all_reduce_swing_torus_bandwidth`: Swing c starts on dimension c mod D, Swings
    c >= D mirrored) and reduced in, so each rank's 2D messages of a step leave on 2D
    different links. The steps run far partner first (s = lg p - 1 .. 0), as swing_latency's
    do, so that partners reduce the same two operands: the sets each Swing has combined nest
    (checked by :func:`nested_blocks`) and every rank ends with the same bits. Same torus and
    fold as the bandwidth form.

    Cost (one port): lg p (2D α + nβ + nγ), plus 2α + 2nβ + nγ when p is not a power of two.
    """
    return _on_the_grid(rank, world, layout, _whole_parts_far_first)


def _whole_parts_far_first(me: int, world: int, swings) -> Iterator[Step]:
    """The latency form's steps: at each step, far partner first, every part exchanged whole
    with its Swing's partner and reduced in."""
    for s in reversed(range(len(swings[0][1]))):
        comms, local = [], []
        for part, partners, _ in swings:
            peer = real_rank(partners[s], world)
            recv_buf = Buf("scratch", part.start, part.stop)
            comms += sendrecv(peer, part, peer, recv_buf)
            local.append(reduce(part, recv_buf))
        yield step(comms, local)
