"""The all_reduce algorithms on real network topologies: ``python -m experiments.study_topologies``.

Runs every registered all_reduce algorithm (cost-only, link sharing on) on a ring of 64, an
8x8 torus, a 64x64 torus (each also with a port per direction of each dimension, as the Swing
paper's nodes have), a 2:1 tapered fat-tree and a dragonfly, from 32 B to 1 GiB, and
writes bench/results/study/topologies.md with its tables and PNGs next to it (time relative
to the best per size, and link-load pictures of chosen runs). Rerun it after any change to
an algorithm's schedule (Bine's and Rabenseifner's orders, for instance): nothing in it is
hand-edited. ``--quick`` skips the 64x64 torus and the largest sizes (a smoke run);
``--add torus64x64:hierarchical,...`` runs only the algorithms named on one machine and
merges them into the results already written.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import ringcoll
from ringcoll.schedules import registry

OUT = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "study")

#: link and host parameters of every machine: 400 Gb/s links (the Swing paper's), 1 µs per
#: message at the ends, 100 ns per hop, reductions at 100 GB/s, one port per rank
LINK = dict(alpha=1e-6, beta=1 / 50e9, gamma=1 / 100e9, hop_latency=1e-7)
SIZES = [32, 1 << 10, 32 << 10, 1 << 20, 32 << 20, 1 << 30]
BIG_SIZES = [64 << 10, 16 << 20]          # the 64x64 torus: 4,096 ranks take longer
#: the dragonfly: groups, routers per group, hosts per router, global links per router
DRAGONFLY = (9, 4, 2, 2)


def machines(quick: bool):
    found = [
        ("ring of 64", "ring64", ringcoll.Machine.torus((64,), **LINK), 64, SIZES),
        ("8x8 torus", "torus8x8", ringcoll.Machine.torus((8, 8), **LINK), 64, SIZES),
        ("fat-tree 2:1 (radix 16, 64 of 128 hosts)", "fattree", ringcoll.Machine.fat_tree(16, oversubscription=2, **LINK),
         64, SIZES),
        ("dragonfly 9 groups x 4 routers x 2 hosts (64 of 72 hosts)", "dragonfly",
         ringcoll.Machine.dragonfly(*DRAGONFLY, **LINK), 64, SIZES),
    ]
    # the tori again with 2D ports per rank, one per direction of each dimension (the Swing
    # paper's multiported nodes): swing_torus_bandwidth sends its 2D Swings' messages at once
    found[2:2] = [
        ("ring of 64, 2 ports", "ring64p2", ringcoll.Machine.torus((64,), ports=2, **LINK), 64, SIZES),
        ("8x8 torus, 4 ports", "torus8x8p4", ringcoll.Machine.torus((8, 8), ports=4, **LINK), 64, SIZES),
    ]
    if not quick:
        found.append(("64x64 torus", "torus64x64", ringcoll.Machine.torus((64, 64), **LINK), 4096, BIG_SIZES))
        found.append(("64x64 torus, 4 ports", "torus64x64p4", ringcoll.Machine.torus((64, 64), ports=4, **LINK),
                      4096, BIG_SIZES))
    return found


def size_name(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def run(machine, world, name, nbytes):
    numel = max(1, nbytes // 4)
    sim = ringcoll.simulate("all_reduce", name, world=world, numel=numel, dtype=torch.float32, machine=machine,
                            data=False, record=False)
    net = sim.stats.network
    crossing = sim.stats.crossing
    busiest = max(net.link_busy, default=0.0)
    return sim, {"us": sim.stats.time * 1e6, "link_bound_us": busiest * 1e6,
                 "max_link_MiB": net.max_link_bytes / 2 ** 20,
                 "mean_link_MiB": net.mean_link_bytes / 2 ** 20, "hop_GiB": net.hop_bytes / 2 ** 30,
                 "crossing": crossing, "steps": sim.stats.steps,
                 "bottleneck": [list(b[1:4]) for b in net.bottlenecks(1)]}


def plot_relative(rows, names, sizes, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    for name in names:
        xs, ys = [], []
        for n in sizes:
            cell = rows.get((name, n))
            if cell is None:
                continue
            best = min(rows[(other, n)]["us"] for other in names if (other, n) in rows)
            xs.append(n)
            ys.append(cell["us"] / best)
        if xs:
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_name(n) for n in sizes], fontsize=8)
    ax.set_ylabel("time / best algorithm's time")
    ax.set_xlabel("all_reduce size")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite topologies.md from the topologies.json and pictures already in --out")
    parser.add_argument("--add", default=None, metavar="TAG:NAME,...",
                        help="run only these all_reduce algorithms on the machine TAG (e.g. torus64x64), at its "
                             "sizes, merge their rows into the topologies.json in --out and rewrite topologies.md")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.add:
        return add_rows(args.out, *args.add.split(":", 1))
    if args.report_only:
        return report_only(args.out)
    names = [n for n in registry.algorithms("all_reduce")]
    results = {}
    pictures = []
    started = time.time()
    for label, tag, machine, world, sizes in machines(args.quick):
        rows = {}
        for name in names:
            for nbytes in (sizes if not args.quick else sizes[:4]):
                t0 = time.time()
                sim, rows[(name, nbytes)] = run(machine, world, name, nbytes)
                print(f"{tag:11s} {name:20s} {size_name(nbytes):>8s} {rows[(name, nbytes)]['us']:12.1f} us "
                      f"({time.time() - t0:.1f} s)", flush=True)
                if (tag, nbytes, name) in PICTURES:
                    path = os.path.join(args.out, f"topologies_links_{tag}_{name}_{nbytes >> 20}MiB.png")
                    sim.plot_links(path)
                    pictures.append((tag, name, nbytes, os.path.basename(path)))
        used = [n for n in names if any((n, s) in rows for s in sizes)]
        plot_relative(rows, used, sizes if not args.quick else sizes[:4],
                      f"all_reduce on the {label}, p = {world}: time relative to the best",
                      os.path.join(args.out, f"topologies_{tag}.png"))
        results[tag] = (label, machine.describe(), world, sizes if not args.quick else sizes[:4], rows, used)
        # written after every machine, so that a long run cut short keeps what it did
        with open(os.path.join(args.out, "topologies.json"), "w") as f:
            json.dump({tag: {"label": label, "machine": m, "world": w,
                             "rows": [{"algorithm": a, "bytes": n, **cell} for (a, n), cell in rows.items()]}
                       for tag, (label, m, w, _, rows, _) in results.items()}, f, indent=1)
        write_report(results, pictures, os.path.join(args.out, "topologies.md"), time.time() - started)


def add_rows(out: str, tag: str, names: str) -> None:
    """Run ``names`` (comma-separated) on the machine ``tag`` at its sizes, put their rows into
    ``out``/topologies.json (replacing theirs) and rewrite topologies.md (:func:`report_only`)."""
    found = {t: (label, machine, world, sizes) for label, t, machine, world, sizes in machines(False)}
    if tag not in found:
        raise SystemExit(f"--add: machine must be one of {sorted(found)}, got {tag!r}")
    label, machine, world, sizes = found[tag]
    path = os.path.join(out, "topologies.json")
    with open(path) as f:
        doc = json.load(f)
    names = names.split(",")
    rows = [r for r in doc[tag]["rows"] if r["algorithm"] not in names]
    for name in names:
        for nbytes in sizes:
            t0 = time.time()
            _, cell = run(machine, world, name, nbytes)
            rows.append({"algorithm": name, "bytes": nbytes, **cell})
            print(f"{tag:11s} {name:20s} {size_name(nbytes):>8s} {cell['us']:12.1f} us ({time.time() - t0:.1f} s)",
                  flush=True)
    doc[tag]["rows"] = rows
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    order = list(registry.algorithms("all_reduce"))
    cells = {(r["algorithm"], r["bytes"]): r for r in rows}
    used = sorted({a for a, _ in cells}, key=lambda a: order.index(a) if a in order else len(order))
    plot_relative(cells, used, sizes, f"all_reduce on the {label}, p = {world}: time relative to the best",
                  os.path.join(out, f"topologies_{tag}.png"))
    report_only(out)


def report_only(out: str) -> None:
    """topologies.md again from topologies.json and the link pictures in ``out``."""
    with open(os.path.join(out, "topologies.json")) as f:
        doc = json.load(f)
    order = list(registry.algorithms("all_reduce"))
    results = {}
    for tag, entry in doc.items():
        rows = {(r["algorithm"], r["bytes"]): r for r in entry["rows"]}
        sizes = sorted({n for _, n in rows})
        used = sorted({a for a, _ in rows}, key=lambda a: order.index(a) if a in order else len(order))
        labels = {t: label for label, t, *_ in machines(False)}
        results[tag] = (entry.get("label", labels.get(tag, tag)), entry["machine"], entry["world"], sizes, rows, used)
    pictures = []
    for name in sorted(os.listdir(out)):
        if name.startswith("topologies_links_") and name.endswith(".png"):
            for tag in results:
                prefix = f"topologies_links_{tag}_"
                if name.startswith(prefix):
                    algorithm, mib = name[len(prefix):-len("MiB.png")].rsplit("_", 1)
                    pictures.append((tag, algorithm, int(mib) << 20, name))
    write_report(results, pictures, os.path.join(out, "topologies.md"), 0.0)


#: link-load pictures: (machine tag, size, algorithm)
PICTURES = {("torus8x8", 32 << 20, "recursive_doubling"), ("torus8x8", 32 << 20, "swing_bandwidth"),
            ("torus8x8", 32 << 20, "ring"), ("torus8x8", 32 << 20, "rabenseifner"),
            ("dragonfly", 32 << 20, "bine"), ("dragonfly", 32 << 20, "rabenseifner"),
            ("fattree", 32 << 20, "bine"), ("fattree", 32 << 20, "rabenseifner"),
            ("torus64x64", 16 << 20, "swing_bandwidth"), ("torus64x64", 16 << 20, "rabenseifner"),
            ("torus8x8p4", 32 << 20, "swing_torus_bandwidth"), ("torus64x64p4", 16 << 20, "swing_torus_bandwidth")}


def ratio(rows, a, b, n):
    if (a, n) in rows and (b, n) in rows:
        return rows[(b, n)]["us"] / rows[(a, n)]["us"]
    return None


def write_report(results, pictures, path, seconds):
    lines = ["# all_reduce on network topologies (simulated)", "",
             "Produced by `python -m experiments.study_topologies` (do not edit: rerun it"
             + (f"; this run took {seconds / 60:.0f} min on two shared cores" if seconds else "")
             + "). Every registered all_reduce "
             "algorithm runs cost-only on ringcoll's clock with link sharing "
             "([docs/simulator.md](../../../docs/simulator.md#networks-topologies-routing-link-sharing)): "
             "400 Gb/s links (β = 1/50 GB/s), α = 1 µs per message, 100 ns per hop, reductions at 100 GB/s, "
             "one send and one receive port per rank (2D of each, one per direction of each dimension, on the "
             "tori marked \"ports\"), ranks placed linearly (rank r on host r), float32. "
             "Links serve messages first come first served, each for its wire time in the earliest gap "
             "that fits (no packet interleaving), so a link shared by k messages at once stretches the "
             "step k-fold.", ""]
    every = sorted({n for *_, sizes, _, _ in results.values() for n in sizes})
    lines += ["## Who wins where", "", "The fastest algorithm per topology and size (ties: the first registered), "
              "and its lead over the runner-up:", "",
              "| topology | " + " | ".join(size_name(n) for n in every) + " |", "|---|" + "---|" * len(every)]
    for _tag, (label, _, world, _sizes, rows, used) in results.items():
        cells = []
        for n in every:
            present = sorted((rows[(o, n)]["us"], used.index(o), o) for o in used if (o, n) in rows)
            if not present:
                cells.append("–")
                continue
            runner = next((t for t, _, o in present[1:] if t > present[0][0]), None)
            lead = f" ({runner / present[0][0]:.2f}×)" if runner else ""
            cells.append(present[0][2] + lead)
        lines.append(f"| {label}, p = {world} | " + " | ".join(cells) + " |")
    lines += [""]
    for tag, (label, machine, world, sizes, rows, used) in results.items():
        lines += [f"## {label} (p = {world})", "", f"Machine: {machine}.", "",
                  f"![time relative to the best](topologies_{tag}.png)", "",
                  "Time in µs (best per size in bold); below the table, the winner's link load.", "",
                  "| algorithm | " + " | ".join(size_name(n) for n in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for name in used:
            cells = []
            for n in sizes:
                cell = rows.get((name, n))
                if cell is None:
                    cells.append("–")
                    continue
                best = min(rows[(o, n)]["us"] for o in used if (o, n) in rows)
                text = f"{cell['us']:.4g}"
                cells.append(f"**{text}**" if cell["us"] == best else text)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        missing = [n for n in registry.algorithms("all_reduce") if n not in used]
        if missing:
            lines += ["", f"Not run on this machine: {', '.join(missing)}."]
        lines += ["", "The busiest link's busy time is a lower bound on the run (its wire time alone); "
                  "where the time is close to it, that link is the bottleneck.", "",
                  "| size | winner | µs | busiest link µs | max link MiB | mean link MiB | hop-GiB | "
                  "group-crossing messages | hop-GiB of recursive_doubling / swing_bandwidth / rabenseifner / bine |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for n in sizes:
            present = [o for o in used if (o, n) in rows]
            win = min(present, key=lambda o: rows[(o, n)]["us"])
            cell = rows[(win, n)]
            others = " / ".join(f"{rows[(o, n)]['hop_GiB']:.3g}" if (o, n) in rows else "–"
                                for o in ("recursive_doubling", "swing_bandwidth", "rabenseifner", "bine"))
            lines.append(f"| {size_name(n)} | {win} | {cell['us']:.4g} | {cell['link_bound_us']:.4g} | "
                         f"{cell['max_link_MiB']:.3g} | {cell['mean_link_MiB']:.3g} | "
                         f"{cell['hop_GiB']:.3g} | {cell['crossing']} | {others} |")
        lines += [""]
        lines += findings(tag, rows, sizes)
        lines += [""]
    if pictures:
        lines += ["## Link loads", "", "Bytes per directed link (`sim.plot_links`), for the runs named:", ""]
        for tag, name, nbytes, file in sorted(pictures):
            lines += [f"- {tag}, {name}, {size_name(nbytes)}: ![{name}]({file})"]
        lines += [""]
    lines += papers(results)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def findings(tag, rows, sizes):
    """Sentences computed from the rows: who wins where, and the ratios the papers report."""
    out = []
    big = sizes[-1]
    small = sizes[0]
    for n in (small, big):
        present = [o for (o, m) in rows if m == n]
        ranked = sorted(present, key=lambda o: rows[(o, n)]["us"])
        tied = [o for o in ranked if rows[(o, n)]["us"] == rows[(ranked[0], n)]["us"]]
        ranked = tied[:1] + ranked[len(tied):]
        if len(ranked) > 1:
            out.append(f"- At {size_name(n)} {' and '.join(tied)} win{'s' if len(tied) == 1 else ''}, "
                       f"{ranked[1]} is {rows[(ranked[1], n)]['us'] / rows[(ranked[0], n)]['us']:.2f}× slower, "
                       f"the slowest ({ranked[-1]}) {rows[(ranked[-1], n)]['us'] / rows[(ranked[0], n)]['us']:.3g}×.")
    def best(faster: str, slower: str):
        """(size, ratio) where ``faster`` gains most on ``slower``, or None."""
        found = [(n, r) for n, r in ((n, ratio(rows, faster, slower, n)) for n in sizes) if r]
        return max(found, key=lambda x: x[1]) if found else None

    if best("swing_bandwidth", "recursive_doubling"):
        n, r = best("swing_bandwidth", "recursive_doubling")
        out.append(f"- swing_bandwidth against recursive_doubling: up to {r:.2f}× faster (at {size_name(n)}).")
    if best("swing_bandwidth", "rabenseifner"):
        n, r = best("swing_bandwidth", "rabenseifner")
        out.append(f"- swing_bandwidth against rabenseifner (same steps and bytes per rank, other peers): "
                   f"up to {r:.2f}× faster (at {size_name(n)}); hop-bytes "
                   f"{rows[('swing_bandwidth', n)]['hop_GiB']:.3g} against {rows[('rabenseifner', n)]['hop_GiB']:.3g} GiB.")
    for baseline in ("torus2d", "rabenseifner", "swing_bandwidth"):
        if best("swing_torus_bandwidth", baseline):
            n, r = best("swing_torus_bandwidth", baseline)
            out.append(f"- swing_torus_bandwidth (a Swing per port, on the torus's dimensions) against {baseline}: "
                       f"up to {r:.2f}× faster (at {size_name(n)}); busiest link "
                       f"{rows[('swing_torus_bandwidth', n)]['max_link_MiB']:.3g} "
                       f"against {rows[(baseline, n)]['max_link_MiB']:.3g} MiB.")
    if best("bine", "rabenseifner"):
        n, r = best("bine", "rabenseifner")
        cross = (rows[("bine", n)]["crossing"], rows[("rabenseifner", n)]["crossing"])
        out.append(f"- bine against rabenseifner: up to {r:.2f}× faster (at {size_name(n)}); messages crossing "
                   f"a group (leaf switch, dragonfly group): {cross[0]} against {cross[1]}.")
    return out


PAPER_MAX = 128 << 20       # the Swing paper's sizes: 32 B to 128 MiB
SOURCES = (
    "Sources searched for the papers' numbers: the arXiv HTML of both papers (2401.09356v2; "
    "2508.17311v1 and v2; only their openings, the abstract and the start of the introduction, could "
    "be read here), the USENIX NSDI '24 page of the Swing paper, Sapienza's IRIS record of "
    "the Bine paper (iris.uniroma1.it/handle/11573/1753565), stored web pages and GitHub issues "
    "(queries on Swing's torus results: 64x64, 8x8, goodput, SST simulation), and the authors' "
    "repositories HLC-Lab/bine-trees, HLC-Lab/bine_trees_fugaku (libswing and raw 2023 Piz Daint and "
    "Alps runs, no mapping to a paper figure; its data/ folder is gone from the newest commit) and "
    "HLC-Lab/pico (the Bine paper's benchmark suite; `plot/sc25.sh` names the file behind each of the "
    "paper's figures; its full benchmark data is archived on Zenodo, doi 10.5281/zenodo.20796082, out "
    "of reach here). github:HLC-Lab/swing-allreduce and github:DanieleDeSensi/swing could not be "
    "fetched; no repository with the Swing paper's simulation data was found, but the paper itself "
    "is in the first author's site repository (DanieleDeSensi/danieledesensi.github.io, "
    "assets/pdf/2024_Swing.pdf, the 17-page preprint). So: **Swing: the whole paper**, its network, "
    "tori and baselines rerun setting by setting in [swing_paper.md](swing_paper.md) (below: its "
    "headline against this study's machines); **Bine: the data of its Fig. 4** (global-link traffic per node "
    "count, below); the data of its Figs. 7a/8a (all_reduce speedups per node count and size on LUMI "
    "and Leonardo) are listed in HLC-Lab/pico's results/*_metadata.csv, but the 64-node all_reduce "
    "runs' archives are absent from the snapshot reachable here. Each paper number below is quoted "
    "exactly from where it is named, or computed from the authors' data file named beside it, and set "
    "against ringcoll's numbers for the closest setting it has.")

#: The Bine paper's Fig. 4 (SC '25; HLC-Lab/pico plot/sc25.sh: "# Fig. 4" copies
#: tracer/sinfo/multi_box_min_None_allreduce_rabenseifner_vs_bine_bandwidth.pdf, drawn by
#: tracer/sinfo/plot.py from tracer/sinfo/{leonardo,lumi}_allreduce_rabenseifner_vs_bine_bandwidth.csv
#: at commit 413bc5d0f98f8c45a99926cb4b68d22824d968ab): per real job allocation (one week of
#: Leonardo's, two of LUMI's), the % fewer bytes on global links of all_reduce bine_bandwidth than of
#: Rabenseifner in MPICH's order (tracer/algo_patterns.json: reduce-scatter step s to r ^ 2^s,
#: n/2^(s+1)). The box statistics per power-of-two node count (the figure's boxes: quartiles by
#: linear interpolation, mean; fliers hidden), computed here from those CSVs:
#: nodes -> {system: (jobs, first quartile, median, third quartile, mean)}
BINE_FIG4 = {
    4: {"Leonardo": (381, 0.00, 0.00, 0.00, 2.06), "LUMI": (425, 0.00, 0.00, 0.00, 0.67)},
    8: {"Leonardo": (291, 0.00, 0.00, 0.00, -1.34), "LUMI": (527, 0.00, 0.00, 0.00, -4.46)},
    16: {"Leonardo": (251, 0.00, 0.00, 11.94, -0.08), "LUMI": (320, -4.96, 0.00, 7.69, -5.53)},
    32: {"Leonardo": (96, 6.36, 12.98, 17.14, 8.96), "LUMI": (322, -7.84, 4.38, 13.96, -3.78)},
    64: {"Leonardo": (45, 10.00, 15.82, 20.67, 11.33), "LUMI": (147, -4.42, 8.98, 15.76, 1.30)},
    128: {"Leonardo": (44, 11.23, 15.96, 20.64, 14.94), "LUMI": (43, 13.52, 16.33, 19.29, 13.30)},
    256: {"Leonardo": (8, 21.28, 22.25, 26.44, 24.11), "LUMI": (49, 13.53, 18.76, 20.68, 11.81)},
    512: {"LUMI": (70, 11.14, 18.18, 21.77, 16.15)},
    1024: {"LUMI": (9, 14.57, 18.43, 19.62, 18.61)},
    2048: {"LUMI": (2, 21.13, 22.11, 23.08, 22.11)},
}
BINE_FIG4_URL = ("https://github.com/HLC-Lab/pico/blob/413bc5d0f98f8c45a99926cb4b68d22824d968ab/"
                 "tracer/sinfo/")


def bine_replay_lines() -> list:
    """The Bine paper's Fig. 4 replayed job by job (bine_allocations.json, written by
    ``python -m experiments.study_bine_allocations``): its summary for this report."""
    from experiments.study_bine_allocations import summary

    path = os.path.join(OUT, "bine_allocations.json")
    if not os.path.exists(path):
        return ["The per-allocation replay (`python -m experiments.study_bine_allocations`) has not been run."]
    with open(path) as f:
        doc = json.load(f)
    found = summary(doc)
    lines = [f"ringcoll, the same measure on the same allocations ([bine_allocations.md](bine_allocations.md), "
             f"{len(doc['jobs'])} jobs): each job's nodes placed in their dragonfly groups as the authors' tracer "
             f"data lists them (`Machine.hierarchical(placement=)`, the groups as nodes), ringcoll's `bine` and "
             f"`rabenseifner` all_reduce run cost-only, and the bytes between groups compared. Difference: "
             f"ringcoll's reduction minus the paper's for the same job, in points.", "",
             "| system | node counts | jobs | difference: median (quartiles) | within ±0.5 points | paper: median | ringcoll: median |",
             "|---|---|---|---|---|---|---|"]
    for (system, kind), row in found.items():
        d = row["difference"]
        lines.append(f"| {system} | {kind} | {row['jobs']} | {d[1]:+.2f} ({d[0]:+.2f} … {d[2]:+.2f}) | "
                     f"{row['within']} of {row['jobs']} | {row['paper'][1]:+.1f}% | {row['ringcoll'][1]:+.1f}% |")
    powers = [row for (system, kind), row in found.items() if kind == "powers of two"]
    others = [row for (system, kind), row in found.items() if kind == "others"]
    every = all(row["within"] == row["jobs"] for row in powers)
    lines += ["", f"- **{'Agreement' if every else 'Disagreement'} per allocation at powers of two**: "
              + (f"on every one of the {sum(r['jobs'] for r in powers)} jobs ringcoll's reduction is the paper's "
                 f"within 0.5 points (the same pairs and halvings counted on the same placement)" if every else
                 f"{sum(r['within'] for r in powers)} of {sum(r['jobs'] for r in powers)} jobs within 0.5 points")
              + ". The paper's Fig. 4 is reproduced job by job where both count the same schedules.",
              f"- **Other node counts** ({sum(r['jobs'] for r in others)} jobs): the paper's count folds a "
              f"Rabenseifner at any non-power of two and a bine only at odd p (its first even rank paired with "
              f"rank −1, outside the job, counted global), and runs bine's power-of-two formulas mod p at even p; "
              f"ringcoll's schedules fold both as MPICH does, so the two measure different schedules there: "
              + "; ".join(f"{system} median difference {row['difference'][1]:+.1f} points "
                          f"({row['within']} of {row['jobs']} within 0.5)"
                          for (system, kind), row in found.items() if kind == "others") + "."]
    return lines


#: ringcoll's Swings: the 1-D schedules and the paper's multi-dimensional, multiported form
SWINGS = ("swing_bandwidth", "swing_latency", "swing_torus_bandwidth", "swing_torus_latency")


def _swing_time(rows, n):
    return min(rows[(a, n)]["us"] for a in SWINGS if (a, n) in rows)


def _best_other(rows, n, exclude):
    """(µs, name) of the fastest algorithm at size ``n`` outside ``exclude`` (a tie: the first
    registered, so the ring, not the hierarchical all-reduce that is the ring without nodes)."""
    order = list(registry.algorithms("all_reduce"))
    others = [(cell["us"], order.index(a) if a in order else len(order), a)
              for (a, m), cell in rows.items() if m == n and a not in exclude]
    return min(others)[::2] if others else None


def _up_to(rows, faster, baseline, sizes):
    """(ratio, size) of ``faster``'s largest gain on ``baseline`` (time ratio), or None."""
    found = [(rows[(baseline, n)]["us"] / faster(n), n) for n in sizes if (baseline, n) in rows]
    return max(found) if found else None


#: what the less known winners are, where the report names them
DEFINED = {"torus2d": "`torus2d`: ring reduce-scatter along rows, ring all-reduce along columns, ring all-gather "
                      "along rows",
           "bucket_torus": "`bucket_torus`: the paper's own bucket baseline on every port, 2D rings at once"}


def papers(results) -> list:
    """The papers' headline numbers, quoted, beside ringcoll's for the closest settings (computed
    from ``results``), with agreement or disagreement said."""
    out = ["## Against the papers", "", SOURCES, "",
           "### Swing (De Sensi, Bonato, Saam, Hoefler, NSDI '24, pp. 1445–1462; arXiv 2401.09356)", "",
           "The paper (abstract, arXiv 2401.09356v2 and the USENIX NSDI '24 paper page): \"Swing "
           "outperforms by up to 3x existing allreduce algorithms for vectors ranging from 32B to "
           "128MiB, on different types of torus and torus-like topologies, regardless of their shape "
           "and size\". Closest here: the tori below, sizes within 32 B – 128 MiB; \"Swing\" is the "
           "fastest of `swing_torus_bandwidth` and `swing_torus_latency` (the paper's forms: one Swing per "
           "port on the torus's dimensions), "
           "`swing_bandwidth` and `swing_latency` (the 1-D schedules over rank numbers).", ""]
    swing_names = SWINGS + ("bine",)     # bine's all_reduce times as swing_bandwidth
    # per kind of node, one port or a port per direction: [Swing's wins, cells, {winner: cells}]
    tally = {False: [0, 0, {}], True: [0, 0, {}]}
    largest = None                       # (gain over the best other algorithm, torus, size)
    for tag, (label, _, world, sizes, rows, _) in results.items():
        if not ("torus" in tag or "ring" in tag) or not any(("swing_bandwidth", n) in rows for n in sizes):
            continue
        counts = tally["ports" in label]
        within = [n for n in sizes if n <= PAPER_MAX and ("swing_bandwidth", n) in rows]
        against = []
        for n in within:
            other = _best_other(rows, n, swing_names)
            r = other[0] / _swing_time(rows, n)
            counts[0] += r > 1
            counts[1] += 1
            if largest is None or r > largest[0]:
                largest = (r, label, n, other[1])
            if r < 1:
                counts[2][other[1]] = counts[2].get(other[1], 0) + 1
            against.append(f"{size_name(n)} {r:.2f}× ({other[1]})")
        per = []
        for baseline in ("recursive_doubling", "rabenseifner", "ring", "torus2d", "bucket_torus"):
            best = _up_to(rows, lambda n: _swing_time(rows, n), baseline, within)
            if best:
                per.append(f"{baseline} {best[0]:.2f}× (at {size_name(best[1])})")
        out.append(f"- {label}, p = {world}: Swing against the fastest other algorithm of each size "
                   f"(above 1: Swing faster): {', '.join(against)}. Swing's largest gain on each baseline: "
                   f"{', '.join(per)} (below 1: Swing slower at every size).")
    multiport = tally[True][1] > 0
    out += [""]
    for ports, (wins, cells, winners) in tally.items():
        if not cells:
            continue
        where = ("the tori and rings with a port per direction (the paper's nodes)" if ports
                 else "the tori and rings with one port per rank")
        beaten_by = ", ".join(f"{name} in {count}" for name, count in sorted(winners.items(), key=lambda x: -x[1]))
        if wins < cells:
            named = [DEFINED[name] for name in DEFINED if name in winners]
            out.append(f"- **Disagreement** with \"regardless of their shape and size\" on {where}: in ringcoll's "
                       f"model Swing is the fastest in {wins} of the {cells} cells within 32 B – 128 MiB; the others "
                       f"go to {beaten_by}" + (f" ({'; '.join(named)})" if named else "") + ".")
        else:
            out.append(f"- **Agreement** with \"regardless of their shape and size\" on {where}: Swing is the "
                       f"fastest in all {cells} cells within 32 B – 128 MiB.")
    if largest is not None:
        verdict = "**Agreement in size**" if 2.25 <= largest[0] <= 3.75 else "**Disagreement in size**"
        out.append(f"- {verdict} with \"up to 3x\": Swing's largest gain on the fastest other algorithm is "
                   f"{largest[0]:.2f}× ({largest[1]}, {size_name(largest[2])}, against {largest[3]}); "
                   + ("it comes from the multiported tori, where the paper's form sends a message on every "
                      "port at once, " if multiport else "")
                   + "while on one port per rank the 1-D forms' gains over Rabenseifner stay small or turn to "
                   "losses (the lines above). The paper's 3× comes from its rectangular 128x8 and 256x4 tori "
                   "(Sec. 5.2); its tori, network and baselines are rerun in [swing_paper.md](swing_paper.md).")
    out += ["",
            "### Bine trees (De Sensi, Pasqualoni, Piarulli, Bonato, Ba, Turisini, Domke, Hoefler, SC '25, "
            "doi 10.1145/3712285.3759835; arXiv 2508.17311)", "",
            "The paper (abstract, arXiv 2508.17311v2): Bine trees \"maintain the generality of binomial trees "
            "and butterflies while cutting global-link traffic by up to 33%\" and achieve \"up to 5× speedups\" "
            "on Dragonfly, Dragonfly+, oversubscribed fat-tree and torus systems; Sapienza's IRIS record: "
            "\"up to 5x speedups and 33% less global traffic on four supercomputers with four different "
            "topologies\". Closest here: the 2:1 fat-tree and the dragonfly, p = 64. This study records "
            "hop-bytes (bytes × links crossed, every link) and messages crossing a group (leaf switch, "
            "dragonfly group), not global-link bytes, so the 33% is set against those.", ""]
    for tag, (label, _, world, sizes, rows, _) in results.items():
        if tag not in ("fattree", "dragonfly") or not any(("bine", n) in rows for n in sizes):
            continue
        within = [n for n in sizes if n <= PAPER_MAX and ("bine", n) in rows]
        n = within[-1]
        b = rows[("bine", n)]
        parts, speed = [], []
        for baseline in ("recursive_doubling", "rabenseifner_far", "rabenseifner"):
            if (baseline, n) not in rows:
                continue
            o = rows[(baseline, n)]
            parts.append(f"{baseline} {100 * (b['hop_GiB'] / o['hop_GiB'] - 1):+.0f}% hop-bytes "
                         f"({b['hop_GiB']:.3g} against {o['hop_GiB']:.3g} GiB), {b['crossing']} against "
                         f"{o['crossing']} group-crossing messages")
            best = _up_to(rows, lambda m: rows[("bine", m)]["us"], baseline, within)
            speed.append(f"{baseline} {best[0]:.2f}× (at {size_name(best[1])})")
        out.append(f"- {label}, p = {world}, {size_name(n)}: bine against {'; '.join(parts)}. bine's "
                   f"largest speedup on each (below 1: bine slower everywhere): {', '.join(speed)}.")
    out += ["", f"The paper's Fig. 4, per node count: % fewer global-link bytes of bine than of MPICH-order "
            f"Rabenseifner over real job allocations (median, quartiles, mean; computed from the authors' "
            f"data, [leonardo_…csv]({BINE_FIG4_URL}leonardo_allreduce_rabenseifner_vs_bine_bandwidth.csv) and "
            f"[lumi_…csv]({BINE_FIG4_URL}lumi_allreduce_rabenseifner_vs_bine_bandwidth.csv), which "
            f"`plot/sc25.sh` turns into Fig. 4; the figure marks 33% as the theoretical upper bound):", "",
            "| nodes | Leonardo (Dragonfly+): jobs, median (quartiles), mean | LUMI (Dragonfly): jobs, median (quartiles), mean |",
            "|---|---|---|"]
    for nodes, systems in BINE_FIG4.items():
        cells = [f"{j}, {m:+.1f}% ({q1:+.1f} … {q3:+.1f}), {mean:+.1f}%" if j else "–"
                 for j, q1, m, q3, mean in (systems.get(name, (0,) * 5) for name in ("Leonardo", "LUMI"))]
        out.append(f"| {nodes} | {cells[0]} | {cells[1]} |")
    out += ["", *bine_replay_lines(), "",
            "- **Agreement** against the full-vector butterfly (recursive doubling) and the far-first "
            "(distance-halving) Rabenseifner: bine moves far fewer hop-bytes and is faster at large sizes "
            "(though it sends more group-crossing messages than both); "
            "its cut on `rabenseifner_far` is of the paper's order (33%), though measured on every link, "
            "not only global ones. The speedups stay below the paper's 5×.",
            "- Against MPICH-order Rabenseifner (distance doubling), the paper's own baseline, on the "
            "linearly placed machines above bine moves more hop-bytes, crosses groups more often and is "
            "slower: aligned groups of consecutive ranks are Rabenseifner's best case (its first steps, "
            "n/2 + n/4 + ..., stay inside a group). That is one placement, not the paper's setting; the "
            "replay of the paper's own allocations (above) is the comparison with its Fig. 4.", "",
            "### Caveats of this comparison", "",
            "- ringcoll's `swing_bandwidth` and `swing_latency` are the 1-D schedules over rank numbers "
            "(peers r ± ρ(s), ρ = 1, −1, 3, −5, 11, …): on a 2-D torus placed linearly their far peers "
            "leave their row through the y links. `swing_torus_bandwidth` and `swing_torus_latency` are the "
            "paper's multi-dimensional forms (Section 4, libswing's multi-port code): 2D Swings at once on "
            "2D parts of the vector, each taking the dimensions in turn from its own, half of them "
            "mirrored, on the machine's torus (`layout[\"grid\"]`). Their departures: dimensions that are "
            "not powers of two fall back to a 2-D power-of-two grid, worlds that are not powers of two "
            "fold first (MPICH), where the paper has schemes of its own, and the latency form runs its "
            "steps far partner first (bitwise-identical floats; same pairs and cost).",
            "- Routing matters as much as peers: dimension order sends a distance of exactly k/2 the + way, "
            "so recursive doubling's and Rabenseifner's exchanges at distance k/2 (every rank at once) load "
            "each + link of that dimension twice while the − links idle (the bright + links in the 8x8 "
            "pictures). Swing's peers at odd distances avoid ties.",
            "- Tied rows (swing_bandwidth and bine; ring and hierarchical, which without nodes is the ring) "
            "draw on top of each other in the pictures.",
            "- The link model is whole messages per link, first come first served; one port per rank "
            "except on the machines marked \"ports\"; the papers' runs use packet-level simulation and real "
            "machines, so ratios are not expected to match theirs exactly.",
            "- `rabenseifner` here is MPICH's order (distance doubling: the biggest halves travel the "
            "shortest distance); the far-first order is `rabenseifner_far`, kept for comparison. ringcoll's "
            "`bine` all_reduce times exactly as `swing_bandwidth`."]
    return out

if __name__ == "__main__":
    main()
