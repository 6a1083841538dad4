"""What a list argument costs per call: a view, the caller's own tensors, or a staging copy.

    python -m experiments.list_staging [--world 4] [--out bench/results/experiments]

For every list-taking collective (all_gather, reduce_scatter, gather, scatter, all_to_all),
every algorithm, and three kinds of list: ``chunks`` (the chunks of one contiguous tensor:
back to back), ``separate`` (one tensor each) and ``aliased`` (separate, one of them also the
call's other tensor: all_gather's input is ``tensor_list[rank]``, reduce_scatter's output
``input_list[rank]``, gather's input and scatter's output the root's own entry), one call on a
local gloo cluster (4 KiB blocks: the plan is kept, as every repeated call's is) and, on the
root (rank 0), what its kept plan does on every later call:

- ``list as``: ``view`` (one flat view over the list, decided by the builder: no staging
  asked for), ``blocks`` (the builder asked the executor for a staging buffer, the executor
  found every chunk of the schedule within one tensor and sends from and receives into the
  tensors themselves: no copy), ``staged`` (the staging buffer is used: the list is copied
  in before the schedule or out after it), ``entries`` (all_to_all: every tensor is a buffer
  of its own, never staged);
- ``copies``: tensor copies per call that stage the list (one per tensor of the list per
  copy hook left in the kept plan); ``other copies``: the plan's other copies (an input
  copied apart from an output it overlaps, a premul's scaled copy);
- ``lent``: whether the builder took a staging buffer from the executor (kept across calls:
  on a CUDA device, memory the caching allocator holds), and ``used`` whether it is.

Writes ``list_staging.json`` and ``list_staging.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

BLOCK = 512                    # int64 / float64 elements per rank: 4 KiB
COLLECTIVES = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")
KINDS = ("chunks", "separate", "aliased")


def _lists(kind: str, world: int, dtype) -> list:
    if kind == "chunks":
        return list(torch.ones(world * BLOCK, dtype=dtype).chunk(world))
    return [torch.ones(BLOCK, dtype=dtype) for _ in range(world)]


def _call(collective: str, algorithm: str, kind: str, premul: bool):
    """Run one call on this rank; the tensors of its list (None where this rank has none)."""
    import torch.distributed as dist

    import ringcoll

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float64 if premul else torch.int64
    tensors = _lists(kind, world, dtype)
    if collective == "all_gather":
        tensor = tensors[rank] if kind == "aliased" else torch.full((BLOCK,), rank + 1, dtype=dtype)
        ringcoll.all_gather(tensors, tensor, algorithm=algorithm)
    elif collective == "reduce_scatter":
        output = tensors[rank] if kind == "aliased" else torch.empty(BLOCK, dtype=dtype)
        op = dist._make_nccl_premul_sum(0.5) if premul else dist.ReduceOp.SUM
        ringcoll.reduce_scatter(output, tensors, op=op, algorithm=algorithm)
    elif collective == "gather":
        tensor = tensors[0] if kind == "aliased" and rank == 0 else torch.full((BLOCK,), rank + 1, dtype=dtype)
        ringcoll.gather(tensor, tensors if rank == 0 else None, dst=0, algorithm=algorithm)
    elif collective == "scatter":
        tensor = tensors[0] if kind == "aliased" and rank == 0 else torch.empty(BLOCK, dtype=dtype)
        ringcoll.scatter(tensor, tensors if rank == 0 else None, src=0, algorithm=algorithm)
    else:
        outputs = _lists(kind, world, dtype)
        inputs = outputs[:] if kind == "aliased" else tensors
        ringcoll.all_to_all(outputs, inputs, algorithm=algorithm)
    return tensors


def _copy_hook(hook) -> bool:
    return getattr(hook, "__qualname__", "").split(".")[0] in ("copy_in", "copy_out")


def _other_copy(hook) -> bool:
    code = getattr(hook, "__code__", None)
    return code is not None and not _copy_hook(hook) and any("copy" in name for name in code.co_names)


def _measure() -> list:
    """On every rank: one row per (collective, algorithm, kind[, premul]) from its kept plan."""
    import torch.distributed as dist

    import ringcoll
    from ringcoll.api.common import group_executor, persistent_plans
    from ringcoll.runtime.blocks import Blocks

    executor = group_executor(None)
    rows = []
    for collective in COLLECTIVES:
        for algorithm in ringcoll.algorithms(collective):
            for kind in KINDS:
                for premul in ((False, True) if collective == "reduce_scatter" else (False,)):
                    persistent_plans(executor).clear()
                    try:
                        tensors = _call(collective, algorithm, kind, premul)
                    except (ValueError, TypeError, RuntimeError) as error:
                        rows.append({"collective": collective, "algorithm": algorithm, "kind": kind,
                                     "premul": premul, "error": str(error)[:80]})
                        continue
                    dist.barrier()
                    if not persistent_plans(executor):
                        rows.append({"collective": collective, "algorithm": algorithm, "kind": kind,
                                     "premul": premul, "error": "no kept plan"})
                        continue
                    prepared = next(reversed(persistent_plans(executor).values()))
                    plan, hooks = prepared.plan, (*prepared.before, *prepared.after)
                    lent = any(buffer.untyped_storage().data_ptr() in executor.lent()
                               for buffer in plan.buffers.values())
                    copies = sum(len(tensors) for hook in hooks if _copy_hook(hook))
                    if collective == "all_to_all":
                        as_ = "entries"
                    elif any(isinstance(b, Blocks) for b in prepared.buffers.values()):
                        as_ = "blocks"
                    elif copies:
                        as_ = "staged"
                    else:
                        as_ = "view"
                    rows.append({"collective": collective, "algorithm": algorithm, "kind": kind,
                                 "premul": premul, "as": as_, "copies": copies,
                                 "other_copies": sum(1 for hook in hooks if _other_copy(hook)),
                                 "lent": lent, "used": lent and copies > 0})
    return rows


def report(world: int, rows: list) -> str:
    lines = ["# List arguments: view, the caller's tensors, or a staging copy", "",
             f"`python -m experiments.list_staging` on a local gloo cluster of {world} ranks, the root's "
             "(rank 0's) kept plan of one call with 4 KiB blocks (see the script's docstring).", "",
             "| collective | algorithm | list | list as | copies per call | other copies | staging lent | used |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        name = row["collective"] + (" (premul)" if row["premul"] else "")
        if "error" in row:
            lines.append(f"| {name} | {row['algorithm']} | {row['kind']} | ({row['error']}) | | | | |")
            continue
        lines.append(f"| {name} | {row['algorithm']} | {row['kind']} | {row['as']} | {row['copies']} | "
                     f"{row['other_copies']} | {'yes' if row['lent'] else ''} | {'yes' if row['used'] else ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    import ringcoll

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", default="bench/results/experiments")
    args = parser.parse_args(argv)
    with ringcoll.launch(args.world) as cluster:
        rows = cluster.run(_measure)[0]
    text = report(args.world, rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "list_staging.json"), "w") as f:
        json.dump({"world": args.world, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "list_staging.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
