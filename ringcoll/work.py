"""Work handles and the per-process queue that runs collectives in call order.

Every call goes through one queue, so collectives run in the order the program issued them
(the order every rank must agree on), whether they are synchronous or not. With nothing
pending, a synchronous call runs inline on the caller's thread; otherwise, and for
``async_op=True``, it runs on the worker thread and the caller gets a :class:`Work`.
"""
from __future__ import annotations

import datetime
import queue
import threading
from typing import Callable, Optional

import torch
import torch.distributed as dist


def _unwrap(future: torch.futures.Future):
    return future.wait()


def timeout_seconds(timeout) -> Optional[float]:
    """A wait's timeout in seconds, or None for none: torch's C++ callers pass timedelta(0)
    (kNoTimeout) and its options use negative values for "unset"."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return seconds if seconds > 0 else None


class Work(dist.Work):
    """A pending collective, as torch.distributed's Work: ``wait()`` completes it and
    re-raises its error (unlike a Work made by ``_create_work_from_future``, which loses it),
    ``wait(timeout)`` gives up after ``timeout`` and ``get_future()`` resolves to the result.

    ``Future.set_exception`` stores the error as a value only Python unwraps, so C++ holders
    (DDP's reducer) would see success; the future handed out is a ``then`` of the one
    completed here, whose callback re-raises: that makes the error a real C++ future error."""

    def __init__(self, result=None):
        super().__init__()
        self._base: torch.futures.Future = torch.futures.Future()
        self._future: torch.futures.Future = self._base.then(_unwrap)
        self._done = threading.Event()
        self._result = result
        self._error: Optional[BaseException] = None

    def _finish(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        if error is None:
            self._base.set_result(self._result)
        else:
            self._base.set_exception(error)
        self._done.set()

    def wait(self, timeout=None) -> bool:
        seconds = timeout_seconds(timeout)
        if not self._done.wait(seconds):
            raise RuntimeError(f"ringcoll: Work.wait timed out after {seconds:g} s; the collective "
                               f"has not completed")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()


class _Queue:
    def __init__(self):
        self._lock = threading.Lock()
        self._pending = 0
        self._tasks: "queue.Queue[tuple[Callable[[], None], Work]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def _worker(self) -> None:
        while True:
            task, work = self._tasks.get()
            try:
                task()
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits
                work._finish(error)
            else:
                work._finish()
            with self._lock:
                self._pending -= 1

    def submit(self, task: Callable[[], None], async_op: bool, result=None) -> Optional[Work]:
        with self._lock:
            inline = not async_op and self._pending == 0
            if not inline:
                self._pending += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._worker, name="ringcoll", daemon=True)
                    self._thread.start()
        if inline:
            task()
            return None
        work = Work(result)
        self._tasks.put((task, work))
        if async_op:
            return work
        work.wait()
        return None


_queue = _Queue()


def submit(task: Callable[[], None], async_op: bool, result=None) -> Optional[Work]:
    """Run ``task`` in call order: now, or as a Work when ``async_op``."""
    return _queue.submit(task, async_op, result)
