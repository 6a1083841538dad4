"""The one interface every transport implements, method by method (as gloo's
``transport/unbound_buffer.h`` states each of its calls' contract). The P2P executor talks to a
transport through these calls only, and never asks which kind it has beyond :attr:`batched`
and :attr:`streamed`; :func:`ringcoll.runtime.transport.factory.make_transport` picks it.

A *step* is one schedule step's transfers: sends and receives of flat ``uint8`` views
(:func:`~ringcoll.runtime.transport.base.wire`) with peers of the group, all posted together.
"""
from __future__ import annotations

from typing import Sequence


class Transport:
    """How the P2P executor moves one step's transfers (see the module docstring)."""

    #: one handle (one Work) per step, messages matched by posting order per pair: tags are
    #: ignored, so nothing of a failed call may ever be posted again (NCCL's shape)
    batched: bool = False
    #: stream-ordered: ``post``/``wait`` enqueue on the transport's stream and return at once;
    #: the call is opened, enqueued and closed (:class:`~ringcoll.runtime.transport.stream_ordered.
    #: StreamTransport`'s ``open``/``local``/``close``/``drop``) and the watchdog, not the
    #: host, waits for it
    streamed: bool = False

    def ready(self, deadline: float) -> None:
        """Set up whatever the first transfer needs (a communicator every rank joins), once;
        ``TimeoutError`` (or the backend's own error) when a peer has not joined by
        ``deadline`` (a ``time.monotonic()`` value). Called before every call's first step."""
        raise NotImplementedError

    def post(self, transfers: Sequence, tag: int):
        """Start one step's ``transfers`` ((Send | Recv item, bytes) pairs) and return its
        handle at once, without waiting for any peer. ``tag``: the call's tag (ignored where
        :attr:`batched`). Raises ``TransferError`` naming the items when posting itself fails."""
        raise NotImplementedError

    def wait(self, handle, deadline: float) -> None:
        """Block until the step of ``handle`` is complete (received bytes written) or raise
        ``TransferError`` (``timed_out`` when ``deadline`` passed first; the items still
        incomplete named). Releases the handle's resources either way. On a stream-ordered
        transport: orders the stream after the step instead, and returns at once."""
        raise NotImplementedError

    def release(self, handle) -> None:
        """Give back what ``handle`` holds (staging memory) without waiting: for a step
        abandoned by a failed call."""
        raise NotImplementedError

    def abort(self) -> None:
        """The group failed on this rank: end this rank's communication on it now, so that the
        peers waiting on this rank fail at once (gloo: close its connections; NCCL: abort the
        communicator), and post nothing more. Never blocks long; idempotent."""
        raise NotImplementedError
