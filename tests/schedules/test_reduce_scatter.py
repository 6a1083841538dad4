"""reduce_scatter and reduce_scatter_single: every algorithm in the simulator, then against
torch.distributed's built-ins on real gloo processes."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import (FLOATS, INTS, SIM_WORLDS, assert_every_rank, assert_no_problems, block_numels,
                   one_thread, ops_for, run_world, wrong_errors)  # noqa: F401 - one_thread: an autouse fixture
from conftest import GLOO_WORLDS

R = dist.ReduceOp
ALGORITHMS = ringcoll.algorithms("reduce_scatter")


def op_name(op):
    return getattr(op, "op", op).name


def rank_input(rank, world, numel):
    """Rank ``rank``'s input of world x ``numel``: element i is (i % 97 + 1)(rank + 1) + rank,
    so the SUM over p ranks is (i % 97 + 1)·p(p+1)/2 + p(p-1)/2."""
    i = torch.arange(world * numel, dtype=torch.int64)
    return (i % 97 + 1) * (rank + 1) + rank


def summed(world, numel):
    i = torch.arange(world * numel, dtype=torch.int64)
    return (i % 97 + 1) * (world * (world + 1) // 2) + world * (world - 1) // 2


# -- simulator ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_simulated_sum_every_world_and_size_inputs_untouched(algorithm):
    for world in SIM_WORLDS:
        for numel in block_numels(world):
            want = summed(world, numel)
            args, results = run_world(
                "reduce_scatter_single", algorithm, world,
                lambda rank: ((torch.zeros(numel, dtype=torch.int64), rank_input(rank, world, numel)), {}))
            for rank, ((output, tensor), result) in enumerate(zip(args, results)):
                mine = want[rank * numel:(rank + 1) * numel]
                assert torch.equal(output, mine), \
                    f"world {world} numel {numel} rank {rank}: first wrong index " \
                    f"{(output != mine).nonzero()[:1].tolist()}"
                assert torch.equal(tensor, rank_input(rank, world, numel)), \
                    f"world {world} numel {numel} rank {rank}: the input changed"
                assert result == [output] and result[0] is output


def reference(inputs, op, world):
    """The element-wise reduction of ``inputs`` (one tensor per rank) by ``op``."""
    kind = getattr(op, "op", op)
    combine = {R.SUM: torch.add, R.AVG: torch.add, R.PREMUL_SUM: torch.add, R.PRODUCT: torch.mul,
               R.MIN: torch.minimum, R.MAX: torch.maximum, R.BAND: torch.bitwise_and,
               R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[kind]
    if kind == R.PREMUL_SUM:
        inputs = [x * 0.25 for x in inputs]
    total = functools.reduce(combine, inputs)
    return total / world if kind == R.AVG else total


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_simulated_every_op(algorithm):
    for world in (1, 2, 3, 5, 6, 7, 8, 13):
        numel = world + 2
        for dtype, ops in ((torch.int64, ops_for(torch.int64)), (torch.float64, ops_for(torch.float64))):
            for op in ops:
                inputs = [(rank_input(r, world, numel) % 11 - 5 + (r == 0)).to(dtype) for r in range(world)]
                inputs = [torch.where(x == 0, torch.ones_like(x), x) for x in inputs]
                want = reference(inputs, op, world)
                sim = ringcoll.simulate("reduce_scatter_single", algorithm, world, inputs=[
                    (torch.zeros(numel, dtype=dtype), inputs[r]) for r in range(world)], op=op)
                for rank, (output,) in enumerate(sim.outputs):
                    assert torch.allclose(output, want[rank * numel:(rank + 1) * numel], rtol=1e-12, atol=0), \
                        f"world {world} {dtype} {op_name(op)} rank {rank}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_simulated_lists_and_in_place(algorithm):
    for world in (1, 2, 3, 4, 5, 6, 7, 9, 12):
        for numel in (1, world + 1, 40):
            want = summed(world, numel)
            originals = [rank_input(r, world, numel) for r in range(world)]

            def separate(rank):
                return (torch.zeros(numel, dtype=torch.int64), list(originals[rank].clone().chunk(world))), {}

            def staged(rank):       # separate tensors, not back to back: staged through one buffer
                return (torch.zeros(numel, dtype=torch.int64),
                        [c.clone() for c in originals[rank].chunk(world)]), {}

            def in_place(rank):     # NCCL's in-place form: the output is this rank's block of the input
                tensor = originals[rank].clone()
                return (tensor[rank * numel:(rank + 1) * numel], tensor), {}

            for collective, make in (("reduce_scatter", separate), ("reduce_scatter", staged),
                                     ("reduce_scatter_single", in_place)):
                args, _ = run_world(collective, algorithm, world, make)
                for rank, (output, inputs) in enumerate(args):
                    assert torch.equal(output, want[rank * numel:(rank + 1) * numel]), \
                        f"{make.__name__}: world {world} numel {numel} rank {rank}"
                    if make is not in_place:
                        assert torch.equal(torch.cat(inputs), originals[rank]), f"{make.__name__}: input changed"
                    else:
                        outside = torch.ones(world * numel, dtype=torch.bool)
                        outside[rank * numel:(rank + 1) * numel] = False
                        assert torch.equal(inputs[outside], originals[rank][outside]), "in place: other blocks changed"


def test_cost_models_match_the_simulated_messages():
    for world in (2, 4, 8, 16):
        for algorithm, messages in (("ring", world - 1), ("pairwise", world - 1),
                                    ("recursive_halving", world.bit_length() - 1)):
            sim = ringcoll.simulate("reduce_scatter_single", algorithm, world,
                                    call=lambda rank: ((torch.zeros(64), torch.ones(world * 64)), {}))
            assert sim.cost.alpha == messages, algorithm
            assert sim.stats.messages == world * messages, algorithm
            assert sim.stats.max_bytes_sent == sim.cost.beta, algorithm
            assert sim.stats.bytes_reduced == world * sim.cost.gamma, algorithm


# -- real gloo ----------------------------------------------------------------------------
def values(rank, numel, dtype, op):
    """Never-zero data whose reduction by ``op`` is exact in any order (small integers;
    powers of two for PRODUCT), distinct across ranks."""
    raw = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1
    if dtype == torch.bool:
        return raw % 3 != 0
    if not dtype.is_floating_point:
        return raw.to(dtype)
    sign = 1 - 2 * (raw % 5 == 0).to(torch.float64)
    if getattr(op, "op", op) == R.PRODUCT:
        return (sign * torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)[raw % 3]).to(dtype)
    return (sign * (raw % 4 + 1)).to(dtype)


def builtin_reduce_scatter(output, tensor, op, group=None):
    if tensor.dtype == torch.int16:     # gloo has no int16: widen (exact modulo 2^16) and narrow back
        wide = torch.empty(output.shape, dtype=torch.int32)
        builtin_reduce_scatter(wide, tensor.to(torch.int32), op, group)
        output.copy_(wide)
        return
    if getattr(op, "op", op) == R.PREMUL_SUM:     # gloo lacks PREMUL_SUM: SUM of the premultiplied input
        tensor, op = tensor * 0.25, R.SUM
    # (torch 2.11, the GPU image's, has it under its older name only)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, tensor, op=op, group=group)


def compare_with_builtin():
    """Every algorithm x every op and dtype torch allows, at a block size not divisible by the
    world; the list variant and the edge sizes on a few."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [(dtype, op, world + 1) for dtype in FLOATS + INTS + (torch.bool,) for op in ops_for(dtype)]
    cases += [(torch.float32, R.SUM, 1), (torch.int32, R.BXOR, 300), (torch.float64, R.MAX, 0)]
    references = {}
    for dtype, op, numel in cases:
        want = torch.empty(numel, dtype=dtype)
        builtin_reduce_scatter(want, values(rank, world * numel, dtype, op), op)
        references[dtype, op_name(op), numel] = want
    problems = []
    for algorithm in ALGORITHMS + ["auto"]:
        for dtype, op, numel in cases:
            if algorithm == "auto" and op_name(op) != "SUM":
                continue
            tensor = values(rank, world * numel, dtype, op)
            before = tensor.clone()
            want = references[dtype, op_name(op), numel]
            output = torch.zeros(numel, dtype=dtype)
            ringcoll.reduce_scatter_single(output, tensor, op=op, algorithm=algorithm)
            outputs = [output]
            if dtype in (torch.bfloat16, torch.uint8) or numel != world + 1:
                listed = torch.zeros(numel, dtype=dtype)
                ringcoll.reduce_scatter(listed, [t.clone() for t in tensor.chunk(world)] if numel else
                                        [torch.zeros(0, dtype=dtype) for _ in range(world)], op=op,
                                        algorithm=algorithm)
                outputs.append(listed)
            name = f"{algorithm} {dtype} {op_name(op)} numel {numel}"
            for got in outputs:
                if op_name(op) in ("AVG", "PREMUL_SUM"):
                    ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-3)
                else:
                    ok = torch.equal(got, want)
                if not ok:
                    problems.append(f"{name}: {got[:6].tolist()} != {want[:6].tolist()}")
            if not torch.equal(tensor, before):
                problems.append(f"{name}: the input changed")
    return problems


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_matches_builtin_every_op_and_dtype(clusters, world):
    assert_no_problems(clusters(world).run(compare_with_builtin))


def shapes_and_aliasing():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for algorithm in ALGORITHMS:
        source = (torch.arange(world * 6, dtype=torch.float32) % 7 + 1) * (rank + 1)
        want = torch.empty(6)
        dist.reduce_scatter_single(want, source)
        for shape in ((world * 6,), (world, 2, 3), (2 * world, 3)):        # flat, stacked, concatenated
            output = torch.zeros(2, 3)
            tensor = source.clone().view(shape)
            ringcoll.reduce_scatter_single(output, tensor, algorithm=algorithm)
            out[f"{algorithm} input {shape}"] = torch.equal(output.flatten(), want) and \
                torch.equal(tensor.flatten(), source)
        tensor = source.clone()                                              # in place
        ringcoll.reduce_scatter_single(tensor[6 * rank:6 * rank + 6], tensor, algorithm=algorithm)
        out[f"{algorithm} in place"] = torch.equal(tensor[6 * rank:6 * rank + 6], want)
        strided = torch.zeros(3, 2).t()                                      # non-contiguous output
        ringcoll.reduce_scatter_single(strided, source.clone(), algorithm=algorithm)
        out[f"{algorithm} non-contiguous output"] = torch.equal(strided.reshape(-1), want) and \
            not strided.is_contiguous()
        noncontig = source.view(world, 6).t().contiguous().t()              # non-contiguous input, same values
        output = torch.zeros(6)
        ringcoll.reduce_scatter_single(output, noncontig, algorithm=algorithm)
        out[f"{algorithm} non-contiguous input"] = torch.equal(output, want) and not noncontig.is_contiguous()
        listed = [torch.zeros(3, 2).t() for _ in range(world)]             # non-contiguous list
        for index, item in enumerate(listed):
            item.copy_(source[6 * index:6 * index + 6].view(2, 3))
        output = torch.zeros(6)
        ringcoll.reduce_scatter(output, listed, algorithm=algorithm)
        out[f"{algorithm} non-contiguous list"] = torch.equal(output, want)
        empty = torch.zeros(0)
        ringcoll.reduce_scatter_single(empty, torch.zeros(0), algorithm=algorithm)
        out[f"{algorithm} empty"] = empty.numel() == 0
    return out


def test_shapes_in_place_and_non_contiguous(clusters):
    assert_every_rank(clusters(3).run(shapes_and_aliasing))


def in_sub_group(members):
    group = dist.new_group(members)
    rank = dist.get_rank()
    out = {}
    for algorithm in ALGORITHMS:
        tensor = (torch.arange(4 * len(members), dtype=torch.int64) + 1) * (rank + 1)
        output = torch.zeros(4, dtype=torch.int64)
        listed = torch.zeros(4, dtype=torch.int64)
        want = torch.zeros(4, dtype=torch.int64)
        results = (ringcoll.reduce_scatter_single(output, tensor, op=R.MAX, group=group, algorithm=algorithm),
                   ringcoll.reduce_scatter(listed, list(tensor.chunk(len(members))), group=group,
                                           algorithm=algorithm))
        if rank in members:
            dist.reduce_scatter_single(want, tensor, op=R.MAX, group=group)
        sums = torch.zeros(4, dtype=torch.int64)
        if rank in members:
            dist.reduce_scatter_single(sums, tensor, group=group)
        out[algorithm] = (results, output.tolist(), want.tolist(), listed.tolist(), sums.tolist())
    dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (8, [7, 1, 4, 2, 6])])
def test_sub_group(clusters, world, members):
    for rank, out in enumerate(clusters(world).run(in_sub_group, members)):
        for algorithm, (results, output, want, listed, sums) in out.items():
            assert results == (None, None)
            if rank in members:
                assert output == want and listed == sums, f"rank {rank} {algorithm}"
            else:
                assert not any(output) and not any(listed), f"rank {rank} {algorithm}: touched outside the group"


def asynchronous():
    rank, world = dist.get_rank(), dist.get_world_size()
    checks = []
    for algorithm in ALGORITHMS:
        tensor = torch.arange(world * 5, dtype=torch.float64) + rank
        output, listed, want = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64), \
            torch.zeros(5, dtype=torch.float64)
        works = [ringcoll.reduce_scatter_single(output, tensor, op=R.AVG, async_op=True, algorithm=algorithm),
                 ringcoll.reduce_scatter(listed, list(tensor.chunk(world)), op=R.AVG, async_op=True,
                                         algorithm=algorithm)]
        dist.reduce_scatter_single(want, tensor, op=R.AVG)
        waited = [work.wait() for work in works]
        checks.append(all(waited) and all(isinstance(w, ringcoll.Work) and w.is_completed() for w in works))
        checks.append(works[0].result()[0] is output and works[1].result()[0] is listed)
        checks.append(torch.allclose(output, want) and torch.allclose(listed, want))
    return checks


def test_async_op_and_result(clusters):
    assert_every_rank(clusters(4).run(asynchronous))


def bad_inputs():
    _rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(4 * world, dtype=torch.float32) + 1
    inputs = [torch.full((4,), 5.0) for _ in range(world)]
    output = torch.full((4,), 7.0)
    ints = torch.ones(4 * world, dtype=torch.int32)
    cases = {
        "input not divisible": (ValueError, lambda: ringcoll.reduce_scatter_single(output, tensor[:-1])),
        "input too large": (ValueError, lambda: ringcoll.reduce_scatter_single(output[:3], tensor)),
        "mixed dtypes": (ValueError, lambda: ringcoll.reduce_scatter_single(output.double(), tensor)),
        "mixed devices": (ValueError, lambda: ringcoll.reduce_scatter_single(torch.zeros(4, device="meta"), tensor)),
        "list too long": (ValueError, lambda: ringcoll.reduce_scatter(output, inputs + [inputs[0]])),
        "list too short": (ValueError, lambda: ringcoll.reduce_scatter(output, inputs[:-1])),
        "uneven list": (ValueError, lambda: ringcoll.reduce_scatter(output, inputs[:-1] + [torch.ones(5)])),
        "tuple, not list": (TypeError, lambda: ringcoll.reduce_scatter(output, tuple(inputs))),
        "mixed dtypes in list": (ValueError, lambda: ringcoll.reduce_scatter(
            output, inputs[:-1] + [torch.ones(4, dtype=torch.float64)])),
        "mixed devices in list": (ValueError, lambda: ringcoll.reduce_scatter(
            output, inputs[:-1] + [torch.ones(4, device="meta")])),
        "BAND on float": (ValueError, lambda: ringcoll.reduce_scatter_single(output, tensor, op=R.BAND)),
        "AVG on int": (ValueError, lambda: ringcoll.reduce_scatter_single(ints[:4], ints, op=R.AVG)),
        "PREMUL on int": (ValueError, lambda: ringcoll.reduce_scatter(
            ints[:4], list(ints.chunk(world)), op=dist._make_nccl_premul_sum(2.0))),
        "op not a ReduceOp": (TypeError, lambda: ringcoll.reduce_scatter_single(output, tensor, op="sum")),
        "unknown algorithm": (ValueError, lambda: ringcoll.reduce_scatter_single(output, tensor, algorithm="bruck")),
        "async_op not a bool": (TypeError, lambda: ringcoll.reduce_scatter(output, inputs, async_op=[1])),
    }
    wrong = wrong_errors(cases)
    untouched = bool((output == 7).all()) and all(bool((x == 5).all()) for x in inputs) and \
        torch.equal(tensor, torch.arange(4 * world, dtype=torch.float32) + 1) and bool((ints == 1).all())
    ringcoll.reduce_scatter(output, inputs)          # still in step afterwards
    return wrong, untouched, output.tolist() == [5.0 * world] * 4


def test_bad_input_raises_before_touching_anything(clusters):
    for rank, (wrong, untouched, ok) in enumerate(clusters(2).run(bad_inputs)):
        assert not wrong, f"rank {rank}: {wrong}"
        assert untouched and ok
