"""Networks the simulator's clock routes messages over: hosts, switches and directed links.

A :class:`Network` is a graph. Its **hosts** (nodes 0 .. hosts - 1) carry one rank each; any
further nodes are switches or routers. Every **link** is directed and has its own latency
(seconds), β (seconds per byte) and ``lanes`` (parallel channels, each at that β). A message
from rank a to rank b follows the deterministic **route** from a's host to b's host:

- torus (k-ary n-cube, wrap-around) and mesh: dimension order, dimension 0 first; on a torus
  each dimension goes the shorter way round, + on a tie (distance k/2);
- fat-tree: up-down, up to the lowest common ancestor then down, the up-link chosen by the
  destination host (D-mod-k: the j-th up-link where j = destination host mod up-links, then
  (destination // up-links) mod up-links one level higher), so routes are spread and fixed;
- dragonfly: minimal, host → router → (local link to the router that owns the global link) →
  global link → (local link) → router → host; between two groups joined by several global
  links, the i-th with i = source host mod their number;
- any graph (:meth:`Network.from_graph`): the routes given, else a shortest path in hops,
  ties broken towards the smallest node ids (breadth-first search from the destination);
- a GPU cluster ("gpu_cluster", :meth:`ringcoll.Machine.gpu_cluster`): inside a node GPU →
  NVSwitch → GPU; between nodes on the destination GPU's rail: the sender's NIC when it is on
  that rail, else NVSwitch → that rail's NIC (PXN), → the rail's leaf switch (→ the spine →
  the destination's leaf when the nodes are on different leaves) → NIC → GPU;
- a 2-level machine's nodes ("nodes", :meth:`ringcoll.Machine.network_for`): inside a node no
  link, between nodes the source node's NIC up-link then the destination node's down-link,
  both held per message like ports (``Link.hold``), priced at the inter-node α and β.

**Placement** maps ranks to hosts: ``None`` or ``"linear"`` (rank r on host r), ``("random",
seed)`` (a seeded permutation of the hosts), or a sequence giving each rank's host (distinct
hosts). How the clock uses links (:mod:`ringcoll.sim.clock`): a message holds every link of
its route for its wire time n·β_path (β_path the slowest of its links and the machine's own β),
each lane, like a port, taking it in the earliest gap that fits (first come first served, no
lane idle while a message fits), while the message as a whole takes α + Σ link latencies +
hops · ``hop_latency`` + n·β_path.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

KINDS = ("torus", "mesh", "fat_tree", "dragonfly", "graph", "nodes", "gpu_cluster")

#: how a link is held: for the message's wire time n·β_path, in the earliest gap of a lane
#: ("wire"), or like a port for the message's whole time α + n·β, a message taking the
#: earliest gap of any lane ("message": a NIC's send or receive engine serves one message at
#: a time, as a rank's port does)
HOLDS = ("wire", "message")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return value


@dataclass(frozen=True)
class Link:
    """A directed link ``src → dst``: ``latency`` s, ``beta`` s/B per lane, ``lanes`` lanes,
    ``level`` a label for pictures and statistics ("x", "y", "up1", "global", "nic_out" ...),
    ``hold`` how a message holds it (:data:`HOLDS`)."""

    src: int
    dst: int
    latency: float
    beta: float
    lanes: int = 1
    level: str = ""
    hold: str = "wire"


class Network:
    """A network for :class:`ringcoll.Machine` (built by its constructors: ``Machine.torus``,
    ``.mesh``, ``.fat_tree``, ``.dragonfly``, ``.from_graph``). Immutable and hashable by its
    description; links, routes and placement are built from it."""

    __slots__ = ("kind", "params", "placement", "hop_latency", "links", "hosts", "group",
                 "position", "_index", "_routes", "_next", "_memo", "_hops")

    def __init__(self, kind: str, params: dict, placement=None, hop_latency: float = 0.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.params = dict(params)
        self.hop_latency = _seconds("hop_latency", hop_latency)
        self._routes: Dict[Tuple[int, int], Tuple[int, ...]] = {}
        self._next: Dict[int, Dict[int, int]] = {}
        self._memo: Dict[tuple, dict] = {}
        self._hops = None
        getattr(self, "_build_" + kind)(**self.params)
        self._index = {}
        for i, link in enumerate(self.links):
            self._index.setdefault((link.src, link.dst), i)
        self.placement = self._place(placement)

    # -- identity -----------------------------------------------------------------------
    def _key(self):
        def freeze(v):
            if isinstance(v, (list, tuple)):
                return tuple(freeze(x) for x in v)
            if isinstance(v, dict):
                return tuple(sorted((freeze(k), freeze(x)) for k, x in v.items()))
            return v
        return self.kind, freeze(self.params), self.placement, self.hop_latency

    def __eq__(self, other):
        return isinstance(other, Network) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"Network({self.describe()})"

    def to_dict(self) -> dict:
        params = {k: ([list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, (list, tuple)) else v)
                  for k, v in self.params.items()}
        if self.kind == "graph" and params.get("routes") is not None:
            params["routes"] = [[list(k), list(v)] for k, v in self.params["routes"].items()]
        return {"kind": self.kind, "params": params, "hop_latency": self.hop_latency,
                "placement": None if self.placement is None else list(self.placement)}

    @classmethod
    def from_dict(cls, data: dict) -> "Network":
        known = {"kind", "params", "hop_latency", "placement"}
        if not isinstance(data, dict) or set(data) - known:
            raise ValueError(f"a Network has the fields {sorted(known)}, got {data!r}")
        params = dict(data["params"])
        if data["kind"] == "graph" and params.get("routes") is not None:
            params["routes"] = {tuple(k): tuple(v) for k, v in params["routes"]}
        return cls(data["kind"], params, data.get("placement"), data.get("hop_latency", 0.0))

    def describe(self) -> str:
        p = self.params
        if self.kind in ("torus", "mesh"):
            shape = "x".join(str(d) for d in p["dims"])
            what = f"{shape} {self.kind}"
        elif self.kind == "fat_tree":
            what = (f"{p['levels']}-level fat-tree of radix {p['radix']} ({self.hosts} hosts, "
                    f"{p['oversubscription']:g}:1)")
        elif self.kind == "dragonfly":
            what = (f"dragonfly of {p['groups']} groups x {p['routers']} routers x {p['hosts']} hosts, "
                    f"{p['global_links']} global links per router")
        elif self.kind == "gpu_cluster":
            what = (f"GPU cluster of {p['nodes']} node{'s' if p['nodes'] != 1 else ''} x {p['gpus']} GPUs "
                    f"(NVSwitch), {p['nics']} NIC{'s' if p['nics'] != 1 else ''} per node on rails, "
                    f"{p.get('nodes_per_leaf') or p['nodes']} nodes per leaf, {p['oversubscription']:g}:1 spine")
        elif self.kind == "nodes":
            count = len(self.links) // 2
            return (f"2-level: {self.hosts} ranks on {count} node{'s' if count != 1 else ''}, "
                    f"NIC of {p['nic_ports']} port{'s' if p['nic_ports'] != 1 else ''}")
        else:
            what = f"graph of {len(self.links)} links, {self.hosts} hosts"
        where = "linear" if self.placement is None else "placed"
        return f"{what}, {where}, {self.hop_latency * 1e9:.3g} ns per hop"

    # -- builders -----------------------------------------------------------------------
    def _add(self, src, dst, latency, beta, lanes=1, level="", hold="wire"):
        self.links.append(Link(src, dst, latency, beta, lanes, level, hold))

    def _build_grid(self, dims, latency, beta, wrap):
        dims = tuple(dims)
        if not dims:
            raise ValueError("dims must name at least one dimension, got ()")
        for d in dims:
            _positive_int("dims", d)
        self.params["dims"] = dims
        _seconds("latency", latency), _seconds("beta", beta)
        self.hosts = 1
        for d in dims:
            self.hosts *= d
        self.links = []
        self.group = None
        self.position = {}
        for host in range(self.hosts):
            coords = self.coords(host)
            self.position[host] = (coords[0], coords[1] if len(dims) > 1 else 0)
            for dim, k in enumerate(dims):
                for sign in (1, -1):
                    c = coords[dim] + sign
                    if not wrap and not 0 <= c < k:
                        continue
                    if k == 1 or (k == 2 and sign == -1 and wrap):
                        continue            # no self-links; on a wrapped 2 one link each way
                    other = list(coords)
                    other[dim] = c % k
                    self._add(host, self.host_at(other), latency, beta, 1, "xyzuvw"[dim] if dim < 6 else f"d{dim}")

    def _build_torus(self, dims, latency=0.0, beta=1 / 10e9):
        self._build_grid(dims, latency, beta, True)

    def _build_mesh(self, dims, latency=0.0, beta=1 / 10e9):
        self._build_grid(dims, latency, beta, False)

    def coords(self, host: int) -> Tuple[int, ...]:
        out = []
        for d in self.params["dims"]:
            out.append(host % d)
            host //= d
        return tuple(out)

    def grid(self, world: int) -> Optional[Tuple[int, ...]]:
        """The dimensions of this torus or mesh (dimension 0 fastest) when ``world`` ranks sit
        on it one per host, rank r on host r; else None (another kind, fewer ranks than hosts,
        or another placement). The schedules that follow the machine's grid read it."""
        if self.kind not in ("torus", "mesh") or self.placement is not None or world != self.hosts:
            return None
        return tuple(self.params["dims"])

    def host_at(self, coords) -> int:
        host = 0
        for c, d in zip(reversed(coords), reversed(self.params["dims"])):
            host = host * d + c
        return host

    def _build_fat_tree(self, radix, levels=2, oversubscription=1.0, latency=0.0, beta=1 / 10e9):
        _positive_int("radix", radix)
        if radix < 2 or radix % 2:
            raise ValueError(f"radix must be an even int >= 2, got {radix!r}")
        if levels not in (2, 3):
            raise ValueError(f"levels must be 2 or 3, got {levels!r}")
        if isinstance(oversubscription, bool) or not isinstance(oversubscription, (int, float)) \
                or oversubscription < 1:
            raise ValueError(f"oversubscription must be a number >= 1 (up-link bandwidth divided by it), "
                             f"got {oversubscription!r}")
        _seconds("latency", latency), _seconds("beta", beta)
        half = radix // 2
        up_beta = beta * oversubscription
        self.links, self.position = [], {}
        if levels == 2:
            leaves, per_leaf = radix, half
        else:
            leaves, per_leaf = radix * half, half          # k pods of k/2 edge switches
        self.hosts = leaves * per_leaf
        leaf0 = self.hosts
        self.group = tuple(h // per_leaf for h in range(self.hosts))   # a host's leaf switch
        for h in range(self.hosts):
            self.position[h] = (h, 0)
            self._add(h, leaf0 + h // per_leaf, latency, beta, 1, "host")
            self._add(leaf0 + h // per_leaf, h, latency, beta, 1, "host")
        for leaf in range(leaves):
            self.position[leaf0 + leaf] = ((leaf + 0.5) * per_leaf - 0.5, 1)
        if levels == 2:
            spine0 = leaf0 + leaves
            for s in range(half):
                self.position[spine0 + s] = ((s + 0.5) * self.hosts / half - 0.5, 2)
                for leaf in range(leaves):
                    self._add(leaf0 + leaf, spine0 + s, latency, up_beta, 1, "up1")
                    self._add(spine0 + s, leaf0 + leaf, latency, up_beta, 1, "up1")
        else:
            agg0 = leaf0 + leaves
            core0 = agg0 + leaves
            for pod in range(radix):
                for a in range(half):
                    agg = agg0 + pod * half + a
                    self.position[agg] = ((pod * half + a + 0.5) * per_leaf - 0.5, 2)
                    for e in range(half):
                        edge = leaf0 + pod * half + e
                        self._add(edge, agg, latency, up_beta, 1, "up1")
                        self._add(agg, edge, latency, up_beta, 1, "up1")
                    for c in range(half):
                        core = core0 + a * half + c
                        self._add(agg, core, latency, up_beta, 1, "up2")
                        self._add(core, agg, latency, up_beta, 1, "up2")
            for c in range(half * half):
                self.position[core0 + c] = ((c + 0.5) * self.hosts / (half * half) - 0.5, 3)

    def _build_dragonfly(self, groups, routers, hosts, global_links, latency=0.0, beta=1 / 10e9,
                         global_latency=0.0, global_beta=None):
        for name, v in (("groups", groups), ("routers", routers), ("hosts", hosts), ("global_links", global_links)):
            _positive_int(name, v)
        if groups > 1 and (routers * global_links) % (groups - 1):
            raise ValueError(f"a dragonfly's routers * global_links ({routers * global_links}) must be a "
                             f"multiple of groups - 1 ({groups - 1}), so that every pair of groups is joined "
                             f"by as many global links")
        _seconds("latency", latency), _seconds("beta", beta), _seconds("global_latency", global_latency)
        g_beta = beta if global_beta is None else _seconds("global_beta", global_beta)
        self.hosts = groups * routers * hosts
        router0 = self.hosts
        self.links, self.position = [], {}
        self.group = tuple(h // (routers * hosts) for h in range(self.hosts))
        for h in range(self.hosts):
            r = router0 + h // hosts
            self._add(h, r, latency, beta, 1, "host")
            self._add(r, h, latency, beta, 1, "host")
        for g in range(groups):
            for a in range(routers):
                self.position[router0 + g * routers + a] = (g, a)
                for b in range(routers):
                    if a != b:
                        self._add(router0 + g * routers + a, router0 + g * routers + b, latency, beta, 1, "local")
        for h in range(self.hosts):
            g, rest = divmod(h, routers * hosts)
            self.position[h] = (g, rest / hosts - 0.5 + 0.5 / hosts)
        if groups > 1:
            ports = routers * global_links
            for g in range(groups):
                for t in range(g + 1, groups):
                    d, back = (t - g) % groups, (g - t) % groups
                    mine = [j for j in range(ports) if j % (groups - 1) == d - 1]
                    theirs = [j for j in range(ports) if j % (groups - 1) == back - 1]
                    for j, k in zip(mine, theirs):
                        u = router0 + g * routers + j // global_links
                        v = router0 + t * routers + k // global_links
                        self._add(u, v, global_latency, g_beta, 1, "global")
                        self._add(v, u, global_latency, g_beta, 1, "global")

    def _build_gpu_cluster(self, nodes, gpus, nics, nvlink, nic, oversubscription=1.0, fabric_latency=0.0,
                           arch="hopper", nvlinks=None, nodes_per_leaf=None, nvlink_lanes=1):
        """A rail-optimised GPU cluster: ``nodes`` nodes of ``gpus`` GPUs (hosts, node-major),
        each node an NVSwitch (node ``hosts + n``) joined to each of its GPUs by a link each way
        at ``nvlink = (latency, β)`` (β per direction of one GPU's NVLinks together); ``nics``
        NICs per node (node ``hosts + nodes + n·nics + k``), GPU g on rail k = g·nics // gpus,
        a link each way GPU ↔ its NIC, one NVSwitch → NIC (PXN: a GPU sends through another
        GPU's NIC over NVLink) and NIC ↔ its leaf, all at ``nic = (latency, β)`` (the latency on
        the NIC → leaf link); rail k of every ``nodes_per_leaf`` nodes (default: all) on one leaf
        switch, the leaves joined by a spine with ``nodes_per_leaf`` lanes each way at β ·
        ``oversubscription`` and ``fabric_latency``. The NVSwitch never limits beyond each GPU's
        own NVLinks. ``nvlink_lanes`` splits each GPU's NVLink link into lanes of 1/lanes of its
        bandwidth each (NCCL's rings side by side on it: a message through a NIC then holds one
        lane at the NIC's pace, not the GPU's whole NVLink). ``arch`` and ``nvlinks`` are facts
        for NCCL's tuner model (ringcoll.cost.nccl), not for routes."""
        for name, v in (("nodes", nodes), ("gpus", gpus), ("nics", nics)):
            _positive_int(name, v)
        if nics > gpus:
            raise ValueError(f"nics must be at most gpus ({gpus}) per node, got {nics!r}")
        per_leaf = nodes if nodes_per_leaf is None else _positive_int("nodes_per_leaf", nodes_per_leaf)
        if isinstance(oversubscription, bool) or not isinstance(oversubscription, (int, float)) \
                or oversubscription < 1:
            raise ValueError(f"oversubscription must be a number >= 1, got {oversubscription!r}")
        nvlink, nic = tuple(nvlink), tuple(nic)
        for name, pair in (("nvlink", nvlink), ("nic", nic)):
            if len(pair) != 2:
                raise ValueError(f"{name} must be (latency, beta), got {pair!r}")
            _seconds(f"{name} latency", pair[0]), _seconds(f"{name} beta", pair[1])
        _seconds("fabric_latency", fabric_latency)
        lanes = _positive_int("nvlink_lanes", nvlink_lanes)
        self.params.update(nvlink=nvlink, nic=nic)
        self.hosts = nodes * gpus
        switch0, nic0 = self.hosts, self.hosts + nodes
        leaf0 = nic0 + nodes * nics
        groups = -(-nodes // per_leaf)
        spine = leaf0 + groups * nics
        self.links, self.position = [], {}
        self.group = tuple(h // gpus for h in range(self.hosts))
        for h in range(self.hosts):
            n, g = divmod(h, gpus)
            self.position[h] = (h, 0)
            self._add(h, switch0 + n, nvlink[0], nvlink[1] * lanes, lanes, "nvlink")
            self._add(switch0 + n, h, nvlink[0], nvlink[1] * lanes, lanes, "nvlink")
            card = nic0 + n * nics + g * nics // gpus
            self._add(h, card, 0.0, nic[1], 1, "pcie")
            self._add(card, h, 0.0, nic[1], 1, "pcie")
        for n in range(nodes):
            self.position[switch0 + n] = (n * gpus + (gpus - 1) / 2, 1)
            for k in range(nics):
                card, leaf = nic0 + n * nics + k, leaf0 + (n // per_leaf) * nics + k
                self.position[card] = (n * gpus + (k + 0.5) * gpus / nics - 0.5, 2)
                self._add(switch0 + n, card, 0.0, nic[1], 1, "pxn")
                self._add(card, leaf, nic[0], nic[1], 1, "rail")
                self._add(leaf, card, 0.0, nic[1], 1, "rail")
        for leaf in range(groups * nics):
            self.position[leaf0 + leaf] = ((leaf + 0.5) * self.hosts / (groups * nics) - 0.5, 3)
            if groups > 1:
                self._add(leaf0 + leaf, spine, fabric_latency, nic[1] * oversubscription, per_leaf, "spine")
                self._add(spine, leaf0 + leaf, 0.0, nic[1] * oversubscription, per_leaf, "spine")
        self.position[spine] = ((self.hosts - 1) / 2, 4)

    def _gpu_route(self, a, b):
        """GPU ``a`` to GPU ``b`` (:meth:`_build_gpu_cluster`): through the NVSwitch inside a
        node; between nodes on the destination's rail, from ``a``'s own NIC when it is on that
        rail, else over NVLink to the NIC of that rail (PXN), through the spine only between
        leaves."""
        p = self.params
        gpus, nics, nodes = p["gpus"], p["nics"], p["nodes"]
        per_leaf = p.get("nodes_per_leaf") or nodes
        na, nb = a // gpus, b // gpus
        switch0, nic0 = self.hosts, self.hosts + nodes
        if na == nb:
            return self._path([a, switch0 + na, b])
        ka, kb = (a % gpus) * nics // gpus, (b % gpus) * nics // gpus
        leaf0 = nic0 + nodes * nics
        la, lb = leaf0 + (na // per_leaf) * nics + kb, leaf0 + (nb // per_leaf) * nics + kb
        start = [a] if ka == kb else [a, switch0 + na]
        middle = [la] if la == lb else [la, leaf0 + -(-nodes // per_leaf) * nics, lb]
        return self._path([*start, nic0 + na * nics + kb, *middle, nic0 + nb * nics + kb, b])

    def _build_nodes(self, nodes, intra, inter, nic_ports):
        """A 2-level machine (:meth:`ringcoll.Machine.hierarchical`) as a network: host h is
        rank h on node ``nodes[h]``; node n has a NIC of ``nic_ports`` lanes up (link 2n, node
        n → the fabric) and down (link 2n + 1), held per message ("message"), the up-link
        carrying the whole inter-node α (``inter = (α, β)``). A route inside a node has no
        link (the ranks' ports alone, at ``intra``); between nodes it is [up of a's node, down
        of b's node]. The fabric between NICs is never the bottleneck."""
        nodes = tuple(nodes)
        if not nodes:
            raise ValueError("nodes must give the node of at least one rank, got ()")
        for h, n in enumerate(nodes):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"nodes[{h}] must be a non-negative int, got {n!r}")
        _positive_int("nic_ports", nic_ports)
        intra, inter = tuple(intra), tuple(inter)
        for name, pair in (("intra", intra), ("inter", inter)):
            if len(pair) != 2:
                raise ValueError(f"{name} must be (alpha, beta), got {pair!r}")
            _seconds(f"{name} alpha", pair[0]), _seconds(f"{name} beta", pair[1])
        self.params.update(nodes=nodes, intra=intra, inter=inter)
        self.hosts = len(nodes)
        count = max(nodes) + 1
        fabric = self.hosts + count
        self.links, self.group = [], nodes
        self.position = {h: (h, 0) for h in range(self.hosts)}
        for n in range(count):
            ranks = [h for h in range(self.hosts) if nodes[h] == n] or [n]
            self.position[self.hosts + n] = (sum(ranks) / len(ranks), 1)
            self._add(self.hosts + n, fabric, inter[0], inter[1], nic_ports, "nic_out", "message")
            self._add(fabric, self.hosts + n, 0.0, inter[1], nic_ports, "nic_in", "message")
        self.position[fabric] = ((self.hosts - 1) / 2, 2)

    def _build_graph(self, links, hosts=None, routes=None):
        if not isinstance(links, (list, tuple)) or not links:
            raise ValueError(f"links must be a non-empty list of (src, dst, latency, beta[, lanes[, hold]]), "
                             f"got {links!r}")
        self.links = []
        nodes = set()
        frozen = []
        for i, item in enumerate(links):
            if not isinstance(item, (list, tuple)) or len(item) not in (4, 5, 6):
                raise ValueError(f"links[{i}] must be (src, dst, latency, beta[, lanes[, hold]]), got {item!r}")
            src, dst = item[0], item[1]
            for end in (src, dst):
                if isinstance(end, bool) or not isinstance(end, int) or end < 0:
                    raise ValueError(f"links[{i}]: nodes must be non-negative ints, got {item!r}")
            if src == dst:
                raise ValueError(f"links[{i}] joins node {src} to itself")
            lanes = _positive_int(f"links[{i}] lanes", item[4]) if len(item) >= 5 else 1
            hold = item[5] if len(item) == 6 else "wire"
            if hold not in HOLDS:
                raise ValueError(f"links[{i}] hold must be one of {HOLDS}, got {hold!r}")
            self._add(src, dst, _seconds(f"links[{i}] latency", item[2]), _seconds(f"links[{i}] beta", item[3]),
                      lanes, "", hold)
            nodes.update((src, dst))
            frozen.append(tuple(item))
        self.params["links"] = tuple(frozen)
        count = (max(nodes) + 1) if hosts is None else _positive_int("hosts", hosts)
        self.hosts = count
        self.group = None
        self.position = {}
        if routes is not None:
            if not isinstance(routes, dict):
                raise ValueError(f"routes must be a dict {{(src host, dst host): [node, ...]}}, got {type(routes).__name__}")
            frozen_routes = {}
            for (a, b), path in routes.items():
                path = tuple(path)
                if len(path) < 2 or path[0] != a or path[-1] != b:
                    raise ValueError(f"routes[({a}, {b})] must be a node path from {a} to {b}, got {list(path)}")
                frozen_routes[(a, b)] = path
            self.params["routes"] = frozen_routes

    # -- placement ----------------------------------------------------------------------
    def _place(self, placement):
        if placement is None or (isinstance(placement, str) and placement == "linear"):
            return None
        if isinstance(placement, (tuple, list)) and len(placement) == 2 and placement[0] == "random":
            seed = placement[1]
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ValueError(f"placement ('random', seed) needs an int seed, got {seed!r}")
            order = list(range(self.hosts))
            random.Random(seed).shuffle(order)
            return tuple(order)
        if isinstance(placement, str) or not isinstance(placement, Sequence):
            raise ValueError(f"placement must be 'linear', ('random', seed) or a sequence of hosts, got {placement!r}")
        hosts = []
        for rank, h in enumerate(placement):
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < self.hosts:
                raise ValueError(f"placement[{rank}] must be a host in 0 .. {self.hosts - 1}, got {h!r}")
            hosts.append(h)
        if len(hosts) > self.hosts:
            raise ValueError(f"placement places {len(hosts)} ranks on a network of {self.hosts} hosts")
        seen = {}
        for rank, h in enumerate(hosts):
            if h in seen:
                raise ValueError(f"placement puts ranks {seen[h]} and {rank} on host {h}: one rank per host")
            seen[h] = rank
        return tuple(hosts)

    def hosts_of(self, world: int) -> List[int]:
        """The host of each of ``world`` ranks (ValueError if the network cannot place them)."""
        if self.placement is None:
            if world > self.hosts:
                raise ValueError(f"world {world} does not fit on {self.describe()} ({self.hosts} hosts)")
            return list(range(world))
        if len(self.placement) < world or (len(self.placement) != world and len(self.placement) != self.hosts):
            raise ValueError(f"placement gives the hosts of {len(self.placement)} ranks, the world has {world}")
        return list(self.placement[:world])

    # -- routing ------------------------------------------------------------------------
    def link(self, src: int, dst: int) -> int:
        """The id of the link ``src → dst`` (ValueError if there is none)."""
        try:
            return self._index[(src, dst)]
        except KeyError:
            raise ValueError(f"the network has no link {src} -> {dst}") from None

    def route(self, a: int, b: int) -> Tuple[int, ...]:
        """The link ids from host ``a`` to host ``b``, in order (empty when a == b)."""
        key = (a, b)
        found = self._routes.get(key)
        if found is None:
            found = () if a == b else tuple(self._route(a, b))
            if len(self._routes) > 1 << 20:
                self._routes.clear()
            self._routes[key] = found
        return found

    def _path(self, nodes):
        return [self.link(u, v) for u, v in zip(nodes, nodes[1:])]

    def _route(self, a, b):
        kind = self.kind
        if kind in ("torus", "mesh"):
            # dimension order: each dimension's hops, the shorter way round on a torus (ties:
            # forward), walked on the hop tables (each host's next host and link per direction)
            hops = self._grid_hops()
            path, cur, stride = [], a, 1
            for dim, k in enumerate(self.params["dims"]):
                delta = (b // stride) % k - (a // stride) % k
                if kind == "torus":
                    delta %= k
                    sign, count = (1, delta) if delta <= k // 2 else (-1, k - delta)
                else:
                    sign, count = (1 if delta > 0 else -1), abs(delta)
                nxt, link = hops[dim][sign > 0]
                for _ in range(count):
                    path.append(link[cur])
                    cur = nxt[cur]
                stride *= k
            return path
        if kind == "fat_tree":
            radix, levels = self.params["radix"], self.params["levels"]
            half = radix // 2
            leaf0 = self.hosts
            la, lb = a // half, b // half
            if la == lb:
                return self._path([a, leaf0 + la, b])
            leaves = len(self.group) // half
            if levels == 2:
                spine = leaf0 + leaves + b % half
                return self._path([a, leaf0 + la, spine, leaf0 + lb, b])
            agg0, core0 = leaf0 + leaves, leaf0 + 2 * leaves
            pa, pb = la // half, lb // half
            up = b % half
            if pa == pb:
                return self._path([a, leaf0 + la, agg0 + pa * half + up, leaf0 + lb, b])
            core = up * half + (b // half) % half
            return self._path([a, leaf0 + la, agg0 + pa * half + up, core0 + core,
                               agg0 + pb * half + up, leaf0 + lb, b])
        if kind == "gpu_cluster":
            return self._gpu_route(a, b)
        if kind == "nodes":
            na, nb = self.group[a], self.group[b]
            return [] if na == nb else [2 * na, 2 * nb + 1]
        if kind == "dragonfly":
            p = self.params
            per_router = p["hosts"]
            router0 = self.hosts
            ra, rb = router0 + a // per_router, router0 + b // per_router
            ga, gb = self.group[a], self.group[b]
            nodes = [a, ra]
            if ga != gb:
                joins = [(link.src, link.dst) for link in self._globals(ga, gb)]
                u, v = joins[a % len(joins)]
                if u != ra:
                    nodes.append(u)
                nodes.append(v)
                if v != rb:
                    nodes.append(rb)
            elif ra != rb:
                nodes.append(rb)
            nodes.append(b)
            return self._path(nodes)
        return self._graph_route(a, b)

    def _grid_hops(self):
        """Per dimension, for the backward and the forward direction: each host's neighbour
        and the id of the link to it (None where a mesh ends), built on first use."""
        if self._hops is None:
            hops, stride = [], 1
            for k in self.params["dims"]:
                per_dim = []
                for sign in (-1, 1):
                    nxt, link = [], []
                    for host in range(self.hosts):
                        c = (host // stride) % k
                        other = host + ((c + sign) % k - c) * stride
                        nxt.append(other)
                        link.append(self._index.get((host, other)))
                    per_dim.append((nxt, link))
                hops.append(tuple(per_dim))
                stride *= k
            self._hops = hops
        return self._hops

    def _globals(self, ga, gb):
        cache = self._next.setdefault(-1, {})
        key = ga * len(self.group) + gb
        found = cache.get(key)
        if found is None:
            routers, router0 = self.params["routers"], self.hosts
            found = [link for link in self.links if link.level == "global"
                     and (link.src - router0) // routers == ga and (link.dst - router0) // routers == gb]
            cache[key] = found
        return found

    def _graph_route(self, a, b):
        routes = self.params.get("routes")
        if routes is not None:
            path = routes.get((a, b))
            if path is None:
                raise ValueError(f"routes gives no path from host {a} to host {b}")
            return self._path(list(path))
        nxt = self._next.get(b)
        if nxt is None:
            # breadth-first from the destination over reversed links: each node's next hop
            # is its smallest-id neighbour one hop closer to b
            into: Dict[int, List[int]] = {}
            for link in self.links:
                into.setdefault(link.dst, []).append(link.src)
            dist = {b: 0}
            frontier = deque([b])
            while frontier:
                v = frontier.popleft()
                for u in into.get(v, ()):
                    if u not in dist:
                        dist[u] = dist[v] + 1
                        frontier.append(u)
            nxt = {}
            outs: Dict[int, List[int]] = {}
            for link in self.links:
                outs.setdefault(link.src, []).append(link.dst)
            for u, d in dist.items():
                if u != b:
                    nxt[u] = min(v for v in outs[u] if dist.get(v) == d - 1)
            self._next[b] = nxt
        if a not in nxt:
            raise ValueError(f"the graph has no path from host {a} to host {b}")
        nodes = [a]
        while nodes[-1] != b:
            nodes.append(nxt[nodes[-1]])
        return self._path(nodes)

    def memo(self, key: tuple) -> dict:
        """A dict kept under ``key`` across runs on this network (the clock's priced routes
        per rank pair: a model pricing ten candidates on one machine routes each pair once);
        at most 16 keys, each dict at most 2^20 entries (its user clears it)."""
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= 16:
                self._memo.clear()
            found = self._memo[key] = {}
        return found

    def price(self, path: Sequence[int], alpha: float, beta: float) -> Tuple[float, float]:
        """(α, β) of a message over ``path`` (link ids) between hosts whose own are ``alpha``
        and ``beta``: α + Σ link latencies + hops · hop_latency, and the slowest of β and the
        links' β. On a 2-level network ("nodes") a message that leaves its node is priced by
        its NIC links alone: the inter-node α (the hosts' software latency included, as
        ``Machine.hierarchical``'s ``inter`` says) and the inter-node β."""
        links = self.links
        latency = sum(links[i].latency for i in path) + len(path) * self.hop_latency
        if self.kind == "nodes" and path:
            return latency, max(links[i].beta for i in path)
        return alpha + latency, max([beta] + [links[i].beta for i in path])

    def mirror_period(self, period: int, world: int) -> Optional[int]:
        """The representatives' count a mirrored run of ``world`` ranks rotation-symmetric
        with ``period`` needs on this network, so that shifting the ranks by it maps the
        network onto itself (routes onto routes), or None: on a whole torus placed linearly
        the least multiple of ``period`` and of the hosts in its last dimension's stride (a
        translation); on a 2-level network of equal nodes in blocks ``period`` itself if it
        is whole nodes."""
        if self.kind == "nodes":
            nodes = self.params["nodes"]
            size = nodes.count(0)
            if world != self.hosts or world % size or any(n != h // size for h, n in enumerate(nodes)):
                return None
            return math.lcm(period, size)       # shifts by whole nodes map nodes onto nodes
        if self.kind != "torus" or self.placement is not None or world != self.hosts:
            return None
        return math.lcm(period, self.hosts // self.params["dims"][-1])

    def representatives(self, count: int, world: int) -> List[int]:
        """For a mirrored run (:func:`ringcoll.sim.clock.run_schedules`) of ranks 0 .. count
        - 1 standing for a ``world`` of ranks, each shifted by a multiple of ``count`` (which
        :meth:`mirror_period` allows): the link each link is the translate of (the one those
        ranks' clock books). ValueError on a network the shifts do not map onto itself."""
        if self.mirror_period(count, world) != count:
            raise ValueError("a mirrored run on a network needs a whole torus placed linearly or equal nodes "
                             "in blocks, and representatives that a shift maps onto every rank")
        if self.kind == "nodes":
            size = self.params["nodes"].count(0)
            return [2 * ((i // 2) % (count // size)) + i % 2 for i in range(len(self.links))]
        canon = []
        for link in self.links:
            shift = link.src - link.src % count
            canon.append(self.link(link.src - shift, (link.dst - shift) % world))
        return canon

    def groups_of(self, hosts: Sequence[int]) -> Optional[List[int]]:
        """Each host's group (a dragonfly group, a fat-tree leaf switch), or None."""
        if self.group is None:
            return None
        return [self.group[h] for h in hosts]


def network(kind: str, placement=None, hop_latency: float = 0.0, **params) -> Network:
    """A :class:`Network` of ``kind`` with the builder's ``params`` (Machine's constructors call this)."""
    return Network(kind, params, placement, hop_latency)


__all__ = ["Link", "Network", "network"]
