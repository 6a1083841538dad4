"""The host transport (gloo): one tagged send or receive per message, waited on with the step's
deadline; CUDA tensors staged through reused pinned host buffers (see the package docstring)."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import List, Sequence

from ...schedules.vocabulary import Recv, Send
from . import base
from .base import TransferError, _remaining, close_gloo, wire
from .interface import Transport


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
                base.cuda_calls.synchronize(entry[1])
        return [base.cuda_calls.pinned(max(nbytes, 1)), None]

    def give(self, entry: list) -> None:
        self._free.append(entry)


class _HostStep:
    __slots__ = ("transfers", "staging")

    def __init__(self):
        self.transfers: list = []         # (item, work, device bytes, host bytes)
        self.staging = None


class HostTransport(Transport):
    """gloo: one tagged message per transfer (neither batched nor streamed: the interface's
    defaults); see the module docstring."""

    def __init__(self, pg, *, stage: bool = False):
        self.pg = pg
        self.stage = stage
        self._staging = _Staging()
        self._closed = None               # close_gloo's buffer, once the group has failed

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
            except Exception as error:
                raise TransferError([item], error, timed_out=False) from error
            posted.append((item, work, data, data))
        return handle

    def _post_staged(self, transfers: Sequence, tag: int) -> _HostStep:
        """CUDA tensors: sends copied into a pinned host buffer first, receives land there."""
        handle = _HostStep()
        total = sum(t.numel() * t.element_size() for _, t in transfers)
        handle.staging = entry = self._staging.take(total)
        if entry[1] is not None:
            base.cuda_calls.synchronize(entry[1])          # its last copy out has finished
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
            base.cuda_calls.synchronize(base.cuda_calls.record(transfers[0][1].device))
        for (item, tensor), host in zip(transfers, hosts):
            try:
                if type(item) is Send:
                    work = self.pg.send([host], item.peer, tag)
                else:
                    work = self.pg.recv([host], item.peer, tag)
            except Exception as error:
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
                except Exception as error:
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
                    handle.staging[1] = base.cuda_calls.record(handle.transfers[0][2].device)
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
        """The group failed on this rank: close its gloo connections (:func:`close_gloo`), so
        that the peers waiting on this rank fail now, not at their timeout. Once."""
        if self._closed is None:
            self._closed = close_gloo(self.pg) or True
