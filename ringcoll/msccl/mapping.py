"""Where MSCCL's chunks lie in ringcoll's buffers for one call, and the schedule that runs
a compiled program on them.

Words: MSCCL's ``i`` and ``o`` are sequences of **blocks** (one per rank where the collective
has per-rank blocks: all_gather's ``o``, all_to_all's ``i`` and ``o``, reduce_scatter's ``i``;
a single block otherwise), each of ``per`` chunks; ringcoll's call gives the same blocks as
Bufs of ``b`` elements. A buffer is **direct** when its blocks lie in one ringcoll buffer one
after another and ``b`` is a multiple of ``per``: a chunk is then ``b / per`` elements of the
caller's memory. Otherwise it is **staged**: a scratch copy whose blocks are padded to
``per·⌈b / per⌉`` elements, filled before the program (inputs) and copied out after it
(outputs). So any size runs, padding included (the padded tail of each block carries
whatever the scratch held; it is never copied out, and every operation is element-wise).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Sequence, Tuple

from ..schedules.vocabulary import (IN_PLACE, RECV_BLOCKS, SEND_BLOCKS, Buf, Copy, Layout, Recv, Reduce, Send, Step,
                                    chunks, step)
from .ir import OPCODES, Program
from .to_schedule import Compiled, LocalCopy, Region, aliases

#: ringcoll's scratch buffers for the program's own (s), its temporaries (t) and staging
SCRATCH = {"s": "msccl_s", "t": "msccl_t", "i": "msccl_i", "o": "msccl_o"}


def _writes_input(program: Program) -> bool:
    """Whether any instruction writes chunks of ``i`` (the caller's input must not be written)."""
    for gpu in program.gpus:
        for tb in gpu.tbs.values():
            for ins in tb.steps:
                if OPCODES[ins.op][3] and ins.dstbuf == "i":
                    return True
    return False


def _blocks(program: Program, rank: int, world: int, layout: Layout):
    """(input blocks, output blocks, whether the input lies in the output already) of the call."""
    coll, numel = program.collective, layout.numel
    if coll == "all_reduce":
        data = [Buf("data", 0, numel)]
        return data, data, True
    if coll == "all_gather":
        out = list(chunks("output", numel, world))
        return [Buf("input", 0, out[rank].numel)], out, bool(layout.get(IN_PLACE, False))
    if coll == "reduce_scatter":
        inp = list(chunks("input", numel, world))
        return inp, [Buf("output", 0, inp[rank].numel)], False
    send, recv = list(layout[SEND_BLOCKS]), list(layout[RECV_BLOCKS])
    sizes = {b.numel for b in send} | {b.numel for b in recv}
    if len(sizes) > 1:
        raise ValueError(f"an MSCCL all_to_all moves equal blocks; this call's split sizes differ: "
                         f"sends {[b.numel for b in send]}, receives {[b.numel for b in recv]}")
    return send, recv, False


def _contiguous(blocks: Sequence[Buf], per: int) -> bool:
    b = blocks[0].numel
    return all(x.name == blocks[0].name and x.start == blocks[0].start + k * b and x.numel == b
               for k, x in enumerate(blocks)) and b % per == 0


class Placement:
    """One rank's map from MSCCL chunk ranges to ringcoll Bufs for one call, with the copies
    that stage inputs before the program and outputs after it."""

    def __init__(self, program: Program, rank: int, world: int, layout: Layout):
        if world != program.ngpus:
            raise ValueError(f"the MSCCL algorithm {program.name!r} runs at world size {program.ngpus} "
                             f"(its ngpus), got world {world}")
        inp, out, input_in_output = _blocks(program, rank, world, layout)
        coll, n = program.collective, program.ngpus
        per = program.nchunksperloop if coll == "all_reduce" else program.nchunksperloop // n
        block = inp[0].numel                            # every collective's block: the input's
        c = self.chunk = -(-block // per)               # elements per chunk, padded up
        self.empty = block == 0
        self.before: List[Copy] = []
        self.after: List[Copy] = []
        self.base: Dict[str, Tuple[str, int]] = {}      # MSCCL buffer -> (ringcoll buffer, element offset)
        alias = aliases(program, rank)
        writes_input = _writes_input(program)

        def place(name: str, blocks: Sequence[Buf], copy_in: bool, copy_out: bool, stage: bool = False):
            if not stage and _contiguous(blocks, per):
                self.base[name] = (blocks[0].name, blocks[0].start)
                return
            self.base[name] = (SCRATCH[name], 0)
            for k, b in enumerate(blocks):
                staged = Buf(SCRATCH[name], k * per * c, k * per * c + b.numel)
                if copy_in:
                    self.before.append(Copy(staged, b))
                if copy_out:
                    self.after.append(Copy(b, staged))

        def block_of(name: str, k: int, numel: int) -> Buf:
            buf, off = self.base[name]
            return Buf(buf, off + k * per * c, off + k * per * c + numel)

        if coll == "all_reduce":
            place("o", out, True, True)
            if "i" not in alias:        # an out-of-place-only program reads a copy of the input
                place("i", inp, True, False, stage=True)
        elif coll == "all_gather":
            # the input is read once, first (it may alias the output): copied into place
            source = out[rank] if input_in_output else inp[0]
            place("o", out, False, True)
            if "i" in alias:
                target = block_of("o", rank, source.numel)
                if target != source:
                    self.before.append(Copy(target, source))
            else:
                place("i", [source], True, False, stage=True)
        elif coll == "all_to_all":
            place("o", out, False, True)
            if "i" in alias:            # an in-place-only program: the input blocks go into o first
                self.before.extend(Copy(block_of("o", k, b.numel), b) for k, b in enumerate(inp))
            else:
                place("i", inp, True, False, stage=writes_input)
        else:                           # reduce_scatter: the input is only ever read
            place("i", inp, True, False, stage=writes_input or "o" in alias)
            if "o" in alias:            # an in-place-only program: o is this rank's block of i
                self.after.append(Copy(out[0], block_of("i", rank, out[0].numel)))
            else:
                place("o", out, False, True)
        for name, (target, chunk_offset) in alias.items():
            buf, off = self.base[target]
            self.base[name] = (buf, off + chunk_offset * c)
        self.base["s"] = (SCRATCH["s"], 0)
        self.base["t"] = (SCRATCH["t"], 0)

    def buf(self, region: Region) -> Buf:
        name, off = self.base[region[0]]
        start = off + region[1] * self.chunk
        return Buf(name, start, start + region[2] * self.chunk)


def schedule(compiled: Compiled, rank: int, world: int, layout: Layout) -> Iterator[Step]:
    """Rank ``rank``'s ringcoll steps for ``compiled`` on the call's ``layout``."""
    place = Placement(compiled.program, rank, world, layout)
    if place.empty:
        return
    if place.before:
        yield step(local=place.before)
    for st in compiled.steps[rank]:
        if not st.comms and not st.local:
            continue
        comms = [Send(peer, place.buf(region)) if kind == "send" else Recv(peer, place.buf(region))
                 for kind, peer, region in st.comms]
        local = []
        for op in st.local:
            if isinstance(op, LocalCopy):
                local.append(Copy(place.buf(op.dst), place.buf(op.src)))
            else:
                local.append(Reduce(place.buf(op.dst), tuple(place.buf(r) for r in op.srcs),
                                    place.buf(op.out) if op.out is not None else None))
        yield step(comms, local)
    if place.after:
        yield step(local=place.after)
