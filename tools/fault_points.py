"""Fault injection at every point of a call: an exception raised inside one rank's call.

    python -m tools.fault_points --worlds 3 --transports host --out /tmp/w3_host.json     # one part
    python -m tools.fault_points --merge /tmp/w*_*.json --replays /tmp/replays.json --out bench/results/faults/faults_points.json
    python -m tools.fault_points --sample 16 --seed 1 --transports host,batched          # CI runs this one
    python -m tools.fault_points --replay 'all_reduce/ring@4/host:local:1:r2'            # one injection alone

Where tools/faults.py kills or stalls a rank, this raises an exception in one rank (the
victim) at one point of one call: ``RuntimeError("injected ...")``, ``MemoryError`` in a local
operation. The points, in the order a call reaches them (see ringcoll/runtime/executor.py):

- ``ready``: the transport's set-up (``transport.ready``), before anything is posted;
- ``start``: the start of the schedule's run (``P2PExecutor._run_steps``), before the first post;
- ``post:k``: the k-th step with transfers, as it is posted (``P2PExecutor._post``); on the
  streamed transport this is on the caller's thread, at enqueue;
- ``local:k``: the k-th local operation (``run_resolved``) raises MemoryError; on the streamed
  transport it runs later, on the (emulated) stream's thread;
- ``before``/``after``: a hook the plan runs before/after its schedule (a raising hook added
  to the prepared plan, last of the ``before`` hooks, first of the ``after`` ones);
- streamed only: ``enqueue:k``, the k-th operation handed to the stream (``transport.local``:
  hooks and local operations) raises on the caller's thread, as CUDA's host-side work does;
  ``watchdog_query``/``watchdog_failed``: the watchdog's event query (``runtime.query``) or
  the communicator's ``failed`` query raises once while the call is in flight (one algorithm
  per collective: :func:`watchdog_algorithm`).

k runs over the first, middle and last of the victim's own (counted in a clean census call
of the same collective, algorithm, world and transport); victims are taken in turn among the
ranks that have the point (``--turn`` starts the rotation elsewhere). The injection is a
monkeypatch in the victim only, installed for the injected call and removed after it; the
patched functions fire only for that call (never for an internal exchange it runs, such as
the group's placement).

For each injection, on a kept-alive cluster per world and a fresh pair of groups (the
group's timeout ``--timeout``): every rank either raises within the timeout plus
``--margin``, or returns the exactly right result (a rank whose part was complete may);
nothing else. On the streamed transport a call is made with ``async_op=True`` and its
future waited on: a synchronous call there returns once enqueued, and the host learns the
outcome from the future. Then every rank makes one more call on the same group, which must
raise (a rank that only sends in that collective is noted, not failed: gloo completes a
buffered send), and one on the fresh group, which must be right. A call not done within the
timeout + ``--grace`` is a hang: the rank reports it and the cluster is relaunched.
Verdicts: ok, wrong (a rank returned a wrong value), hang, slow (raised, but late), later (a
later call on the failed group returned), fresh (the fresh group's call failed), unfired (the
injection point was never reached: the harness's miss, not the library's).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

#: the drop-in each collective runs through (as tools/faults.py runs them)
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather_single", "reduce_scatter_single",
               "gather", "scatter", "all_to_all_single", "barrier")
#: points that exist once per call (every rank has them: a hook is added where the plan has
#: none); per-k points take k from the census
SINGLE = ("ready", "start", "before", "after")
PER_K = ("post", "local")
STREAMED_ONLY_SINGLE = ("watchdog_query", "watchdog_failed")
STREAMED_ONLY_PER_K = ("enqueue",)
VERDICTS = ("ok", "wrong", "hang", "slow", "later", "fresh", "unfired", "harness")
NUMEL = 1027
#: the fresh group's timeout (s)
FRESH_TIMEOUT = 30.0


@dataclass(frozen=True)
class Injection:
    collective: str
    algorithm: str
    world: int
    transport: str          # RINGCOLL_TRANSPORT in the ranks: host, batched, streamed
    point: str              # ready, start, post, local, before, after, enqueue, watchdog_query, ...
    k: int                  # which one of the point's (0 for the single points)
    victim: int

    @property
    def id(self) -> str:
        point = f"{self.point}:{self.k}" if self.point in PER_K + STREAMED_ONLY_PER_K else self.point
        return f"{self.collective}/{self.algorithm}@{self.world}/{self.transport}:{point}:r{self.victim}"


# -- the call, its data and its exact result ------------------------------------------------
def make_call(collective: str, algorithm: str, rank: int, world: int, group, salt: int):
    """(run, correct): the call on ``group`` and whether its result is exactly right; data
    ``salt``-dependent and never zero, so a stale or missing contribution shows."""
    import torch


    n = NUMEL

    def of(r):
        return torch.arange(n, dtype=torch.int64) % 11 + 1 + r * 3 + salt * 100

    x = of(rank)
    total = sum(of(r) for r in range(world))
    c, alg = collective, algorithm
    run, correct = _call(c, alg, rank, world, group, x, total, of, n)
    if os.environ.get("RINGCOLL_TRANSPORT") != "streamed":
        return run, correct

    def settled():
        # a synchronous call on the stream path returns once enqueued (as NCCL's); the host
        # learns its outcome from its future, which completes once the watchdog saw it end
        # (and raises its error)
        work = run(async_op=True)
        if work is not None:
            work.get_future().wait()
    return settled, correct


def _call(c, alg, rank, world, group, x, total, of, n):
    import torch

    import ringcoll

    g = {"group": group, "algorithm": alg}
    if c == "all_reduce":
        return (lambda **kw: ringcoll.all_reduce(x, **g, **kw)), (lambda: torch.equal(x, total))
    if c == "reduce":
        return (lambda **kw: ringcoll.reduce(x, dst=0, **g, **kw)), \
            (lambda: rank != 0 or torch.equal(x, total))
    if c == "broadcast":
        return (lambda **kw: ringcoll.broadcast(x, src=0, **g, **kw)), (lambda: torch.equal(x, of(0)))
    if c == "all_gather_single":
        out = torch.full((world * n,), -1, dtype=torch.int64)
        return (lambda **kw: ringcoll.all_gather_single(out, x, **g, **kw)), \
            (lambda: torch.equal(out, torch.cat([of(r) for r in range(world)])))
    if c == "reduce_scatter_single":
        big = torch.cat([x * (j + 1) for j in range(world)])
        out = torch.full((n,), -1, dtype=torch.int64)
        return (lambda **kw: ringcoll.reduce_scatter_single(out, big, **g, **kw)), \
            (lambda: torch.equal(out, total * (rank + 1)))
    if c == "gather":
        outs = [torch.full((n,), -1, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
        return (lambda **kw: ringcoll.gather(x, outs, dst=0, **g, **kw)), \
            (lambda: rank != 0 or all(torch.equal(o, of(r)) for r, o in enumerate(outs)))
    if c == "scatter":
        parts = [of(r) * 10 for r in range(world)] if rank == 0 else None
        out = torch.full((n,), -1, dtype=torch.int64)
        return (lambda **kw: ringcoll.scatter(out, parts, src=0, **g, **kw)), \
            (lambda: torch.equal(out, of(rank) * 10))
    if c == "all_to_all_single":
        inp = torch.cat([of(rank) * (j + 1) for j in range(world)])
        out = torch.full((world * n,), -1, dtype=torch.int64)
        return (lambda **kw: ringcoll.all_to_all_single(out, inp, **g, **kw)), \
            (lambda: torch.equal(out, torch.cat([of(r) * (rank + 1) for r in range(world)])))
    if c == "barrier":
        return (lambda **kw: ringcoll.barrier(**g, **kw)), (lambda: True)
    raise ValueError(f"unknown collective {c!r}")


# -- the monkeypatches (in the victim only) -------------------------------------------------
class Patches:
    """Wrappers around the executor's and transports' functions that see which call they run
    for: ``target`` is true inside the numbered call's own run (an internal exchange it runs
    with a tag, such as the group's placement, is not the target). Counts each point's events
    for the target call (the census) or raises at ``point`` number ``k`` (an injection)."""

    def __init__(self, point: Optional[str] = None, k: int = 0):
        self.point, self.k = point, k
        self.counts: Counter = Counter()
        self.fired: Optional[str] = None          # where, once it fired
        self.targets: set = set()                  # ids of the target call's prepared plans
        self.locals: set = set()                   # ids of their resolved local operations
        self._stack: List[bool] = []               # per execute entered: whether it is the target
        self._undo: List[Callable[[], None]] = []
        self.armed = True

    def _target(self) -> bool:
        return not self._stack or self._stack[-1]

    def _event(self, point: str, error: BaseException) -> None:
        index = self.counts[point]
        self.counts[point] += 1
        if self.armed and self.point == point and self.k == index and self.fired is None:
            self.fired = f"{point}:{index}"
            raise error

    def _patch(self, owner, name: str, make) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> "Patches":
        from ringcoll.runtime import executor as ex
        from ringcoll.runtime import stream_runtime
        from ringcoll.runtime.transport import BatchedTransport, HostTransport
        from ringcoll.runtime.transport import stream_ordered as stream_transport

        patches = self

        def execute(original):
            def wrapped(self, call, seq=None, *, tag=None, **kw):
                patches._stack.append(tag is None)
                try:
                    return original(self, call, seq, tag=tag, **kw)
                finally:
                    patches._stack.pop()
            return wrapped

        def prepare(original):
            def wrapped(self, plan):
                prepared = original(self, plan)
                if patches._target():
                    patches.targets.add(id(prepared))
                    patches.locals.update(id(ops) for ops in prepared.local)
                    patches.counts["before_hooks"] += len(prepared.before)
                    patches.counts["after_hooks"] += len(prepared.after)
                    if patches.point in ("before", "after"):
                        def hook(where=patches.point):
                            patches._event(where, RuntimeError(f"injected: a {where} hook raised"))
                        if patches.point == "before":
                            prepared.before = tuple(prepared.before) + (hook,)
                        else:
                            prepared.after = (hook,) + tuple(prepared.after)
                return prepared
            return wrapped

        def ready(original):
            def wrapped(self, deadline):
                if patches._target():
                    patches._event("ready", RuntimeError("injected: the transport's set-up raised"))
                return original(self, deadline)
            return wrapped

        def run_steps(original):
            def wrapped(self, prepared, *args):
                if id(prepared) in patches.targets:
                    patches._event("start", RuntimeError("injected: raised before the first post"))
                return original(self, prepared, *args)
            return wrapped

        def post(original):
            def wrapped(self, prepared, index, *args):
                if id(prepared) in patches.targets and prepared.posts[index]:
                    patches._event("post", RuntimeError(f"injected: raised posting step {index + 1}"))
                return original(self, prepared, index, *args)
            return wrapped

        def run_resolved(original):
            def wrapped(op, resolved):
                if id(resolved) in patches.locals:
                    patches._event("local", MemoryError("injected: out of memory in a local operation"))
                return original(op, resolved)
            return wrapped

        def local(original):
            def wrapped(self, fn, *args, **kwargs):
                if patches._target() and patches._stack:
                    patches._event("enqueue", RuntimeError("injected: raised enqueueing host work"))
                return original(self, fn, *args, **kwargs)
            return wrapped

        def watchdog_point(point, message):
            """A wrapper of one of the watchdog's reads (``point``) that raises there once."""
            def patch(original):
                def wrapped(self, subject):
                    if patches.point == point and patches.armed and patches.fired is None:
                        patches._event(point, RuntimeError(message))
                    return original(self, subject)
                return wrapped
            return patch

        query = watchdog_point("watchdog_query", "injected: the watchdog's event query raised")
        failed = watchdog_point("watchdog_failed", "injected: the communicator's failed query raised")

        # run_resolved is called through the executor module's own name (host and stream paths)
        original_run = ex.run_resolved
        ex.run_resolved = run_resolved(original_run)
        self._undo.append(lambda: setattr(ex, "run_resolved", original_run))
        self._patch(ex.P2PExecutor, "execute", execute)
        self._patch(ex.P2PExecutor, "prepare", prepare)
        self._patch(ex.P2PExecutor, "_run_steps", run_steps)
        self._patch(ex.P2PExecutor, "_post", post)
        for cls in (HostTransport, BatchedTransport, stream_transport.StreamTransport):
            self._patch(cls, "ready", ready)
        self._patch(stream_transport.StreamTransport, "local", local)
        self._patch(stream_runtime.EmulatedRuntime, "query", query)
        self._patch(stream_transport.EmulatedNccl, "failed", failed)
        return self

    def remove(self) -> None:
        self.armed = False
        while self._undo:
            self._undo.pop()()


# -- on each rank ---------------------------------------------------------------------------
def _bounded(fn: Callable[[], object], seconds: float) -> dict:
    """Run ``fn`` in a thread for at most ``seconds``: returned, raised (its error), or hung."""
    out: dict = {}

    def body():
        start = time.monotonic()
        try:
            fn()
            out.update(kind="returned")
        except BaseException as error:  # noqa: BLE001 - what is being measured
            text = f"{type(error).__name__}: {error}".split("\n\nAt:")[0]   # a callback's error: no traceback
            out.update(kind="raised", error=text[:240])
        out["elapsed"] = round(time.monotonic() - start, 3)

    thread = threading.Thread(target=body, daemon=True, name="fault-points-call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return {"kind": "hung", "elapsed": seconds}
    return out


def _groups(world: int, transport: str, *timeouts: float):
    """A new group of every rank per timeout given (s), on ``transport``."""
    import datetime

    import torch.distributed as dist

    os.environ["RINGCOLL_TRANSPORT"] = transport
    os.environ.pop("RINGCOLL_TIMEOUT", None)            # the group's own timeout applies
    return [dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=seconds))
            for seconds in timeouts]


def census_on_rank(cases: list, transport: str, timeout: float) -> dict:
    """Each (collective, algorithm) once, cleanly, counting this rank's events per point;
    ``{case: {"counts": ..., "correct": ...} or {"error": ...}}``."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    answers: dict = {}
    (group,) = _groups(world, transport, timeout)
    for collective, algorithm in cases:
        patches = Patches().install()
        try:
            run, correct = make_call(collective, algorithm, rank, world, group, salt=1)
            out = _bounded(run, timeout + 10)
        finally:
            patches.remove()
        if out["kind"] == "returned":
            answers[f"{collective}/{algorithm}"] = {"counts": dict(patches.counts), "correct": bool(correct())}
        else:
            answers[f"{collective}/{algorithm}"] = {"error": out.get("error", "hung")}
            if out["kind"] == "hung":
                return {"answers": answers, "hung": True}
            (group,) = _groups(world, transport, timeout)     # a failed group is never used again
    return {"answers": answers, "hung": False}


def inject_on_rank(inj: dict, timeout: float, grace: float) -> dict:
    """One injection as every rank runs it (the victim with its patch): the call, one more on
    the same group, one on a fresh group; each bounded, a hang reported, not waited out."""
    import torch.distributed as dist

    inj = Injection(**inj)
    rank, world = dist.get_rank(), dist.get_world_size()
    # the fresh group's timeout is long: its call starts on the victim while its peers may
    # still be waiting out the failed call's timeout
    group, fresh = _groups(world, inj.transport, timeout, FRESH_TIMEOUT)
    bound = timeout + grace
    report: dict = {"rank": rank}
    run, correct = make_call(inj.collective, inj.algorithm, rank, world, group, salt=2)
    patches = Patches(inj.point, inj.k).install() if rank == inj.victim else None
    out: dict = {"kind": "hung", "elapsed": bound}
    try:
        out = _bounded(run, bound)
    finally:
        if patches is not None:
            # the watchdog's and the stream's parts run after the call returns on the host:
            # wait for the stream to have run them before the patch goes
            if out.get("kind") != "hung" and inj.transport == "streamed":
                time.sleep(0.05)
            patches.remove()
            report["fired"] = patches.fired
    if out["kind"] == "returned":
        out["correct"] = bool(correct())
    report["call"] = out
    if out["kind"] == "hung":
        return report
    run, correct = make_call(inj.collective, inj.algorithm, rank, world, group, salt=3)
    later = report["later"] = _bounded(run, bound)
    if later["kind"] == "returned":
        later["correct"] = bool(correct())   # recorded: a failed group's call must not return at all
    if later["kind"] == "hung":
        return report
    run, correct = make_call(inj.collective, inj.algorithm, rank, world, fresh, salt=4)
    again = report["fresh"] = _bounded(run, 2 * bound)
    if again["kind"] == "returned":
        again["correct"] = bool(correct())
    if again["kind"] != "hung":
        # both groups go (a failed group's threads and connections too: hundreds of injections
        # share these processes); the injected group's destroy is watched like a call
        report["destroy"] = _bounded(lambda: (dist.destroy_process_group(group),
                                              dist.destroy_process_group(fresh)), bound)
    return report


# -- the verdict ----------------------------------------------------------------------------
def judge(inj: Injection, reports: List[Optional[dict]], timeout: float, margin: float) -> dict:
    """The verdicts of one injection (several may apply; ``ok`` alone when none does) and a
    line per problem naming the rank."""
    problems: Dict[str, List[str]] = {}
    notes: List[str] = []

    def fail(verdict: str, text: str) -> None:
        problems.setdefault(verdict, []).append(text)

    if any(r is None for r in reports):
        fail("hang", "the cluster lost a rank or did not answer: " +
             ", ".join(str(rank) for rank, r in enumerate(reports) if r is None))
    victim = reports[inj.victim] if inj.victim < len(reports) else None
    if victim is not None and not victim.get("fired"):
        fail("unfired", f"rank {inj.victim}: the injection point was never reached")
    for rank, report in enumerate(reports):
        if report is None:
            continue
        call = report["call"]
        if call["kind"] == "hung":
            fail("hang", f"rank {rank}: the injected call did not end within {call['elapsed']:.0f} s")
            continue
        if call["kind"] == "returned" and not call["correct"]:
            fail("wrong", f"rank {rank}: the injected call returned a WRONG value")
        if call["kind"] == "raised" and call["elapsed"] > timeout + margin:
            fail("slow", f"rank {rank}: raised after {call['elapsed']:.2f} s > {timeout} + {margin}: {call['error']}")
        later = report.get("later")
        if later is None:
            continue
        if later["kind"] == "hung":
            fail("hang", f"rank {rank}: the next call on the failed group did not end within {later['elapsed']:.0f} s")
            continue
        if later["kind"] == "returned":
            if receives(inj.collective, rank):
                fail("later", f"rank {rank}: the next call on the failed group returned (it must raise)")
            else:
                # only sends: gloo completes a send once buffered, with the receiver failed (as
                # the built-ins do), and the rank gets no data; noted, not failed
                notes.append(f"rank {rank}: the next call on the failed group returned (it only sends)")
        again = report.get("fresh")
        if again is None:
            continue
        if again["kind"] == "hung":
            fail("hang", f"rank {rank}: the call on a fresh group did not end within {again['elapsed']:.0f} s")
        elif again["kind"] != "returned" or not again["correct"]:
            fail("fresh", f"rank {rank}: the call on a fresh group " +
                 (f"raised {again.get('error', '')[:200]}" if again["kind"] == "raised" else "returned a wrong value"))
    verdict = {"id": inj.id, "verdicts": sorted(problems) or ["ok"],
               "problems": [text for texts in problems.values() for text in texts],
               "ranks": [_summary(r) for r in reports]}
    if notes:
        verdict["notes"] = notes
    if problems:                     # what each rank did, errors in full (400 characters)
        verdict["reports"] = reports
    return verdict


def receives(collective: str, rank: int) -> bool:
    """Whether ``rank`` (the root is rank 0) gets data from its peers in the collective: not a
    reduce's or a gather's non-root, nor a broadcast's or a scatter's root."""
    if collective in ("reduce", "gather"):
        return rank == 0
    return rank != 0 or collective not in ("broadcast", "scatter")


def _summary(report: Optional[dict]) -> Optional[str]:
    """What one rank did, in one line: ``raised PeerError 2.01s | later GroupFailedError 0.00s | fresh ok``."""
    if report is None:
        return None

    def one(out: Optional[dict]) -> str:
        if out is None:
            return "-"
        if out["kind"] == "raised":
            return f"raised {out['error'].split(':')[0]} {out['elapsed']:.2f}s"
        if out["kind"] == "hung":
            return f"HUNG >{out['elapsed']:.0f}s"
        return f"returned {'right' if out.get('correct', True) else 'WRONG'} {out['elapsed']:.2f}s"

    parts = [one(report["call"]), "later " + one(report.get("later")), "fresh " + one(report.get("fresh"))]
    if "fired" in report:
        parts.insert(0, f"victim fired={report['fired']}")
    return " | ".join(parts)


# -- the plan -------------------------------------------------------------------------------
def cases() -> List[tuple]:
    from ringcoll.schedules import registry

    return [(c, a) for c in COLLECTIVES for a in registry.algorithms(registry.collective_of(c))]


def _ks(count: int) -> List[int]:
    """First, middle and last of ``count`` events."""
    return sorted({0, count // 2, count - 1}) if count > 0 else []


def plan_injections(census: dict, world: int, transport: str, turn: int = 0) -> List[Injection]:
    """Every point of every (collective, algorithm) the census ran cleanly: victims taken in
    turn among the ranks that have the point (a leaf of a broadcast may have no local step),
    starting ``turn`` ranks on (a second run with another ``turn`` hits other victims)."""
    plan: List[Injection] = []
    for case, per_rank in census.items():
        collective, algorithm = case.split("/")
        if any("error" in r or not r["correct"] for r in per_rank):
            continue
        next_victim = turn

        def victims(have: Callable[[dict], bool]) -> List[int]:
            return [rank for rank, r in enumerate(per_rank) if have(r["counts"])]

        points: List[tuple] = [(p, 0, lambda c: True) for p in SINGLE]
        if transport == "streamed" and algorithm == watchdog_algorithm(collective):
            points += [(p, 0, lambda c: c.get("post", 0) > 0) for p in STREAMED_ONLY_SINGLE]
        per_k = PER_K + (STREAMED_ONLY_PER_K if transport == "streamed" else ())
        for point in per_k:
            most = max(r["counts"].get(point, 0) for r in per_rank)
            for k in _ks(most):
                points.append((point, k, lambda c, point=point, k=k: c.get(point, 0) > k))
        for point, k, have in points:
            ranks = victims(have)
            if not ranks:
                continue
            plan.append(Injection(collective, algorithm, world, transport, point, k, ranks[next_victim % len(ranks)]))
            next_victim += 1
    return plan


def watchdog_algorithm(collective: str) -> str:
    """The algorithm whose calls the watchdog points are injected into, one per collective:
    the watchdog reads every call's events the same way, whatever its schedule, and an
    injection that kills it costs a hang bound and a relaunch."""
    from ringcoll.schedules import registry

    return registry.algorithms(registry.collective_of(collective))[0]


def skipped(census: dict) -> Dict[str, str]:
    """The cases the census could not run cleanly, and why."""
    out = {}
    for case, per_rank in census.items():
        errors = [f"rank {rank}: {r['error']}" for rank, r in enumerate(per_rank) if "error" in r]
        if errors:
            out[case] = errors[0][:300]
        elif not all(r["correct"] for r in per_rank):
            out[case] = "the clean call returned a wrong value"
    return out


# -- the campaign ---------------------------------------------------------------------------
class Runner:
    """A kept-alive cluster per world, relaunched when it dies or a rank hangs."""

    def __init__(self, timeout: float, margin: float, grace: float, relaunch_every: int):
        self.timeout, self.margin, self.grace = timeout, margin, grace
        self.relaunch_every = relaunch_every
        self._clusters: dict = {}
        self._uses: Counter = Counter()
        self.relaunches = 0

    def cluster(self, world: int):
        import ringcoll

        cluster = self._clusters.get(world)
        if cluster is not None and cluster.alive and self._uses[world] < self.relaunch_every:
            return cluster
        if cluster is not None:
            cluster.close()
            self.relaunches += 1
        cluster = self._clusters[world] = ringcoll.launch(world, "gloo", timeout=120, threads=1,
                                                          env={"RINGCOLL_TIMEOUT": "60"})
        self._uses[world] = 0
        return cluster

    def retire(self, world: int) -> None:
        cluster = self._clusters.pop(world, None)
        if cluster is not None:
            cluster.close()
            self.relaunches += 1

    def census(self, world: int, transport: str, which: Optional[List[tuple]] = None) -> dict:
        """Per case (``which``, default every one), what each rank counted in a clean call."""
        from ringcoll.cluster import ClusterError

        todo, answers = list(which or cases()), {}
        while todo:
            try:
                reports = self.cluster(world).run(census_on_rank, todo, transport, self.timeout,
                                                  timeout=60 + 5 * len(todo))
            except (ClusterError, Exception) as error:  # noqa: BLE001 - one case brought it down
                answers[f"{todo[0][0]}/{todo[0][1]}"] = [{"error": f"census: {type(error).__name__}: {error}"[:300]}]
                self.retire(world)
                todo = todo[1:]
                continue
            for case_key in reports[0]["answers"]:
                answers[case_key] = [r["answers"].get(case_key, {"error": "no answer"}) for r in reports]
            done = len(reports[0]["answers"])
            if any(r["hung"] for r in reports):
                self.retire(world)
            todo = todo[done:]
        return answers

    def inject(self, inj: Injection) -> dict:
        from ringcoll.cluster import ClusterError

        cluster = self.cluster(inj.world)
        self._uses[inj.world] += 1
        start = time.monotonic()
        bound = 3 * (self.timeout + self.grace) + 60
        try:
            reports = cluster.run(inject_on_rank, asdict(inj), self.timeout, self.grace, timeout=bound)
        except (ClusterError, Exception) as error:  # noqa: BLE001 - a rank died or raised outside a call
            # every call is bounded inside the ranks, so this is the harness's (a group not
            # made in time on a loaded host: the store's wait is the group's timeout), or a
            # rank that died
            reports = [None] * inj.world
            self.retire(inj.world)
            verdict = harness_failed(inj, f"cluster: {type(error).__name__}: {str(error)[:300]}")
        else:
            verdict = judge(inj, reports, self.timeout, self.margin)
            destroyed = [(r or {}).get("destroy", {}).get("kind") for r in reports]
            if "hang" in verdict["verdicts"] or any(kind not in (None, "returned") for kind in destroyed):
                self.retire(inj.world)       # a hung thread and whatever it holds stay in its ranks
            if any(kind not in (None, "returned") for kind in destroyed):
                verdict["destroy"] = [(r or {}).get("destroy") for r in reports]
        verdict["seconds"] = round(time.monotonic() - start, 2)
        return verdict

    def close(self) -> None:
        for world in list(self._clusters):
            self.retire(world)


def table(verdicts: List[dict]) -> str:
    """Per point x transport: injections and each verdict's count (an injection may have several)."""
    rows: Dict[tuple, Counter] = {}
    for v in verdicts:
        inj = asdict(injection_of(v))
        key = (inj["transport"], inj["point"])
        counter = rows.setdefault(key, Counter())
        counter["injections"] += 1
        for verdict in v["verdicts"]:
            counter[verdict] += 1
    head = ["transport", "point", "injections"] + list(VERDICTS)
    def row(cells) -> str:
        return f"{cells[0]:<10}{cells[1]:<16}" + "".join(f"{x:>11}" for x in cells[2:])

    lines = [row(head)]
    total: Counter = Counter()
    for (transport, point), counter in sorted(rows.items()):
        total.update(counter)
        lines.append(row([transport, point, counter["injections"]] + [counter[v] for v in VERDICTS]))
    lines.append(row(["all", "", total["injections"]] + [total[v] for v in VERDICTS]))
    return "\n".join(lines)


def _parse_replay(text: str) -> Injection:
    """``all_reduce/ring@4/host:local:2:r1`` (as Injection.id writes it)."""
    case, rest = text.split("@", 1)
    collective, algorithm = case.split("/")
    world, rest = rest.split("/", 1)
    parts = rest.split(":")
    transport, point = parts[0], parts[1]
    k = int(parts[2]) if point in PER_K + STREAMED_ONLY_PER_K else 0
    victim = int(parts[-1][1:]) if parts[-1].startswith("r") else 0
    return Injection(collective, algorithm, int(world), transport, point, k, victim)


def draw_sample(runner: Runner, count: int, seed: int, worlds: List[int], transports: List[str]) -> List[Injection]:
    """``count`` injections: each a (collective, algorithm, world, transport) drawn at random,
    then one of its points at random (the census run for the drawn cases only)."""
    rng = random.Random(f"ringcoll-fault-points:{seed}")
    drawn = [(rng.choice(cases()), rng.choice(worlds), rng.choice(transports)) for _ in range(count)]
    census: Dict[tuple, dict] = {}
    for world, transport in sorted({(w, t) for _, w, t in drawn}):
        which = sorted({case for case, w, t in drawn if (w, t) == (world, transport)})
        census[(world, transport)] = runner.census(world, transport, which)
    plan = []
    for case, world, transport in drawn:
        key = f"{case[0]}/{case[1]}"
        points = plan_injections({key: census[(world, transport)][key]}, world, transport)
        if points:
            plan.append(rng.choice(points))
    return sorted(plan, key=lambda inj: (inj.world, inj.transport))


def summarize(verdicts: List[dict], **extra) -> dict:
    tally = Counter(v for x in verdicts for v in x["verdicts"])
    summary = {"injections": len(verdicts), "tally": {v: tally[v] for v in VERDICTS},
               "noted_send_only_later_returns": sum(len(v.get("notes", [])) for v in verdicts),
               "by_point": table(verdicts)}
    summary.update(extra)
    summary["failing"] = [v["id"] for v in verdicts if v["verdicts"] != ["ok"]]
    summary["verdicts"] = verdicts
    return summary


def failing(summary: dict) -> List[dict]:
    return [v for v in summary["verdicts"] if v["verdicts"] != ["ok"]]


def write(summary: dict, out: str) -> None:
    """The JSON at ``out`` and the table beside it (``.txt``)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    head = {k: v for k, v in summary.items() if k != "verdicts"}
    with open(out, "w") as f:                     # a verdict a line: the file diffs and greps
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "verdicts": [\n')
        f.write(",\n".join(json.dumps(v) for v in summary["verdicts"]) + "\n ]\n}\n")
    with open(os.path.splitext(out)[0] + ".txt", "w") as f:
        f.write(report_text(summary))


def report_text(summary: dict) -> str:
    lines = [f"{summary.get('command', '')}", f"{summary['injections']} injections; " +
             ", ".join(f"{v} {n}" for v, n in summary["tally"].items()), "", summary["by_point"], ""]
    transports = sorted({injection_of(v).transport for v in failing(summary)},
                        key=lambda t: (t == "streamed", t))
    for transport in transports:
        lines.append(f"Every {transport} injection not ok (what each rank did: the injected call | the next "
                     f"call on its group | a call on a fresh group):")
        for v in failing(summary):
            if injection_of(v).transport != transport:
                continue
            lines.append(f"- {v['id']}: {', '.join(v['verdicts'])}")
            for rank, line in enumerate(v["ranks"]):
                lines.append(f"    rank {rank}: {line}")
            if "replay" in v:
                lines.append(f"  replayed alone: {', '.join(v['replay']['verdicts'])}")
                for rank, line in enumerate(v["replay"]["ranks"]):
                    lines.append(f"    rank {rank}: {line}")
        lines.append("")
    return "\n".join(lines) + "\n"


def harness_failed(inj: Injection, problem: str) -> dict:
    """The verdict of an injection the harness could not run (the ranks report nothing)."""
    return {"id": inj.id, "verdicts": ["harness"], "problems": [problem], "ranks": [None] * inj.world}


def rejudge(verdict: dict, timeout: float, margin: float) -> dict:
    """``verdict`` judged again from its ranks' reports (kept for every injection not ok), as
    this version of :func:`judge` reads them."""
    verdict.pop("injection", None)               # older runs kept it; the id says it
    cluster = [p for p in verdict["problems"] if p.startswith("cluster: ")]
    if cluster and not any(verdict["ranks"]):     # older runs judged these a hang
        again = harness_failed(injection_of(verdict), cluster[0])
        again["seconds"] = verdict.get("seconds")
        return again
    if "reports" not in verdict:
        return verdict
    for report in verdict["reports"]:
        for out in (report or {}).values():
            if isinstance(out, dict) and "error" in out:
                out["error"] = out["error"].split("\n\nAt:")[0][:240]
    again = judge(injection_of(verdict), verdict["reports"], timeout, margin)
    again["seconds"] = verdict.get("seconds")
    return again


def run_plan(runner: Runner, plan: List[Injection], progress: int, start: float) -> List[dict]:
    """Every injection of ``plan``, a line per ``progress`` injections and one per failing one."""
    verdicts: List[dict] = []
    for number, inj in enumerate(plan, 1):
        verdict = runner.inject(inj)
        verdicts.append(verdict)
        if verdict["verdicts"] != ["ok"]:
            print(f"  {inj.id}: {', '.join(verdict['verdicts'])}: {'; '.join(verdict['problems'])[:600]}", flush=True)
        if number % progress == 0 or number == len(plan):
            tally = Counter(v for x in verdicts for v in x["verdicts"])
            print(f"[{number}/{len(plan)}] {time.monotonic() - start:.0f} s: " +
                  ", ".join(f"{v} {tally[v]}" for v in VERDICTS if tally[v]), flush=True)
    return verdicts


def injection_of(verdict: dict) -> Injection:
    """The injection a verdict is of (its id says it all)."""
    return _parse_replay(verdict["id"])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fault_points", description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="3,4")
    parser.add_argument("--transports", default="host,streamed")
    parser.add_argument("--timeout", type=float, default=2.0, help="the groups' timeout in the ranks (s)")
    parser.add_argument("--margin", type=float, default=3.0, help="allowed beyond the timeout (s)")
    parser.add_argument("--grace", type=float, default=6.0, help="beyond the timeout, a call is a hang (s)")
    parser.add_argument("--sample", type=int, help="a seeded sample of N injections, not all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--turn", type=int, default=0, help="start the victims' rotation this many ranks on")
    parser.add_argument("--replay", metavar="ID", action="append", help="an injection, as its id reads (repeatable)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="merge campaigns' results into --out")
    parser.add_argument("--replays", metavar="JSON", help="with --merge: a --replay run of failing injections, "
                        "attached to each as it replayed alone")
    parser.add_argument("--relaunch-every", type=int, default=100, help="injections per cluster before a fresh one")
    parser.add_argument("--progress", type=int, default=10, help="a progress line per N injections")
    parser.add_argument("--out", help="results JSON; the table and every failing injection in a .txt beside it")
    args = parser.parse_args(argv)
    command = "python -m tools.fault_points " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.merge:
        parts = [json.load(open(path)) for path in args.merge]
        verdicts = [rejudge(v, parts[0]["timeout_s"], parts[0]["margin_s"]) for part in parts for v in part["verdicts"]]
        summary = summarize(verdicts, command=command,
                            merged=[part["command"] for part in parts],
                            seconds=sum(part["seconds"] for part in parts),
                            skipped={k: v for part in parts for k, v in part["skipped"].items()},
                            relaunches=sum(part["relaunches"] for part in parts),
                            **{k: parts[0][k] for k in ("timeout_s", "margin_s", "grace_s", "cores")},
                            date=max(part["date"] for part in parts))
        if args.replays:
            again = {v["id"]: v for v in json.load(open(args.replays))["verdicts"]}
            for verdict in failing(summary):
                if verdict["id"] in again:
                    verdict["replay"] = {k: again[verdict["id"]][k] for k in ("verdicts", "problems", "ranks")}
            summary["replayed"] = len(again)
    else:
        worlds = [int(w) for w in args.worlds.split(",")]
        transports = args.transports.split(",")
        runner = Runner(args.timeout, args.margin, args.grace, args.relaunch_every)
        start = time.monotonic()
        skips: Dict[str, Dict[str, str]] = {}
        try:
            if args.replay:
                plan = [_parse_replay(text) for text in args.replay]
            elif args.sample is not None:
                plan = draw_sample(runner, args.sample, args.seed, worlds, transports)
            else:
                plan = []
                for world in worlds:
                    for transport in transports:
                        census = runner.census(world, transport)
                        skips[f"{world}/{transport}"] = skipped(census)
                        drawn = plan_injections(census, world, transport, args.turn)
                        print(f"census world {world} {transport}: {len(census)} algorithms, "
                              f"{len(skips[f'{world}/{transport}'])} skipped, {len(drawn)} injections", flush=True)
                        plan += drawn
            verdicts = run_plan(runner, plan, args.progress, start)
        finally:
            runner.close()
        summary = summarize(verdicts, command=command, timeout_s=args.timeout, margin_s=args.margin,
                            grace_s=args.grace, relaunches=runner.relaunches, skipped=skips,
                            seconds=round(time.monotonic() - start, 1), cores=os.cpu_count(),
                            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(report_text(summary), end="")
    if args.out:
        write(summary, args.out)
    return 1 if summary["tally"]["ok"] != summary["injections"] else 0


if __name__ == "__main__":
    sys.exit(main())
