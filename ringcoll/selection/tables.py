"""What ``auto`` and the pipelines' segments go by, as data: the rules measured on this host
(:data:`RULES`, each with its evidence) and the segment sizes (:data:`SEGMENTS`,
:data:`CUDA_SEGMENTS`), both read from ``rules.toml`` beside this module; the CUDA table
(its machine's constants and segments, with their sources) and :func:`table`, the table of a
call's device; :data:`state` is the thread's model context (whether the model is running, and
for which device)."""
from __future__ import annotations

import os
import threading
import tomllib
from dataclasses import dataclass
from typing import Callable, Optional

from ..schedules.vocabulary import DEFAULT_SEGMENT_BYTES
from ..config import settings
from ..cost.machine import Machine

#: the thread's model context: ``modelling`` (the model's own plans are being built: their log
#: lines are hidden) and ``device`` (the device whose table the model prices for)
state = threading.local()

#: the machine of the model when neither Options nor RINGCOLL_MACHINE gives one: the
#: simulator's default machine (α = 5 µs per message, 10 GB/s on the wire, 20 GB/s reducing,
#: one port per rank), a modest cluster
DEFAULT_MACHINE = Machine()


@dataclass(frozen=True)
class Rule:
    """One measured (or literature) rule of ``auto``: ``algorithm`` for ``collective`` on
    worlds that ``world`` admits (``"any"``, ``"power of two"``, ``"<= N"``, ``">= N"``) up to
    ``max_bytes`` (None: any size). It decides only up to ``measured_upto`` ranks (None: a
    literature default, never measured here: the model decides)."""
    collective: str
    max_bytes: Optional[int]
    algorithm: str
    evidence: str
    world: str = "any"
    measured_upto: Optional[int] = None

    def __post_init__(self):
        _world_test(self.world)             # a bad condition fails at load, not at a call

    def admits(self, world: int) -> bool:
        """Whether the rule speaks for a group of ``world`` ranks."""
        return _world_test(self.world)(world)


def _world_test(condition: str) -> Callable[[int], bool]:
    if condition == "any":
        return lambda world: True
    if condition == "power of two":
        return lambda world: world & (world - 1) == 0
    for op, test in (("<=", lambda world, n: world <= n), (">=", lambda world, n: world >= n)):
        if condition.startswith(op) and condition[len(op):].strip().isdigit():
            bound = int(condition[len(op):])
            return lambda world: test(world, bound)
    raise ValueError(f"a rule's world must be 'any', 'power of two', '<= N' or '>= N', got {condition!r}")


KiB, MiB = 1024, 1024 * 1024


def _bytes(text: str) -> int:
    """'64 KiB', '4 MiB', '100 B' as bytes."""
    number, _, unit = text.partition(" ")
    scale = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": 1024 * MiB}.get(unit)
    if not number.isdigit() or scale is None:
        raise ValueError(f"a size in rules.toml must read 'N B', 'N KiB', 'N MiB' or 'N GiB', got {text!r}")
    return int(number) * scale


def _prose(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class SegmentRule:
    collective: str
    algorithm: str
    segment_bytes: int
    evidence: str


def _load_tables(path: str) -> tuple:
    """The rules, gloo's segments and CUDA's segments of ``path`` (rules.toml)."""
    with open(path, "rb") as file:
        data = tomllib.load(file)
    rules = tuple(Rule(entry["collective"], _bytes(entry["max_bytes"]) if "max_bytes" in entry else None,
                       entry["algorithm"], _prose(entry["evidence"]), entry.get("world", "any"),
                       entry.get("measured_upto"))
                  for entry in data.get("rule", ()))

    def segments(kind: str) -> tuple:
        return tuple(SegmentRule(entry["collective"], entry["algorithm"], _bytes(entry["segment_bytes"]),
                                 _prose(entry["evidence"])) for entry in data.get(kind, ()))

    return rules, segments("segment"), segments("cuda_segment")


#: the measured rules, gloo's segment table and CUDA's, with their evidence: rules.toml
RULES, SEGMENTS, CUDA_SEGMENTS = _load_tables(os.path.join(os.path.dirname(__file__), "rules.toml"))


# -- segment sizes of the pipelined algorithms ------------------------------------------

#: the pipelined algorithms' segment where no rule names one (gloo's ring segment; the trees
#: and chains that use it are not chosen by ``auto`` on this machine): DEFAULT_SEGMENT_BYTES,
#: in the schedule vocabulary, where a schedule called without a builder finds it too


def segment_bytes(collective: Optional[str] = None, algorithm: Optional[str] = None,
                  device=None) -> int:
    """The segment, in bytes, that ``collective``/``algorithm`` pipelines over: the
    ``RINGCOLL_SEGMENT`` environment variable (bytes), else the segment table of ``device``'s
    table (:func:`table`: :data:`SEGMENTS` or :data:`CUDA_SEGMENTS`), else its default."""
    forced = settings().segment
    if forced:
        return forced
    of = table(device)
    return next((rule.segment_bytes for rule in of.segments
                 if rule.collective == collective and rule.algorithm == algorithm),
                of.default_segment)


def segment_elements(collective: str, algorithm: str, element_size: int, device=None) -> int:
    """:func:`segment_bytes` in elements of ``element_size`` bytes (at least one)."""
    return max(1, segment_bytes(collective, algorithm, device) // max(1, element_size))


# -- the CUDA table ------------------------------------------------------------------------
# Nothing has run on a GPU yet: no rule was measured there, and the model decides on a machine
# built from published constants (an H200 node and its fabric, as NCCL's own tuning model
# prices a launch). ``ringcoll-bench --tune`` run on CUDA writes rows marked ``cuda`` that
# override it (RINGCOLL_TUNING), as RINGCOLL_MACHINE does with a fitted machine.

#: One step's fixed cost on CUDA: an NCCL P2P launch plus a hop. NCCL's tuning model
#: (src/graph/tuning.cc) prices a Simple-protocol launch at 8.4 us base latency plus 3.4 us per
#: NVLink hop; across nodes the network hop adds a few us more (InfiniBand NDR's wire latency
#: is ~1-2 us; NCCL's Simple net latency is ~5-15 us depending on version).
CUDA_NVLINK_ALPHA = 10e-6
CUDA_IB_ALPHA = 15e-6
#: NVLink 4 on H200 SXM: 18 links, 900 GB/s both directions = 450 GB/s per direction (NVIDIA
#: H200 datasheet); one P2P stream between two GPUs through NVSwitch can use it all.
CUDA_NVLINK_BETA = 1 / 450e9
#: InfiniBand NDR: 400 Gb/s = 50 GB/s per direction per port; a DGX H200 has 8 ConnectX-7
#: ports for the compute fabric, one per GPU (the NIC ports of a node: 8).
CUDA_IB_BETA = 1 / 50e9
#: Reduction at HBM speed: H200's HBM3e moves 4.8 TB/s, a reduce moves 3 bytes (2 reads, 1
#: write) per byte reduced: 1.6 TB/s of bytes reduced.
CUDA_GAMMA = 1 / 1.6e12

#: the CUDA table's machine: nodes of 8 GPUs on NVLink, 8 NIC ports per node between them
CUDA_MACHINE = Machine.hierarchical(8, intra=(CUDA_NVLINK_ALPHA, CUDA_NVLINK_BETA),
                                    inter=(CUDA_IB_ALPHA, CUDA_IB_BETA), gamma=CUDA_GAMMA,
                                    nic_ports=8)

#: the pipelined trees' and chains' segment on CUDA (same script): best 2-4 MiB at 16 MiB
#: (p = 8: chain 193 us, both double binary trees at or within 12 % of their best), 8-16
#: MiB at 256 MiB (there 4 MiB costs up to 38 % more; those sizes go to the bandwidth-optimal
#: algorithms anyway).
CUDA_DEFAULT_SEGMENT_BYTES = 4 * MiB


@dataclass(frozen=True)
class Table:
    """What ``auto`` and the pipelines' segments go by on one kind of device."""
    device: str                 # "cpu" (gloo) or "cuda"
    rules: tuple                # measured rules, each speaking up to its measured world
    machine: Machine            # the model's machine when the call names none
    source: str                 # how the reason names that machine
    segments: tuple
    default_segment: int


TABLES = {
    "cpu": Table("cpu", RULES, DEFAULT_MACHINE, "default machine", SEGMENTS,
                 DEFAULT_SEGMENT_BYTES),
    "cuda": Table("cuda", (), CUDA_MACHINE, "CUDA machine", CUDA_SEGMENTS,
                  CUDA_DEFAULT_SEGMENT_BYTES),
}


def table(device=None) -> Table:
    """The table of ``device``: CUDA's for ``"cuda"`` (or a CUDA torch.device), gloo's for any
    other; None: the one whose model is being priced in this thread (the simulations the
    model runs take its segments), else gloo's."""
    if device is None:
        device = getattr(state, "device", None) or "cpu"
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return TABLES["cuda" if kind == "cuda" else "cpu"]
