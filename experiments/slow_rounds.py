"""Why a small message's median flips at 4 ranks here: the slow rounds, by world size.

    python -m experiments.slow_rounds [--worlds 2,3,4] [--rounds 300] [--out bench/results/experiments]

Each rank of a gloo group on this machine runs a calling thread and gloo's message thread
(and, for a built-in collective, gloo's workers), so once the ranks outnumber the 2 cores some
rank waits for a core in a share of the rounds, and a round that waits takes 2-6 ms instead of
under 1. With about half the rounds slow, a median lands on one side of the gap or the other
from run to run, whatever is measured. Per world size, on one cluster each, four ways in turn
with a barrier before each call: the built-in barrier; a 1 KiB-block all_to_all_single by the
built-in, by its floor (the blocks each rank posts by bare gloo P2P from Python,
``specs.p2p_all_to_all_single``, as the benchmark's ``p2p-floor`` row) and by ringcoll
(``linear``, the plan reused). For each way: the slowest rank's median per call, the median
of the rounds under 2 ms, the share of rounds over 2 ms, and the calling thread's CPU time per
call (mean over ranks and rounds). Writes ``slow_rounds.json`` and ``slow_rounds.png`` (the
distribution of each way's rounds, one panel per world size) under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import ringcoll

from .executor_overhead import _fast_rounds, _in_turn
from ringcoll.bench.specs import p2p_all_to_all_single

#: a round over this is slow (as executor_overhead's fast/slow split)
SLOW = 2e-3
WAYS = ("built-in barrier", "built-in all_to_all_single", "p2p-floor (bare gloo P2P)",
        "ringcoll all_to_all_single (linear)")


def _ways(rounds: int, block: int) -> tuple:
    """On every rank: each way's wall and calling-thread CPU seconds per call, in turn."""
    import torch.distributed as dist

    world = dist.get_world_size()
    data = torch.arange(block * world, dtype=torch.float32)
    into = torch.empty_like(data)
    calls = (dist.barrier, lambda: dist.all_to_all_single(into, data),
             lambda: p2p_all_to_all_single(into, data),
             lambda: ringcoll.all_to_all_single(into, data, algorithm="linear"))
    return _in_turn(dict(zip(WAYS, calls)), rounds, warmup=20)


def measure(world: int, rounds: int, block: int = 256) -> dict:
    """One world size: per way, the slowest rank's rounds summarised (``_fast_rounds``), the
    calling thread's mean CPU per call, and every round (µs) for the plot."""
    with ringcoll.launch(world) as cluster:
        per_rank = cluster.run(_ways, rounds, block)
    out = {}
    for way in WAYS:
        slowest = [max(wall[way][i] for wall, _ in per_rank) for i in range(rounds)]
        row = _fast_rounds(slowest, SLOW)
        row["cpu_us"] = statistics.mean(statistics.mean(cpu[way]) for _, cpu in per_rank) * 1e6
        row["rounds_us"] = [t * 1e6 for t in slowest]
        out[way] = row
    return out


def plot(results: dict, path: str) -> bool:
    """The sorted rounds of each way against their share, one panel per world; False
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), sharey=True, squeeze=False)
    for ax, (world, ways) in zip(axes[0], results.items()):
        for way, row in ways.items():
            rounds = sorted(row["rounds_us"])
            ax.plot(rounds, [(i + 1) / len(rounds) for i in range(len(rounds))], label=way)
        ax.axvline(SLOW * 1e6, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("µs per call (slowest rank)")
        ax.set_title(f"{world} ranks on {os.cpu_count()} cores")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("share of rounds at or under")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("1 KiB-block all_to_all_single and barrier, a barrier before each call: the slow rounds "
                 "appear as the ranks outnumber the cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", default="2,3,4", help="comma-separated world sizes")
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds per way")
    parser.add_argument("--out", default="bench/results/experiments")
    args = parser.parse_args(argv)
    try:
        worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    except ValueError:
        worlds = []
    if not worlds or min(worlds) < 2 or args.rounds < 1:
        parser.error(f"--worlds needs sizes >= 2 and --rounds >= 1, got {args.worlds!r} and {args.rounds}")
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for world in worlds:
        results[world] = measure(world, args.rounds)
        print(f"{world} ranks: median / median of rounds under {SLOW * 1e3:g} ms / share over / "
              f"calling-thread CPU per call", flush=True)
        for way, row in results[world].items():
            print(f"  {way:38s} {row['median_us']:6.0f} us  {row['fast_median_us'] or 0:6.0f} us  "
                  f"{row['slow_share']:.2f}  {row['cpu_us']:5.0f} us")
    with open(os.path.join(args.out, "slow_rounds.json"), "w") as handle:
        json.dump({"results": results, "rounds": args.rounds, "slow_s": SLOW, "cores": os.cpu_count(),
                   "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
                   "loadavg": os.getloadavg()}, handle, indent=1)
    if plot(results, os.path.join(args.out, "slow_rounds.png")):
        print(f"wrote {os.path.join(args.out, 'slow_rounds.png')}")


if __name__ == "__main__":
    main()
