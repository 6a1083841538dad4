"""NCCL's own all_reduce algorithms as ringcoll schedules (``nccl_ring``: a ring per channel,
each leaving its node from another rank; ``nccl_tree``: a chain inside each node under NCCL's
double binary tree over the nodes): exact in the simulator on even and uneven nodes, and the
rings and trees they are built on. Against gloo's built-in: tests/schedules/test_hierarchical.py
(every newer algorithm, NCCL's included, at 3, 4 and 5 ranks)."""
from __future__ import annotations

import pytest

from _util import assert_equal_per_rank, block_numels, exact_results


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
    from ringcoll.schedules.nccl import channel_rings, nccl_trees

    assert channel_rings((0, 0, 0)) == [(0, 1, 2)]
    assert channel_rings((0, 0, 1, 1)) == [(0, 1, 2, 3), (1, 0, 3, 2)]
    first, second = nccl_trees((0, 0, 1, 1, 2, 2))
    # nodes 0, 1, 2: NCCL's btree over 3 nodes has node 0 on top with child 2, node 2 above 1
    assert first.parent == (None, 0, 4, 2, 0, 4)
    assert [first.children[r] for r in (0, 4)] == [(1, 4), (5, 2)]
    assert second.parent[0] is not None or second.parent[2] is not None     # another top
