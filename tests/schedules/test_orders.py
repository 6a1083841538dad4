"""The orders of the steps as the algorithms' authors wrote them: Bine's distance-halving tree
(the Bine authors' ``MPIR_Bcast_intra_bine_lat``), Rabenseifner's distance-doubling
reduce-scatter (MPICH's ``MPIR_Allreduce_intra_reduce_scatter_allgather`` and
``MPIR_Reduce_intra_reduce_scatter_gather``), Swing's peers and
steps (De Sensi et al., NSDI'24); the earlier orders under their own names."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import one_thread  # noqa: F401 - the simulator runs on one thread
from ringcoll.schedules.vocabulary import Send

R = ringcoll.ReduceOp


def sends(sim, rank):
    """The peers of ``rank``'s sends, in the order its schedule posts them."""
    return [c.peer for st in sim.schedules[rank] for c in st.comms if isinstance(c, Send)]


def ring_hop_bytes(stats, world):
    """Bytes times shortest ring distance, summed over every link."""
    return sum(min((d - s) % world, (s - d) % world) * n for (s, d), n in stats.links.items())


def test_bine_tree_is_the_authors_distance_halving_order():
    from ringcoll.schedules.bine import bine_tree, bine_tree_near, distance_sum

    tree = bine_tree(64)
    assert tree[1][0] == (43, 11, 59, 3, 63, 1)           # far partner first
    assert distance_sum(tree, 64) == 135                  # binomial: 192
    binomial = (None,) + tuple(v & (v - 1) for v in range(1, 64))
    assert distance_sum((binomial, None), 64) == 192
    assert bine_tree_near(64)[1][0] == (1, 63, 3, 59, 11, 43) and distance_sum(bine_tree_near(64), 64) == 903
    # MPICH's non-power-of-two rule: vrank pof2 + v hangs below vrank v, served last
    parent, children = bine_tree(6)
    assert (parent[4], parent[5]) == (0, 1) and children[0][-1] == 4 and children[1][-1] == 5
    # the schedule runs it: the root's sends in that order, moved by the root
    sim = ringcoll.simulate("broadcast", "bine", 64, numel=5, src=3)
    assert sends(sim, 3) == [(c + 3) % 64 for c in (43, 11, 59, 3, 63, 1)]
    assert sends(ringcoll.simulate("broadcast", "bine_near", 64, numel=5, src=0), 0) == [1, 63, 3, 59, 11, 43]


@pytest.mark.parametrize("world", [3, 5, 6, 7, 12, 64])
def test_bine_reduce_receives_near_partner_first_and_is_exact(world):
    sim = ringcoll.simulate("reduce", "bine", world, numel=world + 1, dst=1, op=R.BXOR)
    from ringcoll.schedules.bine import bine_tree
    _, children = bine_tree(world)
    got = [c.peer for st in sim.schedules[1] for c in st.comms if not isinstance(c, Send)]
    assert got == [(c + 1) % world for c in reversed(children[0])]


def test_rabenseifner_is_mpichs_distance_doubling_and_the_far_order_keeps_its_name():
    near = ringcoll.simulate("all_reduce", "rabenseifner", 64, numel=64 * 16)
    far = ringcoll.simulate("all_reduce", "rabenseifner_far", 64, numel=64 * 16)
    assert sends(near, 0) == [1, 2, 4, 8, 16, 32, 32, 16, 8, 4, 2, 1]
    assert sends(far, 0) == [32, 16, 8, 4, 2, 1, 1, 2, 4, 8, 16, 32]
    assert sends(near, 5) == [5 ^ d for d in (1, 2, 4, 8, 16, 32, 32, 16, 8, 4, 2, 1)]
    # the same α-β-γ cost and clock, far fewer hop-bytes on a ring (3n against 21.3n per rank)
    assert near.stats.time == far.stats.time and near.cost == far.cost
    assert ring_hop_bytes(far.stats, 64) > 7 * ring_hop_bytes(near.stats, 64)
    assert not ringcoll.schedules.registry.get("all_reduce", "rabenseifner_far").auto


def test_reduce_rabenseifner_is_mpichs_distance_doubling_and_the_far_order_keeps_its_name():
    """MPICH's MPIR_Reduce_intra_reduce_scatter_gather: reduce-scatter at distances 1 .. 32,
    then the gather at 32 .. 1 (a rank sends once, at the bit where it leaves the root's side)."""
    # dst 63: w = (rank - dst - 1) % 64 is the rank itself, the root its folded rank 63
    near = ringcoll.simulate("reduce", "rabenseifner", 64, numel=64 * 16, dst=63)
    far = ringcoll.simulate("reduce", "rabenseifner_far", 64, numel=64 * 16, dst=63)
    assert sends(near, 0) == [1, 2, 4, 8, 16, 32, 32]     # 0 xor 63 has bit 32: sends its one chunk first
    assert sends(far, 0) == [32, 16, 8, 4, 2, 1, 1]
    assert sends(near, 62) == [62 ^ d for d in (1, 2, 4, 8, 16, 32)] + [63]     # n/2 to its neighbour, last
    receives = [c.peer for st in near.schedules[63] for c in st.comms if not isinstance(c, Send)]
    assert receives == [63 ^ d for d in (1, 2, 4, 8, 16, 32)] + [63 ^ d for d in (32, 16, 8, 4, 2, 1)]
    # the same α-β-γ cost and clock; on a ring of 64 hop-bytes 223.5n against 1396.5n
    assert near.stats.time == far.stats.time and near.cost == far.cost
    assert ring_hop_bytes(near.stats, 64) == 223.5 * 1024 * 8 and ring_hop_bytes(far.stats, 64) == 1396.5 * 1024 * 8
    assert not ringcoll.schedules.registry.get("reduce", "rabenseifner_far").auto
    # another root: the whole run moves with it
    moved = ringcoll.simulate("reduce", "rabenseifner", 64, numel=64 * 16, dst=5)
    assert sends(moved, 6) == [(6 + d) % 64 for d in (1, 2, 4, 8, 16, 32, 32)]


def test_reduce_scatter_recursive_halving_is_mpichs_far_first_order():
    """MPICH's MPIR_Reduce_scatter_intra_recursive_halving runs mask = pof2/2 down to 1 (block q
    must end on rank q), so ringcoll's reduce_scatter keeps that order: nothing to move."""
    sim = ringcoll.simulate("reduce_scatter_tensor", "recursive_halving", 64, data=False,
                            call=lambda r: ((torch.zeros(16, dtype=torch.int64), torch.ones(64 * 16, dtype=torch.int64)), {}))
    assert sends(sim, 5) == [5 ^ d for d in (32, 16, 8, 4, 2, 1)]


@pytest.mark.parametrize("world", [3, 5, 6, 7, 12])
@pytest.mark.parametrize("numel", [1, 5, 1001])
def test_rabenseifner_exact_at_non_powers_of_two(world, numel):
    inputs = [torch.arange(numel, dtype=torch.int64) * (r + 3) + 7 * r + 1 for r in range(world)]
    sim = ringcoll.simulate("all_reduce", "rabenseifner", world, inputs=inputs)
    for rank, (got,) in enumerate(sim.outputs):
        assert torch.equal(got, sum(inputs)), f"rank {rank}"


def test_swing_peers_and_steps_are_the_papers():
    from ringcoll.schedules.swing import rho, swing_peer

    # ρ(s) = Σ_{i≤s} (-2)^i; even ranks add, odd ranks subtract, mod p
    assert [rho(s) for s in range(7)] == [sum((-2) ** i for i in range(s + 1)) for s in range(7)] \
        == [1, -1, 3, -5, 11, -21, 43]
    assert [swing_peer(6, s, 16) for s in range(4)] == [7, 5, 9, 1]
    assert [swing_peer(7, s, 16) for s in range(4)] == [6, 8, 4, 12]
    bandwidth = ringcoll.simulate("all_reduce", "swing_bandwidth", 16, numel=64)
    latency = ringcoll.simulate("all_reduce", "swing_latency", 16, numel=64)
    for rank in (6, 7):
        paper = [swing_peer(rank, s, 16) for s in range(4)]
        # bandwidth form: reduce-scatter s = 0 .. lg p - 1, all-gather the reverse (the paper's)
        assert sends(bandwidth, rank) == paper + paper[::-1]
        # latency form: far first (the documented deviation, for bitwise-identical floats)
        assert sends(latency, rank) == paper[::-1]


def _against_builtins():
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = []
    for numel in (1, world + 2, 1000):
        for root in (0, world - 1):
            tensor = torch.arange(numel, dtype=torch.int64) * 3 + 100 * rank + 1
            want = tensor.clone()
            dist.broadcast(want, root)
            ringcoll.broadcast(tensor, src=root, algorithm="bine")
            problems += [f"broadcast numel {numel} root {root}"] if not torch.equal(tensor, want) else []
            tensor = torch.arange(numel, dtype=torch.int64) * (rank + 2) + rank + 1
            want = tensor.clone()
            dist.reduce(want, root)
            ringcoll.reduce(tensor, dst=root, algorithm="bine")
            problems += [f"reduce numel {numel} root {root}"] if rank == root and not torch.equal(tensor, want) else []
        tensor = torch.arange(numel, dtype=torch.int64) * (rank + 5) - rank
        want = tensor.clone()
        dist.all_reduce(want)
        ringcoll.all_reduce(tensor, algorithm="rabenseifner")
        problems += [f"all_reduce numel {numel}"] if not torch.equal(tensor, want) else []
    return problems


@pytest.mark.parametrize("world", [3, 5])
def test_new_orders_match_builtins_on_gloo(clusters, world):
    for rank, problems in enumerate(clusters(world).run(_against_builtins)):
        assert not problems, f"rank {rank}: {problems}"


@pytest.mark.parametrize("algorithm", ["swing_latency", "swing_bandwidth", "bine"])
@pytest.mark.parametrize("world", [64, 256])
def test_swing_and_bine_mirrored_runs_equal_the_full_runs(algorithm, world):
    """Swing's pairs are rank 0's (even ranks) or rank 1's (odd) moved by a rotation: the
    cost-only run of ranks 0 and 1 alone gives every rank's statistics and time exactly."""
    machine = ringcoll.Machine(alpha=2e-6, beta=1e-10, gamma=3e-11)
    run = dict(numel=world * 8, dtype=torch.float32, data=False, record=False, machine=machine)
    mirrored = ringcoll.simulate("all_reduce", algorithm, world, **run).stats
    full = ringcoll.simulate("all_reduce", algorithm, world, symmetry=False, **run).stats
    assert mirrored.mirrored == "rotation" and full.mirrored is None
    assert (mirrored.time, mirrored.steps, mirrored.rank_steps, dict(mirrored.link_bytes)) == \
        (full.time, full.steps, full.rank_steps, full.link_bytes)
    assert [vars(r) for r in mirrored.ranks] == [vars(r) for r in full.ranks]
