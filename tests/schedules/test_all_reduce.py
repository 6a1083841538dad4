"""ringcoll.all_reduce: every algorithm exact in the simulator at every world size and bitwise
identical across ranks on floats, Swing's pairs and the torus grid; and against
torch.distributed.all_reduce on real gloo processes."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import (FLOATS, INTS, RTOL, SIM_WORLDS, assert_equal_per_rank, assert_every_rank, block_numels,
                   exact_results, ops_for)
from _util import builtin_all_reduce as builtin_reference
from _util import random_data as data
from conftest import GLOO_WORLDS

R = dist.ReduceOp


def cases(world):
    """Every op x dtype at a size that does not divide by the world, and every edge size
    (0, 1, below the world, not divisible, large) for a float and an integer op."""
    numels = sorted({0, 1, max(world - 1, 1), world + 1, 1000, 70000})
    every = [(dtype, op, world + 1) for dtype in FLOATS + INTS + (torch.bool,) for op in ops_for(dtype)]
    edges = [(dtype, op, numel) for dtype, op in ((torch.float32, R.SUM), (torch.int32, R.BXOR))
             for numel in numels]
    return every + edges


def compare_with_builtin(algorithm):
    """Every case on this rank; returns the mismatches and each result's bytes."""
    rank = dist.get_rank()
    problems, results = [], []
    for dtype, op, numel in cases(dist.get_world_size()):
        tensor = data(rank, numel, dtype)
        want = builtin_reference(tensor, op)
        ringcoll.all_reduce(tensor, op=op, algorithm=algorithm)
        name = f"{dtype} {getattr(op, 'op', op)} numel {numel}"
        if dtype.is_floating_point:
            if not torch.allclose(tensor.double(), want.double(), rtol=RTOL[dtype], atol=RTOL[dtype]):
                problems.append(f"{name}: max diff {(tensor.double() - want.double()).abs().max()}")
        elif not torch.equal(tensor, want):
            problems.append(f"{name}: {tensor[:8].tolist()} != {want[:8].tolist()}")
        results.append(tensor.view(torch.uint8).clone())
    return problems, [r.numpy().tobytes() for r in results]


@pytest.mark.parametrize("world", GLOO_WORLDS)
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "auto"])
def test_matches_builtin_every_op_and_dtype(clusters, world, algorithm):
    answers = clusters(world).run(compare_with_builtin, algorithm)
    for rank, (problems, _) in enumerate(answers):
        assert not problems, f"rank {rank}: {problems[:5]}"
    first = answers[0][1]
    for rank, (_, bits) in enumerate(answers):
        assert bits == first, f"rank {rank}'s result differs in bits from rank 0's"


def every_algorithm_on_shapes():
    rank = dist.get_rank()
    out = []
    for algorithm in ringcoll.algorithms("all_reduce"):
        scalar = torch.tensor(rank + 1.5)
        matrix = torch.arange(12, dtype=torch.int32).view(3, 4) + rank
        strided = (torch.arange(24, dtype=torch.int64).view(4, 6) + rank).t()   # not contiguous
        before = strided.data_ptr()
        for tensor in (scalar, matrix, strided):
            want = tensor.clone()
            dist.all_reduce(want)
            ringcoll.all_reduce(tensor, algorithm=algorithm)
            out.append(torch.equal(tensor, want) and tensor.shape == want.shape)
        out.append(strided.data_ptr() == before and not strided.is_contiguous())
    return out


def test_any_shape_scalar_and_non_contiguous(clusters):
    assert_every_rank(clusters(3).run(every_algorithm_on_shapes))


def in_sub_group(members):
    group = dist.new_group(members)
    rank = dist.get_rank()
    out = {}
    for algorithm in ringcoll.algorithms("all_reduce"):
        tensor = torch.arange(7, dtype=torch.int64) * 10 + rank + 1
        want = tensor.clone()
        result = ringcoll.all_reduce(tensor, group=group, algorithm=algorithm)
        if rank in members:
            dist.all_reduce(want, group=group)
        out[algorithm] = (result, tensor.tolist(), want.tolist())
    dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (4, [1, 3]), (8, [7, 1, 4, 2, 6])])
def test_sub_group_maps_ranks(clusters, world, members):
    for rank, out in enumerate(clusters(world).run(in_sub_group, members)):
        for algorithm, (result, got, want) in out.items():
            assert result is None
            assert got == want, f"rank {rank} {algorithm}"
            if rank not in members:
                assert got == (torch.arange(7) * 10 + rank + 1).tolist()   # untouched outside the group


def asynchronous():
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((1000,), rank + k, dtype=torch.int64) for k in range(3)]
    works = [ringcoll.all_reduce(t, async_op=True, algorithm=a)
             for t, a in zip(tensors, ringcoll.algorithms("all_reduce"))]
    sync = torch.full((10,), rank + 1.0)
    ringcoll.all_reduce(sync)                         # queued behind the async ones, in call order
    waited = [w.wait() for w in works]
    expected = [sum(range(world)) + k * world for k in range(3)]
    ok = [bool((t == e).all()) for t, e in zip(tensors, expected)]
    results = [w.result()[0] is t for w, t in zip(works, tensors)]
    futures = [w.get_future().wait()[0] is t for w, t in zip(works, tensors)]
    return waited, ok, results, futures, [w.is_completed() for w in works], sync[0].item()


def test_async_op_returns_work_in_call_order(clusters):
    world = 4
    for rank, (waited, ok, results, futures, done, sync) in enumerate(clusters(world).run(asynchronous)):
        flags = {"wait() returned True": waited, "the sum is right": ok, "result() is the tensor": results,
                 "the future's value is the tensor": futures, "is_completed()": done}
        assert {what: calls for what, calls in flags.items() if not all(calls)} == {}, f"rank {rank}, per call"
        assert sync == sum(range(1, world + 1)), f"rank {rank}"


def failing_reduction():
    from ringcoll import kernels

    original = kernels.reduce_into

    def broken(*args, **kwargs):
        raise RuntimeError("injected kernel failure")

    # a group of its own: the failed local step fails its group (#36), never the cluster's default
    group = dist.new_group(list(range(dist.get_world_size())))
    kernels.reduce_into = broken
    try:
        work = ringcoll.all_reduce(torch.ones(8), group=group, async_op=True, algorithm="ring")
        try:
            work.wait()
        except RuntimeError as error:
            caught = str(error)
        else:
            caught = None
        return caught, work.is_completed(), work.is_success(), isinstance(work.exception(), RuntimeError)
    finally:
        kernels.reduce_into = original
        dist.destroy_process_group(group)


def test_async_wait_reraises_the_error(clusters):
    for caught, done, success, has_error in clusters(2).run(failing_reduction):
        assert caught == "injected kernel failure"
        assert done and not success and has_error


def bad_inputs():
    tensor = torch.arange(6, dtype=torch.float32) + 1
    before = tensor.clone()
    cases = {
        "not a tensor": lambda: ringcoll.all_reduce([1.0, 2.0]),
        "BAND on float": lambda: ringcoll.all_reduce(tensor, op=R.BAND),
        "AVG on int": lambda: ringcoll.all_reduce(torch.ones(3, dtype=torch.int32), op=R.AVG),
        "PREMUL on int": lambda: ringcoll.all_reduce(torch.ones(3, dtype=torch.int32),
                                                     op=dist._make_nccl_premul_sum(2.0)),
        "unknown algorithm": lambda: ringcoll.all_reduce(tensor, algorithm="butterfly"),
        "algorithm not a str": lambda: ringcoll.all_reduce(tensor, algorithm=3),
        "op not a ReduceOp": lambda: ringcoll.all_reduce(tensor, op="sum"),
        "MAX on complex": lambda: ringcoll.all_reduce(torch.ones(2, dtype=torch.complex64), op=R.MAX),
        "group not a group": lambda: ringcoll.all_reduce(tensor, group="world"),
        "async_op not a bool": lambda: ringcoll.all_reduce(tensor, async_op="yes"),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
        except (TypeError, ValueError) as error:
            out[name] = (type(error).__name__, str(error))
        else:
            out[name] = ("no error", "")
    return out, torch.equal(tensor, before)


def test_bad_input_raises_before_touching_anything(clusters):
    expected = {
        "not a tensor": ("TypeError", "tensor must be a torch.Tensor, got list"),
        "BAND on float": ("ValueError", "op=ReduceOp.BAND needs an integral or bool tensor, got dtype torch.float32"),
        "AVG on int": ("ValueError", "op=ReduceOp.AVG needs a floating-point tensor"),
        "PREMUL on int": ("ValueError", "op=ReduceOp.PREMUL_SUM needs a floating-point tensor"),
        "unknown algorithm": ("ValueError", "algorithm for all_reduce must be 'auto' or one of"),
        "algorithm not a str": ("TypeError", "algorithm must be a str, got int 3"),
        "op not a ReduceOp": ("TypeError", "op must be a torch.distributed.ReduceOp, got str"),
        "MAX on complex": ("ValueError", "all_reduce does not support op=ReduceOp.MAX on complex tensors"),
        "group not a group": ("TypeError", "group must be a torch.distributed.ProcessGroup or None, got str"),
        "async_op not a bool": ("TypeError", "async_op must be a bool, got str"),
    }
    for rank, (out, untouched) in enumerate(clusters(2).run(bad_inputs)):
        assert untouched
        for name, (kind, text) in expected.items():
            assert out[name][0] == kind and text in out[name][1], f"rank {rank} {name}: {out[name]}"


def auto_choice_logged(numel):
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("ringcoll")
    handler, level = Keep(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        tensor = torch.ones(numel)
        ringcoll.all_reduce(tensor)
        os.environ["RINGCOLL_ALGO"] = "all_reduce=rabenseifner"
        ringcoll.all_reduce(tensor)
        os.environ["RINGCOLL_ALGO"] = "ring"
        ringcoll.all_reduce(tensor)
        ringcoll.all_reduce(tensor, algorithm="recursive_doubling")   # explicit beats the override
    finally:
        os.environ.pop("RINGCOLL_ALGO", None)
        log.removeHandler(handler)
        log.setLevel(level)
    return records, tensor[0].item()


def test_auto_override_and_debug_log(clusters):
    records, value = clusters(2).run(auto_choice_logged, 10)[0]
    # the calls' choices (a group's placement line comes first when this test runs first)
    records = [record for record in records if " -> " in record]
    assert value == 16
    assert "-> recursive_doubling (auto:" in records[0]
    assert "-> rabenseifner (RINGCOLL_ALGO)" in records[1]
    assert "-> ring (RINGCOLL_ALGO)" in records[2]
    assert "-> recursive_doubling (requested)" in records[3]
    assert "all_reduce/recursive_doubling 10xfloat32 SUM" in records[0]


def silent_peer():
    ringcoll.set_timeout(2)
    if dist.get_rank() == 1:
        time.sleep(4)
        return None
    start = time.monotonic()
    try:
        ringcoll.all_reduce(torch.ones(4), algorithm="ring")
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "no error", 0.0


def test_silent_peer_is_an_error_naming_it_within_the_timeout():
    with ringcoll.launch(2, threads=1) as cluster:
        message, waited = cluster.run(silent_peer)[0]
    # the group's first collective call: its placement exchange (through the group's store)
    # waits for the silent peer and names it
    assert "placement exchange of call #1 all_reduce" in message, message
    assert "rank 0: rank 1 did not reach the group's first collective call within 2 s" in message, message
    assert waited < 10


def dies():
    if dist.get_rank() == 1:
        os._exit(3)
    ringcoll.set_timeout(20)
    try:
        ringcoll.all_reduce(torch.ones(4), algorithm="ring")
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_dead_peer_fails_fast_and_the_cluster_reports_it():
    with ringcoll.launch(2, threads=1) as cluster:
        with pytest.raises(ringcoll.cluster.ClusterError, match="rank 1 died"):
            cluster.run(dies, timeout=60)
        assert not cluster.alive


# -- simulator -------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ringcoll.algorithms("all_reduce"))
def test_simulated_exact_at_every_world_and_size(algorithm):
    for world in SIM_WORLDS:
        for numel in block_numels(world):
            got, want = exact_results("all_reduce", algorithm, world, numel)
            assert_equal_per_rank(got, want, f"{algorithm} world {world} numel {numel}")


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("all_reduce"))
@pytest.mark.parametrize("world", [3, 6, 8, 12, 16])
def test_simulated_float_sum_bitwise_identical_on_every_rank(algorithm, world):
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    sim = ringcoll.simulate("all_reduce", algorithm, world, inputs=inputs)
    torch.testing.assert_close(sim.outputs[0][0], sum(inputs), rtol=1e-5, atol=1e-5)
    assert_equal_per_rank([got.view(torch.int32) for (got,) in sim.outputs], [sim.outputs[0][0].view(torch.int32)] * world,
                          f"{algorithm} world {world}: bits against rank 0's")


def test_swing_pairs_nest():
    from ringcoll.schedules.swing import swing_blocks, swing_peer

    assert [swing_peer(0, s, 1024) for s in range(5)] == [1, 1023, 3, 1019, 11]
    for k in range(1, 11):
        blocks = swing_blocks(1 << k)
        assert sorted(b[-1] for b in blocks) == [(i, i + 1) for i in range(1 << k)], f"world {1 << k}"


def test_torus_grid():
    from ringcoll.schedules.vocabulary import torus_grid

    assert [torus_grid(p) for p in (1, 2, 6, 12, 16, 17, 64, 1024)] == \
        [(1, 1), (2, 1), (3, 2), (4, 3), (4, 4), (17, 1), (8, 8), (32, 32)]
    assert ringcoll.simulate("all_reduce", "torus2d", 12, numel=120).stats.steps == 2 * (4 - 1) + 2 * (3 - 1)
