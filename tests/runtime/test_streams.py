"""The stream-ordered path (issue #26) proven on the CPU, through the stream emulator.

``RINGCOLL_TRANSPORT=streamed`` runs CPU tensors through exactly the executor code that CUDA
tensors on NCCL take (ringcoll.runtime.transport.stream_ordered.StreamTransport), with
ringcoll.runtime.stream_runtime.EmulatedRuntime in place of CUDA: every stream is a FIFO thread, the NCCL
batches move bytes over a private gloo group, and the host never waits. Before this path
existed a CUDA call on NCCL polled every step from the host (``poll`` with sleeps up to 1 ms),
ran a backend call on the worker thread's default stream of device 0 with no event tying it to
the caller's stream, and a synchronous call returned only once its data had arrived: every
test here fails on that code (most simply because none of it was there).

- the whole registry (every collective x algorithm, one size per algorithm among 0, 1, below
  and above the world, not divisible; sub-groups; async) against the built-ins at 3 and 4 ranks,
  with a count of the host's waits inside ringcoll's calls: zero;
- a synchronous call returns while the caller's stream is held by a gate (its data has not
  arrived), and completes once the gate opens;
- a producer on the caller's stream is read by the call, a consumer after ``wait()`` reads its
  result; the backend (``dist.all_reduce`` on a ringcoll group) likewise;
- a stalled peer: every surviving rank's watchdog fails the call within the timeout, the user's
  group stays usable, ringcoll's stays failed;
- check mode on the stream path; graph capture refused with a clear error.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.runtime import stream_runtime
from ringcoll.runtime.watchdog import Watchdog
from ringcoll.api.common import group_executor

CPU = torch.device("cpu")


def data(numel: int, rank: int, dtype=torch.int64) -> torch.Tensor:
    """Exact integer data, never zero, distinct per rank."""
    return (torch.arange(numel, dtype=torch.int64) % 97 + 1 + 100 * rank).to(dtype)


def sync() -> None:
    """Block the host until the calling thread's emulated stream has run everything enqueued
    on it (what reading a CUDA tensor on the host does)."""
    runtime = stream_runtime.emulated()
    runtime.synchronize(runtime.record(runtime.current(CPU)))


class device_memory:
    """The emulator's CPU tensors standing for device memory while active (the host reads them
    only after a synchronisation, as CUDA tensors): what the tests of CUDA's semantics need.
    Outside it they are CPU memory, read at once (RINGCOLL_TRANSPORT=streamed for a user)."""

    def __enter__(self):
        self.saved = stream_runtime.emulated().device_memory
        stream_runtime.emulated().device_memory = True

    def __exit__(self, *exc):
        stream_runtime.emulated().device_memory = self.saved


def on_stream(stream, fn) -> None:
    """``fn`` run on ``stream`` as device work (a kernel's): a launch runs its Python on the
    host at once, as CUDA's, so a test's stand-in for a slow kernel is device work itself."""
    stream_runtime.emulated().launch(stream, lambda: stream_runtime.device_work(fn))


def on_device_memory(fn):
    """``fn`` run with :class:`device_memory` active (a rank function of a CUDA-semantics test)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with device_memory():
            return fn(*args, **kwargs)
    return run


class HostWaits:
    """Counts the host's waits inside ringcoll calls only (the test's own syncs excluded)."""

    def __init__(self):
        self.count, self.where = 0, []

    def __call__(self, what, fn, *args, **kwargs):
        before = stream_runtime.StreamRuntime.host_waits
        result = fn(*args, **kwargs)
        taken = stream_runtime.StreamRuntime.host_waits - before
        if taken:
            self.count += taken
            self.where.append(what)
        return result


def catalogue(as_device: bool = True):
    """Every collective x algorithm, one size per algorithm (rotating through 0, 1, world - 1,
    world + 1 and 1001), on the whole group and on a sub-group of world - 1 ranks, some calls
    async; int64 exact data against the built-in on the same group. ``as_device``: the tensors
    stand for device memory (:class:`device_memory`); else they are CPU memory, which every
    call must have written when it returns (synchronous) or ``wait()`` returns."""
    if as_device:
        with device_memory():
            return _catalogue(True)
    return _catalogue(False)


def _catalogue(as_device: bool):
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong, waits, compared = [], HostWaits(), []
    sizes = (0, 1, world - 1, world + 1, 1001)
    sub_ranks = list(range(1, world))
    sub = dist.new_group(sub_ranks)
    groups = [(None, rank, world, list(range(world))), (sub, rank - 1, world - 1, sub_ranks)]
    # the node-aware algorithms' placement exchange is a host wait by contract (the host reads it),
    # once per group: done before counting
    for group, _, _, members in groups:
        if rank in members:
            ringcoll.all_reduce(data(4, rank), group=group, algorithm="hierarchical")
    sync()

    def check(what, got, want):
        if not torch.equal(got, want):
            wrong.append(what)

    algorithms = ringcoll.algorithms()
    counter = 0
    for group, _me, size, members in groups:
        if rank not in members:
            continue
        pending = []                            # async calls: (work, check) checked after wait

        def call(what, fn, *args, **kwargs):
            nonlocal counter
            counter += 1
            if counter % 3 == 0:                # every third call async, waited for later
                pending.append(waits(what, fn, *args, async_op=True, group=group, **kwargs))
            else:
                waits(what, fn, *args, group=group, **kwargs)

        checks = []
        for i, alg in enumerate(algorithms["all_reduce"]):
            n = sizes[i % len(sizes)]
            x, y = data(n, rank), data(n, rank)
            call(f"all_reduce/{alg} {n}", ringcoll.all_reduce, x, algorithm=alg)
            dist.all_reduce(y, group=group)
            checks.append((f"all_reduce/{alg} {n}", x, y))
        for i, alg in enumerate(algorithms["broadcast"]):
            n, root = sizes[i % len(sizes)], members[i % size]
            x, y = data(n, rank), data(n, rank)
            call(f"broadcast/{alg} {n}", ringcoll.broadcast, x, src=root, algorithm=alg)
            dist.broadcast(y, src=root, group=group)
            checks.append((f"broadcast/{alg} {n}", x, y))
        for i, alg in enumerate(algorithms["reduce"]):
            n, root = sizes[(i + 1) % len(sizes)], members[(i + 1) % size]
            x, y = data(n, rank), data(n, rank)
            call(f"reduce/{alg} {n}", ringcoll.reduce, x, dst=root, algorithm=alg)
            dist.reduce(y, dst=root, group=group)
            if rank == root:
                checks.append((f"reduce/{alg} {n}", x, y))
        for i, alg in enumerate(algorithms["all_gather"]):
            n = sizes[(i + 2) % len(sizes)]
            outs = [torch.zeros(n, dtype=torch.int64) for _ in range(size)]
            want = [torch.zeros(n, dtype=torch.int64) for _ in range(size)]
            call(f"all_gather/{alg} {n}", ringcoll.all_gather, outs, data(n, rank), algorithm=alg)
            dist.all_gather(want, data(n, rank), group=group)
            checks.append((f"all_gather/{alg} {n}", outs, want))
        for i, alg in enumerate(algorithms["reduce_scatter"]):
            n = sizes[(i + 3) % len(sizes)]
            inputs = [data(n, rank * world + j) for j in range(size)]
            out, want = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
            call(f"reduce_scatter/{alg} {n}", ringcoll.reduce_scatter, out, inputs, algorithm=alg)
            dist.reduce_scatter(want, [t.clone() for t in inputs], group=group)
            checks.append((f"reduce_scatter/{alg} {n}", out, want))
        for i, alg in enumerate(algorithms["gather"]):
            n, root = sizes[(i + 4) % len(sizes)], members[i % size]
            outs = [torch.zeros(n, dtype=torch.int64) for _ in range(size)] if rank == root else None
            want = [torch.zeros(n, dtype=torch.int64) for _ in range(size)] if rank == root else None
            call(f"gather/{alg} {n}", ringcoll.gather, data(n, rank), outs, dst=root, algorithm=alg)
            dist.gather(data(n, rank), want, dst=root, group=group)
            if rank == root:
                checks.append((f"gather/{alg} {n}", outs, want))
        for i, alg in enumerate(algorithms["scatter"]):
            n, root = sizes[i % len(sizes)], members[(i + 1) % size]
            inputs = [data(n, 10 + j) for j in range(size)] if rank == root else None
            out, want = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
            call(f"scatter/{alg} {n}", ringcoll.scatter, out, inputs, src=root, algorithm=alg)
            dist.scatter(want, inputs, src=root, group=group)
            checks.append((f"scatter/{alg} {n}", out, want))
        for i, alg in enumerate(algorithms["all_to_all"]):
            n = sizes[(i + 1) % len(sizes)]
            inp = data(n * size, rank)
            out, want = torch.zeros(n * size, dtype=torch.int64), torch.zeros(n * size, dtype=torch.int64)
            call(f"all_to_all_single/{alg} {n}", ringcoll.all_to_all_single, out, inp, algorithm=alg)
            dist.all_to_all_single(want, inp, group=group)
            checks.append((f"all_to_all_single/{alg} {n}", out, want))
        for alg in algorithms["barrier"]:
            before = stream_runtime.StreamRuntime.host_waits
            ringcoll.barrier(group=group, algorithm=alg)        # blocks the host, by contract
            if stream_runtime.StreamRuntime.host_waits == before:
                wrong.append(f"barrier/{alg} did not wait for its peers")
        x = data(world + 1, rank, torch.int16)                  # a dtype NCCL lacks: moved as bytes
        call("all_reduce int16", ringcoll.all_reduce, x, algorithm="ring")
        checks.append(("all_reduce int16", x, sum(data(world + 1, r) for r in members).to(torch.int16)))
        for work in pending:
            work.wait()
        if as_device:
            sync()                              # CPU memory: no sync, read at once
        for what, got, want in checks:
            if isinstance(got, list):
                got, want = torch.cat(got), torch.cat(want)
            check(what, got, want)
            compared.append(what)
    transport = group_executor(None).transport(CPU)
    return (type(transport).__name__, type(transport.runtime).__name__, wrong, waits.count, waits.where,
            len(compared))


@pytest.fixture(scope="module", params=[3, 4])
def streamed(request):
    with ringcoll.launch(request.param, threads=1, timeout=120,
                         env={"RINGCOLL_TRANSPORT": "streamed", "RINGCOLL_TIMEOUT": "60"}) as cluster:
        yield cluster


def test_every_collective_and_algorithm_on_emulated_streams_with_no_host_wait(streamed):
    """The catalogue through the stream-ordered executor path; zero host waits per call. Old
    code: no stream path (CUDA steps were polled by the host, every one)."""
    algorithms = ringcoll.algorithms()
    every = sum(len(algorithms[c]) for c in ("all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                             "scatter", "all_to_all")) + 1      # checked on every rank
    for rank, (transport, runtime, wrong, waits, where, compared) in enumerate(streamed.run(catalogue)):
        assert (transport, runtime) == ("StreamTransport", "EmulatedRuntime")
        assert compared >= every * (1 if rank == 0 else 2), (rank, compared, every)   # rank 0: no sub-group
        assert wrong == [], f"rank {rank}: {wrong}"
        assert waits == 0, f"rank {rank}: the host waited in {where}"


def test_every_collective_and_algorithm_on_cpu_memory_returns_its_result(streamed):
    """Issue #40 finding 4: ``RINGCOLL_TRANSPORT=streamed`` on CPU tensors, read at once as a
    user does (no stream synchronisation): every synchronous call returns with its result
    written, every async call's ``wait()`` with it. Old code: results read before they arrived."""
    for rank, (transport, runtime, wrong, _waits, _where, compared) in enumerate(streamed.run(catalogue, False)):
        assert (transport, runtime) == ("StreamTransport", "EmulatedRuntime")
        assert compared > 0 and wrong == [], f"rank {rank}: {wrong}"


@on_device_memory
def gated():
    """A synchronous call while the caller's stream is held: it must return (enqueued) with the
    data not yet there, then complete once the gate opens."""
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = stream_runtime.emulated()
    x = data(1001, rank)
    ringcoll.all_reduce(x.clone())                       # the group's set-up, outside the gate
    sync()
    gate = threading.Event()
    on_stream(runtime.current(CPU), lambda: gate.wait(30))
    start = time.monotonic()
    before = stream_runtime.StreamRuntime.host_waits
    ringcoll.all_reduce(x, algorithm="ring")
    returned = time.monotonic() - start
    untouched = torch.equal(x, data(1001, rank))
    waits = stream_runtime.StreamRuntime.host_waits - before
    gate.set()
    sync()
    return returned, untouched, waits, torch.equal(x, sum(data(1001, r) for r in range(world)))


def test_a_synchronous_call_returns_before_its_data_arrived(streamed):
    """NCCL's contract: a synchronous call returns once enqueued. Old code: the call returned
    only after the host had waited for every step's data."""
    for returned, untouched, waits, right in streamed.run(gated):
        assert returned < 5 and untouched and waits == 0 and right


def read_at_once():
    """Every entry point on CPU tensors read at once, as a user reads them, with the last rank
    late (its data arrives after the others' calls were enqueued): synchronous drop-in, async
    drop-in + ``wait()``, ``dist.all_reduce`` on a "ringcoll" group, sync and async."""
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.new_group(list(range(world)), backend="ringcoll")
    warm = data(4, rank)
    ringcoll.all_reduce(warm)                            # set-ups outside the measured calls
    dist.all_reduce(warm, group=backend)
    want = sum(data(1001, r) for r in range(world))
    out = {}
    for name, reduce in (("sync drop-in", lambda x: ringcoll.all_reduce(x, algorithm="ring")),
                         ("async drop-in + wait", lambda x: ringcoll.all_reduce(x, algorithm="ring",
                                                                                async_op=True).wait()),
                         ("dist.all_reduce", lambda x: dist.all_reduce(x, group=backend)),
                         ("dist async + wait", lambda x: dist.all_reduce(x, group=backend, async_op=True).wait())):
        x = data(1001, rank)
        if rank == world - 1:
            time.sleep(0.3)
        reduce(x)
        wrong = (x != want).nonzero()
        out[name] = "right" if not len(wrong) else \
            f"element {wrong[0].item()}: got {x[wrong[0]].item()}, want {want[wrong[0]].item()}"
    return out


def test_cpu_tensors_on_the_streamed_transport_hold_their_result_on_return(streamed):
    """Issue #40 finding 4: on CPU tensors there is no stream the caller's reads are ordered on,
    so a synchronous call and ``wait()`` return with the result written (the host waits). Old
    code: every rank but the late one read its own input back."""
    for rank, out in enumerate(streamed.run(read_at_once)):
        assert set(out.values()) == {"right"}, f"rank {rank}: {out}"


@on_device_memory
def scratch_on_ringcoll_stream():
    """Every scratch or staging buffer the stream path allocates for a call, on which stream it
    was allocated: ringcoll's stream of the group (which alone uses it), never the caller's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = stream_runtime.emulated()
    seen = []
    original = type(runtime).allocating

    def recording(self, stream):
        seen.append(stream)
        return original(self, stream)

    type(runtime).allocating = recording
    try:
        side = runtime.new_stream(CPU)                   # the caller works on a side stream
        with runtime.use(side):
            x = data(1 << 17, rank)                      # larger than earlier calls: fresh scratch
            ringcoll.all_reduce(x, algorithm="ring")
            outputs = [torch.zeros(1 << 15, dtype=torch.int64) for _ in range(world)]
            ringcoll.all_gather(outputs, data(1 << 15, rank), algorithm="ring")
            runtime.synchronize(runtime.record(side))
    finally:
        type(runtime).allocating = original
    stream = group_executor(None).transport(CPU).stream
    right = torch.equal(x, sum(data(1 << 17, r) for r in range(world)))
    return len(seen), all(s is stream for s in seen), any(s is side for s in seen), right


def test_scratch_buffers_are_allocated_on_ringcoll_s_stream(streamed):
    """Item 7 of issue #26: scratch and staging buffers belong to ringcoll's stream (allocated
    under it, used only by it, in its order), so a caller's side stream can never reuse their
    memory while a call is in flight. Old code: the worker thread allocated them on the default
    stream, unordered with the caller's."""
    for count, on_ringcoll, on_side, right in streamed.run(scratch_on_ringcoll_stream):
        assert count > 0 and on_ringcoll and not on_side and right


@on_device_memory
def ordered():
    """A producer on the caller's stream before an async call, a consumer after ``wait()``:
    the call reads what the producer wrote and the consumer reads the call's result, with the
    host never waiting; also through the ringcoll backend's ``dist.all_reduce``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = stream_runtime.emulated()
    want = sum(data(64, r) for r in range(world))
    out = {}
    backend = dist.new_group(list(range(world)), backend="ringcoll")
    for name, reduce in (("drop-in", lambda x: ringcoll.all_reduce(x, async_op=True)),
                         ("backend", lambda x: dist.all_reduce(x, group=backend, async_op=True))):
        warm = torch.ones(4, dtype=torch.int64)
        reduce(warm).wait()                              # set-up outside the measured call
        sync()
        x, seen = torch.zeros(64, dtype=torch.int64), torch.zeros(64, dtype=torch.int64)
        side = runtime.new_stream(CPU)                   # the caller works on a side stream
        with runtime.use(side):
            on_stream(side, lambda: (time.sleep(0.3), x.copy_(data(64, rank))))        # producer
            before = stream_runtime.StreamRuntime.host_waits
            work = reduce(x)
            start = time.monotonic()
            work.wait()
            waited = time.monotonic() - start
            on_stream(side, lambda: seen.copy_(x))                                      # consumer
            waits = stream_runtime.StreamRuntime.host_waits - before
            runtime.synchronize(runtime.record(side))
        out[name] = (type(work).__name__, waited < 0.25, waits, torch.equal(seen, want))
    return out


def test_the_callers_stream_orders_the_call_and_the_call_orders_it(streamed):
    """Item 2 of issue #26: a call waits on the caller's current stream, and ``wait()`` orders
    the waiting stream after the call, without blocking the host. Old code: the drop-in read its
    input on the host at once (before the producer), the backend ran on the worker thread's
    default stream with no event at all."""
    for out in streamed.run(ordered):
        assert out == {"drop-in": ("StreamWork", True, 0, True), "backend": ("StreamWork", True, 0, True)}, out


def stalled():
    """The last rank stalls in a call on a fresh group: every other rank's watchdog fails it
    within the timeout; the user's group stays usable, ringcoll's stays failed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    others = dist.new_group(list(range(world - 1)))       # the survivors
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(1.0)
    out = {}
    try:
        x = torch.ones(100, dtype=torch.int64)
        ringcoll.all_reduce(x, group=group)
        sync()
        if rank == world - 1:
            time.sleep(3.0)
        else:
            start = time.monotonic()
            work = ringcoll.all_reduce(x, group=group, algorithm="ring", async_op=True)
            # another group goes on meanwhile: no worker thread serialises the groups
            z = torch.full((5,), rank + 1, dtype=torch.int64)
            ringcoll.all_reduce(z, group=others)
            sync()
            out["others"] = (time.monotonic() - start < 0.9, z.tolist())
            while not work.is_completed() and time.monotonic() - start < 10:
                time.sleep(0.01)
            try:
                work.wait()
                out["wait"] = "returned"
            except ringcoll.PeerError as error:
                out["wait"] = ("PeerError", time.monotonic() - start, str(error), error.step)
            try:
                ringcoll.all_reduce(x, group=group)
                out["next"] = "returned"
            except ringcoll.GroupFailedError as error:
                out["next"] = str(error)
            # the abort fails the transfers the emulated stream was blocked in: it drains
            transport = group_executor(group).transport(CPU)
            drained = transport.runtime.record(transport.stream)
            while not drained.query() and time.monotonic() - start < 8:
                time.sleep(0.01)
            out["drained"] = drained.query()
    finally:
        ringcoll.set_timeout(previous)
    y = torch.ones(3)
    dist.all_reduce(y, group=group)                      # the user's group, after ringcoll's abort
    out["user"] = y.tolist()
    return out


def test_a_stalled_peer_fails_every_survivor_within_the_timeout(streamed):
    """Items 4 and 6 of issue #26: one watchdog thread, not per-step host polls, fails the call
    within ringcoll's timeout on every surviving rank, naming the call and the step; only
    ringcoll's private communicator is aborted; a call on another group completes meanwhile.
    Old code: the batched transport aborted the user's own NCCL group, and the async call held
    the one worker thread, so the other group's call waited behind it."""
    results = streamed.run(stalled)
    world = len(results)
    for out in results[:-1]:
        outcome, waited, message, step = out["wait"]
        assert outcome == "PeerError" and 0.9 <= waited < 3.0, out
        assert "all_reduce/ring" in message and "call #" in message and f"/{2 * (world - 1)}" in message, message
        assert step is not None
        assert "call #" in out["next"] and "all_reduce" in out["next"]
        assert out["others"] == (True, [world * (world - 1) // 2] * 5), out
        assert out["drained"], out
    for out in results:
        assert out["user"] == [float(world)] * 3


def checked():
    """Check mode on the stream path: a mismatch raises the same MismatchError on every rank;
    agreeing calls pass."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    executor = group_executor(group)
    executor.check = True
    x = data(10, rank)
    ringcoll.all_reduce(x, group=group)
    sync()
    ok = torch.equal(x, sum(data(10, r) for r in range(world)))
    try:
        if rank == 0:
            ringcoll.broadcast(x, src=0, group=group)
        else:
            ringcoll.all_reduce(x, group=group)
        return ok, "no error"
    except ringcoll.MismatchError as error:
        return ok, str(error)


def test_check_mode_runs_on_the_stream_path(streamed):
    """Item 3 of issue #26: check mode's fingerprint table travels on the call's device and
    transport (old code: a CPU tensor, which an NCCL-only group cannot send)."""
    for ok, message in streamed.run(checked):
        assert ok and "collective: 'broadcast' on ranks [0] vs 'all_reduce'" in message, message


def test_graph_capture_is_refused_with_a_clear_error(monkeypatch):
    """Item 7: a collective called while the current stream captures a CUDA graph raises a
    CaptureError naming why and what to do, before any transfer (old code: no check; NCCL's
    capture failed somewhere inside the schedule)."""
    from ringcoll.runtime import work as work_module
    from ringcoll.runtime.transport.stream_ordered import CaptureError

    runtime = stream_runtime.emulated()
    monkeypatch.setattr(runtime, "capture", True)
    ran = []
    with pytest.raises(CaptureError, match="capturing a graph.*outside the captured region"):
        work_module.submit_stream(lambda caller: ran.append(caller), False, [], runtime, CPU, "all_reduce/ring")
    assert ran == []


# -- the private communicator, in process (a fake ProcessGroupNCCL: this build has none) ----------
class FakeProcessGroupNccl:
    """``dist.ProcessGroupNCCL(store, rank, size, options)`` as ringcoll builds its private one:
    records its prefix, timeout and the environment its constructor read; a raw Backend's
    coalescing (no device) and abort."""

    made: list = []

    class Options:
        def __init__(self):
            self._timeout = None

    def __init__(self, store, rank, size, options):
        import os
        self.store, self.rank, self.size, self.timeout = store, rank, size, options._timeout
        self.env = {name: os.environ.get(name) for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                            "TORCH_NCCL_BLOCKING_WAIT",
                                                            "TORCH_NCCL_ENABLE_MONITORING",
                                                            "TORCH_NCCL_DUMP_ON_TIMEOUT",
                                                            "TORCH_NCCL_DESYNC_DEBUG")}
        self.aborted = False
        FakeProcessGroupNccl.made.append(self)

    def eager_connect_single_device(self, device):
        pass

    def abort(self):
        self.aborted = True

    def shutdown(self):
        self.closed = True


class UserNccl(FakeProcessGroupNccl):
    def __init__(self):
        self.aborted = False


@pytest.fixture
def fake_nccl(monkeypatch):
    FakeProcessGroupNccl.made = []
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeProcessGroupNccl, raising=False)
    monkeypatch.setattr(stream_runtime, "cuda", stream_runtime.emulated)        # no CUDA streams in this build
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.delenv("RINGCOLL_TRANSPORT", raising=False)
    return FakeProcessGroupNccl.made


def test_cuda_calls_on_a_users_nccl_group_run_on_a_private_communicator(fake_nccl, monkeypatch):
    """Items 5 and 6 of issue #26: ringcoll's CUDA transport on a user's NCCL group talks over
    an NCCL group of its own (nothing else can be matched with its messages), built with a
    timeout beyond ringcoll's deadline and without NCCL's process teardown; a timeout aborts
    only it. The kernels' probe runs then, on the group's device. Old code: the user's group
    itself, aborted on ringcoll's timeout; the probe inside the first collective, on GPU 0."""
    from ringcoll.runtime.executor import P2PExecutor
    from ringcoll.runtime.failures import PeerError
    from ringcoll.runtime.transport.stream_ordered import StreamTransport, private_timeout

    from ringcoll import kernels

    probed = []
    monkeypatch.setattr(kernels, "backend_for", lambda device, backend=None: probed.append(device))
    ringcoll.set_timeout(7.0)
    try:
        user = UserNccl()
        executor = P2PExecutor(user, rank=0, world=2, backend="nccl", store=dist.HashStore())
        transport = executor.transport(torch.device("cuda", 0))
    finally:
        ringcoll.set_timeout(None)
    assert isinstance(transport, StreamTransport)
    assert probed == [torch.device("cuda", 0)]      # item 7: the kernel probe, at the transport's making
    assert fake_nccl and transport.comm.pg is fake_nccl[0] and transport.comm.pg is not user
    private = fake_nccl[0]
    assert private.timeout.total_seconds() == private_timeout(7.0) > 7.0
    # #37: nor does its heartbeat monitor dump through the global store and end the process
    assert private.env == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "0",
                           "TORCH_NCCL_ENABLE_MONITORING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                           "TORCH_NCCL_DESYNC_DEBUG": "0"}
    import os
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"          # restored for the user's
    executor._failed(PeerError("timed out", rank=0, peer=1, step=0), [])
    transport._aborting.join(5)                  # the abort runs on a thread of its own
    assert private.aborted and not user.aborted


def test_the_backends_collectives_and_user_p2p_use_different_nccl_groups(fake_nccl, monkeypatch):
    """Item 5: on a "ringcoll" group, user send/recv go to the inner NCCL group and ringcoll's
    collectives to a private one, which the group's shutdown closes too. Old code: both on the
    inner group, matched by order."""
    from ringcoll.backend import ProcessGroupRingcoll
    from datetime import timedelta

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    group = ProcessGroupRingcoll(dist.HashStore(), 0, 1, timedelta(seconds=30))
    try:
        executor = group.executor(torch.device("cuda", 0))
        collectives = executor.transport(torch.device("cuda", 0)).comm.pg
        assert group._nccl in fake_nccl and collectives in fake_nccl and collectives is not group._nccl
    finally:
        group.shutdown()
    assert getattr(collectives, "closed", False) and getattr(group._nccl, "closed", False)   # both shut down


def ddp_with_the_hook():
    """DDP with ringcoll's comm hook on the stream path: the hook's future (the Work's) carries
    the reduced bucket back to DDP's reducer; gradients equal the built-in's."""
    rank, _world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    grads = []
    for hooked in (False, True):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3))
        if hooked:
            model.register_comm_hook(None, ringcoll.ddp_comm_hook("ring"))
        inputs = torch.arange(24, dtype=torch.float32).view(4, 6) / 8 + rank
        model(inputs).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return all(torch.allclose(a, b) for a, b in zip(*grads))


def test_ddp_comm_hook_on_the_stream_path(streamed):
    """Item 7: the hook's future comes from the stream path's Work (CUDA: stream-aware)."""
    assert all(streamed.run(ddp_with_the_hook))


# -- the CUDA runtime's calls, on fakes of torch.cuda checked against the real signatures ----------
class _FakeCuda:
    """torch.cuda's streams, events and contexts as CudaRuntime uses them, recording what it did;
    the fakes' methods take what the real ones take (test_the_cuda_fakes_take_the_real_signatures)."""

    def __init__(self):
        self.log, self.local = [], threading.local()

    def current(self):
        return getattr(self.local, "stream", "default")


def _cuda_fakes(monkeypatch):

    cuda = _FakeCuda()

    class Stream:
        def __new__(cls, device=None, priority=0, **kwargs):
            stream = object.__new__(cls)
            stream.device = device
            return stream

        def wait_event(self, event):
            cuda.log.append(("wait_event", self, event))

    class Event:
        def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
            return object.__new__(cls)

        def record(self, stream=None):
            cuda.log.append(("record", self, stream))

        def query(self):
            return True

        def synchronize(self):
            cuda.log.append(("synchronize", self))

    class Future(torch.futures.Future):
        __class_getitem__ = classmethod(lambda cls, item: cls)     # Future[Tensor], as the real

        def __init__(self, *, devices=None):
            super().__init__()
            for device in devices or []:            # torch's: devices with an index (CUDA here)
                if torch.device(device).type != "cuda" or torch.device(device).index is None:
                    raise ValueError(f"Expected devices to have indices, got {device}")
            self.devices = devices

        def set_result(self, result):
            cuda.log.append(("set_result", self.devices, cuda.current()))
            super().set_result(result)

    @contextlib.contextmanager
    def stream_context(stream):
        saved, cuda.local.stream = cuda.current(), stream
        try:
            yield
        finally:
            cuda.local.stream = saved

    class ExternalStream(Stream):
        def __new__(cls, stream_ptr, device=None, **kwargs):
            stream = object.__new__(cls)
            stream.device, stream.cuda_stream = device, stream_ptr
            return stream

    def create_stream(pointer, flags, priority):   # cudaStreamCreateWithPriority(cudaStream_t*, unsigned, int)
        cuda.created.append((flags, priority, cuda.device))
        pointer._obj.value = 0x1000 + len(cuda.created)
        return 0

    @contextlib.contextmanager
    def device(index):
        saved, cuda.device = cuda.device, index
        try:
            yield
        finally:
            cuda.device = saved

    cuda.created, cuda.device, cuda.looked_up = [], None, []
    monkeypatch.setattr(stream_runtime, "_cudart_function",
                        lambda name, argtypes=(): cuda.looked_up.append((name, argtypes)) or create_stream)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "ExternalStream", ExternalStream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", stream_context)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current())
    monkeypatch.setattr(torch.futures, "Future", Future)
    cuda.Stream, cuda.ExternalStream, cuda.Event, cuda.Future = Stream, ExternalStream, Event, Future
    return cuda


def test_the_cuda_fakes_take_the_real_signatures(monkeypatch):
    import inspect

    real = {"Stream.wait_event": torch.cuda.Stream.wait_event, "Event.record": torch.cuda.Event.record,
            "Event.__new__": torch.cuda.Event.__new__, "Stream.__new__": torch.cuda.Stream.__new__,
            "Future.__init__": torch.futures.Future.__init__,
            "ExternalStream.__new__": torch.cuda.ExternalStream.__new__}
    cuda = _cuda_fakes(monkeypatch)
    fake = {"Stream.wait_event": cuda.Stream.wait_event, "Event.record": cuda.Event.record,
            "Event.__new__": cuda.Event.__new__, "Stream.__new__": cuda.Stream.__new__,
            "Future.__init__": cuda.Future.__init__, "ExternalStream.__new__": cuda.ExternalStream.__new__}
    for name, function in real.items():
        assert list(inspect.signature(fake[name]).parameters) == list(inspect.signature(function).parameters), name
    with pytest.raises(ValueError, match="indices"):
        torch.futures.Future(devices=["cpu"])          # as the real one


def test_a_cuda_work_hands_out_a_stream_aware_future(monkeypatch):
    """Items 2 and 7: on CUDA a Work's future is ``Future(devices=[device])`` completed under
    ringcoll's stream (DDP's reducer and the comm hook then chain on the stream), and wait()
    orders the waiting stream after the call's end event without blocking the host. Old code:
    a CPU-only future completed on the host, and a backend call's Work had no event at all."""
    from ringcoll.runtime.stream_runtime import CudaRuntime
    from ringcoll.runtime.transport.stream_ordered import InFlight
    from ringcoll.runtime.work import StreamWork

    cuda = _cuda_fakes(monkeypatch)
    runtime = CudaRuntime()
    device = torch.device("cuda", 1)

    class Transport:
        stream = runtime.new_stream(device)

    call = InFlight("call #1 all_reduce/ring", 1.0, 2, Transport())
    call.done = runtime.record(Transport.stream)
    result = [torch.ones(3)]
    work = StreamWork(result, "all_reduce/ring", runtime, device)
    early = work.get_future()                 # taken while the call is still queued
    assert not early.done()
    work._enqueued(call)
    assert early.done()
    assert ("set_result", [device], Transport.stream) in cuda.log
    chained = work.get_future().then(lambda future: future.value()[0])
    assert torch.equal(chained.wait(), torch.ones(3))
    cuda.log.clear()
    side = cuda.local.stream = runtime.new_stream(device)          # the caller's side stream
    assert work.wait() is True
    assert cuda.log == [("wait_event", side, call.done)]             # no host wait


def test_ringcolls_cuda_streams_are_its_own_never_torchs_pool(monkeypatch):
    """#37 item 5: a transport's CUDA stream is created for ringcoll (cudaStreamCreateWithPriority
    of torch's CUDA runtime, non-blocking, priority 0, on the transport's device) and wrapped in
    ExternalStream; torch.cuda.Stream() (the pool of 32 per device that NCCL's internal streams
    and every other group's come from) is never asked. Two live transports never share one; a
    released stream is reused, never destroyed. Old code: torch.cuda.Stream(device), which can
    be another group's or NCCL's very stream."""
    import ctypes

    from ringcoll.runtime.stream_runtime import STREAM_NON_BLOCKING, CudaRuntime

    cuda = _cuda_fakes(monkeypatch)

    def pool(*args, **kwargs):
        raise AssertionError("torch.cuda.Stream(): a stream of torch's pool")

    monkeypatch.setattr(cuda.Stream, "__new__", pool)
    runtime, one, two = CudaRuntime(), torch.device("cuda", 1), torch.device("cuda", 2)
    first, second = runtime.new_stream(one), runtime.new_stream(one)
    assert cuda.looked_up[0] == ("cudaStreamCreateWithPriority",
                            (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int))
    assert isinstance(first, cuda.ExternalStream) and first.device == one
    assert (first.cuda_stream, second.cuda_stream) == (0x1001, 0x1002)
    assert cuda.created == [(STREAM_NON_BLOCKING, 0, one), (STREAM_NON_BLOCKING, 0, one)]
    runtime.release_stream(first)
    assert runtime.new_stream(two).cuda_stream == 0x1003          # another device: a new one
    assert runtime.new_stream(one) is first and len(cuda.created) == 3
    monkeypatch.setattr(stream_runtime, "_cudart_function", lambda name, argtypes=(): None)
    with pytest.raises(RuntimeError, match="no CUDA runtime library"):
        runtime.new_stream(one)


def test_a_transports_stream_outlives_its_calls_and_serves_one_transport_at_a_time():
    """#37 item 5: two live transports (two groups) have distinct streams; a transport shut down
    (aborted) while its call is still on its stream keeps the stream out of the pool until the
    call has settled, and only then may a new transport take it."""
    from ringcoll.runtime.transport.stream_ordered import StreamTransport

    runtime = stream_runtime.EmulatedRuntime()
    gated = GatedComm()
    a = StreamTransport(gated, runtime, CPU, WATCHDOG, private=False)
    b = StreamTransport(GatedComm(), runtime, CPU, WATCHDOG, private=False)
    assert a.stream is not b.stream
    call = _enqueue_one(a, timeout=30.0)
    a.shutdown("abort")
    c = StreamTransport(GatedComm(), runtime, CPU, WATCHDOG, private=False)
    assert c.stream not in (a.stream, b.stream)         # a's call still runs on a's stream
    gated.gate.set()
    assert _settled(call, 10.0) and call.failure is None
    d = StreamTransport(GatedComm(), runtime, CPU, WATCHDOG, private=False)
    assert d.stream is a.stream
    b.shutdown()                                        # no call: released at once
    c.shutdown()
    assert {StreamTransport(GatedComm(), runtime, CPU, WATCHDOG, private=False).stream
            for _ in range(2)} == {b.stream, c.stream}


def test_a_cuda_call_over_gloo_under_capture_is_refused_too(monkeypatch):
    """CUDA tensors over gloo (host staging, which capture forbids) are refused alike."""
    from ringcoll.runtime import work as work_module
    from ringcoll.runtime.stream_runtime import CudaRuntime
    from ringcoll.runtime.transport.stream_ordered import CaptureError

    monkeypatch.setattr(CudaRuntime, "capturing", lambda self, device: True)
    ran = []
    with pytest.raises(CaptureError, match="all_reduce/ring"):
        work_module.submit(lambda: ran.append(1), False, device=torch.device("cuda", 0), describe="all_reduce/ring")
    assert ran == []


# -- the transport and the watchdog in process, on a fake communicator ----------------------------

#: the in-process tests' watchdog (one thread, as the process's)
WATCHDOG = Watchdog(period=0.002)


class GatedComm:
    """A communicator whose batches complete when ``gate`` is set (or fail once aborted); NCCL's
    shape: ``start`` and ``join`` return at once, the wait is the stream's (device work)."""

    def __init__(self):
        self.gate, self.aborted, self.started = threading.Event(), False, []

    def connect(self, deadline):
        pass

    def start(self, ops):
        self.started.append(len(ops))
        return {"error": None}

    def join(self, work):
        def wait():
            while not self.gate.wait(0.01):
                if self.aborted:
                    work["error"] = RuntimeError("NCCL communicator was aborted")
                    return

        stream_runtime.device_work(wait)

    def failed(self, work):
        return work["error"]

    def abort(self):
        self.aborted = True


def _enqueue_one(transport, timeout=0.3, local=None, name="call #1 all_reduce/ring 4xint64"):
    from ringcoll.schedules.vocabulary import Buf, Recv, Send

    transport.open(name, timeout, 1)
    items = [Send(1, Buf("data", 0, 2)), Recv(1, Buf("data", 2, 4))]
    step = transport.post(list(zip(items, [torch.ones(2), torch.zeros(2)])), 0)
    step.index = 0
    transport.wait(step, 0)
    if local is not None:
        transport.local(local)
    return transport.close([])


def test_the_watchdog_fails_an_overdue_step_and_aborts_the_communicator():
    """A step whose batch does not complete within the timeout: the watchdog fails the call
    (naming the step's transfers) and aborts the communicator, which lets the stream go on; a
    call behind it on the stream fails with it; the host's wait ends with the error."""
    from ringcoll.runtime.transport.stream_ordered import StreamTransport
    from ringcoll.runtime.watchdog import Watchdog

    comm = GatedComm()
    transport = StreamTransport(comm, stream_runtime.emulated(), CPU, Watchdog(period=0.002))
    start = time.monotonic()
    first, second = _enqueue_one(transport), _enqueue_one(transport)
    with pytest.raises(Exception) as caught:
        first.host_wait()
    assert 0.25 <= time.monotonic() - start < 2.0
    transport._aborting.join(5)                  # the abort runs on a thread of its own
    assert comm.aborted and caught.value.timed_out and caught.value.step == 0 and len(caught.value.items) == 2
    assert second.failure is first.failure
    drained = transport.runtime.record(transport.stream)
    transport.runtime.synchronize(drained)


def test_a_local_operations_error_on_the_stream_is_the_calls():
    """A local operation's Python that raises raises at enqueue, on the caller's thread (as on
    a GPU, where only device work is deferred); one whose device work fails on the emulated
    stream fails the call (its Work raises), not only the stream's log."""
    from ringcoll.runtime.transport.stream_ordered import StreamTransport

    comm = GatedComm()
    comm.gate.set()
    transport = StreamTransport(comm, stream_runtime.emulated(), CPU, WATCHDOG)
    on_host = threading.current_thread().name
    seen = []
    with pytest.raises(ZeroDivisionError):
        _enqueue_one(transport, timeout=5, local=lambda: seen.append(threading.current_thread().name) or 1 // 0)
    assert seen == [on_host]
    transport.drop()
    small, large = torch.ones(2), torch.ones(3)
    call = _enqueue_one(transport, timeout=5, local=lambda: small.add_(large))   # fails when it runs
    with pytest.raises(Exception, match="size of tensor"):
        call.host_wait()
    ok = _enqueue_one(transport, timeout=5)
    ok.host_wait()
    assert ok.failure is None and comm.started == [2, 2, 2]


def test_the_private_communicators_set_up_has_a_deadline():
    """NCCL's eager set-up blocks until every rank joins: a rank that never comes is a
    TimeoutError at the deadline and the communicator is aborted (old code: the host blocked
    in ``eager_connect_single_device`` for as long as NCCL let it)."""
    from ringcoll.runtime.transport import NcclComm

    class Blocking(UserNccl):
        def eager_connect_single_device(self, device):
            time.sleep(30)

    group = Blocking()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="set-up"):
        NcclComm(group, torch.device("cuda", 0)).connect(time.monotonic() + 0.3)
    assert 0.25 <= time.monotonic() - start < 2 and group.aborted


# -- a watchdog that cannot die (issue #36 item 4) ------------------------------------------------
def _watched(runtime, comm=None, timeout=5.0, name="call #1 all_reduce/ring 4xint64", gate_open=True):
    """One call of one step on a transport of its own, its failure reported as the executor's
    (an error naming the call)."""
    from ringcoll.runtime.transport.stream_ordered import StreamTransport

    comm = comm or GatedComm()
    if gate_open:
        comm.gate.set()
    transport = StreamTransport(comm, runtime, CPU, WATCHDOG)
    call = _enqueue_one(transport, timeout=timeout, name=name)
    call.on_failure = lambda call, error: RuntimeError(f"ringcoll {call.name}: {error}")
    return transport, call


def _settled(call, within: float = 3.0) -> bool:
    return call._verdict.wait(within)


class RefusingQueries(stream_runtime.EmulatedRuntime):
    """Queries of the events in ``refused`` raise, as a sticky CUDA error would."""

    def __init__(self):
        super().__init__()
        self.refused = set()

    def query(self, event):
        if id(event) in self.refused:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().query(event)


def test_an_exception_reading_one_call_fails_that_call_and_the_watchdog_goes_on():
    """A failing event query fails that call's group with an error naming the call; the
    watchdog keeps serving the other calls, then and later. Old code: the exception killed the
    watchdog's thread for good (no later call ever completed)."""
    runtime = RefusingQueries()
    _, bad = _watched(runtime, name="call #7 all_reduce/ring 4xint64")
    runtime.refused.add(id(bad.steps[0].event))
    _, good = _watched(runtime)
    assert _settled(bad) and _settled(good)
    assert good.failure is None
    assert "call #7 all_reduce/ring" in str(bad.failure) and "illegal memory access" in str(bad.failure)
    _, later = _watched(runtime)
    assert _settled(later) and later.failure is None and WATCHDOG._thread.is_alive()


def test_the_watchdog_reads_events_in_a_relaxed_capture_mode():
    """While a graph is captured on another thread in the global mode, a query from a thread
    whose capture mode is not relaxed fails (as cudaEventQuery does); the watchdog's are made
    under the relaxed mode and calls complete. Old code: no capture-mode guard."""
    runtime = stream_runtime.EmulatedRuntime()
    runtime.global_capture = True
    try:
        transport, call = _watched(runtime)
        assert _settled(call) and call.failure is None, call.failure
        with pytest.raises(RuntimeError, match="capturing"):
            runtime.query(call.done)             # this thread: not relaxed
        with runtime.watching(CPU):
            assert runtime.query(call.done)
    finally:
        runtime.global_capture = False


def test_a_blocking_abort_does_not_stall_the_watchdog():
    """A call past its deadline is failed and its communicator aborted, with the abort blocking
    (ProcessGroupNCCL's can, up to its timeout): the failed call's verdict comes at once and a
    call on another stream completes meanwhile. Old code: the abort ran on the watchdog's
    thread, which stalled in it."""

    class BlockingAbort(GatedComm):
        def abort(self):
            release.wait(30)
            super().abort()

    release = threading.Event()
    try:
        runtime = stream_runtime.emulated()
        _, overdue = _watched(runtime, comm=BlockingAbort(), timeout=0.3, gate_open=False)
        assert _settled(overdue) and "did not complete within the timeout" in str(overdue.failure)
        _, other = _watched(runtime)
        assert _settled(other) and other.failure is None
    finally:
        release.set()


def test_the_watchdog_reuses_step_events_and_destroys_none():
    """Step events of completed calls go back to the runtime's pool and are reused; no event is
    destroyed on the watchdog's thread (cudaEventDestroy can hang). Old code: a new event per
    step, dropped wherever the last reference went."""
    import gc

    runtime = stream_runtime.EmulatedRuntime()
    stream_runtime.EmulatedEvent.destroyed_on.clear()
    made = []
    original = stream_runtime.EmulatedEvent.__init__

    def counting(self, stream):
        made.append(1)
        original(self, stream)

    stream_runtime.EmulatedEvent.__init__ = counting
    try:
        for _ in range(6):
            _, call = _watched(runtime)
            assert _settled(call) and call.failure is None
            time.sleep(0.02)
        gc.collect()
    finally:
        stream_runtime.EmulatedEvent.__init__ = original
    assert len(made) < 6 * 3, len(made)             # caller, step and end events: steps reused
    assert "ringcoll-watchdog" not in stream_runtime.EmulatedEvent.destroyed_on


# -- an emulator as strict as CUDA (issue #36 item 3) ---------------------------------------------
def raising_at_enqueue(where: str, algorithm: str = "ring", last: bool = False):
    """The middle rank's local reduction (``last``: the last rank's first) raises MemoryError at
    enqueue (its Python, on the caller's thread, as CUDA's host side would) in the middle of an
    all_reduce, or its kernel's compile and load fails (``where`` = "compile"): what every rank
    sees of that call, then of the next one on the group, and of a call on a fresh group."""
    from ringcoll import kernels

    rank, world = dist.get_rank(), dist.get_world_size()
    failing, nth = (world - 1, 1) if last else (world // 2, 2)
    group = dist.new_group(list(range(world)))
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(60.0)                   # the peers must fail long before it
    out = {}
    try:
        warm = data(12, rank)
        ringcoll.all_reduce(warm, group=group, algorithm=algorithm)
        transport = group_executor(group).transport(CPU)
        batches = sum(1 for entry in transport.comm.shim.log if entry[0] == "batch")
        seen, original = [], (kernels.reduce_into if where == "local" else kernels.prepare_reduction)

        def failing_kernel(*args, **kwargs):
            seen.append(threading.current_thread().name)
            if len(seen) == nth:                 # the second (or first) reduction of the call
                raise MemoryError("injected: out of memory in a local reduction")
            return original(*args, **kwargs)

        name = "reduce_into" if where == "local" else "prepare_reduction"
        if rank == failing:
            setattr(kernels, name, failing_kernel)
        x = data(1001, rank)
        start = time.monotonic()
        try:
            ringcoll.all_reduce(x, group=group, algorithm=algorithm)
            out["call"] = "returned: " + ("right" if torch.equal(x, sum(data(1001, r) for r in range(world)))
                                          else f"WRONG {x[:3].tolist()}")
        except Exception as error:  # noqa: BLE001 - reported
            out["call"] = f"{type(error).__name__}: {error}"
        finally:
            setattr(kernels, name, original)
        out["seconds"] = time.monotonic() - start
        out["on host"] = all(thread == threading.current_thread().name for thread in seen)
        if where == "compile" and rank == failing:
            out["posted"] = sum(1 for entry in transport.comm.shim.log if entry[0] == "batch") - batches
        y = data(7, rank)
        start = time.monotonic()
        try:
            ringcoll.all_reduce(y, group=group)
            out["next"] = f"returned {y.tolist()}"
        except Exception as error:  # noqa: BLE001 - reported
            out["next"] = f"{type(error).__name__}: {error}"
        out["next seconds"] = time.monotonic() - start
        fresh = dist.new_group(list(range(world)))
        z = data(5, rank)
        ringcoll.all_reduce(z, group=fresh)
        out["fresh"] = torch.equal(z, sum(data(5, r) for r in range(world)))
    finally:
        ringcoll.set_timeout(previous)
    return out


@pytest.mark.parametrize("where, algorithm, last", [("local", "ring", False), ("compile", "ring", False),
                                                    ("compile", "recursive_doubling", True)])
def test_an_error_at_enqueue_fails_the_group_on_every_rank(streamed, where, algorithm, last):
    """Issue #36 item 3: with a local reduction raising at enqueue on one rank mid-call (or its
    kernel failing to compile before the call's first transfer), every rank raises for that call,
    the failing rank's next call raises GroupFailedError at once, a fresh group works; never a
    wrong value. The reduction's host part runs on the caller's thread. Old code: the emulator ran
    it on the stream's thread; the failing rank's group stayed usable and its peers received
    unreduced data.

    Recursive doubling at world 3 with its last rank failing before it posts anything: rank 1's
    exchange with it fails at once (the failed rank closed its connections), and rank 1's stream
    must post nothing after that batch: its next step hands rank 0 the result, which would be
    computed from a receive that never landed (rank 0 returned those stale bytes when the
    emulator's stream went on past a failed batch)."""
    results = streamed.run(raising_at_enqueue, where, algorithm, last)
    world = len(results)
    for rank, out in enumerate(results):
        assert not out["call"].startswith("returned"), f"rank {rank}: {out}"
        assert out["on host"], f"rank {rank}: the reduction ran on a stream's thread"
        assert out["next"].startswith("GroupFailedError"), f"rank {rank}: {out}"
        assert out["fresh"], f"rank {rank}: {out}"
        assert out["seconds"] < 20, f"rank {rank}: peers must fail fast, not at the timeout: {out}"
    failing = results[world - 1 if last else world // 2]
    assert failing["call"].startswith("MemoryError: injected"), failing
    assert f"all_reduce/{algorithm}" in failing["next"] and "MemoryError" in failing["next"], failing
    assert failing["next seconds"] < 0.5, failing
    if where == "compile":
        assert failing["posted"] == 0, failing          # compiled before the first transfer


# -- tensor lifetime of async calls (issue #36 item 5) ---------------------------------------------
@on_device_memory
def dropped_before_wait():
    """Each tensor a call's hooks read or write, dropped by the caller after an async call whose
    stream is held, its memory handed straight to a new tensor that is then overwritten
    (stream_runtime.ReusingAllocator: device work holds memory, not tensors, as a GPU's); then
    ``wait()``. Per case: which of those tensors the call does not keep, whether the result is
    right, whether the new tensors kept what was written into them."""
    import gc

    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = stream_runtime.emulated()
    pool = runtime.allocator = stream_runtime.ReusingAllocator(1 << 22)
    n = 2 * world + 1
    out = {}
    try:
        ringcoll.all_reduce(data(4, rank))                   # set-up
        sync()

        def filled(values: torch.Tensor) -> torch.Tensor:
            tensor = pool.empty(*values.shape, dtype=values.dtype)
            tensor.copy_(values)
            return tensor

        def staged_list_input():
            inputs = [filled(data(n, rank * world + j)) for j in range(world)]
            output = torch.zeros(n, dtype=torch.int64)
            work = ringcoll.reduce_scatter(output, inputs, algorithm="ring", async_op=True)
            want = sum(data(n, r * world + rank) for r in range(world))
            return work, inputs, lambda: torch.equal(output, want)

        def premul_source():
            source = filled(data(n * world, rank).double())
            output = torch.zeros(n, dtype=torch.float64)
            work = ringcoll.reduce_scatter_tensor(output, source, op=dist._make_nccl_premul_sum(2.0),
                                                  algorithm="ring", async_op=True)
            want = 2 * sum(data(n * world, r).double() for r in range(world))[rank * n:(rank + 1) * n]
            return work, [source], lambda: torch.equal(output, want)

        def write_back_target():
            wide = filled(data(2 * n, rank).view(n, 2))
            target = wide.t()                                # not contiguous: reduced through a copy
            work = dist.all_reduce(target, group=backend, async_op=True)
            return work, [wide], lambda: True                # the caller dropped its result

        backend = dist.new_group(list(range(world)), backend="ringcoll")
        warm = data(4, rank)
        dist.all_reduce(warm, group=backend)
        sync()
        for name, start in (("staged list input", staged_list_input), ("PREMUL_SUM source", premul_source),
                            ("write-back target", write_back_target)):
            gate = threading.Event()
            on_stream(runtime.current(CPU), lambda: gate.wait(30))     # the call waits behind it
            work, dropped, right = start()
            # the call is enqueued on the caller's thread, or by the worker when the queue is
            # busy: read what it keeps once it is enqueued (it then holds the stream's gate)
            enqueued = time.monotonic() + 10
            while getattr(work, "_call", None) is None and time.monotonic() < enqueued:
                time.sleep(0.001)
            call = getattr(work, "_call", None)
            kept = {t.untyped_storage().data_ptr() for t in (call.keep if call is not None else [])}
            missing = [i for i, t in enumerate(dropped) if t.untyped_storage().data_ptr() not in kept]
            shapes = [(t.shape, t.dtype) for t in dropped]
            dropped.clear()                                  # the caller's last references
            gc.collect()
            reused = [pool.empty(*shape, dtype=dtype) for shape, dtype in shapes]
            for tensor in reused:
                tensor.fill_(-7)
            gate.set()
            work.wait()
            sync()
            out[name] = {"not kept": missing, "right": right(),
                         "reused memory untouched": all(bool((t == -7).all()) for t in reused)}
    finally:
        runtime.allocator = None
    return out


def test_async_calls_keep_every_tensor_their_hooks_touch(streamed):
    """Issue #36 item 5: staged list inputs, the PREMUL_SUM source and the write-back target of a
    non-contiguous tensor are kept by the call (and recorded on ringcoll's stream) until it
    completes: dropped by the caller before ``wait()``, their memory is not reused while the call
    reads or writes it. Old code: the call kept its buffers only."""
    for rank, out in enumerate(streamed.run(dropped_before_wait)):
        for case, facts in out.items():
            assert facts == {"not kept": [], "right": True, "reused memory untouched": True}, f"rank {rank} {case}: {facts}"


def test_the_reusing_allocator_reuses_a_block_only_for_its_own_stream():
    """As CUDA's caching allocator: a freed block serves the next allocation of its size for the
    stream it was allocated for, never one for another stream (in-process ranks on their own
    streams would otherwise trade blocks in an order set by their threads' timing; the GPU
    check's allocator test failed in CI that way)."""
    import gc

    runtime = stream_runtime.emulated()
    first, second = runtime.new_stream(CPU), runtime.new_stream(CPU)
    pool = stream_runtime.ReusingAllocator(1 << 16)
    with runtime.use(first):
        a = pool.empty(16, dtype=torch.float32)
    address = a.data_ptr()
    del a
    gc.collect()
    with runtime.use(second):
        other = pool.empty(16, dtype=torch.float32)
    assert other.data_ptr() != address
    with runtime.use(first):
        same = pool.empty(16, dtype=torch.float32)
    assert same.data_ptr() == address


def test_wait_with_a_timeout_on_cpu_memory_honours_it():
    """On CPU memory ``wait()`` blocks the host until the call ends, and ``wait(timeout)``
    raises WaitTimeout once the timeout has passed (the call goes on)."""
    from datetime import timedelta
    from ringcoll.runtime.transport.stream_ordered import StreamTransport
    from ringcoll.runtime.work import StreamWork, WaitTimeout

    comm = GatedComm()
    transport = StreamTransport(comm, stream_runtime.emulated(), CPU, WATCHDOG)
    call = _enqueue_one(transport, timeout=10)
    work = StreamWork([], "all_reduce/ring", stream_runtime.emulated(), CPU)
    work._enqueued(call)
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match="still running"):
        work.wait(timedelta(seconds=0.2))
    assert 0.15 <= time.monotonic() - start < 2
    comm.gate.set()
    assert work.wait() is True and call.finished


def test_a_numba_cpu_kernel_is_device_work_in_the_emulator():
    """A numba CPU reduction launched on an emulated stream compiles at once, on the caller's
    thread (the host's part), and computes when the stream reaches it (not a torch operation, so
    the dispatch mode alone would have run it at once)."""
    pytest.importorskip("numba")
    from ringcoll import kernels

    runtime = stream_runtime.EmulatedRuntime()
    stream = runtime.new_stream(CPU)
    gate = threading.Event()
    runtime.launch(stream, lambda: stream_runtime.device_work(lambda: gate.wait(30)))
    dst, src = data(9, 0), data(9, 1)
    runtime.launch(stream, lambda: kernels.reduce_into(dst, src, "sum", backend="numba"))
    held = torch.equal(dst, data(9, 0))
    gate.set()
    runtime.synchronize(runtime.record(stream))
    assert held and torch.equal(dst, data(9, 0) + data(9, 1))


def numba_compile_order():
    """A ring all_reduce with the numba kernels and none compiled yet: the events of the rank's
    call in order, "compile <signatures>" when the kernel is compiled and "post <signatures>" at
    each batch posted (the kernel's compiled signatures then); and the result."""
    from ringcoll import kernels
    from ringcoll.kernels import _lowering, _numba
    from ringcoll.runtime.transport.stream_ordered import EmulatedNccl

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    ringcoll.all_reduce(data(4, rank), group=group)           # the group's transport set up
    kind, op = _lowering.lower(torch.int64, "sum")
    _numba.cpu_kernel.cache_clear()                           # this process compiled nothing yet
    events, start, compiled = [], EmulatedNccl.start, _numba.cpu_compiled

    def compiling(kind_, op_):
        kernel = compiled(kind_, op_)
        events.append(f"compile {len(kernel.signatures)}")
        return kernel

    def posting(self, ops):
        events.append(f"post {len(_numba.cpu_kernel(kind, op).signatures)}")
        return start(self, ops)

    kernels.set_backend("numba")
    EmulatedNccl.start, _numba.cpu_compiled = posting, compiling
    try:
        x = data(1001, rank)
        ringcoll.all_reduce(x, group=group, algorithm="ring")
    finally:
        EmulatedNccl.start, _numba.cpu_compiled = start, compiled
        kernels.set_backend(None)
    events.append(f"after {len(_numba.cpu_kernel(kind, op).signatures)}")
    return events, torch.equal(x, sum(data(1001, r) for r in range(world)))


def test_numba_kernels_are_compiled_before_the_first_transfer(streamed):
    """#37 item 5: a call whose reductions take numba's kernels has them compiled (for the types
    its launches pass: no second compile at the launch) before its first batch is posted.
    Old code: prepare_reduction only made numba's lazy dispatcher; the compile ran at the first
    launch, on the stream, after transfers of the call were posted."""
    pytest.importorskip("numba")
    for rank, (events, right) in enumerate(streamed.run(numba_compile_order)):
        assert right, rank
        posts = [event for event in events if event.startswith("post")]
        assert events[0] == "compile 1" and posts and set(posts) == {"post 1"}, (rank, events)
        assert events[-1] == "after 1", (rank, events)          # the launches compiled nothing more


def watchdog_query_fails():
    """Rank 0's event queries of one call on group A raise (a sticky CUDA error's stand-in):
    what each rank sees of that call, of a call on group B meanwhile and after, and of the next
    call on A."""
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = stream_runtime.emulated()
    a, b = dist.new_group(list(range(world))), dist.new_group(list(range(world)))
    for group in (a, b):
        ringcoll.all_reduce(data(4, rank), group=group)
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(20.0)
    original = type(runtime).query
    refused = set()

    def query(self, event):
        if id(event) in refused:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return original(self, event)

    out = {}
    try:
        if rank == 0:
            type(runtime).query = query
        transport = group_executor(a).transport(CPU)
        real_close = transport.close

        def close(keep=()):
            call = real_close(keep)
            refused.update(id(step.event) for step in call.steps)
            return call

        transport.close = close
        x = data(1001, rank)
        start = time.monotonic()
        try:
            ringcoll.all_reduce(x, group=a, algorithm="ring")
            out["a"] = "returned " + ("right" if torch.equal(x, sum(data(1001, r) for r in range(world))) else "WRONG")
        except Exception as error:  # noqa: BLE001 - reported
            out["a"] = f"{type(error).__name__}: {error}"
        out["a seconds"] = time.monotonic() - start
        transport.close = real_close
        y = data(7, rank)
        ringcoll.all_reduce(y, group=b)
        out["b"] = torch.equal(y, sum(data(7, r) for r in range(world)))
        start = time.monotonic()
        try:
            ringcoll.all_reduce(data(3, rank), group=a)
            out["next a"] = "returned"
        except Exception as error:  # noqa: BLE001 - reported
            out["next a"] = type(error).__name__
        out["next a seconds"] = time.monotonic() - start
    finally:
        type(runtime).query = original
        ringcoll.set_timeout(previous)
    return out


def test_a_failing_event_query_fails_its_group_and_the_watchdog_serves_the_others(streamed):
    """Issue #36 item 4 through the executor: the failing rank's call raises an error naming the
    call and the watchdog's failure (its peers' call completed: the transfers did), group B keeps
    working on every rank, and group A is failed on every rank: the next call on it raises at
    once where it failed, within seconds on its peers (the abort is told through the store).
    Old code: the exception killed rank 0's watchdog; no later call there ever completed."""
    results = streamed.run(watchdog_query_fails)
    for rank, out in enumerate(results):
        assert out["a"] in ("returned right",) or not out["a"].startswith("returned"), f"rank {rank}: {out}"
        assert out["a seconds"] < 10 and out["b"] is True, f"rank {rank}: {out}"
        assert out["next a"] in ("GroupFailedError", "PeerError") and out["next a seconds"] < 10, f"rank {rank}: {out}"
    assert results[0]["next a"] == "GroupFailedError", results[0]
    assert "call #" in results[0]["a"] and "all_reduce/ring" in results[0]["a"], results[0]
    assert "watchdog could not read" in results[0]["a"] and "illegal memory access" in results[0]["a"], results[0]


class FailingNccl(FakeProcessGroupNccl):
    """A ProcessGroupNCCL (the fake stands for the class) whose eager connect fails as NCCL's does."""

    def eager_connect_single_device(self, device):
        raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp: unhandled system error (run with NCCL_DEBUG=INFO)")

    def allreduce(self, tensors):
        raise AssertionError("a lazy set-up was tried after NCCL's own eager connect failed")


def test_a_failed_eager_connect_on_nccl_is_reported_as_itself(fake_nccl, monkeypatch):
    """#37: ProcessGroupNCCL always has its eager connect, so its error is NCCL's: raised as it
    is, never followed by a lazy set-up that blocks in the store past the deadline and reports
    a timeout. A group standing in for NCCL without one (the gloo shim) still falls back."""
    import time

    from ringcoll.runtime.transport.shim import NcclComm

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FailingNccl, raising=False)
    comm = NcclComm(FailingNccl(None, 0, 2, FakeProcessGroupNccl.Options()), torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="unhandled system error"):
        comm.connect(time.monotonic() + 5)
