"""The best all_reduce on a 2-level machine, hierarchical included: the study map of ringcoll-study.

Every all_reduce algorithm, every world and size below, as one cost-only simulation each on
:data:`MACHINE` (``ringcoll.sim.sweep``: nodes of 4 ranks at 2 µs and 100 GB/s inside, 10 µs
and 10 GB/s between nodes through one NIC port per node, 50 GB/s reducing: ringcoll-study's
``--hierarchical 4`` defaults). The node-aware algorithms see the machine's nodes.

    python experiments/study_2level.py      # writes bench/results/study/best_all_reduce_2level.{png,md,csv}
"""
from __future__ import annotations

import os
import sys
import time

from ringcoll import Machine
from ringcoll.sim.sweep import best, crossovers, plot_map, sweep, write_table

RANKS_PER_NODE = 4
MACHINE = Machine.hierarchical(RANKS_PER_NODE, intra=(2e-6, 1 / 100e9), inter=(10e-6, 1 / 10e9), gamma=1 / 50e9)
WORLDS = (4, 8, 16, 32, 64, 128)
SIZES = tuple(1024 * 4 ** k for k in range(9))          # 1 KiB to 64 MiB
NAME = "best_all_reduce_2level"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def main(argv=None) -> int:
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results", "study")
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    cells = sweep(["all_reduce"], WORLDS, SIZES, MACHINE)
    seconds = time.perf_counter() - started
    write_table(cells, os.path.join(out, NAME + ".csv"))
    plot_map(cells, "all_reduce", os.path.join(out, NAME + ".png"),
             title=f"all_reduce on 2 levels (nodes of {RANKS_PER_NODE}): best algorithm "
                   "(number: time / lower bound)")
    time_of = {(c.algorithm, c.world, c.nbytes): c.seconds for c in cells}
    winners = best(cells)
    lines = ["# all_reduce on a 2-level machine: the best algorithm, hierarchical included", "",
             f"bench/study_2level.py: ringcoll.sim.sweep, every all_reduce algorithm as a cost-only "
             f"simulation on `Machine.hierarchical({RANKS_PER_NODE}, intra=(2 µs, 100 GB/s), "
             f"inter=(10 µs, 10 GB/s), gamma=50 GB/s)`, one NIC port per node, float32; the node-aware "
             f"algorithms see the machine's nodes. Map: [{NAME}.png]({NAME}.png); every cell: "
             f"[{NAME}.csv]({NAME}.csv). `x bound`: the best time ÷ the lower bound. Computed in {seconds:.0f} s; deterministic.", "",
             "At p = 4 (one node) hierarchical is the ring, which Rabenseifner and the latency-optimal "
             "algorithms beat. From 2 nodes on, large sizes go to Rabenseifner in MPICH's order "
             "(`rabenseifner`: distances 1, 2, 4 ..., so the halves n/2 .. n/L of the reduce-scatter "
             "stay inside the node and each rank sends at most n/(2L) between nodes): hierarchical's "
             "bandwidth profile at 2 lg p latencies. Hierarchical follows within 9 % at 16 and 64 MiB "
             "on 2 to 8 nodes and falls behind on more (its 2(N-1)-step rings of L messages share "
             "one NIC: 50 % slower at p = 128, 16 MiB). The far-first "
             "order (`rabenseifner_far`, ringcoll's before) pushes n/2 from every rank of a node "
             "through one NIC in its first and last steps and runs about 3x slower; a flat ring pays "
             "the slow link on each of its 2(p-1) steps. Small messages go to the latency-optimal "
             "algorithms (Swing's lg p steps, the double binary tree). `x bound` on this machine is "
             "against the larger of the bound at the fastest link and the bound across the node "
             "boundary (ringcoll.sim.bounds.node_bounds). tests/schedules/test_hierarchical.py checks the "
             "ring's and hierarchical's times against their 2-level formulas.", "",
             "| p | bytes | best | x bound | hierarchical us | ring us | rabenseifner us | rabenseifner_far us "
             "| best us |",
             "|---|---|---|---|---|---|---|---|---|"]
    for world in WORLDS:
        for nbytes in SIZES:
            win = winners[("all_reduce", world, nbytes)]
            lines.append(f"| {world} | {_size(nbytes)} | {win.algorithm} | {win.bound_ratio:.3g} | "
                         f"{time_of[('hierarchical', world, nbytes)] * 1e6:.4g} | "
                         f"{time_of[('ring', world, nbytes)] * 1e6:.4g} | "
                         f"{time_of[('rabenseifner', world, nbytes)] * 1e6:.4g} | "
                         f"{time_of[('rabenseifner_far', world, nbytes)] * 1e6:.4g} | {win.seconds * 1e6:.4g} |")
    lines += ["", "Crossovers (the size from which the best changes):", ""]
    lines += [f"- p = {w}: from {_size(n)}, {a} -> {b}" for _, w, n, a, b in crossovers(cells)]
    with open(os.path.join(out, NAME + ".md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"wrote {out}/{NAME}.{{png,md,csv}} in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
