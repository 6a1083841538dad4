"""The double trees two ways: each global step split by the colours of its messages (the
layout's ONE_PORT, the simulator's clock) or posted together (the P2P executor's default):
the same messages, posted in the same order at both ends of a pair, the same bits, in the simulator and on gloo."""
from __future__ import annotations

import os
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist

from _util import builtin_all_reduce, random_data
from ringcoll.api import BUILDERS
from ringcoll.api.common import Context, persistent_plans
from ringcoll.schedules.vocabulary import ONE_PORT, Send
from ringcoll.sim.engine import run_plans

SEGMENT_BYTES = 512                          # 128 int32 elements: several segments per tree
CALLS = {"all_reduce": {}, "broadcast": {"src": 1}, "reduce": {"dst": 2}}


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(SEGMENT_BYTES))


def _plans(collective: str, world: int, numel: int, one_port: bool):
    plans = []
    for rank in range(world):
        tensor = random_data(rank, numel, torch.int32, seed=3)
        plan = BUILDERS[collective](Context(rank, world), tensor, algorithm="double_binary_tree",
                                    **CALLS[collective])
        if not one_port:
            plan.layout = plan.layout.replace(**{ONE_PORT: False})
        plans.append((plan, tensor))
    return plans


def _messages(steps, rank):
    """Per (sender, receiver): the chunks this rank sends or receives into (in colour order
    when split, in phase order when together: either way both ends post alike, which the
    simulator's run checks)."""
    pairs = defaultdict(list)
    for st in steps:
        for c in st.comms:
            pairs[(rank, c.peer) if isinstance(c, Send) else (c.peer, rank)].append(c.buf)
    return {pair: sorted(bufs, key=lambda b: (b.name, b.start, b.stop)) for pair, bufs in pairs.items()}


@pytest.mark.parametrize("collective", sorted(CALLS))
@pytest.mark.parametrize("world", [3, 5, 6, 11])
def test_same_messages_fewer_steps_same_bits(small_segments, collective, world):
    numel = 1001                              # 4 segments in one tree, 4 in the other, uneven
    split, together = _plans(collective, world, numel, True), _plans(collective, world, numel, False)
    fewer = False
    for rank in range(world):
        a, b = split[rank][0].steps(), together[rank][0].steps()
        assert _messages(a, rank) == _messages(b, rank), f"rank {rank}: other messages"
        assert len(b) <= len(a)
        fewer |= len(b) < len(a)
        assert split[rank][0].steps(one_port=False) == b
    assert fewer, "posting together should merge some colour steps"
    with torch.no_grad():
        run_plans([plan for plan, _ in split])
        run_plans([plan for plan, _ in together])
    for rank in range(world):
        assert torch.equal(split[rank][1], together[rank][1]), f"rank {rank} differs"


def _both_ways(numel: int) -> list:
    """On every rank: each double tree split and together against the built-ins; problems."""
    import ringcoll
    from ringcoll.api.common import group_executor

    executor = group_executor(None)
    rank, problems, steps = dist.get_rank(), [], {}
    os.environ["RINGCOLL_SEGMENT"] = str(SEGMENT_BYTES)
    try:
        for one_port in (True, False):
            executor.one_port = one_port
            persistent_plans(executor).clear()         # a kept plan was prepared the other way
            for case, collective in enumerate(sorted(CALLS)):
                tensor = random_data(rank, numel, torch.int32, seed=case)
                if collective == "all_reduce":
                    want = builtin_all_reduce(tensor, dist.ReduceOp.SUM)
                    ringcoll.all_reduce(tensor, algorithm="double_binary_tree")
                elif collective == "broadcast":
                    want = tensor.clone()
                    dist.broadcast(want, 1)
                    ringcoll.broadcast(tensor, src=1, algorithm="double_binary_tree")
                else:
                    want = tensor.clone()
                    dist.reduce(want, 2)
                    ringcoll.reduce(tensor, dst=2, algorithm="double_binary_tree")
                    if rank != 2:
                        want = tensor
                if not torch.equal(tensor, want):
                    problems.append(f"{collective} one_port={one_port} numel {numel}")
            steps[one_port] = sum(len(prepared.steps) for prepared in persistent_plans(executor).values())
    finally:
        executor.one_port = False
        persistent_plans(executor).clear()
        os.environ.pop("RINGCOLL_SEGMENT", None)
    return problems, steps


@pytest.mark.parametrize("numel", [0, 1, 2, 1001])
def test_gloo_split_and_together_match_the_builtins(clusters, numel):
    for rank, (problems, steps) in enumerate(clusters(3).run(_both_ways, numel)):
        assert not problems, f"rank {rank}: {problems}"
        if numel == 1001:                       # the kept plans: the runs really differed
            assert steps[True] > steps[False], f"rank {rank}: {steps}"
