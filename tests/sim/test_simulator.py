"""The simulator, and every all_reduce algorithm in it: many worlds, sizes and ops, exact data."""
from __future__ import annotations

import functools

import pytest
import torch

import ringcoll
from ringcoll.runtime.plan import Plan
from ringcoll.schedules.registry import Algorithm, Cost, get
from ringcoll.schedules.vocabulary import Buf, Layout, Recv, Send, chunk_bounds, step
from ringcoll.api._calls import rank_data
from _util import SIM_WORLDS
from ringcoll.sim.engine import ScheduleError, run_plans

R = ringcoll.ReduceOp
INT_OPS = {
    "SUM": (R.SUM, lambda a, b: a + b),
    "PRODUCT": (R.PRODUCT, lambda a, b: a * b),      # int64 products wrap identically in any order
    "MIN": (R.MIN, torch.minimum),
    "MAX": (R.MAX, torch.maximum),
    "BAND": (R.BAND, torch.bitwise_and),
    "BOR": (R.BOR, torch.bitwise_or),
    "BXOR": (R.BXOR, torch.bitwise_xor),
}


def sizes(world):
    return sorted({0, 1, max(world - 1, 0), world + 1, 1000, 4099})


def expected(world, numel, fold, dtype=torch.int64):
    return functools.reduce(fold, [rank_data(r, numel, dtype) for r in range(world)])


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("all_reduce"))
@pytest.mark.parametrize("world", SIM_WORLDS)
def test_all_reduce_every_world_size_and_op(algorithm, world):
    ops = INT_OPS if world <= 17 else {k: INT_OPS[k] for k in ("SUM", "BXOR")}
    for numel in sizes(world):
        for name, (op, fold) in ops.items():
            sim = ringcoll.simulate("all_reduce", algorithm, world, numel=numel, op=op)
            want = expected(world, numel, fold)
            for rank, (got,) in enumerate(sim.outputs):
                assert torch.equal(got, want), f"{algorithm} world {world} numel {numel} {name} rank {rank}"


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("all_reduce"))
@pytest.mark.parametrize("world", [3, 6, 7])
def test_all_reduce_float_ops_bitwise_identical(algorithm, world):
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r), dtype=torch.float32)
              for r in range(world)]
    cases = {
        R.SUM: sum(inputs),
        R.AVG: sum(inputs) / world,
        torch.distributed._make_nccl_premul_sum(0.5): sum(x * 0.5 for x in inputs),
        R.MAX: functools.reduce(torch.maximum, inputs),
        R.PRODUCT: functools.reduce(torch.mul, inputs),
    }
    for op, want in cases.items():
        sim = ringcoll.simulate("all_reduce", algorithm, world, inputs=inputs, op=op)
        first = sim.outputs[0][0]
        torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
        for rank, (got,) in enumerate(sim.outputs):
            assert torch.equal(got.view(torch.int32), first.view(torch.int32)), f"rank {rank} differs in bits"
    for x, original in zip(inputs, [torch.randn(1001, generator=torch.Generator().manual_seed(r))
                                     for r in range(world)]):
        assert torch.equal(x, original), "simulate must not modify its inputs"


@pytest.mark.parametrize("world", [4, 5, 8])
def test_ring_statistics_match_the_cost_model(world):
    numel = 8 * 1024 * world
    sim = ringcoll.simulate("all_reduce", "ring", world, numel=numel, dtype=torch.float32)
    nbytes = numel * 4
    assert sim.stats.steps == 2 * (world - 1)
    for stats in sim.stats.ranks:
        assert stats.bytes_sent == 2 * (world - 1) * nbytes // world
        assert stats.bytes_reduced == (world - 1) * nbytes // world
    assert sim.cost == Cost(2 * (world - 1), 2 * (world - 1) / world * nbytes, (world - 1) / world * nbytes)
    assert sim.stats.time > 0


def test_recursive_doubling_folds_non_powers_of_two():
    pof2 = ringcoll.simulate("all_reduce", "recursive_doubling", 8, numel=10)
    folded = ringcoll.simulate("all_reduce", "recursive_doubling", 6, numel=10)
    assert pof2.stats.steps == 3
    assert folded.stats.steps == 2 + 2     # fold in, lg 4 exchanges, fold out
    assert folded.cost.alpha == 4


def test_simulates_hundreds_of_ranks_quickly():
    import time

    start = time.perf_counter()
    sim = ringcoll.simulate("all_reduce", "rabenseifner", 300, numel=4099)
    assert torch.equal(sim.outputs[299][0], expected(300, 4099, INT_OPS["SUM"][1]))
    assert time.perf_counter() - start < 30


# -- schedules that cannot run ----------------------------------------------------------

def _plans(schedule, world, numel=4):
    algorithm = Algorithm("test", "bad", schedule, lambda p, n: Cost(0, 0, 0))
    return [Plan("test", algorithm, rank, world, Layout(numel), {"data": rank_data(rank, numel)},
                 op="sum", describe="test/bad") for rank in range(world)]


def test_deadlock_names_ranks_steps_and_peers():
    def both_receive(rank, world, layout):
        yield step([Recv(1 - rank, Buf("data", 0, 4))])

    with pytest.raises(ScheduleError, match=r"(?s)deadlock.*rank 0 step 1/1 waits on: receive from peer 1"):
        run_plans(_plans(both_receive, 2))


def test_unmatched_send_is_an_error():
    def lonely_send(rank, world, layout):
        if rank == 0:
            yield step([Send(1, Buf("data", 0, 4))])

    with pytest.raises(ScheduleError, match=r"rank 0 step 1/1 waits on: send to peer 1"):
        run_plans(_plans(lonely_send, 2))


def test_size_mismatch_is_an_error():
    def mismatch(rank, world, layout):
        yield step([Send(1, Buf("data", 0, 4))] if rank == 0 else [Recv(0, Buf("data", 0, 3))])

    with pytest.raises(ScheduleError, match=r"rank 0 step 1/1 sends data\[0:4\] \(4 elements\) to rank 1"):
        run_plans(_plans(mismatch, 2))


def test_bad_peer_is_an_error():
    def self_send(rank, world, layout):
        yield step([Send(rank, Buf("data", 0, 4))])

    with pytest.raises(ScheduleError, match="names peer 0"):
        run_plans(_plans(self_send, 1))


def test_messages_match_in_posting_order():
    def two_messages(rank, world, layout):
        if rank == 0:
            yield step([Send(1, Buf("data", 0, 2)), Send(1, Buf("data", 2, 4))])
        else:
            yield step([Recv(0, Buf("data", 2, 4))])
            yield step([Recv(0, Buf("data", 0, 2))])

    plans = _plans(two_messages, 2)
    plans[0].buffers["data"].copy_(torch.tensor([10, 11, 12, 13]))
    run_plans(plans)
    assert plans[1].buffers["data"].tolist() == [12, 13, 10, 11]


# -- schedule helpers -------------------------------------------------------------------

@pytest.mark.parametrize("numel,parts", [(0, 3), (1, 4), (7, 3), (12, 4), (5, 8)])
def test_chunk_bounds_cover_everything_once(numel, parts):
    bounds = chunk_bounds(numel, parts)
    assert bounds[0] == 0 and bounds[-1] == numel and len(bounds) == parts + 1
    widths = [b - a for a, b in zip(bounds, bounds[1:])]
    assert max(widths) - min(widths) <= 1


def test_registry_lists_and_rejects():
    assert set(ringcoll.algorithms("all_reduce")) >= {"ring", "recursive_doubling", "rabenseifner"}
    assert "all_reduce" in ringcoll.algorithms()
    with pytest.raises(ValueError, match=r"algorithm for all_reduce must be 'auto' or one of .*got 'nope'"):
        get("all_reduce", "nope")
    with pytest.raises(ValueError, match="collective must be one of"):
        ringcoll.algorithms("all_reduse")
    assert "Cost:" in get("all_reduce", "ring").doc


@pytest.mark.parametrize("segment_bytes", ["8", "24", "800"])
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_segmented_ring(monkeypatch, world, segment_bytes):
    monkeypatch.setenv("RINGCOLL_SEGMENT", segment_bytes)
    for numel in sizes(world):
        sim = ringcoll.simulate("all_reduce", "ring", world, numel=numel)
        want = expected(world, numel, INT_OPS["SUM"][1])
        assert all(torch.equal(got, want) for (got,) in sim.outputs), f"world {world} numel {numel}"
    segments = max(1, -(-(4099 // world + 1) * 8 // int(segment_bytes)))
    assert sim.stats.steps == 2 * (world - 1) * segments


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_segmented_rings_of_all_gather_and_reduce_scatter(monkeypatch, world):
    """Blocks cut into many segments (8-byte segments of int64): still exact."""
    monkeypatch.setenv("RINGCOLL_SEGMENT", "24")
    for block in (1, world + 1, 100):
        inputs = [rank_data(rank, block) for rank in range(world)]
        gathered = ringcoll.simulate(
            "all_gather_into_tensor", "ring", world,
            call=lambda rank: ((torch.empty(world * block, dtype=torch.int64), inputs[rank]), {}))
        for rank, views in enumerate(gathered.outputs):      # result(): one view per rank's block
            got = torch.cat([view.reshape(-1) for view in views])
            assert torch.equal(got, torch.cat(inputs)), f"all_gather world {world} block {block} rank {rank}"
        full = [rank_data(rank, world * block) for rank in range(world)]
        scattered = ringcoll.simulate(
            "reduce_scatter_tensor", "ring", world,
            call=lambda rank: ((torch.empty(block, dtype=torch.int64), full[rank]), {}))
        total = sum(full)
        for rank, out in enumerate(scattered.outputs):
            assert torch.equal(out[0], total[rank * block:(rank + 1) * block]), f"reduce_scatter rank {rank}"
        assert scattered.stats.steps == (world - 1) * -(-block * 8 // 24)
