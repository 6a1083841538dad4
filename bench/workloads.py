"""``ringcoll-bench --workload ddp|fsdp``: one training step of a real model, backend "ringcoll"
against "gloo", in the same run.

Every rank builds the same MLP (``--width``, default 1024: about 2.1 M parameters, 8.1 MiB
of float32 gradients a step) once per contestant: on the cluster's gloo group (the built-in),
and on ringcoll groups (``dist.new_group(backend="ringcoll", pg_options=...)``), one with
``auto`` and one per algorithm of the collective the workload leans on (DDP: all_reduce;
FSDP2: reduce_scatter, its gradient collective); ``--algorithms`` narrows the list (the
built-in always runs). DDP at a power-of-two world also runs ``p2p-floor``: DDP on the gloo
group with a comm hook that all-reduces each bucket by bare point-to-point from Python
(recursive halving, then doubling: the exchanges and bytes of ``auto``'s choice above 1 MiB,
``rabenseifner``), through the same ProcessGroup send/recv ringcoll's gloo transport calls,
on one thread of its own as any Python backend's calls (the hook returns at once, as an
asynchronous all_reduce does, and backward goes on), with no plan, tag, check or queue: what
an all_reduce built on this transport from Python reaches without a library's costs, so
ringcoll's ratio to gloo cannot be expected below its ratio.

Each round times one step (forward, backward, optimiser) of every contestant, the order
rotated every round, after a barrier; a step's time is the slowest rank's. Reported: the
median over rounds, and the paired ratio: each round's time over gloo's in the same round,
its median and its spread (lowest and highest), so that load which comes and goes on a
shared machine shows as spread rather than moving one contestant.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from typing import Dict, List, Optional

BUILTIN = "built-in"
#: DDP with the bare point-to-point comm hook (module docstring)
P2P_FLOOR = "p2p-floor"


def _model(width: int, seed: int = 0):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 16))


def _contestants(workload: str, world: int, algorithms: Optional[str] = None) -> List[tuple]:
    """(label, ringcoll.Options, or None for a gloo group): the built-in, auto, each algorithm
    (or those of the comma-separated ``algorithms``), and DDP's p2p-floor at a power-of-two
    world. ValueError naming an algorithm the collective does not have."""
    import ringcoll

    collective = "all_reduce" if workload == "ddp" else "reduce_scatter"
    known = ["auto", *ringcoll.algorithms(collective)]
    floor = [P2P_FLOOR] if workload == "ddp" and world > 1 and world & (world - 1) == 0 else []
    wanted = known + floor if not algorithms else \
        [a.strip() for a in algorithms.split(",") if a.strip() and a.strip() != BUILTIN]
    unknown = [a for a in wanted if a not in known + floor]
    if unknown:
        raise ValueError(f"--algorithms: {unknown} are not algorithms of {collective} at --np {world}; "
                         f"choose from {known + floor}")
    return [(BUILTIN, None)] + [(name, None if name == P2P_FLOOR else
                                 ringcoll.Options(**({} if name == "auto" else {collective: name})))
                                for name in dict.fromkeys(wanted)]


class FloorThread:
    """The p2p-floor hook's state: one thread that all-reduces the buckets in the order DDP
    hands them over (:func:`halving_doubling`), completing each bucket's future."""

    def __init__(self):
        import queue
        import threading

        self._buckets = queue.Queue()
        threading.Thread(target=self._run, name="p2p-floor", daemon=True).start()

    def submit(self, tensor):
        import torch

        future = torch.futures.Future()
        self._buckets.put((tensor, future))
        return future

    def _run(self) -> None:
        while True:
            tensor, future = self._buckets.get()
            try:
                halving_doubling(tensor)
                future.set_result(tensor)
            except Exception as error:  # noqa: BLE001 - handed to DDP, which waits on it
                future.set_exception(error)


def p2p_floor_hook(state: FloorThread, bucket):
    """A DDP comm hook: the bucket's mean over the ranks, by bare point-to-point on
    ``state``'s thread (module docstring); the future completes when it is done."""
    import torch.distributed as dist

    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    return state.submit(tensor)


def halving_doubling(tensor) -> None:
    """Sum ``tensor`` over the ranks of the default group in place, by bare point-to-point.
    Recursive halving: at step k each rank sends the half of its current span that its peer
    (rank XOR p/2^k) keeps, receives that peer's copy of the half it keeps and adds it; then
    recursive doubling sends the spans back in the reverse order. Power-of-two worlds; cost
    2 lg p α + 2 (p-1)/p n β + (p-1)/p n γ."""
    import torch
    import torch.distributed as dist

    from .specs import _exchange

    rank, world = dist.get_rank(), dist.get_world_size()
    lo, hi, kept, distance = 0, tensor.numel(), [], world // 2
    scratch = torch.empty((hi + 1) // 2, dtype=tensor.dtype)
    while distance:
        peer, mid = rank ^ distance, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank < peer else ((mid, hi), (lo, mid))
        received = scratch[:keep[1] - keep[0]]
        _exchange([(tensor[give[0]:give[1]], peer)], [(received, peer)])
        tensor[keep[0]:keep[1]].add_(received)
        kept.append((peer, keep, give))
        (lo, hi), distance = keep, distance // 2
    for peer, keep, give in reversed(kept):
        _exchange([(tensor[keep[0]:keep[1]], peer)], [(tensor[give[0]:give[1]], peer)])


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


def measure_workload(workload: str, width: int, batch: int, iters: int, warmup: int,
                     algorithms: Optional[str] = None) -> dict:
    """On every rank: each contestant's step times (seconds)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rank = dist.get_rank()
    entries = []
    for label, options in _contestants(workload, dist.get_world_size(), algorithms):
        group = None if options is None else dist.new_group(backend="ringcoll", pg_options=options)
        model = _wrap(workload, _model(width), group)
        if label == P2P_FLOOR:
            model.register_comm_hook(FloorThread(), p2p_floor_hook)
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
    """A row per contestant: its rounds' times (each the slowest rank's), their median, least
    and greatest, and the paired ratio (each round's time over the built-in's in that round):
    its median, least and greatest (module docstring)."""
    rounds = {label: [max(ts) for ts in zip(*(r["times"][label] for r in per_rank))]
              for label in per_rank[0]["times"]}
    base = rounds.get(BUILTIN)
    rows = []
    for label, times in rounds.items():
        row = {"contestant": label, "time_us": statistics.median(times) * 1e6, "min_us": min(times) * 1e6,
               "max_us": max(times) * 1e6, "rounds": len(times)}
        ratios = [t / b for t, b in zip(times, base)] if base else []
        row["vs_builtin"] = statistics.median(ratios) if ratios else None
        row["vs_builtin_min"], row["vs_builtin_max"] = (min(ratios), max(ratios)) if ratios else (None, None)
        rows.append(row)
    return rows


def table(workload: str, world: int, rows: List[dict], grad_bytes: int, load) -> List[str]:
    collective = "all_reduce" if workload == "ddp" else "reduce_scatter"
    lines = [f"# ringcoll-bench --workload {workload}: one training step, {world} ranks, CPU, "
             f"{grad_bytes / 2**20:.1f} MiB of float32 gradients; load average {load} on "
             f"{os.cpu_count()} cores (the whole machine's: other processes share them)",
             f"# backend 'gloo' (built-in) vs backend 'ringcoll' ({collective} algorithm per line); "
             f"vs built-in: each round's time / gloo's in the same round, median [least - greatest]",
             f"#{'backend':>10} {collective + ' algorithm':>28} | {'time(us)':>10} {'min(us)':>10} "
             f"{'vs built-in':>11} {'spread':>13}"]
    for row in rows:
        backend = {BUILTIN: "gloo", P2P_FLOOR: "gloo p2p"}.get(row["contestant"], "ringcoll")
        algorithm = {BUILTIN: "-", P2P_FLOOR: "p2p-floor (hook)"}.get(row["contestant"], row["contestant"])
        spread = f"[{row['vs_builtin_min']:.2f} - {row['vs_builtin_max']:.2f}]"
        lines.append(f" {backend:>10} {algorithm:>28} | {row['time_us']:>10.0f} {row['min_us']:>10.0f} "
                     f"{row['vs_builtin']:>11.2f} {spread:>13}")
    return lines


def run(options) -> int:
    """The ``--workload`` mode of ringcoll-bench (its -n, -w, --np, --out flags)."""
    import ringcoll

    world = options.np or 4
    try:
        _contestants(options.workload, world, options.algorithms)
    except ValueError as error:
        raise SystemExit(f"ringcoll-bench: {error}") from None
    load = f"{os.getloadavg()[0]:.1f}"
    with ringcoll.launch(world, "gloo", timeout=options.timeout) as cluster:
        per_rank = cluster.run(measure_workload, options.workload, options.width, options.batch,
                               options.iters, options.warmup_iters, options.algorithms,
                               timeout=options.timeout)
    rows = summarize(per_rank)
    load_end = f"{os.getloadavg()[0]:.1f}"
    lines = table(options.workload, world, rows, per_rank[0]["grad_bytes"], f"{load} -> {load_end}")
    lines.insert(1, f"# {options.iters} rounds after {options.warmup_iters} warm-up, width {options.width}, "
                    f"batch {options.batch}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
                    f"command: ringcoll-bench {' '.join(getattr(options, 'argv', []))}")
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
