"""NCCL's tuner model: the algorithm × protocol × channels NCCL would pick, and its time.

Every formula and constant here is NCCL's own, read (not copied) from github.com/NVIDIA/nccl
at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027:

- ``src/graph/tuning.cc`` ``ncclTopoTuneModel``: per collective, algorithm and protocol a
  latency (µs) and a bus bandwidth (GB/s). busBw = channels × per-channel bandwidth, then
  LL: min(llMaxBw, busBw / 2) (ring), busBw / 3.8 (tree); LL128: × 0.92 (ring) or × 120/128
  (tree across nodes, 7/9 on one node), capped per channel; tree all_reduce × 0.92 capped
  by perChMaxTreeBw; NVLS × nvlsEfficiency (0.85 on Hopper) × (channels − 1)/channels, × 2 for
  all_reduce; then the bus bandwidth becomes an algorithm bandwidth (ring, NVLS: × nRanks /
  nsteps; tree: × 0.5). Latency: base + for the ring (nsteps − inter steps) · intra +
  inter steps · inter, the intra step at least the network overhead (1 µs, × 3 for Simple)
  across nodes; for the tree 2((ppn − 1)·intra + log2 nNodes · inter); NVLS intra (+ inter).
  The constants: ``ncclTunerConstantsDefaults`` (baseLatencies, hwLatencies, llMaxBws,
  perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws, perChMaxNVLSTreeBws) and
  ``nvlsEfficiency``.
- ``ncclTopoGetAlgoTime``: time = latency + bytes / (1000 · bandwidth) µs, the tree's bandwidth
  × ``treeCorrectionFactor`` by size, and a multi-node Simple ring all_reduce's latency × 1.4
  when each channel's rank holds ≥ 64 bytes.
- ``src/enqueue.cc`` ``topoGetAlgoInfo``: the least time wins; then the channels fall by one
  while bytes < channels × threads × threadThreshold (threadThresholds 8 / 8 / 64 for LL /
  LL128 / Simple, ×nRanks for the LL ring; ``src/include/comm.h``).

What NCCL measures at start-up and ringcoll cannot (its topology search, ``src/graph/
search.cc``) comes from the machine instead, each step stated where it is taken:
bandwidth of the ring and tree graphs = a GPU's NVLink links × NCCL's per-link bandwidth
(``src/graph/topo.h``: SM80_NVLINK_BW 20, SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1 GB/s) and,
across nodes, the bound of channels that leave every node through its NICs (:func:`_graph_bw`);
the channel count is :data:`CHANNELS` (execution channels, twice the search's: nccl issue
#1041). The NVLS graph has one channel per head GPU, each at the bandwidth its head's NVLinks
can route (:func:`_nvls_graph`, from ``ncclTopoSearchTryNvls``, solved exactly where the
search steps through its speed array). NVLS is counted on Hopper and later NVSwitch machines
on one node (NCCL disables it across nodes without CollNet/SHARP), NVLS-tree across nodes;
PAT for all_gather and reduce_scatter with one GPU per node (Simple, the tree graph's bandwidth
× 0.75, latency 8 µs + log2 nodes · 14/3.5 µs + 2.8 µs per rank); CollNet is left out (no SHARP
is modelled).

:func:`protocol_machine` puts a protocol on the simulator's clock instead of in a formula: its
per-step latency, payload, chunks and channels as a machine that NCCL's schedules run on
(``simulate(..., algorithm="nccl")``, ``simulate(..., protocol=)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

from .machine import Machine
from .network import network

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
ARCH_INDEX = {"volta": 0, "ampere": 1, "hopper": 2, "blackwell": 3}

# -- ncclTunerConstantsDefaults (src/graph/tuning.cc) -----------------------------------------
#: baseLatencies[algorithm][protocol], µs
BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
                "pat": (8.0, 8.0, 8.0)}
#: hwLatencies[NVLINK | NET][algorithm][protocol], µs
NVLINK_LATENCY = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25),
                  "pat": (0, 0, 4.0)}
NET_LATENCY = {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9),
               "pat": (0, 0, 14)}
#: PAT's bandwidth factor (tuning.cc: busBw *= .75) and its per-rank latency (nRanks * 2.8 µs)
PAT_BW, PAT_RANK_LATENCY = 0.75, 2.8
#: llMaxBws[arch on one node | Intel CPU across nodes][nodes: 1, 2, more], GB/s
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
             "blackwell": (282.0, 90.0, 70.0)}
LL_MAX_BW_INTEL = (39.0, 39.0, 20.4)          # llMaxBws[0]: multi-node, Intel CPUs
PER_CH_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CH_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
                     "blackwell": (55.6, 31.67, 20.0)}
PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
               "blackwell": (70.0, 42.8, 24.0)}
PER_CH_NVLS_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (0.0, 57.7, 45.5),
                    "blackwell": (0.0, 96.0, 80.0)}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
#: treeCorrectionFactor[protocol][log2(bytes / 64)], powers of two from 64 B
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9))
#: src/graph/topo.h: one NVLink's bandwidth as NCCL counts it, GB/s
NVLINK_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
#: NCCL_NET_OVERHEAD's default on an Intel x86 host, µs (getNetOverhead)
NET_OVERHEAD = 1.0
#: threadThresholds (src/include/comm.h) and the threads per protocol (src/include/device.h:
#: NCCL_LL_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640, NCCL_SIMPLE_MAX_NTHREADS 512)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
#: execution channels of the ring and tree graphs: 16 on an 8-GPU Hopper NVSwitch node
#: (NCCL_DEBUG=INFO "16 coll channels", nccl issue #892, H800), 24 on an 8-GPU HGX A100
#: ("Channel 23/24", nccl-tests issue #100); NVLS channels 16 (enqueue.cc: "NVLS should not
#: need more than 16 channels")
CHANNELS = {"volta": 12, "ampere": 24, "hopper": 16, "blackwell": 16}
NVLS_CHANNELS = 16
#: src/include/device.h NCCL_MAX_NVLS_ARITY: at most this many NVLS heads (graph channels)
NVLS_MAX_ARITY = 32

#: the bus-bandwidth factor nccl-tests reports (src/*.cu: all_reduce 2(n−1)/n ...)
BUS_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
              "reduce_scatter": lambda p: (p - 1) / p, "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}


@dataclass(frozen=True)
class Choice:
    """What NCCL's tuner picks for one call, and its model's time (seconds)."""

    collective: str
    nbytes: int
    world: int
    nodes: int
    algorithm: str          # "ring", "tree", "nvls", "nvls_tree", "pat"
    protocol: str           # "LL", "LL128", "Simple"
    channels: int
    time: float

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth of this time, bytes/s."""
        return self.nbytes / self.time * BUS_FACTOR[self.collective](self.world) if self.time else 0.0

    @property
    def schedule(self) -> Optional[str]:
        """The ringcoll schedule that runs this algorithm's messages (None: NVLS reduces in
        the switch, which no point-to-point schedule can)."""
        return {"ring": "nccl_ring", "tree": "nccl_tree", "pat": "nccl_pat"}.get(self.algorithm)


@dataclass(frozen=True)
class Facts:
    """What the tuner reads of a machine: GPUs, nodes, NVLink and NIC bandwidth (GB/s)."""

    arch: str
    world: int
    nodes: int
    nvlink: float           # a GPU's NVLink bandwidth as NCCL counts it (links × per-link)
    net: float              # NIC bandwidth per GPU, GB/s
    nics: int               # NICs per node

    @classmethod
    def of(cls, machine: Machine, world: int) -> "Facts":
        net = machine.network
        if net is None or net.kind != "gpu_cluster":
            raise ValueError(f"NCCL's model needs a GPU cluster (ringcoll.Machine.gpu_cluster or .preset), "
                             f"got {machine.describe()}")
        p = net.params
        nodes = len(set(machine.nodes(world)))
        links = p.get("nvlinks")
        per_gpu = links * NVLINK_BW[p["arch"]] if links else 1 / net.params["nvlink"][1] / 1e9
        nic = 1 / p["nic"][1] / 1e9 * p["nics"] / p["gpus"]
        return cls(p["arch"], world, nodes, per_gpu, nic, p["nics"])


def _graph_bw(f: Facts) -> float:
    """Channels × per-channel bandwidth of the ring and tree graphs (GB/s). On one node a GPU's
    NVLinks. Across nodes every channel enters and leaves a node through a NIC (search.cc
    ncclTopoSearchRecNet: NET → GPU … GPU → NET), so the node's NICs together bound it, and
    inside the node a channel crosses NVLink ppn − 1 times for ppn GPUs: a GPU's NVLinks carry
    (ppn − 1) / ppn of the channels, bounding them by nvlink · ppn / (ppn − 1)."""
    ppn = f.world // f.nodes
    if f.nodes == 1:
        return f.nvlink
    return min(f.nvlink * ppn / (ppn - 1) if ppn > 1 else f.nvlink, f.net * ppn)


def _nvls_graph(f: Facts) -> Tuple[int, float, float]:
    """NCCL's NVLS graph: (channels, intra-node GB/s per channel, inter-node GB/s per channel).

    A channel per head GPU: on one node every GPU is a head, up to NCCL_MAX_NVLS_ARITY
    (search.cc ncclTopoCompute: maxChannels = min(NCCL_MAX_NVLS_ARITY, GPUs) and, with no
    network, minChannels = maxChannels), across nodes one head per NIC (the "NVLS Head" lines
    of NCCL_DEBUG=INFO logs with 4 NICs in nccl issue #1357 and 8 in nccl-tests issue #319).
    A channel's bandwidth is
    what ncclTopoSearchTryNvls can route: bw on every GPU's NVLinks each way and 2·bw on its
    head's, so with c channels a head carries (c + 1)·bw and bw = nvlink / (c + 1): solved
    exactly here, where the search steps down its speed array (sm90SpeedArrayIntra 60, 50, 40, …;
    at p = 8 it lands on 40 of the exact 41.2). Across nodes a channel's NIC share is the node's
    NICs' bandwidth / c."""
    ppn = f.world // f.nodes
    channels = min(ppn if f.nodes == 1 else f.nics, ppn, NVLS_MAX_ARITY)
    return channels, f.nvlink / (channels + 1), f.net * ppn / channels


def tuner_table(collective: str, f: Facts) -> Dict[Tuple[str, str], Tuple[float, float, int]]:
    """{(algorithm, protocol): (latency µs, algorithm bandwidth GB/s, channels)} as
    ``ncclTopoTuneModel`` fills it, for the algorithms enabled on this machine."""
    p, n = f.world, f.nodes
    ppn = p / n
    i2 = min(n, 3) - 1
    nsteps = 2 * (p - 1) if collective == "all_reduce" else p - 1 if collective in ("all_gather", "reduce_scatter") else p
    channels = CHANNELS[f.arch]
    out = {}
    for algo in ALGORITHMS:
        if algo == "tree" and collective != "all_reduce" or algo == "nvls" and (n > 1 or collective != "all_reduce") \
                or algo == "nvls_tree" and (n == 1 or collective != "all_reduce") \
                or algo.startswith("nvls") and NVLS_EFFICIENCY[f.arch] == 0 \
                or algo == "pat" and (collective not in ("all_gather", "reduce_scatter") or ppn != 1):
            continue                                   # PAT: 1 GPU per node only (tuning.cc ncclPatEnable)
        for k, proto in enumerate(PROTOCOLS):
            if (algo.startswith("nvls") or algo == "pat") and proto != "Simple":
                continue
            bw, ch = _bus_bw(algo, proto, collective, f, channels, ppn, i2)
            if bw <= 0:                                # not run here (NVLS with a single head)
                continue
            if algo in ("ring", "nvls", "nvls_tree"):
                bw *= p / nsteps
            elif algo == "tree":
                bw *= 0.5                              # PAT's all_gather/reduce_scatter: no conversion
            out[algo, proto] = (_latency(algo, k, collective, f, nsteps, ppn), bw, ch)
    return out


def _bus_bw(algo, proto, collective, f, channels, ppn, i2) -> Tuple[float, int]:
    arch, n = f.arch, f.nodes
    if algo.startswith("nvls"):
        nvls, per, inter = _nvls_graph(f)
        if nvls < 2:                                   # tuning.cc: NVLS needs at least 2 channels
            return 0.0, NVLS_CHANNELS
        intra = per * NVLS_EFFICIENCY[arch] * (nvls - 1) / nvls
        intra *= 2 if collective == "all_reduce" else (ppn - 1) / ppn
        inter *= 2 if n <= 2 and algo == "nvls_tree" else 1
        cap = PER_CH_NVLS_TREE[arch][i2] if algo == "nvls_tree" else math.inf
        return nvls * min(intra, inter if n > 1 else math.inf, cap), NVLS_CHANNELS
    bus = _graph_bw(f)
    ll_max = LL_MAX_BW[arch][i2] if n == 1 else LL_MAX_BW_INTEL[i2]
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * .5)
    if algo == "ring" and proto == "LL128":
        bus = min(bus * 0.92, channels * PER_CH_RING_LL128[arch])
    if algo == "pat":
        bus *= PAT_BW
    if algo == "tree":
        bus = min(bus * .92, channels * PER_CH_TREE[arch][i2])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(bus * (7.0 / 9.0 if n == 1 else 120.0 / 128.0), channels * PER_CH_TREE_LL128[arch][i2])
    return bus, channels


def _latency(algo, k, collective, f, nsteps, ppn) -> float:
    n = f.nodes
    lat = BASE_LATENCY[algo][k]
    intra = NVLINK_LATENCY[algo][k]
    inter = NET_LATENCY["tree" if ppn == 1 else algo][k]
    if algo == "ring":
        step = NVLINK_LATENCY["ring"][k] if n == 1 else NET_LATENCY["ring"][k]
        if collective in ("broadcast", "reduce"):
            return lat + step
        overhead = NET_OVERHEAD * (3 if k == 2 else 1) if n > 1 else 0.0
        intra = max(intra, overhead)
        inter_steps = 0 if n == 1 else 2 * (n - 1) if collective == "all_reduce" else n - 1
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + int(math.log2(n)) * inter)
    if algo == "nvls":
        return intra + (inter if n > 1 else 0.0)
    if algo == "pat":
        return lat + int(math.log2(n)) * inter / 3.5 + f.world * PAT_RANK_LATENCY
    return lat + intra + 2 * int(math.log2(n)) * inter          # nvls_tree


def algo_time(collective: str, algo: str, proto: str, nbytes: int, f: Facts,
              entry: Tuple[float, float, int]) -> float:
    """``ncclTopoGetAlgoTime`` for one (algorithm, protocol): seconds."""
    lat, bw, channels = entry
    if bw <= 0:
        return math.inf
    log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
    if algo == "tree" and collective == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOCOLS.index(proto)][log_size]
    if algo == "ring" and proto == "Simple" and f.nodes > 1 and collective == "all_reduce" \
            and nbytes / (channels * f.world) >= 64:
        lat *= 1.9 if f.arch == "volta" else 1.4
    return (lat + nbytes / (1000 * bw)) * 1e-6


def choose(collective: str, nbytes: int, world: int, machine: Machine,
           algorithms: Optional[List[str]] = None, protocols: Optional[List[str]] = None) -> Choice:
    """The (algorithm, protocol, channels) NCCL's tuner picks for ``collective`` of ``nbytes``
    on ``world`` ranks of GPU-cluster ``machine``, with its model's time. ``algorithms``
    limits the candidates (NCCL_ALGO), ``protocols`` the protocols (NCCL_PROTO)."""
    if collective not in BUS_FACTOR:
        raise ValueError(f"collective must be one of {sorted(BUS_FACTOR)} for NCCL's model, got {collective!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    f = Facts.of(machine, world)
    if world == 1:
        return Choice(collective, nbytes, 1, 1, "ring", "Simple", 1, 0.0)
    table = tuner_table(collective, f)
    best = None
    for (algo, proto), entry in table.items():
        if algorithms is not None and algo not in algorithms or protocols is not None and proto not in protocols:
            continue
        t = algo_time(collective, algo, proto, nbytes, f, entry)
        if best is None or t < best[0]:
            best = (t, algo, proto, entry[2])
    if best is None:
        raise ValueError(f"no NCCL algorithm among {algorithms} (protocols {protocols}) runs {collective} "
                         f"on this machine")
    t, algo, proto, channels = best
    return Choice(collective, nbytes, world, f.nodes, algo, proto, _channels(algo, proto, nbytes, channels, world),
                  t)


def _channels(algo: str, proto: str, nbytes: int, channels: int, world: int) -> int:
    """topoGetAlgoInfo's channel count: fewer while the bytes would not give every thread of
    every channel its threshold."""
    if algo.startswith("nvls"):
        return channels
    threshold = THREAD_THRESHOLD[proto] * (world if algo == "ring" and proto == "LL" else 1)
    while channels >= 2 and nbytes < channels * THREADS[proto] * threshold:
        channels -= 1
    return channels


# -- protocols on the simulator's clock ------------------------------------------------------
# What a protocol changes is what a byte and a step cost, not where messages go. Read (not
# copied) from github.com/NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027:
# src/include/device.h (NCCL_STEPS, the LL and LL128 line formats), src/init.cc (the default
# buffSizes), src/include/collectives.h (ALLREDUCE_CHUNKSTEPS) and src/enqueue.cc
# calcCollChunking (stepSize = buffSize / NCCL_STEPS; chunkSize = stepSize × chunkSteps, the
# chunkSteps only for the Simple ring, 1 otherwise; halved for LL, × 15/16 for LL128).

#: NCCL_STEPS: buffer slots of a connection, so steps one channel keeps in flight
NCCL_STEPS = 8
#: stepSize = buffSize / NCCL_STEPS, bytes on the wire per step: LL 8 lines × 512 threads of
#: 16-byte lines (DEFAULT_LL_BUFFSIZE), LL128 120 elements × 640 threads of 8 bytes
#: (DEFAULT_LL128_BUFFSIZE), Simple 4 MiB (DEFAULT_BUFFSIZE)
STEP_BYTES = {"LL": 8 * 512 * 16, "LL128": 120 * 640 * 8, "Simple": (1 << 22) // NCCL_STEPS}
#: payload per byte on the wire: an LL line (ncclLLFifoLine, 16 B) carries 8 B of data and two
#: flags, an LL128 line of 128 B 120 B (NCCL_LL128_DATAELEMS of NCCL_LL128_LINEELEMS), Simple all
PAYLOAD = {"LL": 8 / 16, "LL128": 120 / 128, "Simple": 1.0}
#: ALLREDUCE_CHUNKSTEPS = NCCL_STEPS / 2: a Simple ring chunk spans 4 steps' slots
RING_SIMPLE_CHUNK_STEPS = NCCL_STEPS // 2


@dataclass(frozen=True)
class ProtocolMachine:
    """The machine one NCCL protocol runs an algorithm on, for the simulator's clock
    (:func:`protocol_machine`), and what the clock cannot charge (``launch``)."""

    machine: Machine
    algorithm: str          # "ring" or "tree": whose per-step latency and chunk
    protocol: str           # "LL", "LL128", "Simple"
    channels: int
    chunk: int              # payload bytes one channel moves per step (calcCollChunking's chunkSize)
    launch: float           # seconds, baseLatencies: once per call, not per message, so not on the clock

    @property
    def segment(self) -> int:
        """Bytes per pipelined message of a schedule that runs every channel in one step:
        each channel's chunk, side by side."""
        return self.channels * self.chunk


def check_protocol(protocol) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`; TypeError or ValueError naming it."""
    if not isinstance(protocol, str):
        raise TypeError(f"protocol must be a str, one of {PROTOCOLS}, got {type(protocol).__name__} {protocol!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    return protocol


def protocol_machine(machine: Machine, world: int, protocol: str, algorithm: str = "ring",
                     channels: Optional[int] = None) -> ProtocolMachine:
    """The machine ``protocol`` runs NCCL's ``algorithm`` ("ring" or "tree") on, on ``world``
    ranks of GPU-cluster ``machine``, with ``channels`` channels (default: all, :data:`CHANNELS`).

    - **Latency**: each message's is NCCL's per-step hwLatencies[NVLINK][algorithm][protocol],
      as LogGP's wire latency ``L`` (α = o = g = 0): NCCL's formula charges it per step of the
      algorithm, not per chunk, and the clock charges L where a step waits on the one before
      and overlaps it where chunks pipeline. A message between nodes also pays
      hwLatencies[NET] − hwLatencies[NVLINK] on its NIC (held with the message, as a network
      link's latency is). baseLatencies, once per call, is ``launch``.
    - **Bandwidth**: a channel's is the tuner's (:class:`Facts`: a GPU's NVLinks as NCCL counts
      them, shared by the :data:`CHANNELS` channels), ``channels`` of them running side by side
      on a GPU's NVLinks, and a NIC at its own; both × the protocol's payload (:data:`PAYLOAD`:
      LL 8 of 16 bytes, LL128 120 of 128, Simple all).
    - **Chunks**: a channel moves ``chunk`` payload bytes per step (:data:`STEP_BYTES` ×
      chunkSteps × payload); a step of all channels together is ``segment`` bytes, the
      pipelining segment of the schedule, each channel running its share of the bytes.
    - **Steps in flight**: NCCL_STEPS / chunkSteps chunks, the clock's ``window``.

    NCCL's tuner model caps some of these further (LL at llMaxBws, LL128 × 0.92); the clock
    does not, and that is where the two differ (docs/simulator.md, "Compare against NCCL").
    """
    check_protocol(protocol)
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm must be 'ring' or 'tree' (the schedules that run NCCL's protocols), "
                         f"got {algorithm!r}")
    f = Facts.of(machine, world)
    full = CHANNELS[f.arch]
    if channels is None:
        channels = full
    if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= full:
        raise ValueError(f"channels must be an int in 1..{full}, got {channels!r}")
    k = PROTOCOLS.index(protocol)
    payload = PAYLOAD[protocol]
    steps = RING_SIMPLE_CHUNK_STEPS if (algorithm, protocol) == ("ring", "Simple") else 1
    net = machine.network
    nvlink = f.nvlink / full * channels * payload * 1e9
    inter = max(0.0, NET_LATENCY[algorithm][k] - NVLINK_LATENCY[algorithm][k]) * 1e-6 if f.nodes > 1 else 0.0
    params = {**net.params, "nvlink": (0.0, 1 / nvlink), "nic": (inter, net.params["nic"][1] / payload)}
    # across nodes ringcoll runs NCCL's channels as one ring (or tree pair) per GPU of a node
    # (schedules.nccl.channel_rings), side by side: a port each, and a lane each of every GPU's
    # NVLinks, so a ring's message through a NIC holds its own lane at the NIC's pace, as
    # NCCL's channels share the NVLinks, instead of the whole GPU's port and NVLink
    rings = world // f.nodes if f.nodes > 1 else 1
    params["nvlink_lanes"] = rings
    on = replace(machine, alpha=0.0, o=0.0, g=0.0, L=NVLINK_LATENCY[algorithm][k] * 1e-6,
                 window=NCCL_STEPS // steps, ports=rings,
                 network=network("gpu_cluster", placement=net.placement, hop_latency=net.hop_latency, **params))
    return ProtocolMachine(on, algorithm, protocol, channels, int(STEP_BYTES[protocol] * steps * payload),
                           BASE_LATENCY[algorithm][k] * 1e-6)
