"""gather and scatter: every algorithm and root in the simulator, then against
torch.distributed's built-ins on real gloo processes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import (DTYPES, SIM_WORLDS, assert_equal_per_rank, assert_every_rank, assert_no_problems, block,
                   block_numels, one_thread, values, wrong_errors)  # noqa: F401 - one_thread: an autouse fixture
from conftest import GLOO_WORLDS


def roots(world):
    """Every root class: the first rank, the last, one in the middle."""
    return sorted({0, world - 1, world // 2})


# -- simulator ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ringcoll.algorithms("gather"))
def test_simulated_gather_every_world_size_and_root(algorithm):
    for world in SIM_WORLDS:
        for numel in block_numels(world):
            for root in roots(world):
                sim = ringcoll.simulate(
                    "gather", algorithm, world, dst=root,
                    call=lambda rank: ((block(rank, numel), [torch.zeros(numel, dtype=torch.int64)
                                                             for _ in range(world)] if rank == root else None), {}))
                for rank, result in enumerate(sim.outputs):
                    if rank != root:
                        assert result == []
                        continue
                    for source, got in enumerate(result):
                        assert torch.equal(got, block(source, numel)), \
                            f"world {world} numel {numel} root {root}: block of rank {source}"


@pytest.mark.parametrize("algorithm", ringcoll.algorithms("scatter"))
def test_simulated_scatter_every_world_size_and_root(algorithm):
    for world in SIM_WORLDS:
        for numel in block_numels(world):
            for root in roots(world):
                sim = ringcoll.simulate(
                    "scatter", algorithm, world, src=root,
                    call=lambda rank: ((torch.zeros(numel, dtype=torch.int64),
                                        [block(r, numel) for r in range(world)] if rank == root else None), {}))
                for rank, (got,) in enumerate(sim.outputs):
                    assert torch.equal(got, block(rank, numel)), \
                        f"world {world} numel {numel} root {root} rank {rank}"


def test_simulated_group_roots_and_chunked_lists():
    """group_dst/group_src name the root too; a list of chunks of one buffer is written in place."""
    for world in (1, 3, 6, 7):
        numel = world + 2
        for algorithm in ringcoll.algorithms("gather"):
            root = world - 1
            storage = torch.zeros(world * numel, dtype=torch.int64)
            sim = ringcoll.simulate(
                "gather", algorithm, world, group_dst=root,
                call=lambda rank: ((block(rank, numel), list(storage.chunk(world)) if rank == root else None), {}))
            assert torch.equal(torch.cat(sim.outputs[root]), torch.cat([block(r, numel) for r in range(world)]))
        for algorithm in ringcoll.algorithms("scatter"):
            root = world // 2
            sim = ringcoll.simulate(
                "scatter", algorithm, world, group_src=root,
                call=lambda rank: ((torch.zeros(numel, dtype=torch.int64),
                                    list(torch.cat([block(r, numel) for r in range(world)]).chunk(world))
                                    if rank == root else None), {}))
            assert_equal_per_rank([got for (got,) in sim.outputs], [block(rank, numel) for rank in range(world)],
                                  f"scatter/{algorithm} world {world} numel {numel}")


def test_cost_models_match_the_simulated_messages():
    for world in (2, 4, 8, 16):
        lg = world.bit_length() - 1
        for collective in ("gather", "scatter"):
            for algorithm, alpha in (("linear", world - 1), ("binomial", lg)):
                numel = 16
                root_list = [torch.ones(numel) for _ in range(world)]
                sim = ringcoll.simulate(collective, algorithm, world,
                                        call=lambda rank: ((torch.ones(numel), root_list if rank == 0 else None), {}))
                assert sim.cost.alpha == alpha, (collective, algorithm)
                assert sim.stats.messages == world - 1, (collective, algorithm)    # one per block, either tree
                depth = max(r.steps for r in sim.stats.ranks)
                assert depth <= lg + 2, (collective, algorithm, depth)


# -- real gloo ----------------------------------------------------------------------------
def builtin_gather(tensor, gather_list, dst):
    if tensor.dtype == torch.int16:     # gloo has no int16: widen (exact) and narrow back
        wide = [torch.empty(t.shape, dtype=torch.int32) for t in gather_list] if gather_list else None
        builtin_gather(tensor.to(torch.int32), wide, dst)
        for t, w in zip(gather_list or [], wide or []):
            t.copy_(w)
        return
    dist.gather(tensor, gather_list, dst=dst)


def builtin_scatter(tensor, scatter_list, src):
    if tensor.dtype == torch.int16:
        wide = torch.empty(tensor.shape, dtype=torch.int32)
        builtin_scatter(wide, [t.to(torch.int32) for t in scatter_list] if scatter_list else None, src)
        tensor.copy_(wide)
        return
    dist.scatter(tensor, scatter_list, src=src)


def compare_with_builtin():
    """Every algorithm x every dtype at a size not divisible by the world, at every root
    class; sizes 1 and 300 on one dtype."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [(dtype, world + 1) for dtype in DTYPES] + [(torch.float32, 1), (torch.int64, 300)]
    problems = []
    for root in roots(world):
        is_root = rank == root
        for dtype, numel in cases:
            tensor = values(rank, numel, dtype)
            want = [torch.empty(numel, dtype=dtype) for _ in range(world)] if is_root else None
            builtin_gather(tensor, want, root)
            parts = [values(100 + r, numel, dtype) for r in range(world)] if is_root else None
            wanted = torch.empty(numel, dtype=dtype)
            builtin_scatter(wanted, parts, root)
            for algorithm in ringcoll.algorithms("gather") + ["auto"]:
                name = f"{algorithm} {dtype} numel {numel} root {root}"
                before = tensor.clone()
                got = [torch.zeros(numel, dtype=dtype) for _ in range(world)] if is_root else None
                ringcoll.gather(tensor, got, dst=root, algorithm=algorithm)
                if is_root and not all(torch.equal(g, w) for g, w in zip(got, want)):
                    problems.append(f"gather {name}")
                if not torch.equal(tensor, before):
                    problems.append(f"gather {name}: the input changed")
                received = torch.zeros(numel, dtype=dtype)
                copies = [p.clone() for p in parts] if is_root else None
                ringcoll.scatter(received, copies, src=root, algorithm=algorithm)
                if not torch.equal(received, wanted):
                    problems.append(f"scatter {name}: {received[:4].tolist()} != {wanted[:4].tolist()}")
                if is_root and not all(torch.equal(c, p) for c, p in zip(copies, parts)):
                    problems.append(f"scatter {name}: the scatter_list changed")
    return problems


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_matches_builtin_every_dtype_and_root(clusters, world):
    assert_no_problems(clusters(world).run(compare_with_builtin))


def shapes_and_aliasing():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    root = world - 1
    for algorithm in ringcoll.algorithms("gather"):
        tensor = values(rank, 6, torch.float32).view(2, 3)
        want = [torch.zeros(2, 3) for _ in range(world)] if rank == root else None
        dist.gather(tensor, want, dst=root)
        got = [torch.zeros(3, 2).t() for _ in range(world)] if rank == root else None   # non-contiguous list
        ringcoll.gather(tensor.t().contiguous().t(), got, dst=root, algorithm=algorithm)
        out[f"gather {algorithm} non-contiguous"] = rank != root or all(map(torch.equal, got, want))
        if rank == root:                                     # the root's input is its own slot
            got = list(torch.zeros(world * 2, 3).chunk(world))
            got[rank].copy_(tensor)
            ringcoll.gather(got[rank], got, dst=root, algorithm=algorithm)
        else:
            ringcoll.gather(tensor, None, dst=root, algorithm=algorithm)
        out[f"gather {algorithm} in place"] = rank != root or all(map(torch.equal, got, want))
        if rank == root:                                     # the root's input in another rank's slot
            got = list(torch.zeros(world * 2, 3).chunk(world))
            got[0].copy_(tensor)
            ringcoll.gather(got[0], got, dst=root, algorithm=algorithm)
        else:
            ringcoll.gather(tensor, None, dst=root, algorithm=algorithm)
        out[f"gather {algorithm} input in another slot"] = rank != root or all(map(torch.equal, got, want))
        parts = [values(50 + r, 6, torch.float32).view(3, 2) for r in range(world)] if rank == root else None
        received = torch.zeros(2, 3).t()                     # non-contiguous output
        ringcoll.scatter(received, parts, src=root, algorithm=algorithm)
        out[f"scatter {algorithm} non-contiguous"] = torch.equal(received, values(50 + rank, 6, torch.float32)
                                                                 .view(3, 2)) and not received.is_contiguous()
        scalar = torch.zeros(())
        ringcoll.scatter(scalar, [torch.tensor(r + 0.5) for r in range(world)] if rank == 0 else [],
                         algorithm=algorithm)                # src defaults to global rank 0; [] = None
        out[f"scatter {algorithm} scalar"] = scalar.item() == rank + 0.5
    return out


def test_shapes_in_place_and_non_contiguous(clusters):
    assert_every_rank(clusters(3).run(shapes_and_aliasing))


def in_sub_group(members):
    group = dist.new_group(members)
    members = sorted(members)                  # torch numbers a new group's ranks in global order
    rank = dist.get_rank()
    me = members.index(rank) if rank in members else None
    out = {}
    for algorithm in ringcoll.algorithms("gather"):
        for group_root in sorted({0, len(members) - 1, len(members) // 2}):
            root = members[group_root]
            tensor = torch.arange(3, dtype=torch.int32) + 10 * rank
            got = [torch.zeros(3, dtype=torch.int32) for _ in members] if rank == root else None
            by_global = ringcoll.gather(tensor, got, dst=root, group=group, algorithm=algorithm)
            got_group = [torch.zeros(3, dtype=torch.int32) for _ in members] if rank == root else None
            by_group = ringcoll.gather(tensor, got_group, group=group, group_dst=group_root, algorithm=algorithm)
            parts = [torch.arange(3, dtype=torch.int32) + 100 * k for k in range(len(members))] \
                if rank == root else None
            received = torch.zeros(3, dtype=torch.int32)
            scattered = ringcoll.scatter(received, parts, src=root, group=group, algorithm=algorithm)
            received_group = torch.zeros(3, dtype=torch.int32)
            ringcoll.scatter(received_group, parts, group=group, group_src=group_root, algorithm=algorithm)
            want_scatter = (torch.arange(3) + 100 * me).tolist() if me is not None else [0, 0, 0]
            ok = (by_global, by_group, scattered) == (None, None, None)
            if rank == root:
                want = [(torch.arange(3) + 10 * m).tolist() for m in members]
                ok = ok and [g.tolist() for g in got] == want and [g.tolist() for g in got_group] == want
            ok = ok and received.tolist() == want_scatter and received_group.tolist() == want_scatter
            out[algorithm, group_root] = ok
    dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (8, [7, 1, 4, 2, 6])])
def test_sub_group_global_and_group_roots(clusters, world, members):
    assert_every_rank(clusters(world).run(in_sub_group, members))


def asynchronous():
    rank, world = dist.get_rank(), dist.get_world_size()
    checks = []
    for algorithm in ringcoll.algorithms("gather"):
        tensor = torch.full((5,), float(rank))
        got = [torch.zeros(5) for _ in range(world)] if rank == 1 else None
        received = torch.zeros(5)
        parts = [torch.full((5,), r + 0.5) for r in range(world)] if rank == 2 else None
        works = [ringcoll.gather(tensor, got, dst=1, async_op=True, algorithm=algorithm),
                 ringcoll.scatter(received, parts, src=2, async_op=True, algorithm=algorithm)]
        builtin_got = [torch.zeros(5) for _ in range(world)] if rank == 1 else None
        builtin = [dist.gather(tensor, builtin_got, dst=1, async_op=True),
                   dist.scatter(torch.zeros(5), parts, src=2, async_op=True)]
        for work in works + builtin:
            work.wait()
        checks.append(all(isinstance(w, ringcoll.Work) and w.is_completed() for w in works))
        checks.append(works[0].result() is got if rank == 1 else works[0].result() == [])
        checks.append(len(works[0].result()) == len(builtin[0].result()))
        checks.append(works[1].result()[0] is received and len(builtin[1].result()) == 1)
        checks.append(received.tolist() == [rank + 0.5] * 5)
        checks.append(rank != 1 or [g.tolist() for g in got] == [g.tolist() for g in builtin_got])
    return checks


def test_async_op_and_result(clusters):
    assert_every_rank(clusters(4).run(asynchronous))


def bad_inputs():
    """Checks every rank can make raise on every rank; checks only the root (or only the
    others) can make run on those ranks alone, so nobody is left waiting."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((4,), 5.0)
    slots = [torch.full((4,), 7.0) for _ in range(world)]
    everywhere = {
        "dst out of range": (ValueError, lambda: ringcoll.gather(tensor, None, dst=world)),
        "negative group_dst": (ValueError, lambda: ringcoll.gather(tensor, None, group_dst=-1)),
        "both dst and group_dst": (ValueError, lambda: ringcoll.gather(tensor, None, dst=0, group_dst=0)),
        "dst not an int": (TypeError, lambda: ringcoll.gather(tensor, None, dst=0.5)),
        "src out of range": (ValueError, lambda: ringcoll.scatter(tensor, None, src=world + 3)),
        "group_src out of range": (ValueError, lambda: ringcoll.scatter(tensor, None, group_src=world)),
        "both src and group_src": (ValueError, lambda: ringcoll.scatter(tensor, None, src=0, group_src=0)),
        "gather_list a tuple": (TypeError, lambda: ringcoll.gather(tensor, tuple(slots), dst=0)),
        "scatter_list of non-tensors": (TypeError, lambda: ringcoll.scatter(tensor, [1.0] * world, src=0)),
        "mixed dtypes": (ValueError, lambda: ringcoll.gather(tensor, [s.double() for s in slots], dst=0)),
        "mixed devices": (ValueError, lambda: ringcoll.scatter(
            tensor, slots[:-1] + [torch.zeros(4, device="meta")], src=0)),
        "unknown algorithm": (ValueError, lambda: ringcoll.scatter(tensor, None, src=1, algorithm="ring")),
        "async_op not a bool": (TypeError, lambda: ringcoll.gather(tensor, None, dst=1, async_op="no")),
    }
    # Checks that only some ranks make leave the peers' calls pending (the root's refused call
    # took its number: docs/semantics.md#a-calls-number): they run on a group of their own.
    one_sided = dist.new_group(list(range(world)))
    on_root = {    # root 0
        "gather_list missing on the root": (ValueError, lambda: ringcoll.gather(tensor, None, dst=0, group=one_sided)),
        "gather_list too short": (ValueError, lambda: ringcoll.gather(tensor, slots[:-1], dst=0, group=one_sided)),
        "gather_list uneven": (ValueError, lambda: ringcoll.gather(tensor, slots[:-1] + [torch.zeros(3)], dst=0, group=one_sided)),
        "scatter_list missing on the root": (ValueError, lambda: ringcoll.scatter(tensor, [], src=0, group=one_sided)),
        "scatter_list too long": (ValueError, lambda: ringcoll.scatter(tensor, slots + [slots[0]], src=0, group=one_sided)),
        "scatter_list uneven": (ValueError, lambda: ringcoll.scatter(tensor, slots[:-1] + [torch.ones(5)], src=0, group=one_sided)),
    }
    elsewhere = {
        "gather_list on a non-root": (ValueError, lambda: ringcoll.gather(tensor, slots, dst=0, group=one_sided)),
        "scatter_list on a non-root": (ValueError, lambda: ringcoll.scatter(tensor, slots, src=0, group=one_sided)),
    }
    cases = {**everywhere, **(on_root if rank == 0 else elsewhere)}
    wrong = wrong_errors(cases)
    untouched = bool((tensor == 5).all()) and all(bool((s == 7).all()) for s in slots)
    received = torch.zeros(4)                            # still in step afterwards
    ringcoll.scatter(received, [torch.full((4,), float(r)) for r in range(world)] if rank == 0 else None)
    return wrong, untouched, received.tolist() == [float(rank)] * 4


def test_bad_input_raises_before_touching_anything(clusters):
    for rank, (wrong, untouched, ok) in enumerate(clusters(3).run(bad_inputs)):
        assert not wrong, f"rank {rank}: {wrong}"
        assert untouched and ok
