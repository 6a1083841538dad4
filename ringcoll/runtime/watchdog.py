"""The watchdog of stream-ordered calls: one thread per process instead of per-step host polls.

A call on the stream-ordered path (:mod:`ringcoll.runtime.transport.stream_ordered`) returns to its caller once
enqueued; nothing on the host waits for its steps. This thread reads, without blocking, the end
event of each step of every call in flight, and gives each step the call's per-step timeout,
counted from when it saw the step before it end (the first step's clock starts when the call
before it on the same stream ended, or when the call was enqueued). Past a step's deadline, or
when a step's batch failed, it hands the call to its executor, which builds the PeerError
naming the call, the step and the peers, marks the group failed and aborts the transport's
private communicator (never the user's groups); the queued calls behind it on that stream fail
with it. The next call on the group, or ``wait()`` on a failed call's Work, raises.

Completed calls release the tensors they held (the stream used them until their end event).

It cannot die, as torch's own NCCL watchdog (ProcessGroupNCCL's ``watchdogHandler``) cannot:

- each call's advance is guarded: an exception while reading a call's events (a sticky CUDA
  error, an event query refused) fails that call's group through its executor, naming the call,
  and the thread goes on with the other calls;
- it reads events under the call's device and a thread-local *relaxed* stream-capture mode
  (``runtime.watching``): a CUDA graph captured meanwhile on another thread in the global mode
  would otherwise make ``cudaEventQuery`` fail and invalidate that capture;
- it never blocks in an abort: the transport's abort runs on a thread of its own
  (ProcessGroupNCCL's ``abort()`` can block up to the group's timeout);
- it destroys no event: step events go back to the runtime's pool for reuse, and the last
  reference to a finished call is dropped on an enqueuing thread, not here (``cudaEventDestroy``
  can hang, which torch's watchdog avoids with an event cache).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import deque
from typing import Dict, Optional

from .failures import NOTICE_EVERY

#: how often the thread reads the events of the calls in flight
PERIOD = 0.005


class Watchdog:
    def __init__(self, period: float = PERIOD):
        self.period = period
        self._queues: Dict[int, deque] = {}      # id(transport) -> its calls, in stream order
        self._lock = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._finished: list = []                # calls the thread finished with this round
        self._released: list = []                # ... in an earlier round (see watch)
        self.failures = 0
        self.errors = 0                          # calls failed by an exception of the watchdog's own

    def watch(self, call) -> None:
        """Watch ``call`` (an InFlight with its steps' events and its end event)."""
        with self._lock:
            queue = self._queues.setdefault(id(call.transport), deque())
            if not queue:
                call.clock = time.monotonic()
            queue.append(call)
            # the last references to calls the thread finished with go here, on the
            # enqueuing thread: their events are never destroyed on the watchdog's (only those
            # of earlier rounds, which no frame of the thread refers to any more)
            self._released = []
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ringcoll-watchdog", daemon=True)
                self._thread.start()
            self._lock.notify()

    def in_flight(self) -> int:
        with self._lock:
            return sum(len(queue) for queue in self._queues.values())

    def _run(self) -> None:
        while True:
            with self._lock:
                self._released.extend(self._finished)
                self._finished = []
                while not any(self._queues.values()):
                    self._lock.wait()
                queues = [(key, queue) for key, queue in self._queues.items() if queue]
            for _key, queue in queues:
                self._advance(queue)
            with self._lock:
                for key in [key for key, queue in self._queues.items() if not queue]:
                    del self._queues[key]
            time.sleep(self.period)

    def _advance(self, queue: deque) -> None:
        """Move the head call of one stream on as far as its events say, under the call's
        device and a relaxed capture mode; an exception of its own fails that call (its group,
        through the executor) and leaves the other calls watched."""
        while queue:
            call = queue[0]
            try:
                with call.transport.runtime.watching(call.transport.device):
                    moved = self._step(queue, call)
            except Exception as error:  # noqa: BLE001 - the watchdog must not die
                self.errors += 1
                if not queue or queue[0] is not call:     # already settled or failed
                    return
                self._fail(queue, call, call.index, RuntimeError(
                    f"the watchdog could not read the progress of {call.name}: {type(error).__name__}: "
                    f"{error}; its group is failed"), timed_out=False)
                return
            if not moved:
                return

    def _step(self, queue: deque, call) -> bool:
        """One look at ``call``, the head of its stream: True when it completed (the next call
        is then looked at), False when it is still running or has just failed."""
        runtime, comm = call.transport.runtime, call.transport.comm
        now = time.monotonic()
        index, clock = call.index, call.clock
        if clock is None:
            clock = call.clock = now
        while index < len(call.steps):
            step = call.steps[index]
            if step.error is None and step.work is not None:
                step.error = comm.failed(step.work)
            if step.error is not None:
                self._fail(queue, call, index, step.error, timed_out=False)
                return False
            if not runtime.query(step.event):
                break
            if step.error is None and step.work is not None:
                step.error = comm.failed(step.work)   # set before the step's end event
            if step.error is not None:
                continue
            index += 1
            clock = now
        call.index, call.clock = index, clock
        if index == len(call.steps) and runtime.query(call.done):
            if call.error is not None:        # a local operation failed on the device
                self._fail(queue, call, index, call.error, timed_out=False, local=True)
                return False
            queue.popleft().settle()
            runtime.reuse([step.event for step in call.steps])
            self._finished.append(call)
            if queue:
                queue[0].clock = now
            return True
        transport = call.transport
        if now - clock > NOTICE_EVERY and now - getattr(transport, "polled", now) > NOTICE_EVERY:
            transport.polled = now
            notice = transport.peer_failed()
            if notice is not None:
                self._fail(queue, call, index, RuntimeError(
                    f"a rank failed the group before this step completed ({notice}); ringcoll's "
                    f"communicator was aborted"), timed_out=False)
                return False
        if now - clock > call.timeout:
            self._fail(queue, call, index, TimeoutError(
                "the step did not complete within the timeout (watchdog); ringcoll's private "
                "communicator was aborted"), timed_out=True)
        return False

    def _fail(self, queue: deque, call, index: int, error: BaseException, timed_out: bool,
              local: bool = False) -> None:
        """Fail ``call`` (and the calls behind it on its stream) with the executor's verdict;
        the transport's abort returns at once (its communicator's runs on a thread of its own)."""
        from .transport import TransferError

        self.failures += 1
        items = call.steps[index].items if index < len(call.steps) else []
        step = call.steps[index].index if index < len(call.steps) and call.steps[index].index is not None else index
        failure = TransferError(items, error, timed_out=timed_out, batch=True)
        failure.step, failure.local = step, local
        queue.popleft()
        verdict = failure
        try:
            if call.on_failure is not None:
                verdict = call.on_failure(call, failure)
        except Exception as reporting:  # noqa: BLE001 - the call fails all the same
            verdict = RuntimeError(f"ringcoll {call.name}: {failure} (and reporting it raised "
                                   f"{type(reporting).__name__}: {reporting})")
        try:
            call.transport.abort()       # ringcoll's private communicator: the stream goes on
        except Exception:  # noqa: BLE001 - the verdict stands; the group is failed either way
            pass
        call.settle(verdict)
        self._finished.append(call)
        while queue:                     # the calls behind it on the stream fail with it
            behind = queue.popleft()
            behind.settle(verdict)
            self._finished.append(behind)


@functools.lru_cache(maxsize=None)
def watchdog() -> Watchdog:
    """The process's watchdog."""
    return Watchdog()
