"""The executor's transports, without a GPU.

- A 3-rank cluster with ``RINGCOLL_TRANSPORT=batched`` runs every collective x algorithm
  through the batched (NCCL-shaped) transport and its NCCL shim on gloo, against the
  built-ins; plus NCCL's semantics that bite: a barrier that must block the host, a timeout
  that aborts, honest batch errors, a rank with no transfers in its first call.
- In-process fakes: a fake NCCL process group (coalescing, polling, abort), a fake CUDA
  stream/device layer that records which thread, device and stream each operation used
  (async calls run under the caller's stream; staged gloo copies reuse pinned buffers,
  ordered by events), and the choice of transport by tensor device.

The whole catalogue runs through the batched transport with ``pytest --transport batched``
(or ``RINGCOLL_TEST_TRANSPORT=batched``).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.runtime import stream_runtime, transport, work as work_module
from ringcoll.api import BUILDERS
from ringcoll.api.common import Context, executor_context
from ringcoll.api._checks import check_device
from ringcoll.runtime.executor import P2PExecutor
from ringcoll.runtime.failures import group_timeout
from ringcoll.schedules.vocabulary import Buf, Recv, Send
from ringcoll.runtime.transport import (BatchedTransport, HostTransport, NcclComm, NcclShim, TransferError,
                                wire)
from ringcoll.runtime.transport.stream_ordered import StreamTransport


# -- the catalogue through the batched transport -------------------------------------------------
def data(numel: int, rank: int, dtype=torch.int64) -> torch.Tensor:
    """Exact integer data, never zero, distinct per rank."""
    return (torch.arange(numel, dtype=torch.int64) % 97 + 1 + 100 * rank).to(dtype)


def catalogue_slice():
    """Every collective x algorithm at three sizes (1, below and above world, not divisible),
    int64 exact data, against the built-in on the same gloo group; int16 (which NCCL lacks)
    against the exact sum. Returns (transport class name, the wrong cases)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = []
    algorithms = ringcoll.algorithms()

    def check(what, got, want):
        if not torch.equal(got, want):
            wrong.append(what)

    for n in (1, 2, 1001):
        root = n % world
        for alg in algorithms["all_reduce"]:
            x, y = data(n, rank), data(n, rank)
            ringcoll.all_reduce(x, algorithm=alg)
            dist.all_reduce(y)
            check(f"all_reduce/{alg} {n}", x, y)
        for alg in algorithms["broadcast"]:
            x, y = data(n, rank), data(n, rank)
            ringcoll.broadcast(x, src=root, algorithm=alg)
            dist.broadcast(y, src=root)
            check(f"broadcast/{alg} {n}", x, y)
        for alg in algorithms["reduce"]:
            x, y = data(n, rank), data(n, rank)
            ringcoll.reduce(x, dst=root, algorithm=alg)
            dist.reduce(y, dst=root)
            if rank == root:
                check(f"reduce/{alg} {n}", x, y)
        for alg in algorithms["all_gather"]:
            outs = [torch.zeros(n, dtype=torch.int64) for _ in range(world)]
            want = [torch.zeros(n, dtype=torch.int64) for _ in range(world)]
            ringcoll.all_gather(outs, data(n, rank), algorithm=alg)
            dist.all_gather(want, data(n, rank))
            check(f"all_gather/{alg} {n}", torch.cat(outs), torch.cat(want))
        for alg in algorithms["reduce_scatter"]:
            inputs = [data(n, rank * world + j) for j in range(world)]
            out, want = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
            ringcoll.reduce_scatter(out, inputs, algorithm=alg)
            dist.reduce_scatter(want, [t.clone() for t in inputs])
            check(f"reduce_scatter/{alg} {n}", out, want)
        for alg in algorithms["gather"]:
            outs = [torch.zeros(n, dtype=torch.int64) for _ in range(world)] if rank == root else None
            want = [torch.zeros(n, dtype=torch.int64) for _ in range(world)] if rank == root else None
            ringcoll.gather(data(n, rank), outs, dst=root, algorithm=alg)
            dist.gather(data(n, rank), want, dst=root)
            if rank == root:
                check(f"gather/{alg} {n}", torch.cat(outs), torch.cat(want))
        for alg in algorithms["scatter"]:
            inputs = [data(n, 10 + j) for j in range(world)] if rank == root else None
            out, want = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
            ringcoll.scatter(out, inputs, src=root, algorithm=alg)
            dist.scatter(want, inputs, src=root)
            check(f"scatter/{alg} {n}", out, want)
        for alg in algorithms["all_to_all"]:
            inp = data(n * world, rank)
            out, want = torch.zeros(n * world, dtype=torch.int64), torch.zeros(n * world, dtype=torch.int64)
            ringcoll.all_to_all_single(out, inp, algorithm=alg)
            dist.all_to_all_single(want, inp)
            check(f"all_to_all_single/{alg} {n}", out, want)
        ringcoll.barrier()
        x = data(n, rank, torch.int16)
        ringcoll.all_reduce(x, algorithm="ring")
        check(f"all_reduce int16 {n}", x, sum(data(n, r) for r in range(world)).to(torch.int16))
    executor = ringcoll.api.common.group_context(None).executor
    return type(executor.transport(torch.device("cpu"))).__name__, wrong


def batched_semantics():
    """What NCCL's semantics change, on fresh sub-groups of the batched cluster."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(20)
    try:
        # a rank with no transfers in its first call on a group (all-zero splits for the last
        # rank) must not leave the others blocked in the communicator's set-up
        group = dist.new_group(list(range(world)))
        counts = [0 if world - 1 in (rank, peer) else 2 for peer in range(world)]
        inp = data(sum(counts), rank)
        got = torch.zeros(sum(counts), dtype=torch.int64)
        ringcoll.all_to_all_single(got, inp, counts, counts, group=group)
        want = torch.zeros_like(got)
        dist.all_to_all_single(want, inp, counts, counts, group=group)
        shim = ringcoll.api.common.group_context(group).executor.transport(torch.device("cpu")).comm
        out["zero_splits"] = (torch.equal(got, want), shim.log[0], sum(e[0] == "batch" for e in shim.log))
        # barrier blocks the host until the peers arrive (NCCL's wait() does not)
        if rank == 1:
            time.sleep(1.0)
        start = time.monotonic()
        ringcoll.barrier(group=group)
        out["barrier"] = time.monotonic() - start
        # barrier(timeout=) on a peer that never comes: an error within it
        late = dist.new_group(list(range(world)))
        ringcoll.all_reduce(torch.ones(1), group=late)      # set up, so only the barrier waits
        start = time.monotonic()
        if rank == world - 1:
            time.sleep(2.5)
            out["timeout"] = None
        else:
            try:
                ringcoll.barrier(group=late, timeout=timedelta(seconds=1))
                out["timeout"] = ("returned", time.monotonic() - start, "")
            except ringcoll.PeerError as error:
                out["timeout"] = ("PeerError", time.monotonic() - start, str(error), error.peers)
            try:
                ringcoll.all_reduce(torch.ones(1), group=late)
                out["later"] = "returned"
            except ringcoll.GroupFailedError as error:
                out["later"] = str(error)
    finally:
        ringcoll.set_timeout(previous)
    return out


def raw_groups():
    """Both transports on a raw gloo group that c10d does not know (the backend's inner group),
    through the builders and ``executor_context``, as the backend runs them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    results = {}
    for mode in ("host", "batched"):
        raw = dist.ProcessGroupGloo(dist.PrefixStore(f"raw-{mode}", store), rank, world, timedelta(seconds=30))
        saved = os.environ.get("RINGCOLL_TRANSPORT")
        os.environ["RINGCOLL_TRANSPORT"] = mode
        try:
            executor = P2PExecutor(raw, rank=rank, world=world, backend="gloo")
        finally:
            os.environ["RINGCOLL_TRANSPORT"] = saved
        x = data(11, rank, torch.int16)
        executor.execute(BUILDERS["all_reduce"](executor_context(executor), x, algorithm="rabenseifner"))
        results[mode] = (type(executor.transport(x.device)).__name__, executor.timeout(
            BUILDERS["barrier"](executor_context(executor))),
            torch.equal(x, sum(data(11, r) for r in range(world)).to(torch.int16)))
    return results


@pytest.fixture(scope="module")
def batched_cluster():
    with ringcoll.launch(3, threads=1, timeout=120, env={"RINGCOLL_TRANSPORT": "batched",
                                                         "RINGCOLL_TIMEOUT": "60"}) as cluster:
        yield cluster


def test_both_transports_run_on_a_raw_group(batched_cluster):
    for results in batched_cluster.run(raw_groups):
        assert results == {"host": ("HostTransport", 60.0, True), "batched": ("BatchedTransport", 60.0, True)}


def test_every_collective_and_algorithm_through_the_batched_transport(batched_cluster):
    for name, wrong in batched_cluster.run(catalogue_slice):
        assert name == "BatchedTransport"
        assert wrong == []


def test_nccl_semantics_on_the_batched_transport(batched_cluster):
    results = batched_cluster.run(batched_semantics)
    for rank, out in enumerate(results):
        equal, first, batches = out["zero_splits"]
        assert equal and first == ("connect",), out
        # the group's placement is agreed through its store (no batch); the last rank's
        # all-zero all_to_all posts none, the others' post theirs
        assert (batches == 0) == (rank == 2), out
        assert out["barrier"] >= (0.0 if rank == 1 else 0.9), out
    for out in results[:2]:
        outcome, waited, message, peers = out["timeout"]
        assert outcome == "PeerError" and 0.9 <= waited < 4, out
        # dissemination at 3 ranks: both peers in one batch; NCCL cannot say which broke
        assert "a batch of 2 transfers" in message and "timed out after 1s" in message, message
        assert len(peers) == 2
        assert "call #" in out["later"] and "barrier" in out["later"]


# -- in-process fakes -------------------------------------------------------------------------
class _Done:
    def __init__(self, fn=None, error=None):
        self._fn, self._error = fn, error

    def wait(self, timeout=None):
        if self._error is not None:
            raise self._error
        if self._fn is not None:
            self._fn()
            self._fn = None
        return True

    def is_completed(self):
        return True


class Loopback:
    """Rank 0 of two, whose peer echoes: what is sent to peer 1 comes back from peer 1."""

    def __init__(self):
        self.sent: deque = deque()
        self.tags, self.dtypes = [], []

    def send(self, tensors, peer, tag):
        self.sent.append(tensors[0].clone())
        self.tags.append(tag)
        self.dtypes.append(tensors[0].dtype)
        return _Done()

    def recv(self, tensors, peer, tag):
        self.tags.append(tag)
        self.dtypes.append(tensors[0].dtype)
        return _Done(lambda: tensors[0].copy_(self.sent.popleft()))


class FakeStreams:
    """Records which thread, device and stream each operation used."""

    def __init__(self):
        self.log = []
        self.local = threading.local()
        self.pinned_allocations = 0

    def current(self, device):
        return getattr(self.local, "stream", f"default-{device.index}")

    @contextlib.contextmanager
    def use(self, device, stream):
        saved = getattr(self.local, "stream", None)
        self.local.stream, self.local.device = stream, device
        self.log.append(("use", threading.current_thread().name, device, stream))
        try:
            yield
        finally:
            self.local.stream = saved

    def record(self, device, stream=None):
        event = ("event", len(self.log), stream or self.current(device))
        self.log.append(("record", threading.current_thread().name, event))
        return event

    def wait_event(self, device, event):
        self.log.append(("wait_event", threading.current_thread().name, self.current(device), event))

    def synchronize(self, event):
        self.log.append(("synchronize", event))

    def pinned(self, nbytes):
        self.pinned_allocations += 1
        return torch.empty(nbytes, dtype=torch.uint8)


@pytest.fixture
def fake_streams(monkeypatch):
    fake = FakeStreams()
    monkeypatch.setattr(transport.base, "cuda_calls", fake)
    return fake


def test_async_calls_run_under_the_callers_device_and_stream(fake_streams):
    device = torch.device("cuda", 1)
    fake_streams.local.stream = "side-stream"            # the caller is on a side stream
    seen = []
    gate = threading.Event()

    def task():
        gate.wait(5)
        seen.append((threading.current_thread().name, fake_streams.current(device),
                     fake_streams.local.device))

    handle = work_module.submit(task, True, [], device=device)
    fake_streams.local.stream = "other-stream"            # the caller moves on before the call runs
    gate.set()
    handle.wait()
    assert seen == [("ringcoll", "side-stream", device)]
    recorded = [entry for entry in fake_streams.log if entry[0] == "record"]
    assert recorded and recorded[0][1] == "ringcoll" and recorded[0][2][2] == "side-stream"
    # wait() orders the waiting thread's current stream after the call's event, no host block
    waits = [entry for entry in fake_streams.log if entry[0] == "wait_event"]
    assert waits == [("wait_event", threading.current_thread().name, "other-stream", recorded[0][2])]
    # CPU calls need none of it
    fake_streams.log.clear()
    work_module.submit(lambda: None, True, []).wait()
    assert fake_streams.log == []


def test_staged_gloo_transfers_reuse_pinned_buffers_and_order_copies_by_events(fake_streams):
    pg = Loopback()
    host = HostTransport(pg, stage=True)
    for call in range(3):
        source = torch.arange(6, dtype=torch.int16) + call
        target = torch.zeros(6, dtype=torch.int16)
        fake_streams.log.clear()
        handle = host.post([(Send(1, Buf("data", 0, 6)), source), (Recv(1, Buf("out", 0, 6)), target)], 77)
        host.wait(handle, time.monotonic() + 5)
        assert torch.equal(target, source)
        kinds = [entry[0] for entry in fake_streams.log]
        # (from the second call: the reused buffer's last copy back is waited for first), the
        # copies to the host and one event synchronised before gloo reads them, the copies
        # back and one event recorded
        assert kinds == ["synchronize"] * (call > 0) + ["record", "synchronize", "record"], kinds
    assert fake_streams.pinned_allocations == 1
    assert set(pg.tags) == {77} and set(pg.dtypes) == {torch.uint8}


class FakeNccl:
    """A raw NCCL group (``dist.ProcessGroupNCCL``, a c10d Backend) as ringcoll sees it:
    coalescing, one Work per batch. Its methods take what the real Backend binding takes
    (test_the_fake_nccl_takes_what_the_real_backend_binding_takes): coalescing takes no device."""

    def __init__(self, complete=True, error=None):
        self.calls, self.complete, self.error = [], complete, error

    def _start_coalescing(self):
        self.calls.append(("start",))

    def send(self, tensors, peer, tag):
        self.calls.append(("send", peer, tensors[0].dtype, tensors[0].numel()))

    def recv(self, tensors, peer, tag):
        self.calls.append(("recv", peer, tensors[0].dtype, tensors[0].numel()))

    def _end_coalescing(self):
        self.calls.append(("end",))
        fake = self

        class Batch:
            def is_completed(self):
                return fake.complete

            def wait(self, timeout=None):
                if fake.error:
                    raise fake.error
                return True
        return Batch()

    def eager_connect_single_device(self, device):
        self.calls.append(("connect", device))

    def abort(self):
        self.calls.append(("abort",))


def _parameters(doc: str) -> list:
    """The parameter names of a pybind binding's first signature line (after self)."""
    inside = doc.strip().splitlines()[0].split("(", 1)[1].rsplit(")", 1)[0]
    return [part.split(":")[0].strip() for part in inside.split(",")][1:]


def test_the_fake_nccl_takes_what_the_real_backend_binding_takes():
    """FakeNccl stands in for a raw ProcessGroupNCCL, whose coalescing is the c10d Backend
    binding's (no device); a registered ProcessGroup's takes one. A fake that accepted the
    device hid that NcclComm called a raw backend the ProcessGroup way (issue #26 item 1)."""
    import inspect

    raw = torch._C._distributed_c10d.Backend
    for name in ("_start_coalescing", "_end_coalescing", "send", "recv", "abort"):
        real = _parameters(getattr(raw, name).__doc__)
        fake = list(inspect.signature(getattr(FakeNccl, name)).parameters)[1:]
        assert len(fake) == len(real), (name, fake, real)
    assert _parameters(dist.ProcessGroup._start_coalescing.__doc__) == ["device_type"]


def coalesced_batches():
    """NcclComm.batch on a real raw gloo Backend (the same c10d binding as ProcessGroupNCCL)
    and on a registered ProcessGroup: each must get past the binding's argument check; gloo
    then says it has no coalescing, which NCCL has (the error that shows the call was taken)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    raw = dist.ProcessGroupGloo(dist.PrefixStore("coalesce", store), rank, world, timedelta(seconds=30))
    out = {}
    for name, pg in (("raw backend", raw), ("process group", dist.group.WORLD)):
        send, recv = torch.full((5,), rank + 1, dtype=torch.uint8), torch.zeros(5, dtype=torch.uint8)
        try:
            NcclComm(pg, torch.device("cpu")).batch([(True, send, (rank + 1) % world),
                                                     (False, recv, (rank - 1) % world)])
            out[name] = "ran"
        except (TypeError, RuntimeError) as error:
            out[name] = f"{type(error).__name__}: {error}".splitlines()[0]
    return out


def test_nccl_batches_call_the_real_c10d_bindings(batched_cluster):
    for out in batched_cluster.run(coalesced_batches):
        assert out == {"raw backend": "RuntimeError: Backend gloo does not implement startCoalescing",
                       "process group": "RuntimeError: Backend gloo does not implement startCoalescing"}, out


def test_nccl_batches_move_bytes_poll_the_deadline_and_abort():
    device = torch.device("cuda", 0)
    items = [Send(1, Buf("data", 0, 3)), Recv(2, Buf("data", 3, 6))]
    tensors = [torch.arange(3, dtype=torch.int16), torch.zeros(3, dtype=torch.int16)]
    pg = FakeNccl()
    batched = BatchedTransport(NcclComm(pg, device))
    batched.ready(time.monotonic() + 1)
    batched.wait(batched.post(list(zip(items, tensors)), tag=123), time.monotonic() + 1)
    assert pg.calls == [("connect", device), ("start",), ("send", 1, torch.uint8, 6),
                        ("recv", 2, torch.uint8, 6), ("end",)]
    pg = FakeNccl(complete=False)                         # a peer that never comes
    batched = BatchedTransport(NcclComm(pg, device))
    start = time.monotonic()
    with pytest.raises(TransferError) as caught:
        batched.wait(batched.post(list(zip(items, tensors)), 0), time.monotonic() + 0.3)
    assert 0.29 <= time.monotonic() - start < 2 and caught.value.timed_out and caught.value.batch
    assert caught.value.items == items and pg.calls[-1] == ("abort",)
    pg = FakeNccl(error=RuntimeError("NCCL error: remote process exited"))
    batched = BatchedTransport(NcclComm(pg, device))
    with pytest.raises(TransferError, match="remote process exited"):
        batched.wait(batched.post(list(zip(items, tensors)), 0), time.monotonic() + 1)
    assert pg.calls[-1] == ("abort",)


def test_the_shim_keeps_nccls_dtype_list_and_the_transports_move_bytes():
    shim = NcclShim(pg=None)
    shim.connected = True
    with pytest.raises(RuntimeError, match="not supported for NCCL process group: Short"):
        shim.batch([(True, torch.zeros(2, dtype=torch.int16), 1)])
    for dtype in (torch.int16, torch.bool, torch.float64, torch.bfloat16):
        assert wire(torch.zeros(5, dtype=dtype)).dtype == torch.uint8
    assert wire(torch.zeros(0, dtype=torch.int16)).numel() == 0


def test_the_transport_follows_the_tensors_device_not_the_backend_string(monkeypatch):
    monkeypatch.delenv("RINGCOLL_TRANSPORT", raising=False)      # (pytest --transport batched)
    monkeypatch.setattr(stream_runtime, "cuda", stream_runtime.emulated)       # no CUDA streams in this build
    mixed = P2PExecutor(FakeNccl(), rank=0, world=2, backend="cpu:gloo,cuda:nccl")
    cuda = mixed.transport(torch.device("cuda", 0))
    assert isinstance(cuda, StreamTransport) and isinstance(cuda.comm, NcclComm)
    assert isinstance(mixed.transport(torch.device("cpu")), HostTransport)
    gloo = P2PExecutor(Loopback(), rank=0, world=2, backend="gloo")
    staged = gloo.transport(torch.device("cuda", 0))
    assert isinstance(staged, HostTransport) and staged.stage
    assert not gloo.transport(torch.device("cpu")).stage
    nccl = P2PExecutor(FakeNccl(), rank=0, world=2, backend="nccl")
    with pytest.raises(ValueError, match="tensor must be a CUDA tensor on an NCCL group"):
        check_device("tensor", torch.zeros(1), Context(0, 2, nccl))
    check_device("tensor", torch.zeros(1), Context(0, 2, mixed))


def test_the_timeout_of_a_raw_group_is_read_from_its_options():
    store = dist.HashStore()
    raw = dist.ProcessGroupGloo(dist.PrefixStore("t", store), 0, 1, timedelta(seconds=5))
    assert group_timeout(raw) == 5.0
    assert group_timeout(object()) == 30 * 60.0          # torch's default


def test_wire_takes_one_element_blocks_of_strided_tensors():
    """A one-element block of a strided tensor is contiguous but keeps its stride (2 here);
    the fuzz found ``view(torch.uint8)`` refusing it (scatter of int16, trial 2026:83)."""
    strided = (torch.arange(10, dtype=torch.int16) + 1)[::2]
    one = strided[1:2]
    assert one.stride() == (2,) and one.is_contiguous()
    assert torch.equal(wire(one), torch.tensor([3, 0], dtype=torch.uint8))
    assert wire(strided[1:1]).numel() == 0
    wire(one).copy_(torch.tensor([7, 1], dtype=torch.uint8))     # the bytes are the tensor's own
    assert int(strided[1]) == 7 + 256


def test_a_call_reaches_the_executor_once_with_the_number_its_entry_took(monkeypatch):
    """``P2PExecutor.execute`` is the runtime's one entry: a plan that comes without a number
    is refused (numbers are taken at the call's entry, ``executor_context``, never where it
    runs); a call runs on its number's tag and takes none of its own; an internal exchange
    runs on its reserved tag and takes no number either."""
    from ringcoll.runtime.identity import fingerprint, print_bits, tag_of
    from ringcoll.runtime.nodes import PLACEMENT_TAG
    from ringcoll.runtime.plan import Plan
    from ringcoll.schedules import registry
    from ringcoll.schedules.vocabulary import Layout

    monkeypatch.delenv("RINGCOLL_TRANSPORT", raising=False)
    monkeypatch.delenv("RINGCOLL_CHECK", raising=False)
    raw = Loopback()
    executor = P2PExecutor(raw, rank=0, world=2, backend="gloo")
    x = torch.arange(1, 9, dtype=torch.int64)           # even halves: the loopback echoes sizes as sent
    with pytest.raises(ValueError, match="reaches the executor with its number"):
        executor.execute(BUILDERS["all_reduce"](Context(0, 2, executor), x, algorithm="ring"))
    assert not raw.tags                      # refused before anything moved
    ctx = executor_context(executor)
    plan = BUILDERS["all_reduce"](ctx, x, algorithm="ring")
    raw.tags.clear()
    executor.execute(plan)
    assert raw.tags and set(raw.tags) == {tag_of(ctx.seq, print_bits(fingerprint(plan)))}
    # the loopback echoes: the ring reduces the half it gets back (its own second half) into
    # its first, and the all-gather's echo copies that into the second
    assert x.tolist() == [6, 8, 10, 12] * 2
    assert executor_context(executor).seq == ctx.seq + 1          # the run took no number
    table = torch.arange(1, 9, dtype=torch.uint8)
    internal = Plan("layout", registry.get("all_gather", "ring"), 0, 2, Layout(8, {"in_place": True}),
                    {"output": table}, describe="an internal exchange")
    raw.tags.clear()
    executor.execute(internal, tag=PLACEMENT_TAG, blocking=True)
    assert raw.tags and set(raw.tags) == {PLACEMENT_TAG} and table.tolist() == [1, 2, 3, 4] * 2
    assert executor_context(executor).seq == ctx.seq + 2
