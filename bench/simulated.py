"""``ringcoll-bench --simulate MACHINE``: the nccl-tests-style tables on a simulated GPU cluster.

Every registered algorithm of each collective is timed by the simulator's clock (a cost-only
run, :func:`ringcoll.simulate` with ``data=False``) on ``ringcoll.Machine.preset(MACHINE,
nodes=--nodes)``, and beside them the row of NCCL's own model (:mod:`ringcoll.cost.nccl`: the
algorithm × protocol × channels its tuner picks, at its formulas' time), and for all_reduce
the row ``NCCL (clock)``: that pick run on the clock under its protocol (``simulate(...,
"nccl")``, plus the protocol's per-call launch latency). ``vs NCCL`` is an
algorithm's time over that row's. The sizes, collectives, JSON, CSV, text and PNG are those of
a real run (``-b``, ``-e``, ``-f``, ``--collective``, ``--algorithms``, ``--out``).
"""
from __future__ import annotations

import datetime
import os
from typing import List

from .harness import Row
from .specs import OUT_OF_PLACE, SPECS

#: the NCCL model's row in the tables
NCCL_ROW = "NCCL (model)"
#: all_reduce's row of NCCL's pick run on the clock under its protocol (simulate(..., "nccl"))
NCCL_CLOCK_ROW = "NCCL (clock)"
#: the collectives NCCL's model prices: bench spec -> (NCCL's collective, simulate's builder)
MODELLED = {"all_reduce": ("all_reduce", "all_reduce"), "broadcast": ("broadcast", "broadcast"),
            "reduce": ("reduce", "reduce"),
            "all_gather_single": ("all_gather", "all_gather_into_tensor"),
            "reduce_scatter_single": ("reduce_scatter", "reduce_scatter_tensor")}


def rows_for(spec_name: str, machine, world: int, sizes: List[int], algorithms=None) -> tuple:
    """(rows, NCCL's picks) of one collective: per size NCCL's model's row, then every
    algorithm's simulated time (float32 elements; the size is the whole vector, all ranks'
    blocks together for all_gather and reduce_scatter, as nccl-tests counts it and as NCCL's
    model is given it here), each with algbw, busbw and time / NCCL's; the root is rank 0."""
    import torch

    import ringcoll
    from ringcoll.cost import nccl

    spec = SPECS[spec_name]
    collective, builder = MODELLED[spec_name]
    names = [a for a in ringcoll.algorithms(spec.family) if algorithms is None or a in algorithms]
    rows, picks = [], []
    for size in sizes:
        numel = spec.numel(size, 4, world)
        nbytes = numel * 4
        pick = nccl.choose(collective, nbytes, world, machine)
        picks.append(f"{nbytes} B: {pick.algorithm}/{pick.protocol}/{pick.channels} channels")
        count = spec.count(numel, world)

        def row(name, seconds, ratio):
            algbw = nbytes / seconds / 1e9 if seconds else None
            return Row(spec_name, OUT_OF_PLACE, name, nbytes, count, "float", "sum", 0, seconds * 1e6,
                       algbw, algbw * spec.bus_factor(world) if algbw else None, None, ratio)
        rows.append(row(NCCL_ROW, pick.time, 1.0))
        if collective == "all_reduce":
            sim = ringcoll.simulate(builder, "nccl", world, numel=numel, dtype=torch.float32, machine=machine,
                                    data=False, record=False)
            rows.append(row(NCCL_CLOCK_ROW, sim.stats.time + sim.protocol.launch, sim.nccl_ratio))
        for name in names:
            sim = ringcoll.simulate(builder, name, world, numel=numel, dtype=torch.float32, machine=machine,
                                    data=False, record=False)
            rows.append(row(name, sim.stats.time, sim.stats.time / pick.time if pick.time else None))
    return rows, picks


def run(options, chosen: List[str], sizes: List[int]) -> int:
    """The ``--simulate`` run of collectives ``chosen`` (of :data:`MODELLED`) at ``sizes``:
    tables printed and written as a real run's; exit status 0."""
    import ringcoll
    from .report import geomean, plot, table_header, table_lines, write_csv, write_json

    machine = ringcoll.Machine.preset(options.simulate, nodes=options.nodes)
    world = len(machine.nodes(machine.network.hosts))
    wanted = None if not options.algorithms else [a.strip() for a in options.algorithms.split(",")]
    context = f"{world} ranks, simulated {options.simulate} x {options.nodes}: {machine.describe()}"
    printed = [f"# ringcoll-bench --simulate {options.simulate} --nodes {options.nodes}  {context}",
               f"# every algorithm on the simulator's clock; '{NCCL_ROW}': what NCCL's tuner picks, at its "
               f"own model's time (ringcoll.cost.nccl); '{NCCL_CLOCK_ROW}' (all_reduce): that pick's schedule "
               f"(NCCL's ring where NVLS is picked) on the clock under its protocol and channels, + its launch "
               f"latency (simulate(..., 'nccl')); vs NCCL = time / the NCCL model's time"]
    rows, picks = [], {}
    for name in chosen:
        mine, picks[name] = rows_for(name, machine, world, sizes, wanted)
        rows += mine
        lines = [""] + [line.replace("vs built-in", "    vs NCCL") for line in table_header(name, [OUT_OF_PLACE], context)]
        lines += table_lines(mine, [OUT_OF_PLACE]) + ["#"] + [f"#  NCCL picks {p}" for p in picks[name]]
        for algo in dict.fromkeys(r.algorithm for r in mine if r.algorithm != NCCL_ROW):
            ratio = geomean(r.vs_builtin for r in mine if r.algorithm == algo)
            lines.append(f"#  {algo}: geomean time vs NCCL {ratio:.3g}" if ratio else f"#  {algo}: --")
        print("\n".join(lines))
        printed += lines
    date = datetime.datetime.now(datetime.timezone.utc)
    meta = {"date": date.isoformat(timespec="seconds"), "world_size": world, "simulate": options.simulate,
            "nodes": options.nodes, "machine": machine.to_dict(), "backend": "simulated", "device": "simulated",
            "command": " ".join(["ringcoll-bench"] + list(options.argv)), "nccl_picks": picks,
            "timing": "the simulator's clock (cost-only run); NCCL (model): ringcoll.cost.nccl"}
    os.makedirs(options.out, exist_ok=True)
    stem = os.path.join(options.out, f"{date:%Y%m%dT%H%M%SZ}_np{world}_sim_{options.simulate}")
    files = [stem + ".json", stem + ".csv", stem + ".txt"]
    write_json(files[0], meta, rows)
    write_csv(files[1], meta, rows)
    with open(files[2], "w") as handle:
        handle.write("\n".join(printed) + "\n")
    if not options.no_plot:
        for name in chosen:
            title = f"{name}: ringcoll's algorithms vs NCCL's model, simulated {options.simulate} x {options.nodes}"
            if plot(f"{stem}_{name}.png", name, [r for r in rows if r.collective == name], title):
                files.append(f"{stem}_{name}.png")
    for path in files:
        print(f"# wrote {path}")
    return 0
