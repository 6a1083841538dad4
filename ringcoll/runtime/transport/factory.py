"""Which transport a group's calls on a device take, and making it: the one place that
chooses (the executor asks :func:`make_transport` and never builds one itself).

- CUDA tensors on a group whose CUDA backend is NCCL, or CPU tensors with
  ``RINGCOLL_TRANSPORT=streamed``: the stream-ordered transport over a private communicator
  (NCCL on the device; the emulator's gloo group on the CPU) — :func:`stream_ordered`;
- CPU tensors with ``RINGCOLL_TRANSPORT=batched``: the batched transport on the group itself,
  through the NCCL shim;
- anything else (gloo; CUDA tensors on gloo, staged through pinned host memory): the host
  transport.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from .. import stream_runtime
from .batched import BatchedTransport
from .host import HostTransport
from .interface import Transport
from .shim import NcclComm, NcclShim
from .stream_ordered import EmulatedNccl, StreamTransport, private_gloo, private_nccl, private_timeout


def stream_ordered(device: torch.device, device_backends: Dict[str, str], mode: str) -> bool:
    """Whether calls on ``device`` take the stream-ordered path, told without making its
    transport (which sets up a private communicator with every peer): CUDA tensors on a
    group with an NCCL backend (``device_backends``: device type -> backend name), CPU tensors
    with ``RINGCOLL_TRANSPORT=streamed`` (``mode``)."""
    return (device.type == "cuda" and device_backends.get("cuda") == "nccl") or \
        (device.type == "cpu" and mode == "streamed")


def runtime_for(device: torch.device) -> stream_runtime.StreamRuntime:
    """The streams and events of the stream-ordered path on ``device``: CUDA's, or the CPU's emulator."""
    return stream_runtime.cuda() if device.type == "cuda" else stream_runtime.emulated()


def make_transport(device: torch.device, group, *, device_backends: Dict[str, str], mode: str, store,
                   rank: int, world: int, seconds: float, notice: Callable[[], Optional[str]]) -> Transport:
    """The transport for ``group``'s calls on ``device`` (see the module docstring).
    ``store``: the group's store (None for a raw backend c10d does not know); ``seconds``: the
    group's step timeout; ``notice()``: the failure notice a rank left in the group's store,
    read by the polling transports while a step waits."""
    if stream_ordered(device, device_backends, mode):
        return _streamed(device, group, store, rank, world, seconds, notice)
    if device.type == "cpu" and mode == "batched":
        return BatchedTransport(NcclShim(group), notice=notice)
    return HostTransport(group, stage=device.type != "cpu")


def _streamed(device: torch.device, group, store, rank: int, world: int, seconds: float,
              notice) -> StreamTransport:
    """The stream-ordered transport for ``device`` over a private communicator made now
    (every rank makes it at the group's first call on this device): NCCL on a CUDA device,
    the emulator's gloo group on the CPU. A group whose store c10d does not give (a raw
    NCCL group built without one) shares its own communicator, as before."""
    from ... import kernels
    from ..watchdog import watchdog

    runtime = runtime_for(device)
    inner = private_timeout(seconds)
    if device.type == "cuda":
        pg = group if store is None else private_nccl(store, rank, world, inner, device)
        comm = NcclComm(pg, device)
        # the reduction kernels' availability probe compiles and runs once per process: here,
        # on this group's device at its first CUDA call, not inside a collective's schedule
        with runtime.on_device(device):
            kernels.backend_for(device)
    else:
        if store is None:
            raise ValueError("RINGCOLL_TRANSPORT=streamed needs a group whose store c10d knows (a "
                             "registered group, or an executor given store=)")
        comm = EmulatedNccl(private_gloo(store, rank, world, inner), inner)
    return StreamTransport(comm, runtime, device, watchdog(), private=store is not None, notice=notice)
