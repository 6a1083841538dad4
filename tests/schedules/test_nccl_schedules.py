"""NCCL's own algorithms as ringcoll schedules (``nccl_ring`` of every collective: a ring per
channel, each leaving its node from another rank; ``nccl_tree``: a chain inside each node
under NCCL's double binary tree over the nodes; ``nccl_pat``: PAT with NCCL's chunking):
exact in the simulator on even and uneven nodes, their declared costs the clock's on a flat
machine with channels, the rings, chains and trees they are built on, and against gloo's
built-ins at 3, 4 and 5 ranks with sizes 0, 1, below the world and not divisible (also in
tests/schedules/test_hierarchical.py, with every newer algorithm, on other sizes and dtypes)."""
from __future__ import annotations

import os

import pytest
import torch

import ringcoll
from _util import COST_MACHINE, assert_equal_per_rank, block_numels, cost_only, exact_results, one_thread  # noqa: F401
from ringcoll.api._calls import rank_data
from ringcoll.schedules import registry

#: every NCCL schedule, by collective
NCCL = {c: [n for n in names if n.startswith("nccl_")] for c, names in registry.algorithms().items()}
ROOTED = ("broadcast", "reduce")


@pytest.mark.parametrize("algorithm", ["nccl_ring", "nccl_tree"])
@pytest.mark.parametrize("local_size", [1, 2, 3, 4])
def test_nccl_algorithms_exact_on_nodes(algorithm, local_size):
    for world in range(1, 14):
        for numel in block_numels(world):
            got, want = exact_results("all_reduce", algorithm, world, numel, local_size=local_size)
            assert_equal_per_rank(got, want, f"{algorithm} world {world} nodes of {local_size} numel {numel}")


def test_nccl_channel_rings_and_trees():
    """The channels' rings leave each node from a different rank; the tree is a chain per
    node whose first rank sits in NCCL's double binary tree over the nodes."""
    from ringcoll.schedules.nccl import channel_rings, nccl_tree_pipeline, nccl_trees

    assert channel_rings((0, 0, 0)) == [(0, 1, 2)]
    assert channel_rings((0, 0, 1, 1)) == [(0, 1, 2, 3), (1, 0, 3, 2)]
    first, second = nccl_trees((0, 0, 1, 1, 2, 2))
    # nodes 0, 1, 2: NCCL's btree over 3 nodes has node 0 on top with child 2, node 2 above 1
    assert first.parent == (None, 0, 4, 2, 0, 4)
    assert [first.children[r] for r in (0, 4)] == [(1, 4), (5, 2)]
    assert second.parent[0] is not None or second.parent[2] is not None     # another top
    # channel pair 1: each node's chain from its second rank on, the same trees over the nodes
    first, _ = nccl_trees((0, 0, 1, 1, 2, 2), 1)
    assert first.parent == (1, None, 3, 5, 5, 1)
    assert [first.children[r] for r in (1, 5)] == [(0, 5), (4, 3)]
    # C channel pairs, each tree up then down: 2 on nodes of 2, 1 on one node
    assert len(nccl_tree_pipeline((0, 0, 1, 1, 2, 2)).phases) == 8 and len(nccl_tree_pipeline((0, 0, 0)).phases) == 4


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "broadcast", "reduce"])
@pytest.mark.parametrize("local_size", [1, 2, 3, 4])
def test_nccl_ring_of_every_collective_exact_on_nodes(collective, local_size):
    """Channels as nccl_ring all_reduce's (one on a node, L on nodes of L, the last node
    smaller where L does not divide p): every block (or the root's vector) exact."""
    for world in range(1, 12):
        for numel in block_numels(world):
            got, want = exact_results(collective, "nccl_ring", world, numel, local_size=local_size)
            assert_equal_per_rank(got, want,
                                  f"{collective}/nccl_ring world {world} nodes of {local_size} numel {numel}")


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "broadcast", "reduce"])
def test_nccl_ring_on_nodes_of_scattered_ranks(collective):
    for nodes in [(0, 1, 0, 1, 0, 2), (2, 2, 1, 0, 1, 2, 0), (1, 0)]:
        for numel in (1, len(nodes) + 2, 1000):
            got, want = exact_results(collective, "nccl_ring", len(nodes), numel, local_size=nodes)
            assert_equal_per_rank(got, want, f"{collective} nodes {nodes} numel {numel}")


@pytest.mark.parametrize("collective,algorithm", [(c, n) for c in ("all_reduce", "all_gather", "reduce_scatter",
                                                                    "broadcast", "reduce") for n in NCCL[c]])
def test_declared_cost_is_the_clock_with_channels(monkeypatch, collective, algorithm):
    """On the flat machine with the ranks on nodes of L (L channels for nccl_ring, L channel
    pairs for nccl_tree, sharing the rank's one port): the declared cost, given L, is the
    clock's time (the trees' within their 1 %, tests/sim/test_study.py), with one segment
    per channel's chunk and with several."""
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(64 * 1024))
    machine = ringcoll.Machine()
    tolerance = 0.01 if algorithm == "nccl_tree" else 1e-9
    for local_size in (2, 3, 4):
        for world in (4, 6, 8, 12):
            if world % local_size:
                continue
            for blocks in (1, 4, 128):
                numel = world * local_size * 64 * blocks
                sim = ringcoll.simulate(registry.builder_of(collective), algorithm, world, numel=numel, data=False,
                                        machine=machine, record=False, local_size=local_size)
                assert sim.cost.on(machine) == pytest.approx(sim.stats.time, rel=tolerance), \
                    f"{collective}/{algorithm} world {world} nodes of {local_size} {numel * 8} B: cost {sim.cost}"


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("segment_bytes", [8, 24, 56, 100000])
def test_nccl_pat_runs_a_round_per_slice(monkeypatch, collective, segment_bytes):
    """NCCL's PAT: blocks cut into slices of a segment, a PAT round per slice, A the largest
    power of two of slices a segment holds: exact at every size, and per round the messages
    PAT's closed form gives (blocks of 2 float32 in segments of 1, 3, 7 slots: A = 1, 2, 4,
    or all); blocks of 14 float32 in 8- and 24-byte segments make 7 and 3 slices, as many rounds."""
    monkeypatch.setenv("RINGCOLL_SEGMENT_FLOOR", "1")
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(segment_bytes))
    for world in (1, 2, 3, 5, 8, 13):
        for numel in sorted({0, 1, max(world - 1, 0), world + 1, 7}):
            got, want = exact_results(collective, "nccl_pat", world, numel)
            assert_equal_per_rank(got, want,
                                  f"{collective}/nccl_pat segment {segment_bytes} B world {world} numel {numel}")
    per_message = 1 << (max(1, segment_bytes // 8).bit_length() - 1)
    for world in (2, 5, 8, 13):
        sim = cost_only(collective, "nccl_pat", world, world * 2)
        cost = registry.model(registry.get(collective, "nccl_pat"), world, world * 8, segment=segment_bytes)
        assert sim.stats.time == pytest.approx(cost.time(*COST_MACHINE.values()), rel=1e-9), f"world {world}"
        steps = [-(-len(range(0, world - d, 2 * d)) // per_message) for d in (1, 2, 4, 8) if d < world]
        assert sim.stats.ranks[0].messages == cost.alpha == sum(steps), f"world {world}"
        sliced = cost_only(collective, "nccl_pat", world, world * 14)          # 56-byte blocks
        rounds = -(-56 // segment_bytes)
        cost = registry.model(registry.get(collective, "nccl_pat"), world, world * 56, segment=segment_bytes)
        assert sliced.stats.time == pytest.approx(cost.time(*COST_MACHINE.values()), rel=1e-9), f"world {world}"
        # 56-byte blocks in segments of 8, 24, 56 B: 7, 3, 1 rounds of one slice a message
        # (slices of 8, 20, 56 B); in 100000-byte segments one round, all of a step's blocks a message
        want = rounds * (world - 1) if segment_bytes <= 56 else (world - 1).bit_length()
        assert sliced.stats.ranks[0].messages == cost.alpha == want, f"world {world}"


def test_nccl_chains_run_round_each_channels_ring_from_or_to_the_root():
    """Broadcast: from the root round its ring; reduce: from the root's right round to the
    root; on two nodes of 2 one chain per channel ring."""
    from ringcoll.schedules.nccl import nccl_chains

    down = nccl_chains((0, 0, 1, 1), 1, False)
    # channel 0's ring 0 1 2 3: 1 -> 2 -> 3 -> 0; channel 1's ring 1 0 3 2: 1 -> 0 -> 3 -> 2
    assert [tree.parent for tree, _, _ in down.phases] == [(3, None, 1, 2), (1, None, 3, 0)]
    up = nccl_chains((0, 0, 1, 1), 1, True)
    # channel 0's ring 0 1 2 3: 2 -> 3 -> 0 -> 1; channel 1's ring 1 0 3 2: 0 -> 3 -> 2 -> 1
    assert [tree.parent for tree, _, _ in up.phases] == [(1, None, 3, 0), (3, None, 1, 2)]
    assert all(phase[1] for phase in up.phases) and not any(phase[1] for phase in down.phases)


def compare_nccl_with_builtin(local_size):
    """Every NCCL schedule against torch.distributed and the exact result on this rank, on
    int64 data that is never zero; returns the problems."""
    import torch.distributed as dist

    if local_size:
        os.environ["RINGCOLL_LOCAL_SIZE"] = str(local_size)
    rank, world = dist.get_rank(), dist.get_world_size()
    root, problems = world - 1, []
    try:
        for numel in (0, 1, world - 1, world + 1, 1000):
            data = rank_data(rank, numel)
            total = sum(rank_data(r, numel) for r in range(world))
            full = [rank_data(r, world * numel) for r in range(world)]
            cases = {
                "all_reduce": lambda name: _run(ringcoll.all_reduce, dist.all_reduce, data.clone(), name),
                "all_gather": lambda name: _gather(data, world, name),
                "reduce_scatter": lambda name: _scatter(full[rank], numel, name),
                "broadcast": lambda name: _run(ringcoll.broadcast, dist.broadcast, data.clone(), name, root),
                "reduce": lambda name: _run(ringcoll.reduce, dist.reduce, data.clone(), name, root),
            }
            wants = {"all_reduce": total, "all_gather": torch.cat([rank_data(r, numel) for r in range(world)]),
                     "reduce_scatter": sum(full)[rank * numel:(rank + 1) * numel], "broadcast": rank_data(root, numel),
                     "reduce": total if rank == root else None}
            for collective, run in cases.items():
                for name in NCCL[collective]:
                    got, builtin = run(name)
                    want = wants[collective]
                    if want is not None and not (torch.equal(got, want) and torch.equal(builtin, want)):
                        problems.append(f"{collective}/{name} numel {numel}: {got[:6].tolist()} against "
                                        f"{want[:6].tolist()} (built-in {builtin[:6].tolist()})")
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
    return problems


def _run(ours, builtin, tensor, name, root=None):
    """``ours`` and ``builtin`` on copies of ``tensor`` (rooted at ``root``): both results."""
    theirs = tensor.clone()
    if root is None:
        ours(tensor, algorithm=name)
        builtin(theirs)
    else:
        ours(tensor, root, algorithm=name)
        builtin(theirs, root)
    return tensor, theirs


def _gather(tensor, world, name):
    import torch.distributed as dist

    got, want = (torch.zeros(world * tensor.numel(), dtype=tensor.dtype) for _ in (0, 1))
    ringcoll.all_gather_into_tensor(got, tensor, algorithm=name)
    dist.all_gather_into_tensor(want, tensor)
    return got, want


def _scatter(full, numel, name):
    import torch.distributed as dist

    got, want = torch.zeros(numel, dtype=full.dtype), torch.zeros(numel, dtype=full.dtype)
    ringcoll.reduce_scatter_tensor(got, full, algorithm=name)
    dist.reduce_scatter_tensor(want, full.clone())
    return got, want


@pytest.mark.parametrize("world,local_size", [(3, None), (4, 2), (5, 2)])
def test_nccl_schedules_match_the_builtins_on_gloo(clusters, world, local_size):
    """Worlds 3 (one node: one channel), 4 on two emulated nodes of 2 (two channels, two
    tree channel pairs), 5 on uneven nodes (2, 2, 1)."""
    answers = clusters(world).run(compare_nccl_with_builtin, local_size)
    for rank, problems in enumerate(answers):
        assert not problems, f"rank {rank}: {problems[:6]}"
