"""What every transport shares: NCCL's dtype list, the transfer error, the one place ringcoll
touches CUDA devices, streams and events (:data:`cuda_calls`), and a chunk's bytes on the wire."""
from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Sequence

import torch

from ..identity import CLOSE_TAG


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


class CudaCalls:
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


cuda_calls = CudaCalls()


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


def close_gloo(pg) -> object:
    """Close this rank's gloo connections of ``pg`` (a gloo group of world >= 2), so that every
    peer waiting on this rank fails at once ("Connection closed by peer") instead of at its
    timeout. gloo has no call for it (``abort()``/``shutdown()`` leave receives already posted
    waiting, measured on torch 2.13), but a wait that times out makes gloo's context signal the
    error to every pair of the group, which closes their sockets: the very teardown a peer's
    timeout would cause a moment later. So: a receive no rank ever sends to (:data:`CLOSE_TAG`),
    waited on for a millisecond. Returns the receive's buffer, which the caller keeps (gloo
    holds its address). A failed group is never used again; a new group has connections of its
    own."""
    if pg.size() < 2:
        return None
    buffer = torch.empty(1, dtype=torch.uint8)
    try:
        pg.recv([buffer], (pg.rank() + 1) % pg.size(), CLOSE_TAG).wait(timedelta(milliseconds=1))
    except Exception:  # noqa: BLE001 - the timeout that closes the connections, or closed already
        pass
    return buffer


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


def poll(work, deadline: float, pause: float = 20e-6, longest: float = 1e-3, give_up=None,
         every: float = 0.25) -> bool:
    """Block the host until ``work`` completes (True) or ``deadline`` passes (False), polling
    ``is_completed()`` with a pause that doubles from 20 us to 1 ms. ``give_up``: asked every
    ``every`` seconds while the work is incomplete (never in a step that completes sooner); a
    true answer ends the wait at once (False)."""
    start = time.monotonic()
    asked = start + every
    while not work.is_completed():
        now = time.monotonic()
        if now >= deadline:
            return False
        if give_up is not None and now >= asked:
            if give_up():
                return False
            asked = now + every
        time.sleep(pause)
        pause = min(pause * 2, longest)
    return True
