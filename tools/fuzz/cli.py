"""``python -m tools.fuzz``: the command line (see the package docstring)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import List, Optional

import torch

from .trials import draw, parse_worlds
from .driver import run_trials
from .simulated import simulate_trials


def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    summary = sys.modules[__package__].__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m tools.fuzz", description=summary)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worlds", default="1-8", help="world sizes: 1-8 or 2,3,5 (default 1-8)")
    parser.add_argument("--max-bytes", type=int, default=2 << 20, help="largest call, bytes (default 2 MiB)")
    parser.add_argument("--batch", type=int, default=40, help="trials per Cluster.run (default 40)")
    parser.add_argument("--timeout", type=float, default=300.0, help="s per batch (default 300)")
    parser.add_argument("--replay", metavar="SEED:INDEX", help="run this one trial alone, with details")
    parser.add_argument("--simulate", action="store_true", help="in one process, on the simulator")
    parser.add_argument("--out", help="write the summary as JSON here")
    args = parser.parse_args(argv)
    worlds = parse_worlds(args.worlds)
    if args.replay:
        seed, index = (int(part) for part in args.replay.split(":"))
        trials = [draw(seed, index, worlds, args.max_bytes)]
        print(json.dumps(asdict(trials[0])))
    else:
        trials = [draw(args.seed, index, worlds, args.max_bytes) for index in range(args.trials)]
    load_before = _load()
    start = time.monotonic()
    if args.simulate:
        tally = simulate_trials(trials)
    else:
        tally = run_trials(trials, batch=args.batch, timeout=args.timeout, detail=bool(args.replay),
                           progress=lambda line: print(line, flush=True))
    elapsed = time.monotonic() - start
    summary = {
        "command": "python -m tools.fuzz " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": "simulator" if args.simulate else "gloo",
        "seed": args.seed, "worlds": worlds, "max_bytes": args.max_bytes,
        "trials": tally.trials, "wrong_elements": tally.wrong_elements,
        "checked_elements": tally.checked_elements, "failing_trials": len(tally.failing),
        "failing": tally.failing[:50], "by_collective": tally.by_collective,
        "reference": tally.by_reference, "seconds": round(elapsed, 1),
        "load_before": load_before, "load_after": _load(), "cores": os.cpu_count(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{tally.trials} trials, {tally.wrong_elements} wrong elements of {tally.checked_elements} checked, "
          f"{len(tally.failing)} failing trials, {elapsed:.0f} s")
    for failure in tally.failing[:20]:
        print(f"  FAIL {failure['id']}: {'; '.join(failure['problems'])[:300]}  "
              f"(replay: python -m tools.fuzz --replay {failure['id']} --worlds {args.worlds})")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if tally.failing else 0
