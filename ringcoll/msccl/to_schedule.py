"""An MSCCL-IR program as ringcoll steps: one global order that puts both ends of every
message in the same step.

MSCCL runs a rank's threadblocks concurrently and matches sends with receives per (peer,
channel) connection; ringcoll runs a rank's steps in turn, posting a step's transfers together
and its local work after them. The translation, done once per program in chunk units:

1. every instruction becomes **events**: a send, a receive (with the local work that follows
   it: the reduction of ``rrs``/``rrc``/``rrcs``), or local work (``cpy``, ``re``, ``nop``);
   a fused opcode that forwards (``rcs``, ``rrs``, ``rrcs``) is a receive then a send one step
   later (store and forward: a step's sends never read what its receives write). What
   ``rrs`` forwards without storing is kept in a private temporary chunk range;
2. program order within a threadblock and ``depid``/``deps`` order events, with a weight of
   one step where the later one is a transfer that must see the earlier one's effect (local
   work runs at the end of a step; a transfer that touches what an earlier receive wrote, or
   a receive into what an earlier send reads), else zero;
3. both ends of a message are merged; rings of send-then-receive threadblocks then form
   zero-weight cycles, which collapse into one step, while a cycle of positive weight is a
   dependency cycle (a program that cannot run) and is refused;
4. each event's step is its longest path; a send and a receive of one rank left in the same
   step on overlapping chunks get an extra one-step edge, and the order is recomputed.

Within a step a rank posts its transfers by (sender, receiver, channel, index), which both
ends of a connection agree on, and runs its local work in dependency order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .ir import Instruction, MscclError, OPCODES, Program

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
    kind: str                         # "send" | "recv" | "local"
    peer: int = -1
    region: Optional[Region] = None   # what a send reads or a receive writes
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
    """The events of every instruction; (first, last) event of each, by instruction."""
    events: List[Event] = []
    span: Dict[Tuple[int, int, int], Tuple[int, int]] = {}
    inner: List[Tuple[int, int]] = []          # recv -> forwarding send: one step apart
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
                if op == "s":
                    events.append(Event(gpu.id, "send", tb.send, src, where=ins.where, key=send_key))
                elif op == "r":
                    events.append(Event(gpu.id, "recv", tb.recv, dst, where=ins.where, key=recv_key))
                elif op == "rcs":
                    events.append(Event(gpu.id, "recv", tb.recv, dst, where=ins.where, key=recv_key))
                    events.append(Event(gpu.id, "send", tb.send, dst, where=ins.where, key=send_key))
                elif op == "rrs":
                    events.append(Event(gpu.id, "recv", tb.recv, temp, (LocalReduce(temp, (src,)),),
                                        where=ins.where, key=recv_key))
                    events.append(Event(gpu.id, "send", tb.send, temp, where=ins.where, key=send_key))
                elif op in ("rrc", "rrcs"):
                    work = LocalReduce(dst, (temp,)) if src == dst else LocalReduce(temp, (src,), dst)
                    events.append(Event(gpu.id, "recv", tb.recv, temp, (work,), where=ins.where, key=recv_key))
                    if op == "rrcs":
                        events.append(Event(gpu.id, "send", tb.send, dst, where=ins.where, key=send_key))
                elif op == "cpy":
                    events.append(Event(gpu.id, "local", local=(LocalCopy(dst, src),), where=ins.where))
                elif op == "re":
                    events.append(Event(gpu.id, "local", local=(LocalReduce(dst, (src,)),), where=ins.where))
                else:   # nop: a point others order against
                    events.append(Event(gpu.id, "local", where=ins.where))
                if len(events) - first == 2:
                    inner.append((first, first + 1))
                span[(gpu.id, tb.id, ins.s)] = (first, len(events) - 1)
    return events, span, inner


def _writes(event: Event) -> List[Region]:
    out = [event.region] if event.kind == "recv" else []
    for op in event.local:
        out.append(op.dst)
        if isinstance(op, LocalReduce) and op.out is not None:
            out.append(op.out)
    return out


def _weight(before: Event, after: Event) -> int:
    """Steps between ``before`` and ``after`` when ``after`` must see ``before`` done."""
    if after.kind == "local":
        return 0                        # local work runs after the step's transfers
    if before.kind == "local" or before.local:
        return 1                        # ... so a transfer after it waits a step
    if before.kind == "recv":
        return 1 if any(_overlap(w, after.region) for w in _writes(before)) else 0
    return 1 if after.kind == "recv" and _overlap(after.region, before.region) else 0


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
    merged events; MscclError for a cycle that needs a positive number of steps."""
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
    for a, b, w in edges:
        ca, cb = comp_of[uf.find(a)], comp_of[uf.find(b)]
        if ca == cb and w > 0:
            raise MscclError(f"{events[b].where}: dependency cycle: it must come a step after "
                             f"{events[a].where}, which (through matched sends and receives) must come "
                             f"no later than it; the program cannot run")
    # longest path over components, in topological order (reverse of Tarjan's)
    level = [0] * len(components)
    comp_edges: Dict[int, List[Tuple[int, int]]] = {}
    for a, b, w in edges:
        ca, cb = comp_of[uf.find(a)], comp_of[uf.find(b)]
        if ca != cb:
            comp_edges.setdefault(ca, []).append((cb, w))
    order = list(range(len(components) - 1, -1, -1))
    position = {c: p for p, c in enumerate(order)}
    for c in order:
        for d, w in comp_edges.get(c, ()):
            if level[c] + w > level[d]:
                level[d] = level[c] + w
    steps = [level[comp_of[uf.find(i)]] for i in range(len(events))]
    topo = [position[comp_of[uf.find(i)]] for i in range(len(events))]
    return steps, topo


def _conflicts(events: List[Event], steps: List[int]):
    """Pairs (a, b) of transfers of one rank in one step on overlapping chunks, where at
    least one is a receive: ringcoll posts a step's transfers together."""
    by_step: Dict[Tuple[int, int], List[int]] = {}
    for i, e in enumerate(events):
        if e.kind != "local":
            by_step.setdefault((e.gpu, steps[i]), []).append(i)
    found = []
    for members in by_step.values():
        recvs = [i for i in members if events[i].kind == "recv"]
        if not recvs:
            continue
        for r in recvs:
            for other in members:
                if other != r and (events[other].kind == "send" or other > r) and \
                        _overlap(events[r].region, events[other].region):
                    found.append((r, other))
    return found


def compile_program(program: Program) -> Compiled:
    """The program's global step order and each rank's steps (see the module's docstring)."""
    events, span, inner = _events(program)
    uf = _UnionFind(len(events))
    by_key: Dict[Tuple, List[int]] = {}
    for i, e in enumerate(events):
        if e.key:
            by_key.setdefault(e.key, []).append(i)
    messages = 0
    for key, ends in by_key.items():
        if len(ends) == 2:          # validate() saw a receive for every send
            uf.union(ends[0], ends[1])
            messages += 1
    edges: List[Tuple[int, int, int]] = [(a, b, 1) for a, b in inner]
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
        conflicts = _conflicts(events, steps)
        if not conflicts:
            break
        for a, b in conflicts:
            if uf.find(a) == uf.find(b) or topo[a] == topo[b]:
                raise MscclError(f"{events[b].where}: its transfer overlaps the chunks of {events[a].where} "
                                 f"in the same step, and neither can move (a race in the program)")
            first, second = (a, b) if topo[a] < topo[b] else (b, a)
            edges.append((first, second, 1))
    return _assemble(program, events, steps, topo, messages)


def _assemble(program: Program, events: List[Event], steps: List[int], topo: List[int], messages: int) -> Compiled:
    nsteps = max(steps, default=-1) + 1
    ranks = [[RankStep() for _ in range(nsteps)] for _ in range(program.ngpus)]
    temps, extents = _allocate_temps(program, events, steps)
    order = sorted(range(len(events)), key=lambda i: (topo[i], i))
    comms: Dict[Tuple[int, int], List[Tuple[Tuple, str, int, Region]]] = {}
    for i in order:
        e = events[i]
        place = ranks[e.gpu][steps[i]]
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
        if max(moved, default=0):
            compiled.alpha += 1
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
