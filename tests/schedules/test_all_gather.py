"""all_gather and all_gather_single: every algorithm in the simulator, then against
torch.distributed's built-ins on real gloo processes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import (DTYPES, SIM_WORLDS, assert_every_rank, block, block_numels, run_world, values, wrong_errors)
from conftest import GLOO_WORLDS

ALGORITHMS = ringcoll.algorithms("all_gather")


# -- simulator ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_simulated_every_world_and_size(algorithm):
    for world in SIM_WORLDS:
        for numel in block_numels(world):
            want = torch.cat([block(r, numel) for r in range(world)])
            sim = ringcoll.simulate(
                "all_gather_single", algorithm, world,
                call=lambda rank: ((torch.zeros(world * numel, dtype=torch.int64), block(rank, numel)), {}))
            for rank, result in enumerate(sim.outputs):
                got = torch.cat(result) if numel else torch.zeros(0, dtype=torch.int64)
                assert torch.equal(got, want), \
                    f"world {world} numel {numel} rank {rank}: first wrong index " \
                    f"{(got != want).nonzero()[:1].tolist()}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_simulated_in_place_and_lists(algorithm):
    for world in (1, 2, 3, 5, 6, 7, 8, 12):
        for numel in (1, world + 1, 50):
            want = torch.cat([block(r, numel) for r in range(world)])

            def in_place(rank):
                output = torch.zeros(world * numel, dtype=torch.int64)
                output[rank * numel:(rank + 1) * numel] = block(rank, numel)
                return (output, output[rank * numel:(rank + 1) * numel]), {}

            args, _ = run_world("all_gather_single", algorithm, world, in_place)
            for rank, (output, _) in enumerate(args):
                assert torch.equal(output, want), f"in place: world {world} numel {numel} rank {rank}"

            def separate(rank):     # a list of separate tensors: staged through one buffer
                return ([torch.zeros(numel, dtype=torch.int64) for _ in range(world)], block(rank, numel)), {}

            def chunked(rank):      # the chunks of one buffer, the input one of them: written in place
                outputs = list(torch.zeros(world * numel, dtype=torch.int64).chunk(world))
                outputs[rank].copy_(block(rank, numel))
                return (outputs, outputs[rank]), {}

            for make in (separate, chunked):
                args, results = run_world("all_gather", algorithm, world, make)
                for rank, ((outputs, _), result) in enumerate(zip(args, results)):
                    assert result is outputs
                    assert torch.equal(torch.cat(outputs), want), f"{make.__name__}: world {world} rank {rank}"


def test_simulated_input_may_alias_another_block():
    world, numel = 5, 7
    want = torch.cat([block(r, numel) for r in range(world)])
    for algorithm in ALGORITHMS:
        def aliased(rank):      # the input lies in the block of the next rank
            output = torch.zeros(world * numel, dtype=torch.int64)
            other = (rank + 1) % world
            output[other * numel:(other + 1) * numel] = block(rank, numel)
            return (output, output[other * numel:(other + 1) * numel]), {}

        args, _ = run_world("all_gather_single", algorithm, world, aliased)
        for rank, (output, _) in enumerate(args):
            assert torch.equal(output, want), f"{algorithm} rank {rank}"


def test_cost_models_match_the_simulated_messages():
    for world in (2, 4, 8, 16):
        for algorithm, messages in (("ring", world - 1), ("recursive_doubling", world.bit_length() - 1),
                                    ("bruck", world.bit_length() - 1)):
            sim = ringcoll.simulate("all_gather_single", algorithm, world,
                                    call=lambda rank: ((torch.zeros(world * 64), torch.ones(64)), {}))
            assert sim.cost.alpha == messages, algorithm
            assert sim.stats.messages == world * messages, algorithm
            assert sim.stats.max_bytes_sent == sim.cost.beta, algorithm


# -- real gloo ----------------------------------------------------------------------------
def builtin_all_gather_single(output, tensor, group=None):
    if tensor.dtype == torch.int16:     # gloo has no int16: widen (exact) and narrow back
        wide = torch.empty(output.shape, dtype=torch.int32)
        builtin_all_gather_single(wide, tensor.to(torch.int32), group)
        output.copy_(wide)
        return
    # (torch 2.11, the GPU image's, has it under its older name only)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, tensor, group=group)


def compare_with_builtin():
    """Every algorithm: every dtype at a size not divisible by the world, both variants, and
    the edge sizes; one built-in reference per (dtype, size)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [(dtype, world + 1) for dtype in DTYPES] + [(torch.float32, 1), (torch.int64, 300)]
    references = {}
    for dtype, numel in cases:
        want = torch.empty(world * numel, dtype=dtype)
        builtin_all_gather_single(want, values(rank, numel, dtype))
        references[dtype, numel] = want
    problems, bits = [], []
    for algorithm in ALGORITHMS + ["auto"]:
        for dtype, numel in cases:
            tensor = values(rank, numel, dtype)
            before = tensor.clone()
            want = references[dtype, numel]
            output = torch.full((world * numel,), 3, dtype=dtype)
            ringcoll.all_gather_single(output, tensor, algorithm=algorithm)
            name = f"{algorithm} {dtype} numel {numel}"
            if not torch.equal(output, want):
                problems.append(f"all_gather_single {name}: {output[:6].tolist()} != {want[:6].tolist()}")
            if dtype in (torch.bfloat16, torch.int8, torch.bool) or numel != world + 1:
                outputs = [torch.zeros(numel, dtype=dtype) for _ in range(world)]
                ringcoll.all_gather(outputs, tensor, algorithm=algorithm)
                if not torch.equal(torch.cat(outputs), want):
                    problems.append(f"all_gather {name}")
            if not torch.equal(tensor, before):
                problems.append(f"{name}: the input changed")
            bits.append(output.view(torch.uint8).numpy().tobytes())
    return problems, bits


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_matches_builtin_every_dtype_bitwise_on_every_rank(clusters, world):
    answers = clusters(world).run(compare_with_builtin)
    for rank, (problems, _) in enumerate(answers):
        assert not problems, f"rank {rank}: {problems[:5]}"
    for rank, (_, bits) in enumerate(answers):
        assert bits == answers[0][1], f"rank {rank}'s results differ in bits from rank 0's"


def shapes_and_aliasing():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for algorithm in ALGORITHMS:
        tensor = values(rank, 6, torch.float32).view(2, 3)
        want = torch.empty(2 * world, 3)
        dist.all_gather_single(want, tensor)
        for shape in ((2 * world, 3), (world, 2, 3), (6 * world,)):          # concatenated, stacked, flat
            output = torch.zeros(shape)
            ringcoll.all_gather_single(output, tensor, algorithm=algorithm)
            out[f"{algorithm} output {shape}"] = torch.equal(output.reshape(2 * world, 3), want)
        output = torch.zeros(2 * world, 3)                                   # in place
        output[2 * rank:2 * rank + 2] = tensor
        ringcoll.all_gather_single(output, output[2 * rank:2 * rank + 2], algorithm=algorithm)
        out[f"{algorithm} in place"] = torch.equal(output, want)
        output = torch.zeros(2 * world, 3)                                   # input in another rank's block
        other = (rank + 1) % world
        output[2 * other:2 * other + 2] = tensor
        ringcoll.all_gather_single(output, output[2 * other:2 * other + 2], algorithm=algorithm)
        out[f"{algorithm} input in another block"] = torch.equal(output, want)
        strided = torch.zeros(3, 2 * world).t()                              # non-contiguous output
        ringcoll.all_gather_single(strided, tensor.t().contiguous().t(), algorithm=algorithm)
        out[f"{algorithm} non-contiguous"] = torch.equal(strided, want) and not strided.is_contiguous()
        outputs = [torch.zeros(3, 2).t() for _ in range(world)]             # non-contiguous list
        ringcoll.all_gather(outputs, tensor.t().contiguous().t(), algorithm=algorithm)
        out[f"{algorithm} non-contiguous list"] = torch.equal(torch.cat(outputs), want)
        scalars = [torch.zeros(()) for _ in range(world)]                   # 0-d tensors
        ringcoll.all_gather(scalars, torch.tensor(rank + 0.5), algorithm=algorithm)
        out[f"{algorithm} scalars"] = [s.item() for s in scalars] == [r + 0.5 for r in range(world)]
        empty = torch.zeros(0)
        ringcoll.all_gather_single(empty, torch.zeros(0), algorithm=algorithm)
        out[f"{algorithm} empty"] = empty.numel() == 0
    return out


def test_shapes_in_place_and_non_contiguous(clusters):
    assert_every_rank(clusters(3).run(shapes_and_aliasing))


def in_sub_group(members):
    group = dist.new_group(members)
    rank = dist.get_rank()
    out = {}
    for algorithm in ALGORITHMS:
        tensor = values(rank, 5, torch.int32)
        output = torch.zeros(5 * len(members), dtype=torch.int32)
        outputs = [torch.zeros(5, dtype=torch.int32) for _ in members]
        want = torch.zeros(5 * len(members), dtype=torch.int32)
        results = (ringcoll.all_gather_single(output, tensor, group=group, algorithm=algorithm),
                   ringcoll.all_gather(outputs, tensor, group=group, algorithm=algorithm))
        if rank in members:
            dist.all_gather_single(want, tensor, group=group)
        out[algorithm] = (results, output.tolist(), torch.cat(outputs).tolist(), want.tolist())
    dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (8, [7, 1, 4, 2, 6])])
def test_sub_group(clusters, world, members):
    for rank, out in enumerate(clusters(world).run(in_sub_group, members)):
        for algorithm, (results, output, outputs, want) in out.items():
            assert results == (None, None)
            if rank in members:
                assert output == want and outputs == want, f"rank {rank} {algorithm}"
            else:
                assert not any(output) and not any(outputs), f"rank {rank} {algorithm}: touched outside the group"


def asynchronous():
    rank, world = dist.get_rank(), dist.get_world_size()
    checks = []
    for algorithm in ALGORITHMS:
        tensor = values(rank, 4, torch.float64)
        outputs = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
        output = torch.zeros(world * 4, dtype=torch.float64)
        works = [ringcoll.all_gather_single(output, tensor, async_op=True, algorithm=algorithm),
                 ringcoll.all_gather(outputs, tensor, async_op=True, algorithm=algorithm)]
        builtin_out = torch.zeros(world * 4, dtype=torch.float64)
        builtin = dist.all_gather_single(builtin_out, tensor, async_op=True)
        builtin.wait()
        for work in works:
            work.wait()
        views = works[0].result()
        checks.append(isinstance(works[0], ringcoll.Work) and works[0].is_completed())
        checks.append(len(views) == world and all(v.shape == tensor.shape for v in views))
        checks.append([v.tolist() for v in views] == [v.tolist() for v in builtin.result()])
        checks.append(all(v.data_ptr() == output[r * 4:].data_ptr() for r, v in enumerate(views)))
        checks.append(works[1].result() is outputs)
        checks.append(torch.equal(output, builtin_out) and torch.equal(torch.cat(outputs), builtin_out))
    return checks


def test_async_op_and_result(clusters):
    assert_every_rank(clusters(4).run(asynchronous))


def bad_inputs():
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(4, dtype=torch.float32) + 1
    output = torch.full((4 * world,), 7.0)
    outputs = [torch.full((4,), 7.0) for _ in range(world)]
    cases = {
        "list too long": (ValueError, lambda: ringcoll.all_gather(outputs + [torch.zeros(4)], tensor)),
        "list too short": (ValueError, lambda: ringcoll.all_gather(outputs[:-1], tensor)),
        "tuple, not list": (TypeError, lambda: ringcoll.all_gather(tuple(outputs), tensor)),
        "list of non-tensors": (TypeError, lambda: ringcoll.all_gather([1.0] * world, tensor)),
        "uneven sizes": (ValueError, lambda: ringcoll.all_gather(outputs[:-1] + [torch.zeros(5)], tensor)),
        "mixed dtypes in list": (ValueError, lambda: ringcoll.all_gather(
            outputs[:-1] + [torch.zeros(4, dtype=torch.float64)], tensor)),
        "mixed devices in list": (ValueError, lambda: ringcoll.all_gather(
            outputs[:-1] + [torch.zeros(4, device="meta")], tensor)),
        "output size != world x input": (ValueError, lambda: ringcoll.all_gather_single(output[:-1], tensor)),
        "output too large": (ValueError, lambda: ringcoll.all_gather_single(
            torch.zeros(4 * world + 4), tensor)),
        "mixed dtypes": (ValueError, lambda: ringcoll.all_gather_single(output.double(), tensor)),
        "mixed devices": (ValueError, lambda: ringcoll.all_gather_single(
            torch.zeros(4 * world, device="meta"), tensor)),
        "input not a tensor": (TypeError, lambda: ringcoll.all_gather_single(output, [1.0])),
        "complex input, real output": (ValueError, lambda: ringcoll.all_gather_single(
            output, torch.ones(4, dtype=torch.complex64))),
        "unknown algorithm": (ValueError, lambda: ringcoll.all_gather(outputs, tensor, algorithm="pairwise")),
        "algorithm not a str": (TypeError, lambda: ringcoll.all_gather_single(output, tensor, algorithm=1)),
        "async_op not a bool": (TypeError, lambda: ringcoll.all_gather(outputs, tensor, async_op="yes")),
        "group not a group": (TypeError, lambda: ringcoll.all_gather(outputs, tensor, group=0)),
    }
    wrong = wrong_errors(cases)
    untouched = bool((output == 7).all()) and all(bool((o == 7).all()) for o in outputs) and \
        torch.equal(tensor, torch.arange(4, dtype=torch.float32) + 1)
    # still in step afterwards
    ringcoll.all_gather_single(output, tensor + rank)
    return wrong, untouched, output.tolist() == torch.cat([tensor + r for r in range(world)]).tolist()


def test_bad_input_raises_before_touching_anything(clusters):
    for rank, (wrong, untouched, ok) in enumerate(clusters(2).run(bad_inputs)):
        assert not wrong, f"rank {rank}: {wrong}"
        assert untouched and ok
