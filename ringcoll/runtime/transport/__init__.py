"""Transports: how the P2P executor moves one step's transfers.

Every transfer moves bytes (a ``uint8`` view of its chunk), so every dtype travels on every
transport, int16 included, which NCCL refuses and gloo's own collectives lack.

- :class:`HostTransport` (gloo): one tagged ``send``/``recv`` per message, waited on with the
  step's deadline. CUDA tensors are staged through pinned host buffers that are reused across
  steps and calls, copied with non-blocking copies ordered by events.
- :class:`BatchedTransport` (NCCL): one batch (one coalesced group of sends and receives) per
  step and one Work per batch; no host staging. NCCL's ``wait()`` only orders the current
  stream, so the transport blocks the host by polling ``is_completed()`` until the step's
  deadline, then aborts the communicator: a dead peer is a :class:`TransferError` within the
  timeout, never a watchdog kill minutes later. Tags are ignored (NCCL matches messages by
  posting order per pair); see the executor for what isolates calls there.

``RINGCOLL_TRANSPORT=batched`` runs the batched transport on a gloo group with CPU tensors,
through :class:`NcclShim`, which reproduces NCCL's semantics (one Work per batch, a
``wait()`` that does not block the host, tags ignored, NCCL's dtype list, communicator set-up
at a rank's first operation), so everything but the NCCL calls themselves runs on a CPU-only
machine.

:data:`streams` is the one place ringcoll touches CUDA devices, streams and events; tests
swap in a fake that records which thread, device and stream each operation used.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from datetime import timedelta
from typing import List, Optional, Sequence

import torch

from ...schedules.vocabulary import Recv, Send

#: the dtypes ProcessGroupNCCL accepts (torch's getNcclDataType): no int16, uint16, complex ...
NCCL_DTYPES = frozenset({
    torch.int8, torch.uint8, torch.int32, torch.uint32, torch.int64, torch.uint64, torch.bool,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.float8_e4m3fn, torch.float8_e5m2,
})


class TransferError(RuntimeError):
    """Transfers of one step failed or timed out; ``items`` are the Send/Recv concerned (a
    batch fails as a whole: NCCL cannot say which of its transfers broke)."""

    def __init__(self, items: Sequence, error: BaseException, *, timed_out: bool, batch: bool = False):
        super().__init__(str(error))
        self.items, self.error, self.timed_out, self.batch = list(items), error, timed_out, batch


class CudaStreams:
    """CUDA devices, streams, events and pinned memory, as ringcoll uses them."""

    def current(self, device: torch.device):
        return torch.cuda.current_stream(device)

    @contextlib.contextmanager
    def use(self, device: torch.device, stream):
        with torch.cuda.device(device), torch.cuda.stream(stream):
            yield

    def record(self, device: torch.device, stream=None):
        event = torch.cuda.Event()
        event.record(stream if stream is not None else torch.cuda.current_stream(device))
        return event

    def wait_event(self, device: torch.device, event) -> None:
        """Order the calling thread's current stream after ``event`` (no host block)."""
        torch.cuda.current_stream(device).wait_event(event)

    def synchronize(self, event) -> None:
        event.synchronize()

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


streams = CudaStreams()


def wire(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat contiguous chunk. A chunk of 0 or 1 elements is contiguous whatever
    its stride (a one-element block of a strided tensor keeps stride 2, say), and ``view``
    refuses such a stride for a change of element size: re-stride it first. Bytes (a
    prepared plan's transfers) are their own wire."""
    if tensor.dtype is torch.uint8:
        return tensor
    if tensor.numel() <= 1 and tensor.dim() > 0 and tensor.stride(-1) != 1:
        tensor = tensor.as_strided((tensor.numel(),), (1,))
    return tensor.view(torch.uint8)


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


# -- gloo ---------------------------------------------------------------------------------
class _Staging:
    """Pinned host buffers for CUDA tensors on gloo, reused across steps and calls. A buffer
    goes back to the pool with the event of its last asynchronous copy; whoever takes it next
    waits for that event before writing into it."""

    def __init__(self):
        self._free: List[list] = []       # [buffer, event or None]

    def take(self, nbytes: int) -> list:
        for index, entry in enumerate(self._free):
            if entry[0].numel() >= nbytes:
                return self._free.pop(index)
        if self._free:                    # grow the smallest one rather than keep many
            self._free.sort(key=lambda e: e[0].numel())
            entry = self._free.pop(0)
            if entry[1] is not None:
                streams.synchronize(entry[1])
        return [streams.pinned(max(nbytes, 1)), None]

    def give(self, entry: list) -> None:
        self._free.append(entry)


class _HostStep:
    __slots__ = ("transfers", "staging")

    def __init__(self):
        self.transfers: list = []         # (item, work, device bytes, host bytes)
        self.staging = None


class HostTransport:
    """gloo: one tagged message per transfer; see the module docstring."""

    batched = False

    def __init__(self, pg, *, stage: bool = False):
        self.pg = pg
        self.stage = stage
        self._staging = _Staging()

    def ready(self, deadline: float) -> None:
        """gloo connects lazily per pair; nothing to set up."""

    def post(self, transfers: Sequence, tag: int) -> _HostStep:
        """``transfers``: (Send|Recv item, bytes: a flat uint8 view, see :func:`wire`).
        Returns the step's handle."""
        if self.stage:
            return self._post_staged(transfers, tag)
        handle = _HostStep()
        send, recv, posted = self.pg.send, self.pg.recv, handle.transfers
        for item, data in transfers:
            try:
                work = (send if type(item) is Send else recv)([data], item.peer, tag)
            except Exception as error:  # noqa: BLE001 - the executor names the peer and step
                raise TransferError([item], error, timed_out=False) from error
            posted.append((item, work, data, data))
        return handle

    def _post_staged(self, transfers: Sequence, tag: int) -> _HostStep:
        """CUDA tensors: sends copied into a pinned host buffer first, receives land there."""
        handle = _HostStep()
        total = sum(t.numel() * t.element_size() for _, t in transfers)
        handle.staging = entry = self._staging.take(total)
        if entry[1] is not None:
            streams.synchronize(entry[1])          # its last copy out has finished
            entry[1] = None
        hosts, offset, copied = [], 0, False
        for item, tensor in transfers:
            nbytes = tensor.numel() * tensor.element_size()
            hosts.append(entry[0][offset:offset + nbytes])
            offset += nbytes
            if type(item) is Send:
                hosts[-1].copy_(wire(tensor), non_blocking=True)
                copied = True
        if copied:                                  # gloo reads host memory at once
            streams.synchronize(streams.record(transfers[0][1].device))
        for (item, tensor), host in zip(transfers, hosts):
            try:
                if type(item) is Send:
                    work = self.pg.send([host], item.peer, tag)
                else:
                    work = self.pg.recv([host], item.peer, tag)
            except Exception as error:  # noqa: BLE001 - the executor names the peer and step
                self.release(handle)
                raise TransferError([item], error, timed_out=False) from error
            handle.transfers.append((item, work, wire(tensor), host))
        return handle

    def wait(self, handle: _HostStep, deadline: float) -> None:
        """Wait for the step's transfers until ``deadline``. On a timeout the error names the
        transfer that ran out first and every other one of the step still incomplete then
        (each probed for a millisecond): the peers this rank was actually waiting on, not
        only the first in posting order."""
        try:
            for index, (item, work, _, _) in enumerate(handle.transfers):
                try:
                    work.wait(timedelta(seconds=_remaining(deadline)))
                except Exception as error:  # noqa: BLE001
                    timed_out = "timed out" in str(error).lower() or time.monotonic() >= deadline
                    items = [item] + (self._incomplete(handle.transfers[index + 1:]) if timed_out else [])
                    raise TransferError(items, error, timed_out=timed_out) from error
            if self.stage:
                copied = False
                for item, _, device_bytes, host in handle.transfers:
                    if type(item) is Recv:
                        device_bytes.copy_(host, non_blocking=True)
                        copied = True
                if copied:
                    handle.staging[1] = streams.record(handle.transfers[0][2].device)
        finally:
            self.release(handle)

    @staticmethod
    def _incomplete(transfers) -> list:
        """The items of ``transfers`` that do not complete within a millisecond (gloo's works
        learn of their completion only inside a wait; the step has failed, so a probe that
        times out costs nothing more)."""
        pending = []
        for item, work, _, _ in transfers:
            try:
                work.wait(timedelta(milliseconds=1))
            except Exception:  # noqa: BLE001 - still waiting, or failed: either way not done
                pending.append(item)
        return pending

    def release(self, handle: _HostStep) -> None:
        if handle.staging is not None:
            self._staging.give(handle.staging)
            handle.staging = None

    def abort(self) -> None:
        """gloo tears a pair's connection down when a wait on it times out; nothing more."""


# -- NCCL ---------------------------------------------------------------------------------
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
            if not isinstance(errors[0], RuntimeError):
                raise errors[0]
            # not supported by this build: post a collective
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

    # the stream-ordered path (ringcoll.runtime.transport.stream): both called with ringcoll's
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

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - NCCL: orders a stream, never blocks
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
        self.aborted = True
        self.log.append(("abort",))


def _c10_name(dtype: torch.dtype) -> str:
    return {torch.int16: "Short", torch.uint16: "UInt16", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble"}.get(dtype, str(dtype))


def poll(work, deadline: float, pause: float = 20e-6, longest: float = 1e-3) -> bool:
    """Block the host until ``work`` completes (True) or ``deadline`` passes (False), polling
    ``is_completed()`` with a pause that doubles from 20 us to 1 ms."""
    while not work.is_completed():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, longest)
    return True


class BatchedTransport:
    """NCCL-shaped: one batch per step; see the module docstring."""

    batched = True

    def __init__(self, comm):
        self.comm = comm
        self._ready = False

    def ready(self, deadline: float) -> None:
        """Set the communicator up (see NcclComm.connect); TimeoutError after ``deadline``."""
        if not self._ready:
            self.comm.connect(deadline)
            self._ready = True

    def post(self, transfers: Sequence, tag: int):   # noqa: ARG002 - NCCL ignores tags
        items = [item for item, _ in transfers]
        ops = [(isinstance(item, Send), wire(tensor), item.peer) for item, tensor in transfers]
        try:
            return items, self.comm.batch(ops)
        except Exception as error:  # noqa: BLE001
            raise TransferError(items, error, timed_out=False, batch=True) from error

    def wait(self, handle, deadline: float) -> None:
        items, work = handle
        if not poll(work, deadline):
            self.comm.abort()
            raise TransferError(items, TimeoutError("the batch did not complete within the timeout; "
                                                    "the communicator was aborted"),
                                timed_out=True, batch=True)
        try:
            work.wait()                   # NCCL: orders the current stream; raises a failure
        except Exception as error:  # noqa: BLE001
            self.comm.abort()
            raise TransferError(items, error, timed_out=False, batch=True) from error

    def release(self, handle) -> None:
        pass

    def abort(self) -> None:
        self.comm.abort()
