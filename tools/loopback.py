"""Several ranks of one process on one device, over a loopback communicator: how gpu_check drives
ringcoll's real stream-ordered executor with 2-4 ranks on one GPU (NCCL refuses two ranks on one
device, "Duplicate GPU detected"; NCCL itself is covered by gpu_check's world-1 checks).

Each rank is a thread with an executor of its own (:class:`LoopbackExecutor`: ringcoll's
:class:`~ringcoll.runtime.executor.P2PExecutor`, with its stream-ordered transport, its own stream,
the process's watchdog and the kernels of ``ringcoll.kernels`` on that stream) and a caller's stream
of its own. What NCCL would do between GPUs, :class:`LoopbackComm` does between the ranks'
buffers on one device, split as NCCL's calls are:

- ``start(ops)`` (on the host, at enqueue): records an event of the rank's stream (what the
  batch's sends read is written, what its receives write is free), leaves each send in the
  hub's mailbox of its (sender, receiver) pair, in order, and for each receive takes the
  matching send from its sender's mailbox (waiting on the host until the sender has enqueued
  its batch: the ranks are threads of one process, each enqueueing its schedule in order) and
  enqueues the copy on the rank's *communication stream*, ordered after both ranks' events,
  then records the copy's event;
- ``join(batch)``: orders the rank's stream after the copies of its receives and after the
  receivers' copies of its sends (the buffer a send reads is not written before it was read),
  without blocking the host beyond waiting for the receivers to have enqueued them.

The host waits (for a peer's enqueue, never for the device) are bounded by the hub's timeout and
end when the communicator is aborted; an error is the step's, as an NCCL error would be.

The same code runs on the CPU through the stream emulator (``streams.emulated()``: CPU
tensors, each stream a thread), which is how CI rehearses gpu_check's multi-rank checks.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict, deque
from datetime import timedelta
from typing import Callable, List, Optional

import torch

from ringcoll.runtime.executor import P2PExecutor
from ringcoll.runtime.transport.stream_ordered import StreamTransport
from ringcoll.runtime.watchdog import watchdog


class _Send:
    __slots__ = ("tensor", "ready", "copied")

    def __init__(self, tensor: torch.Tensor, ready):
        self.tensor, self.ready, self.copied = tensor, ready, None


class _Batch:
    __slots__ = ("sends", "copies", "error")

    def __init__(self):
        self.sends: List[_Send] = []
        self.copies: list = []
        self.error: Optional[BaseException] = None


class Hub:
    """The ranks' meeting point: a mailbox of sends per (sender, receiver), in order."""

    def __init__(self, world: int, device: torch.device, timeout: float = 60.0):
        self.world, self.device = world, device
        self.runtime = P2PExecutor.stream_runtime(device)
        self.timeout = timedelta(seconds=timeout)      # the group's timeout (failures.group_timeout reads it)
        self.aborted = False
        self.copies = 0                                # copies enqueued, all ranks together
        self._mail = defaultdict(deque)
        self._cond = threading.Condition()

    def _until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout.total_seconds()
        with self._cond:
            while not ready():
                if self.aborted:
                    raise RuntimeError("loopback communicator was aborted")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"loopback: {what} not enqueued within {self.timeout.total_seconds():.0f} s")
                self._cond.wait(min(left, 0.05))


class LoopbackComm:
    """One rank's communicator on a :class:`Hub` (see the module docstring); ``stream`` is the
    rank's transport's stream (set when the transport is made)."""

    def __init__(self, hub: Hub, rank: int):
        self.hub, self.rank = hub, rank
        self.stream = None
        self.copy_stream = hub.runtime.new_stream(hub.device)     # the communication stream

    def connect(self, deadline: float) -> None:
        pass

    def start(self, ops) -> _Batch:
        hub, runtime = self.hub, self.hub.runtime
        if hub.aborted:
            raise RuntimeError("loopback communicator was aborted")
        ready = runtime.record(self.stream)
        batch, receives = _Batch(), []
        with hub._cond:
            for is_send, tensor, peer in ops:
                if is_send:
                    entry = _Send(tensor, ready)
                    hub._mail[(self.rank, peer)].append(entry)
                    batch.sends.append(entry)
                else:
                    receives.append((tensor, peer))
            hub._cond.notify_all()
        while receives:                   # each as soon as its sender has enqueued it
            hub._until(lambda: any(hub._mail[(peer, self.rank)] for _, peer in receives),
                       f"rank {self.rank}'s receive from ranks {[peer for _, peer in receives]}")
            with hub._cond:
                index = next(i for i, (_, peer) in enumerate(receives) if hub._mail[(peer, self.rank)])
                tensor, peer = receives.pop(index)
                entry = hub._mail[(peer, self.rank)].popleft()
            if (entry.tensor.numel(), entry.tensor.dtype) != (tensor.numel(), tensor.dtype):
                raise RuntimeError(f"loopback: rank {peer} sent {entry.tensor.numel()} x {entry.tensor.dtype} "
                                   f"to rank {self.rank}, which receives {tensor.numel()} x {tensor.dtype}")
            runtime.wait(self.copy_stream, ready)
            runtime.wait(self.copy_stream, entry.ready)
            source = entry.tensor
            runtime.launch(self.copy_stream, lambda: tensor.copy_(source))
            copied = runtime.record(self.copy_stream)
            batch.copies.append(copied)
            with hub._cond:
                entry.copied = copied
                hub.copies += 1
                hub._cond.notify_all()
        return batch

    def join(self, batch: _Batch) -> None:
        """As NCCL's ``Work.wait()``: the stream ordered after the batch, and the batch's tensors
        let go (what keeps them alive until the device is done is ringcoll's business, as with
        NCCL, which releases them here)."""
        runtime = self.hub.runtime
        for entry in batch.sends:
            self.hub._until(lambda: entry.copied is not None, f"the receive of rank {self.rank}'s send")
            runtime.wait(self.stream, entry.copied)
            entry.tensor = None
        for copied in batch.copies:
            runtime.wait(self.stream, copied)

    def failed(self, batch: _Batch) -> Optional[BaseException]:
        return batch.error

    def abort(self) -> None:
        with self.hub._cond:
            self.hub.aborted = True
            self.hub._cond.notify_all()

    def close(self, how: str) -> None:
        pass


class LoopbackExecutor(P2PExecutor):
    """ringcoll's executor for one in-process rank of a :class:`Hub`: every device's calls take
    the stream-ordered path, over a :class:`LoopbackComm`."""

    def __init__(self, hub: Hub, rank: int):
        super().__init__(hub, rank=rank, world=hub.world, backend="loopback")
        self.comm = LoopbackComm(hub, rank)

    def stream_ordered(self, device: torch.device) -> bool:
        return True

    def _make_transport(self, device: torch.device) -> StreamTransport:
        transport = StreamTransport(self.comm, self.stream_runtime(device), device, watchdog(), private=False)
        self.comm.stream = transport.stream
        return transport


class Rank:
    """One in-process rank: its executor and its caller's stream (a thread's current stream
    while :meth:`current` is entered)."""

    def __init__(self, hub: Hub, rank: int):
        self.hub, self.rank, self.device = hub, rank, hub.device
        self.runtime = hub.runtime
        self.executor = LoopbackExecutor(hub, rank)
        self.caller = self.runtime.new_stream(self.device)
        self.seq = 0

    def current(self):
        """The caller's stream made the calling thread's current one."""
        if self.device.type == "cuda":
            return torch.cuda.stream(self.caller)
        return self.runtime.use(self.caller)

    def on_caller(self, fn: Callable[[], None]) -> None:
        """``fn``'s tensor work on the caller's stream (CUDA: with it current; emulated: launched
        on it)."""
        if self.device.type == "cuda":
            with torch.cuda.device(self.device), torch.cuda.stream(self.caller):
                fn()
        else:
            self.runtime.launch(self.caller, fn)

    def call(self, collective: str, *args, algorithm: str = "ring", async_op: bool = False, **kwargs):
        """One collective enqueued on this rank after its caller's stream: the InFlight call. The
        caller's stream is then ordered after the call's end (a synchronous call, as NCCL's; no
        host wait), or, with ``async_op``, only by :meth:`wait`."""
        from ringcoll.api import BUILDERS
        from ringcoll.api.common import Context

        plan = BUILDERS[collective](Context(self.rank, self.hub.world), *args, algorithm=algorithm, **kwargs)
        self.seq += 1
        with self.current():
            call = self.executor.execute(plan, self.seq)
        if not async_op:
            self.wait(call)
        return call

    def wait(self, call) -> None:
        """Order the caller's stream after ``call`` (``Work.wait()``'s part; the host goes on)."""
        self.runtime.wait(self.caller, call.done)

    def synchronize(self) -> None:
        """Block the host until the caller's stream has run everything enqueued on it."""
        self.runtime.synchronize(self.runtime.record(self.caller))

    def close(self) -> None:
        self.executor.close("shutdown")


def run_ranks(world: int, device, fn: Callable[[Rank], object], timeout: float = 60.0) -> list:
    """``fn(rank)`` on ``world`` in-process ranks at once, one thread each, on one :class:`Hub`
    over ``device``; every rank's result (an exception is raised once every thread ended, or
    a TimeoutError names the ranks still running after ``timeout`` seconds)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    hub = Hub(world, device, timeout)
    ranks = [Rank(hub, r) for r in range(world)]
    results: list = [None] * world
    errors: list = [None] * world

    def run(rank: Rank) -> None:
        try:
            with contextlib.ExitStack() as stack:
                if device.type == "cuda":
                    stack.enter_context(torch.cuda.device(device))
                stack.enter_context(torch.no_grad())
                results[rank.rank] = fn(rank)
        except BaseException as error:  # noqa: BLE001 - raised on the caller's thread
            errors[rank.rank] = error
            rank.executor.comm.abort()    # the others fail fast instead of waiting for it

    threads = [threading.Thread(target=run, args=(rank,), name=f"loopback-rank-{rank.rank}", daemon=True)
               for rank in ranks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [rank.rank for rank, thread in zip(ranks, threads) if thread.is_alive()]
    if hung:
        ranks[0].executor.comm.abort()
        raise TimeoutError(f"loopback ranks {hung} still running after {timeout:.0f} s")
    for rank in ranks:
        rank.close()
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return results
