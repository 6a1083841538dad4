"""Cost-only simulations at a million ranks: every algorithm that declares a symmetry
(``ringcoll.register(..., symmetry=)``), flat default machine, p = 2^20 = 1,048,576.

    python -m experiments.study_million [--out bench/results/study/million.json] [--world N]

Each case runs in a child process of its own (``experiments.study_scale.child``) with n =
8 bytes per rank (int64, one element per rank: a multiple of the world, so the rings and
butterflies are symmetric), the node-aware ones on nodes of 8, and records wall and CPU time,
peak RSS, the simulated time, whether the run was mirrored, and the load average (the
machine is shared; its 2 cores are disturbed by other work). A case past ``--timeout``
seconds is recorded as such.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

WORLD = 1 << 20


def cases():
    """Every symmetric algorithm, the O(lg p)-step ones first (the others take p - 1 steps or
    post p - 1 messages at once: minutes each at a million ranks)."""
    import ringcoll
    from ringcoll.schedules import registry
    from experiments.study_scale import LOG_STEPS

    found = [(collective, name) for collective, names in ringcoll.algorithms().items() for name in names
             if registry.get(collective, name).symmetry is not None]
    return sorted(found, key=lambda case: case[1] not in LOG_STEPS | {"rabenseifner_far"})


def main(argv=None) -> int:
    if argv and argv[0] == "--child":
        from experiments.study_scale import child

        world = int(argv[3])
        print(json.dumps(child(argv[1], argv[2], world, numel=world)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("bench", "results", "study", "million.json"))
    p.add_argument("--world", type=int, default=WORLD)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    args = p.parse_args(argv)
    rows = []
    for collective, algorithm in cases():
        load = os.getloadavg()
        start = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, "-m", "experiments.study_million", "--child", collective,
                                  algorithm, str(args.world)], capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            row = {"collective": collective, "algorithm": algorithm, "world": args.world,
                   "error": f"timeout after {args.timeout:.0f} s"}
        else:
            if out.returncode:
                row = {"collective": collective, "algorithm": algorithm, "world": args.world,
                       "error": out.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_before"] = [round(x, 2) for x in load]
        row["elapsed_s"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": {"world": args.world, "python": platform.python_version(),
                                "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
