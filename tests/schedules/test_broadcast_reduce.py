"""broadcast, reduce and the tree all_reduce: every algorithm in the simulator (many worlds,
sizes, roots and ops, exact data, pipelines of several segments) and against
torch.distributed's built-ins on real gloo processes."""
from __future__ import annotations

import functools

import os

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.schedules.vocabulary import ceil_log2
from _util import FLOATS, INTS, SIM_WORLDS, assert_every_rank, builtin_all_reduce, close, ops_for
from _util import random_data as gloo_data
from conftest import GLOO_WORLDS
from ringcoll.api import BUILDERS
from ringcoll.api.common import Context
from ringcoll.schedules import trees
from ringcoll.api._calls import rank_data

R = dist.ReduceOp
#: small enough that 1000 and 4099 int64 elements make several segments (256 elements each)
TEST_SEGMENT_BYTES = 2048
OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def sizes(world):
    return sorted({0, 1, max(world - 1, 0), world + 1, 1000, 4099})


def cases(world):
    """(numel, root, op name) for one world, kept fast: at worlds up to 4 every root position
    class (first, last, middle) with every op; above, for every numel, SUM and one other op,
    each at a root class, rotating so that every op and every class meets every world."""
    classes = sorted({0, world - 1, world // 2})
    for i, numel in enumerate(sizes(world)):
        if world <= 4:
            for root in classes:
                for name in OP_NAMES:
                    yield numel, root, name
        else:
            yield numel, classes[(i + world) % len(classes)], "SUM"
            yield numel, classes[(i + world + 1) % len(classes)], OP_NAMES[1 + (i + world) % 6]


def int_data(op_name, rank, numel):
    """Exact, never-zero int64 data for one op: PRODUCT's factors are 1 or 2, sparse enough to
    stay far from overflow at 64 ranks; BAND's share bit 3 so the result is not all zeros."""
    base = rank_data(rank, numel)
    if op_name == "PRODUCT":
        return 1 + ((torch.arange(numel) + rank) % 11 == 0).long()
    if op_name == "BAND":
        return base | 8
    return base


INT_OPS = {
    "SUM": (R.SUM, torch.add),
    "PRODUCT": (R.PRODUCT, torch.mul),
    "MIN": (R.MIN, torch.minimum),
    "MAX": (R.MAX, torch.maximum),
    "BAND": (R.BAND, torch.bitwise_and),
    "BOR": (R.BOR, torch.bitwise_or),
    "BXOR": (R.BXOR, torch.bitwise_xor),
}


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(TEST_SEGMENT_BYTES))


# -- simulator: broadcast ------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ringcoll.algorithms("broadcast"))
def test_broadcast_every_world_size_root_and_numel(small_segments, algorithm):
    for world in SIM_WORLDS:
        for numel, root in sorted({(numel, root) for numel, root, _ in cases(world)}):
            sim = ringcoll.simulate("broadcast", algorithm, world, numel=numel, src=root)
            want = rank_data(root, numel)
            for rank, (got,) in enumerate(sim.outputs):
                assert torch.equal(got, want), \
                    f"{algorithm} world {world} numel {numel} root {root}: rank {rank} differs"


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("broadcast"))
def test_broadcast_float_bits_and_group_src(small_segments, algorithm):
    world, root = 6, 4
    inputs = [torch.randn(777, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16)
              for r in range(world)]
    for kwargs in ({"src": root}, {"group_src": root}):
        sim = ringcoll.simulate("broadcast", algorithm, world, inputs=inputs, **kwargs)
        for rank, (got,) in enumerate(sim.outputs):
            assert torch.equal(got.view(torch.int16), inputs[root].view(torch.int16)), f"rank {rank}"


# -- simulator: reduce ---------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ringcoll.algorithms("reduce"))
def test_reduce_every_world_size_root_numel_and_op(small_segments, algorithm):
    for world in SIM_WORLDS:
        for numel, root, name in cases(world):
            op, fold = INT_OPS[name]
            sim = ringcoll.simulate("reduce", algorithm, world, op=op, dst=root,
                                    call=lambda rank: ((int_data(name, rank, numel),), {}))
            want = functools.reduce(fold, [int_data(name, r, numel) for r in range(world)])
            got = sim.outputs[root][0]
            assert torch.equal(got, want), \
                f"{algorithm} world {world} numel {numel} root {root} {name}: {got[:6]} != {want[:6]}"


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("reduce"))
@pytest.mark.parametrize("world", [1, 3, 8, 13])
def test_reduce_float_ops_avg_and_premul(small_segments, algorithm, world):
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
              for r in range(world)]
    root = world // 2
    cases = {
        "SUM": (R.SUM, sum(inputs)),
        "AVG": (R.AVG, sum(inputs) / world),
        "PREMUL_SUM": (dist._make_nccl_premul_sum(0.25), sum(x * 0.25 for x in inputs)),
        "MIN": (R.MIN, functools.reduce(torch.minimum, inputs)),
        "PRODUCT": (R.PRODUCT, functools.reduce(torch.mul, inputs)),
    }
    for name, (op, want) in cases.items():
        sim = ringcoll.simulate("reduce", algorithm, world, inputs=inputs, op=op, dst=root)
        got = sim.outputs[root][0]
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), f"{name}: {(got - want).abs().max()}"


# -- simulator: the tree all_reduce -------------------------------------------------------------
def test_tree_all_reduce_pipelined_every_world_size(small_segments):
    for world in SIM_WORLDS:
        for numel, name in sorted({(numel, name) for numel, _, name in cases(world)}):
            op, fold = INT_OPS[name]
            sim = ringcoll.simulate("all_reduce", "double_binary_tree", world, op=op,
                                    call=lambda rank: ((int_data(name, rank, numel),), {}))
            want = functools.reduce(fold, [int_data(name, r, numel) for r in range(world)])
            for rank, (got,) in enumerate(sim.outputs):
                assert torch.equal(got, want), f"world {world} numel {numel} {name} rank {rank}"


@pytest.mark.parametrize("world", [2, 5, 6, 9])
def test_tree_all_reduce_float_bitwise_identical(small_segments, world):
    inputs = [torch.randn(3001, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    for op, want in ((R.SUM, sum(inputs)), (R.AVG, sum(inputs) / world),
                     (dist._make_nccl_premul_sum(0.5), sum(x * 0.5 for x in inputs))):
        sim = ringcoll.simulate("all_reduce", "double_binary_tree", world, inputs=inputs, op=op)
        first = sim.outputs[0][0]
        assert torch.allclose(first, want, rtol=1e-5, atol=1e-5)
        for rank, (got,) in enumerate(sim.outputs):
            assert torch.equal(got.view(torch.int32), first.view(torch.int32)), f"rank {rank}"


# -- the trees and the pipelines' shape ---------------------------------------------------------
@pytest.mark.parametrize("world", range(1, 65))
def test_trees_are_trees_and_nccl_shaped(world):
    first, second = trees.all_reduce_trees(world)
    rooted = trees.rooted_trees(world)
    for tree in (first, second) + rooted:
        assert sum(p is None for p in tree.parent) == 1
        for rank in range(world):
            assert len(tree.children[rank]) <= 2
            for child in tree.children[rank]:
                assert tree.parent[child] == rank and tree.depth[child] == tree.depth[rank] + 1
        assert tree.height <= ceil_log2(world) + 2
    for tree in rooted:
        assert tree.parent[0] is None and len(tree.children[0]) == (1 if world > 1 else 0)
    # every rank is interior in at most one tree, but NCCL's rank 0 (one child) for odd counts
    both = [r for r in range(world) if first.children[r] and second.children[r]]
    assert both == ([0] if world % 2 and world > 1 else []), both
    assert first.parent[0] is None and (world == 1 or second.parent[world - 1 if world % 2 == 0 else 1] is None)
    if world % 2 == 0:
        for rank in range(world):       # the mirror
            assert second.parent[world - 1 - rank] == (None if first.parent[rank] is None
                                                       else world - 1 - first.parent[rank])


@pytest.mark.parametrize("algorithm", ["pipelined_chain", "double_binary_tree"])
@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_pipelines_cut_segments_and_the_root_moves_each_byte_once(small_segments, collective, algorithm):
    if collective == "reduce" and algorithm == "pipelined_chain":
        algorithm = "ring"
    world, numel = 7, 4000
    kwargs = {"src": 2} if collective == "broadcast" else {"dst": 2}
    sim = ringcoll.simulate(collective, algorithm, world, numel=numel, **kwargs)
    segment = TEST_SEGMENT_BYTES // 8
    if algorithm == "double_binary_tree":
        k = 2 * -(-(numel // 2) // segment)
    else:
        k = -(-numel // segment)
    assert sim.stats.messages == (world - 1) * k        # every segment crosses each tree edge once
    root = sim.stats.ranks[2]
    moved = root.bytes_sent if collective == "broadcast" else root.bytes_received
    assert moved == numel * 8
    assert sim.stats.steps < k + 2 * world              # pipelined, not k steps per hop


def test_segment_parameter_comes_from_one_place(monkeypatch):
    monkeypatch.setenv("RINGCOLL_SEGMENT", "800")
    plan = BUILDERS["broadcast"](Context(0, 4), torch.ones(10, dtype=torch.float64), 1,
                                 algorithm="pipelined_chain")
    assert plan.layout["segment"] == 100 and plan.layout["root"] == 1
    plan = BUILDERS["reduce"](Context(0, 4), torch.ones(10, dtype=torch.int8), 1, algorithm="ring")
    assert plan.layout["segment"] == 800


# -- simulator: bad input --------------------------------------------------------------------------
def _error(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)
    return "no error", ""


def test_bad_input_is_refused_before_anything_is_touched():
    tensor = torch.arange(6, dtype=torch.float32) + 1
    before = tensor.clone()
    bcast, red = BUILDERS["broadcast"], BUILDERS["reduce"]
    ctx = Context(1, 4)
    cases = {
        "src out of range": (lambda: bcast(ctx, tensor, 4), "ValueError", "src must be a rank in [0, 4), got 4"),
        "src negative": (lambda: bcast(ctx, tensor, -1), "ValueError", "src must be a rank in [0, 4), got -1"),
        "dst out of range": (lambda: red(ctx, tensor, 9), "ValueError", "dst must be a rank in [0, 4), got 9"),
        "group_dst out of range": (lambda: red(ctx, tensor, group_dst=4), "ValueError",
                                   "group_dst must be a rank of the group, in [0, 4), got 4"),
        "src and group_src": (lambda: bcast(ctx, tensor, 1, group_src=1), "ValueError",
                              "give exactly one of src and group_src"),
        "no root": (lambda: red(ctx, tensor), "ValueError", "dst (a global rank) or group_dst"),
        "src a str": (lambda: bcast(ctx, tensor, "0"), "TypeError", "src must be an int, got str '0'"),
        "src a float": (lambda: bcast(ctx, tensor, 1.0), "TypeError", "src must be an int, got float"),
        "dst a bool": (lambda: red(ctx, tensor, True), "TypeError", "dst must be an int, got bool"),
        "not a tensor": (lambda: bcast(ctx, [1.0], 0), "TypeError", "tensor must be a torch.Tensor, got list"),
        "BAND on float": (lambda: red(ctx, tensor, 0, R.BAND), "ValueError",
                          "op=ReduceOp.BAND needs an integral or bool tensor"),
        "AVG on int": (lambda: red(ctx, torch.ones(3, dtype=torch.int32), 0, R.AVG), "ValueError",
                       "op=ReduceOp.AVG needs a floating-point tensor"),
        "op a str": (lambda: red(ctx, tensor, 0, "sum"), "TypeError", "op must be a torch.distributed.ReduceOp"),
        "unknown algorithm": (lambda: bcast(ctx, tensor, 0, algorithm="flat"), "ValueError",
                              "algorithm for broadcast must be 'auto' or one of"),
    }
    for name, (call, kind, text) in cases.items():
        got = _error(call)
        assert got[0] == kind and text in got[1], f"{name}: {got}"
    assert torch.equal(tensor, before)


# -- real gloo: against torch.distributed -----------------------------------------------------
def builtin_reduce(tensor, dst, op, group=None):
    """torch's reduce of ``tensor`` (a copy), widening what gloo lacks: int16 (exact for small
    data) and PREMUL_SUM (SUM of the premultiplied input)."""
    if tensor.dtype == torch.int16:
        return builtin_reduce(tensor.to(torch.int32), dst, op, group).to(torch.int16)
    ref = tensor.clone()
    if getattr(op, "op", op) == R.PREMUL_SUM:
        ref.mul_(0.25)
        op = R.SUM
    dist.reduce(ref, dst=dst, op=op, group=group)
    return ref


def builtin_broadcast(tensor, src, group=None):
    ref = tensor.clone()
    if ref.dtype == torch.int16:
        ref = ref.view(torch.uint8).clone()       # gloo has no int16: move the same bytes
        dist.broadcast(ref, src=src, group=group)
        return ref.view(torch.int16)
    dist.broadcast(ref, src=src, group=group)
    return ref


def against_builtins(segment_bytes):
    """Every algorithm (and auto) x dtype x op x numel x root on this rank, against torch; the
    mismatches, and the bytes of every replicated result for the bit-equality check."""
    os.environ["RINGCOLL_SEGMENT"] = str(segment_bytes)
    try:
        return _against_builtins()
    finally:
        os.environ.pop("RINGCOLL_SEGMENT")


def _against_builtins():
    rank, world = dist.get_rank(), dist.get_world_size()
    problems, bits = [], []
    numels = sorted({0, 1, max(world - 1, 1), world + 1, 1000})
    classes = (0, world - 1, world // 2)
    broadcasts, reduces = ringcoll.algorithms("broadcast") + ["auto"], ringcoll.algorithms("reduce") + ["auto"]
    # broadcast: every algorithm at every numel on float32; every dtype with each algorithm
    runs = [(algorithm, torch.float32, numel) for algorithm in broadcasts for numel in numels]
    runs += [(algorithm, dtype, numels[i % len(numels)]) for algorithm in broadcasts
             for i, dtype in enumerate(FLOATS + INTS + (torch.bool,)) if dtype != torch.float32]
    for case, (algorithm, dtype, numel) in enumerate(runs):
        root = classes[case % 3]
        tensor = gloo_data(rank, numel, dtype)
        want = builtin_broadcast(tensor, root)
        ringcoll.broadcast(tensor, src=root, algorithm=algorithm)
        if not torch.equal(tensor.view(torch.uint8), want.view(torch.uint8)):
            problems.append(f"broadcast/{algorithm} {dtype} numel {numel} root {root}")
        bits.append(tensor.view(torch.uint8).numpy().tobytes())
    # reduce: every algorithm at every numel (SUM, float32); every op x dtype, the algorithm rotating
    runs = [(algorithm, torch.float32, R.SUM, numel) for algorithm in reduces for numel in numels]
    runs += [(reduces[i % len(reduces)], dtype, op, numels[i % len(numels)] if i % 2 else 1000)
             for i, (dtype, op) in enumerate((d, o) for d in FLOATS + INTS + (torch.bool,) for o in ops_for(d))]
    for case, (algorithm, dtype, op, numel) in enumerate(runs):
        root = classes[case % 3]
        tensor = gloo_data(rank, numel, dtype, seed=1)
        want = builtin_reduce(tensor, root, op)
        ringcoll.reduce(tensor, dst=root, op=op, algorithm=algorithm)
        if rank == root and not close(tensor, want):
            problems.append(f"reduce/{algorithm} {dtype} {getattr(op, 'op', op)} numel {numel} "
                            f"root {root}: {tensor[:6].tolist()} != {want[:6].tolist()}")
    # the tree all_reduce: every op x dtype
    for dtype in FLOATS + INTS + (torch.bool,):
        for op in ops_for(dtype):
            tensor = gloo_data(rank, 1000, dtype, seed=2)
            want = builtin_all_reduce(tensor, op)
            ringcoll.all_reduce(tensor, op=op, algorithm="double_binary_tree")
            if not close(tensor, want):
                problems.append(f"all_reduce/double_binary_tree {dtype} {getattr(op, 'op', op)}")
            bits.append(tensor.view(torch.uint8).numpy().tobytes())
    return problems, bits


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_matches_builtins_every_dtype_op_and_algorithm(clusters, world):
    answers = clusters(world).run(against_builtins, 256)
    for rank, (problems, _) in enumerate(answers):
        assert not problems, f"rank {rank}: {len(problems)} mismatches, first {problems[:4]}"
    for rank, (_, bits) in enumerate(answers):
        assert bits == answers[0][1], f"rank {rank}'s replicated results differ in bits from rank 0's"


def in_sub_group(members):
    """broadcast and reduce on a sub-group, by global and by group root, sync and async."""
    group = dist.new_group(members)
    rank = dist.get_rank()
    inside = rank in members
    src, dst = members[-1], members[0]             # global ranks
    out = []
    for algorithm in ringcoll.algorithms("broadcast"):
        for kwargs in ({"src": src}, {"group_src": 1}):
            tensor = torch.arange(9, dtype=torch.int64) * 10 + rank + 1
            want = tensor.clone()
            if inside:
                dist.broadcast(want, group=group, **kwargs)
            result = ringcoll.broadcast(tensor, group=group, algorithm=algorithm, **kwargs)
            out.append(("broadcast", algorithm, result is None, tensor.tolist(), want.tolist(), True))
    for algorithm in ringcoll.algorithms("reduce"):
        for kwargs in ({"dst": dst}, {"group_dst": len(members) - 1}):
            tensor = torch.arange(9, dtype=torch.int64) * 10 + rank + 1
            want = tensor.clone()
            if inside:
                dist.reduce(want, group=group, **kwargs)
            work = ringcoll.reduce(tensor, group=group, algorithm=algorithm, async_op=True, **kwargs)
            root = dst if "dst" in kwargs else sorted(members)[-1]
            if work is not None:
                assert work.wait() and work.result()[0] is tensor
            mine = rank == root or not inside         # root: the result; outside: untouched
            out.append(("reduce", algorithm, (work is None) == (not inside), tensor.tolist(), want.tolist(), mine))
    errors = [_error(lambda: ringcoll.broadcast(torch.ones(2), src=next(r for r in range(8) if r not in members),
                                                group=group)),
              _error(lambda: ringcoll.reduce(torch.ones(2), group_dst=len(members), group=group))]
    dist.destroy_process_group(group)
    return inside, out, errors


@pytest.mark.parametrize("world,members", [(5, [4, 1, 3]), (8, [7, 1, 4, 2, 6])])
def test_sub_group_roots_global_and_group(clusters, world, members):
    for rank, (inside, out, errors) in enumerate(clusters(world).run(in_sub_group, members)):
        for collective, algorithm, returned_none, got, want, check in out:
            where = f"rank {rank} {collective}/{algorithm}"
            assert returned_none, where
            if not inside:
                assert got == (torch.arange(9) * 10 + rank + 1).tolist(), f"{where}: touched outside the group"
            elif check:
                assert got == want, where
        if inside:
            assert errors[0][0] == "ValueError" and "global rank of a member of the group" in errors[0][1], errors
            assert errors[1][0] == "ValueError" and f"in [0, {len(members)})" in errors[1][1], errors


def asynchronous_in_order():
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((1000,), float(rank + k)) for k in range(4)]
    works = [ringcoll.broadcast(tensors[0], src=world - 1, async_op=True, algorithm="double_binary_tree"),
             ringcoll.reduce(tensors[1], dst=1, async_op=True, algorithm="ring"),
             ringcoll.all_reduce(tensors[2], async_op=True, algorithm="double_binary_tree"),
             ringcoll.broadcast(tensors[3], group_src=0, async_op=True, algorithm="scatter_allgather")]
    sync = torch.full((10,), float(rank))
    ringcoll.reduce(sync, dst=0)                         # queued behind the async ones
    waited = [w.wait() for w in works]
    same = [w.result()[0] is t for w, t in zip(works, tensors)]
    return waited, same, [t[0].item() for t in tensors], sync[0].item() if rank == 0 else None


def test_async_op_works_in_call_order(clusters):
    world = 4
    for rank, (waited, same, values, sync) in enumerate(clusters(world).run(asynchronous_in_order)):
        assert waited == [True] * 4, f"rank {rank}: wait() of each call"
        assert same == [True] * 4, f"rank {rank}: result() is the call's tensor, per call"
        assert values[0] == world - 1
        if rank == 1:
            assert values[1] == sum(range(1, world + 1))
        assert values[2] == sum(range(2, world + 2)) and values[3] == 3
        if rank == 0:
            assert sync == sum(range(world))


def shapes_and_strides():
    rank = dist.get_rank()
    out = []
    for algorithm in ringcoll.algorithms("broadcast"):
        strided = (torch.arange(24, dtype=torch.int32).view(4, 6) + rank).t()
        want = strided.clone()
        dist.broadcast(want, src=1)
        ringcoll.broadcast(strided, 1, algorithm=algorithm)
        scalar = torch.tensor(rank + 0.5)
        ringcoll.broadcast(scalar, 2, algorithm=algorithm)
        out.append(torch.equal(strided, want) and not strided.is_contiguous() and scalar.item() == 2.5)
    for algorithm in ringcoll.algorithms("reduce"):
        strided = (torch.arange(24, dtype=torch.int64).view(4, 6) + rank).t()
        want = strided.clone()
        dist.reduce(want, dst=2)
        ringcoll.reduce(strided, 2, algorithm=algorithm)
        out.append(rank != 2 or torch.equal(strided, want))
    return out


def test_shapes_scalars_and_non_contiguous(clusters):
    assert_every_rank(clusters(3).run(shapes_and_strides))


def test_bine_trees_span_every_world():
    """Every vrank of the Bine trees (far and near first) reaches the root, at every world to 299."""
    from ringcoll.schedules.bine import bine_tree, bine_tree_near

    for world, tree in ((w, t) for w in range(1, 300) for t in (bine_tree, bine_tree_near)):
        parent, _ = tree(world)
        for vrank in range(world):
            seen, up = 0, vrank
            while parent[up] is not None:
                up, seen = parent[up], seen + 1
                assert seen <= world, f"{tree.__name__} world {world}: vrank {vrank} goes round a cycle"
            assert up == 0, f"{tree.__name__} world {world}: vrank {vrank} ends at {up}, not the root"
