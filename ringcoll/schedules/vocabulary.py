"""The schedule vocabulary: what an algorithm yields and what executors run.

Words used everywhere in ringcoll:

- a **buffer** is a flat 1-D tensor known by name. The caller's buffers are given by the
  collective (``"data"`` for in-place collectives; ``"input"``/``"output"`` otherwise); any
  other name (``"scratch"``, ``"scratch1"`` ...) is a scratch buffer that the executor
  allocates with the extent the schedule uses and reuses across calls;
- a **chunk** is a contiguous element range of a buffer, written ``Buf(name, start, stop)``;
- a **block** is the part of a collective's vector that belongs to one rank (block r of
  all_gather's output is rank r's input; reduce_scatter leaves block r on rank r), cut by
  :func:`chunks`; in a ring over a subset of the ranks, a position's block may be several
  chunks (a node's ranks' blocks); a **span** is the one chunk from block lo to block hi;
- a **segment** is the unit a pipeline moves: a chunk or block cut into parts of at most
  ``layout[SEGMENT]`` elements (:func:`segments`, :func:`segmented`);
- a **step** is a set of point-to-point operations (``Send``/``Recv``) that are posted
  together and waited on together, followed by local operations (``Reduce``/``Copy``) that
  run once the step's transfers are complete. Sends of a step never read what the same step's
  receives write.

Messages between one (source, destination) pair match in the order they are posted, as
gloo and NCCL match them. An algorithm is a pure function ``(rank, world, layout) ->
Iterable[Step]`` that never touches torch.distributed: executors run it on a process group
(:mod:`ringcoll.runtime.executor`) or on all ranks at once (:mod:`ringcoll.sim.engine`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable, Iterable, Optional, Tuple


@dataclass(frozen=True, slots=True)
class Buf:
    """Elements ``[start, stop)`` of the buffer called ``name``."""

    name: str
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    def sub(self, start: int, stop: int) -> "Buf":
        """Elements ``[start, stop)`` of this chunk, relative to its start."""
        return Buf(self.name, self.start + start, self.start + stop)

    def __repr__(self) -> str:
        return f"{self.name}[{self.start}:{self.stop}]"


@dataclass(frozen=True, slots=True)
class _Transfer:
    """One message of a step: ``buf`` to or from ``peer``. A Send and a Recv of the same peer
    and chunk are different items (dataclass equality compares the class too)."""
    peer: int
    buf: Buf


class Send(_Transfer):
    __slots__ = ()


class Recv(_Transfer):
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Reduce:
    """``dst = dst (op) srcs[0] (op) srcs[1] ...``; with ``out``, the result is also copied there."""

    dst: Buf
    srcs: Tuple[Buf, ...]
    out: Optional[Buf] = None


@dataclass(frozen=True, slots=True)
class Copy:
    dst: Buf
    src: Buf


@dataclass(frozen=True, slots=True)
class Step:
    comms: Tuple[Send | Recv, ...] = ()
    local: Tuple[Reduce | Copy, ...] = ()


class Copies(Sequence):
    """A step's local operations when every one is a :class:`Copy`, built on access (a
    subclass says how, in ``__iter__`` and ``__len__``): a step that moves O(world) blocks
    would otherwise build O(world) objects per rank that the simulator's clock never reads
    (it reads only reductions, and a step of copies reduces nothing). Compares equal to the
    tuple of its copies, as :class:`Step`'s ``local`` tuples do."""

    __slots__ = ()

    def __getitem__(self, i):
        return tuple(self)[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self)!r})"


def step(comms: Iterable[Send | Recv] = (), local: Iterable[Reduce | Copy] = ()) -> Step:
    """A step without the empty parts: transfers and local work on zero elements are dropped
    on both sides alike (a chunk's extent is a function of the layout, which every rank shares)."""
    return Step(tuple([c for c in comms if c.buf.stop > c.buf.start]),
                tuple([op for op in local if op.dst.stop > op.dst.start]) if local else ())


def sendrecv(send_peer: int, send_buf: Buf, recv_peer: int, recv_buf: Buf) -> Tuple[Send, Recv]:
    """The exchange at the heart of rings and butterflies, posted together so it cannot deadlock."""
    return Send(send_peer, send_buf), Recv(recv_peer, recv_buf)


def reduce(dst: Buf, *srcs: Buf, out: Optional[Buf] = None) -> Reduce:
    return Reduce(dst, tuple(srcs), out)


def span(blocks: Sequence[Buf], lo: int, hi: int) -> Buf:
    """Blocks ``[lo, hi)`` of one buffer as one chunk (empty when ``lo == hi``)."""
    if lo >= hi:
        return Buf(blocks[0].name, blocks[0].start, blocks[0].start)
    return Buf(blocks[lo].name, blocks[lo].start, blocks[hi - 1].stop)


def ceil_log2(n: int) -> int:
    """⌈log2 n⌉ for n >= 1 (0 for n = 1): the rounds of a doubling or halving over n ranks."""
    return (n - 1).bit_length()


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """Cumulative bounds of ``parts`` near-equal chunks of ``numel`` elements: chunk ``i`` is
    ``[bounds[i], bounds[i + 1])``; the first ``numel % parts`` chunks hold one element more,
    so any numel works, 0 and numel < parts included (trailing chunks are then empty)."""
    base, extra = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


class Chunks(Sequence):
    """``parts`` near-equal chunks of ``name[offset : offset + numel]``, computed on access (a
    schedule indexes the chunks of every rank, so a list of them per rank would be O(world²)
    objects in a simulated world): chunk ``i`` starts at ``i·base + min(i, extra)``."""

    __slots__ = ("name", "offset", "parts", "base", "extra")

    def __init__(self, name: str, numel: int, parts: int, offset: int = 0):
        self.name, self.offset, self.parts = name, offset, parts
        self.base, self.extra = divmod(numel, parts)

    def __len__(self) -> int:
        return self.parts

    def __getitem__(self, i):
        if type(i) is not int:
            if isinstance(i, slice):
                return [self[j] for j in range(*i.indices(self.parts))]
            i = i.__index__()
        if i < 0:
            i += self.parts
        if not 0 <= i < self.parts:
            raise IndexError(f"chunk {i} of {self.parts}")
        base, extra = self.base, self.extra
        if i < extra:
            start = self.offset + i * (base + 1)
            return Buf(self.name, start, start + base + 1)
        start = self.offset + i * base + extra
        return Buf(self.name, start, start + base)

    def __iter__(self):
        name, base, extra, start = self.name, self.base, self.extra, self.offset
        for i in range(self.parts):
            stop = start + base + (1 if i < extra else 0)
            yield Buf(name, start, stop)
            start = stop

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Chunks({list(self)!r})"


def chunks(name: str, numel: int, parts: int, offset: int = 0) -> Chunks:
    """``parts`` near-equal chunks of ``name[offset : offset + numel]`` (a lazy sequence of
    Bufs, see :class:`Chunks`)."""
    return Chunks(name, numel, parts, offset)


@functools.lru_cache(maxsize=16)
def chunk_table(name: str, numel: int, parts: int, offset: int = 0) -> Tuple[Buf, ...]:
    """The Bufs of :func:`chunks` as one tuple, built once per arguments: every rank of a
    simulated world that walks all the chunks shares this table (O(world) objects for the
    world), where building them on access costs each rank a Buf per step."""
    return tuple(Chunks(name, numel, parts, offset))


def segments(chunk: Buf, segment_numel: int) -> Sequence[Buf]:
    """``chunk`` cut into segments of at most ``segment_numel`` elements (at least one segment)."""
    if chunk.numel <= segment_numel or segment_numel <= 0:
        return [chunk]
    count = -(-chunk.numel // segment_numel)
    return chunks(chunk.name, chunk.numel, count, chunk.start)


class _Segmented(Sequence):
    """Each block of ``blocks`` cut into ``count`` chunks, computed on access."""

    __slots__ = ("blocks", "count")

    def __init__(self, blocks: Sequence[Buf], count: int):
        self.blocks, self.count = blocks, count

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        b = self.blocks[i]
        return chunks(b.name, b.numel, self.count, b.start)


def segmented(blocks: Sequence[Buf], segment: Optional[int]) -> Sequence[Sequence[Buf]]:
    """Each block cut into the same number of near-equal segments: as many as the largest
    block needs for segments of at most ``segment`` elements (one when ``segment`` is 0 or
    None). A block's segments depend only on the block and the count, so the sender's and
    the receiver's cuts of a block agree."""
    if isinstance(blocks, Chunks):
        largest = blocks[0].numel if len(blocks) else 0      # the first chunks are the largest
    else:
        largest = max((b.numel for b in blocks), default=0)
    count = max(1, -(-largest // segment)) if segment else 1
    return _Segmented(blocks, count)


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


# -- a layout's parameters: one constant each, and nothing else ----------------------------------
#: the root rank of a rooted collective (broadcast, reduce, gather, scatter)
ROOT = "root"

#: the pipelined schedules' segment, in elements (the builders add it from the segment table,
#: :func:`ringcoll.selection.segment_elements`; absent, :data:`DEFAULT_SEGMENT_BYTES`' worth)
SEGMENT = "segment"

#: the node of every rank, by rank (a group's placement, :mod:`ringcoll.runtime.nodes`); the
#: builders add it for schedules marked with :func:`needs_nodes`
NODES = "nodes"

#: whether a collective that has an in-place form runs in place (all_gather's output holds this
#: rank's input at its block)
IN_PLACE = "in_place"

#: all_to_all's blocks: per peer, the chunk of ``"input"`` sent to it and of ``"output"``
#: received from it
SEND_BLOCKS = "send_blocks"
RECV_BLOCKS = "recv_blocks"

#: a layout parameter: whether the executor that runs the schedule carries one message in and
#: one out per rank at a time (True, the default: the simulator's port-limited clock), or posts
#: a step's transfers together and lets them queue (False: the P2P executor sets it, see
#: :meth:`ringcoll.runtime.plan.Plan.steps`). Only the double trees read it: they split each
#: global step by the colours of its messages when it is True (``trees.TreePipeline``), and
#: post a global step as one step when it is False (docs/design.md, Decisions)
ONE_PORT = "one_port"

#: a layout parameter: the torus (or mesh) the ranks are laid out on, its dimensions with
#: dimension 0 varying fastest (rank r at coordinates r % d0, r // d0 % d1 ...), as
#: ``Machine.torus(dims)`` numbers its hosts; the builders add it, from the group's or the
#: simulator's machine, for schedules marked with :func:`needs_grid` (absent: no torus known)
GRID = "grid"

#: every parameter a :class:`Layout` may hold: a name outside it (a misspelt ``"segmnet"``) is
#: an error where the layout is made or read, never a parameter that silently is not there
PARAMETERS = frozenset({ROOT, SEGMENT, NODES, IN_PLACE, SEND_BLOCKS, RECV_BLOCKS, ONE_PORT, GRID})


def _known(name) -> str:
    if name not in PARAMETERS:
        raise ValueError(f"unknown layout parameter {name!r}: expected one of {sorted(PARAMETERS)} "
                         f"(the constants of ringcoll.schedules.vocabulary)")
    return name


class Layout:
    """What a schedule knows about the buffers: the element count of the collective's main
    buffer plus its parameters (:data:`ROOT`, :data:`SEGMENT`, :data:`NODES` ...: the names in
    :data:`PARAMETERS`, any other refused with a ValueError). Two equal layouts give the same
    schedule, so executors may cache it."""

    __slots__ = ("numel", "params", "_key")

    def __init__(self, numel: int, params: Optional[dict] = None):
        self.numel = numel
        self.params = dict(params or {})
        for name in self.params:
            _known(name)
        self._key = (numel, _freeze(self.params))

    def __getitem__(self, key):
        return self.params[_known(key)]

    def get(self, key, default=None):
        return self.params.get(_known(key), default)

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Layout({self.numel}, {self.params})"

    def replace(self, **params) -> "Layout":
        """The same layout with ``params`` set."""
        return Layout(self.numel, {**self.params, **params})


def buffers_of(steps: Sequence[Step]):
    """Every chunk a schedule touches, for extent and scratch sizing."""
    for st in steps:
        for c in st.comms:
            yield c.buf
        for op in st.local:
            if isinstance(op, Reduce):
                yield op.dst
                yield from op.srcs
                if op.out is not None:
                    yield op.out
            else:
                yield op.dst
                yield op.src


def extents(steps: Sequence[Step]) -> dict[str, int]:
    """The number of elements each named buffer must hold for this schedule."""
    need: dict[str, int] = {}
    for buf in buffers_of(steps):
        if buf.stop > need.get(buf.name, 0):
            need[buf.name] = buf.stop
    return need


#: the pipelined schedules' segment where their layout names none (gloo's ring segment). The
#: builders always name one, from the segment table (:func:`ringcoll.selection.segment_bytes`,
#: RINGCOLL_SEGMENT): this serves schedules and cost models called directly
DEFAULT_SEGMENT_BYTES = 1 << 20

#: the node of every rank, by rank (``layout[NODES]``; :mod:`ringcoll.runtime.nodes` agrees it)
Nodes = Tuple[int, ...]


def needs_nodes(schedule: Callable) -> Callable:
    """Mark a schedule as reading ``layout[NODES]`` (the builders then add it)."""
    schedule.needs_nodes = True
    return schedule


def needs_grid(schedule: Callable) -> Callable:
    """Mark a schedule as reading ``layout[GRID]`` where the caller's machine is a torus or a
    mesh of the world's size (the builders then add it)."""
    schedule.needs_grid = True
    return schedule


def torus_grid(world: int) -> Tuple[int, int]:
    """(X, Y) with X·Y = p and Y the largest divisor of p not above √p: rows of X ranks (the
    grid of torus2d, and of the torus schedules where the machine names none)."""
    y = max(d for d in range(1, int(world ** 0.5) + 1) if world % d == 0) if world else 1
    return world // y, y


def grid_of(world: int, given: Optional[Sequence[int]] = None,
            usable: Callable[[Tuple[int, ...]], bool] = lambda dims: True) -> Tuple[int, ...]:
    """The grid a torus schedule runs on: ``given`` (``layout[GRID]``, the machine's torus or
    mesh, dimension 0 fastest) when its product is the world and ``usable(given)``, else the
    X × Y grid of :func:`torus_grid`; dimensions of one rank are dropped (a ring is one
    dimension)."""
    dims = tuple(given) if given is not None and math.prod(given) == world and usable(tuple(given)) \
        else torus_grid(world)
    return tuple(d for d in dims if d > 1)
