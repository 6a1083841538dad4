"""What every collective shares on its way to the runtime: the builders' table, the group context
(a call's group, executor and sequence number), and running a plan (persistent plans, the
stream-ordered path). Argument checks live in :mod:`._checks`, choosing and planning in
:mod:`._plans`."""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..schedules import registry
from ..config import Settings
from ..runtime.executor import P2PExecutor, Prepared
from ..runtime.nodes import group_placement, known_placement, share_placement
from ..cost.machine import Machine
from ..runtime.plan import Plan
from ..selection import checked_settings
from ..runtime.work import submit, submit_stream

log = logging.getLogger("ringcoll")

#: collective name -> builder(ctx, *args, **kwargs) -> Plan | None; the simulator uses them too
BUILDERS: Dict[str, Callable[..., Optional[Plan]]] = {}


#: builder -> the collective it was registered for (its first name)
_COLLECTIVE: Dict[Callable, str] = {}

#: collectives whose calls do not resolve the group's placement: a barrier moves tokens, has
#: no node-aware algorithm, and its ``timeout=`` must bound the whole call, even a group's first
#: (a barrier that looks for a dead peer); the next other collective call resolves it
WITHOUT_LAYOUT = frozenset({"barrier"})


def builder(collective: str):
    def decorate(fn):
        BUILDERS[collective] = fn
        _COLLECTIVE.setdefault(fn, collective)
        return fn
    return decorate


@dataclass
class Context:
    """One rank's view of a group: its rank (None outside the group), the world size, and on
    a process group its executor and this call's sequence number in the group."""

    rank: Optional[int]
    world: Optional[int]
    executor: Optional[P2PExecutor] = None
    seq: Optional[int] = None
    #: node of each rank: on a group its agreed placement, resolved at the call's entry
    #: (executor_context); in the simulator simulate's local_size, if given (ringcoll.runtime.nodes)
    nodes: Optional[Tuple[int, ...]] = None
    nodes_from: Optional[str] = None             # where ``nodes`` came from, for the log
    machine: Optional[Machine] = None            # auto's model: Options(machine=), simulate's
    #: the call's checked settings, read once at its entry (run_call); None: read when needed
    settings: Optional[Settings] = None
    #: the group's placement is agreed inside this call's run, not at its entry (an
    #: ``async_op=True`` call at its group's first collective call: :func:`executor_context`'s
    #: ``defer``); building on the caller's thread then reads a stand-in, and ``provisional``
    #: records that the plan depended on it
    placement_pending: bool = False
    provisional: bool = False

    def submit(self, plan: Optional[Plan], async_op: bool, rebuild: Optional[Callable[[], Plan]] = None):
        """Run this call's ``plan`` (None: nothing to run) now or, with ``async_op``, as a Work;
        ``rebuild``: how the plan is built again (see :meth:`late`)."""
        if plan is None:
            return None
        self.late(plan, rebuild)
        return submit_call(self.executor, plan, self.seq, async_op)

    def late(self, plan: Plan, rebuild: Optional[Callable[[], Plan]]) -> Plan:
        """Give ``plan`` what its run does first when its group's placement is still to be agreed
        (``plan.late``, called by the executor on the worker thread, in call order): agree the
        placement (every rank does at this call, as at any group's first collective call), then
        return the plan to run: ``plan`` itself, or, if building it read the stand-in placement
        (a node-aware algorithm, ``auto`` weighing nodes), ``rebuild()`` on the agreed one.
        The caller's thread has built and checked the call already, so bad input was refused
        at the call; the same checks pass again. ``plan`` unchanged otherwise."""
        if not self.placement_pending:
            return plan
        if rebuild is None:
            raise RuntimeError(f"ringcoll {plan.describe}: a call deferring its group's placement needs "
                               f"a way to build its plan again")

        def agreed() -> Plan:
            self.agree(plan.collective)
            if not self.provisional:
                return plan
            self.provisional = False
            return rebuild()

        plan.late = agreed
        return plan

    def agree(self, collective: str = "") -> None:
        """Agree the group's placement now, if still pending: in the call's run (on the worker
        thread, in call order), never at an asynchronous call's entry."""
        if self.placement_pending:
            self.nodes, self.nodes_from = group_placement(self.executor, call=f"call #{self.seq} {collective}".rstrip())
            self.placement_pending = False


def executor_context(executor: P2PExecutor, machine: Optional[Machine] = None, *, layout: bool = True,
                     collective: Optional[str] = None, defer: bool = False) -> Context:
    """A collective call's context on ``executor``: the one place a call takes its sequence
    number in its group, for the drop-ins (:func:`group_context`, :func:`run_call`) and the
    backend (``ringcoll.backend``) alike, by the rule of docs/semantics.md#a-calls-number.
    ``machine``: auto's model (the backend's ``Options(machine=)``).

    The context also carries the group's placement (:func:`ringcoll.runtime.nodes.group_placement`),
    resolved here, after the number: agreed by one exchange at the group's first collective call
    (every rank makes it, at the same point), read from the group's record after that, so the
    builders and ``auto`` only read it. Every caller is a collective call (point-to-point
    send/recv never come here); ``layout=False``: a call that needs none (:data:`WITHOUT_LAYOUT`,
    monitored_barrier), whose context then has none. ``collective``: the call's, for the
    exchange's errors.

    ``defer``: the call runs asynchronously (``async_op=True``, every backend call), so it must
    not wait on a peer here: when the group has no placement yet (its first collective call), the
    exchange is left to the call's own run, on the worker thread in call order (the same point
    in every rank's sequence of calls, whichever rank runs it where), and the context is
    ``placement_pending`` until then (:meth:`Context.late`)."""
    seq = executor.begin_call()
    nodes = source = None
    pending = False
    if layout:
        known = known_placement(executor)
        if known is not None:
            nodes, source = known
        elif defer and executor.world > 1:
            pending = True
        else:
            nodes, source = group_placement(executor, call=f"call #{seq} {collective or ''}".rstrip())
    return Context(executor.rank, executor.world, executor, seq, nodes=nodes, nodes_from=source,
                   machine=machine, placement_pending=pending)


def call_context(executor: P2PExecutor, collective: Optional[str], machine: Optional[Machine] = None, *,
                 defer: bool = False) -> Context:
    """:func:`executor_context` for a call of ``collective`` (a builder's name; None: a
    composite call, an object collective): with the group's placement unless the collective needs
    none; ``defer``: an asynchronous call's (the placement then possibly agreed in its run)."""
    return executor_context(executor, machine, layout=collective not in WITHOUT_LAYOUT, collective=collective,
                            defer=defer)


_executors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CPU = torch.device("cpu")


def _serving_backend(group, device: Optional[torch.device]):
    """The backend that runs ``group``'s calls on ``device`` with executors of its own, found
    through torch's per-device lookup (``group._get_backend(device)``: for a ``"ringcoll"``
    group in torch 2.13, the :class:`~ringcoll.backend.ProcessGroupRingcoll` itself); None for
    any other group (gloo, NCCL, a group without a backend for that device)."""
    try:
        backend = group._get_backend(device if device is not None else _CPU)
    except (RuntimeError, AttributeError):      # torch: "No backend type associated with device type"
        return None
    return backend if callable(getattr(backend, "executor", None)) else None


def _executor(group, device: Optional[torch.device] = None) -> P2PExecutor:
    """The executor of a registered group this process belongs to, for calls on ``device``
    (None: a call without tensors, which runs as a CPU call).

    A ``"ringcoll"`` group runs a drop-in's call on its own executor for that device
    (``ProcessGroupRingcoll.executor(device)``), the one its ``dist.*`` calls use: one call
    numbering, one failure state, the group's timeout, its private communicator and, for
    CUDA tensors over NCCL, its stream-ordered path. Any other group gets one executor of the
    drop-ins' own (it holds the group weakly, or this cache would keep every destroyed group
    alive)."""
    backend = _serving_backend(group, device)
    if backend is not None:
        return backend.executor(device if device is not None else _CPU)
    executor = _executors.get(group)
    if executor is None:
        executor = _executors[group] = P2PExecutor(group, weak=True)
        share_placement(executor, group)       # one placement per group, the backend's executors' too
    return executor


#: the group of the last call and what serves it: (weak reference to the group, its executor
#: when it is the drop-ins' own, else a weak reference to the ringcoll backend that serves it);
#: the one lookup of a call that repeats on its group (a weak key's lookup builds a reference).
#: A ringcoll backend is asked for its executor at every call: it depends on the call's device
#: (the backend serves every device of its group), and it is gone once the group is shut down
_last: tuple = (lambda: None, None, None)


def group_executor(group, device: Optional[torch.device] = None) -> Optional[P2PExecutor]:
    """The executor of ``group`` (None: the default group) for this process's call on
    ``device`` (None: a call without tensors; see :func:`_executor`); None when this process
    is not a member."""
    if group is not None and not isinstance(group, dist.ProcessGroup) \
            and group is not dist.GroupMember.NON_GROUP_MEMBER:
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    if group is None:
        group = dist.distributed_c10d._get_default_group()   # torch's own error when not initialised
    global _last
    last, executor, served = _last
    if group is last():                 # a member: it had an executor
        if executor is not None:
            return executor
        backend = served()
        if backend is not None:
            return backend.executor(device if device is not None else _CPU)
    if group is dist.GroupMember.NON_GROUP_MEMBER or dist.distributed_c10d._rank_not_in_group(group):
        return None
    backend = _serving_backend(group, device)
    if backend is not None:
        _last = (weakref.ref(group), None, weakref.ref(backend))
        return backend.executor(device if device is not None else _CPU)
    executor = _executor(group)
    _last = (weakref.ref(group), executor, None)
    return executor


def _call_device(values) -> Optional[torch.device]:
    """The device of a drop-in call's first tensor (in its arguments, or the first item of a
    list argument), which picks the executor on a ringcoll group as the backend's methods do;
    None for a call without tensors (barrier)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0].device
    return None


def group_machine(group) -> Optional[Machine]:
    """The machine a ringcoll-backend group was made with (``pg_options=ringcoll.Options(
    machine=)``; None: the default group), so that the drop-ins on it choose and lay out as
    its own calls do; None for any other group."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    machine = getattr(getattr(group, "options", None), "machine", None)
    return machine if isinstance(machine, Machine) else None


def group_context(group) -> Context:
    """The context of ``group`` (None: the default group) for this process."""
    executor = group_executor(group)
    current = _call_settings(executor)
    # The call takes its number here (docs/semantics.md#a-calls-number); a failed group raises.
    ctx = Context(None, None) if executor is None else executor_context(executor, group_machine(group))
    ctx.settings = current              # read once, as run_call's
    return ctx


def _call_settings(executor) -> Settings:
    """The settings of this call (:func:`ringcoll.config.settings`), read before anything is
    touched: a bad RINGCOLL_* value is refused here, naming it. A rank that refuses still
    takes the call's number, as an argument error does (see group_context): a setting bad on
    one host only must not shift this rank's later calls against its peers'."""
    try:
        return checked_settings()
    except ValueError:
        if executor is not None:
            executor_context(executor, layout=False)        # the number only: its facts are unreadable
        raise


# -- persistent plans ---------------------------------------------------------------------
#: plans kept per group when RINGCOLL_PERSISTENT_PLANS is unset (0: none, every call builds
#: its own), least recently used dropped first; a call whose tensors hold more bytes than
#: PERSISTENT_MAX_BYTES keeps none: its transfers dwarf the cost of a new plan, and a kept
#: plan keeps its tensors' memory (see run_call)
PERSISTENT_PLANS = 16
PERSISTENT_MAX_BYTES = 1 << 20


#: argument types a key holds as they are, checked first (most of a call's arguments)
_ATOMS = frozenset({int, str, bool, float, type(None)})
_TENSOR, _PARAMETER, _STRIDED = torch.Tensor, torch.nn.Parameter, torch.strided


class _NotKeyed(Exception):
    """An argument a call's key cannot hold: the call builds its plan afresh."""


def _signature(values, tensors: list) -> tuple:
    """The key of a call's arguments: each tensor by the memory and view it names (address,
    shape, strides, dtype, device; the conjugate bit of a complex one), lists and tuples item
    by item, anything else as itself (hashable, or the key is refused). ``tensors`` collects
    the tensors."""
    key = []
    for value in values:
        kind = value.__class__
        if kind in _ATOMS:
            key.append(value)
        elif isinstance(value, _TENSOR):
            if kind is not _TENSOR and not isinstance(value, _PARAMETER) or value.layout is not _STRIDED:
                raise _NotKeyed                 # a subclass's own dispatch may differ
            tensors.append(value)
            dtype = value.dtype
            if dtype.is_complex:
                key.append((value.data_ptr(), value.shape, value.stride(), dtype, value.device,
                            value.is_conj(), value.is_neg()))
            else:
                key.append((value.data_ptr(), value.shape, value.stride(), dtype, value.device))
        elif isinstance(value, (list, tuple)):
            key.append((kind, _signature(value, tensors)))
        else:
            key.append(value)
    return tuple(key)


def check_async(async_op) -> bool:
    """``async_op`` as the bool torch makes of it, checked before anything else.

    torch hands ``async_op`` to a C++ option (pybind11's bool conversion), which takes True,
    False, None (False) and any object whose type defines ``__bool__``: ints, floats, numpy
    bools, one-element tensors. It refuses, with a TypeError, what has no ``__bool__`` or
    whose ``__bool__`` fails: strings, lists, plain objects, tensors of several elements."""
    if async_op is None or isinstance(async_op, bool):
        return bool(async_op)
    to_bool = getattr(type(async_op), "__bool__", None)
    if to_bool is not None:
        try:
            value = to_bool(async_op)
        except Exception:  # noqa: BLE001 - refused below, as torch
            value = None
        if isinstance(value, bool):
            return value
    raise TypeError(f"async_op must be a bool, got {type(async_op).__name__} {async_op!r:.60} (torch also "
                    f"takes None, numbers and one-element tensors, by their truth value)")


#: each group's persistent plans (its executor -> prepared plans by call, least recently used
#: first): the api's own state, kept beside the executor, not on it, and gone with it
_PERSISTENT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def persistent_plans(executor: P2PExecutor) -> "OrderedDict[tuple, Prepared]":
    """The persistent plans :func:`run_call` keeps for ``executor``'s group."""
    plans = _PERSISTENT.get(executor)
    if plans is None:
        plans = _PERSISTENT[executor] = OrderedDict()
    return plans


def run_call(build: Callable[..., Optional[Plan]], group, async_op, *args, **kwargs):
    """Run one drop-in call: ``build(ctx, *args, **kwargs)`` checks the arguments and makes
    the plan, which this rank's executor for ``group`` runs now or, with ``async_op``, as a
    Work.

    A synchronous call repeated with the same arguments reuses the plan its first instance
    prepared (the executor's :class:`~ringcoll.runtime.executor.Prepared`: checks passed, algorithm
    chosen, schedule expanded, transfers resolved), as MPI's persistent collectives: on a
    2-core gloo host a small broadcast spends more time building its plan than moving its
    bytes. "The same" is exact: each tensor names the same memory with the same shape,
    strides and dtype (the kept plan holds that memory, so the address cannot have been
    handed to another tensor meanwhile; a plan whose memory moved, a storage resized in
    place, is dropped: :meth:`Prepared.moved`), every other argument is equal, and so are the
    settings (:func:`ringcoll.config.settings`: every RINGCOLL_* variable, the files they
    name and the registry of algorithms). Only calls whose tensors hold at most
    :data:`PERSISTENT_MAX_BYTES` and whose plan reads their data when it runs (not a copy
    made while building: :func:`_rerunnable`) keep a plan; a call takes its sequence number
    (docs/semantics.md#a-calls-number) and tag afresh either way."""
    async_op = check_async(async_op)
    executor = group_executor(group, _call_device((*args, *kwargs.values())))
    current = _call_settings(executor)
    limit = PERSISTENT_PLANS if current.persistent_plans is None else current.persistent_plans
    if executor is None:
        ctx = Context(None, None, settings=current)
        return ctx.submit(build(ctx, *args, **kwargs), async_op)
    ctx = call_context(executor, _COLLECTIVE.get(build), group_machine(group), defer=async_op)
    ctx.settings = current              # the call reads its settings once: choosing reads these
    if async_op or limit <= 0:
        return ctx.submit(build(ctx, *args, **kwargs), async_op, lambda: build(ctx, *args, **kwargs))
    tensors: list = []
    try:
        key = (build, tuple(kwargs), _signature((*args, *kwargs.values()), tensors), current, registry.loaded_version())
        prepared = persistent_plans(executor).get(key)
    except (_NotKeyed, TypeError, RuntimeError):
        # not hashable, or a tensor without an address (its call's checks say what is wrong)
        key = prepared = None
    if prepared is not None and prepared.moved():
        persistent_plans(executor).pop(key, None)
        prepared = None
    if prepared is not None:
        try:
            persistent_plans(executor).move_to_end(key)
        except KeyError:                    # dropped meanwhile by a call on another thread
            pass
        plan = prepared.plan
        log.info("%s: world %d, rank %d -> %s (%s; plan reused)", plan.describe, plan.world,
                 plan.rank, plan.algorithm.name, plan.why)
        return submit_call(executor, prepared, ctx.seq, False)
    plan = build(ctx, *args, **kwargs)
    if plan is None:
        return None
    if key is None or sum(t.numel() * t.element_size() for t in tensors) > PERSISTENT_MAX_BYTES \
            or not _rerunnable(plan, tensors, executor):
        return ctx.submit(plan, False)
    executor.raise_if_failed()
    prepared = executor.prepare(plan)
    persistent_plans(executor)[key] = prepared
    if len(persistent_plans(executor)) > limit:
        persistent_plans(executor).popitem(last=False)
    return submit_call(executor, prepared, ctx.seq, False)


def _rerunnable(plan: Plan, tensors: list, executor: P2PExecutor) -> bool:
    """Whether ``plan`` reads the caller's data when it runs, not when it was built: each of
    its buffers is the memory of one of the call's tensors, or the executor's (staging), or
    one of the plan's own (Plan.own). A buffer the builder filled itself (the contiguous
    copy of a strided tensor, the clone that separates an input from its output) holds this
    call's data only."""
    owned = {t.untyped_storage().data_ptr() for t in tensors}
    owned |= executor.lent()
    return all(name in plan.own or buffer.untyped_storage().data_ptr() in owned
               for name, buffer in plan.buffers.items())


def submit_streamed(executor: P2PExecutor, run: Callable, async_op: bool, result, device: torch.device,
                    describe: str, collective: str, *, late: bool = False):
    """A call on the stream-ordered path (ringcoll.runtime.work.submit_stream): ``run(caller)``
    enqueues it; a barrier blocks the host until its peers arrived, as NCCL's. ``late``: the
    call's run first agrees its group's placement (``Plan.late``), so the worker enqueues it and
    its transport (a private communicator every rank sets up together) is made there too."""
    # a late call's transport is made in its run, on the worker: the process's runtime for now
    runtime = executor.stream_runtime(device) if late else executor.transport(device).runtime

    def task(caller):
        with torch.no_grad():
            return run(caller)

    return submit_stream(task, async_op, result, runtime, device, describe,
                         blocking=collective == "barrier", queued=late)


def submit_call(executor: P2PExecutor, call: Union[Plan, Prepared], seq: int, async_op: bool):
    """Run call ``seq`` (a plan, or a persistent one prepared earlier) in call order, now or as
    a Work: the api's one way to the runtime (:meth:`P2PExecutor.execute`), on the
    stream-ordered path enqueued after the caller's stream."""
    executor.raise_if_failed()          # at once, not after the calls queued before it
    plan = call.plan if isinstance(call, Prepared) else call
    if executor.stream_ordered(plan.device):
        return submit_streamed(executor, lambda caller: executor.execute(call, seq, caller=caller), async_op,
                               plan.result, plan.device, plan.describe, plan.collective,
                               late=plan.late is not None)
    if isinstance(call, Prepared) and not (call.before or call.after):   # the schedule alone: detached buffers
        return submit(lambda: executor.execute(call, seq), async_op, plan.result, device=plan.device,
                      describe=plan.describe)

    def task():
        with torch.no_grad():
            executor.execute(call, seq)

    return submit(task, async_op, plan.result, device=plan.device, describe=plan.describe)
