"""The P2P executor: runs one rank's plan on a real torch.distributed process group.

Each step's sends and receives are posted together and waited on together (a blocking send
before a receive deadlocks under gloo at every size), then the step's local operations run.
The transfers go through a transport (:mod:`ringcoll.runtime.transport`), chosen by the device of
the call's tensors: the stream-ordered transport (:mod:`ringcoll.runtime.transport.stream_ordered`) for CUDA
tensors on a group with an NCCL backend (``"nccl"``, ``"cpu:gloo,cuda:nccl"``, or no backend
given), where the same loop enqueues the whole call on ringcoll's stream and returns without a
host wait (a watchdog thread, not this loop, times its steps); gloo's host transport otherwise
(CUDA tensors staged through pinned host memory). ``RINGCOLL_TRANSPORT=batched`` runs CPU
tensors on gloo through the host-polled batched transport and its NCCL shim,
``RINGCOLL_TRANSPORT=streamed`` through the stream-ordered transport on emulated streams.

Isolation between calls. Every call on a group has a sequence number in that group (taken
by the rule of docs/semantics.md#a-calls-number; :meth:`P2PExecutor.execute` runs a call
only with its number) and a
fingerprint (collective, algorithm, element count, dtype, op, root). On gloo every message
of the call carries a tag made of both, in [2**30, 2**31), away from user tags: a message of
one call can only ever be received by the same call, and a mismatched call times out with
an error instead of taking another call's data. NCCL ignores tags and matches by order, so
there isolation rests on order (each rank posts calls in program order, through one queue,
and a call's transfers in schedule order), on fail-stop (below), and on check mode
(``RINGCOLL_CHECK=1``), which compares the fingerprints and sequence numbers of all ranks
before each call and so also catches the one case order cannot: a rank whose call failed its
own argument checks while its peers posted theirs.

What check mode catches, exactly. Sequence numbers count each rank's own calls, so a rank
that skips a call does not make numbers differ: it compares its next call with the others'
skipped one. Any difference of fingerprint or number at a call raises the same
MismatchError on every rank at that call and leaves the group failed everywhere (a skip
leaves the ranks out of step for good). What no check can catch: a skipped call identical in
fingerprint to the call that follows it (same collective, algorithm, element count, dtype,
op and root): the skipping rank's call runs with the others' first one, and the difference
shows at the first later call that differs (or, if none does, as a timeout where a rank
has no partner left), as in NCCL. Shapes with equal element counts, data and the call site
are not compared.

Failure. A transfer that fails or does not complete within the timeout raises a
:class:`PeerError` naming this rank, the peer, the step and the call, and marks the group
failed, as NCCL aborts its communicator: every later call on it raises
:class:`GroupFailedError` at once, naming the call that failed, instead of posting messages
that could meet leftovers. Timeouts: a call's ``timeout=`` (barrier), else ``set_timeout``/
``RINGCOLL_TIMEOUT``, else the group's own (``init_process_group``/``new_group``'s
``timeout``, torch's default when none was given), per step.
"""
from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from datetime import timedelta
from typing import Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import kernels
from ..schedules import registry
from ..config import settings
from .blocks import Blocks, posts_early, tensors_in, tensors_of
from .failures import (GroupFailedError, MismatchError, PeerError, get_timeout, group_notice, group_timeout,
                       leave_notice, read_notices)
from .identity import (CHECK_TAG, FIELDS, MONITORED, RECORD, call_tag, check_enabled, fingerprint, pack_record,
                       print_bits, tag_of, unpack_record)
from .local import resolve_local, run_resolved
from .plan import Plan
from ..schedules.vocabulary import IN_PLACE, Layout, Send, extents
from .transport import TransferError, wire
from ..cost.machine import EXECUTOR_WINDOW
from .transport.factory import make_transport, runtime_for, stream_ordered
from .transport.interface import Transport
from .transport.stream_ordered import InFlight, PostedStep, group_store


def _device_backends(backend: str) -> Dict[str, str]:
    """``"nccl"`` -> {cuda: nccl}; ``"gloo"`` -> gloo for both; ``"cpu:gloo,cuda:nccl"`` -> as written."""
    backend = backend.lower()
    if ":" not in backend:
        return {"cpu": backend, "cuda": backend} if backend != "nccl" else {"cuda": "nccl"}
    pairs = (part.split(":", 1) for part in backend.split(",") if ":" in part)
    return {device.strip(): name.strip() for device, name in pairs}


class P2PExecutor:
    """Runs plans for one process group; keeps scratch buffers and transports across calls."""

    def __init__(self, group: dist.ProcessGroup, *, rank: Optional[int] = None,
                 world: Optional[int] = None, backend: Optional[str] = None, weak: bool = False,
                 store=None):
        """``group`` is a process group; or, with ``rank``, ``world`` and ``backend`` given,
        any object with ProcessGroup's ``send``/``recv`` in group ranks (a raw gloo or NCCL
        group that c10d does not know, or a transport for measurements; ``store``: its
        store, where the stream-ordered path makes its private communicator). ``weak``: hold the
        group by a weak reference (the drop-in's one executor per group does), so that it
        never keeps a group that ``destroy_process_group`` released alive; a gloo group
        destroyed only at the interpreter's teardown aborts the process ("terminate called
        without an active exception")."""
        self._group = weakref.ref(group) if weak else (lambda: group)
        self._weak = weak
        self._store = store if store is not None else group_store(group)
        if rank is None:
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            backend = str(dist.get_backend(group))
            try:
                config = str(dist.get_backend_config(group))
            except (AttributeError, RuntimeError, ValueError):
                config = backend
            self.global_ranks = [dist.get_global_rank(group, r) for r in range(world)] \
                if group is not dist.GroupMember.WORLD else list(range(world))
        else:
            config = str(backend)
            self.global_ranks = list(range(world))
        self.rank, self.world = rank, world
        self.backend = str(backend).lower()
        self.device_backends = _device_backends(config)
        # steps in flight at once (see execute): RINGCOLL_WINDOW, else the default, which lives
        # with the model that prices it, a layer below (ringcoll.cost.machine)
        self.window = settings().window or EXECUTOR_WINDOW
        #: whether schedules split a step so a rank carries one message in and one out at a
        #: time, as on the simulator's clock; False: a global step's transfers are posted
        #: together (measured faster on gloo, docs/design.md, Decisions)
        self.one_port = False
        self.transport_mode = settings().transport
        self.check = check_enabled()
        self.failure: Optional[BaseException] = None
        self.failed_call = ""           # the call that raised ``failure`` (see _failed)
        self._seq = 0
        self._transports: Dict[Tuple[str, Optional[int]], Transport] = {}
        self._graveyard: list = []        # transfers of a failed call, kept alive (see _failed)
        self._scratch: Dict[Tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    @property
    def group(self):
        group = self._group()
        if group is None:
            raise RuntimeError("ringcoll: this executor's process group has been destroyed")
        return group

    # -- calls -------------------------------------------------------------------------
    def begin_call(self) -> int:
        """The next call's sequence number in this group (raises if the group has failed).
        Called in one place only, ``ringcoll.api.common.executor_context``, by the rule of
        docs/semantics.md#a-calls-number."""
        self.raise_if_failed()
        self._seq += 1
        return self._seq

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            failure = self.failure
            cause = self._cause(failure)
            raise GroupFailedError(
                f"ringcoll: this process group failed earlier and cannot be used any more (as an "
                f"aborted NCCL communicator): {cause} -- create a new group (or restart) to go on",
                failure)

    def _cause(self, failure: BaseException) -> str:
        """``failure`` as the rest of the group should read it: ringcoll's own errors name their
        call; any other is named with the call that raised it."""
        if getattr(failure, "call", ""):
            return str(failure)
        where = f"rank {self.rank} {self.failed_call}" if self.failed_call else f"rank {self.rank}"
        return f"{where}: {type(failure).__name__}: {failure}"

    def _notice(self) -> Optional[str]:
        """The text a rank that failed this group left in its store, or None (one store
        request): what the polling transports ask while a step waits, to fail fast."""
        return group_notice(self._store)

    def transport(self, device: torch.device) -> Transport:
        """The transport for tensors on ``device`` (kept per device), as the factory picks it."""
        key = (device.type, device.index)
        transport = self._transports.get(key)
        if transport is None:
            transport = self._transports[key] = self._make_transport(device)
        return transport

    def _make_transport(self, device: torch.device) -> Transport:
        """The factory's transport for ``device`` on this group (an executor over a
        communicator of its own, tools/loopback.py's, overrides this)."""
        group = weakref.proxy(self.group) if self._weak else self.group   # kept: not owning
        return make_transport(device, group, device_backends=self.device_backends, mode=self.transport_mode,
                              store=self._store, rank=self.rank, world=self.world,
                              seconds=get_timeout() or group_timeout(self.group, device), notice=self._notice)

    def stream_ordered(self, device: torch.device) -> bool:
        """Whether calls on ``device`` take the stream-ordered path, told without making its
        transport (which sets up a private communicator with every peer)."""
        return stream_ordered(device, self.device_backends, self.transport_mode)

    #: the streams and events of the stream-ordered path on a device
    stream_runtime = staticmethod(runtime_for)

    def close(self, how: str = "shutdown") -> None:
        """Close the private communicators of this executor's stream-ordered transports
        (``"shutdown"``: after their calls in flight; ``"abort"``: at once)."""
        for transport in list(self._transports.values()):
            if transport.streamed:
                transport.shutdown(how)

    def streamed(self, device: torch.device) -> bool:
        """Whether calls on ``device`` take the stream-ordered path."""
        return getattr(self.transport(device), "streamed", False)

    def timeout(self, plan: Plan, of_group: Optional[float] = None) -> float:
        """Seconds a step of ``plan`` may wait: the call's own, else set_timeout's or
        RINGCOLL_TIMEOUT's, else the
        group's (``of_group`` when already known: a prepared plan's)."""
        if plan.timeout is not None:
            return plan.timeout
        override = get_timeout()
        if override is not None:
            return override
        return of_group if of_group is not None else group_timeout(self.group, plan.device)

    # -- buffers -----------------------------------------------------------------------
    def _buffers(self, plan: Plan, steps) -> Dict[str, torch.Tensor]:
        buffers = dict(plan.buffers)
        for name, need in extents(steps).items():
            if name in buffers:
                continue
            key = (name, plan.dtype, plan.device)
            scratch = self._scratch.get(key)
            if scratch is None or scratch.numel() < need:
                scratch = self._scratch[key] = self._allocate(need, plan.dtype, plan.device)
            buffers[name] = scratch
        return buffers

    def _allocate(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A scratch or staging buffer. On the stream-ordered path it is allocated on
        ringcoll's stream, which alone uses it (calls run in its order): freed or grown, its
        memory goes back to that stream's pool, never to the caller's while in use."""
        transport = self.transport(device)
        if transport.streamed:
            with transport.runtime.allocating(transport.stream):
                return torch.empty(numel, dtype=dtype, device=device)
        return torch.empty(numel, dtype=dtype, device=device)

    def lent(self) -> set:
        """The addresses of the storages this executor lends (scratch and staging buffers)."""
        return {buffer.untyped_storage().data_ptr() for buffer in self._scratch.values()}

    def staging(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of ``numel`` elements that a builder stages a tensor list through, kept
        across calls like the scratch buffers (plans run one at a time, and each copies in and
        out within its own run)."""
        key = ("staging", dtype, device)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._scratch[key] = self._allocate(numel, dtype, device)
        return buffer[:numel]

    # -- running -----------------------------------------------------------------------
    def prepare(self, plan: Plan) -> "Prepared":
        """``plan`` made ready to run any number of times (see :class:`Prepared`)."""
        steps = plan.steps(one_port=self.one_port)
        # detached: the schedule's copies and reductions need no autograd (no_grad), only
        # the plan's own before/after steps on the caller's tensors do
        buffers = {name: tensor.detach() for name, tensor in self._buffers(plan, steps).items()}
        before, after = plan.before, plan.after
        for name, (tensors, hook, writes) in plan.lists.items():
            blocks = Blocks.of(name, tensors, writes, steps, buffers)
            if blocks is not None:       # the list itself, no staging copy
                buffers[name] = blocks
                before = [other for other in before if other is not hook]
                after = [other for other in after if other is not hook]
        posts = []
        for index, st in enumerate(steps):
            for item in st.comms:
                if not 0 <= item.peer < self.world or item.peer == self.rank:
                    raise ValueError(f"ringcoll {plan.describe}: step {index + 1} names peer {item.peer}, "
                                     f"which is not another rank of a world of {self.world}")
            posts.append(tuple((item, wire(buffers[item.buf.name][item.buf.start:item.buf.stop]))
                               for item in st.comms))
        timeout = None if plan.timeout is not None else group_timeout(self.group, plan.device)
        return Prepared(plan, steps, buffers, tuple(posts), self.transport(plan.device),
                        print_bits(fingerprint(plan)), timeout, tuple(before), tuple(after))

    def execute(self, call: Union[Plan, "Prepared"], seq: Optional[int] = None, *, tag: Optional[int] = None,
                caller=None, blocking: bool = False) -> Optional[InFlight]:
        """The one way a call reaches the runtime: run ``call`` (a plan, prepared here, or a
        plan prepared earlier and kept: :class:`Prepared`) on this rank, keeping up to
        ``window`` steps' transfers in flight.

        ``seq``: the call's number in the group (default: the plan's own). Numbers are taken in
        one place, at the call's entry, never here (``ringcoll.api.common.executor_context``);
        a call that reaches the executor without one is refused. ``tag``: an internal
        exchange's reserved tag instead of a number (the placement, check mode's
        fingerprints): such a run has no number, is not itself checked and is named by its
        plan's ``describe``. ``caller``: on the stream-ordered path, the event of the caller's
        stream the call is enqueued after (None: the calling thread's current stream now).
        ``blocking``: on the stream-ordered path, wait on the host for the call to complete
        (for callers that read its result on the host next); elsewhere every run is blocking.

        Step j is posted early, while earlier steps are still moving or reducing, when none of
        its transfers touches what those steps still read or write; a step's local operations
        run as soon as its own transfers are done, so the reduction of one segment overlaps the
        transfer of the next. On the stream-ordered path (:mod:`ringcoll.runtime.transport.stream_ordered`)
        the same loop enqueues the call on ringcoll's stream and returns it in flight (its end
        event) without waiting; the caller orders its own stream after it (ringcoll.runtime.work)."""
        self.raise_if_failed()
        plan = call.plan if isinstance(call, Prepared) else call
        if tag is None:                 # refused before anything is touched: the group stays usable
            seq = plan.seq if seq is None else seq
            if seq is None:
                raise ValueError(f"ringcoll {plan.describe}: a call reaches the executor with its number, "
                                 f"taken at its entry (ringcoll.api.common.executor_context); got none")
        try:
            return self._execute(call, seq, tag, caller, blocking)
        except BaseException as error:
            # Anything raised once a call has its number fails the group on this rank (a local
            # reduction out of memory, a kernel that fails to load, a hook's error): its
            # messages may be half posted, and no later call may meet what is left of them
            if self.failure is None:
                self._failed(error, [], call=f"call #{seq} {plan.describe}" if tag is None else plan.describe)
            raise

    def _execute(self, call: Union[Plan, "Prepared"], seq: Optional[int], tag: Optional[int], caller,
                 blocking: bool) -> Optional[InFlight]:
        """:meth:`execute`'s body (every exception it raises fails the group)."""
        if not isinstance(call, Prepared) and call.late is not None:
            call = call.late()          # the group's placement agreed here, on the worker, in call order
        prepared = call if isinstance(call, Prepared) else self.prepare(call)
        plan, transport = prepared.plan, prepared.transport
        if tag is None:
            name, tag = f"call #{seq} {plan.describe}", tag_of(seq, prepared.print_bits)
        else:
            name = plan.describe
        timeout = self.timeout(plan, prepared.group_timeout)
        try:
            transport.ready(time.monotonic() + timeout)
        except (TimeoutError, RuntimeError) as error:   # set-up is part of the first step (NCCL)
            first = next((st.comms for st in prepared.steps if st.comms), ())
            failure = self._peer_error(name, 0, len(prepared.steps),
                                       TransferError(first, error, timed_out=True, batch=True), timeout)
            self._failed(failure, [])
            raise failure from error
        if self.check and seq is not None:
            # on the stream-ordered path its own call on the stream, read by the host: check
            # mode's one wait
            self._check(plan, seq, timeout)
        if transport.batched and transport.streamed:
            in_flight = self._enqueue(prepared, name, tag, timeout, caller)
            if not blocking:
                return in_flight
            self._await(in_flight)
            return None
        for before in prepared.before:
            before()
        self._run_steps(prepared, tag, timeout, name)
        for after in prepared.after:
            after()
        return None

    def _enqueue(self, prepared: "Prepared", name: str, tag: int, timeout: float, caller) -> InFlight:
        """The stream-ordered run of :meth:`execute`: everything the call does, its copies
        before and after the schedule included, enqueued on the transport's stream; the host's
        part of each (Python, checks, kernel compiles and loads, allocations) runs here, now, as
        on a GPU. Every kernel module the call's reductions need is compiled and loaded before
        its first transfer is posted. The tensors the plan's hooks read or write are kept by
        the call until it completes.

        Enqueueing that raises (a hook, a local step's Python, a compile, an allocation, a
        refused batch) leaves this rank's call incomplete while its peers' goes on, and NCCL
        matches messages by order alone: the rank's next call would pair with the peers' this
        one. So the group fails at once (its private communicator aborted, which fails the
        peers' transfers of this call promptly), the error raises, and every later call raises
        GroupFailedError."""
        transport = prepared.transport
        call = transport.open(name, timeout, len(prepared.steps), caller)
        call.on_failure = self._in_flight_failed
        try:
            op = prepared.plan.op
            for resolved in prepared.local:
                for dst, src, out, nbytes in resolved:
                    if nbytes is None:
                        continue
                    if op is None:
                        raise RuntimeError("a Reduce step needs a reduction operator, and this collective has none")
                    kernels.prepare_reduction(dst, src, op, out=out)
            for before in prepared.before:
                transport.local(before, keep=True)
            self._run_steps(prepared, tag, timeout, name)
            for after in prepared.after:
                transport.local(after, keep=True)
        except BaseException as error:
            enqueued = len(call.steps)
            transport.drop()
            if self.failure is None:      # a transfer's error has failed it already
                failure = RuntimeError(
                    f"ringcoll {name}: rank {self.rank}: enqueueing the call raised {type(error).__name__}: "
                    f"{error} ({enqueued} of its {len(prepared.steps)} steps enqueued); its peers' transfers "
                    f"of this call can no longer be matched in order, so the group is failed and its "
                    f"communicator aborted")
                failure.__cause__ = error
                self._failed(failure, [call, call.touched, prepared.buffers])
            raise
        return transport.close(tensors_in(prepared.buffers))

    def _in_flight_failed(self, call: InFlight, error: TransferError) -> BaseException:
        """The watchdog's report of a stream-ordered call that timed out or failed at a step
        (or whose local operation failed on the device, ``error.local``): the group fails (the
        private communicator is aborted) with the error naming it."""
        if getattr(error, "local", False):
            failure = RuntimeError(f"ringcoll {call.name}: rank {self.rank}: a local operation failed on the "
                                   f"stream: {type(error.error).__name__}: {error.error}")
            failure.__cause__ = error.error
        else:
            failure = self._peer_error(call.name, error.step, call.total, error, call.timeout)
        if self.failure is None:
            self._failed(failure, [call.keep, call.steps])
        return failure

    def _await(self, call: InFlight) -> None:
        """Block the host until ``call`` completed and the watchdog gave its verdict; raise
        its error."""
        call.host_wait()
        self.raise_if_failed()

    def _run_steps(self, prepared: "Prepared", tag: int, timeout: float, name: str) -> None:
        """``name``: the call, for errors (``call #7 all_reduce/ring ...``). On the stream-ordered path the
        transport's ``wait`` only orders its stream, and local operations are launched on it."""
        transport, op, local = prepared.transport, prepared.plan.op, prepared.local
        streamed = transport.streamed
        reach = prepared.reach(self.window)
        posted: deque = deque()          # handles of posted, unfinished steps, in step order
        next_post, index, handle = 0, 0, None
        try:
            for index, last in enumerate(reach):
                while next_post < last:
                    posted.append(self._post(prepared, next_post, tag))
                    next_post += 1
                handle = posted.popleft()
                if handle is not None:
                    transport.wait(handle, time.monotonic() + timeout)
                if local[index]:
                    if streamed:
                        transport.local(functools.partial(run_resolved, op, local[index]))
                    else:
                        run_resolved(op, local[index])
        except TransferError as error:
            failure = self._peer_error(name, getattr(error, "step", index), len(reach), error, timeout)
            self._failed(failure, [handle] + list(posted))
            raise failure from error.error
        except BaseException as error:          # a local step's: its transfers in flight kept too
            self._failed(error, [handle] + list(posted), call=f"{name} (step {index + 1}/{len(reach)})")
            raise

    def _post(self, prepared: "Prepared", index: int, tag: int):
        """Post step ``index``'s transfers (None when it has none): the one place a step
        starts moving (bench/faults.py injects its faults here)."""
        transfers = prepared.posts[index]
        if not transfers:
            return None
        try:
            handle = prepared.transport.post(transfers, tag)
        except TransferError as error:
            error.step = index
            raise
        if type(handle) is PostedStep:
            handle.index = index
        return handle

    def _peer_error(self, call: str, index: int, total: int, error: TransferError, timeout: float) -> PeerError:
        what = "timed out after %gs" % timeout if error.timed_out else "failed"

        def name(item) -> str:
            kind = "send to" if isinstance(item, Send) else "receive from"
            return f"{kind} peer {item.peer} (global rank {self.global_ranks[item.peer]}) of {item.buf!r}"

        peers = sorted({item.peer for item in error.items})
        also = ""
        if not error.items:
            subject = "the group's set-up"
        elif error.batch and len(error.items) > 1:
            subject = (f"a batch of {len(error.items)} transfers (NCCL reports a batch as a whole: "
                       f"{'; '.join(name(item) for item in error.items)})")
        else:
            subject = name(error.items[0])
            if len(error.items) > 1:     # the step's other transfers still incomplete then
                also = f"; still incomplete too: {'; '.join(name(item) for item in error.items[1:])}"
        message = (f"ringcoll {call}: rank {self.rank} step {index + 1}/{total}: {subject} {what}{also}: "
                   f"{error.error}")
        # a rank that failed its group first (the peer named, or the rank that peer waits on)
        notices = read_notices(self._store, [r for r in range(self.world) if r != self.rank])
        for rank, text in sorted(notices.items()):
            if text not in message:      # a peer's notice names the rank it failed on already
                message += f"; rank {rank} had failed the group: {text}"
        if error.timed_out:
            message += self._timeout_hint()
        first = error.items[0].peer if error.items and not error.batch else None
        return PeerError(message, rank=self.rank, peer=peers[0] if len(peers) == 1 else first,
                         step=index, peers=peers, call=call)

    def _timeout_hint(self) -> str:
        """What a timeout can mean, for the PeerError: the peer named is the one this rank
        waited on, which may itself be waiting on the rank that stalled; and without check
        mode a mismatched call looks exactly like a stall."""
        hint = (" -- the peer named is the one this rank was waiting on; it may itself be waiting on "
                "another rank (the rank that stalled or died is named by every neighbour of it)")
        if self.check:
            return hint + "; check mode is on and the ranks agreed on this call, so a peer stalled or died"
        return hint + ("; a mismatched call (ranks calling different collectives, or a rank skipping a "
                       "call) looks exactly like this: run with RINGCOLL_CHECK=1 to diagnose it (every rank "
                       "then raises a MismatchError naming what differs on which ranks)")

    def _failed(self, failure: BaseException, keep: list, call: str = "") -> None:
        """Mark the group failed. The failed call's posted transfers are kept alive for good:
        gloo may still hold their buffers' addresses, and a failed group is never used again.
        ``call``: the call that raised ``failure``, when the error does not name it itself
        (any error but ringcoll's own)."""
        if call and not getattr(failure, "call", ""):
            self.failed_call = call
        self.failure = failure
        leave_notice(self._store, self.rank, self._cause(failure))
        self._graveyard.append(keep)
        for transport in self._transports.values():
            transport.abort()

    # -- monitored barrier -----------------------------------------------------------------
    def monitored_barrier(self, seq: int, seconds: float, wait_all_ranks: bool = False) -> None:
        """gloo's ``monitoredBarrier`` on this group, as one call (it takes a call number and
        a tag of its own): every other rank sends rank 0 a token and waits for rank 0's
        release; rank 0 waits for each rank in turn, all within ``seconds`` of entering, and
        releases them once every rank has arrived. A rank that did not arrive in time makes
        rank 0 raise a :class:`PeerError` naming it (``wait_all_ranks``: naming every such
        rank, found by waiting on each until the same deadline) and leaves the group failed,
        as every timeout does; the others then time out waiting for the release. What it is
        for: finding the rank that hangs, where ``barrier()`` only says that some peer did.
        ``seq``: its number, taken at its entry as every call's (not a plan: it posts its own
        transfers, so it is the one call that does not go through :meth:`execute`)."""
        self.raise_if_failed()
        if self.world == 1:
            return
        tag, group = call_tag(seq, MONITORED), self.group
        deadline = time.monotonic() + seconds
        call = f"call #{seq} monitored_barrier"
        tokens = {peer: torch.zeros(1, dtype=torch.uint8) for peer in range(self.world) if peer != self.rank}

        def wait(work) -> Optional[BaseException]:
            """None once ``work`` completes, or its error (a peer's closed connection fails
            the post itself: then ``work`` is that error)."""
            if isinstance(work, BaseException):
                return work
            try:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
                return None
            except RuntimeError as error:
                return error

        def post(transfer, peer: int):
            try:
                return transfer([tokens[peer]], peer, tag)
            except RuntimeError as error:
                return error

        if self.rank != 0:
            for what, transfer in (("send its token to", group.send), ("receive the release from", group.recv)):
                work = post(transfer, 0)
                error = wait(work)
                if error is not None:
                    failure = PeerError(
                        f"ringcoll {call}: rank {self.rank} could not {what} rank 0 (global rank "
                        f"{self.global_ranks[0]}) within {seconds:g} s: rank 0 has not reached "
                        f"monitored_barrier, or another rank did not and rank 0 names it: {error}",
                        rank=self.rank, peer=0, step=0, call=call)
                    self._failed(failure, [work, tokens])
                    raise failure from error
            return
        works = {peer: post(group.recv, peer) for peer in tokens}
        missing = []
        for peer, work in works.items():
            if wait(work) is not None:
                missing.append(peer)
                if not wait_all_ranks:
                    break
        if missing:
            ranks = ", ".join(f"{peer} (global rank {self.global_ranks[peer]})" for peer in missing)
            failure = PeerError(
                f"ringcoll {call}: rank 0: {'rank' if len(missing) == 1 else 'ranks'} {ranks} failed to pass "
                f"monitoredBarrier in {seconds * 1000:.0f} ms" + ("" if wait_all_ranks else
                " (the first such rank; wait_all_ranks=True names every one)"),
                rank=self.rank, peer=missing[0] if len(missing) == 1 else None, step=0, peers=missing, call=call)
            self._failed(failure, [works, tokens])
            raise failure
        releases = {peer: post(group.send, peer) for peer in tokens}
        for peer, work in releases.items():
            error = wait(work)
            if error is not None:
                failure = PeerError(f"ringcoll {call}: rank 0 could not release rank {peer} (global rank "
                                    f"{self.global_ranks[peer]}) within {seconds:g} s: {error}",
                                    rank=self.rank, peer=peer, step=1, call=call)
                self._failed(failure, [releases, tokens])
                raise failure from error

    # -- check mode ----------------------------------------------------------------------
    def _check(self, plan: Plan, seq: int, timeout: float) -> None:
        """Exchange every rank's sequence number and fingerprint (a fixed-size record) with a
        ring all-gather on the call's device, through :meth:`execute` on its own tag, and raise the same
        :class:`MismatchError` on every rank if they differ, and leave the group failed on
        every rank: from a mismatch alone no rank can tell a different call from a skipped one
        (numbers count each rank's own calls, so a rank that skipped a call compares its next
        call with the others' skipped one, at the same number), and after a skip the ranks are
        out of step for good; identical calls would then pair up silently. A differing number
        means a rank's call failed its own checks after taking it."""
        table = torch.zeros(self.world * RECORD.size, dtype=torch.uint8)
        row = slice(self.rank * RECORD.size, (self.rank + 1) * RECORD.size)
        table[row] = torch.frombuffer(bytearray(pack_record(seq, fingerprint(plan))), dtype=torch.uint8)
        # on the call's own device and transport: an NCCL-only group has no CPU transport
        table = table.to(plan.device)
        ring = registry.get("all_gather", "ring")
        layout = Layout(table.numel(), {IN_PLACE: True})
        check_plan = Plan("check", ring, self.rank, self.world, layout, {"output": table}, timeout=timeout,
                          describe=f"fingerprint check of call #{seq} {plan.describe}")
        self.execute(check_plan, tag=CHECK_TAG, blocking=True)
        table = table.cpu()
        rows = [unpack_record(bytes(table[r * RECORD.size:(r + 1) * RECORD.size].tolist())) for r in range(self.world)]
        names = ("call number",) + FIELDS
        differences = []
        for column, field in enumerate(names):
            by_value: Dict[object, list] = {}
            for r, values in enumerate(rows):
                by_value.setdefault(values[column], []).append(r)
            if len(by_value) > 1:
                differences.append(f"{field}: " + " vs ".join(
                    f"{value!r} on ranks {ranks}" for value, ranks in by_value.items()))
        if not differences:
            return
        call = f"call #{seq} {plan.describe}"
        message = (f"ringcoll check: the ranks of the group disagree on their call (this rank, rank "
                   f"{self.rank}: {call}): " + "; ".join(differences) + ". Every rank raises this error.")
        error = MismatchError(message + " The group is failed on every rank (a skipped call leaves the "
                              "ranks out of step): create a new group to go on.",
                              rank=self.rank, differences=differences, call=call)
        self._failed(error, [])
        raise error


#: the fingerprint in monitored_barrier's tag (no plan: its transfers are its own)
class Prepared:
    """A plan made ready to run again and again, as MPI-4's persistent collectives
    (``MPI_Bcast_init`` once, ``MPI_Start`` per call): its steps; its buffers, scratch
    included; each step's transfers as (item, bytes) on those buffers; its transport; the
    fingerprint part of its tags; the group's timeout; its local operations on views of its
    buffers. Which later step may be posted while an earlier one is in flight is worked out
    once (:meth:`reach`). Valid for any later call
    whose tensors name the same memory with the same shapes, strides and dtypes: the drop-in
    checks that before it reuses one (ringcoll.api.common.run_call)."""

    __slots__ = ("plan", "steps", "buffers", "posts", "local", "transport", "print_bits", "group_timeout",
                 "before", "after", "device", "_addresses", "_reach")

    def __init__(self, plan, steps, buffers, posts, transport, bits, group_timeout, before, after):
        self.plan, self.steps, self.buffers, self.posts = plan, steps, buffers, posts
        self.before, self.after = before, after         # the plan's, less any staging copy Blocks spares
        self.device = plan.device
        self.transport, self.print_bits, self.group_timeout = transport, bits, group_timeout
        self.local = tuple(resolve_local(buffers, st.local) for st in steps)
        self._addresses = tuple((tensor, tensor.data_ptr()) for buffer in buffers.values()
                                for tensor in tensors_of(buffer))
        self._reach: Dict[int, Tuple[int, ...]] = {}

    def moved(self) -> bool:
        """Whether a buffer's memory has moved since (its storage resized in place, as FSDP
        frees and re-allocates parameters): the old address may then belong to another tensor,
        and this plan must not run again."""
        return any(buffer.data_ptr() != address for buffer, address in self._addresses)

    def reach(self, window: int) -> Tuple[int, ...]:
        """For each step, how many steps are posted once the executor waits on it, with up to
        ``window`` steps in flight: step j is posted early, while steps i .. j-1 are in flight,
        when none of its transfers touches what those steps still read or write. Worked out
        once per window."""
        known = self._reach.get(window)
        if known is None:
            reach, next_post = [], 0
            for index in range(len(self.steps)):
                while next_post < len(self.steps) and (
                        next_post == index or posts_early(self.steps, next_post, index, window)):
                    next_post += 1
                reach.append(next_post)
            known = self._reach[window] = tuple(reach)
        return known
