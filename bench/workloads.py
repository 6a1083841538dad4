"""``ringcoll-bench --workload ddp|fsdp``: one training step of a real model, backend "ringcoll"
against "gloo", in the same run.

Every rank builds the same MLP (``--width``, default 1024: about 2.1 M parameters, 8.4 MiB
of float32 gradients a step) once per contestant: on the cluster's gloo group (the built-in),
and on ringcoll groups (``dist.new_group(backend="ringcoll", pg_options=...)``), one with
``auto`` and one per algorithm of the collective the workload leans on (DDP: all_reduce;
FSDP2: reduce_scatter, its gradient collective). Each round times one step
(forward, backward, optimiser) of every contestant, the order rotated every round, after a
barrier; a step's time is the slowest rank's, the median over rounds is reported with its
ratio to gloo's in the same rounds.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from typing import Dict, List

BUILTIN = "built-in"


def _model(width: int, seed: int = 0):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 16))


def _contestants(workload: str) -> List[tuple]:
    """(label, ringcoll.Options or None for gloo): the built-in, auto, each algorithm."""
    import ringcoll

    collective = "all_reduce" if workload == "ddp" else "reduce_scatter"
    return [(BUILTIN, None), ("auto", ringcoll.Options())] + [
        (name, ringcoll.Options(**{collective: name})) for name in ringcoll.algorithms(collective)]


def _wrap(workload: str, model, group):
    import torch.distributed as dist

    if workload == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
    for layer in model:
        if hasattr(layer, "weight"):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def measure_workload(workload: str, width: int, batch: int, iters: int, warmup: int) -> dict:
    """On every rank: each contestant's step times (seconds), and its collectives' choices."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rank = dist.get_rank()
    entries = []
    for label, options in _contestants(workload):
        group = None if options is None else dist.new_group(backend="ringcoll", pg_options=options)
        model = _wrap(workload, _model(width), group)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        entries.append((label, model, opt))
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 16, generator=gen)

    def step(model, opt) -> float:
        dist.barrier()
        began = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return time.perf_counter() - began

    for _ in range(warmup):
        for _, model, opt in entries:
            step(model, opt)
    times: Dict[str, List[float]] = {label: [] for label, _, _ in entries}
    for it in range(iters):
        shift = it % len(entries)
        for label, model, opt in entries[shift:] + entries[:shift]:
            times[label].append(step(model, opt))
    grads = sum(p.numel() * p.element_size() for p in _model(width).parameters())
    return {"times": times, "grad_bytes": grads}


def summarize(per_rank: List[dict]) -> List[dict]:
    labels = list(per_rank[0]["times"])
    rows = []
    base = None
    for label in labels:
        rounds = [max(ts) for ts in zip(*(r["times"][label] for r in per_rank))]
        median = statistics.median(rounds)
        if label == BUILTIN:
            base = median
        rows.append({"contestant": label, "time_us": median * 1e6, "min_us": min(rounds) * 1e6,
                     "max_us": max(rounds) * 1e6, "rounds": len(rounds)})
    for row in rows:
        row["vs_builtin"] = row["time_us"] / (base * 1e6) if base else None
    return rows


def table(workload: str, world: int, rows: List[dict], grad_bytes: int, load) -> List[str]:
    collective = "all_reduce" if workload == "ddp" else "reduce_scatter"
    lines = [f"# ringcoll-bench --workload {workload}: one training step, {world} ranks, CPU, "
             f"{grad_bytes / 2**20:.1f} MiB of float32 gradients; load average {load}",
             f"# backend 'gloo' (built-in) vs backend 'ringcoll' ({collective} algorithm per line; "
             f"vs built-in = time / gloo's time in the same rounds)",
             f"#{'backend':>10} {collective + ' algorithm':>28} | {'time(us)':>10} {'min(us)':>10} "
             f"{'vs built-in':>11}"]
    for row in rows:
        backend = "gloo" if row["contestant"] == BUILTIN else "ringcoll"
        algorithm = "-" if row["contestant"] == BUILTIN else row["contestant"]
        lines.append(f" {backend:>10} {algorithm:>28} | {row['time_us']:>10.0f} {row['min_us']:>10.0f} "
                     f"{row['vs_builtin']:>11.2f}")
    return lines


def run(options) -> int:
    """The ``--workload`` mode of ringcoll-bench (its -n, -w, --np, --out flags)."""
    import ringcoll

    world = options.np or 4
    load = f"{os.getloadavg()[0]:.1f}"
    with ringcoll.launch(world, "gloo", timeout=options.timeout) as cluster:
        per_rank = cluster.run(measure_workload, options.workload, options.width, options.batch,
                               options.iters, options.warmup_iters, timeout=options.timeout)
    rows = summarize(per_rank)
    load_end = f"{os.getloadavg()[0]:.1f}"
    lines = table(options.workload, world, rows, per_rank[0]["grad_bytes"], f"{load} -> {load_end}")
    lines.insert(1, f"# {options.iters} rounds after {options.warmup_iters} warm-up, width {options.width}, "
                    f"batch {options.batch}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("\n".join(lines))
    os.makedirs(options.out, exist_ok=True)
    stem = os.path.join(options.out, f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}_"
                                     f"workload_{options.workload}_np{world}")
    with open(stem + ".txt", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(stem + ".json", "w") as handle:
        json.dump({"workload": options.workload, "world": world, "load": [load, load_end],
                   "width": options.width, "batch": options.batch, "rows": rows,
                   "per_rank_times": [r["times"] for r in per_rank]}, handle, indent=1)
    print(f"# wrote {stem}.txt, {stem}.json")
    return 0
