"""Cost-only simulations at a million ranks: every algorithm that declares a symmetry
(``ringcoll.register(..., symmetry=)``), flat default machine, p = 2^20 = 1,048,576 and
p = 1,000,000 (= 2^6 · 5^6, where the declaration holds: the rotations, not the butterflies,
Swing or Bine, which need a power of two).

    python -m experiments.study_million [--out bench/results/study/million.json]
        [--worlds 1048576,1000000] [--only all_reduce/direct,...] [--append]

``--append`` keeps the rows of the other cases already in ``--out`` and records a rerun
case's previous outcome under ``before``. The torus counterpart (every all_reduce on a 64x64
torus with link sharing) is ``python -m experiments.topology_scale``.

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


def _child(collective: str, algorithm: str, world: int) -> dict:
    """One case, refused (``skipped``) where the algorithm's symmetry does not hold at this
    world: a run of every rank would take hours."""
    from ringcoll.sim import engine
    from experiments.study_scale import child

    declared = engine.symmetric

    def symmetric_or_skip(plans, machine):
        found = declared(plans, machine)
        if found is None:
            raise _NotSymmetric()
        return found

    engine.symmetric = symmetric_or_skip
    try:
        return child(collective, algorithm, world, numel=world)
    except _NotSymmetric:
        return {"collective": collective, "algorithm": algorithm, "world": world,
                "skipped": "no symmetry declared at this world (every rank would run)"}


class _NotSymmetric(Exception):
    pass


def main(argv=None) -> int:
    if argv and argv[0] == "--child":
        print(json.dumps(_child(argv[1], argv[2], int(argv[3]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("bench", "results", "study", "million.json"))
    p.add_argument("--worlds", default=f"{WORLD},1000000", help="comma-separated world sizes")
    p.add_argument("--only", default=None, help="comma-separated collective/algorithm cases (default: all)")
    p.add_argument("--append", action="store_true", help="keep the other cases' rows already in --out")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    args = p.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    only = set(args.only.split(",")) if args.only else None
    rows, meta = [], {}
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        rows, meta = old["rows"], old.get("meta", {})
    todo = [(c, a, w) for w in worlds for c, a in cases() if only is None or f"{c}/{a}" in only]
    for number, (collective, algorithm, world) in enumerate(todo, 1):
        print(f"[{number}/{len(todo)}] {collective}/{algorithm} p = {world} ...", flush=True)
        load = os.getloadavg()
        start = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, "-m", "experiments.study_million", "--child", collective,
                                  algorithm, str(world)], capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            row = {"collective": collective, "algorithm": algorithm, "world": world,
                   "error": f"timeout after {args.timeout:.0f} s"}
        else:
            if out.returncode:
                row = {"collective": collective, "algorithm": algorithm, "world": world,
                       "error": out.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_before"] = [round(x, 2) for x in load]
        row["elapsed_s"] = round(time.perf_counter() - start, 1)
        key = (collective, algorithm, world)
        previous = [r for r in rows if (r["collective"], r["algorithm"], r.get("world")) == key]
        if previous:
            was = previous[-1]
            row["before"] = was.get("before") or {k: was[k] for k in ("wall_s", "cpu_s", "peak_rss_mib", "error",
                                                                       "note", "when") if k in was}
            rows = [r for r in rows if (r["collective"], r["algorithm"], r.get("world")) != key]
        row["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rows.append(row)
        print(json.dumps(row), flush=True)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        meta.update({"worlds": sorted({r.get("world") for r in rows if r.get("world")}),
                     "python": platform.python_version(), "cpus": os.cpu_count(),
                     "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        meta.pop("world", None)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
