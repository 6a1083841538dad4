"""GPU clusters from their spec sheets: :meth:`ringcoll.Machine.gpu_cluster` and its presets.

A GPU cluster is ``nodes`` nodes of ``gpus_per_node`` GPUs. Inside a node every GPU reaches
every other through an NVSwitch over its NVLinks (``nvlink_bandwidth`` bytes/s per direction,
all of one GPU's links together); between nodes each GPU sends through its rail's NIC (GPU g of
``nics_per_node`` NICs on rail g·K // G, ``nic_bandwidth`` bytes/s per direction), NIC k of
every ``nodes_per_leaf`` nodes on one leaf switch of rail k, the leaves joined by a spine with
``oversubscription``:1
(ringcoll.cost.network, kind "gpu_cluster"); a message between nodes travels on the
destination GPU's rail, through another GPU's NIC over NVLink when the sender's rail differs
(NCCL's PXN). A message costs α (``alpha``: the per-message
software latency at the ends) + the latencies of its route's links (``nic_latency`` once for a
message between nodes, ``fabric_latency`` more through the spine) + n·β of its slowest link.

Every constant of a preset names its source: a spec sheet (URL) or NCCL's source
(github.com/NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027, the file and the
name of the constant). None was fitted to a measurement.
"""
from __future__ import annotations

from typing import Dict, Optional

#: NCCL's source the presets cite (github.com/NVIDIA/nccl)
NCCL_COMMIT = "5067397c2676d5aed50042fc39e5c8ee96eb0027"

#: per-message latencies both presets take from NCCL's own tuner (src/graph/tuning.cc,
#: ncclTunerConstantsDefaults.hwLatencies, Ring/Simple): 3.4 µs per step over NVLink, 14 µs
#: per step over the network (the NVLink step's share counted in alpha, the rest in the NIC)
NCCL_NVLINK_STEP = 3.4e-6
NCCL_NET_STEP = 14.0e-6

#: name -> the constants of one node, with each one's source
PRESETS: Dict[str, dict] = {
    "dgx-h100": dict(
        gpus_per_node=8,           # https://www.nvidia.com/en-us/data-center/dgx-h100/ (8x H100 SXM5)
        nvlink_bandwidth=450e9,    # 900 GB/s NVLink 4 per GPU, both directions:
                                   # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM)
        nvlinks=18,                # 18 NVLink 4 links per H100 SXM (same page)
        nics_per_node=8,           # 8x ConnectX-7 400 Gb/s for the compute fabric:
        nic_bandwidth=400e9 / 8,   # https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html
        arch="hopper",             # compute capability 9.0
        hbm_bandwidth=3.35e12,     # H100 SXM, https://www.nvidia.com/en-us/data-center/h100/
    ),
    "hgx-h100": "dgx-h100",        # the same board (8x H100 SXM5, NVSwitch) in partners' servers
    "dgx-h200": dict(
        gpus_per_node=8,           # https://www.nvidia.com/en-us/data-center/dgx-h200/ (8x H200)
        nvlink_bandwidth=450e9,    # 900 GB/s NVLink per GPU: https://www.nvidia.com/en-us/data-center/h200/
        nvlinks=18,
        nics_per_node=8,           # 8x ConnectX-7 400 Gb/s (DGX H200 page above)
        nic_bandwidth=400e9 / 8,
        arch="hopper",
        hbm_bandwidth=4.8e12,      # H200 SXM, https://www.nvidia.com/en-us/data-center/h200/
    ),
    "hgx-h200": "dgx-h200",
    "dgx-a100": dict(
        gpus_per_node=8,           # https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html
        nvlink_bandwidth=300e9,    # 600 GB/s NVLink 3 per GPU, both directions:
                                   # https://www.nvidia.com/en-us/data-center/a100/ (A100 SXM)
        nvlinks=12,                # 12 NVLink 3 links per A100 SXM (same page)
        nics_per_node=8,           # 8x ConnectX-6 200 Gb/s HDR for the compute fabric (DGX A100 guide above)
        nic_bandwidth=200e9 / 8,
        arch="ampere",             # compute capability 8.0
        hbm_bandwidth=2.039e12,    # A100 80GB SXM, https://www.nvidia.com/en-us/data-center/a100/
    ),
}


def presets() -> list:
    """The names :func:`preset` knows, sorted."""
    return sorted(PRESETS)


def preset_facts(name: str) -> dict:
    """The constants of preset ``name`` (an alias resolved); ValueError naming the choices."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset name must be one of {presets()}, got {name!r}")
    facts = PRESETS[name]
    return dict(PRESETS[facts] if isinstance(facts, str) else facts)


def gpu_cluster(cls, nodes: int, gpus_per_node: int, *, nvlink_bandwidth: float, nics_per_node: int,
                nic_bandwidth: float, alpha: float = NCCL_NVLINK_STEP,
                nic_latency: float = NCCL_NET_STEP - NCCL_NVLINK_STEP, nvlink_latency: float = 0.0,
                oversubscription: float = 1.0, fabric_latency: float = 0.0, gamma: float = 0.0,
                ports: int = 1, arch: str = "hopper", nvlinks: Optional[int] = None,
                nodes_per_leaf: Optional[int] = None, placement=None):
    """The :class:`ringcoll.Machine` of a GPU cluster (see the module docstring). ``gamma``
    defaults to 0: NCCL reduces in registers as data arrives, so reductions never add to the
    link time at these rates. ``arch`` ("volta", "ampere", "hopper", "blackwell") and
    ``nvlinks`` (NVLink links per GPU) are what NCCL's tuner model reads
    (:mod:`ringcoll.cost.nccl`). ``nodes_per_leaf``: the nodes whose NICs share one leaf
    switch per rail (default: all; more nodes go through the spine, ``oversubscription``:1).
    A DGX SuperPOD scalable unit puts 32 nodes on its rail leaves:
    https://docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100/latest/network-fabrics.html"""
    from .network import _positive_int, network

    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("nics_per_node", nics_per_node)):
        _positive_int(name, value)
    if nics_per_node > gpus_per_node:
        raise ValueError(f"nics_per_node must be at most gpus_per_node ({gpus_per_node}), got {nics_per_node!r}")
    for name, value in (("nvlink_bandwidth", nvlink_bandwidth), ("nic_bandwidth", nic_bandwidth)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of bytes per second, got {value!r}")
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    net = network("gpu_cluster", placement=placement, nodes=nodes, gpus=gpus_per_node, nics=nics_per_node,
                  nvlink=(nvlink_latency, 1 / nvlink_bandwidth), nic=(nic_latency, 1 / nic_bandwidth),
                  oversubscription=oversubscription, fabric_latency=fabric_latency, arch=arch,
                  nvlinks=nvlinks, nodes_per_leaf=nodes_per_leaf)
    return cls(alpha=alpha, beta=0.0, gamma=gamma, ports=ports, network=net)


#: the GPU generations NCCL's tuner tells apart (its compCapIndex)
ARCHES = ("volta", "ampere", "hopper", "blackwell")


def preset(cls, name: str, nodes: int = 1, nics_per_node: Optional[int] = None, **overrides):
    """``nodes`` nodes of preset ``name`` (:data:`PRESETS`), ``nics_per_node`` NICs each
    (default: the preset's), any other :func:`gpu_cluster` argument overriding."""
    facts = preset_facts(name)
    facts.pop("hbm_bandwidth")
    if nics_per_node is not None:
        facts["nics_per_node"] = nics_per_node
    facts.update(overrides)
    return gpu_cluster(cls, nodes, facts.pop("gpus_per_node"), **facts)
