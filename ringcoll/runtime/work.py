"""Work handles and the per-process queue that runs collectives in call order.

Every call goes through one queue, so collectives run in the order the program issued them
(the order every rank must agree on), whether they are synchronous or not. With nothing
pending, a synchronous call runs inline on the caller's thread; otherwise, and for
``async_op=True``, it runs on the worker thread and the caller gets a :class:`Work`.

A call on CUDA tensors that runs on the worker thread runs under the device and the current
stream its caller had when it submitted the call (torch's current stream is per thread, so
the worker would otherwise see device 0's default stream), and ``Work.wait()`` orders the
waiting thread's current stream after an event recorded at the end of the call, as NCCL's
``wait()`` does.

Calls on the stream-ordered path (CUDA tensors over NCCL, or the CPU emulator of it:
:mod:`ringcoll.runtime.transport.stream_ordered`) go through :func:`submit_stream` instead: the call is
enqueued on ringcoll's stream after an event of the caller's current stream, taken at submit,
and a :class:`StreamWork` stands for it, exactly as ProcessGroupNCCL's Work: a synchronous
call returns once enqueued with the caller's stream ordered after the call's end event,
``wait()`` orders the waiting thread's current stream after it (the host does not block, but
for a barrier), and ``get_future()`` is stream-aware (CUDA: ``Future(devices=[device])``,
completed in the stream's order; DDP's reducer and comm hooks chain on it).

**A callback that blocks never holds the worker.** A call is completed (its future set, its
``then()`` callbacks run, then ``wait()`` released) in the order the worker finished the calls:
by the worker itself when no earlier completion is still going on (the caller then wakes one
thread hop after the call's last transfer, as on gloo, not two), else by a completion thread.
A callback may make collective calls and wait for them, as torch's PowerSGD hook does inside
its ``then()`` chain. Before a callback blocks on ringcoll (it submits a call, or waits for a
Work or asks for the future of one not yet complete), its thread hands its role on: a
completion thread's to another completion thread; the worker's, when the callback runs on
the worker, to a new worker thread (the old one ends once its callback returns). So the nested
call runs and completes, and every later one, while the callback waits; callbacks still
start in completion order. A
callback that blocks on something else (a future taken before the callback ran, an event,
a lock) holds later completions back until it returns. A call made from a callback takes its
number where it is made, as a call from any thread: a program must order such calls the
same way on every rank (gloo takes its tags the same way). Calls never overlap: a
synchronous call run on its caller's thread holds the same turn as the worker's.
"""
from __future__ import annotations

import datetime
import queue
import threading
from typing import Callable, Optional

import torch
import torch.distributed as dist

from . import stream_runtime, transport


class WaitTimeout(RuntimeError):
    """``Work.wait(timeout)`` ran out before the call completed (the call itself goes on,
    bounded by its own step timeout)."""


def timeout_seconds(timeout) -> Optional[float]:
    """``wait``'s timeout in seconds, or None for no limit: None and ``timedelta(0)`` (what
    C++ callers pass) mean no timeout, as torch's."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return seconds if seconds > 0 else None


def _unwrap(future: torch.futures.Future):
    return future.wait()     # raises the stored error: the chained future fails for real


class Work(dist.Work):
    """A pending collective, as torch.distributed's Work.

    ``wait()`` completes it and re-raises its error. For C++ holders (DDP, the backend's
    callers) errors must be real future errors: ``Future.set_exception`` stores the error as a
    value that only Python unwraps, so :meth:`get_future` returns a future chained with a
    callback that re-raises (a raising callback fails the chained future in C++ too); it
    resolves to the result list (what DDP reads)."""

    def __init__(self, result=None, describe: str = ""):
        super().__init__()
        self._base: torch.futures.Future = torch.futures.Future()
        self._future: torch.futures.Future = self._base.then(_unwrap)
        self._result = result
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self._describe = describe
        self._event = None              # CUDA event recorded at the end (see _Queue)
        self._device = None

    def _finish(self, error: Optional[BaseException] = None) -> None:
        """Complete the call (on a completion thread, :class:`_Queue`): the futures first,
        then the event ``wait()`` blocks on, so that whoever returns from ``wait()`` finds
        ``get_future()`` done (its chained callback runs inside ``set_result``), as gloo's and
        NCCL's works guarantee."""
        self._error = error
        if error is None:
            self._base.set_result(self._result)
        else:
            self._base.set_exception(error)
        self._done.set()

    def wait(self, timeout=None) -> bool:
        """Block until the call completes (or ``timeout``, a timedelta, runs out: a
        :class:`WaitTimeout`); re-raise its error. ``timedelta(0)`` means no timeout."""
        seconds = timeout_seconds(timeout)
        if not self._done.is_set():
            _queue.hand_off()           # a callback about to block: later completions go on
        if not self._done.wait(seconds):
            raise WaitTimeout(f"ringcoll {self._describe or 'collective'}: Work.wait timed out after "
                              f"{seconds:g} s (the call is still running)")
        if self._error is not None:
            raise self._error
        if self._event is not None:
            transport.base.cuda_calls.wait_event(self._device, self._event)
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def get_future(self) -> torch.futures.Future:
        if not self._done.is_set():
            _queue.hand_off()           # a callback that may wait on it (Future.wait)
        return self._future

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()


#: per thread: whether it holds the completion role now (:meth:`_Queue.hand_off`)
_role = threading.local()
#: per thread: whether it is running a call now (then it holds the turn; a synchronous call made
#: from inside that call runs inline, as it did before there was a turn)
_running = threading.local()


class _Queue:
    """The per-process queue: one worker thread runs the calls in the order they were
    submitted, one at a time (a synchronous call made with nothing pending runs on its
    caller's thread instead, holding the same turn); they are completed in the order the
    worker finished them, by the worker itself when no earlier completion is under way
    (``_completing`` is 0), else by the completion threads (module docstring).

    ``_pending`` counts the calls submitted and not yet completed (queued, running, or
    waiting for or running their completion): a synchronous call runs inline only when it
    is 0, so every earlier call's future is done and its callbacks have returned, as
    before. Exactly one completion thread at a time holds the completion role (``_turn_to_complete``)
    and takes the next finished call; a thread that blocks inside a callback hands the role
    on first (:meth:`hand_off`), to an idle completion thread or a new one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = 0
        self._tasks: "queue.Queue[tuple[Callable[[], None], Work, object]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._turn = threading.Lock()                 # held while a call runs, wherever it runs
        self._finished: "queue.Queue[tuple[Work, Optional[BaseException]]]" = queue.Queue()
        self._turn_to_complete = threading.Lock()     # the completion role
        self._idle = 0                                # completion threads waiting for the role
        self._completing = 0                          # finished calls not yet completed
        self._completers = 0                          # completion threads started (for tests)

    def _start(self) -> None:
        """Start the worker and the first completion thread (under ``_lock``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="ringcoll", daemon=True)
            self._thread.start()
            self._start_completer()

    def _start_completer(self) -> None:
        self._completers += 1
        threading.Thread(target=self._completer, name=f"ringcoll-complete-{self._completers}",
                         daemon=True).start()

    def _worker(self) -> None:
        while self._thread is threading.current_thread():    # until a blocked callback replaced it
            task, work, stream = self._tasks.get()
            error = None
            with self._turn:
                _running.held = True
                try:
                    if stream is None:
                        task()
                    else:                       # the caller's device and stream, as it submitted
                        with transport.base.cuda_calls.use(work._device, stream):
                            task()
                            work._event = transport.base.cuda_calls.record(work._device, stream)
                except BaseException as failure:  # noqa: BLE001 - handed to whoever waits
                    error = failure
                finally:
                    _running.held = False
            with self._lock:
                direct = self._completing == 0       # no earlier completion still going on
                self._completing += 1
            if direct:
                self._complete(work, error, on_worker=True)
            else:
                self._finished.put((work, error))

    def _complete(self, work: Work, error: Optional[BaseException], on_worker: bool = False) -> None:
        """Complete ``work`` on this thread, holding the completion role (``on_worker``: the
        worker's own, :meth:`hand_off` then replaces the worker if a callback blocks)."""
        _role.held = True
        _role.worker = on_worker
        try:
            work._finish(error)
        finally:
            if _role.held and not on_worker:      # not handed on inside a callback
                self._turn_to_complete.release()
            _role.held = False
            with self._lock:
                self._completing -= 1
                self._pending -= 1

    def _completer(self) -> None:
        """A completion thread: while it holds the role, complete the next finished call."""
        while True:
            with self._lock:
                self._idle += 1
            self._turn_to_complete.acquire()
            with self._lock:
                self._idle -= 1
            work, error = self._finished.get()
            self._complete(work, error)

    def hand_off(self) -> None:
        """Called where the current thread may block on ringcoll: if it holds the completion
        role (it runs a callback), pass the role on, so the calls it waits for, and every later
        call, still run and complete: on the worker, the worker's role to a new worker thread
        (later completions go to the completion threads while this one is under way); on a
        completion thread, to an idle completion thread, or a new one. Nothing otherwise."""
        if not getattr(_role, "held", False):
            return
        _role.held = False
        if _role.worker:
            with self._lock:
                self._thread = threading.Thread(target=self._worker, name="ringcoll", daemon=True)
                self._thread.start()
            return
        with self._lock:
            if self._idle == 0:
                self._start_completer()
        self._turn_to_complete.release()

    def submit_work(self, task: Callable[[], None], work: Work) -> None:
        """Queue ``task`` for the worker, standing for ``work`` (which it completes itself)."""
        self.hand_off()
        with self._lock:
            self._pending += 1
            self._start()
        self._tasks.put((task, work, None))

    def submit(self, task: Callable[[], None], async_op: bool, result=None, *,
               device: Optional[torch.device] = None, describe: str = "") -> Optional[Work]:
        self.hand_off()
        if not async_op and getattr(_running, "held", False):
            task()                              # made from inside a running call: its turn
            return None
        if not async_op:
            with self._lock:
                inline = self._pending == 0
                if inline:
                    self._pending += 1          # a call submitted meanwhile queues behind this one
            if inline:
                # nothing pending: run now, on the caller's thread, holding the turn the worker
                # takes, so it can never overlap a call the worker runs (one submitted
                # meanwhile from a callback or another thread waits for it)
                try:
                    with self._turn:
                        _running.held = True
                        try:
                            task()
                        finally:
                            _running.held = False
                finally:
                    with self._lock:
                        self._pending -= 1
                return None
        with self._lock:
            self._pending += 1
            self._start()
        work = Work(result, describe)
        stream = None
        if device is not None and device.type == "cuda":
            work._device = device
            stream = transport.base.cuda_calls.current(device)
        self._tasks.put((task, work, stream))
        if async_op:
            return work
        work.wait()
        return None


_queue = _Queue()


def submit(task: Callable[[], None], async_op: bool, result=None, *,
           device: Optional[torch.device] = None, describe: str = "") -> Optional[Work]:
    """Run ``task`` in call order: now, or as a Work when ``async_op``. ``device``: the call's
    tensors' device; a CUDA call run on the worker thread runs under the caller's device and
    current stream (recorded here, at submit). A CUDA call under graph capture is refused
    (CUDA tensors over gloo: staging blocks the host, which capture forbids). Safe from inside
    a Work's future callback (module docstring)."""
    if device is not None and device.type == "cuda":
        _refuse_capture(stream_runtime.cuda(), device, describe)
    return _queue.submit(task, async_op, result, device=device, describe=describe)


def _refuse_capture(runtime, device: torch.device, describe: str) -> None:
    if runtime.capturing(device):
        from .transport.stream_ordered import refuse_capture

        raise refuse_capture(describe or "collective")


class StreamWork(Work):
    """A stream-ordered call (see the module docstring). ``wait()`` raises the call's error
    once the watchdog has reported it (a PeerError naming the call and the step); before that
    it orders the stream, as NCCL's. On memory the host reads at once (CPU tensors through the
    emulator, ``RINGCOLL_TRANSPORT=streamed``: ``runtime.host_reads``) there is no stream to
    order: ``wait()`` blocks the host until the call has ended, and raises its error."""

    def __init__(self, result, describe: str, runtime, device: torch.device, *, blocking: bool = False):
        super().__init__(result, describe)
        self._runtime, self._device, self._blocking = runtime, device, blocking
        self._call = None
        if runtime.stream_aware_futures:      # before any get_future(), even while queued
            self._base = runtime.new_future(device)
            self._future = self._base.then(_unwrap)

    def _enqueued(self, call) -> None:
        """The call is on the stream (``call``: its InFlight)."""
        self._call = call
        if self._runtime.stream_aware_futures:
            self._runtime.complete(self._base, call.transport.stream, self._result)
        else:
            call.when_settled(self._settled)
        self._done.set()

    def _settled(self, call) -> None:
        if call.failure is None:
            self._base.set_result(self._result)
        else:
            self._error = call.failure
            self._base.set_exception(call.failure)

    def _finish(self, error: Optional[BaseException] = None) -> None:
        """The enqueueing itself failed (on the host: bad state, a refused batch)."""
        if error is None:
            return
        self._error = error
        self._base.set_exception(error)
        self._done.set()

    def wait(self, timeout=None) -> bool:
        from time import monotonic

        seconds = timeout_seconds(timeout)
        start = monotonic()
        if not self._done.wait(seconds):          # queued behind a host call: until enqueued
            raise WaitTimeout(f"ringcoll {self._describe or 'collective'}: Work.wait timed out after "
                              f"{seconds:g} s (the call is still queued)")
        call = self._call
        if call is None:
            raise self._error
        if call.failure is not None:
            raise call.failure
        if self._blocking or self._runtime.host_reads(self._device):
            # a barrier, as NCCL's; CPU memory (the emulator's tensors as a user's), which the
            # caller reads at once: no stream of the caller's can be ordered after the call
            left = None if seconds is None else max(seconds - (monotonic() - start), 0.0)
            if not call.host_wait(left):
                raise WaitTimeout(f"ringcoll {self._describe or 'collective'}: Work.wait timed out after "
                                  f"{seconds:g} s (the call is still running)")
        else:
            self._runtime.wait(self._runtime.current(self._device), call.done)
        return True

    def is_completed(self) -> bool:
        call = self._call
        return self._error is not None or (call is not None and call.finished)

    def is_success(self) -> bool:
        call = self._call
        return call is not None and call.finished and call.failure is None

    def exception(self) -> Optional[BaseException]:
        call = self._call
        return self._error if call is None else call.failure


def submit_stream(task: Callable[[object], object], async_op: bool, result, runtime,
                  device: torch.device, describe: str = "", *, blocking: bool = False,
                  queued: bool = False) -> Optional[Work]:
    """Run a stream-ordered call in call order: ``task(caller)`` enqueues it after ``caller``
    (an event of the calling thread's current stream, recorded here) and returns its InFlight.
    Enqueued now when nothing is queued on the worker thread, else by the worker in its turn.
    A synchronous call returns once enqueued, its caller's stream ordered after it; with
    ``blocking`` (barrier), or on memory the host reads at once (CPU tensors), once it
    completed, its result written. ``queued``: enqueued by the worker even when nothing is
    queued (a call whose run first waits on its peers: ``Plan.late``)."""
    _refuse_capture(runtime, device, describe)
    caller = runtime.record(runtime.current(device))
    work = StreamWork(result, describe, runtime, device, blocking=blocking)
    if _queue._pending == 0 and not queued:
        if getattr(_running, "held", False):        # from inside a running call: its turn
            work._enqueued(task(caller))
        else:
            # the turn the worker's calls take: two threads enqueueing on the stream at once
            # never interleave their calls' batches (NCCL matches them by order)
            with _queue._turn:
                _running.held = True
                try:
                    work._enqueued(task(caller))
                finally:
                    _running.held = False
    else:
        _queue.submit_work(lambda: work._enqueued(task(caller)), work)
    if async_op:
        return work
    work.wait()
    return None
