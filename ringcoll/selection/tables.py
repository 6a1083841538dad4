"""What ``auto`` and the pipelines' segments go by, as data: the rules measured on this host
(:data:`RULES`, each with its evidence), the segment sizes (:data:`SEGMENTS`), the CUDA table
(its machine's constants and segments, with their sources) and :func:`table`, the table of a
call's device; :data:`state` is the thread's model context (whether the model is running, and
for which device)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

from ..schedules.vocabulary import DEFAULT_SEGMENT_BYTES
from ..config import settings
from ..sim.machine import Machine

#: the thread's model context: ``modelling`` (the model's own plans are being built: their log
#: lines are hidden) and ``device`` (the device whose table the model prices for)
state = threading.local()

#: the machine of the model when neither Options nor RINGCOLL_MACHINE gives one: the
#: simulator's default machine (α = 5 µs per message, 10 GB/s on the wire, 20 GB/s reducing,
#: one port per rank), a modest cluster
DEFAULT_MACHINE = Machine()


def _any_world(world: int) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    collective: str
    max_bytes: Optional[int]
    algorithm: str
    evidence: str
    world: Callable[[int], bool] = _any_world
    #: the largest world size its evidence measured: the rule decides only up to there.
    #: None: a default from the literature (MPICH), never measured here; the model decides.
    measured_upto: Optional[int] = None


KiB, MiB = 1024, 1024 * 1024

RULES = (
    # Measured 2026-12-02 with ringcoll-bench on this 2-core machine (gloo, float32 SUM, median
    # of 7, time ratio to the built-in in the same run; raw JSON under bench/results/). Here α is
    # a process wake-up (~1 ms with p ranks on 2 cores) and every P2P message pays a rendezvous,
    # so fewer, larger messages win; ±15 % is run-to-run noise at one size.
    Rule("all_reduce", 1 * MiB, "recursive_doubling",
         "up to 1 MiB: lg p whole-vector exchanges; p=4: 0.39-0.84 of the built-in from 4 KiB to "
         "1 MiB, best of the four at every size; p=3 (with the fold): 0.32-1.07, best at 4 of 5 "
         "sizes.",
         measured_upto=4),
    Rule("all_reduce", None, "rabenseifner",
         "above 1 MiB at powers of two: 2 lg p messages with the ring's bytes; p=4: 1.02-1.09 at "
         "4-16 MiB and 0.87 at 64 MiB, where ring was 0.99-1.45 and recursive doubling 1.16-1.30.",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("all_reduce", None, "ring",
         "above 1 MiB at other p: no fold (Rabenseifner's fold moves 2n more); p=3 at 64 MiB: ring "
         "1.07-1.20 vs rabenseifner 1.41, recursive doubling 1.30, double_binary_tree 1.42.",
         measured_upto=3),
    # all_gather / reduce_scatter / gather / scatter: nbytes is the gathered (scattered) total
    Rule("all_gather", None, "recursive_doubling",
         "powers of two, any size: lg p messages, no fold; p=4 (ringcoll-bench 2026-12-02): 0.48-"
         "0.86 of the built-in from 1 MiB to 64 MiB (ring 0.53-1.20, bruck 0.58-1.16), 0.53-1.12 "
         "below (MPICH stops at 512 KiB; here the ring's p-1 rendezvous cost more).",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("all_gather", 80 * KiB, "bruck",
         "first rule: MPICH's default: other worlds below 80 KiB take Bruck, ⌈lg p⌉ messages at "
         "any p. To be re-measured by ringcoll-bench."),
    Rule("all_gather", None, "ring",
         "MPICH's default above 80 KiB at other p; p=3 (ringcoll-bench 2026-12-02): ring 0.49-"
         "0.97 of the built-in from 1 MiB to 64 MiB, best at 3 of 4 sizes (bruck 0.53-1.03).",
         measured_upto=3),
    Rule("reduce_scatter", None, "recursive_halving",
         "powers of two, any size: lg p messages and no fold; p=4 (ringcoll-bench 2026-12-02): "
         "0.34-0.51 of the built-in (which runs a whole all_reduce) from 1 MiB to 64 MiB, 0.40-0.96 "
         "below; pairwise 0.34-0.89, ring 0.52-0.87.",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("reduce_scatter", 512 * KiB, "recursive_halving",
         "first rule: MPICH's default for commutative ops (every ReduceOp): recursive halving "
         "below 512 KiB, lg p messages. To be re-measured by ringcoll-bench."),
    Rule("reduce_scatter", None, "pairwise",
         "MPICH's default above 512 KiB: every block straight to its owner, no fold; p=3 "
         "(ringcoll-bench 2026-12-02): 0.42-0.63 of the built-in from 4 MiB to 64 MiB, best there.",
         measured_upto=3),
    Rule("gather", None, "linear",
         "p <= 8: the root posts every receive at once; p=4 (ringcoll-bench 2026-12-02): linear "
         "1.05-1.59 of the built-in from 4 KiB to 64 MiB, binomial 1.18-2.14 (each tree level "
         "costs a wake-up here).",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("gather", None, "binomial",
         "p > 8: MPICH's default, ⌈lg p⌉ messages on the critical path. Not measured (p > 8 needs "
         "more cores)."),
    Rule("scatter", None, "linear",
         "p <= 8: the root posts every send at once; p=4 (ringcoll-bench 2026-12-02, run "
         "20261202T144510Z_np4): linear 1.40 of the built-in at 1 MiB and up and 1.34 at 64 MiB, "
         "binomial 1.66 and 1.75; 1.65 vs 1.93 up to 64 KiB.",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("scatter", None, "binomial",
         "p > 8: MPICH's default scatter, ⌈lg p⌉ messages on the critical path. Not measured "
         "(p > 8 needs more cores)."),
    # broadcast / reduce: nbytes is the vector. Measured 2026-12-02, gloo on 2 cores (heavily
    # shared: load 15), float32, root 1, median of 7, ms, p=4 / p=8. Broadcast 4 KiB: binomial
    # 5.1 / 6.3, pipelined_chain 4.3 / 8.1, scatter_allgather 10.6 / 32.2, double_binary_tree
    # 7.4 / 36.7; 256 KiB: 6.8 / 27.2, 13.0 / 27.9, 7.9 / 104, 19.6 / 64.3; 4 MiB: 18.2 / 50.8,
    # 119 / 440, 8.5 / 27.6, 41.8 / 253. Reduce 4 KiB: binomial 1.5 / 5.6, rabenseifner 3.2 /
    # 21.1, ring 2.3 / 8.3, double_binary_tree 4.2 / 8.2; 256 KiB: 2.0 / 10.3, 8.5 / 29.0, 5.1 /
    # 79.5, 8.4 / 25.1; 4 MiB: 9.9 / 29.5, 11.9 / 42.3, 116 / 381, 98 / 204. Here α is a process
    # wake-up (~1 ms), so the 64 KiB-segment pipelines pay it per segment and lose.
    Rule("broadcast", 1 * MiB, "linear",
         "p <= 8, up to 1 MiB: one step (the root's p-1 sends at once) instead of lg p dependent "
         "ones, each a wake-up here; p=4 (ringcoll-bench 2026-12-02, 30 rounds): linear 1.13-1.76 "
         "of the built-in from 1 KiB to 1 MiB, binomial 1.34-2.27 (at p=2 they are one message "
         "alike).",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("broadcast", None, "binomial",
         "p <= 8, above 1 MiB: lg p messages and the fewest bytes in all (p-1)n, which is what two "
         "cores can move; p=4 (ringcoll-bench 2026-12-02): 0.98-1.05 of the built-in from 1 MiB "
         "to 64 MiB, scatter_allgather 0.98-1.57, pipelined_chain 1.07-1.56. Checked against "
         "every committed p=4 run (bench/results/*_np4_gloo.csv with broadcast): at 64 MiB "
         "binomial 0.85 / 0.99 / 0.98 / 0.98 of the built-in (runs 20261202T144510Z, "
         "20261204T012843Z, T033103Z, T154640Z), scatter_allgather 0.94 / 1.08 / 0.94 / 0.91: it "
         "wins 2 of 4 (in T033103Z bine, 0.84, beat both) and loses 2, and in T154640Z their "
         "p10-p90 overlap (41-59 ms vs 43-58); at 16 MiB binomial 1.03 / 1.00 / 1.08 / 1.05, "
         "scatter_allgather 1.13 / 1.09 / 1.04 / 1.09. Not a case for a switch; linear (0.94 / "
         "0.97 / 0.97 at 64 MiB in the last three) neither.",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("broadcast", 256 * KiB, "binomial",
         "p > 8, up to 256 KiB: lg p messages (MPICH: binomial below 12 KiB or p < 8). Not "
         "measured (p > 8 needs more cores)."),
    Rule("broadcast", None, "scatter_allgather",
         "p > 8, above 256 KiB: 2(p-1)/p·n on the wire instead of lg p·n (MPICH's long-message "
         "broadcast). Not measured (p > 8 needs more cores)."),
    Rule("reduce", None, "binomial",
         "p <= 8: binomial measured fastest at every size; 2026-12-02 (comment above), 4 KiB to "
         "4 MiB, at p=4 and 8 (4 MiB: 9.9 ms vs rabenseifner 11.9 at p=4, 29.5 vs 42.3 at p=8). "
         "To be re-measured by ringcoll-bench.",
         world=lambda world: world <= 8,
         measured_upto=8),
    Rule("reduce", 64 * KiB, "binomial",
         "p > 8, up to 64 KiB: α-bound, lg p messages; the α-β-γ models cross between 12 and 64 "
         "KiB at α = 5 µs, 10 GB/s. Not measured (p > 8 needs more cores). To be re-measured by "
         "ringcoll-bench."),
    Rule("reduce", None, "rabenseifner",
         "p > 8, above 64 KiB: 2(p-1)/p·n on the wire and (p-1)/p·n reduced instead of lg p·n "
         "of each; MPICH's reduce_scatter_gather for long vectors. Not measured (p > 8 needs "
         "more cores). To be re-measured by ringcoll-bench."),
    # all_to_all: bytes = the largest block (what one rank sends to one peer), as MPICH's
    # thresholds. Bruck needs every rank to run it, so the builder skips its rule (taking the
    # next that matches) unless the call declares equal blocks (all_to_all_single, splits None).
    Rule("all_to_all", 256, "bruck",
         "blocks <= 256 B at p >= 8: ⌈lg p⌉ messages instead of p-1 (MPICH's short-message rule); "
         "measured 2026-12-02, gloo on 2 cores, p=8, median of 15: 8 B blocks bruck 11.8 ms vs "
         "linear 10.1 vs pairwise 31.4, 64 B 17.2 vs 18.4 vs 30.6 (a tie with linear here, where "
         "α is process wake-ups; the lg p advantage grows with p). To be re-measured by ringcoll-bench.",
         world=lambda world: world >= 8,
         measured_upto=8),
    Rule("all_to_all", 256 * KiB, "linear",
         "blocks <= 256 KiB: all p-1 exchanges in flight at once (MPICH's medium-message "
         "isend/irecv); measured 2026-12-02, gloo on 2 cores, median of 15: linear 1.2-3x faster "
         "than pairwise at p=4 and 8 for every block from 8 B to 256 KiB (p=8, 4 KiB: 19.8 ms vs "
         "33.3; 256 KiB: 15.4 vs 33.4). To be re-measured by ringcoll-bench.",
         measured_upto=8),
    Rule("all_to_all", None, "pairwise",
         "blocks > 256 KiB: one exchange in flight per step bounds the memory and contention "
         "(MPICH's long-message choice); measured 2026-12-02, gloo on 2 cores, median of 7, p=8: "
         "1 MiB blocks pairwise 57.8 ms vs linear 60.4, 4 MiB 147 vs 252 (at p=4 linear still led: "
         "35 vs 69 ms at 4 MiB). To be re-measured by ringcoll-bench.",
         measured_upto=8),
    Rule("barrier", None, "dissemination",
         "the only barrier: ⌈lg p⌉ steps at any p, no fold (Hensgen-Finkel-Manber; MPICH's default)."),
)


# -- segment sizes of the pipelined algorithms ------------------------------------------

@dataclass(frozen=True)
class SegmentRule:
    collective: str
    algorithm: str
    segment_bytes: int
    evidence: str


SEGMENTS = (
    SegmentRule("all_reduce", "ring", 16 * MiB,
                "gloo's own ring cuts ≤ 1 MiB segments, but here each segment pays a P2P "
                "rendezvous and a wake-up while two cores leave nothing to overlap: ring at 64 MiB "
                "(ringcoll-bench 2026-12-02, time / built-in) p=4: 1.41 with 1 MiB segments, 1.15 "
                "with 4 MiB, 1.04 unsegmented; p=3: 1.35-1.44 with 1 MiB, 1.07-1.10 with 8 MiB, "
                "1.07-1.25 unsegmented."),
)

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

CUDA_SEGMENTS = (
    SegmentRule("all_reduce", "ring", 64 * MiB,
                "α-β-γ on CUDA_MACHINE (experiments/cuda_segments.py, bench/results/"
                "cuda_segments.txt): the ring's simulated time only falls as segments grow (p = 8 "
                "and 16, 64 MiB to 1 GiB: best at the whole chunk, e.g. p=8 256 MiB 1331 us at 32 "
                "MiB and up, 1751 at 8 MiB, 5671 at 1 MiB): at 1.6 TB/s a reduction hides little "
                "and every segment costs an α (10 us: 4.5 MB of NVLink time). 64 MiB is the best "
                "up to 512 MiB per chunk and bounds the two scratch slots."),
)

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
