"""The watchdog of stream-ordered calls: one thread per process instead of per-step host polls.

A call on the stream-ordered path (:mod:`ringcoll.runtime.transport.stream`) returns to its caller once
enqueued; nothing on the host waits for its steps. This thread reads, without blocking, the end
event of each step of every call in flight, and gives each step the call's per-step timeout,
counted from when it saw the step before it end (the first step's clock starts when the call
before it on the same stream ended, or when the call was enqueued). Past a step's deadline, or
when a step's batch failed, it hands the call to its executor, which builds the PeerError
naming the call, the step and the peers, marks the group failed and aborts the transport's
private communicator (never the user's groups); the queued calls behind it on that stream fail
with it. The next call on the group, or ``wait()`` on a failed call's Work, raises.

Completed calls release the tensors they held (the stream used them until their end event).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import deque
from typing import Dict, Optional

#: how often the thread reads the events of the calls in flight
PERIOD = 0.005


class Watchdog:
    def __init__(self, period: float = PERIOD):
        self.period = period
        self._queues: Dict[int, deque] = {}      # id(transport) -> its calls, in stream order
        self._lock = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self.failures = 0

    def watch(self, call) -> None:
        """Watch ``call`` (an InFlight with its steps' events and its end event)."""
        with self._lock:
            queue = self._queues.setdefault(id(call.transport), deque())
            if not queue:
                call.clock = time.monotonic()
            queue.append(call)
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
                while not any(self._queues.values()):
                    self._lock.wait()
                queues = [(key, queue) for key, queue in self._queues.items() if queue]
            for key, queue in queues:
                self._advance(queue)
            with self._lock:
                for key in [key for key, queue in self._queues.items() if not queue]:
                    del self._queues[key]
            time.sleep(self.period)

    def _advance(self, queue: deque) -> None:
        """Move the head call of one stream on as far as its events say; fail it past its
        step's deadline or on its batch's error."""
        while queue:
            call = queue[0]
            runtime = call.transport.runtime
            now = time.monotonic()
            index, clock = call.index, call.clock
            if clock is None:
                clock = call.clock = now
            while index < len(call.steps):
                step = call.steps[index]
                if step.error is None and step.work is not None:
                    step.error = call.transport.comm.failed(step.work)
                if step.error is not None:
                    self._fail(queue, call, index, step.error, timed_out=False)
                    return
                if not runtime.query(step.event):
                    break
                if step.error is not None:    # set before the step's end event: seen above next
                    continue
                index += 1
                clock = now
            call.index, call.clock = index, clock
            if index == len(call.steps) and runtime.query(call.done):
                queue.popleft().settle(call.error)    # a local operation's error, if any
                if queue:
                    queue[0].clock = now
                continue
            if now - clock > call.timeout:
                self._fail(queue, call, index, TimeoutError(
                    "the step did not complete within the timeout (watchdog); ringcoll's private "
                    "communicator was aborted"), timed_out=True)
            return

    def _fail(self, queue: deque, call, index: int, error: BaseException, timed_out: bool) -> None:
        from .transport import TransferError

        self.failures += 1
        items = call.steps[index].items if index < len(call.steps) else []
        step = call.steps[index].index if index < len(call.steps) and call.steps[index].index is not None else index
        failure = TransferError(items, error, timed_out=timed_out, batch=True)
        failure.step = step
        queue.popleft()
        verdict = call.on_failure(call, failure) if call.on_failure is not None else failure
        call.transport.abort()           # ringcoll's private communicator: the stream goes on
        call.settle(verdict)
        while queue:                     # the calls behind it on the stream fail with it
            queue.popleft().settle(verdict)


@functools.lru_cache(maxsize=None)
def watchdog() -> Watchdog:
    """The process's watchdog."""
    return Watchdog()
