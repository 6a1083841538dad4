"""How a call on a group can end badly, and how long a step may wait: :class:`PeerError` (a peer
dead, silent or failing, named with the step), :class:`GroupFailedError` (every call after a
failure), :class:`MismatchError` (check mode: ranks disagree about a call), and the per-step
timeout (:func:`set_timeout`, ``RINGCOLL_TIMEOUT``, else the group's own)."""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from ..config import settings

#: torch's default process-group timeout, for groups whose own cannot be read
DEFAULT_TIMEOUT = timedelta(minutes=30).total_seconds()

_timeout_override: Optional[float] = None


def set_timeout(seconds: Optional[float]) -> None:
    """Override how long one step of any ringcoll call may wait for its peers (it wins over
    the ``RINGCOLL_TIMEOUT`` environment variable); ``None`` goes back to RINGCOLL_TIMEOUT,
    else each group's own timeout (given to ``init_process_group``/``new_group``, torch's
    default otherwise)."""
    global _timeout_override
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or seconds <= 0):
        raise ValueError(f"seconds must be a positive number or None, got {seconds!r}")
    _timeout_override = None if seconds is None else float(seconds)


def get_timeout() -> Optional[float]:
    """The override of :func:`set_timeout`, else RINGCOLL_TIMEOUT's, or None when groups'
    own timeouts apply."""
    return _timeout_override if _timeout_override is not None else settings().timeout


def group_timeout(pg, device: torch.device = torch.device("cpu")) -> float:
    """The timeout, in seconds, that ``pg`` (a registered ProcessGroup or a raw backend) was
    created with: its backend's for ``device`` (``options._timeout`` on gloo and NCCL; a
    ``"ringcoll"`` group's own ``timeout``, as its Options are the user's algorithm choices);
    torch's default when it cannot be read."""
    try:
        backend = pg._get_backend(device) if isinstance(pg, dist.ProcessGroup) else pg
        own = getattr(backend, "timeout", None)
        return (own if isinstance(own, timedelta) else backend.options._timeout).total_seconds()
    except (AttributeError, RuntimeError):
        return DEFAULT_TIMEOUT


class PeerError(RuntimeError):
    """A transfer with a peer failed or timed out. ``peer`` is the peer (None when a batch of
    transfers with several peers failed as a whole); ``peers`` all the step's peers concerned."""

    def __init__(self, message: str, *, rank: int, peer: Optional[int], step: int, peers=None, call=""):
        super().__init__(message)
        self.rank, self.peer, self.step = rank, peer, step
        self.peers = tuple(peers) if peers is not None else ((peer,) if peer is not None else ())
        self.call = call

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.rank, self.peer, self.step, self.peers, self.call))


def _rebuild(cls, message, rank, peer, step, peers, call):
    return cls(message, rank=rank, peer=peer, step=step, peers=peers, call=call)


class GroupFailedError(RuntimeError):
    """A call on a group that an earlier call left failed. ``failure`` is that call's
    :class:`PeerError` (or :class:`MismatchError`)."""

    def __init__(self, message: str, failure: Optional[BaseException] = None):
        super().__init__(message)
        self.failure = failure
        self.call = getattr(failure, "call", "")
        self.rank = getattr(failure, "rank", None)
        self.peer = getattr(failure, "peer", None)
        self.step = getattr(failure, "step", None)

    def __reduce__(self):
        return (type(self), (str(self), self.failure))


class MismatchError(RuntimeError):
    """Check mode: the ranks of a group called different collectives (or the same one
    differently) at the same point. Raised on every rank alike."""

    def __init__(self, message: str, *, rank: int, differences=(), call=""):
        super().__init__(message)
        self.rank, self.differences, self.call = rank, tuple(differences), call
        self.peer = self.step = None

    def __reduce__(self):
        return (_rebuild_mismatch, (str(self), self.rank, self.differences, self.call))


def _rebuild_mismatch(message, rank, differences, call):
    return MismatchError(message, rank=rank, differences=differences, call=call)


# -- the failure notice: what a failed rank leaves in its group's store -------------------------
#: the key (in the group's store) under which rank r leaves the error that failed its group
NOTICE = "ringcoll/failed/{rank}"
#: the key any failed rank sets too: one look tells a polling peer that some rank failed
GROUP_NOTICE = "ringcoll/failed"

#: how long reading or leaving a notice may take: the store may be gone with a dead rank (it
#: lives in rank 0's process under torchrun's default), and a failing call must not hang on it
NOTICE_SECONDS = 2.0


def _bounded(work, seconds: float = NOTICE_SECONDS):
    """``work()``'s value, or None when it raised or took longer than ``seconds`` (it goes on
    in a daemon thread that nothing waits for)."""
    import threading

    box: list = []

    def run():
        try:
            box.append(work())
        except Exception:  # noqa: BLE001 - a notice is best effort
            pass

    thread = threading.Thread(target=run, name="ringcoll-notice", daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else None


def leave_notice(store, rank: int, text: str) -> None:
    """Leave ``text`` (the call and the error that failed the group on ``rank``) in the group's
    store, for the peers' errors to name (why the rank went silent or closed its connections,
    not only that it did) and for the polling transports to read while a step waits (an abort
    that does not reach a peer: docs/semantics.md). Waited for up to
    :data:`NOTICE_SECONDS` (a store gone with a dead rank never answers): the notice must be in
    the store before this rank goes on, or its next store request (a new group's set-up, which
    waits for these very peers) would hold the store client and the notice behind it."""
    if store is None:
        return

    def leave():
        store.set(NOTICE.format(rank=rank), text.encode())
        store.set(GROUP_NOTICE, f"rank {rank}: {text}".encode())

    _bounded(leave)


def group_notice(store) -> Optional[str]:
    """Whether some rank of the group has failed it (the text it left), in one store request:
    what a peer that polls its transfers (the batched and stream-ordered transports) looks at every
    :data:`NOTICE_EVERY` seconds of a step, to fail fast instead of waiting out its timeout."""
    if store is None:
        return None
    try:
        return store.get(GROUP_NOTICE).decode(errors="replace") if store.check([GROUP_NOTICE]) else None
    except Exception:  # noqa: BLE001 - a notice is best effort
        return None


#: how often a polling transport looks for a group notice while a step is incomplete
NOTICE_EVERY = 0.25


def read_notices(store, peers) -> dict:
    """The notices ``peers`` left in the group's store (peer -> text), read within
    :data:`NOTICE_SECONDS` in all; {} without a store or when none is there."""
    if store is None or not peers:
        return {}

    def read():
        keys = {peer: NOTICE.format(rank=peer) for peer in peers}
        return {peer: store.get(key).decode(errors="replace") for peer, key in keys.items() if store.check([key])}

    return _bounded(read) or {}
