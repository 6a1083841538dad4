"""MSCCL-IR: parse the XML that MSCCLang, TACCL and TE-CCL emit, and check its rules.

Words: a **program** is one ``<algo>``: ``ngpus`` ranks (``<gpu>``), each running
**threadblocks** (``<tb>``) concurrently; a threadblock runs its **instructions** (``<step>``) in
order, sends to at most one peer and receives from at most one, on one **channel**. Buffers
are ``i`` (input), ``o`` (output) and ``s`` (scratch), counted in **chunks** of
``count / nchunksperloop`` elements; an instruction moves ``cnt`` consecutive chunks. The
k-th send on (a → b, channel c) meets the k-th receive on (b ← a, channel c): the format has
no tags. Every rule broken is a :class:`MscclError` naming the element and the rule, raised
before anything is registered.
"""
from __future__ import annotations

import gzip
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Dict, List, Tuple


class MscclError(ValueError):
    """An MSCCL-IR program that breaks a rule of the format (or one ringcoll cannot run)."""


#: the collectives ringcoll runs, by the XML's ``coll`` (and the spellings seen in the wild)
COLLECTIVES = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all",
               "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
               "all_reduce": "all_reduce", "all_gather": "all_gather", "all_to_all": "all_to_all"}

#: opcode -> (receives, sends, reads src, writes dst, reduces)
OPCODES = {
    "s": (False, True, True, False, False),
    "r": (True, False, False, True, False),
    "rcs": (True, True, False, True, False),
    "rrs": (True, True, True, False, True),
    "rrc": (True, False, True, True, True),
    "rrcs": (True, True, True, True, True),
    "cpy": (False, False, True, True, False),
    "re": (False, False, True, True, True),
    "nop": (False, False, False, False, False),
}
BUFFERS = ("i", "o", "s")

#: the MSCCL executor's default build limits (msccl_struct.h)
MAX_STEPS_PER_TB = 64
MAX_COUNT = 72
MAX_CHANNELS = 32
MAX_TBS_PER_CHANNEL = 32


@dataclass(frozen=True)
class Instruction:
    gpu: int
    tb: int
    s: int
    op: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: bool = False

    @property
    def where(self) -> str:
        return f"<gpu id={self.gpu}> <tb id={self.tb}> <step s={self.s} type={self.op!r}>"

    @property
    def receives(self) -> bool:
        return OPCODES[self.op][0]

    @property
    def sends(self) -> bool:
        return OPCODES[self.op][1]


@dataclass
class Threadblock:
    id: int
    send: int
    recv: int
    chan: int
    steps: List[Instruction] = field(default_factory=list)


@dataclass
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: Dict[int, Threadblock] = field(default_factory=dict)

    def chunks(self, buf: str) -> int:
        return {"i": self.i_chunks, "o": self.o_chunks, "s": self.s_chunks}[buf]


@dataclass
class Program:
    name: str
    collective: str            # ringcoll's name: all_reduce, all_gather, ...
    coll: str                  # the XML's
    ngpus: int
    nchunksperloop: int
    nchannels: int
    proto: str
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    gpus: List[Gpu]
    text: str = field(repr=False, default="")

    def connections(self) -> Dict[Tuple[int, int, int], Tuple[List[Instruction], List[Instruction]]]:
        """(sender, receiver, channel) -> (the sender's sends, the receiver's receives), in order."""
        table: Dict[Tuple[int, int, int], Tuple[List[Instruction], List[Instruction]]] = {}
        for gpu in self.gpus:
            for tb in gpu.tbs.values():
                for ins in tb.steps:
                    if ins.sends:
                        table.setdefault((gpu.id, tb.send, tb.chan), ([], []))[0].append(ins)
                    if ins.receives:
                        table.setdefault((tb.recv, gpu.id, tb.chan), ([], []))[1].append(ins)
        return table


#: the protocols MSCCL's executor runs
PROTOCOLS = ("Simple", "LL", "LL128")


def _given(element) -> str:
    return " ".join(f"{k}={v!r}" for k, v in element.attrib.items()) or "no attributes"


def _str(element, attr: str, where: str) -> str:
    """An attribute MSCCL's executor reads (msccl_parser.cc refuses an element without it)."""
    value = element.get(attr)
    if value is None:
        raise MscclError(f"{where}: attribute {attr!r} is required and missing (given: {_given(element)})")
    return value


def _int(element, attr: str, where: str) -> int:
    value = _str(element, attr, where)
    try:
        return int(value)
    except ValueError:
        raise MscclError(f"{where}: attribute {attr}={value!r} must be an integer (given: {_given(element)})") from None


def read_text(path_or_text: str) -> str:
    """The XML of ``path_or_text``: the text itself when it holds an element, else a file
    (``.gz``: gzip-compressed)."""
    if not isinstance(path_or_text, (str, os.PathLike)):
        raise TypeError(f"path_or_text must be a str or path of MSCCL-IR XML, got {type(path_or_text).__name__}")
    text = os.fspath(path_or_text)
    if text.lstrip().startswith("<"):
        return text
    if not os.path.isfile(text):
        raise FileNotFoundError(f"path_or_text names no file and holds no XML: {text!r}")
    if text.endswith(".gz"):            # public XMLs are large and compress twentyfold
        with gzip.open(text, "rt", encoding="utf-8") as handle:
            return handle.read()
    with open(text, encoding="utf-8") as handle:
        return handle.read()


def parse(text: str) -> Program:
    """The program of one ``<algo>`` element (checked by :func:`validate`)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise MscclError(f"not well-formed XML: {error}") from None
    if root.tag != "algo":
        found = root.find(".//algo")
        if found is None:
            raise MscclError(f"the root element must be <algo>, got <{root.tag}>")
        root = found
    where = "<algo>"
    coll = _str(root, "coll", where)
    if coll not in COLLECTIVES:
        raise MscclError(f"{where}: coll={coll!r} is not one ringcoll runs; it runs "
                         f"{sorted(set(k for k in COLLECTIVES if '_' not in k))}")
    proto = _str(root, "proto", where)
    if proto not in PROTOCOLS:
        raise MscclError(f"{where}: proto must be one of {list(PROTOCOLS)}, got {proto!r}")
    program = Program(
        name=root.get("name") or coll, collective=COLLECTIVES[coll], coll=coll,
        ngpus=_int(root, "ngpus", where), nchunksperloop=_int(root, "nchunksperloop", where),
        nchannels=_int(root, "nchannels", where), proto=proto,
        inplace=bool(_int(root, "inplace", where)), outofplace=bool(_int(root, "outofplace", where)),
        min_bytes=_int(root, "minBytes", where), max_bytes=_int(root, "maxBytes", where),
        gpus=[], text=text)
    for g in root.findall("gpu"):
        gw = f"<gpu id={g.get('id')}>"
        gpu = Gpu(_int(g, "id", gw), _int(g, "i_chunks", gw), _int(g, "o_chunks", gw), _int(g, "s_chunks", gw))
        for t in g.findall("tb"):
            tw = f"{gw} <tb id={t.get('id')}>"
            tb = Threadblock(_int(t, "id", tw), _int(t, "send", tw), _int(t, "recv", tw), _int(t, "chan", tw))
            if tb.id in gpu.tbs:
                raise MscclError(f"{tw}: threadblock ids must be unique on a gpu, {tb.id} appears twice")
            for st in t.findall("step"):
                sw = f"{tw} <step s={st.get('s')} type={st.get('type')!r}>"
                op = _str(st, "type", sw)
                if op not in OPCODES:
                    raise MscclError(f"{sw}: type must be one of {sorted(OPCODES)}, got {op!r}")
                hasdep = _int(st, "hasdep", sw)
                if hasdep not in (0, 1):
                    raise MscclError(f"{sw}: hasdep must be 0 or 1, got {hasdep}")
                ins = Instruction(gpu.id, tb.id, _int(st, "s", sw), op, _str(st, "srcbuf", sw),
                                  _int(st, "srcoff", sw), _str(st, "dstbuf", sw), _int(st, "dstoff", sw),
                                  _int(st, "cnt", sw), _int(st, "depid", sw), _int(st, "deps", sw), bool(hasdep))
                tb.steps.append(ins)
            gpu.tbs[tb.id] = tb
        program.gpus.append(gpu)
    validate(program)
    return program


def expected_chunks(program: Program) -> Tuple[int, int]:
    """(i_chunks, o_chunks) the collective implies for ``nchunksperloop`` chunks in all."""
    total, n = program.nchunksperloop, program.ngpus
    per_rank = total // n
    return {"all_reduce": (total, total), "all_gather": (per_rank, total),
            "all_to_all": (total, total), "reduce_scatter": (total, per_rank)}[program.collective]


def validate(program: Program) -> None:
    """Every rule of the format that ringcoll relies on, each broken one a MscclError naming
    the element: the rank count, peers, step numbering, opcodes and their threadblock's peers,
    buffers and chunk ranges, dependencies, one threadblock per connection, a receive for every
    send with the same chunk count. (Dependency cycles are found when ordering: to_schedule.)"""
    n = program.ngpus
    if n < 1:
        raise MscclError(f"<algo>: ngpus must be at least 1, got {n}")
    if program.nchunksperloop < 1:
        raise MscclError(f"<algo>: nchunksperloop must be at least 1, got {program.nchunksperloop}")
    ids = [gpu.id for gpu in program.gpus]
    if len(ids) != n:
        raise MscclError(f"<algo>: wrong rank count: ngpus={n} but the program has {len(ids)} <gpu> elements")
    if sorted(ids) != list(range(n)):
        raise MscclError(f"<algo>: the <gpu> ids must be 0 .. {n - 1}, one each, got {sorted(ids)}")
    program.gpus.sort(key=lambda gpu: gpu.id)
    if program.collective != "all_reduce" and program.nchunksperloop % n:
        raise MscclError(f"<algo>: nchunksperloop={program.nchunksperloop} must be a multiple of "
                         f"ngpus={n} for {program.coll}")
    want_i, want_o = expected_chunks(program)
    for gpu in program.gpus:
        gw = f"<gpu id={gpu.id}>"
        # in-place programs often declare the buffer they never use with 0 chunks
        if gpu.i_chunks not in (want_i, 0) or gpu.o_chunks not in (want_o, 0):
            raise MscclError(f"{gw}: {program.coll} with nchunksperloop={program.nchunksperloop} at {n} ranks "
                             f"has i_chunks={want_i} and o_chunks={want_o} (0 for an unused one), got {gpu.i_chunks} and {gpu.o_chunks}")
        if gpu.s_chunks < 0:
            raise MscclError(f"{gw}: s_chunks must not be negative, got {gpu.s_chunks}")
        send_conn, recv_conn = {}, {}
        for tb in gpu.tbs.values():
            tw = f"{gw} <tb id={tb.id}>"
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if not -1 <= peer < n or peer == gpu.id:
                    raise MscclError(f"{tw}: {role} must be -1 or another rank in [0, {n}), got {peer}")
            if not 0 <= tb.chan < MAX_CHANNELS:
                raise MscclError(f"{tw}: chan must be in [0, {MAX_CHANNELS}), got {tb.chan}")
            for table, peer, role in ((send_conn, tb.send, "send"), (recv_conn, tb.recv, "recv")):
                if peer >= 0:
                    other = table.setdefault((peer, tb.chan), tb.id)
                    if other != tb.id:
                        raise MscclError(f"{tw}: one threadblock per connection: <tb id={other}> already "
                                         f"{role}s {'to' if role == 'send' else 'from'} rank {peer} on channel {tb.chan}")
            for index, ins in enumerate(tb.steps):
                sw = ins.where
                if ins.s != index:
                    raise MscclError(f"{sw}: steps of a threadblock must be numbered 0, 1, ... in order; "
                                     f"expected s={index}")
                if ins.sends and tb.send < 0:
                    raise MscclError(f"{sw}: a sending opcode in a threadblock without a send peer (send=-1)")
                if ins.receives and tb.recv < 0:
                    raise MscclError(f"{sw}: a receiving opcode in a threadblock without a receive peer (recv=-1)")
                if ins.op == "nop":
                    pass
                elif ins.cnt < 1:
                    raise MscclError(f"{sw}: cnt must be at least 1, got {ins.cnt}")
                elif ins.cnt >= MAX_COUNT:
                    raise MscclError(f"{sw}: cnt must be less than {MAX_COUNT} (MSCCL's MSCCL_MAX_COUNT), got {ins.cnt}")
                _, _, reads, writes, _ = OPCODES[ins.op]
                # only the sides an opcode touches are checked: a receive's src is unused
                uses = ([("src", ins.srcbuf, ins.srcoff)] if reads else []) + \
                       ([("dst", ins.dstbuf, ins.dstoff)] if writes else [])
                for side, buf, off in uses:
                    if buf not in BUFFERS:
                        raise MscclError(f"{sw}: {side}buf must be one of {list(BUFFERS)}, got {buf!r}")
                    if off < 0 or off + ins.cnt > gpu.chunks(buf):
                        raise MscclError(f"{sw}: chunk out of range: {side}off={off} cnt={ins.cnt} reaches chunk "
                                         f"{off + ins.cnt - 1} of buffer {buf!r}, which has {gpu.chunks(buf)} "
                                         f"({buf}_chunks)")
                if ins.depid >= 0:
                    if ins.depid == tb.id:
                        raise MscclError(f"{sw}: depid names its own threadblock {tb.id}")
                    if ins.depid not in gpu.tbs:
                        raise MscclError(f"{sw}: depends on <tb id={ins.depid}>, which gpu {gpu.id} does not have")
                elif ins.depid < -1:
                    raise MscclError(f"{sw}: depid must be -1 or a threadblock id, got {ins.depid}")
    # dependencies on steps that exist (all threadblocks are known now)
    for gpu in program.gpus:
        for tb in gpu.tbs.values():
            for ins in tb.steps:
                if ins.depid >= 0:
                    target = gpu.tbs[ins.depid]
                    if not 0 <= ins.deps < len(target.steps):
                        raise MscclError(f"{ins.where}: depends on <tb id={ins.depid}> step {ins.deps}, which does "
                                         f"not exist (that threadblock has {len(target.steps)} steps)")
    for (src, dst, chan), (sends, recvs) in program.connections().items():
        for k in range(max(len(sends), len(recvs))):
            if k >= len(recvs):
                raise MscclError(f"{sends[k].where}: missing receive: send #{k} from rank {src} to rank {dst} on "
                                 f"channel {chan} has no matching receive (rank {dst} receives {len(recvs)} "
                                 f"messages from rank {src} on that channel, rank {src} sends {len(sends)})")
            if k >= len(sends):
                raise MscclError(f"{recvs[k].where}: missing send: receive #{k} by rank {dst} from rank {src} on "
                                 f"channel {chan} has no matching send (rank {src} sends {len(sends)} messages "
                                 f"to rank {dst} on that channel, rank {dst} receives {len(recvs)})")
            if sends[k].cnt != recvs[k].cnt:
                raise MscclError(f"{recvs[k].where}: message #{k} from rank {src} on channel {chan} is sent with "
                                 f"cnt={sends[k].cnt} ({sends[k].where}) but received with cnt={recvs[k].cnt}")


def load_program(path_or_text: str) -> Program:
    """Parse and check the MSCCL-IR of a file or a string."""
    return parse(read_text(path_or_text))
