"""An MSCCL-IR program as ringcoll steps: one global order that puts both ends of every
message in the same step.

MSCCL runs a rank's threadblocks concurrently and matches sends with receives per (peer,
channel) connection; its sends are **buffered**: a send copies its chunks into the
connection's buffer when it is issued and goes on, so the sender may overwrite them at once
(a ring that receives every chunk into one scratch slot, copies it out, forwards it and
receives the next one into the same slot is a correct program). ringcoll runs a rank's steps
in turn, posting a step's transfers together and its local work after them. The
translation, done once per program in chunk units:

1. every instruction becomes **events** in its threadblock's program order: a receive (with
   the local work that follows it: the reduction of ``rrs``/``rrc``/``rrcs``), local work
   (``cpy``, ``re``, ``nop``), or for a send its **issue**, the point where MSCCL reads the
   chunks; the **transfer** of a send is an event of its own, after its issue. A fused
   opcode that forwards (``rcs``, ``rrs``, ``rrcs``) is a receive, then an issue one step
   later (store and forward). What ``rrs`` forwards without storing is kept in a private
   temporary chunk range;
2. program order within a threadblock, ``depid``/``deps``, and issue -> transfer order events,
   with a weight of one step where the later one must see the earlier one's effect (local
   work runs at the end of a step; an issue or a receive that touches what an earlier
   receive wrote), else zero. A write after an issue never waits for the issue's transfer
   (the buffered send);
3. a transfer and its matching receive are merged into one message. Every cycle left is
   one in MSCCL's own order (a send waits for nothing but its threadblock and its depid;
   a receive also for its message): the program deadlocks, and it is refused;
4. each event's step is its longest path; two receives of one rank in the same step on
   overlapping chunks, or a receive and a later issue reading what it writes, get an extra
   one-step edge, and the order is recomputed;
5. a transfer whose chunks its rank writes between the issue and the transfer (a receive
   posted in the same step, or any write in the steps between) sends a **snapshot**: a
   copy taken at the end of the step before the issue, which is what MSCCL's buffer holds.

Within a step a rank posts its transfers by (sender, receiver, channel, index), which both
ends of a connection agree on, and runs its local work in dependency order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .ir import MscclError, Program

#: a chunk range: (buffer, first chunk, chunks); buffers i, o, s, and t (temporaries)
Region = Tuple[str, int, int]


@dataclass(frozen=True)
class LocalCopy:
    dst: Region
    src: Region


@dataclass(frozen=True)
class LocalReduce:
    """``dst = dst (op) srcs...``; with ``out``, the result is also copied there."""
    dst: Region
    srcs: Tuple[Region, ...]
    out: Optional[Region] = None


@dataclass
class Event:
    gpu: int
    kind: str                         # "issue" | "send" (its transfer) | "recv" | "local"
    peer: int = -1
    region: Optional[Region] = None   # what an issue or a send reads, or a receive writes
    local: Tuple = ()                 # LocalCopy / LocalReduce run after the step's transfers
    where: str = ""
    key: Tuple = ()                   # a transfer's (sender, receiver, channel, index)


@dataclass
class RankStep:
    """One step of one rank in chunk units: transfers ``("send"|"recv", peer, region)`` then
    local work."""
    comms: List[Tuple[str, int, Region]] = field(default_factory=list)
    local: List = field(default_factory=list)


@dataclass
class Compiled:
    program: Program
    steps: List[List[RankStep]]       # [rank][global step]
    messages: int
    temp_chunks: List[int]            # per rank: chunks of the temporary buffer t
    #: sends that transfer a snapshot of their chunks (overwritten before the transfer)
    snapshots: int = 0
    #: the cost in chunk units: steps with transfers, chunks on the wire and reduced on the
    #: critical path (per step, the busiest rank's)
    alpha: int = 0
    beta_chunks: int = 0
    gamma_chunks: int = 0

    @property
    def nsteps(self) -> int:
        return len(self.steps[0]) if self.steps else 0


def aliases(program: Program, rank: int) -> Dict[str, Tuple[str, int]]:
    """The buffers one rank's program sees as parts of another, in chunks: MSCCL runs an
    in-place call with ``i`` inside ``o`` (or ``o`` inside ``i``), and ringcoll runs it so when
    the XML allows in-place calls, preferring the mode that needs no staging copy."""
    coll, per = program.collective, program.nchunksperloop // program.ngpus
    if coll == "all_reduce" and program.inplace:
        return {"i": ("o", 0)}
    if coll == "all_gather" and program.inplace:
        return {"i": ("o", rank * per)}
    if coll == "all_to_all" and not program.outofplace:
        return {"i": ("o", 0)}
    if coll == "reduce_scatter" and not program.outofplace:
        return {"o": ("i", rank * per)}
    return {}


def _canonical(region: Region, alias: Dict[str, Tuple[str, int]]) -> Region:
    buf, off, cnt = region
    if buf in alias:
        target, base = alias[buf]
        return (target, base + off, cnt)
    return region


def _overlap(a: Region, b: Region) -> bool:
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def _events(program: Program):
    """The events of every instruction; (first, last) event of each in program order, by
    instruction; (receive, issue) pairs of a forwarding opcode; (issue, transfer) of each send."""
    events: List[Event] = []
    span: Dict[Tuple[int, int, int], Tuple[int, int]] = {}
    inner: List[Tuple[int, int]] = []          # recv -> forwarding issue: one step apart
    sends: List[Tuple[int, int]] = []          # issue -> its transfer
    sent: Dict[Tuple[int, int, int], int] = {}        # messages counted on each connection,
    received: Dict[Tuple[int, int, int], int] = {}    # by the sender and by the receiver
    for gpu in program.gpus:
        alias = aliases(program, gpu.id)
        for tb in gpu.tbs.values():
            for ins in tb.steps:
                def reg(buf, off, cnt=ins.cnt):
                    return _canonical((buf, off, cnt), alias)

                src, dst = reg(ins.srcbuf, ins.srcoff), reg(ins.dstbuf, ins.dstoff)
                temp = (f"t{len(events)}", 0, ins.cnt)
                first = len(events)
                op = ins.op
                recv_key = send_key = ()
                if ins.receives:
                    k = (tb.recv, gpu.id, tb.chan)
                    recv_key = k + (received.get(k, 0),)
                    received[k] = recv_key[-1] + 1
                if ins.sends:
                    k = (gpu.id, tb.send, tb.chan)
                    send_key = k + (sent.get(k, 0),)
                    sent[k] = send_key[-1] + 1
                sends_from = None
                if op == "s":
                    sends_from = src
                elif op == "r":
                    events.append(Event(gpu.id, "recv", tb.recv, dst, where=ins.where, key=recv_key))
                elif op == "rcs":
                    events.append(Event(gpu.id, "recv", tb.recv, dst, where=ins.where, key=recv_key))
                    sends_from = dst
                elif op == "rrs":
                    events.append(Event(gpu.id, "recv", tb.recv, temp, (LocalReduce(temp, (src,)),),
                                        where=ins.where, key=recv_key))
                    sends_from = temp
                elif op in ("rrc", "rrcs"):
                    work = LocalReduce(dst, (temp,)) if src == dst else LocalReduce(temp, (src,), dst)
                    events.append(Event(gpu.id, "recv", tb.recv, temp, (work,), where=ins.where, key=recv_key))
                    if op == "rrcs":
                        sends_from = dst
                elif op == "cpy":
                    events.append(Event(gpu.id, "local", local=(LocalCopy(dst, src),), where=ins.where))
                elif op == "re":
                    events.append(Event(gpu.id, "local", local=(LocalReduce(dst, (src,)),), where=ins.where))
                else:   # nop: a point others order against
                    events.append(Event(gpu.id, "local", where=ins.where))
                if sends_from is not None:
                    events.append(Event(gpu.id, "issue", tb.send, sends_from, where=ins.where))
                    if len(events) - first == 2:
                        inner.append((first, first + 1))
                span[(gpu.id, tb.id, ins.s)] = (first, len(events) - 1)
                if sends_from is not None:
                    sends.append((len(events) - 1, len(events)))
                    events.append(Event(gpu.id, "send", tb.send, sends_from, where=ins.where, key=send_key))
    return events, span, inner, sends


def _writes(event: Event) -> List[Region]:
    out = [event.region] if event.kind == "recv" else []
    for op in event.local:
        out.append(op.dst)
        if isinstance(op, LocalReduce) and op.out is not None:
            out.append(op.out)
    return out


def _weight(before: Event, after: Event) -> int:
    """Steps between ``before`` and ``after`` (consecutive in program order, or a depid) when
    ``after`` must see ``before`` done."""
    if after.kind == "local":
        return 0                        # local work runs after the step's transfers
    if before.kind == "local" or before.local:
        return 1                        # ... so a transfer after it waits a step
    if before.kind == "recv":
        return 1 if any(_overlap(w, after.region) for w in _writes(before)) else 0
    return 0                            # an issue: MSCCL's send took its copy of the chunks


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _sccs(nodes: List[int], adjacency: Dict[int, List[Tuple[int, int]]]) -> List[List[int]]:
    """Strongly connected components (iterative Tarjan), in reverse topological order."""
    index: Dict[int, int] = {}
    low: Dict[int, int] = {}
    on_stack = set()
    stack: List[int] = []
    result: List[List[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, i = work[-1]
            edges = adjacency.get(node, ())
            if i < len(edges):
                work[-1] = (node, i + 1)
                nxt = edges[i][0]
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                result.append(component)
    return result


def _order(events: List[Event], edges: List[Tuple[int, int, int]], uf: _UnionFind):
    """(step of each event, topological position of each event) by longest path over the
    merged events; MscclError for a cycle (MSCCL itself would deadlock on it)."""
    adjacency: Dict[int, List[Tuple[int, int]]] = {}
    for a, b, w in edges:
        ra, rb = uf.find(a), uf.find(b)
        adjacency.setdefault(ra, []).append((rb, w))
    nodes = sorted({uf.find(i) for i in range(len(events))})
    components = _sccs(nodes, adjacency)
    comp_of: Dict[int, int] = {}
    for c, members in enumerate(components):
        for m in members:
            comp_of[m] = c
    for a, b, _weight in edges:
        if comp_of[uf.find(a)] == comp_of[uf.find(b)]:
            raise MscclError(f"{events[b].where}: dependency cycle: it waits for {events[a].where}, which "
                             f"(through program order, depid/deps and matched sends and receives) waits for "
                             f"it; the program cannot run (MSCCL would deadlock on it too)")
    # longest path over components, in topological order (reverse of Tarjan's)
    level = [0] * len(components)
    comp_edges: Dict[int, List[Tuple[int, int]]] = {}
    for a, b, w in edges:
        comp_edges.setdefault(comp_of[uf.find(a)], []).append((comp_of[uf.find(b)], w))
    order = list(range(len(components) - 1, -1, -1))
    position = {c: p for p, c in enumerate(order)}
    for c in order:
        for d, w in comp_edges.get(c, ()):
            if level[c] + w > level[d]:
                level[d] = level[c] + w
    steps = [level[comp_of[uf.find(i)]] for i in range(len(events))]
    topo = [position[comp_of[uf.find(i)]] for i in range(len(events))]
    return steps, topo


def _conflicts(events: List[Event], steps: List[int], topo: List[int]) -> List[Tuple[int, int]]:
    """Pairs (earlier, later) of one rank's events in one step that must be a step apart:
    two receives into overlapping chunks (ringcoll posts a step's transfers together), or a
    receive and an issue that reads what it writes. An issue before a receive into its
    chunks needs no step: its transfer sends a snapshot (see :func:`_snapshots`)."""
    by_step: Dict[Tuple[int, int], List[int]] = {}
    for i, e in enumerate(events):
        if e.kind in ("recv", "issue"):
            by_step.setdefault((e.gpu, steps[i]), []).append(i)
    found = []
    for members in by_step.values():
        recvs = [i for i in members if events[i].kind == "recv"]
        for r in recvs:
            for other in members:
                if other == r or topo[other] < topo[r] or (topo[other] == topo[r] and other < r):
                    continue
                if events[other].kind == "recv":
                    hit = _overlap(events[r].region, events[other].region)
                else:
                    hit = any(_overlap(w, events[other].region) for w in _writes(events[r]))
                if hit:
                    found.append((r, other))
    return found


def _snapshots(events: List[Event], sends: List[Tuple[int, int]], steps: List[int], topo: List[int]) -> int:
    """Make every transfer whose chunks its rank writes between the send's issue and the
    transfer send a copy taken at the end of the step before the issue (MSCCL's buffered
    send: what it sends is what the chunks held when it was issued). Adds the copies as
    local events last in their step, shifting every step by one if a copy must come before
    the first; returns the number of snapshots."""
    writes: Dict[int, List[Tuple[int, int, Region]]] = {}     # rank -> (step, phase, region)
    for i, e in enumerate(events):
        if e.kind == "recv":
            writes.setdefault(e.gpu, []).append((steps[i], 0, e.region))
        for op in e.local:
            for region in (op.dst, getattr(op, "out", None)):
                if region is not None:
                    writes.setdefault(e.gpu, []).append((steps[i], 1, region))
    needed = []
    for issue, transfer in sends:
        first, last, region = steps[issue], steps[transfer], events[transfer].region
        # a receive writes in its step's transfers, local work after them: the transfer reads
        # the chunks in step ``last`` before local work
        if any(_overlap(w, region) and first <= step and (step < last or (step == last and phase == 0))
               for step, phase, w in writes.get(events[issue].gpu, ())):
            needed.append((issue, transfer))
    if needed and min(steps[issue] for issue, _ in needed) == 0:
        steps[:] = [s + 1 for s in steps]
    after_all = max(topo, default=0) + 1
    for issue, transfer in needed:
        e = events[transfer]
        copy = (f"t{len(events)}", 0, e.region[2])
        events.append(Event(e.gpu, "local", local=(LocalCopy(copy, e.region),), where=e.where))
        steps.append(steps[issue] - 1)
        topo.append(after_all)
        after_all += 1
        e.region = copy
    return len(needed)


def compile_program(program: Program) -> Compiled:
    """The program's global step order and each rank's steps (see the module's docstring)."""
    events, span, inner, sends = _events(program)
    uf = _UnionFind(len(events))
    by_key: Dict[Tuple, List[int]] = {}
    for i, e in enumerate(events):
        if e.key:
            by_key.setdefault(e.key, []).append(i)
    messages = 0
    for _key, ends in by_key.items():
        if len(ends) == 2:          # validate() saw a receive for every send
            uf.union(ends[0], ends[1])
            messages += 1
    edges: List[Tuple[int, int, int]] = [(a, b, 1) for a, b in inner] + [(a, b, 0) for a, b in sends]
    for gpu in program.gpus:
        for tb in gpu.tbs.values():
            previous = None
            for ins in tb.steps:
                first, last = span[(gpu.id, tb.id, ins.s)]
                if previous is not None:
                    edges.append((previous, first, _weight(events[previous], events[first])))
                if ins.depid >= 0:
                    dep = span[(gpu.id, ins.depid, ins.deps)][1]
                    edges.append((dep, first, _weight(events[dep], events[first])))
                previous = last
    for _ in range(10_000):
        steps, topo = _order(events, edges, uf)
        conflicts = _conflicts(events, steps, topo)
        if not conflicts:
            break
        edges.extend((a, b, 1) for a, b in conflicts)
    snapshots = _snapshots(events, sends, steps, topo)
    compiled = _assemble(program, events, steps, topo, messages)
    compiled.snapshots = snapshots
    return compiled


def _assemble(program: Program, events: List[Event], steps: List[int], topo: List[int], messages: int) -> Compiled:
    nsteps = max(steps, default=-1) + 1
    ranks = [[RankStep() for _ in range(nsteps)] for _ in range(program.ngpus)]
    temps, extents = _allocate_temps(program, events, steps)
    order = sorted(range(len(events)), key=lambda i: (topo[i], i))
    comms: Dict[Tuple[int, int], List[Tuple[Tuple, str, int, Region]]] = {}
    for i in order:
        e = events[i]
        place = ranks[e.gpu][steps[i]]
        if e.kind == "issue":
            continue                    # the point its transfer's chunks were read
        if e.kind != "local":
            comms.setdefault((e.gpu, steps[i]), []).append((e.key, e.kind, e.peer, _temp(e.region, temps)))
        for op in e.local:
            place.local.append(_relocate(op, temps))
    for (gpu, step), items in comms.items():
        items.sort(key=lambda item: item[0])
        ranks[gpu][step].comms = [(kind, peer, region) for _, kind, peer, region in items]
    compiled = Compiled(program, ranks, messages, extents)
    for s in range(nsteps):
        moved = [max(sum(r[2] for k, _, r in ranks[g][s].comms if k == "send"),
                     sum(r[2] for k, _, r in ranks[g][s].comms if k == "recv")) for g in range(program.ngpus)]
        reduced = [sum(op.dst[2] for op in ranks[g][s].local if isinstance(op, LocalReduce))
                   for g in range(program.ngpus)]
        # a single port carries one message at a time: the step's latency is its busiest
        # rank's messages (sent or received), each one α
        compiled.alpha += max((max(sum(k == "send" for k, _, _ in ranks[g][s].comms),
                                   sum(k == "recv" for k, _, _ in ranks[g][s].comms)) for g in range(program.ngpus)),
                              default=0)
        compiled.beta_chunks += max(moved, default=0)
        compiled.gamma_chunks += max(reduced, default=0)
    return compiled


def _allocate_temps(program: Program, events: List[Event], steps: List[int]) -> Tuple[Dict[str, int], List[int]]:
    """Offsets of the temporaries in each rank's buffer t, and each rank's extent of t: a
    temporary lives from the step that receives into it to the step that last reads it, and
    its chunks are reused after that (never within a step that still reads them)."""
    lives: Dict[str, List[int]] = {}
    owner: Dict[str, Tuple[int, int]] = {}
    for i, e in enumerate(events):
        regions = [e.region] if e.region is not None else []
        for op in e.local:
            regions += [op.dst, getattr(op, "out", None), getattr(op, "src", None), *getattr(op, "srcs", ())]
        for region in regions:
            if region is not None and region[0].startswith("t"):
                life = lives.setdefault(region[0], [steps[i], steps[i]])
                life[0], life[1] = min(life[0], steps[i]), max(life[1], steps[i])
                owner[region[0]] = (e.gpu, region[2])
    offsets: Dict[str, int] = {}
    extents = [0] * program.ngpus
    busy: List[List[Tuple[int, int, int]]] = [[] for _ in range(program.ngpus)]   # (last step, offset, size)
    for start, end, name in sorted((life[0], life[1], name) for name, life in lives.items()):
        gpu, size = owner[name]
        live = busy[gpu] = [b for b in busy[gpu] if b[0] >= start]
        offset = 0
        for _, off, sz in sorted(live, key=lambda b: b[1]):
            if offset + size <= off:
                break
            offset = max(offset, off + sz)
        live.append((end, offset, size))
        offsets[name] = offset
        extents[gpu] = max(extents[gpu], offset + size)
    return offsets, extents


def _temp(region: Optional[Region], offsets: Dict[str, int]) -> Optional[Region]:
    if region is None or not region[0].startswith("t"):
        return region
    return ("t", offsets[region[0]] + region[1], region[2])


def _relocate(op, offsets: Dict[str, int]):
    if isinstance(op, LocalCopy):
        return LocalCopy(_temp(op.dst, offsets), _temp(op.src, offsets))
    return LocalReduce(_temp(op.dst, offsets), tuple(_temp(r, offsets) for r in op.srcs), _temp(op.out, offsets))
