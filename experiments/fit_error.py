"""How well ``ringcoll.fit`` predicts this machine's committed ``ringcoll-bench`` runs.

    python experiments/fit_error.py [--out bench/results/study/fit_error_np4.json] [RUN.json ...]

Fits one flat machine to the runs (default: every committed 4-rank gloo run) and reports
its error: per size band (the fit's own report), over the rows of 64 KiB and more, and
split into the collectives where every rank sends at once (all_reduce, all_gather,
reduce_scatter, all_to_all) and the rooted ones where few ranks are busy at a time
(broadcast, reduce, gather, scatter), with each group also fitted on its own. A gap between
the two groups is bandwidth the ranks share (cores, memory), which no per-rank-port
machine models.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics

from ringcoll.sim.fit import fit_samples, samples_from_bench

LARGE = 64 * 1024
GROUPS = {"every rank at once": ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
          "rooted": ("broadcast", "reduce", "gather", "scatter")}


def errors(result, samples) -> list:
    """Signed relative errors, predicted / measured - 1, of ``samples`` of ``LARGE`` bytes or more."""
    return [result.predict(s) / s.seconds - 1 for s in samples if s.nbytes >= LARGE]


def summary(errs: list) -> dict:
    return {"rows": len(errs), "median_abs": round(statistics.median(abs(e) for e in errs), 4),
            "median_signed": round(statistics.median(errs), 4),
            "within_25pct": round(sum(abs(e) <= 0.25 for e in errs) / len(errs), 4)}


def machine_of(result) -> dict:
    m = result.machine
    return {"alpha_us": round(m.alpha * 1e6, 1), "beta_gbps": round(1 / m.beta / 1e9, 3) if m.beta else None,
            "gamma_gbps": round(1 / m.gamma / 1e9, 3) if m.gamma else None, "tied": result.tied}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="ringcoll-bench JSON (default: bench/results/runs/*_np4_gloo.json)")
    p.add_argument("--out", default=os.path.join("bench", "results", "study", "fit_error_np4.json"))
    args = p.parse_args(argv)
    runs = args.runs or sorted(glob.glob(os.path.join("bench", "results", "runs", "*_np4_gloo.json")))
    samples = samples_from_bench(runs)
    joint = fit_samples(samples)
    doc = {"runs": runs, "joint": {"machine": machine_of(joint), "bands": joint.bands,
                                   "large": summary(errors(joint, joint.samples))}, "groups": {}}
    print(joint.report())
    print(f"  >= 64 KiB: {doc['joint']['large']}")
    for name, collectives in GROUPS.items():
        mine = [s for s in joint.samples if s.collective in collectives]
        alone = fit_samples([s for s in samples if s.collective in collectives])
        doc["groups"][name] = {"joint_fit": summary(errors(joint, mine)), "own_fit": machine_of(alone),
                               "own_fit_large": summary(errors(alone, alone.samples))}
        print(f"  {name}: joint fit {doc['groups'][name]['joint_fit']}; fitted alone "
              f"{doc['groups'][name]['own_fit']} {doc['groups'][name]['own_fit_large']}")
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
