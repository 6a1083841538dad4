"""The simulator: every rank's plan in one process, with or without data, on a port-limited clock.

Sends and receives are matched in posting order per (source, destination) pair, exactly as
gloo and NCCL match them; a step completes when all its transfers are done, then its local
operations run. An unmatched transfer, a size mismatch or a deadlock is an error naming the
rank, the step and the peer.

The clock (:mod:`ringcoll.machine`): each rank has ``machine.ports`` send ports and as many
receive ports. A message of n bytes holds one send port of its sender and one receive port
of its receiver (and, between nodes, a port of each node's NIC) for α + nβ, starting once
both ends have posted it and every port it needs is free. Ports serve messages in the order
they became ready, and messages that become ready together in their posting order, so a rank
that posts k sends at once pays k(α + nβ). A step ends when its last transfer does, plus γ per
byte its local operations reduce; the rank then posts its next step.

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
(tests/test_study.py compares both at every rank). The declaration is checked against
sampled ranks on every such run.
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

from .local import run_local
from .machine import Machine
from .plan import Plan
from .schedule import Recv, Reduce, Send, extents

__all__ = ["Machine", "RankStats", "ScheduleError", "SimStats", "Timeline", "run_plans", "run_schedules"]


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


@dataclass
class SimStats:
    ranks: List[RankStats] = field(default_factory=list)
    critical_path: int = 0      # the longest chain of dependent steps
    link_bytes: Dict[int, int] = field(default_factory=dict, repr=False)   # src * world + dst -> bytes
    timeline: Optional[Timeline] = field(default=None, repr=False)
    mirrored: Optional[str] = None      # "rotation" | "xor": representatives' run stood for every rank

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

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.ranks)

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.ranks)

    @property
    def max_bytes_sent(self) -> int:
        return max((r.bytes_sent for r in self.ranks), default=0)

    @property
    def max_bytes_received(self) -> int:
        return max((r.bytes_received for r in self.ranks), default=0)

    @property
    def bytes_reduced(self) -> int:
        return sum(r.bytes_reduced for r in self.ranks)

    @property
    def max_bytes_reduced(self) -> int:
        return max((r.bytes_reduced for r in self.ranks), default=0)

    @property
    def links(self) -> Dict[Tuple[int, int], int]:
        """Bytes carried per directed link ``(src, dst)``."""
        world = max(1, self.world)
        return {divmod(key, world): nbytes for key, nbytes in self.link_bytes.items()}

    @property
    def time(self) -> float:
        return max((r.time for r in self.ranks), default=0.0)


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
            return run_schedules([first.algorithm.schedule(rank, world, first.layout) for rank in range(period)],
                                 machine, itemsizes[:period], describe=[first.describe] * period,
                                 mirror=(kind, world))
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
    if not machine.flat:
        per_node = machine.ranks_per_node
        if kind != "rotation" or machine.placement is not None or period % per_node or world % per_node:
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
    """Bytes a step's local operations reduce (what ringcoll.local.run_local returns)."""
    return sum(op.dst.numel * len(op.srcs) for op in local if isinstance(op, Reduce)) * itemsize


_INF = float("inf")


def _choices(tables):
    """Every way to pick one port from each table (one way when each has one port)."""
    if all(len(t) == 1 for t in tables):
        return (tuple(t[0] for t in tables),)
    return itertools.product(*tables)


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
    flat = machine.flat
    alpha, beta, gamma, ports = machine.alpha, machine.beta, machine.gamma, machine.ports
    single = ports == 1 and machine.nic_ports == 1
    node = [machine.node_of(r) for r in range(peers)] if not flat else None
    nodes = (max(node) + 1) if node else 0
    # each port: its busy intervals (start, end), sorted; a table: one rank's or NIC's ports
    nic_out = [[[] for _ in range(machine.nic_ports)] for _ in range(nodes)]
    nic_in = [[[] for _ in range(machine.nic_ports)] for _ in range(nodes)]
    send_ports = [[[] for _ in range(ports)] for _ in range(world)]
    recv_ports = [[[] for _ in range(ports)] for _ in range(world)]

    stats = [RankStats() for _ in range(world)]
    current: List = [None] * world          # the step each rank is in
    index = [-1] * world
    outstanding = [0] * world
    step_end = [0.0] * world                # latest transfer end of the current step
    reducing = [0] * world                  # bytes the current step reduces
    post_chain = [0] * world                # critical-path length before the current step
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
        reducing[rank] = reduced_bytes(st.local, itemsizes[rank]) if st.local else 0
        for pos, item in enumerate(comms):
            peer = item.peer
            if not 0 <= peer < peers or peer == rank:
                raise ScheduleError(f"{where(rank)} names peer {peer}, which is not "
                                    f"another rank of a world of {peers}")
            if type(item) is Send:
                if mirror is None:
                    key = rank * world + peer
                elif rotation:
                    delegate = peer % world
                    key = delegate * peers + (rank - peer + delegate) % peers
                else:
                    key = peer
                queue = recvs.get(key)
                if queue:
                    dst, other, other_pos = queue.popleft()
                    if not queue:
                        del recvs[key]
                    matched.append((pos, other_pos, rank, dst, item, other))
                else:
                    queue = sends.get(key)
                    if queue is None:
                        sends[key] = queue = deque()
                    queue.append((rank, item, pos))
            elif type(item) is Recv:
                if mirror is None:
                    key = peer * world + rank
                else:
                    key = rank * peers + peer if rotation else peer
                queue = sends.get(key)
                if queue:
                    src, other, other_pos = queue.popleft()
                    if not queue:
                        del sends[key]
                    matched.append((other_pos, pos, src, rank, other, item))
                else:
                    queue = recvs.get(key)
                    if queue is None:
                        recvs[key] = queue = deque()
                    queue.append((rank, item, pos))
            else:
                raise ScheduleError(f"{where(rank)}: {item!r} is not a Send or a Recv")
        if not comms:
            return now + reducing[rank] * gamma
        return None

    def slot(tables, start, duration):
        """The earliest time >= start at which one port of each table is free for
        ``duration``, the ports that are, and the time; a port's busy intervals are sorted
        and a message may take a gap before a later-booked one (a port never idles while a
        ready message could go)."""
        best = None
        for choice in _choices(tables):
            t = start
            moved = True
            while moved:
                moved = False
                for busy in choice:
                    # intervals of one port never overlap: sorted by start, so also by end
                    i = max(0, bisect.bisect_right(busy, (t, _INF)) - 1)
                    while i < len(busy):
                        b_start, b_end = busy[i]
                        i += 1
                        if b_end <= t:
                            continue
                        if b_start >= t + duration:
                            break
                        t = b_end
                        moved = True
            if best is None or t < best[0]:
                best = (t, choice)
        return best

    def wake(rank, time):
        """Post the rank's next step at ``time`` (after the ranks already due then)."""
        ranks = due.get(time)
        if ranks is None:
            due[time] = [rank]
            heapq.heappush(times, time)
        else:
            ranks.append(rank)

    while times:
        now = times[0]
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
        for _, _, src, dst, send_item, recv_item in batch:
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
            inside = flat or node[src] == node[dst if mirror is None else send_item.peer]
            duration = alpha + nbytes * beta if inside else machine.inter_alpha + nbytes * machine.inter_beta
            out_port, in_port = send_ports[src][0], recv_ports[dst][0]
            if single and inside and (not out_port or out_port[-1][1] <= now) \
                    and (not in_port or in_port[-1][1] <= now):
                # both ports idle, the common case: past intervals can never matter again
                start, end = now, now + duration
                out_port[:] = in_port[:] = [(start, end)]
            else:
                tables = (send_ports[src], recv_ports[dst]) if inside else \
                    (send_ports[src], recv_ports[dst], nic_out[node[src]], nic_in[node[dst]])
                if single and all(not t[0] or t[0][-1][1] <= now for t in tables):
                    start, chosen = now, [t[0] for t in tables]
                else:
                    start, chosen = slot(tables, now, duration)
                end = start + duration
                for busy in chosen:
                    if busy and busy[-1][1] <= now:
                        busy.clear()                    # past intervals can never matter again
                    else:
                        while busy and busy[0][1] <= now:
                            busy.pop(0)
                    bisect.insort(busy, (start, end))
            s_stats, d_stats = stats[src], stats[dst]
            s_stats.messages += 1
            s_stats.bytes_sent += nbytes
            d_stats.bytes_received += nbytes
            key = src * world + dst if mirror is None else src * peers + send_item.peer
            link_bytes[key] = link_bytes.get(key, 0) + nbytes
            if timeline is not None:
                timeline.messages.append((src, dst, nbytes, start, end, index[src], index[dst]))
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
        return SimStats([replace(stats[rank % world]) for rank in range(peers)], max(post_chain),
                        MirroredLinks(link_bytes, mirror[0], peers, world), mirrored=mirror[0])
    return SimStats(stats, max(post_chain, default=0), link_bytes, timeline)


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
