"""The compiled clock of one-step exchanges on a torus (ringcoll.sim.batch) against the event
clock (ringcoll.sim.engine.run_schedules) running every rank: every statistic equal, float for
float, on tori of several shapes and port counts, for the direct algorithms, the linear
all-to-all and random one-step exchanges whose messages wait on each other's order."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import ringcoll
from ringcoll.schedules.vocabulary import Buf, Recv, Send, step
from ringcoll.sim.batch import _routes, link_kinds, one_step_torus
from ringcoll.sim.engine import run_one_step, run_schedules

TORI = [(4, 4), (6, 4), (5, 3), (3, 3, 2), (2, 6), (8, 8)]


def _same(compiled, events):
    """Every statistic of the two runs equal (the flag saying how it ran aside)."""
    assert compiled.compiled and not events.compiled
    assert compiled == events                       # ranks, links per rank pair, crossing
    assert compiled.time == events.time
    assert compiled.network.link_bytes == events.network.link_bytes
    assert compiled.network.link_busy == events.network.link_busy
    assert compiled.network.hop_bytes == events.network.hop_bytes
    assert compiled.network.hosts == events.network.hosts


@pytest.mark.parametrize("dims", TORI)
@pytest.mark.parametrize("ports", [1, 4])
@pytest.mark.parametrize("collective,name", [("all_reduce", "direct"), ("reduce_scatter", "direct"),
                                             ("all_gather", "direct"), ("all_to_all", "linear")])
def test_one_step_algorithms_on_a_torus_match_the_event_clock(dims, ports, collective, name):
    machine = ringcoll.Machine.torus(dims, ports=ports)
    world = machine.network.hosts
    for numel in (0, world, 7 * world, 1000 * world):
        compiled = ringcoll.simulate(collective, name, world, numel=numel, dtype=torch.float32, machine=machine,
                                     data=False, record=False)
        events = ringcoll.simulate(collective, name, world, numel=numel, dtype=torch.float32, machine=machine,
                                   data=False, record=False, symmetry=False)
        _same(compiled.stats, events.stats)


def _exchange(sends, receives, sizes, order):
    """A one-step schedule for every rank: sends to rank + s (s in ``sends``), receives from
    rank - s, ``sizes[s]`` elements each, posted in ``order`` (positions into sends then
    receives)."""
    def schedule(rank, world):
        comms = [Send((rank + s) % world, Buf("data", 0, sizes[s])) for s in sends] + \
                [Recv((rank - s) % world, Buf("scratch", 0, sizes[s])) for s in receives]
        return [step([comms[i] for i in order], [])]
    return schedule


def test_random_one_step_exchanges_match_the_event_clock_where_it_runs():
    """Messages posted in random orders wait on one another (held until they head both their
    sender's sends and their receiver's receives); where they wait in a circle the compiled
    clock declines (the event clock's forced release is not its to follow)."""
    rng = random.Random(27)
    ran = declined = 0
    for _trial in range(60):
        dims = rng.choice([(4, 2), (3, 3), (4, 4), (5, 2), (2, 2, 2)])
        machine = ringcoll.Machine.torus(dims, ports=rng.choice([1, 2]))
        world = machine.network.hosts
        offsets = rng.sample(range(1, world), rng.randint(1, min(4, world - 1)))
        sizes = {s: rng.choice([0, 1, 3, 1000]) for s in offsets}
        order = list(range(2 * len(offsets)))
        rng.shuffle(order)
        schedule = _exchange(offsets, offsets, sizes, order)
        count = machine.network.hosts // dims[-1]
        compiled = run_one_step([schedule(rank, world) for rank in range(count)], machine, 4, world)
        events = run_schedules([schedule(rank, world) for rank in range(world)], machine, [4] * world)
        if compiled is None:
            declined += 1
            continue
        ran += 1
        _same(compiled, events)
    assert ran >= 20 and declined >= 1, (ran, declined)


def test_routes_moved_from_host_zero_are_the_networks_routes():
    for dims in [(4, 4), (5, 3), (3, 3, 2), (2, 6), (8, 4, 3), (7,)]:
        net = ringcoll.Machine.torus(dims).network
        hosts = net.hosts
        sources = np.repeat(np.arange(hosts), hosts)
        peers = np.tile(np.arange(hosts), hosts)
        offsets, found = _routes(net, sources, peers, *link_kinds(net))
        for i, (a, b) in enumerate(zip(sources.tolist(), peers.tolist())):
            assert tuple(found[offsets[i]:offsets[i + 1]].tolist()) == net.route(a, b), (dims, a, b)


def test_what_the_compiled_clock_declines():
    torus = ringcoll.Machine.torus((4, 4))
    assert one_step_torus(torus, 4, 16) is torus.network
    assert one_step_torus(torus, 3, 16) is None                 # shifts by 3 are no translation
    assert one_step_torus(torus, 16, 16) is None                # every rank its own representative
    assert one_step_torus(ringcoll.Machine.torus((4, 4), placement=("random", 1)), 4, 16) is None
    assert one_step_torus(ringcoll.Machine.mesh((4, 4)), 4, 16) is None
    assert one_step_torus(ringcoll.Machine.fat_tree(radix=4), 4, 16) is None
    schedule = _exchange([1], [1], {1: 10}, [0, 1])
    two_steps = [schedule(rank, 16) * 2 for rank in range(4)]
    assert run_one_step(two_steps, torus, 4, 16) is None
    unmatched = [[step([Send((rank + 1) % 16, Buf("data", 0, 4))], [])] for rank in range(4)]
    assert run_one_step(unmatched, torus, 4, 16) is None
    mismatched = [_exchange([1], [], {1: 4}, [0])(rank, 16)[0].comms +
                  _exchange([], [1], {1: 5}, [0])(rank, 16)[0].comms for rank in range(4)]
    assert run_one_step([[step(comms, [])] for comms in mismatched], torus, 4, 16) is None
    # a ring of 64 (a torus of one dimension): every shift a translation, one representative
    ring = ringcoll.Machine.torus((64,))
    runs = [ringcoll.simulate("all_reduce", "direct", 64, numel=64 * 16, dtype=torch.float32, machine=ring,
                              data=False, record=False, symmetry=symmetry) for symmetry in (True, False)]
    _same(runs[0].stats, runs[1].stats)
