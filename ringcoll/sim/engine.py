"""The simulator's engine: every rank's plan in one process, with or without data, on the
event clock (:mod:`ringcoll.sim.clock`, which states the machine model and its phases).

With data, each matched message copies its elements and each finished step runs its local
operations on the rank's buffers; with ``data=False`` only the clock runs and each rank's
schedule streams one step at a time, so memory is O(world), not O(steps).

Symmetry: where an algorithm declares that every rank's schedule is a representative's with
its peers relabelled (``ringcoll.register(..., symmetry=)``: rank r is rank r % L moved by
r - r % L, ``(q + shift) % p``, or rank 0 with peers ``q ^ r``), every rank does what its
representative does at the same times, on a flat machine or one whose nodes the relabelling
maps onto nodes. A cost-only run without a timeline then runs the L representatives alone,
each send matched with the representative receive it stands for (:func:`run_schedules`,
``mirror``): O(L ranks' steps) instead of O(world's), with the same statistics and time
(tests/sim/test_study.py compares both at every rank). The declaration is checked against
sampled ranks on every such run. On a torus, where messages share links with their own
translates and by-rank arbitration breaks the symmetry, a rotation-symmetric schedule of one
step per rank runs every rank on the compiled clock of one-step exchanges
(:mod:`ringcoll.sim.batch`, :func:`run_one_step`): the same arithmetic in the same order.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Optional, Sequence, Tuple

import torch

from ..runtime.local import run_local
from .batch import one_step_clock, one_step_torus
from .clock import (MirroredLinks, NetworkStats, RankStats, ScheduleError, SimStats, _Contended, reduced_bytes,
                    run_schedules)
from ..cost.machine import Machine
from ..runtime.plan import Plan
from ..schedules.vocabulary import Send, extents

__all__ = ["run_one_step", "run_plans", "signature", "symmetric"]


def run_plans(plans: Sequence[Plan], machine: Machine = Machine(), *, data: bool = True,
              record: bool = False, symmetry: bool = True) -> SimStats:
    """Run every rank's plan to completion; ``plans[r]`` is rank r's. With ``data=False``
    only the clock runs: no buffer is read or written and schedules stream step by step, and
    where the algorithm declares its schedules the same on every rank up to relabelling
    (``symmetry``, without a timeline; :func:`symmetric` says on which machines) the
    representatives' run stands for all.
    ``record`` keeps the :class:`Timeline` of every message and local operation."""
    world = len(plans)
    itemsizes = [plan.dtype.itemsize for plan in plans]
    if not data:
        found = symmetric(plans, machine) if symmetry and not record else None
        if found is not None:
            kind, period = found
            first = plans[0]
            schedules = [first.algorithm.schedule(rank, world, first.layout) for rank in range(period)]
            if kind == "rotation" and one_step_torus(machine, period, world) is not None:
                # one step per rank on a torus: every rank on the compiled clock of one-step
                # exchanges (ringcoll.sim.batch), exact where messages share links, which a
                # mirrored run cannot follow
                heads = [list(itertools.islice(schedule, 2)) for schedule in schedules]
                if all(len(head) == 1 for head in heads):
                    stats = run_one_step(heads, machine, itemsizes[0], world)
                    if stats is not None:
                        return stats
                schedules = [itertools.chain(head, schedule) for head, schedule in zip(heads, schedules)]
            try:
                return run_schedules(schedules, machine, itemsizes[:period], describe=[first.describe] * period,
                                     mirror=(kind, world))
            except _Contended:
                pass                    # a link made a message wait: run every rank
        schedules = [plan.algorithm.schedule(plan.rank, plan.world, plan.layout) for plan in plans]
        return run_schedules(schedules, machine, itemsizes, record=record,
                             describe=[plan.describe for plan in plans])
    steps = [plan.steps() for plan in plans]
    buffers = []
    for plan, own in zip(plans, steps):
        bufs = dict(plan.buffers)
        for name, need in extents(own).items():
            if name not in bufs:
                bufs[name] = torch.empty(need, dtype=plan.dtype, device=plan.device)
            elif bufs[name].numel() < need:
                raise ScheduleError(f"{plan.describe}: rank {plan.rank} reaches element {need} of "
                                    f"buffer {name!r}, which holds {bufs[name].numel()}")
        buffers.append(bufs)

    def copy(src, send_item, dst, recv_item):
        s, r = send_item.buf, recv_item.buf
        buffers[dst][r.name][r.start:r.stop].copy_(buffers[src][s.name][s.start:s.stop])

    def local(rank, st):
        return run_local(plans[rank].op, buffers[rank], st.local)

    for plan in plans:
        for before in plan.before:
            before()
    stats = run_schedules(steps, machine, itemsizes, record=record, copy=copy, local=local,
                          describe=[plan.describe for plan in plans])
    for plan in plans:
        for after in plan.after:
            after()
    return stats


def run_one_step(representatives: Sequence, machine: Machine, itemsize: int, world: int) -> Optional[SimStats]:
    """The statistics of a cost-only run of ``world`` ranks on a torus, rank r running
    representative ``r % L``'s one step (``representatives``: L lists of steps) with its peers
    moved by ``r - r % L``: every rank on the compiled clock of one-step exchanges
    (:mod:`ringcoll.sim.batch`), equal to the event clock's; None where it declines."""
    reduced = [reduced_bytes(steps[0].local, itemsize) if len(steps) == 1 and steps[0].local else 0
               for steps in representatives]
    run = one_step_clock(representatives, machine, itemsize, world, reduced)
    if run is None:
        return None
    count = len(representatives)
    ranks = [RankStats(steps=1, messages=run.messages[r], bytes_sent=run.sent[r], bytes_received=run.received[r],
                       bytes_reduced=reduced[r % count], time=run.times[r]) for r in range(world)]
    stats = SimStats(ranks, 1, MirroredLinks(run.per_link, "rotation", world, count), compiled=True)
    stats.network = NetworkStats(run.network, run.network.hosts_of(world), run.link_bytes, run.link_busy,
                                 run.hop_bytes)
    return stats


def signature(shift: int, world: int, steps: Iterable, kind: str):
    """A schedule as the clock sees it, its peers moved back by ``shift`` (``(q - shift) %
    world``, or ``q ^ shift``): per step, each transfer's (direction, peer, elements) and the
    elements reduced."""
    for st in steps:
        yield (tuple((type(c) is Send, (c.peer - shift) % world if kind == "rotation" else c.peer ^ shift,
                      c.buf.numel) for c in st.comms),
               reduced_bytes(st.local, 1) if st.local else 0)


#: ranks a mirrored run compares with their representatives (fractions of the world, and the last)
SAMPLED = (1, -1, 0.5, 0.37)


def symmetric(plans: Sequence[Plan], machine: Machine) -> Optional[Tuple[str, int]]:
    """The symmetry ``(kind, period)`` a cost-only run of ``plans`` may use to run ranks
    0 .. period - 1 alone, or None: every rank runs the same algorithm on the same layout and
    dtype, the algorithm declares a symmetry there (``register(..., symmetry=)``), and the
    machine is flat or, for a rotation, has nodes in blocks that the period's shifts map onto
    nodes. The declaration is checked against sampled ranks' schedules (every rank's in the
    tests): a schedule that breaks its own declaration is a ScheduleError, never a silently
    wrong clock."""
    world = len(plans)
    first = plans[0]
    algorithm = first.algorithm
    if world < 2 or algorithm.symmetry is None:
        return None
    for plan in plans:          # copies of one plan (simulate's numel= runs) pass on identity
        if plan.algorithm is not algorithm or (plan.layout is not first.layout and plan.layout != first.layout) \
                or (plan.buffers is not first.buffers and plan.dtype != first.dtype):
            return None
    declared = algorithm.symmetry(world, first.layout)
    if declared is None:
        return None
    kind, period = ("rotation", declared) if isinstance(declared, int) and not isinstance(declared, bool) \
        else (declared, 1)
    if kind not in ("rotation", "xor") or not 1 <= period <= world or world % period:
        raise ScheduleError(f"{algorithm.collective}/{algorithm.name}: symmetry returned {declared!r}, not "
                            f"'rotation', 'xor', a period dividing the world ({world}) or None")
    if period == world:
        return None                      # every rank its own representative: nothing to save
    net = machine.network_for(world)
    if net is not None:
        # the shifts must map the network onto itself: a translation of a whole torus placed
        # linearly, whole nodes of a 2-level machine in blocks (Network.mirror_period)
        period = net.mirror_period(period, world) if kind == "rotation" else None
        if period is None or period == world:
            return None
    references = {}
    for sample in SAMPLED:
        rank = int(sample * world) % world if isinstance(sample, float) else sample % world
        delegate = rank % period
        if rank == delegate:
            continue
        if delegate not in references:
            references[delegate] = list(signature(0, world, algorithm.schedule(delegate, world, first.layout), kind))
        shift = rank - delegate if kind == "rotation" else rank
        got = signature(shift, world, algorithm.schedule(rank, world, first.layout), kind)
        for index, (want, have) in enumerate(itertools.zip_longest(references[delegate], got)):
            if want != have:
                raise ScheduleError(
                    f"{first.describe or algorithm.name}: declared {kind}-symmetric at world {world}, "
                    f"but rank {rank}'s step {index} is {have} where rank {delegate}'s is {want}")
    return kind, period
