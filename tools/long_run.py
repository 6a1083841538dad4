"""Long runs: 10^4 consecutive mixed calls on one group, with each rank's resident memory, open
file descriptors and threads sampled as it goes (issue 10 item 9).

    python -m tools.long_run [--calls 10000] [--world 3] [--seed 1] [--out DIR]

Every rank draws the same seeded sequence of calls: a collective (all_reduce, broadcast,
reduce, all_gather, all_gather_single, reduce_scatter_single, gather, scatter,
all_to_all_single, barrier, all_gather_object), an algorithm of it (``auto`` included), a size
from 1 element to 256 KiB, sync or ``async_op=True`` (waited at once, or after the next call),
on the default group or on one sub-group made at the start. Each result is checked exactly
against its definition (integer data, never zero). After a warm-up (the first ``--warmup``
calls: connections, schedule caches and scratch buffers reach their sizes) the ranks sample
RSS (``/proc/self/statm``), open descriptors (``/proc/self/fd``) and threads
(``/proc/self/status``) every ``--every`` calls. Writes ``long_run.json`` and, with
matplotlib, ``long_run.png`` (RSS of every rank against calls).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import List, Optional

SIZES = (1, 2, 5, 17, 1000, 4099, 65536)       # elements of int64: 8 B to 512 KiB
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single",
               "reduce_scatter_single", "gather", "scatter", "all_to_all_single", "barrier",
               "all_gather_object")


def sample() -> dict:
    """This process's resident memory (MiB), open file descriptors and threads."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {"rss_mib": round(rss_pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20, 2),
            "fds": len(os.listdir("/proc/self/fd")), "threads": threads}


def _data(n: int, rank: int, salt: int):
    import torch

    return torch.arange(n, dtype=torch.int64) % 89 + 1 + 100 * rank + salt


def one_call(rng: random.Random, index: int, group, ranks: List[int]):
    """Draw and post call ``index`` on ``group`` (whose members are the global ``ranks``).
    Returns (work or None, a function that says whether its result is exactly right)."""
    import torch
    import torch.distributed as dist

    import ringcoll
    from ringcoll.schedules import registry

    collective = rng.choice(COLLECTIVES)
    family = None if collective == "all_gather_object" else registry.collective_of(collective)
    algorithm = rng.choice(["auto"] + ringcoll.algorithms(family)) if family else None
    n = rng.choice(SIZES)
    async_op = rng.random() < 0.3 and collective != "all_gather_object"
    salt = index % 50
    me, world = ranks.index(dist.get_rank()), len(ranks)
    root = rng.randrange(world)
    of = [_data(n, r, salt) for r in range(world)]
    x = of[me].clone()
    kw = {"group": group, "async_op": async_op}
    if algorithm is not None:
        kw["algorithm"] = algorithm
    total = sum(of)
    if collective == "all_reduce":
        work = ringcoll.all_reduce(x, **kw)
        return work, lambda: torch.equal(x, total)
    if collective == "broadcast":
        work = ringcoll.broadcast(x, src=ranks[root], **kw)
        return work, lambda: torch.equal(x, of[root])
    if collective == "reduce":
        work = ringcoll.reduce(x, dst=ranks[root], **kw)
        return work, lambda: me != root or torch.equal(x, total)
    if collective == "all_gather":
        outs = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
        work = ringcoll.all_gather(outs, x, **kw)
        return work, lambda: all(torch.equal(o, of[r]) for r, o in enumerate(outs))
    if collective == "all_gather_single":
        out = torch.empty(world * n, dtype=torch.int64)
        work = ringcoll.all_gather_single(out, x, **kw)
        return work, lambda: torch.equal(out, torch.cat(of))
    if collective == "reduce_scatter_single":
        big = torch.cat([x * (k + 1) for k in range(world)])
        out = torch.empty(n, dtype=torch.int64)
        work = ringcoll.reduce_scatter_single(out, big, **kw)
        return work, lambda: torch.equal(out, total * (me + 1))
    if collective == "gather":
        outs = [torch.empty(n, dtype=torch.int64) for _ in range(world)] if me == root else None
        work = ringcoll.gather(x, outs, dst=ranks[root], **kw)
        return work, lambda: me != root or all(torch.equal(o, of[r]) for r, o in enumerate(outs))
    if collective == "scatter":
        parts = [of[r] * 3 for r in range(world)] if me == root else None
        out = torch.empty(n, dtype=torch.int64)
        work = ringcoll.scatter(out, parts, src=ranks[root], **kw)
        return work, lambda: torch.equal(out, of[me] * 3)
    if collective == "all_to_all_single":
        inp = torch.cat([x * (k + 1) for k in range(world)])
        out = torch.empty(world * n, dtype=torch.int64)
        work = ringcoll.all_to_all_single(out, inp, **kw)
        return work, lambda: torch.equal(out, torch.cat([of[r] * (me + 1) for r in range(world)]))
    if collective == "barrier":
        return ringcoll.barrier(**kw), lambda: True
    objects = [None] * world
    ringcoll.all_gather_object(objects, {"rank": me, "index": index}, group=group)
    return None, lambda: objects == [{"rank": r, "index": index} for r in range(world)]


def rank_main(calls: int, seed: int, warmup: int, every: int) -> dict:
    """On every rank: the seeded sequence of calls, alternating between the default group and a
    sub-group of all ranks but the last (when there are three or more)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    sub_ranks = list(range(world - 1)) if world >= 3 else list(range(world))
    sub = dist.new_group(sub_ranks)
    rng = random.Random(f"ringcoll-long-run:{seed}")
    samples, wrong, pending = [], [], None
    start = time.monotonic()
    for index in range(calls):
        on_sub = rng.random() < 0.25
        group, ranks = (sub, sub_ranks) if on_sub else (None, list(range(world)))
        member = rank in ranks
        # every rank draws the same numbers whether or not it takes part (one stream for all)
        call_rng = random.Random(rng.random())
        if member:
            work, correct = one_call(call_rng, index, group, ranks)
        else:
            work, correct = None, (lambda: True)
        if pending is not None:                  # an async call waited after the next one
            pending[0].wait()
            if not pending[1]():
                wrong.append(pending[2])
            pending = None
        if work is not None and call_rng.random() < 0.5:
            pending = (work, correct, index)
        else:
            if work is not None:
                work.wait()
            if not correct():
                wrong.append(index)
        if index + 1 >= warmup and (index + 1 - warmup) % every == 0 or index + 1 == calls:
            if pending is not None:
                pending[0].wait()
                if not pending[1]():
                    wrong.append(pending[2])
                pending = None
            samples.append({"calls": index + 1, "seconds": round(time.monotonic() - start, 2), **sample()})
    dist.barrier()
    return {"rank": rank, "wrong": wrong, "samples": samples}


def growth(samples: List[dict]) -> dict:
    """Change from the first sample after warm-up to the last: RSS (MiB), fds, threads."""
    first, last = samples[0], samples[-1]
    return {"rss_mib": round(last["rss_mib"] - first["rss_mib"], 2), "fds": last["fds"] - first["fds"],
            "threads": last["threads"] - first["threads"],
            "rss_mib_max_over_first": round(max(s["rss_mib"] for s in samples) - first["rss_mib"], 2)}


def run(calls: int = 10000, world: int = 3, seed: int = 1, warmup: int = 500, every: int = 250,
        timeout: float = 3600) -> dict:
    import ringcoll

    start = time.monotonic()
    with ringcoll.launch(world, threads=1, timeout=timeout) as cluster:
        per_rank = cluster.run(rank_main, calls, seed, warmup, every)
    return {"calls": calls, "world": world, "seed": seed, "warmup": warmup, "every": every,
            "seconds": round(time.monotonic() - start, 1),
            "wrong": sum(len(r["wrong"]) for r in per_rank),
            "growth": {r["rank"]: growth(r["samples"]) for r in per_rank},
            "ranks": per_rank}


def plot(result: dict, path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in result["ranks"]:
        calls = [s["calls"] for s in r["samples"]]
        top.plot(calls, [s["rss_mib"] for s in r["samples"]], label=f"rank {r['rank']}")
        bottom.plot(calls, [s["fds"] for s in r["samples"]], label=f"rank {r['rank']} fds")
        bottom.plot(calls, [s["threads"] for s in r["samples"]], "--", label=f"rank {r['rank']} threads")
    top.set_ylabel("resident memory (MiB)")
    bottom.set_ylabel("count")
    bottom.set_xlabel("calls")
    top.set_title(f"{result['calls']} mixed calls on one group of {result['world']} ranks (after warm-up)")
    top.legend(fontsize=7)
    bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.long_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--out", default=None,
                        help="directory of long_run.json and long_run.png (default: a fresh "
                             "long_run-<UTC time> under the current directory, so a run never "
                             "overwrites committed results)")
    args = parser.parse_args(argv)
    result = run(args.calls, args.world, args.seed, args.warmup, args.every)
    result["command"] = "python -m tools.long_run " + " ".join(argv if argv is not None else sys.argv[1:])
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.out is None:
        args.out = time.strftime("long_run-%Y%m%dT%H%M%SZ", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "long_run.json"), "w") as f:
        json.dump(result, f, indent=1)
    picture = plot(result, os.path.join(args.out, "long_run.png"))
    print(f"{result['calls']} calls on {result['world']} ranks in {result['seconds']} s, {result['wrong']} wrong; "
          f"growth after warm-up per rank: " + "; ".join(
              f"rank {r}: RSS {g['rss_mib']:+.1f} MiB (max {g['rss_mib_max_over_first']:+.1f}), fds {g['fds']:+d}, "
              f"threads {g['threads']:+d}" for r, g in result["growth"].items())
          + (f"; plot {picture}" if picture else ""))
    return 1 if result["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
