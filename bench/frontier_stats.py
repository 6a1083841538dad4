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
import os
import sys
import time
from collections import defaultdict, deque
from typing import Dict, List, Sequence, Tuple

from ringcoll import registry
from ringcoll.schedule import Layout, Reduce, Send, Step


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


#: (collective, algorithm, extra layout parameters, worlds) measured; hierarchical on nodes of 8
CASES = [
    ("all_reduce", "direct", {}, (64,)),
    ("all_reduce", "swing_latency", {}, (64, 1024)),
    ("all_reduce", "swing_bandwidth", {}, (64, 1024)),
    ("all_reduce", "bine", {}, (64, 1024)),
    ("all_reduce", "torus2d", {}, (64, 1024)),
    ("all_reduce", "hierarchical", {"local_size": 8}, (64, 1024)),
    ("all_reduce", "rabenseifner", {}, (64, 1024)),
    ("all_reduce", "ring", {}, (64,)),
    ("reduce_scatter", "direct", {}, (64,)),
    ("reduce_scatter", "pat", {}, (64, 1024)),
    ("reduce_scatter", "hierarchical", {"local_size": 8}, (64, 1024)),
    ("reduce_scatter", "recursive_halving", {}, (64, 1024)),
    ("all_gather", "direct", {}, (64,)),
    ("all_gather", "pat", {}, (64, 1024)),
    ("all_gather", "hierarchical", {"local_size": 8}, (64, 1024)),
    ("all_gather", "bruck", {}, (64, 1024)),
    ("broadcast", "bine", {"root": 0}, (64, 1024)),
    ("broadcast", "hierarchical", {"root": 0, "local_size": 8}, (64, 1024)),
    ("broadcast", "binomial", {"root": 0}, (64, 1024)),
    ("reduce", "bine", {"root": 0}, (64, 1024)),
    ("reduce", "hierarchical", {"root": 0, "local_size": 8}, (64, 1024)),
    ("reduce", "binomial", {"root": 0}, (64, 1024)),
]
SIZES = (64 * 1024, 16 * 1024 * 1024)       # n in bytes (float32): the vector, or the gathered total
ALPHA, BETA, GAMMA = 5e-6, 1 / 10e9, 1 / 20e9   # the simulator's and auto's default machine


def bounds(collective: str, world: int, nbytes: int) -> Tuple[int, float, float]:
    """Chan et al. 2007's lower bounds: messages on the critical path, bytes a rank must
    send, bytes it must reduce (STUDY-NOTES §3)."""
    share = (world - 1) / world * nbytes
    wire = {"all_reduce": 2 * share, "broadcast": nbytes, "reduce": nbytes}.get(collective, share)
    reduced = share if collective in ("all_reduce", "reduce_scatter", "reduce") else 0.0
    return (world - 1).bit_length(), wire, reduced


def statistics(collective: str, name: str, params: dict, world: int, nbytes: int) -> dict:
    from ringcoll.selection import segment_elements
    from ringcoll.topology import even_nodes

    params = dict(params)
    local = params.pop("local_size", None)
    if local:
        params["nodes"] = even_nodes(world, local)
        os.environ["RINGCOLL_LOCAL_SIZE"] = str(local)       # the closed form reads it
    params.setdefault("segment", segment_elements(collective, name, 4))     # as the builders add it
    try:
        numel = nbytes // 4
        schedules = schedules_of(collective, name, world, numel, params)
        clock, _ = port_time(schedules, 4, ALPHA, BETA, GAMMA)
        model = registry.get(collective, name).cost(world, nbytes).time(ALPHA, BETA, GAMMA)
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
    rounds = max(sum(1 for st in s if st.comms) for s in schedules)
    messages = max(sum(1 for st in s for c in st.comms if isinstance(c, Send)) for s in schedules)
    sent = max(sum(c.buf.numel * 4 for st in s for c in st.comms if isinstance(c, Send)) for s in schedules)
    reduced = max(sum(op.dst.numel * 4 * len(op.srcs) for st in s for op in st.local if isinstance(op, Reduce))
                  for s in schedules)
    lat, wire, red = bounds(collective, world, nbytes)
    bound_time = lat * ALPHA + wire * BETA + red * GAMMA
    return {"collective": collective, "algorithm": name, "world": world, "bytes": nbytes,
            "local_size": local, "steps": rounds, "messages": messages,
            "steps/lg p": rounds / lat, "messages/lg p": messages / lat,
            "sent/bound": sent / wire, "reduced/bound": reduced / red if red else None,
            "time_us": clock * 1e6, "model_us": model * 1e6, "time/bound": clock / bound_time}


def _fmt(value) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv=None) -> int:
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    rows = []
    started = time.perf_counter()
    for collective, name, params, worlds in CASES:
        for world in worlds:
            for nbytes in SIZES:
                rows.append(statistics(collective, name, params, world, nbytes))
                print(f"{collective}/{name} p={world} n={nbytes}: {rows[-1]['time/bound']:.3g}x bound",
                      file=sys.stderr)
    with open(os.path.join(out, "frontier_stats.json"), "w") as handle:
        json.dump({"machine": {"alpha": ALPHA, "beta": BETA, "gamma": GAMMA}, "rows": rows}, handle, indent=1)
    columns = ["collective", "algorithm", "world", "bytes", "steps", "messages", "steps/lg p",
               "sent/bound", "reduced/bound", "time_us", "model_us", "time/bound"]
    lines = ["# Frontier algorithms: cost-only statistics against the lower bounds", "",
             f"Port-limited clock (bench/frontier_stats.py), α = {ALPHA * 1e6:g} µs, "
             f"{1 / BETA / 1e9:g} GB/s on the wire, {1 / GAMMA / 1e9:g} GB/s reducing; float32; "
             "hierarchical on nodes of 8 ranks. Bounds: Chan et al. 2007 (⌈lg p⌉α, the bandwidth "
             "and compute terms of STUDY-NOTES §3). `sent/bound`: the most bytes a rank sends ÷ the "
             "β bound; `reduced/bound`: the most bytes a rank reduces ÷ (p-1)/p·n; `model_us`: the "
             "registered closed form. Deterministic: no timing of this machine is involved. The "
             "flat machine cannot show what Swing, Bine and the hierarchical algorithms gain on a "
             "torus or between nodes (fewer hops, cheaper intra-node links): here they can only tie "
             "with or lose to the classic algorithms; a per-level machine (the study work's) is "
             "where their gains show. "
             f"Computed in {time.perf_counter() - started:.0f} s.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row[c]) for c in columns) + " |")
    with open(os.path.join(out, "frontier_stats.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
