"""ringcoll as a torch.distributed backend: ``dist.init_process_group("ringcoll")``.

    import torch.distributed as dist
    dist.init_process_group("ringcoll")          # unmodified DDP, FSDP2, DeviceMesh code follows

:class:`ProcessGroupRingcoll` is a ``dist.ProcessGroup`` that owns one inner point-to-point
group per device type: gloo for CPU tensors; NCCL for CUDA tensors (or, when NCCL is absent
or ``RINGCOLL_CUDA_TRANSPORT=gloo``, the gloo group with CUDA tensors staged through host
memory). Every collective torch calls on it is handed to the drop-in's builder
(``ringcoll.api.BUILDERS``) with a :class:`~ringcoll.api.common.Context` over
the inner group's :class:`~ringcoll.runtime.executor.P2PExecutor`, so argument checks, the choice of
algorithm and the ``RINGCOLL_DEBUG`` log are exactly the drop-ins'; the inner group only
moves point-to-point messages (its own collectives never run). User send/recv go straight to
the inner group.

A device-mapped string (``"cpu:gloo,cuda:ringcoll"``) collapses to this group in torch 2.13
(a Python ProcessGroup replaces the whole group), so tensors are routed by their device.

``pg_options=ringcoll.Options(all_reduce="ring", broadcast="binomial")`` fixes algorithms per
group; otherwise ``RINGCOLL_ALGO`` and the ``auto`` table choose, as for the drop-ins.
"""
from __future__ import annotations

import datetime
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from ..schedules import registry
from ..config import settings
from ..selection import checked_settings
from ..api.common import BUILDERS, Context, call_context, executor_context, submit_streamed
from ..api._checks import as_real
from ..runtime.executor import P2PExecutor
from ..runtime.failures import PeerError, get_timeout
from ..runtime.nodes import share_placement
from ..runtime.transport.stream_ordered import private_nccl_environment
from ..cost.machine import Machine
from ..ops import RedOpType
from ..api.p2p import _SendRecvWork
from ..runtime.work import Work, submit, timeout_seconds
from .sparse import sparse_all_reduce

NAME = "ringcoll"


class Options:
    """``pg_options`` of a ringcoll group: the algorithm each collective runs on that group.

    ``Options(all_reduce="ring", broadcast="binomial")``: keys are collectives
    (``ringcoll.algorithms()``), values one of their algorithms or ``"auto"``; collectives
    not named choose as the drop-ins do (``RINGCOLL_ALGO``, then the ``auto`` table). A name
    given here wins over ``RINGCOLL_ALGO``. ``machine=ringcoll.Machine(...)`` (or
    ``ringcoll.fit(...)``) is the machine ``auto``'s model weighs this group's calls on, in
    place of ``RINGCOLL_MACHINE`` (ringcoll.selection.machine). Checked when built:
    ValueError naming the collective and its algorithms."""

    def __init__(self, machine: Optional[Machine] = None, **algorithms: str):
        if machine is not None and not isinstance(machine, Machine):
            raise TypeError(f"Options: machine must be a ringcoll.Machine, got {type(machine).__name__}")
        self.machine = machine
        known = registry.algorithms()
        for collective, name in algorithms.items():
            if collective not in known:
                raise ValueError(f"Options: collective must be one of {sorted(known)}, got {collective!r}")
            if not isinstance(name, str):
                raise TypeError(f"Options: {collective} must be an algorithm name (str), got "
                                f"{type(name).__name__} {name!r}")
            if name != "auto" and name not in known[collective]:
                raise ValueError(f"Options: {collective}={name!r} is not an algorithm of {collective}; "
                                 f"choose 'auto' or one of {known[collective]}")
        self.algorithms: Dict[str, str] = dict(algorithms)

    def algorithm(self, builder_name: str) -> str:
        return self.algorithms.get(registry.collective_of(builder_name), "auto")

    def __repr__(self) -> str:
        inner = ", ".join([f"{k}={v!r}" for k, v in self.algorithms.items()]
                          + ([f"machine={self.machine!r}"] if self.machine is not None else []))
        return f"ringcoll.Options({inner})"


def _op(opts):
    """The ReduceOp of torch's options as the builders take it: the RedOpType, or the
    premul-sum op itself (its ``factor`` raises on every other op)."""
    kind = opts.reduceOp.op
    return opts.reduceOp if kind == RedOpType.PREMUL_SUM else kind


def _real(tensor: torch.Tensor) -> torch.Tensor:
    """Complex tensors move (and sum) as their real view, as the drop-ins do; torch refuses
    complex MIN/MAX/PRODUCT before a call reaches a backend."""
    return as_real(tensor)


def _reals(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [_real(t) for t in tensors]


class _StagedRecvWork(_SendRecvWork):
    """A receive of a CUDA tensor over gloo: the wire is a host buffer, copied in on wait."""

    def __init__(self, inner: dist.Work, wire: torch.Tensor, tensor: torch.Tensor):
        super().__init__([inner], lambda: tensor.copy_(wire), [tensor])

    def _source_rank(self) -> int:
        return self._works[0]._source_rank()


class ProcessGroupRingcoll(dist.ProcessGroup):
    """The ``"ringcoll"`` backend's process group (see the module docstring). Built by torch
    through :func:`create` for ``init_process_group``/``new_group``; ``store`` is the group's
    own PrefixStore, ``rank`` and ``world`` group-local."""

    def __init__(self, store, rank: int, world: int, timeout: datetime.timedelta,
                 options: Optional[Options] = None, global_ranks: Optional[List[int]] = None):
        super().__init__(rank, world)
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"pg_options must be a ringcoll.Options for the ringcoll backend, got "
                            f"{type(options).__name__}")
        self._store = store
        self._rank, self._world = rank, world
        self._timeout = timeout
        self.options = options or Options()
        self.global_ranks = list(global_ranks) if global_ranks else list(range(world))
        self._group_name = ""
        self._group_desc = ""
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("ringcoll/gloo/", store), rank, world, timeout)
        # where the executors make their private communicators (the stream-ordered path): user
        # send/recv on the inner groups can then never be matched with ringcoll's messages
        self._private_store = dist.PrefixStore("ringcoll/executor/", store)
        self._executors: Dict[str, P2PExecutor] = {
            "cpu": self._named(P2PExecutor(self._gloo, rank=rank, world=world, backend="gloo",
                                           store=self._private_store))}
        self._nccl = None
        self._closed: Optional[str] = None    # "shutdown" or "abort" once closed
        #: what _get_sequence_number_for_group adds to the executors' call numbers: this
        #: group's point-to-point operations, and the numbers of executors closed
        self._p2p_calls = 0
        self._closed_calls = 0
        self._lock = threading.Lock()

    # -- identity (the C++ name of a Python group is unset otherwise; DeviceMesh needs it) ------
    def getBackendName(self) -> str:
        return NAME

    def name(self) -> str:
        return NAME

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def timeout(self) -> datetime.timedelta:
        """The group's timeout (``init_process_group``/``new_group``'s ``timeout=``, torch's
        default otherwise): how long a step of any call on this group, ``dist.*`` or drop-in,
        waits for its peers unless ``RINGCOLL_TIMEOUT`` or ``ringcoll.set_timeout`` say
        otherwise (``ringcoll.runtime.failures.group_timeout`` reads it here)."""
        return self._timeout

    def get_group_store(self):
        """The group's store, as gloo's group gives it: the PrefixStore torch registered the
        group with (``distributed_c10d._get_process_group_store``); for a group built directly,
        not through torch, the store it was built with. (The C++ ProcessGroup holds none: a
        Python group is made without one.)"""
        try:
            return dist.distributed_c10d._get_process_group_store(self)
        except KeyError:
            return self._store

    def _get_sequence_number_for_group(self) -> int:
        """torch's sequence number of this group, as gloo's: 0 when the group is made, one
        more per operation on it, equal on every rank at the same point of the program. Here
        the call numbers the group's executors have taken (every collective call on it,
        ``dist.*`` and drop-in alike, on every device: one per tensor of a coalesced call,
        three for a sparse all_reduce, one for a monitored_barrier, where gloo counts one, one
        and its messages) plus one per send and receive, as gloo counts them. Python callers
        only: torch's C++ does not route this method to a Python group."""
        with self._lock:
            executors = list(self._executors.values())
        # the executors' numbers: P2PExecutor.begin_call's count, read without taking one
        return self._closed_calls + sum(executor._seq for executor in executors) + self._p2p_calls

    def _set_sequence_number_for_group(self) -> None:
        """torch calls it on a new gloo or NCCL group (and a split one); as on gloo, numbers
        start at 0 on every rank when the group is made, so there is nothing to agree."""

    def eager_connect_single_device(self, device) -> None:
        """torch's eager connect for ``device`` (a ``torch.device``), collective as NCCL's:
        the executor for that device made now and, on the stream-ordered path (CUDA tensors
        over NCCL), its private communicator connected within the group's timeout. On the CPU,
        or CUDA staged over gloo, there is nothing more to connect (the gloo group connected
        every pair when it was made), as on gloo. torch itself calls it only for groups that
        support splitting, which this one does not (``init_process_group(device_id=)``
        connects at the first call instead)."""
        if not isinstance(device, torch.device):
            raise TypeError(f"eager_connect_single_device: device must be a torch.device, got "
                            f"{type(device).__name__} {device!r}")
        executor = self.executor(device)
        if device.type == "cuda" and device.index is None and executor.backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())   # NCCL's communicator is per GPU
        if executor.streamed(device):
            seconds = get_timeout() or self._timeout.total_seconds()
            executor.transport(device).ready(time.monotonic() + seconds)

    @property
    def _device_types(self) -> List[torch.device]:
        """What object collectives, checkpointing and DCP read: CPU always (object
        collectives then stay in host memory), CUDA where torch has it."""
        devices = [torch.device("cpu")]
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        return devices

    def _get_backend(self, device=None):
        """torch asks a group for its per-device backend (``device_id`` eager init,
        destroy_process_group, batch_isend_irecv): this group serves every device itself."""
        return self

    # -- shutdown (destroy_process_group calls it) ------------------------------------------
    def shutdown(self) -> None:
        """Wait for this process's queued ringcoll calls, then shut the inner gloo/NCCL groups
        down, so their threads are joined now rather than left to interpreter exit (where a
        gloo group still alive can abort the process: ``terminate called without an active
        exception``)."""
        submit(lambda: None, False)
        self._close("shutdown")

    def abort(self) -> None:
        """Abort the inner groups at once, as NCCL's abort: pending transfers fail."""
        self._close("abort")

    def _close(self, how: str) -> None:
        with self._lock:
            inner = [pg for pg in (self._gloo, self._nccl) if pg is not None]
            executors = list(self._executors.values())
            self._closed_calls += sum(executor._seq for executor in executors)
            self._executors.clear()
            self._closed = how
        for executor in executors:        # their private communicators (the stream-ordered path)
            executor.close(how)
        for pg in inner:
            getattr(pg, how)()

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __repr__(self) -> str:
        return f"ProcessGroupRingcoll(rank={self._rank}, world={self._world}, {self.options!r})"

    # -- routing by device -------------------------------------------------------------------
    def _cuda_transport(self) -> str:
        wanted = settings().cuda_transport
        return "nccl" if wanted == "nccl" and dist.is_nccl_available() else "gloo"

    def executor(self, device: torch.device) -> P2PExecutor:
        """The executor for tensors on ``device``: over gloo for CPU; for CUDA over an NCCL
        group built on first use (every rank meets the same first CUDA collective), or over
        gloo, staged through host memory."""
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"tensors of a ringcoll group must be on a CPU device (moved over gloo) or a "
                             f"CUDA device (over NCCL, or gloo through host memory), got a tensor on device "
                             f"{device}")
        kind = device.type
        executor = self._executors.get(kind)
        if executor is None:
            if self._closed:
                raise RuntimeError(f"this ringcoll process group was {'shut down' if self._closed == 'shutdown' else 'aborted'} "
                                   f"(destroy_process_group or abort); create a new group")
            with self._lock:
                executor = self._executors.get(kind)
                if executor is None:
                    if self._cuda_transport() == "nccl":
                        options = dist.ProcessGroupNCCL.Options()
                        options._timeout = self._timeout
                        with private_nccl_environment():     # NCCL's teardown: ringcoll reports
                            self._nccl = dist.ProcessGroupNCCL(dist.PrefixStore("ringcoll/nccl/", self._store),
                                                               self._rank, self._world, options)
                        executor = P2PExecutor(self._nccl, rank=self._rank, world=self._world, backend="nccl",
                                               store=self._private_store)
                    else:
                        executor = P2PExecutor(self._gloo, rank=self._rank, world=self._world, backend="gloo",
                                               store=self._private_store)
                    self._executors[kind] = self._named(executor)
        return executor

    def _named(self, executor: P2PExecutor) -> P2PExecutor:
        """``executor`` naming peers by this group's global ranks in its errors (built on an
        inner group that torch does not know, it would count them from 0), and reading this
        group's one placement (agreed at its first collective call, whichever executor
        and path, drop-in or backend, makes it)."""
        executor.global_ranks = list(self.global_ranks)
        share_placement(executor, self)
        return executor

    def _context(self, collective: str, tensor: Optional[torch.Tensor]) -> Context:
        """A ``collective`` call's context on the executor of ``tensor``'s device: the call takes
        its number here, at its entry, before the builder's checks, and the group's placement
        with it, as a drop-in's does (:func:`ringcoll.api.common.call_context`)."""
        device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
        # every call here is asynchronous (torch waits on the Work for a synchronous one): at a
        # group's first call the placement is agreed in the call's run, never on the caller's thread
        return call_context(self.executor(device), collective, machine=self.options.machine, defer=True)

    def _plan(self, collective: str, tensor: Optional[torch.Tensor], *args, **kwargs):
        """The drop-in's plan for this call on the executor of ``tensor``'s device, with its
        number (one per plan: docs/semantics.md#a-calls-number); bad input raises here, before any
        tensor is touched."""
        ctx = self._context(collective, tensor)

        def build():
            plan = BUILDERS[collective](ctx, *args, algorithm=self.options.algorithm(collective), **kwargs)
            group_limit = timeout_seconds(self._timeout)
            if plan.timeout is None and group_limit is not None and get_timeout() is None:
                plan.timeout = group_limit  # RINGCOLL_TIMEOUT / set_timeout, when given, win
            return plan

        return ctx.executor, ctx.late(build(), build)

    def _submit(self, planned: list, result) -> Work:
        """One Work running the plans in order, after every earlier call (async calls
        complete in call order). On the stream-ordered path (CUDA tensors over NCCL) the plans
        are enqueued on ringcoll's stream after the caller's current stream, and the Work is
        NCCL's kind (ringcoll.runtime.work.StreamWork): its wait() orders the waiting stream, its
        future is stream-aware."""
        if planned:
            executor, first = planned[0]
            device = first.device
            if all(ex is executor and plan.device == device for ex, plan in planned) \
                    and executor.stream_ordered(device):

                def run(caller):
                    call = None
                    for _, plan in planned:
                        call = executor.execute(plan, caller=caller)
                    return call

                return submit_streamed(executor, run, True, result, device, first.describe, first.collective,
                                       late=any(plan.late is not None for _, plan in planned))

        def task():
            with torch.no_grad():
                for executor, plan in planned:
                    executor.execute(plan)

        device = planned[0][1].device if planned else None
        return submit(task, True, result, device=device,         # the caller's stream, on gloo too
                      describe=planned[0][1].describe if planned else "")

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        op = _op(opts)
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, op)
        planned = [self._plan("all_reduce", t, _real(t), op) for t in tensors]
        return self._submit(planned, list(tensors))

    def _sparse_allreduce(self, tensors, op):
        device = tensors[0].device if tensors else torch.device("cpu")
        # its three inner all_gathers take their numbers here, at the call's entry
        # (the group's placement, at its first call, agreed in the call's run: sparse_all_reduce)
        contexts = [executor_context(self.executor(device), machine=self.options.machine, defer=True)
                    for _ in range(3)]
        return sparse_all_reduce(tensors, op, contexts, self.options.algorithm("all_gather_into_tensor"))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        planned = [self._plan("broadcast", t, _real(t), group_src=opts.rootRank) for t in tensors]
        return self._submit(planned, list(tensors))

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        op = _op(opts)
        planned = [self._plan("reduce", t, _real(t), None, op, group_dst=opts.rootRank) for t in tensors]
        return self._submit(planned, list(tensors))

    def allgather(self, output_lists, inputs, opts=None):
        planned = [self._plan("all_gather", t, _reals(outs), _real(t)) for outs, t in zip(output_lists, inputs)]
        return self._submit(planned, list(output_lists))

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """``output_lists[r][i]`` receives rank r's ``inputs[i]``."""
        planned = [self._plan("all_gather", t, _reals([outs[i] for outs in output_lists]), _real(t))
                   for i, t in enumerate(inputs)]
        return self._submit(planned, list(output_lists))

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        planned = [self._plan("all_gather_into_tensor", i, _real(o), _real(i)) for o, i in zip(outputs, inputs)]
        return self._submit(planned, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._reduce_scatter("reduce_scatter", outputs, input_lists, _reals, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter("reduce_scatter_tensor", outputs, inputs, _real, opts)

    def _reduce_scatter(self, collective, outputs, inputs, real_input, opts):
        """Plan ``collective`` per (output, input) pair, the input made real by
        ``real_input`` (a list of tensors or one tensor), and submit them as one work."""
        op = _op(opts or dist.ReduceScatterOptions())
        planned = [self._plan(collective, o, _real(o), real_input(i), op) for o, i in zip(outputs, inputs)]
        return self._submit(planned, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists, inputs, opts=None):
        opts = opts or dist.GatherOptions()
        outputs = _reals(output_lists[0]) if output_lists else None
        tensor = inputs[0]
        planned = [self._plan("gather", tensor, _real(tensor), outputs, group_dst=opts.rootRank)]
        return self._submit(planned, list(output_lists[0]) if output_lists else [])

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ScatterOptions()
        inputs = _reals(input_lists[0]) if input_lists else None
        tensor = outputs[0]
        planned = [self._plan("scatter", tensor, _real(tensor), inputs, group_src=opts.rootRank)]
        return self._submit(planned, list(outputs))

    def alltoall(self, outputs, inputs, opts=None):
        planned = [self._plan("all_to_all", outputs[0] if outputs else None, list(outputs), list(inputs))]
        return self._submit(planned, list(outputs))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        planned = [self._plan("all_to_all_single", output, output, input,
                              list(output_split_sizes) or None, list(input_split_sizes) or None)]
        return self._submit(planned, [output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        """A dissemination barrier on one-byte tokens over the CPU group (``opts.device_ids``
        names GPUs for NCCL's barrier; tokens here never need one). ``opts.timeout``, when
        set, bounds each step."""
        timeout = getattr(opts, "timeout", None) if opts is not None else None
        seconds = timeout_seconds(timeout)
        planned = [self._plan("barrier", None, None,
                              datetime.timedelta(seconds=seconds) if seconds is not None else None)]
        return self._submit(planned, [])

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier (see :meth:`P2PExecutor.monitored_barrier`): rank 0 waits
        for each rank in turn and raises naming the rank that did not arrive within
        ``timeout`` (a timedelta or seconds; the group's own when None), or every such rank
        with ``wait_all_ranks``. A zero timeout is already expired, as gloo's: rank 0 raises at
        once naming rank 1 (every other rank with ``wait_all_ranks``), the other ranks wait for
        its release within the group's timeout, as gloo's do (a negative one is refused). Call
        it on the group, ``group.monitored_barrier(timeout)``: ``dist.monitored_barrier``
        refuses every backend name but gloo's before it reaches a group (torch 2.13,
        ``distributed_c10d.monitored_barrier``)."""
        if not isinstance(wait_all_ranks, bool):
            raise TypeError(f"wait_all_ranks must be a bool, got {type(wait_all_ranks).__name__} {wait_all_ranks!r}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (datetime.timedelta, int, float))):
            raise TypeError(f"timeout must be a datetime.timedelta, seconds or None, got "
                            f"{type(timeout).__name__} {timeout!r}")
        given = None if timeout is None else (
            timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout))
        if given is not None and given < 0:
            raise ValueError(f"timeout must be zero (already expired, as gloo's) or positive, got {timeout!r}")
        seconds = given if given else timeout_seconds(self._timeout)
        if seconds is None:
            raise ValueError(f"timeout must be positive: monitored_barrier needs a deadline, and this group's "
                             f"own timeout is {self._timeout!r}; pass timeout=")
        ctx = executor_context(self.executor(torch.device("cpu")), layout=False)   # its number, at its entry
        if given == 0 and ctx.rank == 0 and ctx.world > 1:
            submit(lambda: _expired_monitored_barrier(ctx, wait_all_ranks), False)   # after earlier calls
            return
        submit(lambda: ctx.executor.monitored_barrier(ctx.seq, seconds, wait_all_ranks), False)

    # -- point to point: the inner group's own ------------------------------------------------
    def _staged(self, tensor: torch.Tensor) -> bool:
        return tensor.is_cuda and self.executor(tensor.device).backend != "nccl"

    def _p2p_group(self, tensor: torch.Tensor):
        if tensor.is_cuda and self.executor(tensor.device).backend == "nccl":
            return self._nccl
        return self._gloo

    def send(self, tensors, dst: int, tag: int):
        self._p2p_calls += 1
        if any(self._staged(t) for t in tensors):
            return self._gloo.send([t.to("cpu") if t.is_cuda else t for t in tensors], dst, tag)
        return self._p2p_group(tensors[0]).send(list(tensors), dst, tag)

    def _receive(self, tensors, post):
        """``post(group, tensors)`` on the inner group; a CUDA tensor over gloo through a host
        buffer."""
        if len(tensors) == 1 and self._staged(tensors[0]):
            wire = torch.empty(tensors[0].shape, dtype=tensors[0].dtype)
            return _StagedRecvWork(post(self._gloo, [wire]), wire, tensors[0])
        return post(self._p2p_group(tensors[0]), list(tensors))

    def recv(self, tensors, src: int, tag: int):
        self._p2p_calls += 1
        return self._receive(tensors, lambda group, wires: group.recv(wires, src, tag))

    def recv_anysource(self, tensors, tag: int):
        self._p2p_calls += 1
        return self._receive(tensors, lambda group, wires: group.recv_anysource(wires, tag))


def _expired_monitored_barrier(ctx: Context, wait_all_ranks: bool) -> None:
    """Rank 0's monitored barrier with a zero timeout, as gloo's: expired before any rank
    could be waited for, so it names rank 1 (every other rank with ``wait_all_ranks``) as not
    passed, in gloo's words, and leaves the group failed as every timeout does (the other
    ranks, waiting for a release that never comes, time out and fail theirs)."""
    executor = ctx.executor
    executor.raise_if_failed()
    missing = list(range(1, ctx.world)) if wait_all_ranks else [1]
    ranks = ", ".join(f"{peer} (global rank {executor.global_ranks[peer]})" for peer in missing)
    call = f"call #{ctx.seq} monitored_barrier"
    failure = PeerError(
        f"ringcoll {call}: rank 0: {'rank' if len(missing) == 1 else 'ranks'} {ranks} failed to pass "
        f"monitoredBarrier in 0 ms: Rank 0 timed out in monitoredBarrier after 0 ms (a zero timeout is "
        f"already expired, as gloo's)", rank=0, peer=missing[0] if len(missing) == 1 else None, step=0,
        peers=missing, call=call)
    executor._failed(failure, [])
    raise failure


#: the underscored methods torch's C++ calls on a group (the rest it calls are public)
_PRIVATE_ENTRY_POINTS = ("_allgather_base", "_reduce_scatter_base", "_get_backend")
#: public methods that only ringcoll calls, on every call (a drop-in on the group looks its
#: executor up): never reached from torch's C++, so left unwrapped (the wrapper costs ~4 us)
_RINGCOLL_ONLY = ("executor",)


def _run_eagerly(cls):
    """Mark every method torch's C++ calls on ``cls`` as never traced by Dynamo
    (``torch.compiler.disable``). Under ``torch.compile(DDP(model))`` the reducer calls the
    group (its ``broadcast`` from ``_rebuild_buckets``) while Dynamo is tracing; Dynamo then
    traces into the Python method as if it were the model's code and fails on the first
    attribute of ``self``, a TorchScript object to it (``UnsafeScriptObjectError: Member
    '_plan' is not registered``). A collective is communication, never part of a graph: it
    runs as it does without compile, as gloo's C++ methods do."""
    if cls.__dict__.get("_eager"):
        return cls
    for name, member in list(vars(cls).items()):
        if callable(member) and not isinstance(member, type) and (
                not name.startswith("_") and name not in _RINGCOLL_ONLY or name in _PRIVATE_ENTRY_POINTS):
            setattr(cls, name, torch.compiler.disable(member, recursive=True))
    cls._eager = True
    return cls


def create(opts, pg_options=None) -> ProcessGroupRingcoll:
    """The creator torch calls (``extended_api=True``) for every ringcoll group. Every
    RINGCOLL_* setting is checked first, so a bad one fails ``init_process_group`` naming
    the variable, not a later call."""
    checked_settings()
    # torch 2.15's flight-recorder hook fails on a Python group ("default backend type 0"): skip it
    getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", set()).add(NAME)
    # at the first group, not at import: torch.compiler.disable imports Dynamo (about a second),
    # which every `import ringcoll` (each launched rank, the drop-ins' users) would pay
    _run_eagerly(ProcessGroupRingcoll)
    return ProcessGroupRingcoll(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                                options=pg_options, global_ranks=list(opts.global_ranks_in_group or []))


NAME = "ringcoll"


def register() -> None:
    """Register the ``"ringcoll"`` backend with torch.distributed (idempotent), as
    ``ringcoll_autoload.register`` does when torch loads its entry point: whichever runs first
    registers. The creator is :func:`create` itself; ringcoll_autoload (above the package: torch
    imports it without ringcoll) is never imported from here."""
    if dist.is_available() and NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
