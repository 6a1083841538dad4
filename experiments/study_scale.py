"""Cost-only simulations at scale: every algorithm at p = 1024, the O(lg p)-step ones at
p = 4096, the ring all_reduce at p = 4096 (targets: 10 s, 10 s, 2 min and 2 GiB).

    python experiments/study_scale.py [--out bench/results/study/study_scale.json] [--skip-long]

Each case runs ``ringcoll.simulate(..., data=False)`` in a child process of its own (so its
peak memory is its own) and records wall time, peak RSS, the simulated time, the critical
path and the machine's load average, since timings on a shared machine are disturbed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

NBYTES = 4 * 1024 * 1024          # the n of every case: 4 MiB (int64)
#: ranks per node of the node-aware (hierarchical) algorithms: 8, as on a DGX node
LOCAL_SIZE = 8
#: algorithms whose step count grows as lg p (the rest take p - 1 or more steps)
LOG_STEPS = {"recursive_doubling", "rabenseifner", "bruck", "binomial", "recursive_halving",
             "dissemination", "double_binary_tree", "swing_latency", "swing_bandwidth", "bine", "pat"}


def child(collective: str, algorithm: str, world: int, symmetry: bool = True, numel: int = NBYTES // 8) -> dict:
    import ringcoll
    from ringcoll.schedules.registry import BUILDER_OF

    start, cpu = time.perf_counter(), time.process_time()
    sim = ringcoll.simulate(BUILDER_OF.get(collective, collective), algorithm, world,
                            numel=numel, data=False, record=False, symmetry=symmetry,
                            local_size=LOCAL_SIZE if algorithm == "hierarchical" else None)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"collective": collective, "algorithm": algorithm, "world": world, "nbytes": numel * 8,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "simulated_s": sim.stats.time, "predicted_s": sim.predicted, "critical_path": sim.stats.steps,
            "messages": sim.stats.messages, "mirrored": sim.stats.mirrored,
            **({"local_size": LOCAL_SIZE} if algorithm == "hierarchical" else {})}


def cases(skip_long: bool):
    import ringcoll

    for collective, names in ringcoll.algorithms().items():
        for name in names:
            yield collective, name, 1024, 10.0, True
            if name in LOG_STEPS:
                yield collective, name, 4096, 10.0, True
    yield "all_reduce", "ring", 4096, 120.0, True
    if not skip_long:
        # the same ring with every rank's schedule run (no symmetry): what it costs without
        yield "all_reduce", "ring", 1024, None, False


def main(argv=None) -> int:
    if argv and argv[0] == "--child":
        print(json.dumps(child(argv[1], argv[2], int(argv[3]), argv[4:5] != ["full"])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("bench", "results", "study", "study_scale.json"))
    p.add_argument("--skip-long", action="store_true",
                   help="leave out the ring at p = 1024 with every rank run (no symmetry)")
    args = p.parse_args(argv)
    rows = []
    for collective, algorithm, world, target, symmetry in cases(args.skip_long):
        load = os.getloadavg()
        out = subprocess.run([sys.executable, __file__, "--child", collective, algorithm, str(world),
                              *([] if symmetry else ["full"])], capture_output=True, text=True)
        if out.returncode:
            row = {"collective": collective, "algorithm": algorithm, "world": world,
                   "error": out.stderr.strip().splitlines()[-1:]}
        else:
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["target_s"] = target
            row["met"] = None if target is None else (
                row["wall_s"] <= target and (world < 4096 or algorithm != "ring" or row["peak_rss_mib"] <= 2048))
        row["loadavg_before"] = [round(x, 2) for x in load]
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "note": "shared 2-core machine, 7 engineers at once: wall times "
            "are disturbed by the others' load (loadavg per row)"}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
