"""GPU runtime checks that need one GPU: the ``runtime`` section of ``python -m tools.gpu_check``.

Each check runs in a subprocess of its own (``python -m tools.gpu_runtime NAME``), under a
wall-clock limit (``--timeout-per-check``), so that an NCCL hang or abort costs one check, not
the run; it prints one JSON line ``{"status": "pass" | "fail" | "skip", "reason": ..., ...}``.
Without CUDA every check is skipped with the reason, and no subprocess starts.

The checks, in order:

- ``kernels_prepare``: ``ringcoll.kernels.prepare("cuda:0", ...)`` probes the kernel backends on
  the device and compiles the float kinds' one-source modules; a second call is cached; a Numba
  kernel compiled ahead (``_numba.cuda_compiled``) is not compiled again by its first launch.
- ``nccl_self_batch``: a self send/recv batch through ``ringcoll.runtime.transport.NcclComm`` on a real
  ProcessGroupNCCL of world 1, both as a raw Backend (what the ``"ringcoll"`` backend's inner
  group is: ``_start_coalescing()`` without a device) and as a registered ProcessGroup
  (``_start_coalescing(device)``): the binding mismatch that once made every CUDA step raise.
- ``backend_world1``: ``init_process_group("ringcoll")`` of world 1 with CUDA tensors (its inner
  group is NCCL): all_reduce (SUM, AVG, PREMUL_SUM), broadcast, all_gather_single,
  reduce_scatter_single through ``dist.*``; ``ringcoll.all_reduce`` on the same group; an async
  call's ``Work.get_future()`` value. A world of one moves nothing over NCCL: the transport is
  exercised by ``nccl_self_batch`` and ``backend_two_ranks_one_gpu``.
- ``side_stream``: a backend call issued under a side stream, behind work already queued on that
  stream (``torch.cuda._sleep`` then a fill), compared with the same call on the default
  stream: both must see the fill (PREMUL_SUM by 2 on world 1 makes the call's own kernel
  visible), and later work on the side stream must see the call's result.
- ``event_poll_latency``: host-side latencies: ``Event.query()`` per call, an empty event's
  turnaround, and for an async ``dist.all_reduce`` on the ringcoll group the time until
  ``is_completed()``, until ``get_future()``'s callback runs and until ``wait()`` returns.
- ``graph_capture``: ``ringcoll.all_reduce`` (world 1, CUDA) inside ``torch.cuda.graph`` must
  raise ringcoll's ``CaptureError`` itself (its type, not a message naming capture) before
  anything is enqueued, and a call right after the capture must work; what ``dist.all_reduce``
  on the ringcoll group raises there is recorded.
- ``loopback_ranks``: 2, 3 and 4 ranks of this process on the one GPU (``tools/loopback.py``:
  copies between the ranks' buffers on a communication stream, ordered by events, where NCCL
  would move them) driving ringcoll's real executor: every all_reduce algorithm on float32 and
  bfloat16 exact data, with two calls in flight before the host synchronises; each rank's
  stream is ringcoll's own (an ExternalStream, none of torch's pool, distinct per rank), the
  reductions run on it with the kernels ``auto`` picks (CuPy on a GPU), ``RINGCOLL_WINDOW``
  steps in flight, every call settled by the watchdog without failure, the scratch buffers
  from the caching allocator on ringcoll's stream.
- ``allocator_safety``: on the loopback ranks, an async all_reduce whose input every rank but
  rank 0 drops at once; a tensor of the same size allocated and overwritten on the caller's
  stream while the call still runs must neither get the dropped tensor's memory while the call
  uses it nor be written by the call, and rank 0's result must be exact.
- ``ring_step_time``: a ring all_reduce of 4 loopback ranks at 4 sizes: the GPU time per call
  (CUDA events on the caller's stream), **µs per step** (the call's steps, never 0: the world-1
  measurement this replaced had none) and the host time per call (enqueue, including waiting
  for the other ranks' threads to enqueue their matching sends).

Entry points used: ``dist.*`` on a ringcoll group, ``ringcoll.all_reduce``,
``Work.get_future()``, ``ringcoll.kernels.prepare``, ``ringcoll.runtime.transport.NcclComm``, and
for the multi-rank checks ``ringcoll.runtime.executor.P2PExecutor`` itself (``tools/loopback.py``).
The loopback checks take a ``device``: ``"cpu"`` runs them on the stream emulator (CI's rehearsal,
``tests/tools/test_gpu_check.py``).
"""
from __future__ import annotations

import atexit
import json
import pathlib
import statistics
import subprocess
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]

#: the checks, in the order they run (each a function below named check_<name>)
CHECKS = ("kernels_prepare", "nccl_self_batch", "backend_world1", "loopback_ranks", "allocator_safety",
          "ring_step_time", "side_stream", "event_poll_latency", "graph_capture")

def _result(status: str, reason: str, **details) -> dict:
    return {"status": status, "reason": reason, **details}


def _cuda():
    import torch
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return torch, device


def _ringcoll_world1():
    """A ringcoll process group of world 1 (its CUDA inner group is NCCL) as the default group."""
    import torch.distributed as dist
    import ringcoll  # noqa: F401 - registers the backend
    dist.init_process_group("ringcoll", store=dist.HashStore(), rank=0, world_size=1)
    # destroyed at exit, as a well-behaved program does: a gloo group (the CPU inner group) left
    # to the interpreter's teardown can abort the process ("terminate called without an active
    # exception"), which would fail a check whose calls all passed
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    return dist


def _premul(dist, factor: float):
    return dist._make_nccl_premul_sum(factor)


# ---- the checks (each runs in its own process) ----

def check_kernels_prepare() -> dict:
    torch, device = _cuda()
    from ringcoll import kernels
    start = time.perf_counter()
    first = kernels.prepare(device, [torch.float32, torch.bfloat16, torch.float16])
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    again = kernels.prepare(device, [torch.float32, torch.bfloat16, torch.float16])
    cached = time.perf_counter() - start
    details = {"prepared": first, "seconds": round(seconds, 3), "again_seconds": round(cached, 6)}
    if "numba" not in first["unavailable"]:       # compiled ahead for the launch's very types?
        from ringcoll.kernels import _numba
        kernel = _numba.cuda_compiled("f32", "sum", device.index)
        before = len(kernel.overloads)
        dst = torch.ones(4099, device=device)
        kernels.reduce_into(dst, dst.clone(), "sum", backend="numba")
        torch.cuda.synchronize(device)
        details["numba_overloads"] = [before, len(kernel.overloads)]
        if len(kernel.overloads) != before or not torch.equal(dst, torch.full_like(dst, 2.0)):
            return _result("fail", f"numba's first launch after cuda_compiled compiled again "
                                   f"(overloads {before} -> {len(kernel.overloads)}: _numba.signature is "
                                   f"not the launch's types) or computed wrong", **details)
    if again is not first:
        return _result("fail", "a second prepare() of the same device compiled again", **details)
    if first["error"]:
        return _result("fail", f"compile error: {first['error']}", **details)
    if first["backend"] == "torch":
        return _result("fail", f"no CUDA kernel backend passed its probe: {first['unavailable']}",
                       **details)
    return _result("pass", f"{first['backend']} kernels probed and compiled on {device} in "
                           f"{seconds:.2f} s; the second call took {cached * 1e6:.0f} us", **details)


def check_nccl_self_batch() -> dict:
    torch, device = _cuda()
    import torch.distributed as dist
    from ringcoll.runtime.transport import NcclComm
    options = dist.ProcessGroupNCCL.Options()
    raw = dist.ProcessGroupNCCL(dist.HashStore(), 0, 1, options)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device)
    outcomes, failures = {}, []
    for label, group in (("raw ProcessGroupNCCL", raw), ("registered ProcessGroup",
                                                           dist.group.WORLD)):
        send = torch.arange(1, 4100, device=device, dtype=torch.float32)
        recv = torch.zeros_like(send)
        try:
            work = NcclComm(group, device).batch([(True, send, 0), (False, recv, 0)])
            work.wait()
            torch.cuda.synchronize(device)
            ok = torch.equal(recv, send)
            outcomes[label] = "received what was sent" if ok else "wrong data received"
            if not ok:
                failures.append(f"{label}: wrong data received")
        except Exception as exc:  # noqa: BLE001 - the check's finding
            outcomes[label] = f"{type(exc).__name__}: {exc}"[:1000]
            failures.append(f"{label}: {outcomes[label]}")
    if failures:
        return _result("fail", "; ".join(failures), outcomes=outcomes)
    return _result("pass", "self send/recv batch through NcclComm on a raw ProcessGroupNCCL and a "
                           "registered ProcessGroup of world 1", outcomes=outcomes)


def _collective_cases(torch, dist, ringcoll, device):
    """(name, run() -> problem or None) of the world-1 backend calls."""
    base = torch.arange(1, 1004, device=device, dtype=torch.float32)

    def all_reduce(op, expected):
        def run():
            t = base.clone()
            dist.all_reduce(t, op=op)
            return None if torch.equal(t, expected) else f"got {t[:3].tolist()}"
        return run

    def broadcast():
        t = base.clone()
        dist.broadcast(t, src=0)
        return None if torch.equal(t, base) else "changed"

    def all_gather():
        out = torch.zeros_like(base)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, base)
        return None if torch.equal(out, base) else "wrong"

    def reduce_scatter():
        out = torch.zeros_like(base)
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, base)
        return None if torch.equal(out, base) else "wrong"

    def dropin():
        t = base.clone()
        ringcoll.all_reduce(t, op=ringcoll.ReduceOp.SUM, algorithm="ring")
        return None if torch.equal(t, base) else "wrong"

    def future():
        t = base.clone()
        work = dist.all_reduce(t, op=_premul(dist, 3.0), async_op=True)
        value = work.get_future().wait()
        torch.cuda.synchronize(device)
        got = value[0] if isinstance(value, (list, tuple)) else value
        if not torch.equal(t, base * 3):
            return f"tensor {t[:3].tolist()}"
        return None if torch.equal(got, base * 3) else f"future value {got[:3].tolist()}"

    return [("all_reduce SUM", all_reduce(dist.ReduceOp.SUM, base)),
            ("all_reduce AVG", all_reduce(dist.ReduceOp.AVG, base)),
            ("all_reduce PREMUL_SUM(2)", all_reduce(_premul(dist, 2.0), base * 2)),
            ("broadcast", broadcast), ("all_gather_single", all_gather),
            ("reduce_scatter_single", reduce_scatter), ("ringcoll.all_reduce", dropin),
            ("async get_future", future)]


def check_backend_world1() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    import ringcoll
    outcomes, failures = {}, []
    for name, run in _collective_cases(torch, dist, ringcoll, device):
        try:
            problem = run()
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001
            problem = f"raised {type(exc).__name__}: {exc}"[:1000]
        outcomes[name] = problem or "ok"
        if problem:
            failures.append(f"{name}: {problem}")
    if failures:
        return _result("fail", "; ".join(failures), outcomes=outcomes)
    return _result("pass", f"{len(outcomes)} calls on a ringcoll group of world 1 with CUDA tensors "
                           f"(no transfers at world 1)", outcomes=outcomes)


def check_side_stream() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    cycles = 50_000_000  # tens of ms at GPU clocks: the fill lands long after the host moved on
    outcomes = {}
    for label in ("default stream", "side stream"):
        stream = torch.cuda.Stream(device) if label == "side stream" else \
            torch.cuda.current_stream(device)
        t = torch.zeros(1 << 20, device=device)
        torch.cuda.synchronize(device)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            t.fill_(7.0)
            dist.all_reduce(t, op=_premul(dist, 2.0))      # must run after the fill, on this stream
            after = t + 1                                   # must see the call's result
        torch.cuda.synchronize(device)
        outcomes[label] = {"tensor": t[0].item(), "after": after[0].item()}
    wrong = {k: v for k, v in outcomes.items() if v != {"tensor": 14.0, "after": 15.0}}
    if wrong:
        return _result("fail", f"expected tensor 14 and later work 15 on each stream, got {wrong}",
                       outcomes=outcomes)
    return _result("pass", "the call ran after the stream's earlier work and before its later "
                           "work, on the default and on a side stream", outcomes=outcomes)


def check_event_poll_latency() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    us = lambda seconds: round(seconds * 1e6, 1)  # noqa: E731
    event = torch.cuda.Event()
    event.record()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(1000):
        event.query()
    query_us = us((time.perf_counter() - start) / 1000)
    turnaround = []
    for _ in range(50):
        event = torch.cuda.Event()
        start = time.perf_counter()
        event.record()
        while not event.query():
            pass
        turnaround.append(time.perf_counter() - start)
    completed, callback, waited = [], [], []
    t = torch.ones(1 << 16, device=device)
    for _ in range(30):
        torch.cuda.synchronize(device)
        fired = []
        start = time.perf_counter()
        work = dist.all_reduce(t, async_op=True)
        work.get_future().then(lambda fut: fired.append(time.perf_counter()))
        while not work.is_completed():
            if time.perf_counter() - start > 10:
                return _result("fail", "an async all_reduce of world 1 was not completed after 10 s")
        completed.append(time.perf_counter() - start)
        work.wait()
        waited.append(time.perf_counter() - start)
        deadline = time.perf_counter() + 10
        while not fired and time.perf_counter() < deadline:
            time.sleep(0)
        if not fired:
            return _result("fail", "get_future()'s callback did not run within 10 s of completion")
        callback.append(fired[0] - start)
    details = {"event_query_us": query_us,
               "event_turnaround_us_median": us(statistics.median(turnaround)),
               "async_all_reduce_is_completed_us_median": us(statistics.median(completed)),
               "async_all_reduce_future_callback_us_median": us(statistics.median(callback)),
               "async_all_reduce_wait_us_median": us(statistics.median(waited))}
    return _result("pass", ", ".join(f"{k} {v}" for k, v in details.items()), **details)


def check_graph_capture() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    import ringcoll
    from ringcoll.runtime.transport.stream_ordered import CaptureError
    t = torch.full((4096,), 3.0, device=device)
    ringcoll.all_reduce(t, op=_premul(dist, 2.0))   # warm-up outside the capture
    torch.cuda.synchronize(device)
    refused = {}
    for label, call in (("ringcoll.all_reduce", lambda: ringcoll.all_reduce(t, op=_premul(dist, 2.0))),
                        ("dist.all_reduce", lambda: dist.all_reduce(t, op=_premul(dist, 2.0)))):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
                call()
            refused[label] = None
        except Exception as exc:  # noqa: BLE001 - what it raised is the finding
            refused[label] = exc
        torch.cuda.synchronize(device)
    seen = {label: None if exc is None else f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:200]}"
            for label, exc in refused.items()}
    t.fill_(5.0)
    ringcoll.all_reduce(t, op=_premul(dist, 2.0))   # after the refused capture: must work
    dist.all_reduce(t, op=_premul(dist, 3.0))
    torch.cuda.synchronize(device)
    after = t[0].item()
    details = {"raised": seen, "after_capture": after}
    if not isinstance(refused["ringcoll.all_reduce"], CaptureError):
        return _result("fail", f"ringcoll.all_reduce under capture raised {seen['ringcoll.all_reduce']}, "
                               f"not ringcoll's CaptureError", **details)
    if not torch.equal(t, torch.full_like(t, 30.0)):
        return _result("fail", f"calls after the refused capture gave {after}, expected 30.0", **details)
    return _result("pass", f"ringcoll.all_reduce under capture raised CaptureError; dist.all_reduce: "
                           f"{seen['dist.all_reduce']}; calls after it are right", **details)


# ---- several ranks on one GPU (tools/loopback.py) ----

def _exact(numel: int, rank: int, dtype):
    """Small integers, exact in every float dtype and in any order of summation."""
    import torch
    return ((torch.arange(numel) % 13) + 1 + 2 * rank).to(dtype)


def _loopback(device):
    """(torch, device) for the loopback checks: CUDA device 0, or the CPU (the emulator)."""
    import torch
    if device == "cuda":
        return _cuda()
    return torch, torch.device(device)


def check_loopback_ranks(device: str = "cuda") -> dict:
    torch, device = _loopback(device)
    import ringcoll
    from ringcoll import kernels
    from tools.loopback import run_ranks
    algorithms = ringcoll.algorithms("all_reduce")
    numel = 4099                                  # not a multiple of any world or pack width

    def rank_fn(rank):
        wrong, calls, seen = [], [], {}
        for dtype in (torch.float32, torch.bfloat16):
            pending = []
            for algorithm in algorithms:
                with rank.current():              # written on the caller's stream, which the call follows
                    x = _exact(numel, rank.rank, dtype).to(device)
                calls.append(rank.call("all_reduce", x, algorithm=algorithm))
                pending.append((algorithm, x))
                if len(pending) == 2:             # two calls in flight, then the host reads
                    rank.synchronize()
                    for name, got in pending:
                        want = sum(_exact(numel, r, torch.float64) for r in range(rank.hub.world)).to(dtype)
                        if not torch.equal(got.cpu(), want):
                            wrong.append(f"rank {rank.rank} {name} {dtype}")
                    pending = []
            rank.synchronize()
            for name, got in pending:
                want = sum(_exact(numel, r, torch.float64) for r in range(rank.hub.world)).to(dtype)
                if not torch.equal(got.cpu(), want):
                    wrong.append(f"rank {rank.rank} {name} {dtype}")
        deadline = time.monotonic() + 10
        while not all(call.finished for call in calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        transport = rank.executor.transport(device)
        seen["stream"] = transport.stream
        seen["unsettled"] = sum(not call.finished for call in calls)
        seen["failed"] = [str(call.failure)[:200] for call in calls if call.failure is not None]
        seen["steps"] = sum(call.total for call in calls)
        seen["window"] = rank.executor.window
        seen["scratch_on_device"] = all(b.device == device for b in rank.executor._scratch.values())
        return wrong, seen

    worlds, wrong, problems = {}, [], []
    for world in (2, 3, 4):
        results = run_ranks(world, device, rank_fn, timeout=60)
        found = [seen for _, seen in results]
        wrong += [w for w, _ in results for w in w]
        stream_ids = {id(seen["stream"]) for seen in found}
        if len(stream_ids) != world:
            problems.append(f"world {world}: ranks share a stream")
        if device.type == "cuda":
            handles = {seen["stream"].cuda_stream for seen in found}
            pool = {torch.cuda.Stream(device).cuda_stream for _ in range(64)}     # torch's pool, all of it
            if not all(isinstance(seen["stream"], torch.cuda.ExternalStream) for seen in found) or handles & pool:
                problems.append(f"world {world}: a rank's stream is one of torch's pool")
        for seen in found:
            if seen["unsettled"] or seen["failed"]:
                problems.append(f"world {world}: {seen['unsettled']} calls not settled by the watchdog, "
                                f"failed: {seen['failed'][:2]}")
            if not seen["scratch_on_device"]:
                problems.append(f"world {world}: a scratch buffer off the device")
        worlds[world] = {"steps": sum(seen["steps"] for seen in found), "window": found[0]["window"]}
    details = {"worlds": worlds, "algorithms": len(algorithms), "kernels": kernels.backend_for(device),
               "wrong": wrong[:20]}
    if wrong or problems:
        return _result("fail", "; ".join(problems + [f"{len(wrong)} wrong results: {wrong[:5]}"])[:2000], **details)
    return _result("pass", f"{len(algorithms)} all_reduce algorithms x float32, bfloat16 at worlds 2, 3, 4 on "
                           f"one {device.type} device: exact; ringcoll's own stream per rank; kernels "
                           f"{details['kernels']}; window {worlds[2]['window']}; every call settled", **details)


def check_allocator_safety(device: str = "cuda") -> dict:
    torch, device = _loopback(device)
    from ringcoll.runtime import stream_runtime as streams
    from tools.loopback import run_ranks
    numel, world = 1 << 20 if device.type == "cuda" else 4096, 3
    emulated = device.type != "cuda"
    runtime = streams.emulated()
    saved = runtime.allocator
    if emulated:                                  # the emulator's caching allocator, unforgiving
        runtime.allocator = streams.ReusingAllocator()

    def empty():
        if emulated:
            return runtime.allocator.empty(numel, dtype=torch.float32)
        return torch.empty(numel, dtype=torch.float32, device=device)

    def hold(rank):
        """the caller's stream busy for a while: the call cannot have run when the host goes on"""
        if emulated:
            rank.on_caller(lambda: streams.device_work(lambda: time.sleep(0.3)))
        else:
            rank.on_caller(lambda: torch.cuda._sleep(100_000_000))

    def rank_fn(rank):
        with rank.current():
            x = empty()
        rank.on_caller(lambda: x.copy_(_exact(numel, rank.rank, torch.float32).to(device)))  # noqa: F821 - deleted later on purpose (the allocator check); the closure runs first
        hold(rank)
        call = rank.call("all_reduce", x, algorithm="ring", async_op=True)
        if rank.rank == 0:
            rank.wait(call)
            rank.synchronize()
            want = sum(_exact(numel, r, torch.float64) for r in range(world)).to(torch.float32)
            return {"exact": bool(torch.equal(x.cpu(), want))}
        address = x.data_ptr()
        del x                                     # dropped while the call runs
        with rank.current():
            y = empty()
        rank.on_caller(lambda: y.fill_(-7.0))
        rank.wait(call)
        rank.synchronize()
        return {"reused_while_in_flight": y.data_ptr() == address,
                "overwritten_kept": bool(torch.all(y.cpu() == -7.0))}

    try:
        results = run_ranks(world, device, rank_fn, timeout=60)
    finally:
        runtime.allocator = saved
    problems = []
    if not results[0]["exact"]:
        problems.append("rank 0's result is wrong: a dropped input was overwritten before it was sent")
    for r, result in enumerate(results[1:], start=1):
        if result["reused_while_in_flight"]:
            problems.append(f"rank {r}: the allocator handed the dropped input's memory out while the call used it")
        if not result["overwritten_kept"]:
            problems.append(f"rank {r}: the call wrote into memory reallocated after it was dropped")
    details = {"results": results}
    if problems:
        return _result("fail", "; ".join(problems), **details)
    return _result("pass", f"inputs dropped during an async all_reduce at world {world}: their memory "
                           f"not reused while in flight, the reallocated tensor untouched, the result exact",
                   **details)


def check_ring_step_time(device: str = "cuda") -> dict:
    torch, device = _loopback(device)
    from tools.loopback import run_ranks
    world = 4
    cuda = device.type == "cuda"
    sizes = (1 << 10, 1 << 16, 1 << 20, 1 << 24) if cuda else (1 << 8, 1 << 10, 1 << 12, 1 << 14)
    reps = 20 if cuda else 3

    def rank_fn(rank):
        rows = []
        for numel in sizes:
            with rank.current():
                x = _exact(numel, rank.rank, torch.float32).to(device)
            for _ in range(2):                    # warm-up: plans, kernels, scratch
                rank.call("all_reduce", x, algorithm="ring")
            rank.synchronize()
            host, device_s, steps = [], [], 0
            for _ in range(reps):
                if cuda:
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record(rank.caller)
                start = time.perf_counter()
                call = rank.call("all_reduce", x, algorithm="ring")
                host.append(time.perf_counter() - start)
                steps = call.total
                if cuda:
                    end.record(rank.caller)
                    end.synchronize()
                    device_s.append(begin.elapsed_time(end) / 1e3)
                else:
                    rank.synchronize()
                    device_s.append(time.perf_counter() - start)
            rows.append({"bytes": numel * 4, "steps": steps,
                         "host_us_per_call": round(statistics.median(host) * 1e6, 1),
                         "us_per_call": round(statistics.median(device_s) * 1e6, 1),
                         "us_per_step": round(statistics.median(device_s) * 1e6 / max(steps, 1), 1)})
        return rows

    results = run_ranks(world, device, rank_fn, timeout=120)
    rows = results[0]
    details = {"world": world, "rows": rows, "timing": "CUDA events on the caller's stream" if cuda
               else "host wall time to a synchronisation (the emulator: no device timing)"}
    if any(row["steps"] <= 0 for row in rows):
        return _result("fail", f"a ring all_reduce of world {world} reported no steps: {rows}", **details)
    return _result("pass", "; ".join(f"{row['bytes']} B: {row['us_per_step']} us/step x {row['steps']}, "
                                     f"host {row['host_us_per_call']} us/call" for row in rows), **details)


# ---- running them ----

#: the check processes running now (gpu_check ends them at its time limit)
RUNNING: set = set()


def run_one(name: str, timeout: float) -> dict:
    """``name`` in a subprocess of its own, within ``timeout`` seconds."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tools.gpu_runtime", name], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    RUNNING.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        return _result("fail", f"timed out after {timeout:.0f} s (a hang?) {stderr[-1500:]}".strip(),
                       seconds=round(time.monotonic() - start, 1))
    finally:
        RUNNING.discard(proc)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return _result("fail", f"exit {proc.returncode}: {(stdout + stderr)[-2000:]}",
                       seconds=round(time.monotonic() - start, 1))
    result = json.loads(lines[-1])
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def run_all(cuda: bool, timeout: float, budget: float, say=print,
            why_not: str = "no CUDA device") -> dict:
    """Every check: in its own process on CUDA, each within ``timeout`` seconds and all within
    ``budget`` (a check that would start with less than 5 s left is skipped, saying so); else
    skipped with ``why_not``."""
    results, deadline = {}, time.monotonic() + budget
    for name in CHECKS:
        left = deadline - time.monotonic()
        if not cuda:
            results[name] = _result("skip", f"needs one GPU: {why_not}")
        elif left < 5:
            results[name] = _result("skip", f"the runtime checks' budget ({budget:.0f} s) was "
                                            f"spent before it")
        else:
            results[name] = run_one(name, min(timeout, left))
        outcome = results[name]
        say(f"  {name}: {outcome['status'].upper()} - {outcome['reason'][:300]}")
    return results


def _main(argv) -> int:
    name = argv[0]
    if name not in CHECKS:
        raise SystemExit(f"unknown check {name!r}; the checks are {', '.join(CHECKS)}")
    fn = globals()[f"check_{name}"]
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - recorded as the check's failure
        result = _result("fail", f"{type(exc).__name__}: {exc}"[:2000],
                         traceback=traceback.format_exc()[-4000:])
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    sys.exit(_main(sys.argv[1:]))
