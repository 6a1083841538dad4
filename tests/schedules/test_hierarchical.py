"""The node-aware algorithms (``hierarchical`` of every collective that has one) on node
layouts: even and uneven nodes, nodes of scattered ranks, their cost against the port clock,
the layouts' checks and the cost models' L, the 2-level machine where hierarchical wins and
where it does not; and every algorithm beyond rings and trees against the built-ins on gloo,
on one node and on emulated nodes."""
from __future__ import annotations

import os

import pytest
import torch

import ringcoll
from _util import COST_MACHINE, assert_equal_per_rank, block_numels, cost_only, exact_results, one_thread  # noqa: F401
from ringcoll.schedules import registry

R = ringcoll.ReduceOp
NODE_AWARE = [c for c, names in registry.algorithms().items() if "hierarchical" in names]


@pytest.mark.parametrize("collective", NODE_AWARE)
@pytest.mark.parametrize("local_size", [1, 3, 4])
def test_even_and_uneven_nodes(collective, local_size):
    """Nodes of local_size consecutive ranks, the last one smaller when it does not divide p."""
    for world in range(1, 18):
        for numel in block_numels(world):
            got, want = exact_results(collective, "hierarchical", world, numel, local_size=local_size)
            assert_equal_per_rank(got, want, f"{collective} L={local_size} world {world} numel {numel}")


@pytest.mark.parametrize("collective", NODE_AWARE)
def test_nodes_of_scattered_ranks(collective):
    """Nodes as hostname grouping may give them: ranks interleaved, sizes 3, 2 and 1 ... ."""
    for nodes in [(0, 1, 0, 1, 0, 2), (2, 2, 1, 0, 1, 2, 0), (0, 1, 2, 3, 0), (1, 0)]:
        world = len(nodes)
        for numel in (1, world + 2, 1000):
            got, want = exact_results(collective, "hierarchical", world, numel, local_size=nodes)
            assert_equal_per_rank(got, want, f"{collective} nodes {nodes} numel {numel}")


@pytest.mark.parametrize("collective", NODE_AWARE)
def test_cost_equals_the_port_clock(monkeypatch, collective):
    roots = {"broadcast": "src", "reduce": "dst"}
    for local_size in (2, 4):
        monkeypatch.setenv("RINGCOLL_LOCAL_SIZE", str(local_size))         # registry.model reads it
        for world in (4, 8, 12, 16, 32):
            numel = world * 96
            root = {roots[collective]: world // 2} if collective in roots else {}
            clock = cost_only(collective, "hierarchical", world, numel, local_size=local_size, **root).stats.time
            model = registry.model(registry.get(collective, "hierarchical"), world, numel * 4)
            assert clock == pytest.approx(model.time(*COST_MACHINE.values()), rel=1e-9), \
                f"{collective} L={local_size} world {world}"


def test_bad_local_size_is_refused(plain_env):
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "two")
    with pytest.raises(ValueError, match="RINGCOLL_LOCAL_SIZE='two' is not valid: RINGCOLL_LOCAL_SIZE accepts a positive integer \\(ranks per node\\)"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8)
    plain_env.delenv("RINGCOLL_LOCAL_SIZE")
    with pytest.raises(ValueError, match="local_size must be a positive int, got 0"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8, local_size=0)
    with pytest.raises(ValueError, match="must give the node of each of the 4 ranks, got 3"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8, local_size=(0, 0, 1))


def test_model_local_size_of_node_layouts(plain_env):
    """The cost models' L of a node layout: the ranks per node, the last rank's node allowed
    fewer (nodes of L consecutive ranks); simulate's cost takes it, not the environment's."""
    from ringcoll.runtime.nodes import even_nodes, model_local_size

    assert model_local_size(None) is None
    assert [model_local_size(even_nodes(p, 4)) for p in (3, 4, 10, 12)] == [3, 4, 4, 4]
    assert model_local_size((0, 1, 0, 1)) == 2                  # equal nodes, ranks interleaved
    assert model_local_size((0, 0, 1, 1, 1)) is None            # the last node holds more
    assert model_local_size((0, 1, 0, 1, 0, 2)) is None         # nodes of 3, 2 and 1
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "2")
    algorithm = registry.get("all_reduce", "hierarchical")
    sim = ringcoll.simulate("all_reduce", "hierarchical", 8, numel=96, data=False, local_size=3)
    layout = ringcoll.simulate("all_reduce", "hierarchical", 8, numel=96, data=False,
                               local_size=(0, 0, 0, 1, 1, 1, 2, 2))
    assert sim.cost == layout.cost                              # L = 3 given, or read off the nodes
    assert sim.cost != registry.model(algorithm, 8, 96 * 8)     # not the environment's L = 2


# -- a 2-level machine: where hierarchical wins, and where it does not -------------------------
def test_hierarchical_wins_on_two_levels_as_the_formulas_predict():
    """The study map's machine (bench/study_2level.py): nodes of L = 4, intra (αi, βi), inter
    (αo, βo) through one NIC port per node. With N = p / L nodes:
    flat ring: every step pays the slow link, one message per NIC at a time:
        2(p-1)(αo + n/p·βo) + (p-1)/p·nγ;
    hierarchical: rings inside (L-1 steps each way), then the N-node ring of each rank's
    n/L shard, the NIC carrying the node's L messages of each of its 2(N-1) steps one after
    another (which hides the inter-node reductions):
        2(L-1)(αi + n/L·βi) + (L-1)/L·nγ + 2(N-1)·L·(αo + n/(NL)·βo);
    Rabenseifner far first (``rabenseifner_far``): its first and last steps (distance p/2) send
    n/2 from all L ranks of a node through one NIC: at least 2L(αo + n/2·βo). In MPICH's order
    (``rabenseifner``) the halves of n/2 .. n/L stay inside the node and the first step between
    nodes (distance L) sends n/(2L) from each of the L ranks: at least 2L(αo + n/(2L)·βo).
    At p = 16 and 16 MiB hierarchical beats the ring and far-first Rabenseifner (MPICH's order
    comes within a few per cent of it: 3.19 against 3.27 ms); at p = 4 (one node) it is the
    ring and Rabenseifner beats it; at p = 64 and 4 KiB Rabenseifner's 2 lg p steps beat its
    2(L+N-2)."""
    from experiments.study_2level import MACHINE

    L = MACHINE.ranks_per_node
    ai, bi, ao, bo, g = MACHINE.alpha, MACHINE.beta, MACHINE.inter_alpha, MACHINE.inter_beta, MACHINE.gamma

    def simulated(name, world, n):
        return ringcoll.simulate("all_reduce", name, world, numel=n // 4, dtype=torch.float32, data=False,
                                 record=False, machine=MACHINE, local_size=L).stats.time

    def ring(p, n):
        hop = (ao, bo) if p > L else (ai, bi)
        return 2 * (p - 1) * (hop[0] + n / p * hop[1]) + (p - 1) / p * n * g

    def hierarchical(p, n):
        nodes = p // L
        return 2 * (L - 1) * (ai + n / L * bi) + (L - 1) / L * n * g + 2 * (nodes - 1) * L * (ao + n / p * bo)

    p, n = 16, 16 << 20
    assert simulated("ring", p, n) == pytest.approx(ring(p, n), rel=1e-9)
    assert simulated("hierarchical", p, n) == pytest.approx(hierarchical(p, n), rel=1e-9)
    assert simulated("rabenseifner_far", p, n) >= 2 * L * (ao + n / 2 * bo)
    assert simulated("rabenseifner", p, n) >= 2 * L * (ao + n / (2 * L) * bo)
    assert hierarchical(p, n) < ring(p, n) and hierarchical(p, n) < 2 * L * (ao + n / 2 * bo)
    assert simulated("rabenseifner", p, n) < simulated("rabenseifner_far", p, n) / 3
    # one node: hierarchical is the ring, and the ring loses to Rabenseifner
    p, n = L, 1 << 20
    assert simulated("hierarchical", p, n) == pytest.approx(ring(p, n), rel=1e-9)
    assert simulated("hierarchical", p, n) > simulated("rabenseifner", p, n)
    # many nodes, small message: latency decides
    p, n = 64, 4096
    assert simulated("hierarchical", p, n) > simulated("rabenseifner", p, n)


# -- real gloo ranks against the built-ins ------------------------------------------------------
def gloo_values(rank, numel, dtype):
    raw = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1
    if dtype.is_floating_point:
        return (raw.to(torch.float64) * (0.5 if rank % 2 else -0.25) + 0.1 * rank).to(dtype)
    return raw.to(dtype)


#: the algorithms beyond rings and trees, by collective: those in the registry's newer bands
#: (preference 10 and up) and those ``auto`` never picks (the far-first and near-first orders)
NEWER = {c: [n for n in names if registry.get(c, n).preference is not None
             and (registry.get(c, n).preference >= 10 or not registry.get(c, n).auto)]
         for c, names in registry.algorithms().items()}


def compare_newer_with_builtin(local_size):
    """Every newer algorithm of every collective against torch.distributed on this rank;
    returns the problems and the bits of the replicated results (equal on every rank)."""
    import torch.distributed as dist

    if local_size:
        os.environ["RINGCOLL_LOCAL_SIZE"] = str(local_size)
    rank, world = dist.get_rank(), dist.get_world_size()
    problems, bits = [], []
    cases = [(torch.int64, R.SUM, world + 1), (torch.float32, R.SUM, 1000), (torch.bfloat16, R.MAX, 7),
             (torch.float64, R.AVG, 1)]
    try:
        for dtype, op, numel in cases:
            tag = f"{dtype} {op} numel {numel}"
            for name in NEWER["all_reduce"]:
                got, want = gloo_values(rank, numel, dtype), gloo_values(rank, numel, dtype)
                ringcoll.all_reduce(got, op=op, algorithm=name)
                dist.all_reduce(want, op=op)
                if not torch.allclose(got.double(), want.double(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-5):
                    problems.append(f"all_reduce/{name} {tag}")
                bits.append(got.view(torch.uint8).numpy().tobytes())
            for name in NEWER["all_gather"]:
                tensor = gloo_values(rank, numel, dtype)
                got, want = torch.zeros(world * numel, dtype=dtype), torch.zeros(world * numel, dtype=dtype)
                ringcoll.all_gather_into_tensor(got, tensor, algorithm=name)
                dist.all_gather_into_tensor(want, tensor)
                if not torch.equal(got, want):
                    problems.append(f"all_gather/{name} {tag}")
            if dtype != torch.bfloat16:        # gloo's reduce_scatter_tensor has no bfloat16 MAX
                for name in NEWER["reduce_scatter"]:
                    full = gloo_values(rank, world * numel, dtype)
                    got, want = torch.zeros(numel, dtype=dtype), torch.zeros(numel, dtype=dtype)
                    ringcoll.reduce_scatter_tensor(got, full, op=op, algorithm=name)
                    dist.reduce_scatter_tensor(want, full.clone(), op=op)
                    if not torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-5):
                        problems.append(f"reduce_scatter/{name} {tag}")
            root = world - 1
            for name in NEWER["broadcast"]:
                got = gloo_values(rank, numel, dtype)
                ringcoll.broadcast(got, src=root, algorithm=name)
                if not torch.equal(got, gloo_values(root, numel, dtype)):
                    problems.append(f"broadcast/{name} {tag}")
            if op != R.AVG:
                for name in NEWER["reduce"]:
                    got, want = gloo_values(rank, numel, dtype), gloo_values(rank, numel, dtype)
                    ringcoll.reduce(got, dst=root, op=op, algorithm=name)
                    dist.reduce(want, dst=root, op=op)
                    if rank == root and not torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-5):
                        problems.append(f"reduce/{name} {tag}")
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
    return problems, bits


@pytest.mark.parametrize("world,local_size", [(3, None), (4, 2), (5, 2)])
def test_matches_builtin_on_gloo(clusters, world, local_size):
    """Worlds 3 (odd, a prime: torus2d is the ring), 4 on two emulated nodes of 2, 5 on
    uneven nodes (2, 2, 1)."""
    answers = clusters(world).run(compare_newer_with_builtin, local_size)
    for rank, (problems, _) in enumerate(answers):
        assert not problems, f"rank {rank}: {problems[:6]}"
    for rank, (_, bits) in enumerate(answers):
        assert bits == answers[0][1], f"rank {rank}'s all_reduce results differ in bits from rank 0's"
