"""Swing on a D-dimensional torus (``swing_torus_bandwidth``, ``swing_torus_latency``): the
paper's peers and dimension order, the 2D Swings on distinct links, the grid taken from the
machine, and the same result as the built-in on a real group whose machine names the torus."""
from __future__ import annotations

import os

import pytest
import torch

import ringcoll
from _util import assert_equal_per_rank, ringcoll_log
from ringcoll.schedules.swing import grid_peers, grid_plan, grid_steps, rho, swing_grid
from ringcoll.schedules.vocabulary import GRID, Send

R = ringcoll.ReduceOp


def coords(rank, dims):
    out = []
    for d in dims:
        out.append(rank % d)
        rank //= d
    return tuple(out)


def test_steps_take_the_dimensions_in_turn_from_each_start():
    # libswing's compute_step_info: one step per dimension in turn, exhausted ones skipped
    assert grid_steps((8, 8), 0) == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))
    assert grid_steps((8, 8), 1) == ((1, 0), (0, 0), (1, 1), (0, 1), (1, 2), (0, 2))
    assert grid_steps((8, 2), 0) == ((0, 0), (1, 0), (0, 1), (0, 2))
    assert grid_steps((4, 4, 2), 2) == ((2, 0), (0, 0), (1, 0), (0, 1), (1, 1))
    assert grid_steps((64,), 0) == tuple((0, k) for k in range(6))


def test_peers_by_hand_on_a_4x4_torus():
    """Rank 0 at (0, 0) and rank 5 at (1, 1): ρ = 1, -1 on each dimension of 4; the even
    coordinate adds, the odd subtracts, the mirrored Swings (2, 3) the other way round."""
    dims = (4, 4)
    plan = grid_plan(dims)

    def peers(rank, c):
        steps, mirrored, _ = plan[c]
        return [int(grid_peers(rank, dims, d, k, mirrored)) for d, k in steps]

    # sub-collective 0 starts on x: (1,0) (0,1) (3,0) (0,3)
    assert peers(0, 0) == [1, 4, 3, 12]
    assert peers(0, 1) == [4, 1, 12, 3]          # starts on y
    assert peers(0, 2) == [3, 12, 1, 4]          # mirrored, starts on x
    assert peers(0, 3) == [12, 3, 4, 1]          # mirrored, starts on y
    # rank 5 = (1, 1): odd coordinates subtract ρ: (0,1)=4, (1,0)=1, x: 1+1=2 -> 6, y: 1+1=2 -> 9
    assert peers(5, 0) == [4, 1, 6, 9]
    assert peers(5, 2) == [6, 9, 4, 1]


@pytest.mark.parametrize("dims", [(8, 8), (4, 4, 4), (16,), (2, 2), (8, 4)])
def test_every_step_is_a_matching_one_dimension_rho_away(dims):
    world = 1
    for d in dims:
        world *= d
    for _c, (steps, mirrored, blocks) in enumerate(grid_plan(dims)):
        assert len(blocks) == world
        for d, k in steps:
            for rank in range(world):
                peer = int(grid_peers(rank, dims, d, k, mirrored))
                assert int(grid_peers(peer, dims, d, k, mirrored)) == rank
                mine, theirs = coords(rank, dims), coords(peer, dims)
                assert [i for i in range(len(dims)) if mine[i] != theirs[i]] in ([d], [])
                moved = (theirs[d] - mine[d]) % dims[d]
                assert moved in (rho(k) % dims[d], -rho(k) % dims[d])


@pytest.mark.parametrize("dims", [(8, 8), (4, 4, 4), (16,)])
def test_the_2d_swings_of_a_step_leave_on_2d_different_links(dims):
    """At every step each rank sends its 2D messages one per direction of each dimension: on
    a torus with 2D ports none of them queues behind another of the same rank."""
    world = 1
    for d in dims:
        world *= d
    plan = grid_plan(dims)
    for s in range(len(plan[0][0])):
        for rank in range(world):
            ways = set()
            for steps, mirrored, _ in plan:
                d, k = steps[s]
                peer = int(grid_peers(rank, dims, d, k, mirrored))
                forward = (coords(peer, dims)[d] - coords(rank, dims)[d]) % dims[d]
                ways.add((d, forward <= dims[d] // 2 and forward != 0))
            assert len(ways) == 2 * len(dims), (s, rank, ways)


def test_grid_defaults_and_choices():
    assert swing_grid(64) == (8, 8) and swing_grid(32) == (8, 4) and swing_grid(2) == (2,)
    assert swing_grid(64, (4, 4, 4)) == (4, 4, 4)
    assert swing_grid(64, (64,)) == (64,)
    assert swing_grid(64, (6, 8)) == (8, 8)           # not powers of two: the default grid
    assert swing_grid(64, (4, 1, 16)) == (4, 16)      # a dimension of one rank is no dimension


@pytest.mark.parametrize("algorithm", ["swing_torus_bandwidth", "swing_torus_latency"])
@pytest.mark.parametrize("dims", [(4, 4, 4), (64,), (8, 8)])
def test_the_machine_names_the_grid_and_the_result_is_exact(dims, algorithm):
    machine = ringcoll.Machine.torus(dims, alpha=1e-6, beta=1 / 50e9, ports=2 * len(dims))
    sim = ringcoll.simulate("all_reduce", algorithm, 64, numel=6 * 64 + 5, op=R.BXOR, machine=machine)
    assert sim.plans[0].layout[GRID] == dims
    floats = [torch.randn(301, generator=torch.Generator().manual_seed(r)) for r in range(64)]
    bits = ringcoll.simulate("all_reduce", algorithm, 64, inputs=floats, machine=machine).outputs
    assert_equal_per_rank([out[0].view(torch.int32) for out in bits], [bits[0][0].view(torch.int32)] * 64,
                          f"{algorithm} dims {dims}: bits against rank 0's")
    # every message of the run crosses one dimension, rho(k) hops: on the machine's torus
    net = machine.network
    for rank, steps in enumerate(sim.schedules):
        for st in steps:
            for c in st.comms:
                if isinstance(c, Send):
                    path = net.route(rank, c.peer)
                    assert len({net.links[i].level for i in path}) == 1
    # placed at random, the machine's grid no longer says where ranks are: the default grid
    shuffled = ringcoll.Machine.torus(dims, placement=("random", 1))
    assert GRID not in ringcoll.simulate("all_reduce", algorithm, 64, numel=100, machine=shuffled,
                                         data=False).plans[0].layout.params


def test_four_ports_run_the_four_swings_at_once():
    """On an 8x8 torus with a port per direction the 4 Swings' messages of a step go together
    and beat the 1-D Swing and Rabenseifner at 16 MiB by more than 2x, with every link carrying
    the same bytes (Rabenseifner's busiest carries over 1.5x the mean); on one port they queue
    (the same bytes through one port), and one message per step gains nothing from ports."""
    link = dict(alpha=1e-6, beta=1 / 50e9, gamma=1 / 100e9, hop_latency=1e-7)
    times = {}
    for ports in (1, 4):
        machine = ringcoll.Machine.torus((8, 8), ports=ports, **link)
        for name in ("swing_torus_bandwidth", "swing_bandwidth", "rabenseifner"):
            sim = ringcoll.simulate("all_reduce", name, 64, numel=4 << 20, dtype=torch.float32, machine=machine,
                                    data=False)
            times[name, ports] = sim.stats.time
            if name == "swing_torus_bandwidth":
                # every directed link of the torus carries the same bytes (the paper's point)
                net = sim.stats.network
                assert net.used_links == len(machine.network.links)
                assert net.max_link_bytes == net.mean_link_bytes
            elif name == "rabenseifner":
                assert sim.stats.network.max_link_bytes > 1.5 * sim.stats.network.mean_link_bytes
    assert times["swing_torus_bandwidth", 4] < times["swing_torus_bandwidth", 1] / 2
    assert times["swing_torus_bandwidth", 4] * 2 < min(times["swing_bandwidth", 4], times["rabenseifner", 4])
    assert times["swing_bandwidth", 4] == times["swing_bandwidth", 1]     # one message per step


def group_on_torus(dims, numel, algorithm):
    import torch.distributed as dist

    machine = ringcoll.Machine.torus(dims)
    rank = dist.get_rank()
    saved = os.environ.get("RINGCOLL_ALGO")
    os.environ["RINGCOLL_ALGO"] = f"all_reduce={algorithm}"      # read at every call
    try:
        with ringcoll_log() as records:
            group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(machine=machine))
            mine = torch.arange(numel, dtype=torch.int64) * 7 + rank * 1000 + 1
            want = mine.clone()
            dist.all_reduce(want)                                   # gloo's
            dist.all_reduce(mine, group=group)
            floats = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
            dist.all_reduce(floats, group=group)
            # the drop-in on the same group sees the group's machine too
            again = torch.arange(numel, dtype=torch.int64) * 7 + rank * 1000 + 1
            ringcoll.all_reduce(again, group=group, algorithm=algorithm)
    finally:
        if saved is None:
            os.environ.pop("RINGCOLL_ALGO", None)
        else:
            os.environ["RINGCOLL_ALGO"] = saved
    dist.destroy_process_group(group)
    return torch.equal(mine, want) and torch.equal(again, want), floats.view(torch.int32).tolist(), records


@pytest.mark.parametrize("world,dims,algorithm", [(4, (4,), "swing_torus_bandwidth"),
                                                  (4, (2, 2), "swing_torus_bandwidth"),
                                                  (4, (4,), "swing_torus_latency"),
                                                  (4, (2, 2), "bucket_torus")])
def test_a_group_whose_machine_is_a_torus_runs_on_its_grid(clusters, world, dims, algorithm):
    """A ringcoll group whose Options(machine=) is a torus: its all_reduce, and the drop-in's on
    it, run Swing on that torus's grid (named in the log), give the built-in's sum and the same
    float bits everywhere."""
    numel = 4 * world + 3
    answers = clusters(world).run(group_on_torus, dims, numel, algorithm)
    for rank, (equal, bits, records) in enumerate(answers):
        assert equal, f"rank {rank}"
        assert bits == answers[0][1], f"rank {rank}: float result differs in bits from rank 0's"
        # this test's three calls (the NCCL-shaped transport's shim connects with a one-element
        # all_reduce of its own on the group)
        lines = [r for r in records if f"{algorithm} {numel}x" in r and " -> " in r]
        assert len(lines) == 3, records
        for line in lines:          # the backend's two calls and the drop-in's
            assert f"on the {'x'.join(map(str, dims))} grid of the machine" in line, line


def test_auto_on_a_four_port_torus_machine_weighs_the_torus_swings():
    """auto's model simulates the candidates on the machine it is given: on a 4-port 8x8 torus
    at 1 MiB the torus Swing is fastest; on the flat one-port machine neither torus form is
    chosen at that size (4x the messages through one port)."""
    from ringcoll import selection

    torus = ringcoll.Machine.torus((8, 8), alpha=1e-6, beta=1 / 50e9, hop_latency=1e-7, ports=4)
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 64, machine=torus)
    assert name == "swing_torus_bandwidth", why
    assert selection.choose("all_reduce", "auto", 1 << 20, 64, machine=ringcoll.Machine())[0] \
        not in ("swing_torus_bandwidth", "swing_torus_latency")
