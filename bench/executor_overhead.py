"""Where the time goes: the executor's own cost per step, and a profile of one big all_reduce.

    python -m ringcoll.bench.executor_overhead [--out bench/results]

1. Executor overhead: rank 0's schedule of each all_reduce algorithm, run by the P2P
   executor over a transport that moves nothing (every send and receive completes at once),
   so what is timed is ringcoll's Python per step: posting, waiting, the independence check
   for steps in flight, and the local reductions on tiny segments.
2. The same for a whole call through the public API (argument checks, the choice, the plan).
3. A cProfile of one 64 MiB float32 all_reduce (ring) on a local 4-rank gloo cluster, rank 0.
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
    print(profile.split("\n")[0])
    with open(os.path.join(args.out, "executor_overhead.json"), "w") as handle:
        json.dump({"per_step": steps, "per_call_us": calls, "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d")}, handle, indent=2)
    with open(os.path.join(args.out, "profile_all_reduce_64MiB.txt"), "w") as handle:
        handle.write(profile)


if __name__ == "__main__":
    main()
