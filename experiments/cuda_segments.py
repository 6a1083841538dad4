"""The CUDA table's segment sizes from the α-β-γ model: for each pipelined algorithm, the
segment that minimises the simulated time on ``ringcoll.selection.CUDA_MACHINE``.

    python -m experiments.cuda_segments [--out bench/results/experiments/cuda_segments.txt]

For ring all_reduce (its own row of CUDA_SEGMENTS) and the pipelined chain/trees that take the
default segment (broadcast pipelined_chain and double_binary_tree, all_reduce
double_binary_tree), at p = 8 (one node, NVLink) and p = 16 (two nodes, InfiniBand between),
it runs the simulator's cost-only clock (``data=False``) at sizes from 16 MiB to 1 GiB with
every candidate segment forced through RINGCOLL_SEGMENT, and prints the time of each and the
best. Nothing here measures a GPU: it is the model's answer, to be replaced by
``ringcoll-bench --tune`` on CUDA.
"""
from __future__ import annotations

import argparse
import os
import pathlib

MiB = 1 << 20
SEGMENTS = [s * MiB for s in (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)]
CASES = (("all_reduce", "ring", (64, 256, 1024)),
         ("all_reduce", "double_binary_tree", (16, 256)),
         ("broadcast", "pipelined_chain", (16, 256)),
         ("broadcast", "double_binary_tree", (16, 256)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "bench" / "results"
                        / "experiments" / "cuda_segments.txt")
    args = parser.parse_args(argv)
    import torch
    import ringcoll
    from ringcoll.selection import CUDA_MACHINE

    lines = [f"machine: {CUDA_MACHINE.describe()}",
             "segment sizes in MiB; time in us of the simulator's cost-only run (float32)"]
    for collective, algorithm, sizes in CASES:
        for world in (8, 16):
            for size in sizes:
                times = {}
                for segment in SEGMENTS:
                    os.environ["RINGCOLL_SEGMENT"] = str(int(segment))
                    sim = ringcoll.simulate(collective, algorithm, world, numel=size * MiB // 4,
                                            dtype=torch.float32, data=False, record=False,
                                            machine=CUDA_MACHINE, local_size=8)
                    times[segment] = sim.stats.time * 1e6
                best = min(times, key=times.get)
                cells = " ".join(f"{s / MiB:g}:{t:.0f}" for s, t in times.items())
                lines.append(f"{collective}/{algorithm} p={world} {size} MiB: best {best / MiB:g} "
                             f"MiB ({times[best]:.0f} us); {cells}")
                print(lines[-1], flush=True)
    os.environ.pop("RINGCOLL_SEGMENT", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
