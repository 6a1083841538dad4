"""The object collectives against torch.distributed's own on 3 gloo ranks: nested Python
objects of different sizes per rank, None and empty containers, every root, sub-groups
(a rank outside the group keeps its lists untouched), and torch's errors."""
from __future__ import annotations

import collections

import torch
import torch.distributed as dist

import ringcoll

Point = collections.namedtuple("Point", "x y")


def objects_of(rank: int) -> list:
    """Per rank a different list of objects: nested containers, None, empty ones, a long
    string only on some ranks (so the sizes differ and padding shows), a namedtuple."""
    return [
        {"rank": rank, "nested": [1, (2.5, {"deep": [None, rank]}), {3, 4}], "empty": {}},
        None,
        [],
        "x" * (1000 * rank + 1),
        Point(rank, [rank] * rank),
        (),
        b"\x00bytes\xff" * rank,
    ]


def both(fn_name: str, call) -> tuple:
    """``call(fn)`` with torch's function and with ringcoll's (in that order); what each left."""
    return call(getattr(dist, fn_name)), call(getattr(ringcoll, fn_name))


def against_builtin(members=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(members) if members is not None else None
    ranks = members if members is not None else list(range(world))
    inside = rank in ranks
    size = len(ranks)
    me = ranks.index(rank) if inside else None
    out = {}
    for index, obj in enumerate(objects_of(rank)):
        def gather_all(fn, obj=obj):
            got = ["untouched"] * size
            result = fn(got, obj, group=group)
            return got, result
        out[f"all_gather_object {index}"] = both("all_gather_object", gather_all)
    for root in range(size):
        global_root = ranks[root]

        def gather_one(fn, by_group):
            got = ["untouched"] * size if me == root else None
            kwargs = {"group_dst": root} if by_group else {"dst": global_root}
            result = fn(objects_of(rank), got, group=group, **kwargs)
            return got, result

        def broadcast_list(fn, by_group):
            got = objects_of(rank) if me == root else ["untouched"] * 7
            kwargs = {"group_src": root} if by_group else {"src": global_root}
            result = fn(got, group=group, **kwargs)
            return got, result

        def scatter_list(fn, by_group):
            got = ["untouched", "second"]
            inputs = [objects_of(r) for r in ranks] if me == root else None
            kwargs = {"group_src": root} if by_group else {"src": global_root}
            result = fn(got, inputs, group=group, **kwargs)
            return got, result

        for by_group in (False, True):
            how = f"root {root} {'group' if by_group else 'global'} rank"
            out[f"gather_object {how}"] = both("gather_object", lambda fn: gather_one(fn, by_group))
            out[f"broadcast_object_list {how}"] = both("broadcast_object_list", lambda fn: broadcast_list(fn, by_group))
            out[f"scatter_object_list {how}"] = both("scatter_object_list", lambda fn: scatter_list(fn, by_group))
    # the defaults: root global rank 0 (when it is in the group)
    if 0 in ranks:
        out["gather_object default dst"] = both(
            "gather_object", lambda fn: (lambda got: (got, fn(rank, got, group=group)))(
                [None] * size if rank == 0 else None))
        out["broadcast_object_list default src"] = both(
            "broadcast_object_list", lambda fn: (lambda got: (got, fn(got, group=group)))(
                [{"from": rank}, None] if rank == 0 else ["untouched"] * 2))
        out["scatter_object_list default src"] = both(
            "scatter_object_list", lambda fn: (lambda got: (got, fn(got, list(range(10, 10 + size)) if rank == 0
                                                                  else None, group=group)))(["untouched"]))
    if group is not None:
        dist.destroy_process_group(group)
    return out


def _compare(results):
    problems = []
    for rank, out in enumerate(results):
        for name, (theirs, ours) in out.items():
            if theirs != ours:
                problems.append(f"rank {rank} {name}: torch {str(theirs)[:120]} != ringcoll {str(ours)[:120]}")
    return problems


def test_every_object_collective_matches_builtin(clusters):
    results = clusters(3).run(against_builtin)
    assert len(results[0]) == 7 + 3 * 2 * 3 + 3
    assert not _compare(results)
    # and the outputs are what they should be (not just equal to torch's)
    got, result = results[1]["all_gather_object 3"][1]
    assert result is None and got == ["x", "x" * 1001, "x" * 2001]
    got, _ = results[2]["scatter_object_list root 1 group rank"][1]
    assert got == [objects_of(2), "second"]
    got, _ = results[0]["broadcast_object_list root 2 global rank"][1]
    assert got == objects_of(2)


def test_sub_groups_and_ranks_outside(clusters):
    """Group [0, 2] of 3 ranks (rank 1 outside: its lists stay untouched, the calls return
    None at once), and group [1, 2] (global rank 0, the default root, outside it)."""
    for members in ([0, 2], [1, 2]):
        results = clusters(3).run(against_builtin, members)
        assert not _compare(results), members
        outside = ({0, 1, 2} - set(members)).pop()
        for name, (_, (got, result)) in results[outside].items():
            assert result is None
            assert got is None or set(map(str, got)) <= {"untouched", "second"}, name
        got, _ = results[members[1]]["all_gather_object 4"][1]
        assert got == [objects_of(r)[4] for r in members]


def errors():
    """Bad calls every rank makes alike, so every rank raises (none waits on another); the
    ranks are still in step afterwards."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}

    def kind(call):
        try:
            call()
        except Exception as error:  # noqa: BLE001 - the type is the point
            return type(error), str(error)
        return None, ""

    for fn in (dist.gather_object, ringcoll.gather_object):
        out[f"{fn.__module__} gather_object dst and group_dst"] = kind(
            lambda fn=fn: fn(rank, [None] * world if rank == 0 else None, dst=0, group_dst=0))[0]
    for fn in (dist.scatter_object_list, ringcoll.scatter_object_list):
        out[f"{fn.__module__} scatter_object_list empty output"] = kind(
            lambda fn=fn: fn([], [1] * world if rank == 0 else None, src=0))[0]
        out[f"{fn.__module__} scatter_object_list src and group_src"] = kind(
            lambda fn=fn: fn([None], [1] * world if rank == 0 else None, src=0, group_src=0))[0]
    # torch raises IndexError after the exchange; ringcoll a ValueError that is an IndexError, first
    torch_kind = kind(lambda: dist.all_gather_object([None] * (world - 1), rank))[0]
    ours = kind(lambda: ringcoll.all_gather_object([None] * (world - 1), rank))
    out["all_gather_object short list: torch"] = torch_kind
    out["all_gather_object short list: ringcoll"] = (issubclass(ours[0], IndexError), issubclass(ours[0], ValueError),
                                                     "object_list" in ours[1])
    out["group not a group"] = kind(lambda: ringcoll.all_gather_object([None] * world, rank, group=3))[0]
    out["broadcast_object_list of a tuple"] = kind(lambda: ringcoll.broadcast_object_list((1, 2)))[0]
    empty = kind(lambda: ringcoll.broadcast_object_list([], src=1))
    out["broadcast_object_list empty"] = empty[0]
    got = [None] * world
    ringcoll.all_gather_object(got, {"in step": rank})
    out["in step"] = got == [{"in step": r} for r in range(world)]
    return out


def test_errors_are_torchs(clusters):
    for rank, out in enumerate(clusters(3).run(errors)):
        for name in ("gather_object dst and group_dst", "scatter_object_list empty output",
                     "scatter_object_list src and group_src"):
            assert out[f"torch.distributed.distributed_c10d {name}"] is ValueError, (rank, name)
            assert out[f"ringcoll.api.objects {name}"] is ValueError, (rank, name)
        assert out["all_gather_object short list: torch"] is IndexError
        assert out["all_gather_object short list: ringcoll"] == (True, True, True)
        assert out["group not a group"] is TypeError
        assert out["broadcast_object_list of a tuple"] is TypeError
        assert out["broadcast_object_list empty"] is (ValueError if rank == 1 else None)
        assert out["in step"]


def point_to_point():
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        ringcoll.send_object_list([{"a": [1, None]}, [], "z" * 3000], dst=world - 1)
        return None
    if rank == world - 1:
        got = [None, None, None]
        source = ringcoll.recv_object_list(got, src=0)
        return got, source
    return None


def test_send_and_recv_object_list_are_torchs(clusters):
    assert ringcoll.send_object_list is dist.send_object_list
    assert ringcoll.recv_object_list is dist.recv_object_list
    results = clusters(3).run(point_to_point)
    assert results[2] == ([{"a": [1, None]}, [], "z" * 3000], 0)


def devices():
    """An explicit ``device=`` (CPU) and a tensor inside an object."""
    rank = dist.get_rank()
    got = [torch.arange(3) + rank, None] if rank == 0 else [None, None]
    ringcoll.broadcast_object_list(got, src=0, device=torch.device("cpu"))
    return torch.equal(got[0], torch.arange(3)) and got[1] is None


def test_device_and_tensors_inside_objects(clusters):
    assert all(clusters(3).run(devices))
