"""Where the time goes: the executor's own cost per step, and a profile of one big all_reduce.

    python -m experiments.executor_overhead [--out bench/results/experiments]

1. Executor overhead: rank 0's schedule of each all_reduce algorithm, run by the P2P
   executor over a transport that moves nothing (every send and receive completes at once),
   so what is timed is ringcoll's Python per step: posting, waiting, the independence check
   for steps in flight, and the local reductions on tiny segments.
2. The same for a whole call through the public API (argument checks, the choice, the plan).
3. A cProfile of one 64 MiB float32 all_reduce (ring) on a local 4-rank gloo cluster, rank 0.
4. The floor of one step: a bare gloo P2P exchange against the built-in barrier.
5. A 1 KiB broadcast four ways (bare P2P, built-in, ringcoll with a new and a reused plan):
   wall and main-thread CPU time per rank.
6. A 4 KiB all_to_all_single three ways (its floor by bare P2P from Python, the built-in,
   ringcoll reused): the slowest rank's median, the median of its fast rounds, the share of
   slow ones.
7. A repeated call through the public API with the null transport, warm and cold.
8. Each thread's CPU time per round of a barrier and that all_to_all_single, built-in and
   ringcoll: how much of the machine gloo's own threads take.
Writes ``executor_overhead.json`` and ``profile_all_reduce_64MiB.txt`` under ``--out``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

import ringcoll
from ringcoll.api import BUILDERS
from ringcoll.api.common import executor_context
from ringcoll.runtime.executor import P2PExecutor


class _Done:
    def wait(self, timeout=None):
        return True


class NullTransport:
    """A ProcessGroup look-alike whose transfers complete at once and move nothing."""

    def send(self, tensors, peer, tag):
        return _Done()

    def recv(self, tensors, peer, tag):
        return _Done()


def per_step_overhead(world: int = 4, numel: int = 1 << 16, segment_bytes: int = 1024,
                      repeats: int = 20) -> dict:
    """Microseconds per step of each all_reduce algorithm's rank-0 schedule, null transport."""
    os.environ["RINGCOLL_SEGMENT"] = str(segment_bytes)
    try:
        executor = P2PExecutor(NullTransport(), rank=0, world=world, backend="null")
        out = {}
        for algorithm in ringcoll.algorithms("all_reduce"):
            tensor = torch.ones(numel)
            plan = BUILDERS["all_reduce"](executor_context(executor), tensor, algorithm=algorithm)
            steps = len(plan.steps())
            executor.execute(plan)                               # warm: scratch, schedule cache
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                executor.execute(plan)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            out[algorithm] = {"steps": steps, "us_per_call": median * 1e6,
                              "us_per_step": median * 1e6 / max(steps, 1)}
        return out
    finally:
        os.environ.pop("RINGCOLL_SEGMENT", None)


def api_overhead(world: int = 4, numel: int = 256, repeats: int = 2000) -> dict:
    """Microseconds per public call (checks, choice, plan) with the null transport."""
    from ringcoll.runtime.work import submit

    executor = P2PExecutor(NullTransport(), rank=0, world=world, backend="null")
    tensor = torch.ones(numel)
    out = {}
    for algorithm in ringcoll.algorithms("all_reduce"):
        def call():
            context = executor_context(executor)
            context.submit(BUILDERS["all_reduce"](context, tensor, algorithm=algorithm), False)
        out[algorithm] = _warm_us(call, repeats)
    del submit
    return out


def _warm_us(call, repeats: int, warmup: int = 50) -> float:
    """Microseconds per ``call()`` in a tight loop, after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def _profiled_all_reduce(numel: int) -> str:
    import torch.distributed as dist

    tensor = torch.ones(numel)
    for _ in range(2):
        ringcoll.all_reduce(tensor, algorithm="ring")
    dist.barrier()
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    ringcoll.all_reduce(tensor, algorithm="ring")
    profile.disable()
    elapsed = time.perf_counter() - start
    dist.barrier()
    builtin_start = time.perf_counter()
    dist.all_reduce(tensor)
    builtin = time.perf_counter() - builtin_start
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
    return (f"rank {dist.get_rank()}: ringcoll ring {elapsed * 1e3:.1f} ms, built-in "
            f"{builtin * 1e3:.1f} ms (one call each, after warm-up)\n" + text.getvalue())


def _message_floor(rounds: int = 30) -> dict:
    """Median ms of one bare gloo P2P exchange (isend right + irecv left, 4 bytes) against the
    built-in barrier and a 4-byte built-in all_reduce: the floor every P2P step pays here."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out, into = torch.ones(1), torch.empty(1)
    group = dist.group.WORLD

    def exchange():
        works = [group.send([out], (rank + 1) % world, 7), group.recv([into], (rank - 1) % world, 7)]
        for work in works:
            work.wait()

    cases = {"p2p exchange": exchange, "built-in barrier": dist.barrier,
             "built-in all_reduce 4 B": lambda: dist.all_reduce(out)}
    wall, _ = _in_turn(cases, rounds, warmup=3)
    return {name: statistics.median(values) * 1e3 for name, values in wall.items()}


def _in_turn(cases: dict, rounds: int, warmup: int) -> tuple:
    """Each case once per round, in turn, a barrier before each; after ``warmup`` rounds, the
    seconds of each call: ({case: wall times}, {case: main-thread CPU times})."""
    import torch.distributed as dist

    wall = {name: [] for name in cases}
    cpu = {name: [] for name in cases}
    for round_ in range(rounds + warmup):
        for name, fn in cases.items():
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.thread_time()
            fn()
            if round_ >= warmup:
                cpu[name].append(time.thread_time() - start_cpu)
                wall[name].append(time.perf_counter() - start)
    return wall, cpu


def _small_calls(rounds: int = 300, numel: int = 256) -> dict:
    """A 1 KiB broadcast from rank 0, four ways in turn, a barrier before each: bare gloo P2P
    (the root sends to each peer: a one-step broadcast's floor), the built-in, ringcoll's
    ``linear`` building its plan on every call (``PERSISTENT_PLANS = 0``) and reusing it.
    Per way, this rank's median wall time and mean main-thread CPU time (``time.thread_time``)
    in us. A rank leaves the barrier with cold caches: each us of Python it then runs costs
    several, and with 4 ranks on 2 cores the others wait for it."""
    import torch.distributed as dist
    from ringcoll.api import common

    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(numel, dtype=torch.float32)
    group = dist.group.WORLD
    kept = common.PERSISTENT_PLANS

    def bare():
        works = [group.send([tensor], peer, 7) for peer in range(1, world)] if rank == 0 \
            else [group.recv([tensor], 0, 7)]
        for work in works:
            work.wait()

    def fresh():
        common.PERSISTENT_PLANS = 0
        try:
            ringcoll.broadcast(tensor, src=0, algorithm="linear")
        finally:
            common.PERSISTENT_PLANS = kept

    ways = {"bare gloo p2p": bare, "built-in": lambda: dist.broadcast(tensor, 0),
            "ringcoll, new plan": fresh,
            "ringcoll, reused plan": lambda: ringcoll.broadcast(tensor, src=0, algorithm="linear")}
    wall, cpu = _in_turn(ways, rounds, warmup=5)
    return {name: {"wall_us": statistics.median(wall[name]) * 1e6,
                   "cpu_us": statistics.fmean(cpu[name]) * 1e6} for name in ways}


def _reused_calls(world: int = 4, numel: int = 1024, repeats: int = 2000, cold_rounds: int = 300) -> dict:
    """A repeated small call through the public API, its plan reused, with the null transport
    (run on a 1-rank gloo group whose executor is swapped for a 4-rank one whose transfers
    complete at once): µs per call warm (a tight loop) and cold (the median of calls after a
    32 MiB write has flushed the caches, as a rank leaving a wait finds them here)."""
    import torch.distributed as dist
    from ringcoll.api import common

    group = dist.group.WORLD
    kept = common._executors.get(group)
    common._executors[group] = P2PExecutor(NullTransport(), rank=0, world=world, backend="gloo")
    common._last = (lambda: None, None)
    data = torch.arange(numel * world, dtype=torch.float32)
    into = torch.empty_like(data)
    parts = [torch.arange(numel, dtype=torch.float32) + r for r in range(world)]
    calls = {"broadcast": lambda: ringcoll.broadcast(data[:numel], 0),
             "scatter (list of separate tensors)": lambda: ringcoll.scatter(into[:numel], parts, src=0),
             "all_to_all_single": lambda: ringcoll.all_to_all_single(into, data),
             "all_reduce": lambda: ringcoll.all_reduce(data[:numel]),
             "barrier": ringcoll.barrier}
    flush = torch.ones(8 << 20)
    out = {}
    try:
        for name, call in calls.items():
            warm = _warm_us(call, repeats)
            cold = []
            for _ in range(cold_rounds):
                flush.add_(1)
                start = time.perf_counter()
                call()
                cold.append(time.perf_counter() - start)
            out[name] = {"warm_us": warm, "cold_us": statistics.median(cold) * 1e6}
    finally:
        common._executors.pop(group, None)
        if kept is not None:
            common._executors[group] = kept
        common._last = (lambda: None, None)
    return out


def _fast_rounds(times: list, slow: float = 2e-3) -> dict:
    """The median of the rounds under ``slow`` seconds and the share of rounds above it."""
    fast = [t for t in times if t < slow]
    return {"median_us": statistics.median(times) * 1e6,
            "fast_median_us": statistics.median(fast) * 1e6 if fast else None,
            "slow_share": 1 - len(fast) / len(times)}


def _all_to_all_floor(rounds: int = 300, numel: int = 1024) -> dict:
    """A 4 KiB all_to_all_single three ways in turn, a barrier before each: its floor from
    Python (the p-1 sends and p-1 receives each rank posts, by bare gloo P2P, then the own
    block copied), the built-in, ringcoll (the plan reused). Per way, this rank's wall times."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    data = torch.arange(numel * world, dtype=torch.float32)
    into = torch.empty_like(data)
    sends, recvs = list(data.view(torch.uint8).chunk(world)), list(into.view(torch.uint8).chunk(world))

    def bare():
        works = []
        for step in range(1, world):
            right, left = (rank + step) % world, (rank - step) % world
            works += [group.send([sends[right]], right, 9), group.recv([recvs[left]], left, 9)]
        for work in works:
            work.wait()
        recvs[rank].copy_(sends[rank])

    ways = {"bare gloo p2p": bare, "built-in": lambda: dist.all_to_all_single(into, data),
            "ringcoll, reused plan": lambda: ringcoll.all_to_all_single(into, data)}
    wall, _ = _in_turn(ways, rounds, warmup=10)
    return wall


def _thread_times() -> dict:
    """CPU seconds (user + system) and context switches of each thread of this process, by
    thread name (Linux /proc; empty elsewhere)."""
    out: dict = {}
    base = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(base):
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as handle:
                stat = handle.read()
            with open(f"{base}/{tid}/status") as handle:
                status = handle.read()
        except OSError:
            continue                    # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        switches = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))}
        row = out.setdefault(name, [0.0, 0, 0])
        row[0] += (int(fields[11]) + int(fields[12])) / tick
        row[1] += switches.get("voluntary_ctxt_switches", 0)
        row[2] += switches.get("nonvoluntary_ctxt_switches", 0)
    return out


def _thread_cpu(rounds: int = 500, numel: int = 1024) -> dict:
    """Where the CPU goes: each thread's CPU time and context switches per round of a barrier
    and a 4 KiB all_to_all_single, the built-in's rounds and then ringcoll's (sampled at the
    clock tick, so a mean over many rounds). gloo's own threads (``gloo_tcp_loop``, which
    moves every message of the process, and the built-in's ``pt_gloo_runloop`` workers) are
    the same for both; the calling thread (``python``) runs ringcoll's part."""
    import torch.distributed as dist

    world = dist.get_world_size()
    data = torch.arange(numel * world, dtype=torch.float32)
    into = torch.empty_like(data)
    out = {}
    for name, call in (("built-in", lambda: dist.all_to_all_single(into, data)),
                       ("ringcoll", lambda: ringcoll.all_to_all_single(into, data))):
        for _ in range(20):
            dist.barrier()
            call()
        before = _thread_times()
        for _ in range(rounds):
            dist.barrier()
            call()
        after = _thread_times()
        out[name] = {thread: {"cpu_us": (row[0] - before.get(thread, [0, 0, 0])[0]) / rounds * 1e6,
                              "voluntary": (row[1] - before.get(thread, [0, 0, 0])[1]) / rounds,
                              "involuntary": (row[2] - before.get(thread, [0, 0, 0])[2]) / rounds}
                     for thread, row in after.items()}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/experiments")
    parser.add_argument("--np", type=int, default=4)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    steps = per_step_overhead()
    calls = api_overhead()
    print("executor overhead, null transport (rank 0 of 4, 1 KiB segments):")
    for algorithm, row in steps.items():
        print(f"  {algorithm:20s} {row['steps']:5d} steps  {row['us_per_step']:7.1f} us/step")
    print("public call overhead, null transport, 1 KiB tensor:")
    for algorithm, us in calls.items():
        print(f"  {algorithm:20s} {us:7.1f} us/call")
    with ringcoll.launch(args.np) as cluster:
        profile = cluster.run(_profiled_all_reduce, 16 * 1024 * 1024)[0]
        floors = cluster.run(_message_floor)
        small = cluster.run(_small_calls)
        alltoall = cluster.run(_all_to_all_floor)
        threads = cluster.run(_thread_cpu)
    with ringcoll.launch(1) as cluster:
        reused = cluster.run(_reused_calls)[0]
    slowest = {name: [max(rank[name][i] for rank in alltoall) for i in range(len(alltoall[0][name]))]
               for name in alltoall[0]}
    alltoall = {name: _fast_rounds(times) for name, times in slowest.items()}
    floor = {name: max(rank[name] for rank in floors) for name in floors[0]}
    print(f"1 KiB broadcast at {args.np} ranks, per rank: median wall us / mean main-thread CPU us")
    for name in small[0]:
        print(f"  {name:22s} " + "  ".join(f"{r[name]['wall_us']:6.0f}/{r[name]['cpu_us']:4.0f}" for r in small))
    print("4 KiB all_to_all_single at 4 ranks, slowest rank per round: median / median of rounds "
          "under 2 ms / share of rounds over 2 ms")
    for name, row in alltoall.items():
        print(f"  {name:22s} {row['median_us']:6.0f} us  {row['fast_median_us'] or 0:6.0f} us  {row['slow_share']:.2f}")
    print("CPU per round of barrier + 4 KiB all_to_all_single, rank 0, by thread: us (voluntary / "
          "involuntary switches)")
    for name, rows in threads[0].items():
        print(f"  {name:10s} " + "  ".join(f"{thread} {row['cpu_us']:5.0f} ({row['voluntary']:.1f}/{row['involuntary']:.1f})"
                                           for thread, row in rows.items() if row["cpu_us"] or row["voluntary"]))
    print("a repeated call, plan reused, null transport (4 KiB; scatter 1 KiB blocks): us warm / cold")
    for name, row in reused.items():
        print(f"  {name:36s} {row['warm_us']:6.1f} / {row['cold_us']:6.1f}")
    print(profile.split("\n")[0])
    print(f"one step's floor at {args.np} ranks (median ms, slowest rank): " +
          ", ".join(f"{name} {ms:.2f}" for name, ms in floor.items()))
    with open(os.path.join(args.out, "executor_overhead.json"), "w") as handle:
        json.dump({"per_step": steps, "per_call_us": calls, "message_floor_ms": floor,
                   "broadcast_1KiB_per_rank": small,
                   "all_to_all_single_4KiB_slowest_rank": alltoall,
                   "reused_call_null_transport_us": reused,
                   "thread_cpu_per_round_barrier_all_to_all_4KiB": threads,
                   "world": args.np, "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d")}, handle, indent=2)
    with open(os.path.join(args.out, "profile_all_reduce_64MiB.txt"), "w") as handle:
        handle.write(profile)


if __name__ == "__main__":
    main()
