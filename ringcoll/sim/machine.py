"""Machines the simulator's clock runs on: α-β-γ links, ports per rank, nodes with NICs.

A **port** carries one message at a time. Every rank has ``ports`` send ports and as many
receive ports (full duplex; one of each by default). A message of n bytes from ``src`` to
``dst`` holds one send port of ``src`` and one receive port of ``dst`` for α + nβ, starting
once both ends have posted it and both ports are free. On a hierarchical machine the ranks
sit on nodes (``ranks_per_node`` each, in blocks, or as ``placement`` says); a message
between nodes takes the inter-node α and β and also holds one of ``nic_ports`` send ports of
the source node's NIC and one receive port of the destination node's NIC, which all the
ranks of a node share. A step's local reductions take γ per byte reduced.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple


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

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        for name in ("ports", "nic_ports"):
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

    @property
    def flat(self) -> bool:
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

    def link(self, src: int, dst: int) -> Tuple[float, float, bool]:
        """(α, β, crosses nodes) of a message from ``src`` to ``dst``."""
        if self.ranks_per_node is None or self.node_of(src) == self.node_of(dst):
            return self.alpha, self.beta, False
        return self.inter_alpha, self.inter_beta, True

    def worst_link(self) -> Tuple[float, float]:
        """The slowest link's (α, β): what the flat closed forms assume for every message."""
        if self.ranks_per_node is None:
            return self.alpha, self.beta
        return max(self.alpha, self.inter_alpha), max(self.beta, self.inter_beta)

    def nodes(self, world: int) -> Optional[Tuple[int, ...]]:
        """The node of each of ``world`` ranks on this machine (None on a flat one): the
        layout its node-aware schedules take when the caller gives none."""
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
        if self.ranks_per_node is None:
            return f"flat: {link(self.alpha, self.beta)}, {reduced}, {ports}"
        where = "placed" if self.placement is not None else "blocks"
        return (f"nodes of {self.ranks_per_node} ({where}): {link(self.alpha, self.beta)} inside, "
                f"{link(self.inter_alpha, self.inter_beta)} between, {reduced}, {ports}, "
                f"{self.nic_ports} NIC port{'s' if self.nic_ports > 1 else ''}")

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        data = asdict(self)
        if data["placement"] is not None:
            data["placement"] = list(data["placement"])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Machine":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"a Machine has the fields {sorted(known)}, got unknown {sorted(unknown)}")
        return cls(**data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "Machine":
        with open(path) as f:
            return cls.from_dict(json.load(f))
