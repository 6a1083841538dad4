"""Which node each rank of a group runs on, for the node-aware (hierarchical) algorithms.

Words: a group's **placement** is the node of each of its ranks (the word
:class:`ringcoll.Machine` uses for the same thing); a schedule's **layout**
(:class:`~ringcoll.schedules.vocabulary.Layout`) is something else, its parameters. The
placement reaches a schedule as its layout's ``NODES`` parameter (``"nodes"``): a tuple giving
the node index of every group rank (nodes numbered in order of their lowest rank; a node's ranks
need not be consecutive and nodes may differ in size). The builders
(``ringcoll.api._plans.new_plan``) add it, for schedules marked with
:func:`~ringcoll.schedules.vocabulary.needs_nodes` only, and ``auto``'s model reads it; both
read it from the call's context (:func:`context_placement`), never ask for it: building a plan
runs nothing.

**A group's placement is agreed by all its ranks, never inferred by one, once, when the group is
first used for a collective call.** Every collective call, drop-in (object collectives
included) or backend (``dist.*`` on a ``"ringcoll"`` group, its sparse all_reduce included),
resolves it at its entry, right after taking its number
(``ringcoll.api.common.executor_context``), and carries it in its context; point-to-point
send/recv never do (not every rank makes them, so they cannot exchange), nor do barriers and
monitored_barrier (tokens only, no node-aware algorithm, and a ``timeout=`` that must bound
the whole call even as a group's first). At the group's first such call (every rank makes
it, whatever algorithm it runs), each rank
contributes its own facts in one fixed-size record: its global rank, its
``RINGCOLL_LOCAL_SIZE``, torchrun's ``GROUP_RANK`` and its hostname. The group all-gathers the
records once through its store (each rank sets its record under the exchange's key and reads
the others': no device, no communicator, no message on any transport; a raw group built
without a store uses ringcoll's own ring on a tag of its own instead), and every rank derives
the placement from the same gathered list, by the first of:

1. ``RINGCOLL_LOCAL_SIZE=L`` (set on every rank, to the same value): nodes of L consecutive
   global ranks (the last one may be smaller), which emulates nodes on one machine. Set on
   some ranks only, or to different values: the same ValueError on every rank, naming the
   values per rank;
2. torchrun's ``GROUP_RANK`` (the node rank of the agent that started the rank), on every
   rank: one node per GROUP_RANK. Set on some ranks only: the same ValueError on every rank;
3. the hostnames: one node per hostname.

torchrun's ``LOCAL_WORLD_SIZE`` is never used: it counts the ranks of one node only, and
nodes may differ (``--nproc-per-node 3`` on one host, ``1`` on another) -- grouping every
rank by its own count gave each rank a different placement. The placement is kept per group with
its source (:func:`group_placement`), for every executor of the group (:func:`share_placement`: the
drop-in's and the ``"ringcoll"`` backend's, so both paths see one placement from one exchange),
keyed by this rank's record: a setting changed on every rank between calls takes effect,
with a new exchange, at the next collective call. The cost: one store write and ``world - 1``
store reads of 719-byte records per rank, once per group. An asynchronous call never waits for
it on the caller's thread: at a group's first call it runs in the call's own run
(``ringcoll.api.common.Context.late``; docs/design.md, Decisions).

Outside a process group (the simulator), the placement is ``simulate(..., local_size=L)``'s
(the context's ``nodes``), else ``RINGCOLL_LOCAL_SIZE``'s, else one node.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import socket
import struct
import threading
import weakref
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from .. import config
from ..config import settings
from ..schedules.vocabulary import IN_PLACE, Nodes
from .identity import tag_of

log = logging.getLogger("ringcoll")

#: the placement exchange's reserved tag: the fingerprint bits 0 are never a call's, the sequence
#: bits 1 never check mode's tag (identity.CHECK_TAG)
PLACEMENT_TAG = tag_of(1, 0)


def grouped(keys: Sequence) -> Nodes:
    """Node index per rank from any per-rank key (a hostname, global rank // L ...), nodes
    numbered in order of first appearance."""
    index: dict = {}
    return tuple(index.setdefault(key, len(index)) for key in keys)


def even_nodes(world: int, local_size: int, global_ranks: Optional[Sequence[int]] = None) -> Nodes:
    """Nodes of ``local_size`` consecutive global ranks."""
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
        raise ValueError(f"local_size must be a positive int, got {local_size!r}")
    ranks = range(world) if global_ranks is None else global_ranks
    return grouped([rank // local_size for rank in ranks])


def model_local_size(nodes: Optional[Nodes]) -> Optional[int]:
    """The L (ranks per node) the node-aware cost models take for ranks on ``nodes``: the
    ranks every node holds, the node of the last rank allowed fewer (nodes of L consecutive
    ranks, as :func:`even_nodes` and ``RINGCOLL_LOCAL_SIZE=L`` give them: the models count
    ⌈p/L⌉ nodes); None without nodes or for other uneven ones (the models then read the
    environment)."""
    if nodes is None:
        return None
    counts = collections.Counter(nodes)
    last = counts.pop(nodes[-1])
    sizes = set(counts.values())
    if not sizes:
        return last
    size = sizes.pop()
    return size if not sizes and last <= size else None


def describe_placement(nodes: Nodes) -> str:
    """``nodes`` for a log line: how many nodes of how many ranks, and the tuple itself
    while it is short."""
    sizes = [count for _, count in sorted(collections.Counter(nodes).items())]
    shape = (f"{len(sizes)} node{'s' if len(sizes) != 1 else ''} of "
             f"{sizes[0] if len(set(sizes)) == 1 else '+'.join(map(str, sizes))} rank{'s' if sizes != [1] else ''}")
    return f"{shape} {tuple(nodes)}" if len(nodes) <= 16 else shape


# -- this rank's settings: the one place the placement reads the environment --------------------
#: the settings every rank of a group must share, because each changes which messages go where:
#: RINGCOLL_SEGMENT the pipelined schedules' steps (how many messages, of what size);
#: RINGCOLL_TRANSPORT the transport (``streamed`` runs on a private communicator, ``batched``
#: through the NCCL-shaped shim: ranks on different ones never meet); RINGCOLL_CHECK an exchange
#: of fingerprints before every call; RINGCOLL_ALGO, the tuning table's rows and the machine
#: auto's model weighs (RINGCOLL_TUNING, RINGCOLL_MACHINE: their files' content) the algorithm;
#: RINGCOLL_CUDA_TRANSPORT whether CUDA tensors go over NCCL or gloo. Not compared, as they
#: change no message: RINGCOLL_WINDOW (how many steps are in flight: each peer's sends and
#: receives are still posted in step order), RINGCOLL_PERSISTENT_PLANS (a kept plan is the plan a
#: new build gives), RINGCOLL_KERNELS (the local reduction), the timeouts and the log.
#: (RINGCOLL_LOCAL_SIZE and GROUP_RANK have rules of their own: :func:`agreed_placement`.)
SHARED_SETTINGS = ("RINGCOLL_SEGMENT", "RINGCOLL_TRANSPORT", "RINGCOLL_CHECK", "RINGCOLL_ALGO",
                   "RINGCOLL_TUNING", "RINGCOLL_MACHINE", "RINGCOLL_CUDA_TRANSPORT")
#: bytes of a shared setting's key and of the value its errors show (on the wire)
KEY_BYTES, SHOWN_BYTES = 8, 48


class Shared(NamedTuple):
    """One setting of :data:`SHARED_SETTINGS` as a rank contributes it: ``key``, 8 bytes that
    stand for what must agree (a digest of the value as the rank reads it, of a file's
    content), and ``shown``, the value as the errors show it ("" when unset)."""

    key: bytes
    shown: str


def shared_setting(value: str, shown: Optional[str] = None) -> Shared:
    """A setting whose ``value`` (text, "" when unset) must agree, shown as ``shown`` (default
    the value; cut to :data:`SHOWN_BYTES` with the key's digits, so values that differ never
    look alike)."""
    key = hashlib.blake2b(value.encode(), digest_size=KEY_BYTES).digest()
    text = value if shown is None else shown
    if len(text.encode()) > SHOWN_BYTES:
        text = text.encode()[:SHOWN_BYTES - 12].decode(errors="ignore") + "..#" + key.hex()[:8]
    return Shared(key, text)


def file_setting(path: Optional[str], content: Optional[bytes]) -> Shared:
    """A setting naming a file (RINGCOLL_TUNING, RINGCOLL_MACHINE): what must agree is the
    file's ``content``, not its path (hosts may keep it in different places)."""
    if path is None:
        return shared_setting("")
    digest = hashlib.blake2b(content or b"", digest_size=KEY_BYTES).hexdigest()
    name = path.rsplit("/", 1)[-1]
    shown = f"{name[:SHOWN_BYTES - 20]} (content {digest[:8]})"
    return Shared(bytes.fromhex(digest), shown)


_FILES: dict = {}           # path -> (mtime, content): a file is read again only when it changes


def _content(variable: str, path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None

    def load(name: str) -> bytes:
        with open(name, "rb") as file:
            return file.read()

    return config.read_cached(_FILES, variable, path, load)


def _settings(executor=None) -> Tuple[str, str, Tuple[Shared, ...]]:
    """This rank's ``RINGCOLL_LOCAL_SIZE`` and torchrun's ``GROUP_RANK`` as text ("" when
    unset), checked by :mod:`ringcoll.config`, and its :data:`SHARED_SETTINGS`, in that order:
    RINGCOLL_TRANSPORT and RINGCOLL_CHECK as ``executor`` runs them (it fixed them when it was
    made), the others as a call reads them now."""
    current = settings()
    transport = getattr(executor, "transport_mode", None) or current.transport
    check = getattr(executor, "check", None)
    check = current.check if check is None else bool(check)
    shared = (
        shared_setting("" if current.segment is None else str(current.segment)),
        shared_setting(transport),
        shared_setting("on" if check else "off"),
        shared_setting(repr(current.algo), current.algo_text),
        file_setting(current.tuning, _content("RINGCOLL_TUNING", current.tuning)),
        file_setting(current.machine, _content("RINGCOLL_MACHINE", current.machine)),
        shared_setting(current.cuda_transport),
    )
    return ("" if current.local_size is None else str(current.local_size), current.group_rank, shared)


def parse_local_size(value: str) -> int:
    """A gathered ``RINGCOLL_LOCAL_SIZE`` (checked on its own rank) as a positive int."""
    return config.parse_int("RINGCOLL_LOCAL_SIZE", value, 1, "ranks per node")


def local_size_from_env() -> Optional[int]:
    """Ranks per node from this process's RINGCOLL_LOCAL_SIZE, else None (never torchrun's
    LOCAL_WORLD_SIZE: a per-node count, not every node's). The simulator and the node-aware
    cost models read it; a process group's placement is agreed by exchange (:func:`group_placement`)."""
    return settings().local_size


# -- the agreed placement of a process group ------------------------------------------------------
class Facts(NamedTuple):
    """What one rank contributes to its group's placement, and the settings its ranks must share."""

    global_rank: int
    local_size: str         # RINGCOLL_LOCAL_SIZE, "" when unset
    group_rank: str         # torchrun's GROUP_RANK (its node's rank), "" when unset
    hostname: str
    shared: Tuple[Shared, ...] = ()     # SHARED_SETTINGS, in that order (none: not compared)


#: a rank's facts on the wire: fixed size, so the group all-gathers equal blocks; text fields
#: cut at their width (a longer setting is no positive integer anyway; POSIX hostnames fit),
#: then each of SHARED_SETTINGS as its key and the value shown (:class:`Shared`)
RECORD = struct.Struct("<q32s32s255s" + f"{KEY_BYTES}s{SHOWN_BYTES}s" * len(SHARED_SETTINGS))


def pack_facts(facts: Facts) -> bytes:
    shared = facts.shared or (Shared(b"", ""),) * len(SHARED_SETTINGS)
    if len(shared) != len(SHARED_SETTINGS):
        raise ValueError(f"facts must carry {len(SHARED_SETTINGS)} shared settings "
                         f"({', '.join(SHARED_SETTINGS)}), got {len(shared)}")
    return RECORD.pack(facts.global_rank, *(text.encode()[:width] for text, width in
                                             ((facts.local_size, 32), (facts.group_rank, 32), (facts.hostname, 255))),
                       *(field for one in shared for field in (one.key, one.shown.encode()[:SHOWN_BYTES])))


def unpack_facts(record: bytes) -> Facts:
    global_rank, *fields = RECORD.unpack(record)

    def text(raw: bytes) -> str:
        return raw.rstrip(b"\0").decode(errors="replace")

    shared = tuple(Shared(key, text(shown)) for key, shown in zip(fields[3::2], fields[4::2]))
    return Facts(global_rank, *(text(raw) for raw in fields[:3]), shared)


def _per_rank(values: Sequence[str]) -> str:
    """``values`` (one per group rank) as "'2' on ranks [0, 1], unset on ranks [2]"."""
    ranks: dict = {}
    for rank, value in enumerate(values):
        ranks.setdefault(value, []).append(rank)
    return ", ".join(f"{repr(value) if value else 'unset'} on rank{'s' if len(members) > 1 else ''} {members}"
                     for value, members in ranks.items())


def disagreeing_settings(facts: Sequence[Facts]) -> List[str]:
    """Each of :data:`SHARED_SETTINGS` whose key is not the same on every rank of ``facts``, as
    "RINGCOLL_SEGMENT: '4096' on rank [0], unset on rank [1]" (group ranks), in
    SHARED_SETTINGS order. Facts without shared settings (made by hand) are not compared."""
    if not facts or any(len(f.shared) != len(SHARED_SETTINGS) for f in facts):
        return []
    found = []
    for index, name in enumerate(SHARED_SETTINGS):
        if len({f.shared[index].key for f in facts}) > 1:
            found.append(f"{name}: {_per_rank([f.shared[index].shown for f in facts])}")
    return found


def agreed_placement(facts: Sequence[Facts]) -> Tuple[Nodes, str]:
    """(nodes, source) from every group rank's facts, in group rank order (module docstring for
    the order of the sources). A pure function of the gathered list, so every rank derives the
    same placement, or raises the same ValueError: first where a setting of
    :data:`SHARED_SETTINGS` differs between ranks (every such setting, with each rank's value),
    which would otherwise crash or hang the group's calls."""
    differ = disagreeing_settings(facts)
    if differ:
        raise ValueError(f"settings that change which messages go where must be the same on every rank "
                         f"of the group, got {'; '.join(differ)} (group ranks); set them alike in every "
                         f"rank's environment")
    local_sizes = [f.local_size for f in facts]
    if len(set(local_sizes)) > 1:
        raise ValueError(f"RINGCOLL_LOCAL_SIZE must be the same on every rank of the group (the ranks "
                         f"agree on one placement), got {_per_rank(local_sizes)} (group ranks)")
    if local_sizes and local_sizes[0]:
        size = parse_local_size(local_sizes[0])
        return even_nodes(len(facts), size, [f.global_rank for f in facts]), f"RINGCOLL_LOCAL_SIZE={size}"
    group_ranks = [f.group_rank for f in facts]
    if any(group_ranks):
        if not all(group_ranks):
            raise ValueError(f"GROUP_RANK (torchrun's node rank) must be set on every rank of the group or "
                             f"on none, got {_per_rank(group_ranks)} (group ranks); start every rank with "
                             f"torchrun, or set RINGCOLL_LOCAL_SIZE on every rank")
        return grouped(group_ranks), "torchrun's GROUP_RANK"
    return grouped([f.hostname for f in facts]), "hostnames"


def own_facts(executor) -> Facts:
    """This rank's facts: its global rank (the world's, when torch.distributed is initialised:
    a raw or ringcoll-backend group's executor numbers its ranks from 0), its node settings, its
    hostname, and the settings its group's ranks must share (:data:`SHARED_SETTINGS`)."""
    import torch.distributed as dist

    global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() \
        else executor.global_ranks[executor.rank]
    local_size, group_rank, shared = _settings(executor)
    return Facts(global_rank, local_size, group_rank, socket.gethostname(), shared)


class Agreed(NamedTuple):
    """A group's agreed placement as one rank knows it: the settings and packed facts this rank
    contributed, the nodes and their source."""

    settings: object
    record: bytes
    nodes: Nodes
    source: str


#: each group's agreed placement, by its owner (:func:`share_placement`: the group, for a drop-in's
#: executor and every executor of a "ringcoll"-backend group; else the executor itself); kept
#: beside the executors, not on them, and gone with the owner
_AGREED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: executor -> weak reference to the owner its placement is kept under
_OWNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def share_placement(executor, owner) -> None:
    """Keep ``executor``'s placement under ``owner`` (a process group): the executors of one group
    (the drop-in's, the backend's per device) then agree once and read one placement."""
    _OWNERS[executor] = weakref.ref(owner)


def _owner(executor):
    ref = _OWNERS.get(executor)
    owner = ref() if ref is not None else None
    return executor if owner is None else owner


def agreed(executor) -> Optional[Tuple[Nodes, str]]:
    """The placement ``executor``'s group agreed, with its source, or None before its exchange."""
    known = _AGREED.get(_owner(executor))
    return None if known is None else (known.nodes, known.source)


def known_placement(executor) -> Optional[Tuple[Nodes, str]]:
    """``executor``'s group's placement and its source when no exchange is needed to know it (agreed
    earlier, and this rank's facts unchanged since), else None: what :func:`group_placement` returns
    without waiting on a peer. An ``async_op=True`` call whose group has none yet agrees it inside
    its own run (``ringcoll.api.common.executor_context``), never on the caller's thread."""
    owner, current = _owner(executor), settings()
    known = _AGREED.get(owner)
    if known is None:
        return None
    if known.settings is current:
        return known.nodes, known.source
    if known.record == pack_facts(own_facts(executor)):
        _AGREED[owner] = known._replace(settings=current)
        return known.nodes, known.source
    return None


def group_placement(executor, device=None, call: str = "") -> Tuple[Nodes, str]:
    """The node of every rank of ``executor``'s group and where that came from (``"hostnames"``,
    ``"torchrun's GROUP_RANK"``, ``"RINGCOLL_LOCAL_SIZE=2"``): agreed by exchange at the group's
    first collective call, then kept for the group (:func:`agreed`) while this rank's facts
    stay the same (the same settings: about a microsecond to tell). Called at every collective
    call's entry (``ringcoll.api.common.executor_context``), never while a plan is built:
    every rank of the group makes the same collective calls in the same order, so the ranks
    exchange at the same call; a call made by some ranks only (send/recv) never asks. A
    group of one rank derives its placement without an exchange. ``device``: where the exchange
    runs (default: CPU where the group serves it, else the current CUDA device). ``call``: the
    call it runs for (``"call #1 all_reduce"``), named by its errors: a peer that never comes
    fails the exchange, within the step timeout, naming it and that call."""
    known = known_placement(executor)
    if known is not None:
        return known
    if executor.world == 1:
        return _agree(executor, device, call)
    # behind the calls queued before this one: an asynchronous call among them may be agreeing
    # the placement in its run right now, and then this call reads what it agreed
    return _in_call_order(lambda: known_placement(executor) or _agree(executor, device, call))


def _agree(executor, device, call: str) -> Tuple[Nodes, str]:
    """The exchange itself (:func:`group_placement`): this rank's record, every rank's, the placement."""
    owner, current = _owner(executor), settings()
    record = pack_facts(own_facts(executor))
    gathered = [record] if executor.world == 1 else _all_gather_records(executor, record, device, call)
    nodes, source = agreed_placement([unpack_facts(r) for r in gathered])
    before = _AGREED.get(owner)
    _AGREED[owner] = Agreed(current, record, nodes, source)
    # a new placement is news (INFO); the same one agreed again after a setting changed is not
    news = before is None or (before.nodes, before.source) != (nodes, source)
    log.log(logging.INFO if news else logging.DEBUG, "group of %d ranks (rank %d): %s from %s",
            executor.world, executor.rank, describe_placement(nodes), source)
    return nodes, source


def context_placement(ctx) -> Tuple[Nodes, str]:
    """(nodes, source) for a call's context, read, never exchanged: the placement its entry put
    there (``ctx.nodes``: its group's agreed placement, or simulate's ``local_size``), else (no
    group: the simulator) RINGCOLL_LOCAL_SIZE's nodes, else one node. A context on a group
    without its placement is a call that skipped its entry: refused, so that building a plan can
    never run an exchange."""
    if getattr(ctx, "nodes", None) is not None:
        return tuple(ctx.nodes), getattr(ctx, "nodes_from", None) or "simulate's local_size"
    if getattr(ctx, "placement_pending", False):
        # an async call at its group's first collective call, built on the caller's thread
        # before the placement is agreed (inside its run): one node stands in, and the call's run
        # builds its plan again on the agreed placement (ringcoll.api.common.Context.late)
        ctx.provisional = True
        return (0,) * ctx.world, "a stand-in until the group agrees its placement"
    if ctx.executor is not None:
        raise RuntimeError("ringcoll: a call on a process group builds its plan with the placement its entry "
                           "resolved (ringcoll.api.common.executor_context); this context has none")
    size = local_size_from_env()
    if size is not None:
        return even_nodes(ctx.world, size), f"RINGCOLL_LOCAL_SIZE={size}"
    return (0,) * ctx.world, "one node (no group)"


def _in_call_order(exchange: Callable[[], object]):
    """Run ``exchange`` after every call this process queued before it (an NCCL group matches
    messages by order, not tag), on the caller's thread when nothing is queued; inline when
    already on the queue's worker thread (a call made from inside a queued one)."""
    from . import work

    if getattr(work._queue, "_thread", None) is threading.current_thread():
        return exchange()
    gathered: list = []
    work.submit(lambda: gathered.append(exchange()), False, describe="placement exchange")
    return gathered[0]


def _all_gather_records(executor, record: bytes, device=None, call: str = "") -> List[bytes]:
    """Every group rank's ``record`` (equal sizes), in group rank order: through the group's
    store where the executor has one (every registered group, every ``"ringcoll"`` group),
    else with a ring all-gather on the executor's transport (a raw group built without a
    store). The store needs no device and no communicator: an NCCL-only group never makes one
    on a GPU for it, and ranks whose transports differ still meet there."""
    store = getattr(executor, "_store", None)
    if store is not None:
        return _store_records(executor, store, record, call)
    return _ring_records(executor, record, device, call)


#: each group's exchanges so far, by its owner (:func:`share_placement`), for the store's keys:
#: every rank exchanges at the same calls, so the counts agree
_EXCHANGES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _store_records(executor, store, record: bytes, call: str) -> List[bytes]:
    """The exchange through the group's store: each rank sets its record under the exchange's
    own key and reads every other rank's, waiting for them up to the step timeout; a rank that
    does not come fails the exchange with a PeerError naming it and the call, and leaves the
    group failed, as a transfer's timeout would."""
    import time

    from .failures import PeerError, get_timeout, group_timeout

    owner = _owner(executor)
    count = _EXCHANGES.get(owner, 0) + 1
    _EXCHANGES[owner] = count
    keys = [f"ringcoll/placement/{count}/{rank}" for rank in range(executor.world)]
    executor.raise_if_failed()
    seconds = get_timeout() or group_timeout(executor.group)
    store.set(keys[executor.rank], record)
    others = [key for rank, key in enumerate(keys) if rank != executor.rank]
    # polled, never ``store.wait``: a store client serves one request at a time, and a wait
    # for a late peer would hold every other store request of this process (another group's
    # exchange, a failure notice, c10d's own) for as long
    deadline, pause = time.monotonic() + seconds, 0.0005
    while not store.check(others):
        if time.monotonic() >= deadline:
            missing = [rank for rank, key in enumerate(keys) if rank != executor.rank and not store.check([key])]
            name = f"placement exchange of {call}" if call else "placement exchange"
            failure = PeerError(
                f"ringcoll {name}: rank {executor.rank}: rank{'s' if len(missing) != 1 else ''} "
                f"{', '.join(map(str, missing)) or '(none missing now)'} did not reach the group's first "
                f"collective call within {seconds:g} s (the group's store holds no record of "
                f"{'theirs' if len(missing) != 1 else 'its'})",
                rank=executor.rank, peer=missing[0] if len(missing) == 1 else None, step=0, peers=missing, call=name)
            executor._failed(failure, [])
            raise failure
        time.sleep(pause)
        pause = min(2 * pause, 0.02)
    return [record if rank == executor.rank else store.get(key) for rank, key in enumerate(keys)]


def _ring_records(executor, record: bytes, device=None, call: str = "") -> List[bytes]:
    """Every group rank's ``record`` by a ring all-gather on the executor's transport, on the
    placement's own tag (as check mode's fingerprint exchange, ``P2PExecutor._check``). A failed
    transfer leaves the group failed, as any call's."""
    import torch

    from ..schedules import registry
    from .plan import Plan
    from ..schedules.vocabulary import Layout

    executor.raise_if_failed()
    if device is None:
        device = torch.device("cpu") if "cpu" in executor.device_backends \
            else torch.device("cuda", torch.cuda.current_device())
    size = len(record)
    table = torch.zeros(executor.world * size, dtype=torch.uint8)
    table[executor.rank * size:(executor.rank + 1) * size] = torch.frombuffer(bytearray(record), dtype=torch.uint8)
    table = table.to(device)
    plan = Plan("placement", registry.get("all_gather", "ring"), executor.rank, executor.world,
                Layout(table.numel(), {IN_PLACE: True}), {"output": table},
                describe=f"placement exchange of {call}" if call else "placement exchange")
    with torch.no_grad():
        executor.execute(plan, tag=PLACEMENT_TAG, blocking=True)
    data = table.cpu().numpy().tobytes()
    return [data[r * size:(r + 1) * size] for r in range(executor.world)]
