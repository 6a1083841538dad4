"""The simulator: every rank's plan in one process, with or without data, on a port-limited clock.

Sends and receives are matched in posting order per (source, destination) pair, exactly as
gloo and NCCL match them; a step completes when all its transfers are done, then its local
operations run. An unmatched transfer, a size mismatch or a deadlock is an error naming the
rank, the step and the peer.

The clock (:mod:`ringcoll.cost.machine`): each rank has ``machine.ports`` send ports and as many
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

It is a discrete-event simulation ordered by time: its result does not depend on the order
in which ranks are listed, and a run without data (``data=False``) streams each rank's
schedule one step at a time, so its memory is O(world), not O(steps).

Symmetry: where an algorithm declares that every rank's schedule is a representative's with
its peers relabelled (``ringcoll.register(..., symmetry=)``: rank r is rank r % L moved by
r - r % L, ``(q + shift) % p``, or rank 0 with peers ``q ^ r``), every rank does what its
representative does at the same times, on a flat machine or one whose nodes the relabelling
maps onto nodes. A cost-only run without a timeline then runs the L representatives alone,
each send matched with the representative receive it stands for (:func:`run_schedules`,
``mirror``): O(L ranks' steps) instead of O(world's), with the same statistics and time
(tests/sim/test_study.py compares both at every rank). The declaration is checked against
sampled ranks on every such run. On a torus, where messages share links with their own
translates and by-rank arbitration breaks the symmetry, a rotation-symmetric schedule of one
step per rank runs every rank on the compiled clock of one-step exchanges
(:mod:`ringcoll.sim.batch`, :func:`run_one_step`): the same arithmetic in the same order.
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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..runtime.local import run_local
from .batch import one_step_clock, one_step_torus
from ..cost.machine import Machine
from ..runtime.plan import Plan
from ..schedules.vocabulary import Copies, Recv, Reduce, Send, extents

__all__ = ["NetworkStats", "RankStats", "ScheduleError", "SimStats", "Timeline", "run_plans", "run_schedules"]


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


def run_plans(plans: Sequence[Plan], machine: Machine = Machine(), *, data: bool = True,
              record: bool = False, symmetry: bool = True) -> SimStats:
    """Run every rank's plan to completion; ``plans[r]`` is rank r's. With ``data=False``
    only the clock runs: no buffer is read or written and schedules stream step by step, and
    where the algorithm declares its schedules the same on every rank up to relabelling
    (``symmetry``, without a timeline; :func:`symmetric` says on which machines) the
    representatives' run stands for all.
    ``record`` keeps the :class:`Timeline` of every message and local operation."""
    world = len(plans)
    itemsizes = [plan.dtype.itemsize for plan in plans]
    if not data:
        found = symmetric(plans, machine) if symmetry and not record else None
        if found is not None:
            kind, period = found
            first = plans[0]
            schedules = [first.algorithm.schedule(rank, world, first.layout) for rank in range(period)]
            if kind == "rotation" and one_step_torus(machine, period, world) is not None:
                # one step per rank on a torus: every rank on the compiled clock of one-step
                # exchanges (ringcoll.sim.batch), exact where messages share links, which a
                # mirrored run cannot follow
                heads = [list(itertools.islice(schedule, 2)) for schedule in schedules]
                if all(len(head) == 1 for head in heads):
                    stats = run_one_step(heads, machine, itemsizes[0], world)
                    if stats is not None:
                        return stats
                schedules = [itertools.chain(head, schedule) for head, schedule in zip(heads, schedules)]
            try:
                return run_schedules(schedules, machine, itemsizes[:period], describe=[first.describe] * period,
                                     mirror=(kind, world))
            except _Contended:
                pass                    # a link made a message wait: run every rank
        schedules = [plan.algorithm.schedule(plan.rank, plan.world, plan.layout) for plan in plans]
        return run_schedules(schedules, machine, itemsizes, record=record,
                             describe=[plan.describe for plan in plans])
    steps = [plan.steps() for plan in plans]
    buffers = []
    for plan, own in zip(plans, steps):
        bufs = dict(plan.buffers)
        for name, need in extents(own).items():
            if name not in bufs:
                bufs[name] = torch.empty(need, dtype=plan.dtype, device=plan.device)
            elif bufs[name].numel() < need:
                raise ScheduleError(f"{plan.describe}: rank {plan.rank} reaches element {need} of "
                                    f"buffer {name!r}, which holds {bufs[name].numel()}")
        buffers.append(bufs)

    def copy(src, send_item, dst, recv_item):
        s, r = send_item.buf, recv_item.buf
        buffers[dst][r.name][r.start:r.stop].copy_(buffers[src][s.name][s.start:s.stop])

    def local(rank, st):
        return run_local(plans[rank].op, buffers[rank], st.local)

    for plan in plans:
        for before in plan.before:
            before()
    stats = run_schedules(steps, machine, itemsizes, record=record, copy=copy, local=local,
                          describe=[plan.describe for plan in plans])
    for plan in plans:
        for after in plan.after:
            after()
    return stats


def run_one_step(representatives: Sequence, machine: Machine, itemsize: int, world: int) -> Optional[SimStats]:
    """The statistics of a cost-only run of ``world`` ranks on a torus, rank r running
    representative ``r % L``'s one step (``representatives``: L lists of steps) with its peers
    moved by ``r - r % L``: every rank on the compiled clock of one-step exchanges
    (:mod:`ringcoll.sim.batch`), equal to the event clock's; None where it declines."""
    reduced = [reduced_bytes(steps[0].local, itemsize) if len(steps) == 1 and steps[0].local else 0
               for steps in representatives]
    run = one_step_clock(representatives, machine, itemsize, world, reduced)
    if run is None:
        return None
    count = len(representatives)
    ranks = [RankStats(steps=1, messages=run.messages[r], bytes_sent=run.sent[r], bytes_received=run.received[r],
                       bytes_reduced=reduced[r % count], time=run.times[r]) for r in range(world)]
    stats = SimStats(ranks, 1, MirroredLinks(run.per_link, "rotation", world, count), compiled=True)
    stats.network = NetworkStats(run.network, run.network.hosts_of(world), run.link_bytes, run.link_busy,
                                 run.hop_bytes)
    return stats


def signature(shift: int, world: int, steps: Iterable, kind: str):
    """A schedule as the clock sees it, its peers moved back by ``shift`` (``(q - shift) %
    world``, or ``q ^ shift``): per step, each transfer's (direction, peer, elements) and the
    elements reduced."""
    for st in steps:
        yield (tuple((type(c) is Send, (c.peer - shift) % world if kind == "rotation" else c.peer ^ shift,
                      c.buf.numel) for c in st.comms),
               reduced_bytes(st.local, 1) if st.local else 0)


#: ranks a mirrored run compares with their representatives (fractions of the world, and the last)
SAMPLED = (1, -1, 0.5, 0.37)


def symmetric(plans: Sequence[Plan], machine: Machine) -> Optional[Tuple[str, int]]:
    """The symmetry ``(kind, period)`` a cost-only run of ``plans`` may use to run ranks
    0 .. period - 1 alone, or None: every rank runs the same algorithm on the same layout and
    dtype, the algorithm declares a symmetry there (``register(..., symmetry=)``), and the
    machine is flat or, for a rotation, has nodes in blocks that the period's shifts map onto
    nodes. The declaration is checked against sampled ranks' schedules (every rank's in the
    tests): a schedule that breaks its own declaration is a ScheduleError, never a silently
    wrong clock."""
    world = len(plans)
    first = plans[0]
    algorithm = first.algorithm
    if world < 2 or algorithm.symmetry is None:
        return None
    for plan in plans:          # copies of one plan (simulate's numel= runs) pass on identity
        if plan.algorithm is not algorithm or (plan.layout is not first.layout and plan.layout != first.layout) \
                or (plan.buffers is not first.buffers and plan.dtype != first.dtype):
            return None
    declared = algorithm.symmetry(world, first.layout)
    if declared is None:
        return None
    kind, period = ("rotation", declared) if isinstance(declared, int) and not isinstance(declared, bool) \
        else (declared, 1)
    if kind not in ("rotation", "xor") or not 1 <= period <= world or world % period:
        raise ScheduleError(f"{algorithm.collective}/{algorithm.name}: symmetry returned {declared!r}, not "
                            f"'rotation', 'xor', a period dividing the world ({world}) or None")
    if period == world:
        return None                      # every rank its own representative: nothing to save
    net = machine.network_for(world)
    if net is not None:
        # the shifts must map the network onto itself: a translation of a whole torus placed
        # linearly, whole nodes of a 2-level machine in blocks (Network.mirror_period)
        period = net.mirror_period(period, world) if kind == "rotation" else None
        if period is None or period == world:
            return None
    references = {}
    for sample in SAMPLED:
        rank = int(sample * world) % world if isinstance(sample, float) else sample % world
        delegate = rank % period
        if rank == delegate:
            continue
        if delegate not in references:
            references[delegate] = list(signature(0, world, algorithm.schedule(delegate, world, first.layout), kind))
        shift = rank - delegate if kind == "rotation" else rank
        got = signature(shift, world, algorithm.schedule(rank, world, first.layout), kind)
        for index, (want, have) in enumerate(itertools.zip_longest(references[delegate], got)):
            if want != have:
                raise ScheduleError(
                    f"{first.describe or algorithm.name}: declared {kind}-symmetric at world {world}, "
                    f"but rank {rank}'s step {index} is {have} where rank {delegate}'s is {want}")
    return kind, period


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
    peers = world                         # the ranks a peer may be
    if mirror is not None:
        kind, peers = mirror
        if kind not in ("rotation", "xor") or peers % world or (kind == "xor" and world != 1):
            raise ValueError(f"mirror must be ('rotation', world) with the schedules of ranks 0 .. L - 1, "
                             f"L dividing the world, or ('xor', world) with rank 0's, got {mirror!r} "
                             f"with {world} schedules")
        if record or copy is not None or local is not None:
            raise ValueError("a mirrored run is cost-only, without a timeline")
    rotation = mirror is not None and mirror[0] == "rotation"
    itemsizes = list(itemsizes) if itemsizes is not None else [1] * world
    describe = list(describe) if describe is not None else [""] * world
    lengths = [len(s) if hasattr(s, "__len__") else None for s in schedules]
    iters = [iter(s) for s in schedules]
    alpha, beta, gamma, ports = machine.alpha, machine.beta, machine.gamma, machine.ports
    # each port: its busy intervals (start, end), sorted; a table: one rank's ports, or the
    # lanes of a link held per message (a 2-level machine's NICs)
    send_ports = [[[] for _ in range(ports)] for _ in range(world)]
    recv_ports = [[[] for _ in range(ports)] for _ in range(world)]
    net = machine.network_for(peers)   # a 2-level machine's nodes are a network too
    single = ports == 1
    positive = alpha > 0                # every message holds its ports for more than no time
    crossing = [0]              # messages between a network's groups (nodes, dragonfly groups ...)
    canon = None
    if net is not None:
        host = net.hosts_of(peers)
        if mirror is not None:
            if not rotation:
                raise ValueError("a mirrored run on a network needs a rotation")
            # each link stands for its translates by multiples of the representatives' count
            canon = net.representatives(world, peers)
        group = net.groups_of(host)      # each rank's group (node, fat-tree leaf, dragonfly group) or None
        route = net.route
        links = net.links
        single = single and all(link.lanes == 1 for link in links if link.hold == "message")
        # each lane of each link: its busy intervals (start, end), sorted, like a port's: for a
        # message's wire time on a wire-held link, its whole time on a message-held one
        link_lanes = [[[] for _ in range(link.lanes)] for link in links]
        net_bytes = [0] * len(links)
        net_busy = [0.0] * len(links)
        hop_bytes = [0]
        # per rank pair, kept on the network across runs with the same prices and ranks
        paths: Dict[int, tuple] = net.memo((alpha, beta, peers, None if canon is None else world))

        def path_of(key, src, peer):
            """What the clock needs of the route from rank ``src`` to rank ``peer`` (``key`` =
            src · peers + peer): (α, β of the path, its wire-held links, its message-held
            links, hops, crosses groups, a link met twice), link ids canonical in a mirrored
            run."""
            found = paths.get(key)
            if found is None:
                path = route(host[src], host[peer])
                path_alpha, path_beta = net.price(path, alpha, beta)
                ids = path if canon is None else tuple(canon[i] for i in path)
                wires = tuple(c for i, c in zip(path, ids) if links[i].hold == "wire")
                held = tuple(c for i, c in zip(path, ids) if links[i].hold == "message")
                crosses = group is not None and group[src] != group[peer]
                found = (path_alpha, path_beta, wires, held, len(path), crosses, len(set(ids)) != len(ids))
                if len(paths) > 1 << 20:
                    paths.clear()
                paths[key] = found
            return found

    stats = [RankStats() for _ in range(world)]
    current: List = [None] * world          # the step each rank is in
    index = [-1] * world
    outstanding = [0] * world
    step_end = [0.0] * world                # latest transfer end of the current step
    reducing = [0] * world                  # bytes the current step reduces
    post_chain = [0] * world                # critical-path length before the current step
    # each port serves a step's messages in the order the step posts them: the positions of
    # the step's sends and receives not yet booked, the matched messages waiting on an
    # earlier one (by position), the start of the last booked send and receive
    send_order = [deque() for _ in range(world)]
    recv_order = [deque() for _ in range(world)]
    held_send: List[Dict[int, tuple]] = [{} for _ in range(world)]
    held_recv: List[Dict[int, tuple]] = [{} for _ in range(world)]
    send_floor = [0.0] * world
    recv_floor = [0.0] * world
    depends = [0] * world
    link_bytes: Dict[int, int] = {}
    timeline = Timeline(world) if record else None
    sends: Dict[int, deque] = {}
    recvs: Dict[int, deque] = {}
    # the ranks whose step ends at each time, in the order those ends were found (the order
    # they post their next steps in), and the heap of those times
    due: Dict[float, List[int]] = {0.0: list(range(world))} if world else {}
    times: List[float] = list(due)
    matched: List = []

    def where(rank):
        total = f"/{lengths[rank]}" if lengths[rank] is not None else ""
        prefix = f"{describe[rank]}: " if describe[rank] else ""
        return f"{prefix}rank {rank} step {index[rank] + 1}{total}"

    def post(rank, now):
        """Finish the rank's current step (local operations) and post its next one."""
        st = current[rank]
        if st is not None:
            if local is not None and st.local:
                done = local(rank, st)
            else:
                done = reducing[rank]
            rs = stats[rank]
            rs.bytes_reduced += done
            rs.steps += 1
            rs.time = now
            if timeline is not None and st.local:
                timeline.local.append((rank, index[rank], step_end[rank], now, done))
            post_chain[rank] = depends[rank] + 1
        st = next(iters[rank], None)
        current[rank] = st
        if st is None:
            return None
        index[rank] += 1
        step_end[rank] = now
        depends[rank] = post_chain[rank]
        comms = st.comms
        outstanding[rank] = len(comms)
        send_order[rank] = sending = deque()
        recv_order[rank] = receiving = deque()
        send_floor[rank] = recv_floor[rank] = now
        reducing[rank] = reduced_bytes(st.local, itemsizes[rank]) if st.local else 0
        for pos, item in enumerate(comms):
            peer = item.peer
            if not 0 <= peer < peers or peer == rank:
                raise ScheduleError(f"{where(rank)} names peer {peer}, which is not "
                                    f"another rank of a world of {peers}")
            if type(item) is Send:
                sending.append(pos)
                if mirror is None:
                    key = rank * world + peer
                elif rotation:
                    delegate = peer % world
                    key = delegate * peers + (rank - peer + delegate) % peers
                else:
                    key = peer
                other = _match(recvs, sends, key, (rank, item, pos))
                if other is not None:
                    dst, recv, recv_pos = other
                    matched.append((pos, recv_pos, rank, dst, item, recv))
            elif type(item) is Recv:
                receiving.append(pos)
                if mirror is None:
                    key = peer * world + rank
                else:
                    key = rank * peers + peer if rotation else peer
                other = _match(sends, recvs, key, (rank, item, pos))
                if other is not None:
                    src, send, send_pos = other
                    matched.append((send_pos, pos, src, rank, send, item))
            else:
                raise ScheduleError(f"{where(rank)}: {item!r} is not a Send or a Recv")
        if not comms:
            return now + reducing[rank] * gamma
        return None

    def slot(tables, start, durations):
        """The earliest time >= start at which one port (lane) of each table is free for its
        duration (``durations[i]`` for ``tables[i]``), the ports that are, and the time; a
        port's busy intervals are sorted and a message may take a gap before a later-booked
        one (a port never idles while a ready message could go)."""
        # the least time from which every table has a lane free for its duration: each
        # table's earliest fit from t on (over its lanes) never decreases as t grows, so
        # moving t to the latest of them until none moves it reaches the least common one;
        # each table's lane is its first one that fits there (the first such choice in lane order)
        t = start
        while True:
            latest, chosen = t, []
            for table, duration in zip(tables, durations):
                lane, fits = None, _INF
                for busy in table:
                    fit = _fit(busy, t, duration)
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

    def wake(rank, time):
        """Post the rank's next step at ``time`` (after the ranks already due then)."""
        ranks = due.get(time)
        if ranks is None:
            due[time] = [rank]
            heapq.heappush(times, time)
        else:
            ranks.append(rank)

    def book(now, src, dst, send_item, recv_item):
        """Put a matched message on the clock: its ports (and links) from the earliest time
        they are free, no earlier than now or than the start of its sender's previous send
        of this step (a rank's sends start in the order its step posts them)."""
        sent, received = send_item.buf, recv_item.buf
        numel = sent.stop - sent.start
        if numel != received.stop - received.start:
            raise ScheduleError(
                f"{where(src)} sends {send_item.buf!r} ({numel} elements) to rank {dst}, "
                f"whose matching receive at step {index[dst] + 1} is {recv_item.buf!r} "
                f"({recv_item.buf.numel} elements)")
        if copy is not None:
            copy(src, send_item, dst, recv_item)
        nbytes = numel * itemsizes[src]
        out_port, in_port = send_ports[src][0], recv_ports[dst][0]
        floor = max(now, send_floor[src], recv_floor[dst])
        if net is None:
            duration = alpha + nbytes * beta
            hops = 0
        else:
            # a network message: its path's α + n·β_path (ringcoll.cost.network: Network.price);
            # its wire-held links are held like ports for its wire time n·β_path (the
            # earliest gap of a lane), its message-held links for its whole time
            peer = dst if mirror is None else send_item.peer
            key = src * peers + peer
            path_alpha, path_beta, wires, held, hops, crosses, twice = paths.get(key) or path_of(key, src, peer)
            wire = nbytes * path_beta
            duration = path_alpha + wire
        if single and not hops and (not out_port or out_port[-1][1] <= floor) \
                and (not in_port or in_port[-1][1] <= floor):
            # both ports idle and no link, the common case: past intervals can never matter again
            start, end = floor, floor + duration
            out_port[:] = in_port[:] = [(start, end)]
        else:
            tables = (send_ports[src], recv_ports[dst])
            if hops:
                if held:
                    tables += tuple(map(link_lanes.__getitem__, held))
                durations = (duration,) * len(tables)
                if wire > 0 and wires:
                    if canon is not None and (twice or any(
                            lane and lane[-1][1] > floor for i in wires for lane in link_lanes[i])):
                        # mirrored on a torus: exact only while no link can make a message
                        # wait (then every rank does what its representative does); else run all
                        raise _Contended()
                    tables += tuple(map(link_lanes.__getitem__, wires))
                    durations += (wire,) * len(wires)
            else:
                durations = (duration,) * len(tables)
            if single and all(len(t) == 1 and (not t[0] or t[0][-1][1] <= floor) for t in tables):
                start, chosen = floor, [t[0] for t in tables]
            else:
                start, chosen = slot(tables, floor, durations)
            end = start + duration
            # the wire lanes come last; where every duration is positive (α > 0 for ports, a
            # wire time for links) touching intervals merge: no message fits a gap of zero
            fixed = len(durations) - (len(wires) if hops and wire > 0 else 0)
            for k, (busy, held_for) in enumerate(zip(chosen, durations)):
                if busy and busy[-1][1] <= now:
                    busy.clear()                    # past intervals can never matter again
                else:
                    while busy and busy[0][1] <= now:
                        busy.pop(0)
                stop = start + held_for
                if not (positive or k >= fixed):
                    bisect.insort(busy, (start, stop))
                    continue
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
        if hops:
            if wire > 0:
                for i in wires:
                    net_bytes[i] += nbytes
                    net_busy[i] += wire
            for i in held:
                net_bytes[i] += nbytes
                net_busy[i] += duration
            hop_bytes[0] += nbytes * hops
            if crosses:
                crossing[0] += 1
        send_floor[src] = recv_floor[dst] = start
        s_stats, d_stats = stats[src], stats[dst]
        s_stats.messages += 1
        s_stats.bytes_sent += nbytes
        d_stats.bytes_received += nbytes
        key = src * world + dst if mirror is None else src * peers + send_item.peer
        link_bytes[key] = link_bytes.get(key, 0) + nbytes
        if timeline is not None:
            timeline.messages.append((src, dst, nbytes, start, end, index[src], index[dst]))
            if ports == 1:
                timeline.ports.append((0, 0))
            else:
                timeline.ports.append((next(i for i, b in enumerate(send_ports[src]) if b is chosen[0]),
                                       next(i for i, b in enumerate(recv_ports[dst]) if b is chosen[1])))
        if post_chain[src] > depends[dst]:
            depends[dst] = post_chain[src]
        if post_chain[dst] > depends[src]:
            depends[src] = post_chain[dst]
        if end > step_end[src]:
            step_end[src] = end
        outstanding[src] -= 1
        if not outstanding[src]:
            wake(src, step_end[src] + reducing[src] * gamma)
        if end > step_end[dst]:
            step_end[dst] = end
        outstanding[dst] -= 1
        if not outstanding[dst]:
            wake(dst, step_end[dst] + reducing[dst] * gamma)

    def release(entry, now, forced=False):
        """Book a matched message once it heads both its sender's sends and its receiver's
        receives not yet booked, then the held messages that this lets through."""
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
            book(now, src, dst, e[4], e[5])
            if send_order[src]:
                after = held_send[src].get(send_order[src][0])
                if after is not None:
                    stack.append((after, False))
            if recv_order[dst]:
                after = held_recv[dst].get(recv_order[dst][0])
                if after is not None:
                    stack.append((after, False))

    last = 0.0
    while True:
        if not times:
            # messages of a step waiting on each other's order in a circle (a pathological
            # schedule): the first by sender goes, at the last event's time
            waiting = [e for table in held_send for e in table.values()]
            if not waiting:
                break
            release(min(waiting, key=lambda e: (e[2], e[0])), last, forced=True)
            continue
        now = last = times[0]
        for rank in due[now]:       # a step that ends at once joins this list, and posts now
            finish = post(rank, now)
            if finish is not None:
                wake(rank, finish)
        heapq.heappop(times)
        del due[now]
        if not matched:
            continue
        if len(matched) > 1:
            matched.sort()      # posting order: (send position, receive position, sender), never tied
        batch = matched.copy()
        matched.clear()
        for entry in batch:
            release(entry, now)

    stuck = [r for r in range(world) if current[r] is not None]
    if stuck:
        waiting: Dict[int, List[str]] = {}
        for queue in sends.values():
            for owner, item, _ in queue:
                waiting.setdefault(owner, []).append(f"send to peer {item.peer} {item.buf!r}")
        for queue in recvs.values():
            for owner, item, _ in queue:
                waiting.setdefault(owner, []).append(f"receive from peer {item.peer} {item.buf!r}")
        lines = [f"  {where(r)} waits on: {', '.join(waiting.get(r, [])) or 'nothing posted'}"
                 for r in stuck[:16]]
        if len(stuck) > 16:
            lines.append(f"  ... and {len(stuck) - 16} more ranks")
        raise ScheduleError("deadlock: no rank can make progress\n" + "\n".join(lines))
    if mirror is not None:
        result = SimStats([replace(stats[rank % world]) for rank in range(peers)], max(post_chain),
                          MirroredLinks(link_bytes, mirror[0], peers, world), mirrored=mirror[0],
                          crossing=crossing[0] * (peers // world))
        if net is not None:
            result.network = NetworkStats(net, host, [net_bytes[c] for c in canon],
                                          [net_busy[c] for c in canon], hop_bytes[0] * (peers // world))
        return result
    result = SimStats(stats, max(post_chain, default=0), link_bytes, timeline, crossing=crossing[0])
    if net is not None:
        result.network = NetworkStats(net, host, net_bytes, net_busy, hop_bytes[0])
    return result


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
