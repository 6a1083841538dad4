"""How long a cost-only all_reduce takes to simulate on a 64x64 torus (4,096 ranks) with link
sharing, for every registered all_reduce algorithm: ``python -m experiments.topology_scale``.

Writes bench/results/study/topology_scale_64x64.json and .txt: per algorithm the simulated
time, the run's CPU seconds (its cost, whatever else shares the cores) and wall seconds, whether the representatives' run stood for all
(``mirrored``: a whole torus placed linearly, an algorithm symmetric under rotation, and no
link ever making a message wait), how the clock ran (``clock``: mirrored, every rank on the
compiled clock of one-step exchanges, or every rank on the event clock) and the link statistics. ``--quick`` runs an 8x8 torus."""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch

import ringcoll
from ringcoll.schedules import registry

OUT = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "study")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="64,64")
    parser.add_argument("--ports", type=int, default=1, help="send and receive ports per rank (a tag p<ports> "
                        "names the files when above 1)")
    parser.add_argument("--bytes", type=int, default=1 << 20, help="all_reduce size in bytes (float32)")
    parser.add_argument("--algorithms", default=None, help="comma-separated (default: every all_reduce)")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--append", action="store_true", help="keep the other algorithms' rows already written")
    parser.add_argument("--cpu-limit", type=float, default=300.0,
                        help="CPU seconds after which an algorithm's run is given up (recorded as unfinished)")
    args = parser.parse_args(argv)
    dims = tuple(int(d) for d in args.dims.split(","))
    machine = ringcoll.Machine.torus(dims, ports=args.ports)
    world = machine.network.hosts
    names = args.algorithms.split(",") if args.algorithms else list(registry.algorithms("all_reduce"))
    tag = "x".join(str(d) for d in dims) + (f"p{args.ports}" if args.ports > 1 else "")
    json_path = os.path.join(args.out, f"topology_scale_{tag}.json")
    rows = []
    if args.append and os.path.exists(json_path):
        with open(json_path) as f:
            rows = [r for r in json.load(f)["rows"] if r["algorithm"] not in names]
    for name in names:
        start, cpu = time.perf_counter(), time.process_time()
        signal.signal(signal.SIGPROF, _give_up)
        signal.setitimer(signal.ITIMER_PROF, args.cpu_limit)
        try:
            sim = ringcoll.simulate("all_reduce", name, world=world, numel=args.bytes // 4, dtype=torch.float32,
                                    machine=machine, data=False, record=False)
        except _OutOfTime:
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            rows.append({"algorithm": name, "unfinished": True, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
            print(f"{name:20s} not finished after {cpu:.0f} s CPU", flush=True)
            write(args, machine, world, tag, rows)
            continue
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        net = sim.stats.network
        rows.append({"algorithm": name, "simulated_us": sim.stats.time * 1e6, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "mirrored": sim.stats.mirrored, "clock": _clock(sim.stats.mirrored, sim.stats.compiled), "messages": sim.stats.messages,
                     "max_link_MiB": net.max_link_bytes / 2 ** 20, "mean_link_MiB": net.mean_link_bytes / 2 ** 20,
                     "hop_bytes_GiB": net.hop_bytes / 2 ** 30})
        print(f"{name:20s} {sim.stats.time * 1e6:12.1f} us simulated  {wall:7.2f} s wall  {cpu:7.2f} s CPU  "
              f"clock={_clock(sim.stats.mirrored, sim.stats.compiled)}  messages={sim.stats.messages}", flush=True)
        write(args, machine, world, tag, rows)        # after every algorithm: a long one may be cut short


def _clock(mirrored, compiled: bool) -> str:
    """How the run went: the representatives' run standing for every rank ("mirrored"), every
    rank on the compiled clock of one-step exchanges ("compiled"), every rank on the event clock."""
    return "mirrored" if mirrored else "compiled" if compiled else "every rank"


class _OutOfTime(Exception):
    pass


def _give_up(signum, frame):
    raise _OutOfTime()


def write(args, machine, world, tag, rows) -> None:
    os.makedirs(args.out, exist_ok=True)
    doc = {"machine": machine.describe(), "world": world, "bytes": args.bytes,
           "host": f"{os.cpu_count()} cores (shared)", "rows": rows}
    rows = sorted(rows, key=lambda r: list(registry.algorithms("all_reduce")).index(r["algorithm"])
                  if r["algorithm"] in registry.algorithms("all_reduce") else 99)
    with open(os.path.join(args.out, f"topology_scale_{tag}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, f"topology_scale_{tag}.txt"), "w") as f:
        f.write(f"all_reduce of {args.bytes} B (float32), cost-only, on {machine.describe()}, p = {world}; "
                f"wall seconds on {os.cpu_count()} cores shared with other jobs (python -m experiments.topology_scale)\n")
        f.write("CPU s is this process's processor time (what the run costs); wall s also counts the "
                "time other jobs held the cores\n")
        f.write("clock: mirrored = the representatives' run stood for every rank; compiled = every rank on the "
                "compiled clock of one-step exchanges (ringcoll.sim.batch); every rank = the event clock ran them all\n")
        f.write(f"{'algorithm':20s} {'simulated us':>14s} {'CPU s':>8s} {'wall s':>8s}  {'clock':10s}  messages  "
                f"max link MiB  mean link MiB\n")
        for r in rows:
            if r.get("unfinished"):
                f.write(f"{r['algorithm']:20s} {'not finished':>14s} {r['cpu_s']:8.2f} {r['wall_s']:8.2f}  "
                        f"(given up at --cpu-limit: every rank runs, p² or p·steps messages)\n")
                continue
            f.write(f"{r['algorithm']:20s} {r['simulated_us']:14.1f} {r.get('cpu_s', float('nan')):8.2f} "
                    f"{r['wall_s']:8.2f}  {r.get('clock') or _clock(r['mirrored'], False):10s}  "
                    f"{r['messages']:8d}  {r['max_link_MiB']:12.3f}  {r['mean_link_MiB']:13.3f}\n")


if __name__ == "__main__":
    main()
