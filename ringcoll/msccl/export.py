"""ringcoll's schedules written as MSCCL-IR, for the MSCCL executor in NCCL/RCCL.

A schedule is written at one world size (MSCCL-IR fixes ``ngpus``) from its steps at a
**unit** size: the smallest element count, tried in turn, at which it is linear (its steps
at twice the size are the same with every offset doubled, no segmentation), so that one
element of the unit is one MSCCL chunk. Each rank gets a threadblock per send peer and per
receive peer (per channel) and one for local work; an instruction waits (``depid``/``deps``,
extra ones as ``nop`` steps) for the latest earlier instruction of each other threadblock
that touches the same chunks, so the XML keeps ringcoll's order. ``channels`` splits every
message into that many parts, one per channel. Limits (the executor's default build):
at most 64 steps per threadblock and 32 threadblocks per channel (a ValueError names the
threadblock otherwise), fewer than 72 chunks per instruction (longer ones are split).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from ..schedules import registry
from ..schedules.vocabulary import (IN_PLACE, RECV_BLOCKS, SEGMENT, SEND_BLOCKS, Buf, Copy, Layout, Recv, Reduce, Send,
                                    chunks, extents)
from ..schedules.fold import largest_pof2
from .ir import MAX_COUNT, MAX_STEPS_PER_TB, MAX_TBS_PER_CHANNEL

XML_COLL = {"all_reduce": "allreduce", "all_gather": "allgather", "all_to_all": "alltoall",
            "reduce_scatter": "reducescatter"}
#: ringcoll's caller buffers as MSCCL's: all_reduce runs in place on i
BUFFER_OF = {"data": "i", "input": "i", "output": "o"}


def _layout(collective: str, world: int, numel: int) -> Layout:
    if collective == "all_to_all":
        return Layout(numel, {SEND_BLOCKS: tuple(chunks("input", numel, world)),
                              RECV_BLOCKS: tuple(chunks("output", numel, world)), SEGMENT: numel})
    if collective == "all_gather":
        return Layout(numel, {IN_PLACE: False, SEGMENT: numel})
    return Layout(numel, {SEGMENT: numel})


def _steps(algorithm: registry.Algorithm, world: int, numel: int):
    layout = _layout(algorithm.collective, world, numel)
    return [list(algorithm.schedule(rank, world, layout)) for rank in range(world)]


def _scaled(op, factor: int):
    def s(buf: Optional[Buf]):
        return None if buf is None else Buf(buf.name, buf.start * factor, buf.stop * factor)
    if isinstance(op, (Send, Recv)):
        return type(op)(op.peer, s(op.buf))
    if isinstance(op, Copy):
        return Copy(s(op.dst), s(op.src))
    return Reduce(s(op.dst), tuple(s(b) for b in op.srcs), s(op.out))


def unit_steps(algorithm: registry.Algorithm, world: int):
    """(unit, each rank's steps at the unit): the smallest tried size at which the schedule
    is linear in the size; ValueError if none is."""
    if getattr(algorithm.schedule, "needs_nodes", False):
        raise ValueError(f"{algorithm.collective}/{algorithm.name} needs the placement; MSCCL-IR export "
                         f"takes flat algorithms")
    base = world * largest_pof2(world) // math.gcd(world, largest_pof2(world))
    for unit in (base, 2 * base, 4 * base, 8 * base):
        once, twice = _steps(algorithm, world, unit), _steps(algorithm, world, 2 * unit)
        if all(len(a) == len(b) and all(
                tuple(_scaled(c, 2) for c in x.comms) == y.comms and
                tuple(_scaled(o, 2) for o in x.local) == y.local for x, y in zip(a, b))
               for a, b in zip(once, twice)):
            return unit, once
    raise ValueError(f"{algorithm.collective}/{algorithm.name} at world {world} is not linear in the size "
                     f"(its steps change with it), so no MSCCL-IR with fixed chunks describes it")


class _Rank:
    """One rank's threadblocks while writing."""

    def __init__(self, rank: int):
        self.rank = rank
        self.tbs: Dict[Tuple[str, int, int], int] = {}      # (role, peer, channel) -> tb id
        self.meta: List[Tuple[int, int, int]] = []           # tb id -> (send, recv, chan)
        self.steps: List[List[dict]] = []                    # tb id -> its steps
        self.history: List[Tuple[int, int, tuple, tuple, tuple]] = []   # (tb, step, when, reads, writes)

    def tb(self, role: str, peer: int, chan: int) -> int:
        key = (role, peer, chan)
        if key not in self.tbs:
            self.tbs[key] = len(self.meta)
            self.meta.append((peer if role == "send" else -1, peer if role == "recv" else -1, chan))
            self.steps.append([])
        return self.tbs[key]

    def add(self, tb: int, when: tuple, reads: tuple, writes: tuple, attrs: dict) -> None:
        """Append an instruction that waits for the latest earlier conflicting one of every
        other threadblock (the first as its depid, the rest as nops before it)."""
        latest: Dict[int, int] = {}
        for other, index, at, r, w in self.history:
            if other == tb or at >= when:
                continue
            if _touch(w, reads + writes) or _touch(r, writes):
                latest[other] = max(latest.get(other, -1), index)
        deps = sorted(latest.items())
        for other, index in deps[1:]:
            self.steps[other][index]["hasdep"] = 1
            self.steps[tb].append(_instruction("nop", ("i", 0, 0), ("i", 0, 0), 0, other, index))
        attrs = dict(attrs)
        if deps:
            other, index = deps[0]
            self.steps[other][index]["hasdep"] = 1
            attrs["depid"], attrs["deps"] = other, index
        self.steps[tb].append(attrs)
        self.history.append((tb, len(self.steps[tb]) - 1, when, reads, writes))


def _touch(a: tuple, b: tuple) -> bool:
    return any(x[0] == y[0] and x[1] < y[1] + y[2] and y[1] < x[1] + x[2] for x in a for y in b)


def _instruction(op: str, src: tuple, dst: tuple, cnt: int, depid: int = -1, deps: int = -1) -> dict:
    return {"type": op, "srcbuf": src[0], "srcoff": src[1], "dstbuf": dst[0], "dstoff": dst[1], "cnt": cnt,
            "depid": depid, "deps": deps, "hasdep": 0}


def _pieces(region: tuple) -> List[tuple]:
    """A region cut into instructions of fewer than MAX_COUNT chunks."""
    buf, off, cnt = region
    limit = MAX_COUNT - 8
    return [(buf, off + k, min(limit, cnt - k)) for k in range(0, cnt, limit)]


def export(collective: str, algorithm: str, world: int, path: Optional[str] = None, channels: int = 1) -> str:
    """The MSCCL-IR of ringcoll's ``collective``/``algorithm`` at ``world`` ranks (see the module)."""
    if collective not in XML_COLL:
        raise ValueError(f"collective must be one of {sorted(XML_COLL)}, got {collective!r}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"world must be an int >= 2, got {world!r}")
    if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= 32:
        raise ValueError(f"channels must be an int in [1, 32], got {channels!r}")
    algo = registry.get(collective, algorithm)
    unit, steps = unit_steps(algo, world)
    # every buffer that is not the caller's goes into MSCCL's scratch, one after another
    need: Dict[str, int] = {}
    for rank_steps in steps:
        for name, extent in extents(rank_steps).items():
            need[name] = max(need.get(name, 0), extent)
    scratch_base, s_chunks = {}, 0
    for name in sorted(n for n in need if n not in BUFFER_OF):
        scratch_base[name] = s_chunks
        s_chunks += need[name] * channels

    def region(buf: Buf) -> tuple:
        if buf.name in BUFFER_OF:
            return (BUFFER_OF[buf.name], buf.start * channels, buf.numel * channels)
        return ("s", scratch_base[buf.name] + buf.start * channels, buf.numel * channels)

    def parts(buf: Buf) -> List[tuple]:
        name, off, cnt = region(buf)
        each = cnt // channels
        return [(name, off + j * each, each) for j in range(channels)]

    ranks = [_Rank(r) for r in range(world)]
    for r, rank_steps in enumerate(steps):
        me = ranks[r]
        for t, st in enumerate(rank_steps):
            for op in st.comms:
                role = "send" if isinstance(op, Send) else "recv"
                for chan, part in enumerate(parts(op.buf)):
                    tb = me.tb(role, op.peer, chan)
                    for piece in _pieces(part):
                        if role == "send":
                            me.add(tb, (t, 0), (piece,), (), _instruction("s", piece, piece, piece[2]))
                        else:
                            me.add(tb, (t, 0), (), (piece,), _instruction("r", piece, piece, piece[2]))
            for k, op in enumerate(st.local):
                tb = me.tb("local", -1, 0)
                if isinstance(op, Copy):
                    dst, src = region(op.dst), region(op.src)
                    if dst != src:
                        me.add(tb, (t, 1, k), (src,), (dst,), _instruction("cpy", src, dst, dst[2]))
                    continue
                dst = region(op.dst)
                for src_buf in op.srcs:
                    src = region(src_buf)
                    me.add(tb, (t, 1, k), (src, dst), (dst,), _instruction("re", src, dst, dst[2]))
                if op.out is not None:
                    out = region(op.out)
                    me.add(tb, (t, 1, k), (dst,), (out,), _instruction("cpy", dst, out, out[2]))
    for me in ranks:
        for tb, tb_steps in enumerate(me.steps):
            if len(tb_steps) > MAX_STEPS_PER_TB:
                send, recv, chan = me.meta[tb]
                raise ValueError(f"{collective}/{algorithm} at world {world}: rank {me.rank}'s threadblock "
                                 f"(send {send}, recv {recv}, channel {chan}) has {len(tb_steps)} steps; the MSCCL "
                                 f"executor runs at most {MAX_STEPS_PER_TB} per threadblock")
        per_channel: Dict[int, int] = {}
        for _, _, chan in me.meta:
            per_channel[chan] = per_channel.get(chan, 0) + 1
        if max(per_channel.values(), default=0) > MAX_TBS_PER_CHANNEL:
            raise ValueError(f"{collective}/{algorithm} at world {world}: rank {me.rank} needs "
                             f"{max(per_channel.values())} threadblocks on one channel; the MSCCL executor "
                             f"runs at most {MAX_TBS_PER_CHANNEL}")
    text = _xml(collective, algorithm, world, unit * channels, channels, ranks, s_chunks)
    if path is not None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return text


def _xml(collective: str, algorithm: str, world: int, total: int, channels: int, ranks: List[_Rank],
         s_chunks: int) -> str:
    i_chunks = {"all_reduce": total, "all_gather": total // world, "all_to_all": total,
                "reduce_scatter": total}[collective]
    o_chunks = {"all_reduce": 0, "all_gather": total, "all_to_all": total,
                "reduce_scatter": total // world}[collective]
    inplace, outofplace = {"all_reduce": (1, 0), "all_gather": (1, 1), "all_to_all": (0, 1),
                           "reduce_scatter": (0, 1)}[collective]
    nchannels = max((chan + 1 for me in ranks for _, _, chan in me.meta), default=1)
    lines = [f'<algo name="ringcoll_{collective}_{algorithm}_{world}" proto="Simple" nchannels="{nchannels}" '
             f'nchunksperloop="{total}" ngpus="{world}" coll="{XML_COLL[collective]}" inplace="{inplace}" '
             f'outofplace="{outofplace}" minBytes="0" maxBytes="0">']
    for me in ranks:
        lines.append(f'  <gpu id="{me.rank}" i_chunks="{i_chunks}" o_chunks="{o_chunks}" s_chunks="{s_chunks}">')
        for tb, (send, recv, chan) in enumerate(me.meta):
            lines.append(f'    <tb id="{tb}" send="{send}" recv="{recv}" chan="{chan}">')
            for s, ins in enumerate(me.steps[tb]):
                lines.append(f'      <step s="{s}" type="{ins["type"]}" srcbuf="{ins["srcbuf"]}" srcoff="{ins["srcoff"]}" '
                             f'dstbuf="{ins["dstbuf"]}" dstoff="{ins["dstoff"]}" cnt="{ins["cnt"]}" '
                             f'depid="{ins["depid"]}" deps="{ins["deps"]}" hasdep="{ins["hasdep"]}"/>')
            lines.append('    </tb>')
        lines.append('  </gpu>')
    lines.append('</algo>')
    return "\n".join(lines) + "\n"
