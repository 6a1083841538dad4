"""``ringcoll.simulate``: run a collective on every rank of a world in one process."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, List, Optional, Sequence

import torch

from ..api import BUILDERS
from ..api._calls import numel_call, uniform_plans
from ..api.common import Context
from ..cost.machine import Machine
from ..runtime.plan import Plan
from ..schedules.registry import COLLECTIVE_OF, Algorithm, Cost, model
from ..schedules.vocabulary import NODES, SEGMENT, Send, Step
from .engine import SimStats, run_plans
from ..runtime.nodes import describe_placement, even_nodes, model_local_size


@dataclass
class Simulation:
    collective: str
    algorithm: Algorithm
    world: int
    outputs: List[Any]            # each rank's result: what its Work.result() would give (data runs)
    stats: SimStats
    cost: Cost                    # the algorithm's α-β-γ model at this size
    plans: List[Plan] = field(repr=False, default_factory=list)
    machine: Machine = field(default_factory=Machine)
    nbytes: int = 0               # the n of the cost model
    dtype: Optional[torch.dtype] = None   # the element type of the run (numel=: int64 unless dtype= says)
    #: ``algorithm="nccl"`` (or an NCCL schedule under ``protocol=``): what NCCL's tuner picks
    #: and its model's time (ringcoll.cost.nccl.Choice)
    nccl: Optional[Any] = None
    #: ``algorithm="nccl"`` or ``protocol=``: the protocol's machine the clock ran on
    #: (ringcoll.cost.nccl.ProtocolMachine; ``machine`` is its ``machine``)
    protocol: Optional[Any] = None

    @property
    def schedules(self) -> List[Sequence[Step]]:
        """Each rank's steps, for pictures and study (built on first use)."""
        return [plan.steps() for plan in self.plans]

    @functools.cached_property
    def predicted(self) -> float:
        """The model's time on this machine, without link sharing.

        On a flat machine: the algorithm's α-β-γ cost (``cost.on(machine)``; on a
        single-port machine it is the clock's time). On a machine with links (a 2-level
        machine's NICs, ``Machine.torus`` ..., ``Machine.gpu_cluster``): the
        **contention-free time** of this run's messages, the same schedules on the same ports
        with each message taking what its route costs alone (the 2-level machine's intra- or
        inter-node α and β; on a network α + Σ its links' latencies + hops · hop latency +
        n·β_path, β_path its slowest link, or the machine's β), but no link ever shared; so
        it grows with hops and placement, and ``stats.time - predicted`` is what link sharing
        costs. (:func:`contention_free_time`; computed on first use.) With
        ``algorithm="nccl"``, or nccl_ring / nccl_tree under ``protocol=``: NCCL's own model's
        time of what its tuner picks (``sim.nccl``), the clock's being ``stats.time`` +
        ``protocol.launch`` (:attr:`nccl_ratio`).
        """
        if self.nccl is not None:
            return self.nccl.time
        if self.machine.network_for(self.world) is None:
            return self.cost.on(self.machine)
        return contention_free_time(self.plans, self.machine)

    @property
    def nccl_ratio(self) -> Optional[float]:
        """The clock's answer over NCCL's formula's, for one (algorithm, protocol, channels):
        (``stats.time`` + the protocol's per-call ``launch``, which no message carries) /
        ``nccl.time``; None without ``sim.nccl``."""
        if self.nccl is None or not self.nccl.time:
            return None
        return (self.stats.time + (self.protocol.launch if self.protocol else 0.0)) / self.nccl.time

    def summary(self) -> str:
        """One line per answer: the clock's time, and with ``sim.nccl`` NCCL's formula's and
        their ratio (:attr:`nccl_ratio`)."""
        lines = [f"{self.collective} {self.algorithm.name}, {self.world} ranks, {self.nbytes} B: "
                 f"clock {self.stats.time * 1e6:.3f} us"]
        if self.protocol is not None:
            pm = self.protocol
            lines[0] += (f" under NCCL's {pm.protocol} ({pm.algorithm}, {pm.channels} channels, "
                         f"{pm.segment} B per step) + launch {pm.launch * 1e6:.3g} us")
        if self.nccl is not None:
            c = self.nccl
            ratio = self.nccl_ratio
            lines.append(f"NCCL's formula ({c.algorithm}, {c.protocol}, {c.channels} channels): "
                         f"{c.time * 1e6:.3f} us; clock / formula " + ("--" if ratio is None else f"{ratio:.3f}"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    @property
    def ratios(self):
        """Ratios to the lower bounds of Chan et al. 2007 (ringcoll.sim.bounds): latency
        (critical-path steps ÷ ⌈lg p⌉), bandwidth (most bytes through one rank ÷ the bound),
        compute (most bytes one rank reduces ÷ (p-1)/p·n)."""
        from .bounds import ratios
        return ratios(self.collective, self.world, self.nbytes, self.stats)

    def critical_path(self):
        """The recorded run's chain of messages and reductions that ends last, earliest first
        (:meth:`ringcoll.sim.engine.Timeline.critical_path`; needs ``record``)."""
        if self.stats.timeline is None:
            raise ValueError("this run kept no timeline: simulate(..., record=True)")
        return self.stats.timeline.critical_path()

    def trace(self, path: str) -> str:
        """Write the run's Chrome-trace / Perfetto JSON to ``path`` (see ringcoll.sim.pictures)."""
        from .pictures import write_trace
        return write_trace(self, path)

    def plot(self, path: str) -> str:
        """Write a PNG timeline of the run to ``path`` (see ringcoll.sim.pictures)."""
        from .pictures import plot_timeline
        return plot_timeline(self, path)

    def plot_links(self, path: str) -> str:
        """Write a PNG of the bytes on every link of the machine's network to ``path`` (a
        torus as a grid, a fat-tree by level; see ringcoll.sim.pictures.plot_links)."""
        from .pictures import plot_links
        return plot_links(self, path)


def contention_free_time(plans: Sequence[Plan], machine: Machine) -> float:
    """The clock's time of ``plans`` on ``machine`` (one with links: a network, or a 2-level
    machine's NICs) with no link shared: the run again on a machine whose network joins each
    pair of ranks that exchange a message by one link of its own (as many lanes as the
    machine has ports) priced as the pair's route is priced on ``machine``
    (:meth:`Network.price`: α + Σ the route's link latencies + hops · hop latency, β the
    route's slowest, at least the machine's β; between a 2-level machine's nodes its
    inter-node α and β), so every message takes what its route costs and waits only for its
    ports and its step's dependencies."""
    world = len(plans)
    net = machine.network_for(world)
    host = net.hosts_of(world)
    pairs = set()
    for plan in plans:
        for st in plan.algorithm.schedule(plan.rank, plan.world, plan.layout):
            pairs.update((plan.rank, c.peer) for c in st.comms if isinstance(c, Send) and c.peer != plan.rank)
    # each pair's whole price on its own link; the hosts add nothing (α = β = 0)
    links = [(a, b, *net.price(net.route(host[a], host[b]), machine.alpha, machine.beta), machine.ports)
             for a, b in sorted(pairs)]
    alone = Machine(alpha=machine.alpha, beta=machine.beta, gamma=machine.gamma, ports=machine.ports)
    if links:
        alone = Machine.from_graph(links, {(a, b): (a, b) for a, b, *_ in links}, hosts=world, alpha=0.0,
                                   beta=0.0, gamma=machine.gamma, ports=machine.ports)
    # LogGP's overhead, gap, wire latency and window are the ranks' and the ports', not a link's
    alone = replace(alone, o=machine.o, g=machine.g, L=machine.L, window=machine.window)
    with torch.no_grad():
        return run_plans(plans, alone, data=False, record=False, symmetry=False).time


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def simulate(collective: str, algorithm: str = "auto", world: int = 4,
             inputs: Optional[Sequence[Any]] = None, *, numel: Optional[int] = None,
             dtype: torch.dtype = torch.int64, call: Optional[Callable[[int], tuple]] = None,
             machine: Optional[Machine] = None, data: bool = True, check: Optional[bool] = None,
             record: Optional[bool] = None, local_size=None, symmetry: bool = True,
             protocol: Optional[str] = None, **kwargs) -> Simulation:
    """Run ``collective`` with ``algorithm`` on all ``world`` ranks in this process.

    Each rank's call is the drop-in's arguments after the group: ``inputs[rank]`` (a tensor,
    or a tuple of positional arguments), or rank-valued data of ``numel`` elements of
    ``dtype`` (default ``torch.int64``, exact under every op; the cost model's n is ``numel``
    times its 8 bytes: pass ``dtype=torch.float32`` for 4-byte elements; see
    :func:`numel_call`), or ``call(rank) -> (args, kwargs)``; ``kwargs`` go to every rank (``op=``, ``src=`` ...). Inputs are copied, never
    modified. Returns every rank's result, the statistics (critical-path steps, messages,
    bytes per rank and per link, time on ``machine``'s port-limited clock; None: the default
    ``Machine()``; ``Machine.window`` sets the steps a rank keeps in flight, as the executor's
    RINGCOLL_WINDOW, and ``Machine.o``, ``g``, ``L`` LogGP's overhead, gap and wire latency),
    the algorithm's cost model and every rank's plan. ``algorithm="auto"`` chooses as on a group
    (ringcoll.selection): given ``machine=``, as on a group whose ``Options(machine=)`` is that
    machine, the algorithm the simulator times fastest on it with these nodes; without, as on a
    group without one (RINGCOLL_MACHINE, else the rules measured on this host, else the default
    machine). ``sim.algorithm`` is the one chosen.

    ``data=False`` runs only the clock: no data is read or written, with ``numel=`` one
    builder call (rank 0's, on uninitialised tensors) gives every rank's layout, and schedules
    stream step by step, for thousands of ranks; statistics and times are those of the data
    run. ``check`` (default: on for data runs) compares every
    rank's result with the collective's definition computed from the inputs and raises
    naming the rank and the first wrong element. ``record`` (default: on up to 256 ranks)
    keeps the timeline that :meth:`Simulation.trace` and :meth:`Simulation.plot` draw.
    ``local_size`` puts the ranks on nodes for the node-aware algorithms (ringcoll.runtime.nodes):
    an int for nodes of that many consecutive ranks, or a tuple giving each rank's node; by
    default the machine's own nodes (a 2-level machine's, a GPU cluster's: :func:`run_nodes`),
    so every node-aware schedule, ``auto``'s model and the clock see one layout.
    ``algorithm="nccl"`` (all_reduce, all_gather, reduce_scatter, broadcast or reduce on a GPU
    cluster): NCCL's tuner's pick (algorithm × protocol × channels) by its own cost formulas in
    ``sim.nccl`` (:mod:`ringcoll.cost.nccl`, given the whole vector's bytes), its time
    ``sim.predicted``, run as nccl_ring, nccl_tree or nccl_pat (nccl_ring for NVLS) on the
    clock on that protocol's machine (:func:`ringcoll.cost.nccl.protocol_machine`, in
    ``sim.protocol``): two answers, ``sim.summary()`` gives both and their ratio.
    ``protocol`` ("LL", "LL128", "Simple"; GPU clusters only) runs any schedule on that
    protocol's machine, all channels, the protocol's chunks as its segment; with
    ``algorithm="nccl"`` it limits the tuner to it (NCCL_PROTO), with nccl_ring or nccl_tree
    (all_reduce) ``sim.nccl`` is NCCL's formula for that algorithm and protocol.
    ``symmetry`` (default on) lets a run without data and timeline run only the
    representatives (rank 0, or ranks 0 .. L - 1) when the algorithm declares every rank's
    schedule a representative's with its peers relabelled (``ringcoll.register(...,
    symmetry=)``; the rings, pairwise, Bruck, PAT, dissemination, direct, the butterflies,
    Swing and Bine on powers of two, the node-aware ones on nodes of L, torus2d on its rows, the
    torus Swings by two and bucket_torus by one along their grid's last dimension),
    on a flat machine, one whose nodes the relabelling maps onto nodes (the period widened to
    whole nodes), or a whole torus placed linearly while no link makes a message wait: same
    statistics and time, in O(L ranks' steps)
    (``stats.mirrored`` says so); a schedule of one step per rank on such a torus runs every
    rank on the compiled clock of one-step exchanges instead, links shared or not
    (:mod:`ringcoll.sim.batch`; ``stats.compiled`` says so); ``symmetry=False`` runs every rank
    on the event clock.

    >>> sim = ringcoll.simulate("all_reduce", "ring", world=5, numel=1000)
    >>> sim.outputs[0][0]           # rank 0's reduced tensor
    >>> ringcoll.simulate("all_reduce", "ring", world=4096, numel=1 << 20, data=False).stats.time
    """
    chosen_on, machine = _checked(collective, world, machine, symmetry)
    if check is None:
        check = data
    if check and not data:
        raise ValueError("check=True needs data=True (a run without data has no results to check)")
    if record is None:
        record = world <= 256
    nodes, nodes_from = run_nodes(world, local_size, chosen_on)
    ctx = functools.partial(Context, world=world, nodes=nodes, nodes_from=nodes_from, machine=chosen_on)
    build = functools.partial(_plans, collective, world, inputs, numel, dtype, call, data, check, kwargs, ctx)
    _check_protocol(protocol, machine)
    if algorithm == "nccl":
        (plans, before, after), choice = _nccl(collective, world, machine, build, protocol)
    else:
        (plans, before, after), choice = build(algorithm), None
        if protocol is not None and algorithm in ("nccl_ring", "nccl_tree") \
                and COLLECTIVE_OF.get(collective, collective) == "all_reduce":
            from ..cost.nccl import choose
            choice = choose("all_reduce", _bytes(plans[0]), world, machine,
                            algorithms=[algorithm.removeprefix("nccl_")], protocols=[protocol])
    on = None
    if choice is not None or protocol is not None:
        on = _on_protocol(plans, world, machine, choice, protocol)
        machine = on.machine
    with torch.no_grad():
        stats = run_plans(plans, machine, data=data, record=record, symmetry=symmetry)
    first = plans[0]
    nbytes, cost = _cost(first, world, nodes)
    sim = Simulation(collective, first.algorithm, world,
                     [p.result for p in plans] if data else [], stats, cost, plans, machine, nbytes, first.dtype,
                     choice, on)
    if check:
        from .check import check_results
        check_results(collective, before, after)
    return sim


def _cost(first: Plan, world: int, nodes) -> tuple:
    """(n, the α-β-γ cost at n) of a run whose rank 0 has plan ``first``."""
    itemsize = _itemsize(first)
    nbytes = _bytes(first)
    segment = first.layout.get(SEGMENT)
    return nbytes, model(first.algorithm, world, nbytes, segment=segment * itemsize if segment else None,
                         local_size=model_local_size(nodes))


def _checked(collective: str, world: int, machine: Optional[Machine], symmetry) -> tuple:
    """simulate's arguments checked; (the machine auto weighs, None when none was named; the
    machine the clock runs on: the default one when none was named)."""
    if collective not in BUILDERS:
        raise ValueError(f"collective must be one of {sorted(BUILDERS)}, got {collective!r}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    if machine is not None and not isinstance(machine, Machine):
        raise TypeError(f"machine must be a ringcoll.Machine, got {type(machine).__name__}")
    if not isinstance(symmetry, bool):
        raise TypeError(f"symmetry must be a bool, got {type(symmetry).__name__} {symmetry!r}")
    return machine, machine if machine is not None else Machine()


def run_nodes(world: int, local_size, machine: Optional[Machine]) -> tuple:
    """(nodes, where they came from) of a simulated run: ``local_size``'s (an int: nodes of
    that many consecutive ranks; a tuple: each rank's node), else the machine's own
    (:meth:`Machine.nodes`: a 2-level machine's, a GPU cluster's), else None (the
    environment's RINGCOLL_LOCAL_SIZE, else one node). A ``local_size`` that puts the ranks on
    other nodes than the machine's is refused: the schedule would run on one layout and the
    clock price another."""
    own = machine.nodes(world) if machine is not None else None
    if local_size is None:
        return own, (None if own is None else "the machine's nodes")
    nodes = local_size if isinstance(local_size, tuple) else even_nodes(world, local_size)
    if len(nodes) != world:
        raise ValueError(f"local_size as a tuple must give the node of each of the {world} ranks, got {len(nodes)}")
    if own is not None and tuple(nodes) != own:
        raise ValueError(f"local_size puts the ranks on nodes {describe_placement(nodes)}, the machine on "
                         f"{describe_placement(own)}: give one placement (leave local_size out to take the machine's)")
    return tuple(nodes), "simulate's local_size"


def _itemsize(plan: Plan) -> int:
    return torch.empty((), dtype=plan.dtype).element_size()


def _bytes(plan: Plan) -> int:
    """The call's bytes: the n of the cost model, and what NCCL's tuner is given."""
    return plan.layout.numel * _itemsize(plan)


def _check_protocol(protocol, machine: Machine) -> None:
    """simulate's ``protocol``: None or one of NCCL's, on a GPU cluster."""
    from ..cost.nccl import check_protocol

    if protocol is None:
        return
    check_protocol(protocol)
    net = machine.network
    if net is None or net.kind != "gpu_cluster":
        raise ValueError(f"protocol={protocol!r} needs a GPU cluster (ringcoll.Machine.gpu_cluster or .preset), "
                         f"got {machine.describe()}")


def _nccl(collective, world, machine, build, protocol) -> tuple:
    """``algorithm="nccl"``: the plans of the ringcoll schedule that runs the messages of
    NCCL's tuner's pick for the call's bytes on ``machine`` (:func:`ringcoll.cost.nccl.choose`,
    limited to ``protocol`` when given: nccl_ring, nccl_tree or nccl_pat; NCCL's ring where
    NVLS, which reduces in the switch, is picked), and the pick."""
    from ..cost.nccl import BUS_FACTOR, choose

    family = COLLECTIVE_OF.get(collective, collective)
    if family not in BUS_FACTOR:
        raise ValueError(f"algorithm='nccl' runs {', '.join(BUS_FACTOR)} (the collectives NCCL's model prices), "
                         f"got {collective!r}")
    built = build("nccl_ring")
    choice = choose(family, _bytes(built[0][0]), world, machine,
                    protocols=None if protocol is None else [protocol])
    return (built if choice.schedule in (None, "nccl_ring") else build(choice.schedule)), choice


def _on_protocol(plans, world, machine, choice, protocol):
    """The protocol's machine of a run (:func:`ringcoll.cost.nccl.protocol_machine`): the
    pick's protocol and channels, else ``protocol`` on all channels; NCCL's tree's latencies
    and chunks for nccl_tree, the ring's otherwise. Every plan's segment becomes the protocol's
    step of the NCCL channels that one of its rings or trees carries (nccl_ring: its
    :func:`channel_rings`, one on a node, a node's ranks across nodes; nccl_tree: two trees;
    any other schedule one), in elements."""
    from ..cost.nccl import protocol_machine
    from ..schedules.nccl import channel_rings

    first = plans[0]
    name = first.algorithm.name
    on = protocol_machine(machine, world, protocol if choice is None else choice.protocol,
                          "tree" if name == "nccl_tree" else "ring", None if choice is None else choice.channels)
    # the pipelines that run side by side: a ring per channel (nccl_ring of every collective),
    # two trees per channel pair (nccl_tree), one for any other schedule (nccl_pat among them)
    rings = len(channel_rings(tuple(first.layout.get(NODES) or (0,) * world)))
    carriers = {"nccl_ring": rings, "nccl_tree": 2 * rings}.get(name, 1)
    segment = max(1, on.segment // max(1, min(carriers, on.channels)) // _itemsize(first))
    for plan in plans:
        plan.layout = plan.layout.replace(**{SEGMENT: segment})
    return on


def _plans(collective, world, inputs, numel, dtype, call, data, check, kwargs, ctx, algorithm) -> tuple:
    """Every rank's plan of ``algorithm``, and with ``check`` each rank's arguments before and
    after the run."""
    plans, before, after = [], [], []
    build = BUILDERS[collective]
    by_numel = numel is not None and call is None and inputs is None
    if by_numel and (isinstance(numel, bool) or not isinstance(numel, int) or numel < 0):
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")
    if by_numel and not data:
        # without data: one builder call serves every rank
        plans = uniform_plans(collective, world, numel, dtype, {"algorithm": algorithm, **kwargs}, ctx(0))
    for rank in range(len(plans), world):
        if call is not None:
            args, extra = call(rank)
            extra = {**kwargs, **extra}
        elif inputs is not None:
            if len(inputs) != world:
                raise ValueError(f"inputs must hold one entry per rank ({world}), got {len(inputs)}")
            args = inputs[rank] if isinstance(inputs[rank], tuple) else (inputs[rank],)
            extra = kwargs
        elif numel is not None:
            args, extra = numel_call(collective, rank, world, numel, dtype, kwargs, fill=data)
        else:
            raise ValueError("simulate needs inputs=, numel= or call=")
        extra = {"algorithm": algorithm, **extra}      # a call may give each rank its own
        if check:
            before.append((_clone(args), dict(extra)))
        args = _clone(args) if data else args
        after.append(args)
        plans.append(build(ctx(rank), *args, **extra))
    return plans, before, after
