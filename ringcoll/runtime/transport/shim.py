"""NCCL's communicator (:class:`NcclComm`: one coalesced batch per step on a real
ProcessGroupNCCL or ProcessGroup, set up eagerly with a deadline) and its gloo stand-in
(:class:`NcclShim`: NCCL's semantics over a gloo group, so the NCCL paths run without a GPU)."""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .base import NCCL_DTYPES, _remaining, close_gloo, poll


_SETUP_TIMEOUT = ("Timed out waiting for NCCL's communicator set-up (every rank of the group joins it "
                  "at its first call on the device)")


class NcclComm:
    """An NCCL group (a registered ProcessGroup or a raw ProcessGroupNCCL) as batches."""

    def __init__(self, pg, device: torch.device):
        self.pg, self.device = pg, device
        # c10d's two bindings differ: a registered ProcessGroup coalesces per device type
        # (``_start_coalescing(device)``), a raw Backend (``dist.ProcessGroupNCCL`` itself, the
        # "ringcoll" backend's inner group) takes no argument and refuses one with a TypeError
        self._coalescing_args = (device,) if isinstance(pg, torch.distributed.ProcessGroup) else ()

    def connect(self, deadline: float) -> None:
        """Create the communicator now, on every rank of the group (each calls this in its
        first call on the group), so no rank is left blocked in NCCL's lazy set-up by a peer
        whose first operation has no transfers: eagerly where the backend can, else by a
        one-element all-reduce, polled until ``deadline``. The eager set-up blocks until every
        rank has joined it, so it runs on a helper thread that the host waits for until
        ``deadline`` only: a rank that never comes is a TimeoutError (the group aborted), not a
        hang."""
        backend = self.pg._get_backend(self.device) if hasattr(self.pg, "_get_backend") else self.pg
        connect = getattr(backend, "eager_connect_single_device", None)
        if connect is not None:
            done, errors = threading.Event(), []

            def run():
                try:
                    connect(self.device)
                except BaseException as error:  # noqa: BLE001 - handed to the host below
                    errors.append(error)
                done.set()

            threading.Thread(target=run, name="ringcoll-nccl-connect", daemon=True).start()
            if not done.wait(max(deadline - time.monotonic(), 0.0)):
                self.abort()
                raise TimeoutError(_SETUP_TIMEOUT)
            if not errors:
                return
            if not isinstance(errors[0], RuntimeError) or _is_nccl(backend):
                # ProcessGroupNCCL always has the eager connect: its error is NCCL's own, reported
                # as itself (a lazy set-up behind it would block in the store past the deadline
                # and call a real NCCL error a timeout)
                raise errors[0]
            # not supported by this build (a group standing in for NCCL): post a collective
        work = self.pg.allreduce([torch.zeros(1, device=self.device)])
        if not poll(work, deadline):
            self.abort()
            raise TimeoutError(_SETUP_TIMEOUT)
        work.wait()

    def batch(self, ops: Sequence) -> object:
        """``ops``: (is_send, bytes, peer); one Work for the whole batch."""
        self.pg._start_coalescing(*self._coalescing_args)
        try:
            for is_send, tensor, peer in ops:
                (self.pg.send if is_send else self.pg.recv)([tensor], peer, 0)
        finally:
            work = self.pg._end_coalescing(*self._coalescing_args)
        return work

    # the stream-ordered path (ringcoll.runtime.transport.stream_ordered): both called with ringcoll's
    # stream current
    def start(self, ops: Sequence) -> object:
        """Post a step's batch: NCCL enqueues it on its own stream, after the current one."""
        return self.batch(ops)

    def join(self, work) -> None:
        """Order the current stream after the batch (NCCL's ``wait()``: the host goes on)."""
        work.wait()

    def failed(self, work) -> Optional[BaseException]:
        """The batch's error, once NCCL has reported one (never blocks)."""
        try:
            return work.exception() if work.is_completed() else None
        except Exception as error:  # noqa: BLE001 - is_completed raises a failed work's error
            return error

    def abort(self) -> None:
        self.close("abort")

    def close(self, how: str) -> None:
        """``shutdown`` or ``abort`` the group (best effort: it is failed or done either way)."""
        try:
            getattr(self.pg, how)()
        except Exception:  # noqa: BLE001
            pass


class _ShimWork:
    """One Work for a batch of gloo transfers, with NCCL's wait(): it does not block the host
    (it would only order a stream); it raises once the batch has failed. gloo's own works only
    learn of their completion inside a blocking wait (and a wait that times out tears the
    pair's connection down), so the shim's one waiter thread waits on them, batch by batch."""

    def __init__(self, works):
        self._works = works
        self._done = threading.Event()
        self._error: Optional[BaseException] = None

    def _settle(self) -> None:
        try:
            for work in self._works:
                work.wait()
        except BaseException as error:  # noqa: BLE001 - kept for wait()
            self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout=None) -> bool:
        if self._done.is_set() and self._error is not None:
            raise self._error
        return True


class NcclShim:
    """NCCL's semantics on a gloo group with CPU tensors (see the module docstring). Every
    message carries the one tag SHIM_TAG, as NCCL matches by order alone; set-up is a
    collective at the rank's first operation, as NCCL's lazy communicator creation."""

    SHIM_TAG = 0x3FFFFFF0

    def __init__(self, pg):
        self.pg = pg
        self.connected = False
        self.aborted = False
        self.log: list = []              # what happened, for tests: ("connect"|"batch"|"abort", ...)
        self._pending: "queue.Queue[_ShimWork]" = queue.Queue()
        self._waiter: Optional[threading.Thread] = None

    def connect(self, deadline: float = None) -> None:
        if not self.connected:
            self.log.append(("connect",))
            work = self.pg.allreduce([torch.zeros(1)])
            try:
                work.wait(timedelta(seconds=_remaining(deadline)) if deadline is not None else timedelta(0))
            except RuntimeError as error:
                raise TimeoutError(f"Timed out waiting for the communicator set-up (a collective of every "
                                   f"rank of the group, at its first operation): {error}") from error
            self.connected = True

    def batch(self, ops: Sequence) -> _ShimWork:
        if self.aborted:
            raise RuntimeError("NCCL communicator was aborted")
        self.connect()                     # NCCL: a lazy set-up every rank must join (the
                                           # batched transport connects first, with a deadline)
        for _, tensor, _ in ops:
            if tensor.dtype not in NCCL_DTYPES:
                raise RuntimeError(f"Input tensor data type is not supported for NCCL process group: "
                                   f"{_c10_name(tensor.dtype)}")
        self.log.append(("batch", tuple((is_send, peer, t.numel()) for is_send, t, peer in ops)))
        work = _ShimWork([(self.pg.send if is_send else self.pg.recv)([tensor], peer, self.SHIM_TAG)
                          for is_send, tensor, peer in ops])
        if self._waiter is None:
            self._waiter = threading.Thread(target=self._wait_all, name="ringcoll-shim", daemon=True)
            self._waiter.start()
        self._pending.put(work)
        return work

    def _wait_all(self) -> None:
        while True:
            self._pending.get()._settle()

    def abort(self) -> None:
        """NCCL's abort: nothing more is posted, and the gloo group's connections are closed
        (:func:`close_gloo`), which fails this rank's waits still blocked and the peers' on it
        at once, as an aborted communicator's transfers end. Once; a private group never made
        has no connections."""
        if self.aborted:
            return
        self.aborted = True
        self.log.append(("abort",))
        if getattr(self.pg, "made", True):
            self._closed = close_gloo(self.pg)


def _c10_name(dtype: torch.dtype) -> str:
    return {torch.int16: "Short", torch.uint16: "UInt16", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble"}.get(dtype, str(dtype))


def _is_nccl(backend) -> bool:
    """Whether ``backend`` is torch's ProcessGroupNCCL (absent from CPU builds of torch)."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    return isinstance(nccl, type) and isinstance(backend, nccl)
