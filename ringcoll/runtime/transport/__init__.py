"""Transports: how the P2P executor moves one step's transfers. Every transport implements
:class:`~ringcoll.runtime.transport.interface.Transport` (its contract, method by method);
:func:`~ringcoll.runtime.transport.factory.make_transport` picks one for a group and device.

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

:data:`base.cuda_calls` is the one place ringcoll touches CUDA devices, streams and events; tests
swap in a fake that records which thread, device and stream each operation used.
"""
from __future__ import annotations

from . import base
from .base import NCCL_DTYPES, CudaCalls, TransferError, poll, wire
from .host import HostTransport
from .shim import NcclComm, NcclShim
from .batched import BatchedTransport
from .interface import Transport

__all__ = ["NCCL_DTYPES", "BatchedTransport", "CudaCalls", "HostTransport", "NcclComm", "NcclShim",
           "TransferError", "Transport", "base", "poll", "wire"]
