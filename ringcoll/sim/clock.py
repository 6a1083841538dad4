"""The simulator's event clock: every rank's steps on a port-limited clock, in named phases.

Sends and receives are matched in posting order per (source, destination) pair, exactly as
gloo and NCCL match them; a step completes when all its transfers are done, then its local
operations run. An unmatched transfer, a size mismatch or a deadlock is an error naming the
rank, the step and the peer.

The machine (:mod:`ringcoll.cost.machine`): each rank has ``machine.ports`` send ports and as many
receive ports. A message of n bytes holds one send port of its sender and one receive port
of its receiver for α + nβ, starting once both ends have posted it and every port it needs
is free. A port serves a step's messages
in the order the step posts them (a message starts no earlier than its sender's previous send
and its receiver's previous receive of that step), so a rank that posts k sends at once pays
k(α + nβ), and tiny asymmetries between ranks cannot reorder service. On a machine with a
network (:mod:`ringcoll.cost.network`; a 2-level machine's nodes are one, ``Machine.network_for``)
a message takes its route's α and β (``Network.price``) and also holds every link of its route:
for its wire time, each link lane taking it like a port in the earliest gap that fits, or, a
link held per message (a NIC), for the whole message like a port. A step ends when its last transfer
does, plus γ per byte its local operations reduce; the rank then posts its next step.

**Window** (``machine.window``, 1 by default): as the P2P executor
(:meth:`ringcoll.runtime.executor.P2PExecutor.execute`, ``RINGCOLL_WINDOW``) a rank keeps up to
``window`` steps in flight. Phase by phase: the executor's ``reach`` (which steps are posted
once it waits on step i) is the clock's **post** (:meth:`Clock.ahead`, by the same test,
:func:`ringcoll.runtime.blocks.posts_early`: j - i < window and step j touches nothing steps i
.. j - 1 still read or write); its ``transport.wait`` on step i then ``run_resolved`` of its
local operations is the clock's **wake**: the current step ends at its last transfer's end (or
when it became current, if later) plus its reductions, and steps end in order; a step posted
early whose transfers all end first waits to become current. Its transfers' positions run on
across the steps in flight, so a port serves a later step's messages after an earlier one's.
Window 1 is the clock as it was, bit for bit (``experiments/clock_regression.py``).

**LogGP** (``machine.o``, ``g``, ``L``; 0 by default): a message takes its sender's CPU for o
(one lane per rank, serialised with its other messages' overheads), then its ports (and links)
for α + g + nβ from o after its start, then arrives L after leaving them and takes its
receiver's CPU for o: it ends 2o + α + g + nβ + L after it starts, its ports free after o +
α + g + nβ, so the next message on them overlaps its L (and, with a window, the next step's
messages overlap it too) (:meth:`Clock.take_loggp`).

It is a discrete-event simulation ordered by time: its result does not depend on the order
in which ranks are listed, and a run without data streams each rank's schedule one step at
a time, so its memory is O(world), not O(steps).

The phases (as NCCL's enqueue.cc walks a call through named phases), each a method of
:class:`Clock` over one named state (:class:`Ranks`, :class:`Matching`, :class:`Routes`,
:class:`Due`; ports and link lanes are lists of busy intervals):

- **post** (:meth:`Clock.post`): a rank due now finishes its step (its local operations, its
  statistics) and posts its next one, each transfer to match.
- **match** (:meth:`Clock.match`): a transfer meets the oldest unmatched other end posted for
  its (source, destination) pair, or waits for it.
- **release** (:meth:`Clock.release`): a matched message goes to book once it heads both its
  sender's sends and its receiver's receives not yet booked (a port serves a step's messages
  in posting order), then the held messages that this lets through.
- **book** (:meth:`Clock.book`): the message takes its ports (and its route's link lanes)
  from the earliest time all are free for it (:func:`slot`, :func:`hold`); its statistics.
- **wake** (:meth:`Clock.settle`, :meth:`Clock.wake`): a step whose last transfer is booked
  ends with it, plus γ per byte it reduces: its rank is due then.
- **report** (:meth:`Clock.report`): every rank's statistics, or the deadlock report naming
  each stuck rank, its step and what it waits on.

:meth:`Clock.run` is the loop over due times, earliest first: post the ranks due then, in
the order they became due, then release what they matched in posting order (send position,
receive position, sender). Its compiled twin for one-step exchanges on a torus,
:mod:`ringcoll.sim._batch_clock`, states its correspondence phase by phase.
"""
from __future__ import annotations

import bisect
import functools
import gc
import heapq
import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..cost.machine import Machine
from ..runtime.blocks import posts_early
from ..schedules.vocabulary import Copies, Recv, Reduce, Send

__all__ = ["Clock", "MirroredLinks", "NetworkStats", "RankStats", "ScheduleError", "SimStats", "Timeline",
           "reduced_bytes", "run_schedules"]


class ScheduleError(RuntimeError):
    """A schedule that cannot run: unmatched or mismatched transfers, or a deadlock."""


@dataclass
class RankStats:
    steps: int = 0              # this rank's own steps
    messages: int = 0           # messages it sent
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_reduced: int = 0
    time: float = 0.0           # clock when this rank finished, seconds


@dataclass
class Timeline:
    """What happened when: ``messages`` rows ``(src, dst, nbytes, start, end, src_step,
    dst_step)`` and ``local`` rows ``(rank, step, start, end, bytes_reduced)``, seconds."""

    world: int
    messages: List[Tuple[int, int, int, float, float, int, int]] = field(default_factory=list)
    local: List[Tuple[int, int, float, float, int]] = field(default_factory=list)
    ports: List[Tuple[int, int]] = field(default_factory=list)   # (send port, receive port) per message

    def critical_path(self) -> List[Tuple]:
        """The chain of events that ends last, traced back to time 0: from the event that
        ends last, repeatedly the event on one of its ranks that ended last no later than it
        started (a rank's own reduction before a message of its next step wins a tie). Rows
        ``("message", src, dst, nbytes, start, end, waited)`` and ``("local", rank, step,
        bytes reduced, start, end, waited)``, earliest first; ``waited`` is the gap before
        the event (a port or link busy with messages off the chain)."""
        by_rank: Dict[int, List[Tuple[float, int, int]]] = {}
        events = []
        for src, dst, nbytes, start, end, _, _ in self.messages:
            events.append(("message", src, dst, nbytes, start, end))
            for r in (src, dst):
                by_rank.setdefault(r, []).append((end, 0, len(events) - 1))
        for rank, step, start, end, reduced in self.local:
            events.append(("local", rank, step, reduced, start, end))
            by_rank.setdefault(rank, []).append((end, 1, len(events) - 1))
        if not events:
            return []
        for rows in by_rank.values():
            rows.sort()
        last = max(range(len(events)), key=lambda i: (events[i][5], events[i][0] == "local"))
        chain, seen = [], set()
        current = last
        while current is not None and current not in seen:
            seen.add(current)
            event = events[current]
            start = event[4]
            ranks = (event[1], event[2]) if event[0] == "message" else (event[1],)
            best = None
            limit = start + 1e-12 * max(start, 1e-9)
            for r in ranks:
                rows = by_rank[r]
                i = bisect.bisect_right(rows, (limit, 2, len(events))) - 1
                while i >= 0 and rows[i][2] in seen:
                    i -= 1
                if i >= 0 and (best is None or rows[i][:2] > best[:2]):
                    best = rows[i]
            before = best[0] if best is not None else 0.0
            chain.append(event + (max(0.0, start - before),))
            current = best[2] if best is not None and start > 0 else None
        chain.reverse()
        return chain


def _over_ranks(combine, name: str) -> property:
    """A statistic of the whole run: ``combine`` (sum or max) of every rank's ``name`` (0 for
    no ranks)."""
    def value(stats) -> int:
        values = [getattr(r, name) for r in stats.ranks]
        return combine(values) if values else 0
    return property(value, doc=f"{combine.__name__} over the ranks of RankStats.{name}")


@dataclass
class SimStats:
    ranks: List[RankStats] = field(default_factory=list)
    critical_path: int = 0      # the longest chain of dependent steps
    link_bytes: Dict[int, int] = field(default_factory=dict, repr=False)   # src * world + dst -> bytes
    timeline: Optional[Timeline] = field(default=None, repr=False)
    mirrored: Optional[str] = None      # "rotation" | "xor": representatives' run stood for every rank
    crossing: int = 0           # messages between nodes (hierarchical) or a network's groups
    network: Optional["NetworkStats"] = field(default=None, repr=False)  # per-link load on a network
    compiled: bool = field(default=False, compare=False)  # every rank ran on the compiled one-step clock (sim.batch)

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def steps(self) -> int:
        """The critical path: the longest chain of steps each waiting on the one before it
        (on its own rank or on the peer it exchanges with). Per-rank counts: ``rank_steps``."""
        return self.critical_path

    @property
    def rank_steps(self) -> List[int]:
        return [r.steps for r in self.ranks]

    messages = _over_ranks(sum, "messages")
    bytes_sent = _over_ranks(sum, "bytes_sent")
    max_bytes_sent = _over_ranks(max, "bytes_sent")
    max_bytes_received = _over_ranks(max, "bytes_received")
    bytes_reduced = _over_ranks(sum, "bytes_reduced")
    max_bytes_reduced = _over_ranks(max, "bytes_reduced")

    @property
    def links(self) -> Dict[Tuple[int, int], int]:
        """Bytes carried per directed link ``(src, dst)``."""
        world = max(1, self.world)
        return {divmod(key, world): nbytes for key, nbytes in self.link_bytes.items()}

    @property
    def time(self) -> float:
        return max((r.time for r in self.ranks), default=0.0)


@dataclass
class NetworkStats:
    """Traffic on a network machine's links (:mod:`ringcoll.cost.network`): ``link_bytes[i]`` and
    ``link_busy[i]`` (seconds the link carried data) for link ``network.links[i]``,
    ``hop_bytes`` = Σ bytes × hops over messages, ``hosts[r]`` rank r's host."""

    network: object
    hosts: List[int]
    link_bytes: List[int]
    link_busy: List[float]
    hop_bytes: int = 0

    @property
    def max_link_bytes(self) -> int:
        return max(self.link_bytes, default=0)

    @property
    def mean_link_bytes(self) -> float:
        """Bytes per link, over every link of the network (idle ones included)."""
        return sum(self.link_bytes) / len(self.link_bytes) if self.link_bytes else 0.0

    @property
    def used_links(self) -> int:
        return sum(1 for b in self.link_bytes if b)

    def bottlenecks(self, count: int = 5) -> List[Tuple[int, int, int, str, int, float]]:
        """The ``count`` busiest links, busiest first: ``(link id, src node, dst node, level,
        bytes, busy seconds)`` (ties: the lower id first)."""
        order = sorted(range(len(self.link_bytes)), key=lambda i: (-self.link_busy[i], i))[:count]
        links = self.network.links
        return [(i, links[i].src, links[i].dst, links[i].level, self.link_bytes[i], self.link_busy[i])
                for i in order if self.link_bytes[i]]

    def by_level(self) -> Dict[str, Tuple[int, int]]:
        """Per link level ("x", "up1", "global" ...): (bytes, most bytes on one link)."""
        out: Dict[str, Tuple[int, int]] = {}
        for link, nbytes in zip(self.network.links, self.link_bytes):
            total, most = out.get(link.level, (0, 0))
            out[link.level] = (total + nbytes, max(most, nbytes))
        return out


def reduced_bytes(local, itemsize: int) -> int:
    """Bytes a step's local operations reduce (what ringcoll.runtime.local.run_local returns);
    :class:`~ringcoll.schedules.vocabulary.Copies` reduce nothing and are never built here."""
    if isinstance(local, Copies):
        return 0
    return sum(op.dst.numel * len(op.srcs) for op in local if isinstance(op, Reduce)) * itemsize


_INF = float("inf")


class _Contended(Exception):
    """A mirrored run on a network met a link that would make a message wait: by-rank
    arbitration breaks the symmetry, so every rank must run."""


def _fit(busy, t: float, duration: float) -> float:
    """The earliest time >= t from which a port or lane busy over the sorted, disjoint
    intervals ``busy`` is free for ``duration``."""
    i = max(0, bisect.bisect_right(busy, (t, _INF)) - 1)
    while i < len(busy):
        b_start, b_end = busy[i]
        i += 1
        if b_end <= t:
            continue
        if b_start >= t + duration:
            break
        t = b_end
    return t


def _without_gc(run):
    """Run with Python's cyclic collector paused: the clock allocates millions of short-lived
    steps, freed by reference counting, and the collector's passes over a world of live
    generators cost as much again at thousands of ranks."""
    @functools.wraps(run)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return run(*args, **kwargs)
        gc.disable()
        try:
            return run(*args, **kwargs)
        finally:
            gc.enable()
    return paused


def _match(waiting: Dict[int, deque], pending: Dict[int, deque], key: int, entry: tuple):
    """The oldest transfer queued under ``key`` in ``waiting`` (the other end of ``entry``,
    taken off the queue), or None after queuing ``entry`` under ``key`` in ``pending``: the
    messages of one (source, destination) pair match in the order they are posted, a send
    with the receive it meets and a receive with the send, alike."""
    queue = waiting.get(key)
    if queue:
        other = queue.popleft()
        if not queue:
            del waiting[key]
        return other
    queue = pending.get(key)
    if queue is None:
        pending[key] = queue = deque()
    queue.append(entry)
    return None


def slot(tables, start: float, durations, offsets=None) -> Tuple[float, list]:
    """The earliest time >= start at which one port (lane) of each table is free for its
    duration (``durations[i]`` for ``tables[i]``; from ``offsets[i]`` after that time where
    given: a LogGP message's ports after its sender's overhead, its receiver's CPU after
    its arrival), and the ports that are; a port's busy intervals are sorted and a message
    may take a gap before a later-booked one (a port never idles while a ready message
    could go)."""
    # the least time from which every table has a lane free for its duration: each table's
    # earliest fit from t on (over its lanes; shifted by its offset, which keeps it so) never
    # decreases as t grows, so moving t to the latest of them until none moves it reaches the
    # least common one; each table's lane is its first one that fits there (the first such
    # choice in lane order)
    if offsets is None:
        offsets = itertools.repeat(0.0)    # every table held from the start: t + 0.0 is t, bit for bit
    t = start
    while True:
        latest, chosen = t, []
        for table, duration, offset in zip(tables, durations, offsets):
            lane, fits = None, _INF
            at = t + offset
            for busy in table:
                fit = _fit(busy, at, duration)
                fit = t if fit == at else max(t, fit - offset)
                if fit < fits:
                    lane, fits = busy, fit
                    if fit == t:
                        break           # no lane fits earlier than t
            chosen.append(lane)
            if fits > latest:
                latest = fits
        if latest == t:
            return t, chosen
        t = latest


def hold(busy: list, now: float, start: float, stop: float, merge: bool) -> None:
    """Book ``(start, stop)`` on a port or lane free then: its intervals that end by ``now``
    dropped first (no later booking starts before now), then, with ``merge``, joined with
    a touching neighbour (where every duration is positive no message fits a gap of zero),
    else a plain sorted insert."""
    if busy and busy[-1][1] <= now:
        busy.clear()                    # past intervals can never matter again
    else:
        while busy and busy[0][1] <= now:
            busy.pop(0)
    if not merge:
        bisect.insort(busy, (start, stop))
        return
    i = bisect.bisect_left(busy, (start, stop))
    if i < len(busy) and busy[i][0] == stop:
        stop = busy[i][1]
        if i and busy[i - 1][1] == start:
            busy[i - 1] = (busy[i - 1][0], stop)
            del busy[i]
        else:
            busy[i] = (start, stop)
    elif i and busy[i - 1][1] == start:
        busy[i - 1] = (busy[i - 1][0], stop)
    else:
        busy.insert(i, (start, stop))


class Posted:
    """A step a rank has posted and not yet finished: its number, the step, its transfers not
    yet booked, when its last booked transfer ends (from when it was posted, or became the
    rank's current step), the bytes it reduces, the longest chain its messages wait on."""

    __slots__ = ("index", "step", "outstanding", "end", "reducing", "depends")

    def __init__(self, index: int, step, outstanding: int, end: float, reducing: int, depends: int):
        self.index, self.step, self.outstanding, self.end = index, step, outstanding, end
        self.reducing, self.depends = reducing, depends


@dataclass(slots=True)
class Ranks:
    """Every rank's place in its schedule, one entry per rank: its steps in flight (posted,
    not finished; the first is its current step, the one it waits on), and the order its
    ports serve them in (the positions of its sends and receives not yet booked, the
    matched messages held back behind an earlier one, the start of its last booked send and
    receive: a message starts no earlier)."""

    steps: list                         # each rank's schedule, an iterator of steps
    lengths: List[Optional[int]]        # its number of steps where known (for reports)
    describe: List[str]
    itemsizes: List[int]
    stats: List[RankStats]
    flight: List[deque]                 # its steps in flight (Posted), the current one first
    index: List[int]                    # the number of its current step
    opened: List[int]                   # steps it has posted
    ahead: list                         # its next step, taken from its schedule and not yet posted (or None)
    positions: List[int]                # transfers it has posted (a window's positions run on across steps)
    post_chain: List[int]               # critical-path length before the current step
    send_order: List[deque]
    recv_order: List[deque]
    held_send: List[Dict[int, tuple]]
    held_recv: List[Dict[int, tuple]]
    send_floor: List[float]
    recv_floor: List[float]

    @classmethod
    def start(cls, schedules: Sequence[Iterable], itemsizes: List[int], describe: List[str]) -> "Ranks":
        world = len(schedules)
        return cls([iter(s) for s in schedules], [len(s) if hasattr(s, "__len__") else None for s in schedules],
                   describe, itemsizes, [RankStats() for _ in range(world)], [deque() for _ in range(world)],
                   [-1] * world, [0] * world, [None] * world, [0] * world, [0] * world,
                   [deque() for _ in range(world)], [deque() for _ in range(world)],
                   [{} for _ in range(world)], [{} for _ in range(world)], [0.0] * world, [0.0] * world)

    def where(self, rank: int) -> str:
        """The rank and its step, for error reports: "<describe>: rank r step s/total"."""
        total = f"/{self.lengths[rank]}" if self.lengths[rank] is not None else ""
        prefix = f"{self.describe[rank]}: " if self.describe[rank] else ""
        return f"{prefix}rank {rank} step {self.index[rank] + 1}{total}"


@dataclass(slots=True)
class Matching:
    """Transfers posted and not yet met, per (source, destination) key, and the messages
    matched since the last release. Keys: ``src * world + dst``; in a mirrored run
    (``mirror``) the representative receive a send stands for (see :func:`run_schedules`)."""

    world: int                          # ranks run
    peers: int                          # ranks a peer may be
    mirror: Optional[str] = None        # None, "rotation" or "xor"
    sends: Dict[int, deque] = field(default_factory=dict)
    recvs: Dict[int, deque] = field(default_factory=dict)
    matched: list = field(default_factory=list)     # (send pos, recv pos, src, dst, send, recv)

    def send_key(self, rank: int, peer: int) -> int:
        if self.mirror is None:
            return rank * self.world + peer
        if self.mirror == "rotation":
            delegate = peer % self.world
            return delegate * self.peers + (rank - peer + delegate) % self.peers
        return peer

    def recv_key(self, rank: int, peer: int) -> int:
        if self.mirror is None:
            return peer * self.world + rank
        return rank * self.peers + peer if self.mirror == "rotation" else peer


@dataclass(slots=True)
class Routes:
    """A network machine's links as the clock uses them (:mod:`ringcoll.cost.network`): each
    link lane's busy intervals (like a port's: for a message's wire time on a wire-held link,
    its whole time on a message-held one, a 2-level machine's NICs), and per-link traffic.
    In a mirrored run each link stands for its translates (``canon``)."""

    net: object
    host: List[int]                     # each rank's host
    group: Optional[List[int]]          # each rank's group (node, fat-tree leaf, dragonfly group) or None
    canon: Optional[List[int]]          # mirrored: each link's representative
    paths: Dict[int, tuple]             # per rank pair, kept on the network across runs
    alpha: float
    beta: float
    peers: int
    lanes: list = field(default_factory=list)
    link_bytes: List[int] = field(default_factory=list)
    link_busy: List[float] = field(default_factory=list)
    hop_bytes: int = 0
    crossing: int = 0                   # messages between groups

    @classmethod
    def on(cls, net, machine: Machine, peers: int, mirror: Optional[Tuple[str, int]], world: int) -> "Routes":
        host = net.hosts_of(peers)
        canon = None
        if mirror is not None:
            if mirror[0] != "rotation":
                raise ValueError("a mirrored run on a network needs a rotation")
            canon = net.representatives(world, peers)
        links = net.links
        paths = net.memo((machine.alpha, machine.beta, peers, None if canon is None else world))
        return cls(net, host, net.groups_of(host), canon, paths, machine.alpha, machine.beta, peers,
                   [[[] for _ in range(link.lanes)] for link in links], [0] * len(links), [0.0] * len(links))

    def path(self, key: int, src: int, peer: int) -> tuple:
        """What the clock needs of the route from rank ``src`` to rank ``peer`` (``key`` =
        src · peers + peer): (α, β of the path, its wire-held links, its message-held links,
        hops, crosses groups, a link met twice), link ids canonical in a mirrored run."""
        found = self.paths.get(key)
        if found is None:
            net, links, canon = self.net, self.net.links, self.canon
            path = net.route(self.host[src], self.host[peer])
            path_alpha, path_beta = net.price(path, self.alpha, self.beta)
            ids = path if canon is None else tuple(canon[i] for i in path)
            wires = tuple(c for i, c in zip(path, ids) if links[i].hold == "wire")
            held = tuple(c for i, c in zip(path, ids) if links[i].hold == "message")
            crosses = self.group is not None and self.group[src] != self.group[peer]
            found = (path_alpha, path_beta, wires, held, len(path), crosses, len(set(ids)) != len(ids))
            if len(self.paths) > 1 << 20:
                self.paths.clear()
            self.paths[key] = found
        return found

    def carry(self, path: tuple, nbytes: int, wire: float, duration: float) -> None:
        """Count a booked message on its route's links."""
        _, _, wires, held, hops, crosses, _ = path
        if wire > 0:
            for i in wires:
                self.link_bytes[i] += nbytes
                self.link_busy[i] += wire
        for i in held:
            self.link_bytes[i] += nbytes
            self.link_busy[i] += duration
        self.hop_bytes += nbytes * hops
        if crosses:
            self.crossing += 1

    def stats(self, mirrored: bool, copies: int) -> NetworkStats:
        if mirrored:
            return NetworkStats(self.net, self.host, [self.link_bytes[c] for c in self.canon],
                                [self.link_busy[c] for c in self.canon], self.hop_bytes * copies)
        return NetworkStats(self.net, self.host, self.link_bytes, self.link_busy, self.hop_bytes)


@dataclass(slots=True)
class Due:
    """The ranks whose step ends at each time, in the order those ends were found (the order
    they post their next steps in), the heap of those times, and the last time served."""

    at: Dict[float, List[int]]
    times: List[float]
    last: float = 0.0

    @classmethod
    def start(cls, world: int) -> "Due":
        at = {0.0: list(range(world))} if world else {}
        return cls(at, list(at))


class Clock:
    """One run of the event clock over every rank's schedule (see the module docstring for
    its phases); :func:`run_schedules` builds one and runs it."""

    __slots__ = ("ranks", "matching", "routes", "due", "send_ports", "recv_ports", "alpha", "beta", "gamma",
                 "ports", "single", "positive", "copy", "local", "timeline", "link_bytes", "world", "peers",
                 "mirror", "o", "g", "L", "loggp", "cpus", "window")

    def __init__(self, schedules: Sequence[Iterable], machine: Machine, itemsizes: List[int],
                 describe: List[str], *, record: bool = False, copy: Optional[Callable] = None,
                 local: Optional[Callable] = None, mirror: Optional[Tuple[str, int]] = None):
        world = len(schedules)
        self.world, self.peers, self.mirror = world, world if mirror is None else mirror[1], mirror
        self.alpha, self.beta, self.gamma, self.ports = machine.alpha, machine.beta, machine.gamma, machine.ports
        self.o, self.g, self.L, self.loggp = machine.o, machine.g, machine.L, machine.is_loggp
        self.window = machine.window
        # LogGP's overhead: each rank's CPU, one lane of busy intervals (None: no overhead)
        self.cpus = [[[]] for _ in range(world)] if self.o else None
        self.copy, self.local = copy, local
        # each port: its busy intervals (start, end), sorted; a table: one rank's ports, or the
        # lanes of a link held per message (a 2-level machine's NICs)
        self.send_ports = [[[] for _ in range(self.ports)] for _ in range(world)]
        self.recv_ports = [[[] for _ in range(self.ports)] for _ in range(world)]
        self.positive = self.alpha + self.g > 0  # every message holds its ports for more than no time
        net = machine.network_for(self.peers)   # a 2-level machine's nodes are a network too
        self.routes = None if net is None else Routes.on(net, machine, self.peers, mirror, world)
        self.single = self.ports == 1 and (net is None or all(
            link.lanes == 1 for link in net.links if link.hold == "message"))
        self.ranks = Ranks.start(schedules, itemsizes, describe)
        self.matching = Matching(world, self.peers, None if mirror is None else mirror[0])
        self.due = Due.start(world)
        self.timeline = Timeline(world) if record else None
        self.link_bytes: Dict[int, int] = {}

    def run(self) -> SimStats:
        """Serve the due times, earliest first, until no rank can move; then report."""
        due, matched = self.due, self.matching.matched
        while True:
            if not due.times:
                # messages of a step waiting on each other's order in a circle (a pathological
                # schedule): the first by sender goes, at the last event's time
                waiting = [e for table in self.ranks.held_send for e in table.values()]
                if not waiting:
                    break
                self.release(min(waiting, key=lambda e: (e[2], e[0])), due.last, forced=True)
                continue
            now = due.last = due.times[0]
            for rank in due.at[now]:    # a step that ends at once joins this list, and posts now
                finish = self.post(rank, now)
                if finish is not None:
                    self.wake(rank, finish)
            heapq.heappop(due.times)
            del due.at[now]
            if not matched:
                continue
            if len(matched) > 1:
                matched.sort()  # posting order: (send position, receive position, sender), never tied
            batch = matched.copy()
            matched.clear()
            for entry in batch:
                self.release(entry, now)
        return self.report()

    # -- post ---------------------------------------------------------------------------
    def post(self, rank: int, now: float) -> Optional[float]:
        """Finish the rank's current step (local operations) and make its next one current,
        posting it unless a window posted it already; with a window, post the steps after it
        that may go early. Returns when the current step ends if its transfers are all booked
        (None: its bookings wake the rank, or it has no step left).

        The window is the executor's (:meth:`ringcoll.runtime.executor.Prepared.reach`, by
        the same test, :func:`ringcoll.runtime.blocks.posts_early`): once it waits on step i,
        step j > i is posted too while j - i < window and no transfer of j touches what steps
        i .. j - 1 still read or write, stopping at the first that may not; steps finish in
        order, each at its last transfer's end or its predecessor's, whichever is later, plus
        its reductions. Window 1: a step is posted when the one before it ends."""
        ranks = self.ranks
        flight = ranks.flight[rank]
        if flight:
            self.finish(rank, now)
        if self.window == 1:
            st = next(ranks.steps[rank], None)
            if st is None:
                return None
            current = self.open(rank, st, now)
        else:
            self.ahead(rank, now)
            if not flight:
                return None
            current = flight[0]
            if current.end < now:
                current.end = now
        ranks.index[rank] = current.index
        if current.outstanding:
            return None
        return current.end + current.reducing * self.gamma

    def ahead(self, rank: int, now: float) -> None:
        """Post the rank's steps that its window lets go now: its next one if none is in
        flight, then each following one while fewer than ``window`` are in flight and it is
        independent of those (the executor's rule, :meth:`post`)."""
        ranks = self.ranks
        flight, steps = ranks.flight[rank], ranks.steps[rank]
        while True:
            st = ranks.ahead[rank]
            if st is None:
                st = next(steps, None)
                if st is None:
                    return
            if flight and not posts_early([p.step for p in flight] + [st], len(flight), 0, self.window):
                ranks.ahead[rank] = st
                return
            ranks.ahead[rank] = None
            self.open(rank, st, now)

    def open(self, rank: int, st, now: float) -> Posted:
        """Post one step of the rank: its transfers go to match, in its ports' order (after
        the steps still in flight: positions run on across a window's steps)."""
        ranks = self.ranks
        ranks.opened[rank] += 1
        comms = st.comms
        posted = Posted(ranks.opened[rank] - 1, st, len(comms), now,
                        reduced_bytes(st.local, ranks.itemsizes[rank]) if st.local else 0, ranks.post_chain[rank])
        ranks.flight[rank].append(posted)
        ranks.index[rank] = posted.index        # for errors while its transfers match
        if self.window == 1:
            ranks.send_order[rank] = sending = deque()
            ranks.recv_order[rank] = receiving = deque()
            ranks.send_floor[rank] = ranks.recv_floor[rank] = now
            first = 0
        else:
            sending, receiving = ranks.send_order[rank], ranks.recv_order[rank]
            first = ranks.positions[rank]
            ranks.positions[rank] += len(comms)
        for pos, item in enumerate(comms, first):
            self.match(rank, pos, item, sending, receiving, posted)
        return posted

    def finish(self, rank: int, now: float) -> None:
        """The end of the rank's current step: its local operations run, its statistics."""
        ranks = self.ranks
        current = ranks.flight[rank].popleft()
        st = current.step
        if self.local is not None and st.local:
            done = self.local(rank, st)
        else:
            done = current.reducing
        rs = ranks.stats[rank]
        rs.bytes_reduced += done
        rs.steps += 1
        rs.time = now
        if self.timeline is not None and st.local:
            self.timeline.local.append((rank, current.index, current.end, now, done))
        # with a window the step's chain may be shorter than its predecessor's: it ends after it
        chain = ranks.post_chain[rank]
        ranks.post_chain[rank] = (current.depends if current.depends > chain else chain) + 1

    # -- match --------------------------------------------------------------------------
    def match(self, rank: int, pos: int, item, sending: deque, receiving: deque, posted: Posted) -> None:
        """Queue the transfer at position ``pos`` of the rank's step in its port's order, and
        meet it with the oldest other end posted for its pair, or leave it waiting for one."""
        peer, matching = item.peer, self.matching
        if not 0 <= peer < self.peers or peer == rank:
            raise ScheduleError(f"{self.ranks.where(rank)} names peer {peer}, which is not "
                                f"another rank of a world of {self.peers}")
        kind = type(item)
        if kind is not Send and kind is not Recv:
            raise ScheduleError(f"{self.ranks.where(rank)}: {item!r} is not a Send or a Recv")
        sends = kind is Send
        (sending if sends else receiving).append(pos)
        waiting, own = (matching.recvs, matching.sends) if sends else (matching.sends, matching.recvs)
        key = matching.send_key(rank, peer) if sends else matching.recv_key(rank, peer)
        other = _match(waiting, own, key, (rank, item, pos, posted))
        if other is not None:       # (send position, receive position, src, dst, send, receive, their steps)
            at, other_item, other_pos, other_posted = other
            matching.matched.append((pos, other_pos, rank, at, item, other_item, posted, other_posted) if sends else
                                    (other_pos, pos, at, rank, other_item, item, other_posted, posted))

    # -- release ------------------------------------------------------------------------
    def release(self, entry: tuple, now: float, forced: bool = False) -> None:
        """Book a matched message once it heads both its sender's sends and its receiver's
        receives not yet booked, then the held messages that this lets through."""
        ranks = self.ranks
        send_order, recv_order, held_send, held_recv = ranks.send_order, ranks.recv_order, ranks.held_send, \
            ranks.held_recv
        stack = [(entry, True)]
        while stack:
            e, fresh = stack.pop()
            spos, rpos, src, dst = e[0], e[1], e[2], e[3]
            if not fresh and held_send[src].get(spos) is not e:
                continue                        # booked already
            if not forced and (send_order[src][0] != spos or recv_order[dst][0] != rpos):
                held_send[src][spos] = e
                held_recv[dst][rpos] = e
                continue
            forced = False
            held_send[src].pop(spos, None)
            held_recv[dst].pop(rpos, None)
            send_order[src].remove(spos)
            recv_order[dst].remove(rpos)
            self.book(now, src, dst, e[4], e[5], e[6], e[7])
            if send_order[src]:
                after = held_send[src].get(send_order[src][0])
                if after is not None:
                    stack.append((after, False))
            if recv_order[dst]:
                after = held_recv[dst].get(recv_order[dst][0])
                if after is not None:
                    stack.append((after, False))

    # -- book ---------------------------------------------------------------------------
    def book(self, now: float, src: int, dst: int, send_item: Send, recv_item: Recv, sender: Posted,
             receiver: Posted) -> None:
        """Put a matched message on the clock: its ports (and links) from the earliest time
        they are all free, no earlier than now or than the start of its sender's previous send
        or its receiver's previous receive of this step; then its statistics, and its ends
        (the steps ``sender`` and ``receiver``). On a LogGP machine it also takes its
        sender's CPU for o before its ports and its receiver's CPU for o once it arrives, L
        after its ports (:meth:`take_loggp`)."""
        sent, received = send_item.buf, recv_item.buf
        numel = sent.stop - sent.start
        if numel != received.stop - received.start:
            raise ScheduleError(
                f"{self.ranks.where(src)} sends {send_item.buf!r} ({numel} elements) to rank {dst}, "
                f"whose matching receive at step {receiver.index + 1} is {recv_item.buf!r} "
                f"({recv_item.buf.numel} elements)")
        if self.copy is not None:
            self.copy(src, send_item, dst, recv_item)
        nbytes = numel * self.ranks.itemsizes[src]
        if self.routes is None:
            path, wire, duration = None, 0.0, self.alpha + nbytes * self.beta
        else:
            # a network message: its path's α + n·β_path (ringcoll.cost.network: Network.price);
            # its wire-held links are held like ports for its wire time n·β_path (the
            # earliest gap of a lane), its message-held links for its whole time
            peer = dst if self.mirror is None else send_item.peer
            path = self.routes.path(src * self.peers + peer, src, peer)
            wire = nbytes * path[1]
            duration = path[0] + wire
            if not path[4]:
                path = None                     # no hop: ports alone
        if self.loggp:
            start, end, chosen = self.take_loggp(now, src, dst, duration + self.g, wire, path)
        else:
            start, chosen = self.take(now, src, dst, duration, wire, path)
            end = start + duration
        if path is not None:
            self.routes.carry(path, nbytes, wire, duration)
        self.count(src, dst, send_item.peer, nbytes, start, end, chosen, sender, receiver)
        self.settle(src, dst, end, sender, receiver)

    def take(self, now: float, src: int, dst: int, duration: float, wire: float,
             path: Optional[tuple]) -> Tuple[float, Optional[list]]:
        """When the message starts and the port or lane of each table it holds (None: the
        sender's and receiver's only ports); each booked from then."""
        ranks = self.ranks
        out_port, in_port = self.send_ports[src][0], self.recv_ports[dst][0]
        floor = max(now, ranks.send_floor[src], ranks.recv_floor[dst])
        if self.single and path is None and (not out_port or out_port[-1][1] <= floor) \
                and (not in_port or in_port[-1][1] <= floor):
            # both ports idle and no link, the common case: past intervals can never matter again
            out_port[:] = in_port[:] = [(floor, floor + duration)]
            return floor, None
        tables, durations, fixed = self.tables(src, dst, floor, duration, wire, path)
        if self.single and all(len(t) == 1 and (not t[0] or t[0][-1][1] <= floor) for t in tables):
            start, chosen = floor, [t[0] for t in tables]
        else:
            start, chosen = slot(tables, floor, durations)
        # the wire lanes come last; where every duration is positive (α > 0 for ports, a
        # wire time for links) touching intervals merge: no message fits a gap of zero
        for k, (busy, held_for) in enumerate(zip(chosen, durations)):
            hold(busy, now, start, start + held_for, self.positive or k >= fixed)
        return start, chosen

    def take_loggp(self, now: float, src: int, dst: int, held: float, wire: float,
              path: Optional[tuple]) -> Tuple[float, float, Optional[list]]:
        """A message on a LogGP machine (Machine.o, g, L): its sender's CPU for o from its
        start, then its ports (and links) for ``held`` = α + g + nβ (links: their wire time),
        then L on the wire, then its receiver's CPU for o; the earliest start at which all
        are free, no earlier than the floors of :meth:`take`. Returns (start, arrival with the
        receiver's overhead: when it ends for its steps, the ports taken)."""
        ranks, o = self.ranks, self.o
        floor = max(now, ranks.send_floor[src], ranks.recv_floor[dst])
        tables, durations, fixed = self.tables(src, dst, floor, held, wire, path)
        offsets = (o,) * len(tables)
        if self.cpus is not None:
            tables += (self.cpus[src], self.cpus[dst])
            durations += (o, o)
            offsets += (0.0, o + held + self.L)
        start, chosen = slot(tables, floor, durations, offsets)
        for k, (busy, held_for, offset) in enumerate(zip(chosen, durations, offsets)):
            hold(busy, now, start + offset, start + offset + held_for, self.positive or k >= fixed)
        return start, start + 2 * o + held + self.L, chosen

    def tables(self, src: int, dst: int, floor: float, duration: float, wire: float,
               path: Optional[tuple]) -> Tuple[tuple, tuple, int]:
        """What a message holds: the sender's send ports and the receiver's receive ports,
        then its route's message-held links (each for the message's whole ``duration``),
        then its wire-held links (for its ``wire`` time); their durations; how many tables
        come before the wire-held ones."""
        tables = (self.send_ports[src], self.recv_ports[dst])
        if path is None:
            return tables, (duration,) * len(tables), len(tables)
        _, _, wires, held, _, _, twice = path
        lanes = self.routes.lanes
        if held:
            tables += tuple(map(lanes.__getitem__, held))
        durations, fixed = (duration,) * len(tables), len(tables)
        if wire > 0 and wires:
            if self.routes.canon is not None and (twice or any(
                    lane and lane[-1][1] > floor for i in wires for lane in lanes[i])):
                # mirrored on a torus: exact only while no link can make a message
                # wait (then every rank does what its representative does); else run all
                raise _Contended()
            tables += tuple(map(lanes.__getitem__, wires))
            durations += (wire,) * len(wires)
        return tables, durations, fixed

    def count(self, src: int, dst: int, peer: int, nbytes: int, start: float, end: float,
              chosen: Optional[list], sender: Posted, receiver: Posted) -> None:
        """A booked message's statistics: its ends' messages and bytes, its link's bytes,
        its timeline row (and ports), and the chains its steps depend on."""
        ranks = self.ranks
        ranks.send_floor[src] = ranks.recv_floor[dst] = start
        s_stats, d_stats = ranks.stats[src], ranks.stats[dst]
        s_stats.messages += 1
        s_stats.bytes_sent += nbytes
        d_stats.bytes_received += nbytes
        key = src * self.world + dst if self.mirror is None else src * self.peers + peer
        self.link_bytes[key] = self.link_bytes.get(key, 0) + nbytes
        if self.timeline is not None:
            self.timeline.messages.append((src, dst, nbytes, start, end, sender.index, receiver.index))
            if self.ports == 1:
                self.timeline.ports.append((0, 0))
            else:
                self.timeline.ports.append((next(i for i, b in enumerate(self.send_ports[src]) if b is chosen[0]),
                                            next(i for i, b in enumerate(self.recv_ports[dst]) if b is chosen[1])))
        post_chain = ranks.post_chain
        if post_chain[src] > receiver.depends:
            receiver.depends = post_chain[src]
        if post_chain[dst] > sender.depends:
            sender.depends = post_chain[dst]

    # -- wake ---------------------------------------------------------------------------
    def settle(self, src: int, dst: int, end: float, sender: Posted, receiver: Posted) -> None:
        """A booked message ends at ``end`` for both its steps; a current step whose last
        transfer it was ends then, plus γ per byte it reduces, and its rank is due to post
        again (a step posted ahead that completes waits until it is current: :meth:`post`)."""
        flight = self.ranks.flight
        for rank, posted in ((src, sender), (dst, receiver)):
            if end > posted.end:
                posted.end = end
            posted.outstanding -= 1
            if not posted.outstanding and posted is flight[rank][0]:
                self.wake(rank, posted.end + posted.reducing * self.gamma)

    def wake(self, rank: int, time: float) -> None:
        """Post the rank's next step at ``time`` (after the ranks already due then)."""
        due = self.due
        ranks = due.at.get(time)
        if ranks is None:
            due.at[time] = [rank]
            heapq.heappush(due.times, time)
        else:
            ranks.append(rank)

    # -- report -------------------------------------------------------------------------
    def report(self) -> SimStats:
        """Every rank's statistics (a mirrored run's representatives standing for all), or a
        ScheduleError naming each rank that cannot make progress and what it waits on."""
        ranks, routes, world = self.ranks, self.routes, self.world
        stuck = [r for r in range(world) if ranks.flight[r]]
        if stuck:
            raise ScheduleError(self.deadlock(stuck))
        crossing = 0 if routes is None else routes.crossing
        if self.mirror is not None:
            copies = self.peers // world
            result = SimStats([replace(ranks.stats[rank % world]) for rank in range(self.peers)],
                              max(ranks.post_chain), MirroredLinks(self.link_bytes, self.mirror[0], self.peers, world),
                              mirrored=self.mirror[0], crossing=crossing * copies)
            if routes is not None:
                result.network = routes.stats(True, copies)
            return result
        result = SimStats(ranks.stats, max(ranks.post_chain, default=0), self.link_bytes, self.timeline,
                          crossing=crossing)
        if routes is not None:
            result.network = routes.stats(False, 1)
        return result

    def deadlock(self, stuck: List[int]) -> str:
        """The deadlock report: each stuck rank (the first 16), its step and what it waits on."""
        waiting: Dict[int, List[str]] = {}
        for queue in self.matching.sends.values():
            for owner, item, *_ in queue:
                waiting.setdefault(owner, []).append(f"send to peer {item.peer} {item.buf!r}")
        for queue in self.matching.recvs.values():
            for owner, item, *_ in queue:
                waiting.setdefault(owner, []).append(f"receive from peer {item.peer} {item.buf!r}")
        lines = [f"  {self.ranks.where(r)} waits on: {', '.join(waiting.get(r, [])) or 'nothing posted'}"
                 for r in stuck[:16]]
        if len(stuck) > 16:
            lines.append(f"  ... and {len(stuck) - 16} more ranks")
        return "deadlock: no rank can make progress\n" + "\n".join(lines)


@_without_gc
def run_schedules(schedules: Sequence[Iterable], machine: Machine = Machine(),
                  itemsizes: Optional[Sequence[int]] = None, *, record: bool = False,
                  copy=None, local=None, describe: Optional[Sequence[str]] = None,
                  mirror: Optional[Tuple[str, int]] = None) -> SimStats:
    """The clock over ``schedules[r]`` (rank r's steps, any iterable: consumed one step at a
    time). ``copy(src, send, dst, recv)`` moves a matched message's data and ``local(rank,
    step) -> bytes reduced`` runs a finished step's local operations; without them only the
    clock runs. ``itemsizes[r]``: bytes per element of rank r's buffers (default 1).

    ``mirror=(kind, world)``: ``schedules`` holds the representatives' schedules, ranks
    0 .. L - 1, standing for every rank of a world in which rank r's schedule is rank r % L's
    with every peer q moved to ``(q + r - r % L) % world`` (``kind`` "rotation") or, L = 1,
    to ``q ^ r`` ("xor"); see :func:`ringcoll.register`. By that symmetry every rank does
    what its representative does at the same times, so representative a's k-th send to peer
    q is received as representative b = q % L receives its k-th message from peer
    ``(a - (q - b)) % world`` (``q`` in a xor), on a's and b's own ports: L ranks' clock, and
    their statistics are every rank's (no data, no timeline)."""
    world = len(schedules)
    if mirror is not None:
        kind, peers = mirror
        if kind not in ("rotation", "xor") or peers % world or (kind == "xor" and world != 1):
            raise ValueError(f"mirror must be ('rotation', world) with the schedules of ranks 0 .. L - 1, "
                             f"L dividing the world, or ('xor', world) with rank 0's, got {mirror!r} "
                             f"with {world} schedules")
        if record or copy is not None or local is not None:
            raise ValueError("a mirrored run is cost-only, without a timeline")
    itemsizes = list(itemsizes) if itemsizes is not None else [1] * world
    describe = list(describe) if describe is not None else [""] * world
    return Clock(schedules, machine, itemsizes, describe, record=record, copy=copy, local=local,
                 mirror=mirror).run()


class MirroredLinks(Mapping):
    """Bytes per directed link ``src * world + dst`` of a mirrored run, from the
    representatives' links ``per_link[a * world + q]`` (a < period): rank r's link to q is
    its representative r % period's to ``(q - shift) % world`` (shift ``r - r % period``), or
    rank 0's to ``q ^ r`` (xor); computed on access, as a world of thousands has millions."""

    def __init__(self, per_link: Dict[int, int], kind: str, world: int, period: int = 1):
        self.per_link, self.kind, self.world, self.period = dict(per_link), kind, world, period

    def __getitem__(self, key: int) -> int:
        if not isinstance(key, int) or not 0 <= key < self.world * self.world:
            raise KeyError(key)
        src, dst = divmod(key, self.world)
        if self.kind == "rotation":
            delegate = src % self.period
            return self.per_link[delegate * self.world + (dst - src + delegate) % self.world]
        return self.per_link[dst ^ src]

    def __iter__(self):
        world, period = self.world, self.period
        links = sorted(divmod(key, world) for key in self.per_link)
        for src in range(world):
            if self.kind == "rotation":
                shift = src - src % period
                for delegate, q in links:
                    if delegate == src % period:
                        yield src * world + (q + shift) % world
            else:
                for _, q in links:
                    yield src * world + (src ^ q)

    def __len__(self) -> int:
        return len(self.per_link) * (self.world // self.period)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())
