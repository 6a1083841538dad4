"""The Bine paper's Fig. 4 replayed per job allocation: ``python -m experiments.study_bine_allocations``.

De Sensi et al., "Bine Trees", SC '25 (arXiv 2508.17311), Fig. 4: for each real job allocation
seen on Leonardo (Dragonfly+) and LUMI (Dragonfly), the % fewer bytes on global links (between
dragonfly groups) of the all_reduce ``bine_bandwidth`` than of Rabenseifner in MPICH's order.
The authors' data, HLC-Lab/pico at commit 413bc5d0f98f8c45a99926cb4b68d22824d968ab:
``tracer/sinfo/{leonardo,lumi}.tar.gz`` hold one file per job (its nodes' hostnames, rank r
on line r + 1), ``tracer/maps/leonardo.txt`` each Leonardo node's cell (group), and
``tracer/sinfo/{system}_allreduce_rabenseifner_vs_bine_bandwidth.csv`` one row (nodes, groups,
reduction %) per job kept, written by ``tracer/sinfo/process.sh`` in the order it lists the
jobs (files with "viz", fewer than 2 lines or a single group skipped; LUMI nodes outside the
tracer's table skipped), from the traffic formulas of ``tracer/algo_patterns.json``.

This reads that data (``--pico``: a git directory or a checkout of HLC-Lab/pico holding that
commit, ``git clone https://github.com/HLC-Lab/pico``; 6 minutes of CPU in all), rebuilds
each job's rank → group map as the tracer does, recomputes the authors' reduction from their
formulas (which pairs every CSV row with its job: the node and group counts must match and
the reduction agree to its two printed decimals), and runs ringcoll's ``bine`` and
``rabenseifner`` all_reduce schedules cost-only on that exact placement
(``Machine.hierarchical(placement=)``: the groups as nodes; under minimal routing every byte
between groups crosses one global link), counting the bytes between groups. It writes
bench/results/study/bine_allocations.{json,md}.

The authors' count folds a non-power of two p for Rabenseifner, and an odd p for bine, onto
the largest power of two (:func:`paper_bytes`; its first even rank's partner is rank −1,
outside the job: counted global), and counts bine at an even non-power of two with its
power-of-two formulas taken mod p over ⌈lg p⌉ steps; ringcoll's schedules fold both
algorithms as MPICH does. The agreement is therefore reported for powers of two, where both
count the same schedules, and for the other node counts apart.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import statistics
import subprocess
import tarfile
import time

import torch

import ringcoll

OUT = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "study")
COMMIT = "413bc5d0f98f8c45a99926cb4b68d22824d968ab"
URL = f"https://github.com/HLC-Lab/pico/blob/{COMMIT}/tracer/"
SYSTEMS = ("leonardo", "lumi")
#: Swing's (bine's) peer distances ρ(s) = Σ_{i ≤ s} (−2)^i
RHO = [(1 - (-2) ** (s + 1)) // 3 for s in range(24)]


def lumi_group(nid: int):
    """The LUMI cabinet (dragonfly group) of node ``nid`` as the tracer numbers it, or None
    outside its table. LUMI-C: 256 nodes per cabinet from nid 1000 (1000-1255 -> 1000, ...,
    2792-3047 -> 1007); LUMI-G: from nid 5001, 124 nodes per cabinet (the first 123), six
    cabinets per row 1100-1105, 1200-1205, 1300-1305, 1400-1405 (the last 126)."""
    if 1000 <= nid <= 3047:
        return 1000 + (nid - 1000) // 256
    if 5001 <= nid <= 7977:
        index = 0 if nid <= 5123 else min(1 + (nid - 5124) // 124, 23)
        return 1100 + 100 * (index // 6) + index % 6
    return None


def read(pico: str, path: str) -> bytes:
    """A file of HLC-Lab/pico at :data:`COMMIT`: from a git directory or a checkout."""
    if os.path.isdir(os.path.join(pico, "objects")):
        return subprocess.run(["git", "--git-dir", pico, "show", f"{COMMIT}:{path}"], check=True,
                              capture_output=True).stdout
    with open(os.path.join(pico, path), "rb") as f:
        return f.read()


def leonardo_cells(pico: str) -> dict:
    cells = {}
    for line in read(pico, "tracer/maps/leonardo.txt").decode().splitlines():
        parts = line.split()
        if "NODE" in parts and "CELL" in parts:
            cells[int(parts[parts.index("NODE") + 1])] = int(parts[parts.index("CELL") + 1])
    return cells


def jobs(pico: str, system: str, cells: dict):
    """(job file, hostnames, group of each rank) of every job the tracer keeps, in its order."""
    archive = tarfile.open(fileobj=io.BytesIO(read(pico, f"tracer/sinfo/{system}.tar.gz")))
    members = {os.path.basename(m.name): m for m in archive.getmembers() if m.isfile()}
    for name in sorted(members):                          # `ls`: job ids, all digits
        text = archive.extractfile(members[name]).read().decode()
        lines = text.count("\n")                          # `wc -l`: the last line needs its newline
        if "viz" in text or lines < 2:
            continue
        hosts = text.split("\n")[:lines]
        if system == "leonardo":
            groups = [cells.get(int(re.search(r"lrdn(\d+)", h).group(1))) for h in hosts]
        else:
            groups = [lumi_group(int(re.search(r"nid(\d+)", h).group(1))) for h in hosts]
            if None in groups:
                continue                                  # the tracer exits: no row
        if len(set(groups)) == 1:
            continue
        yield name, hosts, groups


def paper_bytes(groups, bine: bool) -> float:
    """Global-link bytes per vector byte of the authors' count (tracer/algo_patterns.json and
    tracer/trace_communications.py, restated): reduce-scatter step s sends n/2^(s+1) to the
    peer, all-gather step s n/2^(k-s) to the peer of step k − s − 1, over k steps; peers
    r ^ 2^s (Rabenseifner, k = int(log(p, 2))) or r ± ρ(s) mod p (bine, k = ⌈log(p, 2)⌉). A
    Rabenseifner at a non-power of two, and a bine at an odd p, first folds: with P the largest
    power of two ≤ p, each of the ranks 0 .. 2(p − P) − 1 counts 1 (odd ranks, to rank + 1) or
    1.5 (even ranks, to rank − 1) vector with that peer, and the butterfly runs on the even
    ones of them and every rank from 2(p − P) (renumbered); a bine at an even p runs its
    formulas on all p ranks. A peer outside the ranks has no group: counted global."""
    external = 0.0
    p = len(groups)
    if p & (p - 1) and (not bine or p % 2):
        extra = p - (1 << (p.bit_length() - 1))
        for r in range(2 * extra):
            peer, size = (r + 1, 1.0) if r % 2 else (r - 1, 1.5)
            if not (0 <= peer < p and groups[peer] == groups[r]):
                external += size
        groups = [g for r, g in enumerate(groups) if r >= 2 * extra or r % 2 == 0]
        p = len(groups)
    steps = math.ceil(math.log(p, 2)) if bine else int(math.log(p, 2))

    def peer(r, s):
        if not bine:
            return r ^ (2 ** s)
        return (r + RHO[s]) % p if r % 2 == 0 else (r - RHO[s] + p) % p

    for s in range(steps):
        for size, step in ((1 / 2 ** (s + 1), s), (1 / 2 ** (steps - s), steps - s - 1)):
            external += size * sum(1 for r in range(p) if not (peer(r, step) < p and groups[peer(r, step)] == groups[r]))
    return external


def placement_of(groups) -> list:
    """The group of each rank numbered 0, 1, ... in order of first appearance."""
    labels = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    return [labels[g] for g in groups]


def ringcoll_bytes(groups, name: str) -> int:
    """Bytes between groups of ringcoll's ``name`` all_reduce (4 MiB, float32), cost-only on
    the job's placement (the groups as nodes)."""
    placement = placement_of(groups)
    labels = set(placement)
    machine = ringcoll.Machine.hierarchical(max(placement.count(i) for i in labels), intra=(1e-6, 1e-11),
                                            inter=(1e-6, 1e-10), placement=placement)
    sim = ringcoll.simulate("all_reduce", name, len(groups), numel=1 << 20, dtype=torch.float32, data=False,
                            machine=machine, record=False)
    return sum(b for (src, dst), b in sim.stats.links.items() if placement[src] != placement[dst])


def truncate2(value: float) -> float:
    """bc's scale=2: two decimals, toward zero."""
    return math.trunc(value * 100) / 100


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pico", default="/work/.mirror/HLC-Lab+pico/repo",
                        help="HLC-Lab/pico: a git directory (fetched mirror) or a checkout")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    path = os.path.join(args.out, "bine_allocations.json")
    if args.report_only:
        with open(path) as f:
            doc = json.load(f)
    else:
        started = time.time()
        cells = leonardo_cells(args.pico)
        doc = {"source": URL, "commit": COMMIT, "jobs": []}
        for system in SYSTEMS:
            rows = read(args.pico, f"tracer/sinfo/{system}_allreduce_rabenseifner_vs_bine_bandwidth.csv")
            rows = [line.split(",") for line in rows.decode().split("\n")[1:] if line]
            kept = list(jobs(args.pico, system, cells))
            if len(kept) != len(rows):
                raise SystemExit(f"{system}: {len(kept)} jobs kept against {len(rows)} rows of the CSV")
            for (name, _hosts, groups), (nodes, count, reduction) in zip(kept, rows):
                rab, bine = paper_bytes(groups, False), paper_bytes(groups, True)
                again = truncate2((rab - bine) * 100 / rab) if rab else None
                if int(nodes) != len(groups) or int(count) != len(set(groups)) or \
                        (again is not None and abs(again - float(reduction)) > 0.011):
                    raise SystemExit(f"{system} {name}: the CSV row ({nodes}, {count}, {reduction}) is not "
                                     f"this job's ({len(groups)}, {len(set(groups))}, {again})")
                ours = {a: ringcoll_bytes(groups, a) for a in ("bine", "rabenseifner")}
                doc["jobs"].append({"system": system, "job": name, "nodes": len(groups), "groups": len(set(groups)),
                                    "placement": placement_of(groups),
                                    "paper": float(reduction),
                                    "ringcoll": 100 * (1 - ours["bine"] / ours["rabenseifner"])
                                    if ours["rabenseifner"] else 0.0,
                                    "bytes": ours})
            print(f"{system}: {len(kept)} jobs ({time.time() - started:.0f} s)", flush=True)
        doc["seconds"] = round(time.time() - started)
        with open(path, "w") as f:           # one job a line
            f.write(json.dumps({k: v for k, v in doc.items() if k != "jobs"})[:-1] + ', "jobs": [\n'
                    + ",\n".join(json.dumps(job, separators=(",", ":")) for job in doc["jobs"]) + "]}\n")
    write_report(doc, args.out)


def quartiles(values):
    """(first quartile, median, third quartile), linear interpolation (numpy's default)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def power_of_two(p: int) -> bool:
    return p & (p - 1) == 0


def summary(doc) -> dict:
    """Per system and kind ("powers of two", "others"): jobs, quartiles of ringcoll − paper
    (points), jobs within 0.5 points, quartiles of the paper's and of ringcoll's reductions."""
    out = {}
    for system in SYSTEMS:
        for kind, test in (("powers of two", power_of_two), ("others", lambda p: not power_of_two(p))):
            rows = [j for j in doc["jobs"] if j["system"] == system and test(j["nodes"])]
            if not rows:
                continue
            diff = sorted(j["ringcoll"] - j["paper"] for j in rows)
            out[(system, kind)] = {"jobs": len(rows), "difference": quartiles(diff),
                                   "within": sum(abs(d) <= 0.5 for d in diff),
                                   "paper": quartiles(sorted(j["paper"] for j in rows)),
                                   "ringcoll": quartiles(sorted(j["ringcoll"] for j in rows))}
    return out


def per_nodes(doc, system):
    """Per power-of-two node count: jobs, median paper and ringcoll reduction, median |difference|."""
    out = {}
    for p in sorted({j["nodes"] for j in doc["jobs"] if j["system"] == system and power_of_two(j["nodes"])}):
        rows = [j for j in doc["jobs"] if j["system"] == system and j["nodes"] == p]
        out[p] = (len(rows), statistics.median(j["paper"] for j in rows), statistics.median(j["ringcoll"] for j in rows),
                  max(abs(j["ringcoll"] - j["paper"]) for j in rows))
    return out


def write_report(doc, out) -> None:
    found = summary(doc)
    lines = ["# The Bine paper's Fig. 4, allocation by allocation", "",
             "Produced by `python -m experiments.study_bine_allocations` (do not edit: rerun it). "
             + __doc__.split("\n\n", 1)[1].replace("\n", " ").replace("``", "`").strip(), "",
             f"{len(doc['jobs'])} jobs; every CSV row was paired with its job (node and group counts equal, the "
             "authors' reduction recomputed from their formulas to its printed decimals). Reduction: % fewer bytes "
             "between groups of bine than of Rabenseifner (below 0: bine more). Difference: ringcoll's minus the "
             "paper's, in points.", "",
             "| system | node counts | jobs | difference: median (quartiles) | within ±0.5 points | paper: median (quartiles) | ringcoll: median (quartiles) |",
             "|---|---|---|---|---|---|---|"]
    for (system, kind), s in found.items():
        d, pa, rc = s["difference"], s["paper"], s["ringcoll"]
        lines.append(f"| {system} | {kind} | {s['jobs']} | {d[1]:+.2f} ({d[0]:+.2f} … {d[2]:+.2f}) | "
                     f"{s['within']} ({100 * s['within'] / s['jobs']:.0f}%) | {pa[1]:+.1f}% ({pa[0]:+.1f} … {pa[2]:+.1f}) | "
                     f"{rc[1]:+.1f}% ({rc[0]:+.1f} … {rc[2]:+.1f}) |")
    for system in SYSTEMS:
        table = per_nodes(doc, system)
        if not table:
            continue
        lines += ["", f"### {system}, powers of two: per node count", "",
                  "| nodes | jobs | paper median | ringcoll median | largest difference (points) |", "|---|---|---|---|---|"]
        lines += [f"| {p} | {n} | {a:+.2f}% | {b:+.2f}% | {w:.2f} |" for p, (n, a, b, w) in table.items()]
    with open(os.path.join(out, "bine_allocations.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
