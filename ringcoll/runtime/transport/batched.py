"""The batched transport (NCCL's shape, polled by the host): one batch and one Work per step,
``is_completed()`` polled until the step's deadline (``RINGCOLL_TRANSPORT=batched``)."""
from __future__ import annotations

from typing import Sequence

from ...schedules.vocabulary import Send
from .base import TransferError, poll, wire
from .interface import Transport


class BatchedTransport(Transport):
    """NCCL-shaped: one batch per step; see the module docstring."""

    batched = True

    def __init__(self, comm, notice=None):
        """``notice()``: the text a rank that failed the group left, or None (the executor's
        look at the group's store), asked while a step waits: a peer's failure ends the wait
        at once instead of at the deadline."""
        self.comm = comm
        self._ready = False
        self._notice = notice
        self._told = None

    def ready(self, deadline: float) -> None:
        """Set the communicator up (see NcclComm.connect); TimeoutError after ``deadline``."""
        if not self._ready:
            self.comm.connect(deadline)
            self._ready = True

    def post(self, transfers: Sequence, tag: int):
        items = [item for item, _ in transfers]
        ops = [(isinstance(item, Send), wire(tensor), item.peer) for item, tensor in transfers]
        try:
            return items, self.comm.batch(ops)
        except Exception as error:
            raise TransferError(items, error, timed_out=False, batch=True) from error

    def wait(self, handle, deadline: float) -> None:
        items, work = handle
        if not poll(work, deadline, give_up=self._gave_up if self._notice is not None else None):
            self.comm.abort()
            if self._told is not None:
                raise TransferError(items, RuntimeError(f"a rank failed the group before this batch completed "
                                                        f"({self._told}); the communicator was aborted"),
                                    timed_out=False, batch=True)
            raise TransferError(items, TimeoutError("the batch did not complete within the timeout; "
                                                    "the communicator was aborted"),
                                timed_out=True, batch=True)
        try:
            work.wait()                   # NCCL: orders the current stream; raises a failure
        except Exception as error:
            self.comm.abort()
            raise TransferError(items, error, timed_out=False, batch=True) from error

    def _gave_up(self) -> bool:
        self._told = self._notice()
        return self._told is not None

    def release(self, handle) -> None:
        pass

    def abort(self) -> None:
        self.comm.abort()
