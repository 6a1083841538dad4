"""Machines the simulator's clock runs on: α-β-γ links, ports per rank, nodes with NICs.

A **port** carries one message at a time. Every rank has ``ports`` send ports and as many
receive ports (full duplex; one of each by default). A message of n bytes from ``src`` to
``dst`` holds one send port of ``src`` and one receive port of ``dst`` for α + nβ, starting
once both ends have posted it and both ports are free. On a hierarchical machine the ranks
sit on nodes (``ranks_per_node`` each, in blocks, or as ``placement`` says); a message
between nodes takes the inter-node α and β and also holds one of ``nic_ports`` send ports of
the source node's NIC and one receive port of the destination node's NIC, which all the
ranks of a node share. The clock runs it as a network (:meth:`Machine.network_for`: each
node's NIC a link of ``nic_ports`` lanes up and down, held per message like a port). A
step's local reductions take γ per byte reduced.

A machine with a **network** (``Machine.torus``, ``.mesh``, ``.fat_tree``, ``.dragonfly``,
``.from_graph``; :mod:`ringcoll.cost.network`) also routes every message over links: it takes
α + Σ link latencies + hops·hop_latency + n·β_path (β_path: the slowest of its links and the
machine's β) and holds every link of its route for n·β_path (a link held per message, such
as a NIC: for the whole message, like a port), so messages crossing one link at the same time
queue for it.

**LogGP** (Alexandrov et al., 1995; ``o``, ``g``, ``L``, all 0 by default, where α alone is
today's machine): a message also costs ``o`` of CPU (launch) overhead at each end, serialised
on the rank (its sender's before it goes, its receiver's after it arrives), holds its ports
for g more (the gap between consecutive messages on a port: α + g + nβ in all) and arrives
``L`` after it leaves its ports: the wire latency, which the next message on those ports
overlaps. End to end: 2o + α + g + nβ + L. ``window``: how many independent steps a rank keeps
in flight, by the executor's own rule (RINGCOLL_WINDOW; 1 by default: a rank posts its next
step when its current one ends). docs/simulator.md, "The LogGP machine", works an example.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from typing import Optional, Sequence, Tuple

from .network import Network, network as _network


#: steps whose transfers a rank keeps in flight at once in ringcoll's P2P executor when
#: RINGCOLL_WINDOW is unset (its P2PExecutor.execute; the one place this number lives: the
#: executor and the settings table take it from here, below them both)
EXECUTOR_WINDOW = 2


@dataclass(frozen=True)
class Machine:
    """A machine for the simulator's clock (defaults: a modest flat cluster, 5 µs, 10 GB/s,
    20 GB/s reduction, one send and one receive port per rank).

    >>> ringcoll.Machine(alpha=2e-6, beta=1 / 25e9, gamma=1 / 50e9, ports=2)
    >>> ringcoll.Machine.hierarchical(8, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9))
    """

    alpha: float = 5e-6             # seconds per message (intra-node on a hierarchical machine)
    beta: float = 1 / 10e9          # seconds per byte on the wire (idem)
    gamma: float = 1 / 20e9         # seconds per byte reduced
    ports: int = 1                  # send ports and receive ports per rank
    ranks_per_node: Optional[int] = None    # None: flat, every link alike
    inter_alpha: Optional[float] = None     # between nodes
    inter_beta: Optional[float] = None
    nic_ports: int = 1              # send and receive ports of a node's NIC, shared by its ranks
    placement: Optional[Tuple[int, ...]] = None     # node of each rank; None: blocks
    network: Optional[Network] = None       # links and routes (ringcoll.cost.network); None: none
    o: float = 0.0                  # LogGP: seconds of CPU overhead per message at each end, serialised on the rank
    g: float = 0.0                  # LogGP: seconds of gap per message on a port (held with α + nβ)
    L: float = 0.0                  # LogGP: seconds of wire latency after a message leaves its ports
    window: int = 1                 # independent steps a rank keeps in flight (the executor's RINGCOLL_WINDOW)

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma", "o", "g", "L"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        for name in ("ports", "nic_ports", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.ranks_per_node is not None:
            if isinstance(self.ranks_per_node, bool) or not isinstance(self.ranks_per_node, int) \
                    or self.ranks_per_node < 1:
                raise ValueError(f"ranks_per_node must be a positive int, got {self.ranks_per_node!r}")
            for name in ("inter_alpha", "inter_beta"):
                value = getattr(self, name)
                if not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        if self.placement is not None:
            object.__setattr__(self, "placement", tuple(int(n) for n in self.placement))
            if self.ranks_per_node is None:
                raise ValueError("placement needs a hierarchical machine (Machine.hierarchical)")
        if self.network is not None:
            if not isinstance(self.network, Network):
                raise TypeError(f"network must be a ringcoll.cost.network.Network, got {type(self.network).__name__}")
            if self.ranks_per_node is not None:
                raise ValueError("a machine has either nodes (Machine.hierarchical) or a network, not both")

    @classmethod
    def hierarchical(cls, ranks_per_node: int, intra: Tuple[float, float], inter: Tuple[float, float],
                     gamma: float = 1 / 20e9, nic_ports: int = 1, ports: int = 1,
                     placement: Optional[Sequence[int]] = None) -> "Machine":
        """Nodes of ``ranks_per_node`` ranks: ``intra = (α, β)`` between ranks of one node,
        ``inter = (α, β)`` between nodes, through the node's NIC of ``nic_ports`` ports.
        ``placement[rank]`` is the rank's node (default: blocks, rank // ranks_per_node)."""
        return cls(alpha=intra[0], beta=intra[1], gamma=gamma, ports=ports,
                   ranks_per_node=ranks_per_node, inter_alpha=inter[0], inter_beta=inter[1],
                   nic_ports=nic_ports, placement=None if placement is None else tuple(placement))

    # -- networks (ringcoll.cost.network): α is each message's software latency at the ends, β
    # the hosts' injection rate (the links' own β bounds it further) ----------------------
    @classmethod
    def _on(cls, kind, alpha, beta, gamma, ports, placement, hop_latency, **params) -> "Machine":
        return cls(alpha=alpha, beta=beta, gamma=gamma, ports=ports,
                   network=_network(kind, placement=placement, hop_latency=hop_latency, beta=beta, **params))

    @classmethod
    def torus(cls, dims: Sequence[int], *, alpha: float = 5e-6, beta: float = 1 / 10e9,
              gamma: float = 1 / 20e9, ports: int = 1, latency: float = 0.0,
              hop_latency: float = 1e-7, placement=None) -> "Machine":
        """A k-ary n-cube: one host per point of ``dims`` (any number of dimensions), a link
        each way to each neighbour, wrap-around; every link ``latency`` s and β s/B, each hop
        ``hop_latency`` s more; dimension-order routing, the shorter way round (+ on a tie).
        ``placement``: "linear" (rank r on host r, dimension 0 fastest), ("random", seed) or
        each rank's host.

        >>> ringcoll.Machine.torus((8, 8), alpha=2e-6, beta=1 / 25e9)"""
        return cls._on("torus", alpha, beta, gamma, ports, placement, hop_latency, dims=tuple(dims),
                       latency=latency)

    @classmethod
    def mesh(cls, dims: Sequence[int], *, alpha: float = 5e-6, beta: float = 1 / 10e9,
             gamma: float = 1 / 20e9, ports: int = 1, latency: float = 0.0,
             hop_latency: float = 1e-7, placement=None) -> "Machine":
        """A mesh: the torus without wrap-around links; dimension-order routing."""
        return cls._on("mesh", alpha, beta, gamma, ports, placement, hop_latency, dims=tuple(dims),
                       latency=latency)

    @classmethod
    def fat_tree(cls, radix: int, *, levels: int = 2, oversubscription: float = 1.0,
                 alpha: float = 5e-6, beta: float = 1 / 10e9, gamma: float = 1 / 20e9, ports: int = 1,
                 latency: float = 0.0, hop_latency: float = 1e-7, placement=None) -> "Machine":
        """A fat-tree of ``radix``-port switches: 2 levels (radix leaves of radix/2 hosts,
        radix/2 spines: radix²/2 hosts) or 3 (radix pods of radix/2 edge and radix/2
        aggregation switches, (radix/2)² cores: radix³/4 hosts). ``oversubscription`` r: every
        link above the leaves has 1/r of the host links' bandwidth (tapered). Up-down routing,
        the up-link chosen by the destination host (D-mod-k)."""
        return cls._on("fat_tree", alpha, beta, gamma, ports, placement, hop_latency, radix=radix,
                       levels=levels, oversubscription=oversubscription, latency=latency)

    @classmethod
    def dragonfly(cls, groups: int, routers: int, hosts: int, global_links: int, *,
                  alpha: float = 5e-6, beta: float = 1 / 10e9, gamma: float = 1 / 20e9, ports: int = 1,
                  latency: float = 0.0, global_latency: float = 0.0, global_beta: Optional[float] = None,
                  hop_latency: float = 1e-7, placement=None) -> "Machine":
        """A dragonfly: ``groups`` groups of ``routers`` routers, all-to-all local links in a
        group, ``hosts`` hosts per router, ``global_links`` global links per router spread
        evenly over the other groups (routers · global_links must be a multiple of groups −
        1). Minimal routing: local, global, local hop. ``global_beta`` (default β) and
        ``global_latency`` price the global links."""
        return cls._on("dragonfly", alpha, beta, gamma, ports, placement, hop_latency, groups=groups,
                       routers=routers, hosts=hosts, global_links=global_links, latency=latency,
                       global_latency=global_latency, global_beta=global_beta)

    @classmethod
    def from_graph(cls, links, routes=None, *, hosts: Optional[int] = None, alpha: float = 5e-6,
                   beta: float = 1 / 10e9, gamma: float = 1 / 20e9, ports: int = 1,
                   hop_latency: float = 0.0, placement=None) -> "Machine":
        """Any network: ``links`` directed ``(src, dst, latency, beta[, lanes[, hold]])``
        between nodes 0, 1, ...; nodes 0 .. hosts − 1 are hosts (default: every node), the
        others switches; ``hold`` "wire" (default: held for the wire time, first come first
        served) or "message" (held like a port for the whole message: a NIC).
        ``routes`` ``{(src host, dst host): [node, ...]}``, else shortest paths in hops (ties:
        smallest node ids)."""
        return cls(alpha=alpha, beta=beta, gamma=gamma, ports=ports,
                   network=_network("graph", placement=placement, hop_latency=hop_latency,
                                    links=[tuple(link) for link in links], hosts=hosts, routes=routes))

    @classmethod
    def gpu_cluster(cls, nodes: int, gpus_per_node: int, **kwargs) -> "Machine":
        """``nodes`` nodes of ``gpus_per_node`` GPUs on an NVSwitch, ``nics_per_node`` NICs
        per node on rails into a spine (``oversubscription``:1), per-level latency and
        bandwidth (:func:`ringcoll.cost.gpu.gpu_cluster` lists the keywords).

        >>> ringcoll.Machine.gpu_cluster(2, 8, nvlink_bandwidth=450e9, nics_per_node=8, nic_bandwidth=50e9)"""
        from .gpu import gpu_cluster
        return gpu_cluster(cls, nodes, gpus_per_node, **kwargs)

    @classmethod
    def preset(cls, name: str, nodes: int = 1, nics_per_node: Optional[int] = None, **overrides) -> "Machine":
        """A published system's :meth:`gpu_cluster` from its spec sheets (every constant
        cited in :mod:`ringcoll.cost.gpu`): ``nodes`` nodes of preset ``name``
        (:meth:`presets`), ``nics_per_node`` NICs each (default: the system's).

        >>> ringcoll.Machine.preset("dgx-h100", nodes=2)"""
        from .gpu import preset
        return preset(cls, name, nodes, nics_per_node, **overrides)

    @staticmethod
    def presets() -> list:
        """The names :meth:`preset` takes."""
        from .gpu import presets
        return presets()

    @classmethod
    def loggp(cls, L: float, o: float, g: float, beta: float = 1 / 10e9, gamma: float = 1 / 20e9,
              ports: int = 1, window: Optional[int] = None) -> "Machine":
        """A flat LogGP machine: no α (its latency is ``L``, overlapped by pipelined messages),
        ``o`` of overhead per message at each end, ``g`` of gap per message on a port, β per
        byte (LogGP's G); ``window`` steps in flight (default :data:`EXECUTOR_WINDOW`, the
        executor's own when RINGCOLL_WINDOW is unset; a machine is a model and reads no
        setting, so pass ``window=`` to price a run made with another RINGCOLL_WINDOW).

        >>> ringcoll.Machine.loggp(L=5e-6, o=1e-6, g=0.5e-6, beta=1 / 25e9)"""
        if window is None:
            window = EXECUTOR_WINDOW
        return cls(alpha=0.0, beta=beta, gamma=gamma, ports=ports, o=o, g=g, L=L, window=window)

    @property
    def is_loggp(self) -> bool:
        """Whether any LogGP field (o, g, L) is set: the clock then charges them."""
        return bool(self.o or self.g or self.L)

    @property
    def flat(self) -> bool:
        """No nodes (a network machine is flat in this sense: its links are in ``network``)."""
        return self.ranks_per_node is None

    def node_of(self, rank: int) -> int:
        if self.ranks_per_node is None:
            return 0
        if self.placement is not None:
            if rank >= len(self.placement):
                raise ValueError(f"placement names the nodes of {len(self.placement)} ranks, "
                                 f"rank {rank} has none")
            return self.placement[rank]
        return rank // self.ranks_per_node

    def network_for(self, world: int) -> Optional[Network]:
        """The network the clock routes ``world`` ranks over: ``network``; on a hierarchical
        machine its nodes as a network (:meth:`Network._build_nodes`: a NIC of ``nic_ports``
        lanes up and down per node, held per message, priced at the inter-node α and β;
        paths inside a node at the intra-node α and β); None on a flat machine."""
        if self.network is not None or self.ranks_per_node is None:
            return self.network
        return _nodes_network(self, world)

    def link(self, src: int, dst: int) -> Tuple[float, float, bool]:
        """(α, β, crosses nodes) of a message from ``src`` to ``dst``: on a hierarchical
        machine its route's price on the nodes' network (what the clock takes)."""
        if self.ranks_per_node is None:
            return self.alpha, self.beta, False
        net = self.network_for(max(src, dst) + 1)
        path = net.route(src, dst)
        alpha, beta = net.price(path, self.alpha, self.beta)
        return alpha, beta, bool(path)

    def worst_link(self) -> Tuple[float, float]:
        """The slowest link's (α, β): what the flat closed forms assume for every message
        (on a network: α and the slowest link's β; hops and sharing are the clock's)."""
        if self.network is not None:
            return self.alpha, max([self.beta] + [link.beta for link in self.network.links])
        if self.ranks_per_node is None:
            return self.alpha, self.beta
        return max(self.alpha, self.inter_alpha), max(self.beta, self.inter_beta)

    def nodes(self, world: int) -> Optional[Tuple[int, ...]]:
        """The node of each of ``world`` ranks on this machine (a 2-level machine's, a GPU
        cluster's; None on any other): the layout its node-aware schedules take when the
        caller gives none."""
        if self.network is not None and self.network.kind == "gpu_cluster":
            return tuple(self.network.groups_of(self.network.hosts_of(world)))
        if self.ranks_per_node is None:
            return None
        return tuple(self.node_of(rank) for rank in range(world))

    def describe(self) -> str:
        """A short human form for logs: α in µs and bandwidths in GB/s, per link class."""
        def link(alpha: float, beta: float) -> str:
            bandwidth = f"{1 / beta / 1e9:.3g} GB/s" if beta else "unlimited"
            return f"{alpha * 1e6:.3g} us, {bandwidth}"

        reduced = f"{1 / self.gamma / 1e9:.3g} GB/s reduced" if self.gamma else "free reductions"
        ports = f"{self.ports} port{'s' if self.ports > 1 else ''}"
        if self.is_loggp:
            ports += f", LogGP o {self.o * 1e6:.3g} us, g {self.g * 1e6:.3g} us, L {self.L * 1e6:.3g} us"
        if self.window != 1:
            ports += f", window {self.window}"
        if self.network is not None:
            return f"{self.network.describe()}: {link(self.alpha, self.beta)} at the hosts, {reduced}, {ports}"
        if self.ranks_per_node is None:
            return f"flat: {link(self.alpha, self.beta)}, {reduced}, {ports}"
        where = "placed" if self.placement is not None else "blocks"
        return (f"nodes of {self.ranks_per_node} ({where}): {link(self.alpha, self.beta)} inside, "
                f"{link(self.inter_alpha, self.inter_beta)} between, {reduced}, {ports}, "
                f"{self.nic_ports} NIC port{'s' if self.nic_ports > 1 else ''}")

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The machine as JSON-ready data (:meth:`from_dict` reads it back); the LogGP fields
        and the window only where set, so a machine without them saves as it always did."""
        data = asdict(replace(self, network=None))
        for name in ("o", "g", "L", "window"):
            if data[name] == Machine.__dataclass_fields__[name].default:
                del data[name]
        if data["placement"] is not None:
            data["placement"] = list(data["placement"])
        data["network"] = None if self.network is None else self.network.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Machine":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"a Machine has the fields {sorted(known)}, got unknown {sorted(unknown)}")
        if data.get("network") is not None:
            data = {**data, "network": Network.from_dict(data["network"])}
        return cls(**data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "Machine":
        with open(path) as f:
            return cls.from_dict(json.load(f))


@functools.lru_cache(maxsize=32)
def _nodes_network(machine: Machine, world: int) -> Network:
    return _network("nodes", nodes=machine.nodes(world), intra=(machine.alpha, machine.beta),
                    inter=(machine.inter_alpha, machine.inter_beta), nic_ports=machine.nic_ports)
