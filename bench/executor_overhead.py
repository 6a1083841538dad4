"""Where the time goes: the executor's own cost per step, and a profile of one big all_reduce.

    python -m ringcoll.bench.executor_overhead [--out bench/results]

1. Executor overhead: rank 0's schedule of each all_reduce algorithm, run by the P2P
   executor over a transport that moves nothing (every send and receive completes at once),
   so what is timed is ringcoll's Python per step: posting, waiting, the independence check
   for steps in flight, and the local reductions on tiny segments.
2. The same for a whole call through the public API (argument checks, the choice, the plan).
3. A cProfile of one 64 MiB float32 all_reduce (ring) on a local 4-rank gloo cluster, rank 0.
4. The floor of one step: a bare gloo P2P exchange against the built-in barrier.
5. A 1 KiB broadcast four ways (bare P2P, built-in, ringcoll with a new and a reused plan):
   wall and main-thread CPU time per rank.
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
from ringcoll.collectives import BUILDERS
from ringcoll.collectives._common import Context
from ringcoll.executor import P2PExecutor


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
        context = Context(0, world, executor)
        out = {}
        for algorithm in ringcoll.algorithms("all_reduce"):
            tensor = torch.ones(numel)
            plan = BUILDERS["all_reduce"](context, tensor, algorithm=algorithm)
            steps = len(plan.steps())
            executor.run(plan)                                   # warm: scratch, schedule cache
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                executor.run(plan)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            out[algorithm] = {"steps": steps, "us_per_call": median * 1e6,
                              "us_per_step": median * 1e6 / max(steps, 1)}
        return out
    finally:
        os.environ.pop("RINGCOLL_SEGMENT", None)


def api_overhead(world: int = 4, numel: int = 256, repeats: int = 2000) -> dict:
    """Microseconds per public call (checks, choice, plan) with the null transport."""
    from ringcoll.work import submit

    executor = P2PExecutor(NullTransport(), rank=0, world=world, backend="null")
    context = Context(0, world, executor)
    tensor = torch.ones(numel)
    out = {}
    for algorithm in ringcoll.algorithms("all_reduce"):
        def call():
            context.submit(BUILDERS["all_reduce"](context, tensor, algorithm=algorithm), False)
        for _ in range(50):
            call()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        out[algorithm] = (time.perf_counter() - start) / repeats * 1e6
    del submit
    return out


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
    from ringcoll.collectives import _common

    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(numel, dtype=torch.float32)
    group = dist.group.WORLD
    kept = _common.PERSISTENT_PLANS

    def bare():
        works = [group.send([tensor], peer, 7) for peer in range(1, world)] if rank == 0 \
            else [group.recv([tensor], 0, 7)]
        for work in works:
            work.wait()

    def fresh():
        _common.PERSISTENT_PLANS = 0
        try:
            ringcoll.broadcast(tensor, src=0, algorithm="linear")
        finally:
            _common.PERSISTENT_PLANS = kept

    ways = {"bare gloo p2p": bare, "built-in": lambda: dist.broadcast(tensor, 0),
            "ringcoll, new plan": fresh,
            "ringcoll, reused plan": lambda: ringcoll.broadcast(tensor, src=0, algorithm="linear")}
    wall, cpu = _in_turn(ways, rounds, warmup=5)
    return {name: {"wall_us": statistics.median(wall[name]) * 1e6,
                   "cpu_us": statistics.fmean(cpu[name]) * 1e6} for name in ways}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results")
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
    floor = {name: max(rank[name] for rank in floors) for name in floors[0]}
    print(f"1 KiB broadcast at {args.np} ranks, per rank: median wall us / mean main-thread CPU us")
    for name in small[0]:
        print(f"  {name:22s} " + "  ".join(f"{r[name]['wall_us']:6.0f}/{r[name]['cpu_us']:4.0f}" for r in small))
    print(profile.split("\n")[0])
    print(f"one step's floor at {args.np} ranks (median ms, slowest rank): " +
          ", ".join(f"{name} {ms:.2f}" for name, ms in floor.items()))
    with open(os.path.join(args.out, "executor_overhead.json"), "w") as handle:
        json.dump({"per_step": steps, "per_call_us": calls, "message_floor_ms": floor,
                   "broadcast_1KiB_per_rank": small,
                   "world": args.np, "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d")}, handle, indent=2)
    with open(os.path.join(args.out, "profile_all_reduce_64MiB.txt"), "w") as handle:
        handle.write(profile)


if __name__ == "__main__":
    main()
