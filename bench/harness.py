"""The harness, once for every collective: set up, check, warm up, time, summarise.

:func:`measure` runs on every rank (through ``cluster.run``) for one collective at one size.
For each variant (out-of-place, in-place) it sets the collective up from its spec, then:

1. check: one call per contestant on freshly armed buffers, counting wrong elements
   (also the first call of each, so a contestant that raises is dropped on every rank);
2. warm-up: ``warmup`` rounds of one call per contestant;
3. timing: ``iters`` rounds (fewer, but at least 3, once ``max_seconds`` have passed); in
   each round every contestant runs once, the order rotated every round, so the built-in and
   ringcoll's algorithms alternate under the same conditions. Before each timed call the
   inputs are restored, the device synchronised and the ranks meet at a barrier; the time is
   from leaving the barrier to the call's end (after a device synchronisation on CUDA).

:func:`summarize` (in the parent) takes, for each round, the maximum over ranks, then the
median over rounds; algbw = bytes / time, busbw = algbw × the spec's bus factor, and
``vs_builtin`` = time / the built-in's time at the same size in the same run. The spread of the
rounds is their 10th and 90th percentiles; a row whose own or whose built-in's p90/p10 exceeds
:data:`NOISY` is flagged ``noisy``. A collective with a floor (:data:`~.specs.P2P_FLOOR`) times
it as one more contestant of every round: its own messages by bare P2P (all_to_all, scatter,
gather), or the built-in sendrecv of the same bytes on buffers of its own (all_reduce,
all_gather, reduce_scatter: the wire's ceiling for their rings). ``floor_pct`` is each row's
busbw as a percentage of the floor row's (whose busbw takes its own spec's bus factor), so the
floor's own row reads 100 and the percentage compares rounds taken under the same conditions.
"""
from __future__ import annotations

import statistics
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Dict, List, Optional, Tuple

from ..sim.trust import import_module
from .specs import P2P_FLOOR, SPECS, Case, Spec

BUILTIN = "built-in"
#: the one contestant of a spec without algorithms (sendrecv): ringcoll's function as it is
OURS = "ringcoll"
#: a spread (p90 / p10 of the rounds) above this flags a row: its ratio is noise-prone
NOISY = 2.0

#: nccl-tests' -d names and torch's own
DTYPES = {
    "int8": "int8", "char": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32",
    "int": "int32", "int64": "int64", "half": "float16", "float16": "float16",
    "float": "float32", "float32": "float32", "double": "float64", "float64": "float64",
    "bfloat16": "bfloat16", "bool": "bool",
}
#: the fewest timed rounds a time limit leaves
MIN_ROUNDS = 3
#: nccl-tests' -o names
OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")


@dataclass(frozen=True)
class Job:
    """One collective at one size: what every rank runs in one ``cluster.run``."""

    collective: str
    size: int                         # requested bytes (-b .. -e)
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    algorithms: Tuple[str, ...] = ()  # ringcoll's contestants (the built-in always runs)
    variants: Tuple[str, ...] = ()    # empty: every variant the collective has
    iters: int = 20
    warmup: int = 5
    check: bool = True
    device: str = "cpu"               # "cpu" or "cuda"
    max_seconds: float = 0.0          # stop timing a variant after this long (>= MIN_ROUNDS rounds)
    imports: Tuple[str, ...] = ()     # user modules that register algorithms (``--import``)

    @property
    def spec(self) -> Spec:
        return SPECS[self.collective]


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def job_numel(job: Job, world: int) -> int:
    return job.spec.numel(job.size, torch_dtype(job.dtype).itemsize, world)


#: torch before 2.13 has these built-ins only under their older names (2.11: the GPU image's)
_OLDER_BUILTIN_NAMES = {"all_gather_single": "all_gather_into_tensor",
                        "reduce_scatter_single": "reduce_scatter_tensor"}


def _builtin(spec: Spec):
    import torch
    import torch.distributed as dist

    if spec.builtin is not None:
        return spec.builtin
    for name in (spec.name, _OLDER_BUILTIN_NAMES.get(spec.name)):
        found = getattr(dist, name, None) if name else None
        if found is not None:
            return found
    raise AttributeError(f"torch {torch.__version__} has no built-in for {spec.name!r} "
                         f"(looked for torch.distributed.{spec.name}"
                         + (f" and .{_OLDER_BUILTIN_NAMES[spec.name]}" if spec.name in _OLDER_BUILTIN_NAMES else "")
                         + ")")


def _contestant_fns(spec: Spec, algorithms) -> Dict[str, object]:
    import ringcoll

    fns = {BUILTIN: _builtin(spec)}
    ours = getattr(ringcoll, spec.name, None)
    for name in algorithms:
        if name == P2P_FLOOR and spec.has_floor:
            fns[name] = spec.floor or _builtin(floor_spec(spec, name))
        else:
            fns[name] = ours if name == OURS else partial(ours, algorithm=name)
    return fns


def floor_spec(spec: Spec, name: str) -> Spec:
    """The spec whose facts (set-up, bus factor) contestant ``name`` of ``spec`` runs under:
    the floor spec for a ring-bound collective's floor, else ``spec`` itself."""
    return SPECS[spec.floor_spec] if name == P2P_FLOOR and spec.floor_spec else spec


def measure(job: Job) -> dict:
    """Run ``job`` on this rank (every rank calls it together); its raw timings.

    Returns ``{"numel": n, "variants": {variant: {contestant: {"times": [s, ...],
    "wrong": int | None, "error": str | None}}}}``."""
    import torch
    import torch.distributed as dist

    for name in job.imports:        # a spawned rank registers the user's algorithms too
        import_module(name)
    spec = job.spec
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch_dtype(job.dtype)
    device = torch.device("cuda", torch.cuda.current_device()) if job.device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    numel = spec.numel(job.size, dtype.itemsize, world)
    fns = _contestant_fns(spec, job.algorithms)
    contestants = list(fns)
    out: dict = {"numel": numel, "variants": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch 2.13's deprecation notes on *_tensor
        for variant in job.variants or spec.variants:
            case = Case(rank, world, numel, dtype, device, job.op if spec.reduces else None,
                        job.root, variant)
            # (instance, op) by spec: the collective's, and a ring-bound floor's own buffers of
            # the same bytes
            setups: Dict[str, tuple] = {spec.name: (spec.setup(case), case.op)}
            for name in contestants:
                own = floor_spec(spec, name)
                if own.name not in setups:
                    setups[own.name] = (own.setup(replace(case, op=None, variant=own.variants[0])), None)
            setup_of = {name: setups[floor_spec(spec, name).name] for name in contestants}
            results = {name: {"times": [], "wrong": None, "error": None} for name in contestants}

            if job.check:
                for instance, _ in setups.values():
                    instance.expected()     # the spec's own errors are not a contestant's
            # 1. check (and first call): a contestant that raises anywhere is dropped everywhere
            for name in contestants:
                instance, op = setup_of[name]
                try:
                    if job.check:
                        results[name]["wrong"] = instance.check(fns[name], op)
                    else:
                        instance.reset()
                        instance.call(fns[name])
                except Exception as error:  # noqa: BLE001 - reported in the row
                    results[name]["error"] = f"{type(error).__name__}: {error}"
                    results[name]["traceback"] = traceback.format_exc()
            failed = torch.tensor([results[name]["error"] is not None for name in contestants],
                                  dtype=torch.int32, device=device)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            live = [name for name, bad in zip(contestants, failed.tolist()) if not bad]
            for name in contestants:
                if name not in live and results[name]["error"] is None:
                    results[name]["error"] = "failed on another rank"

            def timed(name: str) -> float:
                instance = setup_of[name][0]  # noqa: F821 - defined above; deleted only after the last timed call
                instance.reset()
                sync()
                dist.barrier()
                start = time.perf_counter()
                instance.call(fns[name])
                sync()
                return time.perf_counter() - start

            # 2. warm-up
            for _ in range(job.warmup):
                for name in live:
                    timed(name)
            # 3. timing: every contestant once per round, the order rotated each round
            began = time.perf_counter()
            for it in range(job.iters):
                shift = it % max(1, len(live))
                for name in live[shift:] + live[:shift]:
                    results[name]["times"].append(timed(name))
                if job.max_seconds and it + 1 >= MIN_ROUNDS and it + 1 < job.iters:
                    # the time limit: every rank stops after the same round
                    over = torch.tensor([time.perf_counter() - began > job.max_seconds],
                                        dtype=torch.int32, device=device)
                    dist.all_reduce(over, op=dist.ReduceOp.MAX)
                    if over.item():
                        break
            out["variants"][variant] = results
            del setups, setup_of, instance
    return out


# --------------------------------------------------------------------------------------
# parent side


def bus_bandwidth(spec: Spec, nbytes: int, seconds: float, world: int) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second), as nccl-tests."""
    if seconds <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * spec.bus_factor(world)


@dataclass
class Row:
    """One line of a table: one contestant of one collective, variant and size."""

    collective: str
    variant: str
    algorithm: str
    size: int                 # bytes
    count: int                # elements
    type: str
    redop: str
    root: int
    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]
    vs_builtin: Optional[float] = None
    min_us: Optional[float] = None
    max_us: Optional[float] = None
    p10_us: Optional[float] = None          # the spread of the rounds
    p90_us: Optional[float] = None
    noisy: bool = False                     # its or the built-in's p90/p10 > NOISY
    floor_pct: Optional[float] = None       # busbw / the p2p-floor row's busbw, in percent
    iters: int = 0
    error: Optional[str] = None
    times_us: List[float] = field(default_factory=list)     # per round, the slowest rank's
    traceback: Optional[str] = None                          # of the error, on the first rank that raised


def percentile(values: List[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between order statistics."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def spread(row: Row) -> Optional[float]:
    """p90 / p10 of the row's rounds (1: no spread); None without rounds."""
    if not row.p10_us or not row.p90_us:
        return None
    return row.p90_us / row.p10_us


def summarize(job: Job, per_rank: List[dict]) -> List[Row]:
    """The rows of ``job`` from every rank's :func:`measure` result."""
    spec = job.spec
    world = len(per_rank)
    numel = per_rank[0]["numel"]
    nbytes = numel * torch_dtype(job.dtype).itemsize
    rows: List[Row] = []
    for variant, results in per_rank[0]["variants"].items():
        variant_rows: Dict[str, Row] = {}
        for name in results:
            per = [r["variants"][variant][name] for r in per_rank]
            raised = [p for p in per if p["error"] and p["error"] != "failed on another rank"]
            error = raised[0]["error"] if raised else next((p["error"] for p in per if p["error"]), None)
            wrongs = [p["wrong"] for p in per]
            wrong = None if any(w is None for w in wrongs) else sum(wrongs)
            rounds = [max(ts) for ts in zip(*(p["times"] for p in per))]   # slowest rank, per round
            seconds = statistics.median(rounds) if rounds else None
            algbw, busbw = bus_bandwidth(floor_spec(spec, name), nbytes, seconds, world) if seconds \
                else (None, None)
            variant_rows[name] = Row(
                collective=spec.name, variant=variant, algorithm=name, size=nbytes,
                count=spec.count(numel, world),
                type=job.dtype, redop=job.op if spec.reduces else "none",
                root=job.root if spec.rooted else -1,
                time_us=seconds * 1e6 if seconds else None, algbw=algbw, busbw=busbw, wrong=wrong,
                min_us=min(rounds) * 1e6 if rounds else None, max_us=max(rounds) * 1e6 if rounds else None,
                p10_us=percentile(rounds, 0.1) * 1e6 if rounds else None,
                p90_us=percentile(rounds, 0.9) * 1e6 if rounds else None,
                iters=len(rounds), error=error, times_us=[t * 1e6 for t in rounds],
                traceback=raised[0].get("traceback") if raised else None)
        base, floor = variant_rows.get(BUILTIN), variant_rows.get(P2P_FLOOR)
        for row in variant_rows.values():
            if base is not None and base.time_us and row.time_us:
                row.vs_builtin = row.time_us / base.time_us
            if floor is not None and floor.busbw and row.busbw:
                row.floor_pct = 100.0 * (row.busbw / floor.busbw)
            row.noisy = any((spread(r) or 1.0) > NOISY for r in (row, base) if r is not None)
            rows.append(row)
    return rows


def failed_rows(job: Job, world: int, error: BaseException) -> List[Row]:
    """Rows for a job that did not finish (a rank died or hung): every contestant, the error."""
    spec = job.spec
    numel = spec.numel(job.size, torch_dtype(job.dtype).itemsize, world)
    # every line of the message, joined: the cause (e.g. NCCL's) is rarely on the first
    text = f"{type(error).__name__}: " + " | ".join(
        line.strip() for line in str(error).splitlines() if line.strip())
    return [Row(spec.name, variant, name, numel * torch_dtype(job.dtype).itemsize, spec.count(numel, world), job.dtype,
                job.op if spec.reduces else "none", job.root if spec.rooted else -1,
                None, None, None, None, error=text)
            for variant in (job.variants or spec.variants) for name in (BUILTIN, *job.algorithms)]


def measure_all(jobs: List[Job]) -> List[dict]:
    """:func:`measure` for each job in turn, in one ``cluster.run`` (tests batch cases so)."""
    return [measure(job) for job in jobs]
