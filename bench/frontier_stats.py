"""Cost-only statistics of the frontier algorithms at p = 64 and 1024, against the lower bounds.

No data moves: every rank's schedule is built (the same schedules the executors run) and
timed on the agreed port-limited clock (one send port and one receive port per rank; a
message of n bytes holds both for α + nβ once both ends have posted it and both ports are
free, messages queueing on a port in posting order; γ per byte reduced after a step's
transfers). :func:`port_time` is that clock; the study work's cost-only simulator replaces
it after the merge (``ringcoll.simulate`` with its port clock gives the same times).

    python bench/frontier_stats.py            # writes bench/results/frontier_stats.{json,md}

Ratios (Chan et al. 2007, as STUDY-NOTES §3 suggests): steps / ⌈lg p⌉, the largest bytes a
rank sends / the bandwidth bound, the largest bytes a rank reduces / (p-1)/p·n, and the time
on the default machine / the lower bound's time.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import defaultdict, deque
from typing import Dict, List, Sequence, Tuple

from ringcoll import registry
from ringcoll.schedule import Layout, Recv, Reduce, Send, Step


def port_time(schedules: Sequence[Sequence[Step]], itemsize: int, alpha: float, beta: float,
              gamma: float = 0.0) -> Tuple[float, List[float]]:
    """The finishing time of every rank's schedule on the port-limited clock (module
    docstring), and the largest. A message starts when both ends have posted its step, it
    heads its sender's send queue and its receiver's receive queue, and both ports are free.
    ValueError when the schedules cannot finish (a deadlock or an unmatched transfer)."""
    world = len(schedules)
    sends: List[List[tuple]] = [[] for _ in range(world)]     # (key, step index, nbytes)
    recvs: List[List[tuple]] = [[] for _ in range(world)]
    pending = [[0] * len(s) for s in schedules]              # transfers left per step
    reduced = [[0] * len(s) for s in schedules]
    count: Dict[tuple, int] = defaultdict(int)
    for rank, steps in enumerate(schedules):
        for index, st in enumerate(steps):
            for item in st.comms:
                src, dst = (rank, item.peer) if isinstance(item, Send) else (item.peer, rank)
                pair = (src, dst, isinstance(item, Send))
                key = (src, dst, count[pair])
                count[pair] += 1
                (sends if isinstance(item, Send) else recvs)[rank].append((key, index, item.buf.numel * itemsize))
                pending[rank][index] += 1
            reduced[rank][index] = sum(op.dst.numel * itemsize * len(op.srcs)
                                       for op in st.local if isinstance(op, Reduce))
    send_at = {key: (rank, index, nbytes) for rank in range(world) for key, index, nbytes in sends[rank]}
    recv_at = {key: (rank, index) for rank in range(world) for key, index, _ in recvs[rank]}
    if set(send_at) != set(recv_at):
        raise ValueError(f"unmatched transfers: {sorted(set(send_at) ^ set(recv_at))[:4]}")
    position = [0] * world          # the step each rank has posted
    posted = [0.0] * world
    step_end = [0.0] * world
    send_head, recv_head = [0] * world, [0] * world
    send_free, recv_free = [0.0] * world, [0.0] * world
    finish = [0.0] * world
    work: deque = deque()

    def post(rank: int, when: float) -> None:
        """Post the rank's steps from ``position`` on, finishing those without transfers."""
        while position[rank] < len(schedules[rank]):
            posted[rank] = step_end[rank] = when
            if pending[rank][position[rank]]:
                work.append(rank)
                return
            when += reduced[rank][position[rank]] * gamma
            position[rank] += 1
        finish[rank] = when

    def done(rank: int, index: int, end: float) -> None:
        step_end[rank] = max(step_end[rank], end)
        pending[rank][index] -= 1
        if pending[rank][index] == 0 and index == position[rank]:
            when = step_end[rank] + reduced[rank][index] * gamma
            position[rank] += 1
            post(rank, when)

    for rank in range(world):
        post(rank, 0.0)
    while work:
        rank = work.popleft()
        for queue, head in ((sends, send_head), (recvs, recv_head)):
            while head[rank] < len(queue[rank]):
                key = queue[rank][head[rank]][0]
                src, src_step, nbytes = send_at[key]
                dst, dst_step = recv_at[key]
                if not (sends[src][send_head[src]][0] == key and recv_head[dst] < len(recvs[dst])
                        and recvs[dst][recv_head[dst]][0] == key
                        and position[src] >= src_step and position[dst] >= dst_step):
                    break
                start = max(posted[src] if position[src] == src_step else 0.0,
                            posted[dst] if position[dst] == dst_step else 0.0,
                            send_free[src], recv_free[dst])
                end = start + alpha + nbytes * beta
                send_free[src] = recv_free[dst] = end
                send_head[src] += 1
                recv_head[dst] += 1
                work.extend((src, dst))
                done(src, src_step, end)
                done(dst, dst_step, end)
    stuck = [r for r in range(world) if position[r] < len(schedules[r])]
    if stuck:
        raise ValueError(f"deadlock: ranks {stuck[:8]} cannot finish")
    return max(finish, default=0.0), finish


def schedules_of(collective: str, name: str, world: int, numel: int, params: dict) -> List[List[Step]]:
    algorithm = registry.get(collective, name)
    layout = Layout(numel, params)
    return [list(algorithm.schedule(rank, world, layout)) for rank in range(world)]
