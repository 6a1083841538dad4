"""The bucket algorithm on every port of a torus (``bucket_torus``, the Swing paper's
baseline): its rings by hand, one message per link per step, any torus from the machine,
exact results, and the 2D parts at once on 2D ports."""
from __future__ import annotations

import functools
import math
from collections import Counter

import pytest
import torch

import ringcoll
from _util import assert_equal_per_rank
from ringcoll.schedules.torus import bucket_grid, bucket_lines
from ringcoll.schedules.registry import get
from ringcoll.schedules.vocabulary import GRID, Layout, Recv, Send
from ringcoll.api._calls import rank_data

R = ringcoll.ReduceOp
PORT_LINK = dict(alpha=1e-6, beta=1 / 50e9, gamma=1 / 100e9, hop_latency=1e-7)


def schedule(rank, dims, numel):
    world = math.prod(dims)
    return list(get("all_reduce", "bucket_torus").schedule(rank, world, Layout(numel, {GRID: dims})))


def test_lines_and_grids():
    # rank 5 of a 4x4 torus is at (1, 1)
    assert bucket_lines(5, (4, 4)) == [([4, 5, 6, 7], 1), ([1, 5, 9, 13], 1)]
    assert bucket_lines(7, (2, 3, 2)) == [([6, 7], 1), ([7, 9, 11], 0), ([1, 7], 1)]
    assert bucket_grid(64) == (8, 8) and bucket_grid(12) == (4, 3) and bucket_grid(7) == (7,)
    assert bucket_grid(15, (3, 5)) == (3, 5) and bucket_grid(16, (4, 1, 4)) == (4, 4)
    assert bucket_grid(16, (3, 5)) == (4, 4)          # not the world's torus: the default grid
    assert bucket_grid(1) == ()


def test_first_steps_by_hand_on_a_4x4_torus():
    """Rank 5 at (1, 1), 4 parts of 16 elements: part 0 rings along x to the right, part 1
    along y, parts 2 and 3 the other way round; the reduce-scatter's first step sends the
    partial of the chunk one place behind and reduces the one two places behind."""
    steps = schedule(5, (4, 4), 64)
    first = steps[0]
    sends = [(c.peer, c.buf.start, c.buf.stop) for c in first.comms if isinstance(c, Send)]
    recvs = [c.peer for c in first.comms if isinstance(c, Recv)]
    # part 0 = [0, 16) cut in 4 along x, place 1 sends chunk 0; part 1 = [16, 32) along y,
    # place 1 sends chunk 0; part 2 reversed (place 2 of [7, 6, 5, 4]) sends chunk 1; part 3 too
    assert sends == [(6, 0, 4), (9, 16, 20), (4, 36, 40), (1, 52, 56)]
    assert recvs == [4, 1, 6, 9]
    assert len(steps) == 4 * 3       # 2 dims x (3 reduce-scatter + 3 all-gather) steps, parts together
    # the second phase: part 0 along y on the chunk x left it (its place's, 4 elements)
    part0 = [c for c in steps[3].comms if isinstance(c, Send) and c.buf.start < 16]
    assert [c.peer for c in part0] == [9] and part0[0].buf.numel == 1


@pytest.mark.parametrize("dims", [(8, 8), (4, 4, 4), (16,), (8, 4), (3, 5)])
def test_no_link_carries_two_messages_of_a_step(dims):
    """At every step every message goes one hop, to a neighbour, each rank's 2D messages on 2D
    different links, and no directed link of the torus carries two (the rectangular torus's
    parts wait for the longest ring before the next dimension). (On a dimension of 2 both
    directions reach the one neighbour over the one link: not checked here.)"""
    world = math.prod(dims)
    net = ringcoll.Machine.torus(dims).network
    per_rank = [schedule(rank, dims, 2 * len(dims) * world * 3) for rank in range(world)]
    count = len(per_rank[0])
    assert [len(s) for s in per_rank] == [count] * world, "steps per rank"
    for index in range(count):
        used = Counter()
        for rank in range(world):
            for c in per_rank[rank][index].comms:
                if isinstance(c, Send):
                    path = net.route(rank, c.peer)
                    assert len(path) == 1, (dims, index, rank, c.peer)
                    used[path[0]] += 1
        assert max(used.values()) == 1, (dims, index, used.most_common(2))


@pytest.mark.parametrize("dims", [(3, 5), (2, 3, 2), (7,), (4, 4)])
def test_any_torus_of_the_machine_and_exact_results(dims):
    world = math.prod(dims)
    machine = ringcoll.Machine.torus(dims, ports=2 * len([d for d in dims if d > 1]), **PORT_LINK)
    for numel in (0, 1, world - 1, world + 1, 1000):
        sim = ringcoll.simulate("all_reduce", "bucket_torus", world, numel=numel, op=R.BXOR, machine=machine)
        assert sim.plans[0].layout[GRID] == dims
        want = functools.reduce(torch.bitwise_xor, [rank_data(r, numel) for r in range(world)])
        assert_equal_per_rank([out[0] for out in sim.outputs], [want] * world, f"dims {dims} numel {numel}")
    floats = [torch.randn(301, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    bits = ringcoll.simulate("all_reduce", "bucket_torus", world, inputs=floats, machine=machine).outputs
    assert_equal_per_rank([out[0].view(torch.int32) for out in bits], [bits[0][0].view(torch.int32)] * world,
                          f"dims {dims}: bits against rank 0's")
    total = torch.stack(floats).double().sum(0)
    assert torch.allclose(bits[0][0].double(), total, rtol=1e-5, atol=1e-5)
    # a mesh has no wrap-around: the rings still close, the long way round
    mesh = ringcoll.Machine.mesh(dims, **PORT_LINK)
    sim = ringcoll.simulate("all_reduce", "bucket_torus", world, numel=99, op=R.BXOR, machine=mesh)
    want = functools.reduce(torch.bitwise_xor, [rank_data(r, 99) for r in range(world)])
    assert sim.plans[0].layout[GRID] == dims and all(torch.equal(out[0], want) for out in sim.outputs)


def test_four_ports_run_the_four_rings_at_once():
    """On an 8x8 torus at 16 MiB the 4 parts' messages go together on 4 ports (near 4x faster
    than through one), every message one hop, every directed link carrying the same bytes;
    torus2d's single rings use a quarter of the ports and gain nothing. Reductions are free
    here (γ = 0): the ports are the whole story."""
    times = {}
    for ports in (1, 4):
        machine = ringcoll.Machine.torus((8, 8), ports=ports, **{**PORT_LINK, "gamma": 0.0})
        for name in ("bucket_torus", "torus2d"):
            sim = ringcoll.simulate("all_reduce", name, 64, numel=4 << 20, dtype=torch.float32, machine=machine,
                                    data=False, record=False)
            times[name, ports] = sim.stats.time
            if name == "bucket_torus":
                net = sim.stats.network
                assert net.used_links == len(machine.network.links)
                assert net.max_link_bytes == net.mean_link_bytes
                sent = sum(r.bytes_sent for r in sim.stats.ranks)
                assert net.hop_bytes == sent                     # one hop each
                assert sim.stats.mirrored == "rotation"           # numel a multiple of 2D·p
    assert times["bucket_torus", 4] < times["bucket_torus", 1] / 3.5
    assert times["torus2d", 4] == times["torus2d", 1]
    assert times["bucket_torus", 4] < times["torus2d", 4] / 3.5
