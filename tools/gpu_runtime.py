"""GPU runtime checks that need one GPU: the ``runtime`` section of ``python -m tools.gpu_check``.

Each check runs in a subprocess of its own (``python -m tools.gpu_runtime NAME``), under a
wall-clock limit (``--timeout-per-check``), so that an NCCL hang or abort costs one check, not
the run; it prints one JSON line ``{"status": "pass" | "fail" | "skip", "reason": ..., ...}``.
Without CUDA every check is skipped with the reason, and no subprocess starts.

The checks, in order:

- ``kernels_prepare``: ``ringcoll.kernels.prepare("cuda:0", ...)`` probes the kernel backends on
  the device and compiles the float kinds' one-source modules; a second call is cached.
- ``nccl_self_batch``: a self send/recv batch through ``ringcoll.runtime.transport.NcclComm`` on a real
  ProcessGroupNCCL of world 1, both as a raw Backend (what the ``"ringcoll"`` backend's inner
  group is: ``_start_coalescing()`` without a device) and as a registered ProcessGroup
  (``_start_coalescing(device)``): the binding mismatch that once made every CUDA step raise.
- ``backend_world1``: ``init_process_group("ringcoll")`` of world 1 with CUDA tensors (its inner
  group is NCCL): all_reduce (SUM, AVG, PREMUL_SUM), broadcast, all_gather_single,
  reduce_scatter_single through ``dist.*``; ``ringcoll.all_reduce`` on the same group; an async
  call's ``Work.get_future()`` value. A world of one moves nothing over NCCL: the transport is
  exercised by ``nccl_self_batch`` and ``backend_two_ranks_one_gpu``.
- ``backend_two_ranks_one_gpu``: two processes on GPU 0 over the ``"ringcoll"`` backend (so its
  NCCL inner group). NCCL refuses two ranks on one device in its init ("Duplicate GPU
  detected", NCCL >= 2.8 or so); that refusal is recorded as a skip with NCCL's message, any
  other failure as a fail; if NCCL accepts, all_reduce results are checked.
- ``side_stream``: a backend call issued under a side stream, behind work already queued on that
  stream (``torch.cuda._sleep`` then a fill), compared with the same call on the default
  stream: both must see the fill (PREMUL_SUM by 2 on world 1 makes the call's own kernel
  visible), and later work on the side stream must see the call's result.
- ``event_poll_latency``: host-side latencies: ``Event.query()`` per call, an empty event's
  turnaround, and for an async ``dist.all_reduce`` on the ringcoll group the time until
  ``is_completed()``, until ``get_future()``'s callback runs and until ``wait()`` returns.
- ``graph_capture``: one ``dist.all_reduce`` on the ringcoll group inside
  ``torch.cuda.graph``: either it is captured (and a replay gives the right result) or it is
  refused with a clear error naming capture or graphs; a crash, a hang or a wrong replay fails.
- ``host_time_per_call``: host time of a synchronous call issued behind ~50 ms of queued GPU
  work: stream-ordered (enqueue-only) calls return in far less (pass below 20 %); a call that
  blocks the host until the GPU is done takes the whole 50 ms (fail, with the numbers).

Entry points used: ``dist.*`` on a ringcoll group, ``ringcoll.all_reduce``,
``Work.get_future()``, ``ringcoll.kernels.prepare``, ``ringcoll.runtime.transport.NcclComm``.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]

#: the checks, in the order they run (each a function below named check_<name>)
CHECKS = ("kernels_prepare", "nccl_self_batch", "backend_world1", "backend_two_ranks_one_gpu",
          "side_stream", "event_poll_latency", "graph_capture", "host_time_per_call")

DEFAULT_TIMEOUT = 45.0


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks_child(rank: int, port: int, timeout: float) -> dict:
    """One of two ranks on GPU 0: a ringcoll group, all_reduce of rank-valued CUDA tensors."""
    import datetime
    torch, device = _cuda()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    import ringcoll
    dist.init_process_group("ringcoll", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout))
    results = {}
    for algorithm in ("ring", "recursive_doubling"):
        t = torch.arange(1003, device=device, dtype=torch.float32) + rank
        ringcoll.all_reduce(t, algorithm=algorithm)
        torch.cuda.synchronize(device)
        expected = 2 * torch.arange(1003, device=device, dtype=torch.float32) + 1
        results[algorithm] = bool(torch.equal(t, expected))
    t = torch.full((4099,), float(rank + 1), device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize(device)
    results["dist.all_reduce"] = bool(torch.equal(t, torch.full_like(t, 3.0)))
    dist.destroy_process_group()
    return results


#: how NCCL words its refusal of two ranks on one device (NCCL_DEBUG=WARN prints it)
_REFUSAL = ("duplicate gpu", "both on cuda device", "same cuda device")


def check_backend_two_ranks_one_gpu(timeout: float = DEFAULT_TIMEOUT) -> dict:
    _cuda()
    port, limit = _free_port(), max(5.0, timeout - 5)
    env = {**os.environ, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "tools.gpu_runtime", "_two_ranks_child",
                               str(rank), str(port), str(limit / 2)], cwd=REPO, env=env,
                              stdout=out, stderr=err, text=True)
             for rank, (out, err) in enumerate(files)]
    deadline, timed_out = time.monotonic() + limit, False
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            timed_out = True
            proc.kill()
    outputs = []
    for proc, (out, err) in zip(procs, files):
        code = proc.wait()
        out.seek(0)
        err.seek(0)
        outputs.append((code, out.read(), err.read()))
    text = "\n".join(out + err for _, out, err in outputs)
    refusal = next((line.strip() for line in text.splitlines()
                    if any(marker in line.lower() for marker in _REFUSAL)), None)
    if refusal is not None:
        return _result("skip", f"NCCL refuses two ranks on one GPU: {refusal[:500]}")
    if timed_out:
        return _result("fail", f"two ranks on one GPU did not finish in {limit:.0f} s: "
                               f"{text[-1500:]}")
    if all(code == 0 for code, _, _ in outputs):
        results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]
        if all(all(r.values()) for r in results):
            return _result("pass", "NCCL accepted two ranks on one GPU; all_reduce exact on both",
                           results=results)
        return _result("fail", f"wrong results: {results}", results=results)
    return _result("fail", f"exit codes {[c for c, _, _ in outputs]}: {text[-2000:]}")


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


_CLEAR = ("captur", "graph")


def check_graph_capture() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    t = torch.full((4096,), 3.0, device=device)
    dist.all_reduce(t, op=_premul(dist, 2.0))       # warm-up outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    try:
        with torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(t, op=_premul(dist, 2.0))
    except Exception as exc:  # noqa: BLE001 - a refusal is an acceptable outcome if it is clear
        message = f"{type(exc).__name__}: {exc}"
        torch.cuda.synchronize(device)
        if any(word in message.lower() for word in _CLEAR):
            return _result("pass", f"refused clearly: {message[:500]}", captured=False)
        return _result("fail", f"refused without naming capture: {message[:1000]}", captured=False)
    t.fill_(5.0)
    graph.replay()
    torch.cuda.synchronize(device)
    if torch.equal(t, torch.full_like(t, 10.0)):
        return _result("pass", "captured; a replay scaled the tensor as the call does", captured=True)
    return _result("fail", f"captured, but a replay gave {t[0].item()} instead of 10.0",
                   captured=True)


def check_host_time_per_call() -> dict:
    torch, device = _cuda()
    dist = _ringcoll_world1()
    t = torch.ones(1 << 24, device=device)
    dist.all_reduce(t)                               # warm-up: plans, kernels, executor
    torch.cuda.synchronize(device)
    calibrate_start, calibrate_end = torch.cuda.Event(True), torch.cuda.Event(True)
    cycles = 20_000_000
    calibrate_start.record()
    torch.cuda._sleep(cycles)
    calibrate_end.record()
    torch.cuda.synchronize(device)
    per_cycle_ms = calibrate_start.elapsed_time(calibrate_end) / cycles
    cycles = int(50 / per_cycle_ms)                  # ~50 ms of queued GPU work
    host, gpu = [], []
    for _ in range(5):
        torch.cuda.synchronize(device)
        torch.cuda._sleep(cycles)
        begin, end = torch.cuda.Event(True), torch.cuda.Event(True)
        begin.record()
        start = time.perf_counter()
        dist.all_reduce(t, op=_premul(dist, 1.0))    # synchronous (async_op=False)
        host.append(time.perf_counter() - start)
        end.record()
        torch.cuda.synchronize(device)
        gpu.append(begin.elapsed_time(end) / 1e3)
    queued = cycles * per_cycle_ms / 1e3
    details = {"host_ms_median": round(statistics.median(host) * 1e3, 3),
               "queued_gpu_ms": round(queued * 1e3, 1),
               "call_gpu_ms_median": round(statistics.median(gpu) * 1e3, 3)}
    ratio = statistics.median(host) / queued
    if ratio < 0.2:
        return _result("pass", f"a synchronous call returned in {details['host_ms_median']} ms "
                               f"behind {details['queued_gpu_ms']} ms of queued GPU work: "
                               f"enqueue-only", **details)
    return _result("fail", f"a synchronous call took {details['host_ms_median']} ms of host time "
                           f"behind {details['queued_gpu_ms']} ms of queued GPU work: it waits for "
                           f"the GPU instead of enqueueing", **details)


# ---- running them ----

def run_one(name: str, timeout: float) -> dict:
    """``name`` in a subprocess of its own, within ``timeout`` seconds."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "tools.gpu_runtime", name,
                               "--timeout", str(timeout)], cwd=REPO, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-1500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return _result("fail", f"timed out after {timeout:.0f} s (a hang?) {tail}".strip(),
                       seconds=round(time.monotonic() - start, 1))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return _result("fail", f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}",
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
    if name == "_two_ranks_child":
        print(json.dumps(two_ranks_child(int(argv[1]), int(argv[2]), float(argv[3]))),
              flush=True)
        return 0
    if name not in CHECKS:
        raise SystemExit(f"unknown check {name!r}; the checks are {', '.join(CHECKS)}")
    timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else DEFAULT_TIMEOUT
    fn = globals()[f"check_{name}"]
    try:
        result = fn(timeout) if name == "backend_two_ranks_one_gpu" else fn()
    except Exception as exc:  # noqa: BLE001 - recorded as the check's failure
        result = _result("fail", f"{type(exc).__name__}: {exc}"[:2000],
                         traceback=traceback.format_exc()[-4000:])
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    sys.exit(_main(sys.argv[1:]))
