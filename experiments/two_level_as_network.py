"""How long a cost-only simulate takes on a 2-level machine, before and after the 2-level
machine became a network (one engine path for every non-flat machine):
``python -m experiments.two_level_as_network [--base REF]``.

One run times both trees: the base commit's package (``git archive REF``, default the merge
base with main) and this working tree's, each in its own child process, alternately, the
best of ``--repeats`` per case (CPU seconds of the child: what the run costs, whatever else
shares the cores). Cases: all_reduce algorithms (hierarchical, ring, rabenseifner,
recursive_doubling, double_binary_tree) at p = 8, 64, 512 on nodes of 8 ranks, NICs of 1
and 2 ports, 64 MiB; run as ``auto``'s model runs them (``run_plans(data=False)``: a declared
symmetry runs its representatives alone) and with every rank (``symmetry=False``); and, for
the generic network path with wire-held links, ring, rabenseifner and recursive_doubling on
16 x 4 and 16 x 16 tori (16 MiB). Every
simulated time must agree bit for bit between the trees (the script fails otherwise). Writes
bench/results/study/two_level_as_network.json and .md."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "bench", "results", "study")
ALGORITHMS = ("hierarchical", "ring", "rabenseifner", "recursive_doubling", "double_binary_tree")
WORLDS = (8, 64, 512)

CHILD = r"""
import json, sys, time, dataclasses, torch
import ringcoll
from ringcoll.api import BUILDERS
from ringcoll.api.common import Context
from ringcoll.sim.engine import run_plans
from ringcoll.api._calls import numel_call

cases, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
out = []
for algorithm, world, nic_ports, symmetry, nbytes in cases:
    if nic_ports:
        machine = ringcoll.Machine.hierarchical(8, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9),
                                                gamma=1 / 50e9, nic_ports=nic_ports)
    else:                       # a torus of world ranks, 16 in dimension 0
        machine = ringcoll.Machine.torus((16, world // 16), alpha=1e-6, beta=1 / 25e9, gamma=1 / 50e9)
    nodes = machine.nodes(world)
    args, kwargs = numel_call("all_reduce", 0, world, nbytes // 4, torch.float32, {}, fill=False)
    first = BUILDERS["all_reduce"](Context(0, world, nodes=nodes, machine=machine), *args,
                                   algorithm=algorithm, **kwargs)
    plans = [first] + [dataclasses.replace(first, rank=r) for r in range(1, world)]
    best, value, first = None, None, None
    for _ in range(repeats):
        start = time.process_time()
        stats = run_plans(plans, machine, data=False, symmetry=symmetry)
        spent = time.process_time() - start
        first = spent if first is None else first
        best = spent if best is None else min(best, spent)
        value = stats.time
    out.append([best, value.hex(), stats.mirrored is not None, first])
print(json.dumps(out))
"""


def cases(quick: bool):
    worlds = WORLDS[:2] if quick else WORLDS
    for world in worlds:
        for algorithm in ALGORITHMS:
            for nic_ports in (1, 2):
                for symmetry in (True, False):
                    if world == 512 and not symmetry and algorithm in ("ring",) and nic_ports == 2:
                        continue        # the same run as nic_ports = 1 for the clock's cost
                    yield [algorithm, world, nic_ports, symmetry, 64 << 20]
    for world in (64, 256):     # the generic network path on a torus (wire-held links)
        for algorithm in ("ring", "rabenseifner", "recursive_doubling"):
            yield [algorithm, world, 0, True, 16 << 20]


def run_tree(path: str, todo, repeats: int):
    env = dict(os.environ, PYTHONPATH=path, CI="true")
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(todo), str(repeats)], env=env,
                          capture_output=True, text=True, cwd=path)
    if done.returncode:
        raise RuntimeError(f"child in {path} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="the commit to compare with (default: merge-base with main)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two trees")
    parser.add_argument("--quick", action="store_true", help="p = 8 and 64 only")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    base = args.base or subprocess.check_output(["git", "merge-base", "HEAD", "main"], cwd=ROOT, text=True).strip()
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    todo = list(cases(args.quick))
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", base, "ringcoll"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        best = {"before": None, "after": None}
        for _ in range(args.rounds):
            for label, path in (("before", tmp), ("after", ROOT)):
                got = run_tree(path, todo, args.repeats)
                if best[label] is None:
                    best[label] = got
                else:
                    best[label] = [[min(a[0], b[0]), b[1], b[2], min(a[3], b[3])]
                                   for a, b in zip(best[label], got)]
    rows = []
    for case, before, after in zip(todo, best["before"], best["after"]):
        algorithm, world, nic_ports, symmetry, nbytes = case
        rows.append({"algorithm": algorithm, "world": world,
                     "machine": f"nodes of 8, NIC of {nic_ports}" if nic_ports else f"torus 16x{world // 16}",
                     "symmetry": symmetry,
                     "bytes": nbytes, "mirrored": after[2], "before_s": round(before[0], 4),
                     "after_s": round(after[0], 4), "ratio": round(after[0] / before[0], 3) if before[0] else None,
                     "before_first_s": round(before[3], 4), "after_first_s": round(after[3], 4),
                     "time_us": float.fromhex(after[1]) * 1e6, "same_time": before[1] == after[1]})
    os.makedirs(args.out, exist_ok=True)
    doc = {"base": base, "head": head, "repeats": args.repeats, "rounds": args.rounds,
           "machine": "Machine.hierarchical(8, intra=(1 us, 200 GB/s), inter=(5 us, 20 GB/s), gamma 50 GB/s)",
           "rows": rows}
    with open(os.path.join(args.out, "two_level_as_network.json"), "w") as f:
        json.dump(doc, f, indent=1)
    total_before = sum(r["before_s"] for r in rows)
    total_after = sum(r["after_s"] for r in rows)
    lines = ["# Cost-only simulate on a 2-level machine: node/NIC code path (before) vs the network (after)",
             "",
             f"`python -m experiments.two_level_as_network` — base {base[:10]}, head {head[:10]} (+ working tree), "
             f"best of {args.repeats} x {args.rounds} rounds, CPU seconds per run on this (shared, 2-core) host.",
             f"2-level machine: {doc['machine']}, nodes of 8 ranks, NIC of 1 or 2 ports; all_reduce of 64 MiB "
             "float32. Torus rows: Machine.torus((16, p / 16), 1 us, 25 GB/s), 16 MiB (the generic network path "
             "with wire-held links).",
             "`symmetry` True: as auto's model runs it (a declared symmetry runs its representatives alone). "
             "`first`: the first of the repeats (cold: the first run on a machine prices its routes, later runs "
             "on the same machine and world reuse them).",
             "",
             "| algorithm | p | machine | symmetry | mirrored | time (us) | same time | before (s) | after (s) "
             "| after/before | first before (s) | first after (s) |",
             "|---|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['algorithm']} | {r['world']} | {r['machine']} | {r['symmetry']} | {r['mirrored']} | "
                     f"{r['time_us']:.2f} | {'yes' if r['same_time'] else '**NO**'} | {r['before_s']:.4f} | "
                     f"{r['after_s']:.4f} | {r['ratio']} | {r['before_first_s']:.4f} | {r['after_first_s']:.4f} |")
    lines += ["", f"Total: before {total_before:.3f} s, after {total_after:.3f} s "
                  f"(after/before {total_after / total_before:.3f})."]
    with open(os.path.join(args.out, "two_level_as_network.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not all(r["same_time"] for r in rows):
        raise SystemExit("simulated times differ between the trees")


if __name__ == "__main__":
    main()
