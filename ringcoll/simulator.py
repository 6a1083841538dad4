"""The simulator: every rank's plan in one process, on real data, no process group.

Sends and receives are matched in posting order per (source, destination) pair, exactly as
gloo and NCCL match them; a step completes when all its transfers are matched, then its
local operations run. An unmatched transfer, a size mismatch or a deadlock is an error naming
the rank, the step and the peer. Alongside the data, it keeps statistics per rank and an
α-β-γ clock: a message leaves when both ends have posted it and takes α + nβ; a step's
local reductions take γ per byte reduced.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Sequence, Tuple

import torch

from .local import run_local
from .plan import Plan
from .schedule import Recv, Send, extents


class ScheduleError(RuntimeError):
    """A schedule that cannot run: unmatched or mismatched transfers, or a deadlock."""


@dataclass
class RankStats:
    steps: int = 0
    messages: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_reduced: int = 0
    time: float = 0.0       # α-β-γ clock when this rank finished, seconds


@dataclass
class SimStats:
    ranks: List[RankStats] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return max((r.steps for r in self.ranks), default=0)

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
    def bytes_reduced(self) -> int:
        return sum(r.bytes_reduced for r in self.ranks)

    @property
    def time(self) -> float:
        return max((r.time for r in self.ranks), default=0.0)


@dataclass(frozen=True)
class Machine:
    """The α-β-γ machine the simulator's clock runs on (defaults: a modest cluster)."""

    alpha: float = 5e-6           # seconds per message
    beta: float = 1 / 10e9        # seconds per byte on the wire
    gamma: float = 1 / 20e9       # seconds per byte reduced


def run_plans(plans: Sequence[Plan], machine: Machine = Machine()) -> SimStats:
    """Run every rank's plan to completion; ``plans[r]`` is rank r's."""
    world = len(plans)
    schedules = [plan.steps() for plan in plans]
    buffers = []
    for plan, steps in zip(plans, schedules):
        bufs = dict(plan.buffers)
        for name, need in extents(steps).items():
            if name not in bufs:
                bufs[name] = torch.empty(need, dtype=plan.dtype, device=plan.device)
            elif bufs[name].numel() < need:
                raise ScheduleError(f"{plan.describe}: rank {plan.rank} reaches element {need} of "
                                    f"buffer {name!r}, which holds {bufs[name].numel()}")
        buffers.append(bufs)
    stats = [RankStats() for _ in range(world)]
    position = [0] * world              # index of the step each rank is in
    outstanding = [0] * world           # its unmatched transfers
    posted_at = [0.0] * world           # clock when the current step was posted
    step_end = [0.0] * world            # latest message completion in the current step
    sends: Dict[Tuple[int, int], Deque] = defaultdict(deque)
    recvs: Dict[Tuple[int, int], Deque] = defaultdict(deque)
    ready: Deque[int] = deque()

    def view(rank, buf):
        return buffers[rank][buf.name][buf.start:buf.stop]

    def describe(rank):
        return f"{plans[rank].describe}: rank {rank} step {position[rank] + 1}/{len(schedules[rank])}"

    def complete(rank, when):
        step_end[rank] = max(step_end[rank], when)
        outstanding[rank] -= 1
        if outstanding[rank] == 0:
            ready.append(rank)

    def match(src, dst, send_item, recv_item):
        source, target = view(src, send_item.buf), view(dst, recv_item.buf)
        if source.numel() != target.numel():
            raise ScheduleError(
                f"{describe(src)} sends {send_item.buf!r} ({source.numel()} elements) to rank {dst}, "
                f"whose matching receive at step {position[dst] + 1} is {recv_item.buf!r} "
                f"({target.numel()} elements)")
        target.copy_(source)
        nbytes = source.numel() * source.element_size()
        when = max(posted_at[src], posted_at[dst]) + machine.alpha + nbytes * machine.beta
        stats[src].messages += 1
        stats[src].bytes_sent += nbytes
        stats[dst].bytes_received += nbytes
        complete(src, when)
        complete(dst, when)

    def post(rank):
        """Post the rank's current step (or finish it at once when it has no transfers)."""
        steps = schedules[rank]
        if position[rank] >= len(steps):
            return
        st = steps[position[rank]]
        posted_at[rank] = stats[rank].time
        step_end[rank] = stats[rank].time
        outstanding[rank] = len(st.comms) + 1       # +1: held until every transfer is posted
        for item in st.comms:
            if not 0 <= item.peer < world or item.peer == rank:
                raise ScheduleError(f"{describe(rank)} names peer {item.peer}, which is not "
                                    f"another rank of a world of {world}")
            if isinstance(item, Send):
                key = (rank, item.peer)
                if recvs[key]:
                    match(rank, item.peer, item, recvs[key].popleft()[1])
                else:
                    sends[key].append((rank, item))
            elif isinstance(item, Recv):
                key = (item.peer, rank)
                if sends[key]:
                    match(item.peer, rank, sends[key].popleft()[1], item)
                else:
                    recvs[key].append((rank, item))
            else:
                raise ScheduleError(f"{describe(rank)}: {item!r} is not a Send or a Recv")
        complete(rank, posted_at[rank])

    for plan in plans:
        for before in plan.before:
            before()
    for rank in range(world):
        post(rank)
    while ready:
        rank = ready.popleft()
        st = schedules[rank][position[rank]]
        reduced = run_local(plans[rank].op, buffers[rank], st.local) if st.local else 0
        stats[rank].bytes_reduced += reduced
        stats[rank].steps += 1
        stats[rank].time = step_end[rank] + reduced * machine.gamma
        position[rank] += 1
        post(rank)

    stuck = [r for r in range(world) if position[r] < len(schedules[r])]
    if stuck:
        lines = []
        for r in stuck:
            waiting = [f"{'send to' if isinstance(i, Send) else 'receive from'} peer {i.peer} {i.buf!r}"
                       for key, queue in list(sends.items()) + list(recvs.items())
                       for owner, i in queue if owner == r]
            lines.append(f"  {describe(r)} waits on: {', '.join(waiting) or 'nothing posted'}")
        raise ScheduleError("deadlock: no rank can make progress\n" + "\n".join(lines))
    for plan in plans:
        for after in plan.after:
            after()
    return SimStats(stats)
