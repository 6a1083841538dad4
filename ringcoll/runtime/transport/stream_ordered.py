"""The stream-ordered transport: a whole collective enqueued on a device stream, no host wait.

NCCL's own collectives never block the host: they are enqueued on a stream ordered after the
caller's, and the caller's stream is ordered after them. :class:`StreamTransport` gives
ringcoll's schedules the same shape, on one stream per (group, device) that ringcoll owns:

1. the stream waits on an event of the caller's current stream (what the caller wrote before
   the call is read);
2. per step, one coalesced batch of the step's sends and receives (``comm.start``), the wait
   that orders the stream after the batch (``comm.join``: NCCL's ``Work.wait()``, which orders
   the current stream and never blocks the host), an event that marks the step's end (what
   the watchdog reads to name the step a stalled call is in), and the step's copies and
   reductions, launched on the same stream;
3. the call's end event, which the caller's current stream waits on when a synchronous call
   returns, or when ``Work.wait()`` is called; ``Work.get_future()`` is stream-aware.

Failure is the watchdog's (:mod:`ringcoll.runtime.watchdog`): one thread per process reads the step
events of the calls in flight and, past a step's deadline, aborts the transport's communicator
and fails the group with a PeerError naming the call and the step.

Every transport of this kind has a **private communicator**: an NCCL group (or, emulated, a
gloo group) created by ringcoll for itself on the group's store, so that no other traffic (the
user's send/recv, the built-in collectives, another ringcoll group) can be matched with its
messages (NCCL matches by order alone), and aborting it on a timeout leaves the user's groups
alone. Its own timeout is set well beyond ringcoll's deadline (:func:`private_timeout`), so
ringcoll's watchdog always fires first.

Two implementations, one code path (the executor cannot tell them apart): CUDA tensors on a
group with NCCL (:class:`~ringcoll.runtime.transport.NcclComm` over a private ProcessGroupNCCL, the
CUDA runtime); and ``RINGCOLL_TRANSPORT=streamed``, CPU tensors on gloo through the emulator
(:class:`EmulatedNccl` over a private gloo group, :class:`~ringcoll.runtime.stream_runtime.EmulatedRuntime`),
which is how every test of this path runs without a GPU.
"""
from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from ...config import environment
from ...schedules.vocabulary import Send
from ..stream_runtime import StreamRuntime, device_work
from . import NCCL_DTYPES, NcclShim, TransferError, wire
from .interface import Transport

#: ringcoll's deadline is at most this share of the private communicator's own timeout
PRIVATE_MARGIN = 4.0


def private_timeout(seconds: float) -> float:
    """The private communicator's own timeout for ringcoll's per-step ``seconds``: strictly
    beyond it (4x, and at least 5 minutes more), so ringcoll's watchdog, which aborts the
    communicator at its own deadline, always acts before NCCL's watchdog would (whose clock
    starts when a batch is enqueued, possibly several steps before it runs)."""
    return max(seconds * PRIVATE_MARGIN, seconds + 300.0)


class CaptureError(RuntimeError):
    """A ringcoll collective was called while its stream was capturing a CUDA graph."""


def refuse_capture(describe: str) -> CaptureError:
    return CaptureError(
        f"ringcoll {describe}: called while the current CUDA stream is capturing a graph "
        f"(torch.cuda.graph / CUDA graph capture). ringcoll does not capture its collectives: a "
        f"call checks its peers' progress from the host (the watchdog queries each step's event, "
        f"which capture forbids), may allocate scratch and staging buffers on first use, and "
        f"takes a call number and a tag on the host per call, which a replayed graph would not "
        f"take again. Run the collective outside the captured region (before or after the graph, "
        f"or between two graphs), or use the built-in NCCL collectives inside it. What would "
        f"have to change: buffers allocated before capture, a watchdog on the replay instead of "
        f"the capture, and call numbers that a replay advances.")


class PostedStep:
    """One posted step: its transfers, its batch's handle, its end event, its error."""

    __slots__ = ("items", "index", "work", "event", "error")

    def __init__(self, items):
        self.items, self.index, self.work, self.event, self.error = items, None, None, None, None


class InFlight:
    """A call enqueued on a stream: what the watchdog watches and the Work waits on."""

    def __init__(self, name: str, timeout: float, total: int, transport: "StreamTransport"):
        self.name, self.timeout, self.total, self.transport = name, timeout, total, transport
        self.steps: List[PostedStep] = []
        self.done = None                  # the call's end event
        self.failure: Optional[BaseException] = None
        self.keep: list = []              # tensors the stream uses, held until the call completes
        self.touched: list = []           # tensors its hooks read or write (kept at close)
        self.error: Optional[BaseException] = None   # a local operation's, on the stream
        self.on_failure: Optional[Callable] = None   # (call, step index, TransferError) -> error
        self.enqueued = time.monotonic()
        self.finished = False
        self.index = 0                    # the watchdog's: the first step not seen to end
        self.clock: Optional[float] = None   # when that step's deadline started counting
        self._settled: list = []          # functions of the call, run once it completed or failed
        self._lock = threading.Lock()
        self._verdict = threading.Event()

    def when_settled(self, fn: Callable[["InFlight"], None]) -> None:
        """Run ``fn(call)`` once the watchdog has seen the call complete or fail (now if it
        has)."""
        with self._lock:
            if not self.finished:
                self._settled.append(fn)
                return
        fn(self)

    def settle(self, failure: Optional[BaseException] = None) -> None:
        """The watchdog's verdict: completed (``failure`` None) or failed."""
        with self._lock:
            if self.finished:
                return
            self.failure, self.finished = failure, True
            if failure is None:
                self.keep = []
            settled, self._settled = self._settled, []
        self._verdict.set()
        for fn in settled:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a waiter's callback: the verdict stands for the others
                pass

    def host_wait(self, seconds: Optional[float] = None) -> bool:
        """Block the host until the watchdog has seen the call end (its end event reached) or
        fail (then raise its error): what a barrier, check mode, exchanges the host reads and
        CPU memory need. Counted in ``StreamRuntime.host_waits``. Never longer than the
        watchdog's deadline, even where an aborted transfer would keep the stream from its end
        event; ``seconds``: at most that long (False if the call has not ended by then)."""
        StreamRuntime.host_waits += 1
        if not self._verdict.wait(seconds):
            return False
        if self.failure is not None:
            raise self.failure
        return True

    def __repr__(self) -> str:
        return f"InFlight({self.name}, steps={len(self.steps)}/{self.total})"


class StreamTransport(Transport):
    """The stream-ordered transport (see the module docstring)."""

    batched = True
    streamed = True

    def __init__(self, comm, runtime: StreamRuntime, device: torch.device, watchdog, *, private: bool = True,
                 notice: Optional[Callable[[], Optional[str]]] = None):
        """``notice()``: the text a rank that failed the group left in its store, or None (the
        executor's look, as the batched transport's), asked by the watchdog for a call stalled
        at a step."""
        self.comm, self.runtime, self.device, self.watchdog = comm, runtime, device, watchdog
        self.private = private            # whether comm's group is ringcoll's own (see shutdown)
        self._notice = notice
        self.polled = 0.0                 # when the watchdog last asked whether a peer failed
        self.stream = runtime.new_stream(device)     # ringcoll's own until shutdown releases it
        self._released = False
        self.call: Optional[InFlight] = None
        self.last: Optional[InFlight] = None
        self._ready = False
        self._abort_lock = threading.Lock()
        self._aborting: Optional[threading.Thread] = None

    def ready(self, deadline: float) -> None:
        """Set the private communicator up once, every rank together (the group's first call on
        this device); TimeoutError past ``deadline``."""
        if not self._ready:
            self.comm.connect(deadline)
            self._ready = True

    # -- a call ----------------------------------------------------------------------------
    def open(self, name: str, timeout: float, total: int, caller=None) -> InFlight:
        """Start enqueueing a call: the stream first waits on ``caller`` (an event of the
        caller's stream; None: an event of the calling thread's current stream, now)."""
        if caller is None:
            caller = self.runtime.record(self.runtime.current(self.device))
        self.runtime.wait(self.stream, caller)
        self.call = InFlight(name, timeout, total, self)
        return self.call

    def post(self, transfers: Sequence, tag: int):
        items = [item for item, _ in transfers]
        ops = [(isinstance(item, Send), wire(tensor), item.peer) for item, tensor in transfers]
        step = PostedStep(items)
        comm = self.comm

        def start():
            try:
                step.work = comm.start(ops)
            except BaseException as error:  # noqa: BLE001 - the watchdog or wait() reports it
                step.error = error

        self.runtime.launch(self.stream, start)
        if step.error is not None:       # known at once where launching runs it (CUDA)
            raise TransferError(items, step.error, timed_out=False, batch=True)
        return step

    def wait(self, step: PostedStep, deadline: float) -> None:
        """Order the stream after the step's batch and mark the step's end; the host does not
        wait (a stalled batch is the watchdog's)."""
        comm = self.comm

        def join():
            if step.error is None:
                try:
                    comm.join(step.work)
                except BaseException as error:  # noqa: BLE001
                    step.error = error

        self.runtime.launch(self.stream, join)
        step.event = self.runtime.record(self.stream)
        self.call.steps.append(step)
        if step.error is not None:
            raise TransferError(step.items, step.error, timed_out=False, batch=True)

    def local(self, fn: Callable[[], object], keep: bool = False) -> None:
        """A step's own copies and reductions (or a plan's hook), on the stream after its batch:
        ``fn``'s Python runs now (an error raises here, as CUDA's host side does); an error of
        its device work (known to the emulator) is the call's: the watchdog fails it. ``keep``:
        every tensor ``fn``'s operations read or write is kept by the call until it completes
        (and recorded on the stream), as NCCL keeps an async op's inputs and outputs: a plan's
        hooks name the caller's tensors and staging copies, which the caller may drop."""
        call = self.call

        def failed(error):
            if call.error is None:
                call.error = error

        self.runtime.launch(self.stream, fn, on_error=failed, touched=call.touched if keep else None)

    def close(self, keep=()) -> InFlight:
        """End the call: its end event, handed to the watchdog."""
        call, self.call = self.call, None
        call.done = self.runtime.record(self.stream)
        call.keep = _unique(list(keep) + call.touched)
        call.touched = []
        self.runtime.keep_alive(call.keep, self.stream)
        self.watchdog.watch(call)
        self.last = call
        return call

    def shutdown(self, how: str = "shutdown") -> None:
        """Close the private communicator (``how``: ``"shutdown"``, after the calls in flight
        end or fail, or ``"abort"``, at once); a shared one is the user's and stays. The stream
        goes back to the runtime once the last call on it has settled (it outlives every call
        that used it), and only then may another transport take it."""
        last = self.last
        if how == "shutdown" and last is not None:
            try:
                last.host_wait()
            except Exception:  # noqa: BLE001 - reported to the call's own waiters
                pass
        if self.private:
            self.comm.close(how)
        with self._abort_lock:
            if self._released:
                return
            self._released = True
        if last is None:
            self.runtime.release_stream(self.stream)
        else:
            last.when_settled(lambda call: self.runtime.release_stream(self.stream))

    def drop(self) -> None:
        """Forget a call whose enqueueing failed on the host."""
        self.call = None

    def release(self, handle) -> None:
        pass

    def abort(self) -> None:
        """Abort the communicator, on a thread of its own: ProcessGroupNCCL's ``abort()`` can
        block up to the group's timeout, and the watchdog (which calls this) must not. Once."""
        with self._abort_lock:
            if self._aborting is not None:
                return
            self._aborting = threading.Thread(target=self._abort, name="ringcoll-abort", daemon=True)
        self._aborting.start()

    def _abort(self) -> None:
        try:
            self.comm.abort()
        except Exception:  # noqa: BLE001 - best effort: the group is failed either way
            pass

    def peer_failed(self) -> Optional[str]:
        """The notice of the rank that failed the group (``"rank 2: ..."``), or None. An abort
        (NCCL's, unless a network error tells them) leaves the peers' pending transfers waiting
        until their deadline; so a failing rank's executor leaves its error in the group's store
        before it aborts (runtime.failures), which the watchdog reads for a call stalled at a
        step (torch's NCCL propagates its errors likewise)."""
        return self._notice() if self._notice is not None else None


def _unique(tensors: list) -> list:
    seen, unique = set(), []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            unique.append(tensor)
    return unique


# -- the emulated NCCL communicator ---------------------------------------------------------
class _EmulatedBatch:
    """A batch of the emulated communicator: posted when its stream reaches it."""

    __slots__ = ("work", "error")

    def __init__(self):
        self.work, self.error = None, None


class EmulatedNccl:
    """NCCL on an emulated device (see the module docstring): :class:`NcclShim` (one tag, NCCL's
    dtype list, one Work per batch settled by its waiter thread) on a private gloo group, split
    as NCCL's calls are: ``start`` and ``join`` are host calls that return at once (an
    aborted communicator or a refused dtype raises there); what they enqueue runs on the
    stream (:func:`ringcoll.runtime.stream_runtime.device_work`): the batch's sends and receives are
    posted when the stream reaches them, and the stream's thread (not the host) waits for the
    batch, or until the communicator is aborted: gloo's abort does not fail the waits already
    blocked, so the stream must not sit in one (a stalled stream would keep a barrier's host
    from the watchdog's verdict). A batch's error is read by the watchdog (``failed``)."""

    def __init__(self, pg, timeout: float):
        self.shim, self.timeout = NcclShim(pg), timeout
        #: the first batch error the stream met: NCCL's asynchronous error, sticky; every batch
        #: the stream reaches after it posts nothing (a later step's sends would carry data
        #: computed from a receive that never landed: stale bytes a peer would take as right)
        self.error: Optional[BaseException] = None

    def connect(self, deadline: float) -> None:
        """Set the communicator up now, every rank together, within ``deadline``: the private
        group is made now (gloo connects every pair) with ``deadline`` as its set-up's limit, so
        a peer that never comes fails the set-up in time, as NCCL's eager connect
        (:meth:`NcclComm.connect`), and nothing is left waiting in the store behind it."""
        pg = self.shim.pg
        if isinstance(pg, MadeAtFirstUse):
            pg.made_now(max(deadline - time.monotonic(), 0.001))
        self.shim.connect(deadline)

    def start(self, ops):
        if self.shim.aborted:
            raise RuntimeError("NCCL communicator was aborted")
        for _, tensor, _ in ops:
            if tensor.dtype not in NCCL_DTYPES:
                raise RuntimeError(f"Input tensor data type is not supported for NCCL process group: {tensor.dtype}")
        batch = _EmulatedBatch()

        def post():
            if self.error is not None:
                batch.error = RuntimeError(f"NCCL communicator has an earlier batch's error, nothing more is "
                                           f"posted: {self.error}")
                return
            try:
                batch.work = self.shim.batch(ops)
            except BaseException as error:  # noqa: BLE001 - the watchdog reads it
                batch.error = self.error = error

        device_work(post)
        return batch

    def join(self, batch) -> None:
        def wait():
            if batch.error is not None:
                return
            try:
                while not batch.work._done.wait(0.01):
                    if self.shim.aborted:
                        raise RuntimeError("NCCL communicator was aborted")
                batch.work.wait()         # the batch's error, if it failed
            except BaseException as error:  # noqa: BLE001 - the watchdog reads it
                batch.error = error
                if self.error is None:
                    self.error = error

        device_work(wait)

    def failed(self, batch) -> Optional[BaseException]:
        return batch.error

    def abort(self) -> None:
        if not self.shim.aborted:
            self.shim.abort()
            self.close("abort")

    def close(self, how: str) -> None:
        pg = self.shim.pg
        if isinstance(pg, MadeAtFirstUse) and not pg.made:
            return                        # never set up: nothing to shut down
        try:
            getattr(pg, how)()
        except Exception:  # noqa: BLE001 - best effort: the group is failed or done either way
            pass


class MadeAtFirstUse:
    """A private group made when first used (the communicator's set-up, in the call's run), not
    when its transport is made: gloo's constructor connects every pair and so waits for every
    peer, and a transport is made on the caller's thread at an asynchronous call's entry too
    (a list argument's staging buffer is allocated on its stream), where nothing may wait on a
    peer (docs/design.md, Decisions). Its prefix is taken at once, in every rank's call order."""

    def __init__(self, make):
        self._make, self._pg = make, None

    @property
    def made(self) -> bool:
        return self._pg is not None

    def made_now(self, within: Optional[float] = None):
        """Make the group now, if not yet: it blocks until every peer has connected, up to
        ``within`` seconds (None: the group's own timeout)."""
        if self._pg is None:
            self._pg = self._make(within)
        return self._pg

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.made_now(), name)


def group_store(group):
    """The store of a registered process group (its PrefixStore), for a private group beside
    it; None when c10d does not know the group (a raw backend)."""
    try:
        return dist.distributed_c10d._world.pg_map[group][1]
    except (KeyError, AttributeError, TypeError):
        return None


#: private groups made so far in this process, per store and device type: (the store, kept so
#: that its id is never reused, how many); each group needs a prefix of its own
_made: dict = {}


def private_prefix(store, device: torch.device) -> str:
    """A prefix no earlier private group on ``store`` used: every rank makes its private
    groups on a store in the same order (a group's first call on a device), so the counts agree."""
    key = (id(store), device.type)
    count = _made[key][1] + 1 if key in _made else 1
    _made[key] = (store, count)
    return f"ringcoll/private/{device.type}/{count}/"


def private_gloo(store, rank: int, world: int, timeout: float):
    """A private gloo group on ``store`` (the emulator's communicator): every rank of the group
    creates it at the same call, made (gloo connects every pair, within ``timeout``) at its first
    use: :class:`MadeAtFirstUse`."""
    prefix = private_prefix(store, torch.device("cpu"))

    def make(within: Optional[float]):
        pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world,
                                   timedelta(seconds=timeout if within is None else within))
        if within is not None:        # the set-up had the call's limit; its transfers get their own
            (getattr(pg, "set_timeout", None) or pg._set_default_timeout)(timedelta(seconds=timeout))
        return pg

    return MadeAtFirstUse(make)


def private_nccl(store, rank: int, world: int, timeout: float, device: torch.device):
    """A private ProcessGroupNCCL on ``store`` for ``device``: its communicator is set up by
    :meth:`NcclComm.connect`, every rank at the group's first CUDA call."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timedelta(seconds=timeout)
    prefix = private_prefix(store, device)
    with private_nccl_environment():
        return dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), rank, world, options)


#: what ProcessGroupNCCL reads when it is built, set for the private communicator only:
#: ringcoll's watchdog handles its errors and timeouts (NCCL's own error handling would tear
#: the whole process down on a peer's failure), and its ``wait()`` must order the stream
#: without blocking the host whatever the user chose for their groups
PRIVATE_NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "0",
                    # the heartbeat monitor and the dump on a timeout or an async error: read by a
                    # ProcessGroupNCCL's constructor, and the monitor runs only in a process's first
                    # one (PG uid 0), so these hold where ringcoll's group is that first one (the
                    # "ringcoll" backend's on a job with no NCCL group of its own; docs/gpu.md says
                    # what a user's own first NCCL group needs)
                    "TORCH_NCCL_ENABLE_MONITORING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                    # forces the process's teardown on any NCCL error whatever the above say
                    "TORCH_NCCL_DESYNC_DEBUG": "0"}

_env_lock = threading.Lock()


def private_nccl_environment():
    """The environment a ProcessGroupNCCL of ringcoll's own is built under (:data:`PRIVATE_NCCL_ENV`)."""
    return _environment(PRIVATE_NCCL_ENV)


@contextlib.contextmanager
def _environment(values: dict):
    """``values`` in os.environ for the duration (ProcessGroupNCCL reads them in its
    constructor), restored afterwards; one thread at a time."""
    with _env_lock, environment(values):
        yield
