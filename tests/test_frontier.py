"""The frontier algorithms (direct, Swing, Bine, PAT, 2-D torus, hierarchical): exact results
in the simulator at every world size, their closed-form costs against the port-limited
clock, node layouts; the built-in comparisons on gloo run in the collective's own test file,
which takes every registered algorithm."""
from __future__ import annotations

import functools

import pytest
import torch

import ringcoll
from ringcoll import registry
from ringcoll.bench.frontier_stats import port_time, schedules_of
from ringcoll.simulate import rank_data

R = ringcoll.ReduceOp
WORLDS = tuple(range(1, 18)) + (32, 64)
FRONTIER = {
    "all_reduce": ("direct", "swing_latency", "swing_bandwidth", "bine", "torus2d", "hierarchical"),
    "reduce_scatter": ("direct", "pat", "hierarchical"),
    "all_gather": ("direct", "pat", "hierarchical"),
    "broadcast": ("bine", "hierarchical"),
    "reduce": ("bine", "hierarchical"),
}
#: a machine whose α, β and γ are of the same order at the sizes below, so a wrong term shows
MACHINE = dict(alpha=5e-6, beta=1e-9, gamma=3e-10)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def numels(world):
    return sorted({0, 1, max(world - 1, 0), world + 1, 1000})


def xor_of(world, numel):
    return functools.reduce(torch.bitwise_xor, [rank_data(r, numel) for r in range(world)])


def params_for(collective, world):
    return {"root": world // 2} if collective in ("broadcast", "reduce") else {}


def simulated(collective, algorithm, world, numel, **kwargs):
    """Each rank's result of ``collective`` on rank_data inputs (block numel for the list-style
    collectives), and the exact expectation."""
    if collective == "all_reduce":
        sim = ringcoll.simulate("all_reduce", algorithm, world, numel=numel, op=R.BXOR, **kwargs)
        return [out[0] for out in sim.outputs], [xor_of(world, numel)] * world
    if collective == "reduce_scatter":
        full = [rank_data(r, world * numel) for r in range(world)]
        sim = ringcoll.simulate("reduce_scatter_tensor", algorithm, world, op=R.BXOR,
                                call=lambda r: ((torch.zeros(numel, dtype=torch.int64), full[r]), {}), **kwargs)
        total = functools.reduce(torch.bitwise_xor, full)
        return [out[0] for out in sim.outputs], [total[r * numel:(r + 1) * numel] for r in range(world)]
    if collective == "all_gather":
        sim = ringcoll.simulate("all_gather_into_tensor", algorithm, world,
                                call=lambda r: ((torch.zeros(world * numel, dtype=torch.int64),
                                                 rank_data(r, numel) * (r + 3)), {}), **kwargs)
        want = torch.cat([rank_data(r, numel) * (r + 3) for r in range(world)])
        return [torch.cat([v.reshape(-1) for v in out]) if numel else want[:0] for out in sim.outputs], [want] * world
    root = world // 2
    if collective == "broadcast":
        sim = ringcoll.simulate("broadcast", algorithm, world, numel=numel, src=root, **kwargs)
        return [out[0] for out in sim.outputs], [rank_data(root, numel)] * world
    sim = ringcoll.simulate("reduce", algorithm, world, numel=numel, dst=root, op=R.BXOR, **kwargs)
    return [sim.outputs[root][0]], [xor_of(world, numel)]


CASES = [(c, a) for c, names in FRONTIER.items() for a in names]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_exact_at_every_world_and_size(collective, algorithm):
    for world in WORLDS:
        for numel in numels(world):
            got, want = simulated(collective, algorithm, world, numel)
            for rank, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), f"{collective}/{algorithm} world {world} numel {numel} rank {rank}"


@pytest.mark.parametrize("algorithm", FRONTIER["all_reduce"])
@pytest.mark.parametrize("world", [3, 6, 8, 12, 16])
def test_float_all_reduce_bitwise_identical(algorithm, world):
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    sim = ringcoll.simulate("all_reduce", algorithm, world, inputs=inputs)
    torch.testing.assert_close(sim.outputs[0][0], sum(inputs), rtol=1e-5, atol=1e-5)
    for rank, (got,) in enumerate(sim.outputs):
        assert torch.equal(got.view(torch.int32), sim.outputs[0][0].view(torch.int32)), f"rank {rank}"


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_closed_form_equals_the_port_clock(collective, algorithm):
    """Every rank has one send and one receive port: the registered cost, evaluated on a
    machine, equals the time of the schedules on that clock (sizes divisible by p)."""
    for world in WORLDS:
        numel = world * 96
        schedules = schedules_of(collective, algorithm, world, numel, params_for(collective, world))
        clock, _ = port_time(schedules, 4, **MACHINE)
        model = registry.get(collective, algorithm).cost(world, numel * 4).time(*MACHINE.values())
        assert clock == pytest.approx(model, rel=1e-9, abs=1e-15), f"{collective}/{algorithm} world {world}"


def test_docstrings_state_schedule_cost_and_source():
    for collective, names in FRONTIER.items():
        for name in names:
            doc = registry.get(collective, name).doc
            assert "Cost:" in doc and len(doc) > 200, f"{collective}/{name}"


def test_swing_pairs_nest_and_bine_trees_span():
    from ringcoll.schedules.bine import bine_tree
    from ringcoll.schedules.swing import swing_blocks, swing_peer

    assert [swing_peer(0, s, 1024) for s in range(5)] == [1, 1023, 3, 1019, 11]
    for k in range(1, 11):
        blocks = swing_blocks(1 << k)
        assert sorted(b[-1] for b in blocks) == [(i, i + 1) for i in range(1 << k)]
    for world in range(1, 300):
        parent, _ = bine_tree(world)
        for vrank in range(world):          # every vrank reaches the root
            seen, up = 0, vrank
            while parent[up] is not None:
                up, seen = parent[up], seen + 1
                assert seen <= world
            assert up == 0


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("segment_bytes", [8, 24, 100000])
def test_pat_bounds_its_aggregation(monkeypatch, collective, segment_bytes):
    """Blocks of 8 bytes (int64), segments of 1, 3 or many blocks: exact, and the messages
    and the time are what the closed form says."""
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(segment_bytes))
    per_message = max(1, segment_bytes // 8)
    for world in (2, 5, 8, 13, 16):
        got, want = simulated(collective, "pat", world, 1)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"world {world}"
        schedules = schedules_of(collective, "pat", world, world * 2, {"segment": per_message * 2})
        clock, _ = port_time(schedules, 4, **MACHINE)
        cost = registry.get(collective, "pat").cost(world, world * 8)
        assert clock == pytest.approx(cost.time(*MACHINE.values()), rel=1e-9)
        messages = sum(len([c for c in st.comms if type(c).__name__ == "Send"]) for st in schedules[0])
        assert messages == cost.alpha
        if per_message == 1:
            assert messages == world - 1
        elif per_message > world:
            assert messages == (world - 1).bit_length()


HIERARCHICAL = [c for c, names in FRONTIER.items() if "hierarchical" in names]


@pytest.mark.parametrize("collective", HIERARCHICAL)
@pytest.mark.parametrize("local_size", [1, 2, 3, 4, 5])
def test_hierarchical_even_and_uneven_nodes(collective, local_size):
    """Nodes of local_size consecutive ranks, the last one smaller when it does not divide p."""
    for world in tuple(range(1, 18)) + (32,):
        for numel in numels(world):
            got, want = simulated(collective, "hierarchical", world, numel, local_size=local_size)
            for rank, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), f"{collective} L={local_size} world {world} numel {numel} rank {rank}"


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_nodes_of_scattered_ranks(collective):
    """Nodes as hostname grouping may give them: ranks interleaved, sizes 3, 2 and 1 ... ."""
    for nodes in [(0, 1, 0, 1, 0, 2), (2, 2, 1, 0, 1, 2, 0), (0, 1, 2, 3, 0), (1, 0)]:
        world = len(nodes)
        for numel in (1, world + 2, 1000):
            got, want = simulated(collective, "hierarchical", world, numel, local_size=nodes)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{collective} nodes {nodes} numel {numel}"


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_cost_equals_the_port_clock(monkeypatch, collective):
    from ringcoll.topology import even_nodes

    for local_size in (2, 4):
        monkeypatch.setenv("RINGCOLL_LOCAL_SIZE", str(local_size))
        for world in (4, 8, 12, 16, 32):
            numel = world * 96
            params = {**params_for(collective, world), "nodes": even_nodes(world, local_size)}
            clock, _ = port_time(schedules_of(collective, "hierarchical", world, numel, params), 4, **MACHINE)
            model = registry.get(collective, "hierarchical").cost(world, numel * 4).time(*MACHINE.values())
            assert clock == pytest.approx(model, rel=1e-9), f"{collective} L={local_size} world {world}"


def test_torus_grid():
    from ringcoll.schedules.hierarchical import torus_grid

    assert [torus_grid(p) for p in (1, 2, 6, 12, 16, 17, 64, 1024)] == \
        [(1, 1), (2, 1), (3, 2), (4, 3), (4, 4), (17, 1), (8, 8), (32, 32)]
    assert ringcoll.simulate("all_reduce", "torus2d", 12, numel=120).stats.steps == 2 * (4 - 1) + 2 * (3 - 1)
