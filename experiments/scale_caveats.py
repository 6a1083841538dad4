"""What the simulator's scale claims leave out, measured: numba's first compile of the batch
clock (``ringcoll.sim._batch_clock``, cached on disk after it) and worlds that are not powers
of two beside the powers of two the scale studies ran.

    python -m experiments.scale_caveats [--out bench/results/study/scale_caveats.json]

The compile is timed in child processes sharing a fresh ``NUMBA_CACHE_DIR``: the first (cold
cache: import ringcoll, then the first compiled run, ``direct`` all_reduce cost-only on a 4x4
torus, which compiles the clock), then a second (warm cache: the machine code loaded from
disk). The worlds: each all_reduce algorithm of the O(lg p) scale claims, cost-only at 4 MiB
(as experiments/study_scale.py, whose child runs it) at p = 4096 and p = 4095, each in a child
process of its own with a time limit. CPU seconds are the measure (wall times on a shared
machine are disturbed; the load average is recorded per row).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

#: the all_reduce algorithms whose scale the docs claim (O(lg p) steps, and the ring)
ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "swing_bandwidth", "bine")
WORLDS = (4096, 4095)
#: seconds (wall) a child may take: the ring at p = 4095 runs every rank (33.5 M messages)
LIMIT_S = {"ring": 1500}


def compile_child() -> dict:
    """Import ringcoll and run the compiled clock once, then again: CPU and wall seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    import ringcoll
    imported = time.perf_counter() - wall, time.process_time() - cpu
    machine = ringcoll.Machine.torus((4, 4))
    times = []
    for _ in range(2):
        wall, cpu = time.perf_counter(), time.process_time()
        sim = ringcoll.simulate("all_reduce", "direct", 16, numel=16 * 64, data=False, record=False, machine=machine)
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
        assert sim.stats.compiled, "the run did not take the compiled clock"
    return {"import_wall_s": round(imported[0], 2), "import_cpu_s": round(imported[1], 2),
            "first_run_wall_s": round(times[0][0], 2), "first_run_cpu_s": round(times[0][1], 2),
            "second_run_wall_s": round(times[1][0], 4), "second_run_cpu_s": round(times[1][1], 4)}


def _child(args, env=None, limit=240) -> dict:
    """The child's JSON row; a child stopped at ``limit`` s of wall time gives the CPU seconds it
    had used by then (``cpu_s_when_stopped``)."""
    load = [round(x, 2) for x in os.getloadavg()]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)           # the killed child, waited for
        used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return {"error": f"over {limit} s (killed)", "cpu_s_when_stopped": round(used, 1), "loadavg_before": load}
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1:], "loadavg_before": load}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "loadavg_before": load}


def main(argv=None) -> int:
    if argv and argv[0] == "--compile-child":
        print(json.dumps(compile_child()))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("bench", "results", "study", "scale_caveats.json"))
    args = p.parse_args(argv)
    doc = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
                    "cpu_count": os.cpu_count(), "note": "shared 2-core machine: CPU seconds are the measure, "
                    "wall times are disturbed by the others' load (loadavg per row)"}}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        doc["numba"] = {kind: _child(["-m", "experiments.scale_caveats", "--compile-child"], env)
                        for kind in ("cold_cache", "warm_cache")}
        print(json.dumps(doc["numba"]), flush=True)
    from experiments import study_scale
    doc["worlds"] = []
    for algorithm in ALGORITHMS:
        for world in WORLDS:
            row = {"algorithm": algorithm, "world": world,
                   **_child([study_scale.__file__, "--child", "all_reduce", algorithm, str(world)],
                            limit=LIMIT_S.get(algorithm, 240))}
            doc["worlds"].append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
