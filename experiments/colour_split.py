"""Does splitting the double trees' global steps by colour hurt on gloo?

    python -m experiments.colour_split [--worlds 3 4] [--rounds 1.0] [--runs 1] [--out bench/results/experiments]

The double trees (``ringcoll.schedules.trees.TreePipeline``: all_reduce, broadcast and reduce
``double_binary_tree``) split each global step into one step per colour of a proper edge
colouring of its messages, so that on the simulator's clock a rank carries one message in
and one out at a time. On a real group each of those steps is one round of posts and waits.
This times, on a local gloo cluster, the same schedule two ways: ``split`` (the layout's
``ONE_PORT`` True: one step per colour) and ``together`` (False: a global step's transfers
posted at once). Both variants' plans are prepared once (as a repeated call's persistent
plan) and run by the group's executor; in each round both run once, in alternating order,
each after restoring the input and a barrier; the time is from leaving the barrier to the
call's end, the maximum over ranks per round, then the median over the rounds after warm-up
with its 10th and 90th percentiles. ``uptime``'s load is recorded before and after each
world: other programs share this machine's cores. ``--runs`` repeats the whole measurement
(a fresh cluster each time) and ends with each row's ratio in every run; ``--merge`` adds the
runs of earlier JSON files (numbered first), ``--report-only`` measures nothing. The committed
results: one run with ``--rounds 3``, then three with ``--rounds 2 --runs 3``, merged.

Writes ``colour_split.json`` and ``colour_split.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import torch

COLLECTIVES = ("all_reduce", "broadcast", "reduce")
SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)
#: timed rounds per size (scaled by --rounds), after WARMUP rounds
ROUNDS = {4 << 10: 60, 256 << 10: 40, 4 << 20: 20, 32 << 20: 10}
WARMUP = 3
VARIANTS = ("split", "together")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _plan(collective: str, tensor: torch.Tensor, executor, one_port: bool):
    """The prepared plan of ``collective`` on ``tensor`` (root 0), with ``one_port``."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import executor_context

    ctx = executor_context(executor)
    if collective == "all_reduce":
        plan = BUILDERS[collective](ctx, tensor, algorithm="double_binary_tree")
    elif collective == "broadcast":
        plan = BUILDERS[collective](ctx, tensor, src=0, algorithm="double_binary_tree")
    else:
        plan = BUILDERS[collective](ctx, tensor, dst=0, algorithm="double_binary_tree")
    kept = executor.one_port
    executor.one_port = one_port
    try:
        return executor.prepare(plan)
    finally:
        executor.one_port = kept


def _measure(rounds_scale: float) -> list:
    """On every rank: [(collective, bytes, {variant: [seconds per round]}, {variant: steps})]."""
    import torch.distributed as dist
    from ringcoll.api.common import executor_context, group_executor

    executor = group_executor(None)
    out = []
    for collective in COLLECTIVES:
        for nbytes in SIZES:
            numel = nbytes // 4
            original = (torch.arange(numel, dtype=torch.float32) % 7 + 1 + dist.get_rank())
            tensor = original.clone()
            prepared = {v: _plan(collective, tensor, executor, v == "split") for v in VARIANTS}
            steps = {v: len(p.steps) for v, p in prepared.items()}
            times = {v: [] for v in VARIANTS}
            rounds = max(3, int(ROUNDS[nbytes] * rounds_scale))
            for round_ in range(WARMUP + rounds):
                order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    tensor.copy_(original)
                    dist.barrier()
                    start = time.perf_counter()
                    with torch.no_grad():
                        executor.execute(prepared[variant], executor_context(executor).seq)
                    elapsed = time.perf_counter() - start
                    if round_ >= WARMUP:
                        times[variant].append(elapsed)
            out.append((collective, nbytes, times, steps))
    return out


def same_schedule(world: int, collective: str, nbytes: int) -> bool:
    """Whether every rank's schedule is the same both ways (those rows are the noise's
    control: any ratio there is the machine's)."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import Context

    kwargs = {"all_reduce": {}, "broadcast": {"src": 0}, "reduce": {"dst": 0}}[collective]
    tensor = torch.ones(nbytes // 4)
    for rank in range(world):
        plan = BUILDERS[collective](Context(rank, world), tensor, algorithm="double_binary_tree", **kwargs)
        if plan.steps(one_port=True) != plan.steps(one_port=False):
            return False
    return True


def _quantile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def summarize(world: int, per_rank: list) -> list:
    """Per (collective, size): each variant's median, p10 and p90 in ms of the slowest rank per
    round, and together / split."""
    rows = []
    for index, (collective, nbytes, _, steps) in enumerate(per_rank[0]):
        row = {"world": world, "collective": collective, "bytes": nbytes, "steps": steps}
        for variant in VARIANTS:
            slowest = [max(rank[index][2][variant][r] for rank in per_rank)
                       for r in range(len(per_rank[0][index][2][variant]))]
            row[variant] = {"median_ms": statistics.median(slowest) * 1e3,
                            "p10_ms": _quantile(slowest, 0.1) * 1e3, "p90_ms": _quantile(slowest, 0.9) * 1e3,
                            "rounds": len(slowest)}
        row["together_vs_split"] = row["together"]["median_ms"] / row["split"]["median_ms"]
        rows.append(row)
    return rows


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def report(result: dict) -> str:
    lines = ["# Double trees on gloo: a global step split by colour, or posted together", "",
             "`python -m experiments.colour_split` (see its docstring for the method). Times in ms: "
             "the median over rounds of the slowest rank, [p10, p90] after it; `steps` is rank 0's "
             "step count (split / together); ratio = together / split (below 1: posting a global step "
             "together is faster).", "",
             f"Host: {result['host']}, torch {result['torch']}, {result['cpus']} CPUs.", ""]
    for world in result["worlds"]:
        lines += [f"## world {world['world']}, run {world['run']}", "", f"- load before: `{world['load_before']}`",
                  f"- load after: `{world['load_after']}`", "",
                  "| collective | size | steps | split ms [p10, p90] | together ms [p10, p90] | ratio |",
                  "|---|---|---|---|---|---|"]
        for row in world["rows"]:
            cells = []
            for variant in VARIANTS:
                v = row[variant]
                cells.append(f"{v['median_ms']:.2f} [{v['p10_ms']:.2f}, {v['p90_ms']:.2f}]")
            lines.append(f"| {row['collective']} | {_size(row['bytes'])} | {row['steps']['split']} / "
                         f"{row['steps']['together']} | {cells[0]} | {cells[1]} | {row['together_vs_split']:.2f} |")
        lines.append("")
    runs = sorted({w["run"] for w in result["worlds"]})
    if len(runs) > 1:
        lines += ["## together / split in every run", "",
                  "`same`: every rank's schedule is the same both ways (those rows measure the noise); "
                  "geomean: the geometric mean over the runs.", "",
                  "| world | collective | size | same | " + " | ".join(f"run {r}" for r in runs) + " | geomean |",
                  "|---|---|---|---|" + "---|" * (len(runs) + 1)]
        ratios = {}
        for world in result["worlds"]:
            for row in world["rows"]:
                ratios.setdefault((world["world"], row["collective"], row["bytes"]), {})[world["run"]] = \
                    row["together_vs_split"]
        for (world, collective, nbytes), by_run in ratios.items():
            mean = statistics.geometric_mean(by_run.values())
            same = "yes" if same_schedule(world, collective, nbytes) else ""
            lines.append(f"| {world} | {collective} | {_size(nbytes)} | {same} | "
                         + " | ".join(f"{by_run[r]:.2f}" for r in runs) + f" | {mean:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    import ringcoll

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--rounds", type=float, default=1.0, help="scale the timed rounds per size")
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole measurement")
    parser.add_argument("--merge", nargs="*", default=[], help="earlier colour_split.json files to report "
                        "with this one (their runs numbered first)")
    parser.add_argument("--report-only", action="store_true", help="measure nothing: report the --merge files")
    parser.add_argument("--out", default="bench/results/experiments")
    args = parser.parse_args(argv)
    result = {"host": platform.node(), "torch": torch.__version__, "cpus": os.cpu_count(), "worlds": []}
    for path in args.merge:
        with open(path) as f:
            earlier = json.load(f)
        first = 1 + max((w["run"] for w in result["worlds"]), default=0)
        runs = sorted({w.get("run", 1) for w in earlier["worlds"]})
        for w in earlier["worlds"]:
            result["worlds"].append({**w, "run": first + runs.index(w.get("run", 1))})
    done = max((w["run"] for w in result["worlds"]), default=0)
    for run in range(done + 1, done + 1 + (0 if args.report_only else args.runs)):
        for world in args.worlds:
            before = _uptime()
            with ringcoll.launch(world) as cluster:
                per_rank = cluster.run(_measure, args.rounds)
            result["worlds"].append({"world": world, "run": run, "load_before": before, "load_after": _uptime(),
                                     "rows": summarize(world, per_rank)})
    text = report(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "colour_split.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "colour_split.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
