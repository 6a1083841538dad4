"""One rank of tests/runtime/test_nodes.py's real torchrun launches on uneven nodes.

Run by ``python -m torch.distributed.run`` (every launch on localhost with its own
``--nproc-per-node``): joins the gloo group from torchrun's env:// variables, runs every
node-aware (hierarchical) algorithm and ``auto`` of each collective at element counts 0, 1,
below the world, not divisible by it and about 1000, compares each result with
torch.distributed's built-in on integer data, and writes what it found (the layout the group
agreed on, its source, the problems) as JSON to ``<out>/rank<RANK>.json``.

    python -m torch.distributed.run ... tests/runtime/nodes_rank.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

import ringcoll
from ringcoll.schedules import registry


def values(rank: int, numel: int) -> torch.Tensor:
    """Distinct non-zero integers per rank and element."""
    return (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1


def node_aware(collective: str) -> list:
    """The algorithms of ``collective`` that read the placement."""
    return [name for name in ringcoll.algorithms(collective)
            if getattr(registry.get(collective, name).schedule, "needs_nodes", False)]


def compare(rank: int, world: int, numel: int, algorithm: str, collective: str):
    """None when ringcoll's ``collective`` with ``algorithm`` matches the built-in, else a
    description of the difference."""
    root = world - 1
    if collective == "all_reduce":
        got, want = values(rank, numel), values(rank, numel)
        ringcoll.all_reduce(got, algorithm=algorithm)
        dist.all_reduce(want)
    elif collective == "broadcast":
        got, want = values(rank, numel), values(root, numel)
        ringcoll.broadcast(got, src=root, algorithm=algorithm)
    elif collective == "reduce":
        got, want = values(rank, numel), values(rank, numel)
        ringcoll.reduce(got, dst=root, algorithm=algorithm)
        dist.reduce(want, dst=root)
        if rank != root:
            return None
    elif collective == "all_gather":
        mine = values(rank, numel)
        got, want = torch.zeros(world * numel, dtype=torch.int64), torch.zeros(world * numel, dtype=torch.int64)
        ringcoll.all_gather_into_tensor(got, mine, algorithm=algorithm)
        dist.all_gather_into_tensor(want, mine)
    elif collective == "reduce_scatter":
        full = values(rank, world * numel)
        got, want = torch.zeros(numel, dtype=torch.int64), torch.zeros(numel, dtype=torch.int64)
        ringcoll.reduce_scatter_tensor(got, full, algorithm=algorithm)
        dist.reduce_scatter_tensor(want, full.clone())
    else:
        raise ValueError(f"collective must be one this script compares, got {collective!r}")
    if torch.equal(got, want):
        return None
    wrong = (got != want).nonzero().view(-1).tolist() if got.shape == want.shape else "shape"
    return f"{collective}/{algorithm} numel {numel}: wrong at {wrong[:5] if isinstance(wrong, list) else wrong}"


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    found = {"rank": rank, "problems": [], "layout": None, "source": None}
    try:
        for collective in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"):
            for algorithm in node_aware(collective) + ["auto"]:
                for numel in (0, 1, world - 1, world + 1, 1001):
                    problem = compare(rank, world, numel, algorithm, collective)
                    if problem:
                        found["problems"].append(problem)
        from ringcoll.api.common import group_executor
        from ringcoll.runtime.nodes import group_placement

        nodes, source = group_placement(group_executor(None))
        found["layout"], found["source"] = list(nodes), source
    except Exception:  # noqa: BLE001 - reported to the test, which names the rank
        found["problems"].append(traceback.format_exc(limit=4))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
        json.dump(found, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
