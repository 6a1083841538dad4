"""Persistent plans (collectives.common.run_call): a repeated synchronous call reuses the
plan its first instance prepared, and never returns anything but what a new plan would.

Each call runs on new integer data written into the same tensors, compared with the
built-in on copies; the executor's ``prepare`` is counted, so a plan that is reused when it
must not be (or not reused when it may) fails here.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.api.common import persistent_plans
from ringcoll.api import common
from ringcoll.runtime.executor import P2PExecutor
from ringcoll.runtime.failures import GroupFailedError, PeerError
from ringcoll.runtime.identity import call_tag, fingerprint
from ringcoll.runtime.nodes import PLACEMENT_TAG

ROUNDS = 3
KINDS = ("broadcast", "all_reduce", "reduce", "all_gather_single", "all_gather",
         "reduce_scatter_single", "reduce_scatter", "gather", "scatter", "all_to_all_single",
         "all_to_all", "barrier")


class _Counting:
    """Counts P2PExecutor.prepare of the calls' own plans in this rank while active (not the
    group's placement exchange, which a fresh process makes once, at its group's first
    collective call)."""

    def __enter__(self):
        self.count, self._original = 0, P2PExecutor.prepare
        counter = self

        def prepare(executor, plan):
            counter.count += plan.collective != "layout"
            return counter._original(executor, plan)

        P2PExecutor.prepare = prepare
        return self

    def __exit__(self, *exc):
        P2PExecutor.prepare = self._original


def _data(rank: int, round_: int, n: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64) * 7 + 100 * rank + 1000 * round_ + offset + 1


def _one_kind(kind: str, n: int = 5):
    """ROUNDS calls of ``kind`` on the same tensors, new data each time; (prepares, wrong)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = []
    with _Counting() as counted:
        if kind == "broadcast":
            t = torch.empty(n, dtype=torch.int64)
            for r in range(ROUNDS):
                t.copy_(_data(rank, r, n))
                ref = t.clone()
                ringcoll.broadcast(t, src=1)
                dist.broadcast(ref, src=1)
                wrong.append(not torch.equal(t, ref))
        elif kind in ("all_reduce", "reduce"):
            t = torch.empty(n, dtype=torch.int64)
            for r in range(ROUNDS):
                t.copy_(_data(rank, r, n))
                ref = t.clone()
                if kind == "all_reduce":
                    ringcoll.all_reduce(t)
                    dist.all_reduce(ref)
                    wrong.append(not torch.equal(t, ref))
                else:
                    ringcoll.reduce(t, dst=2)
                    dist.reduce(ref, dst=2)
                    wrong.append(rank == 2 and not torch.equal(t, ref))
        elif kind in ("all_gather_single", "all_gather"):
            inp, out = torch.empty(n, dtype=torch.int64), torch.empty(world * n, dtype=torch.int64)
            outs = list(torch.empty(world, n, dtype=torch.int64))       # one list of views
            for r in range(ROUNDS):
                inp.copy_(_data(rank, r, n))
                ref = torch.empty_like(out)
                dist.all_gather_single(ref, inp)
                if kind == "all_gather_single":
                    ringcoll.all_gather_single(out, inp)
                    wrong.append(not torch.equal(out, ref))
                else:
                    ringcoll.all_gather(list(outs), inp)                 # a new list, the same tensors
                    wrong.append(not torch.equal(torch.cat(outs), ref))
        elif kind in ("reduce_scatter_single", "reduce_scatter"):
            inp, out = torch.empty(world * n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
            ins = [torch.empty(n, dtype=torch.int64) for _ in range(world)]   # apart: staged
            for r in range(ROUNDS):
                inp.copy_(_data(rank, r, world * n))
                for k, piece in enumerate(inp.chunk(world)):
                    ins[k].copy_(piece)
                ref = torch.empty_like(out)
                dist.reduce_scatter_single(ref, inp)
                if kind == "reduce_scatter_single":
                    ringcoll.reduce_scatter_single(out, inp)
                else:
                    ringcoll.reduce_scatter(out, list(ins))
                wrong.append(not torch.equal(out, ref))
        elif kind in ("gather", "scatter"):
            t = torch.empty(n, dtype=torch.int64)
            parts = [torch.empty(n, dtype=torch.int64) for _ in range(world)] if rank == 1 else None
            for r in range(ROUNDS):
                if kind == "gather":
                    t.copy_(_data(rank, r, n))
                    ref = [torch.empty_like(t) for _ in range(world)] if rank == 1 else None
                    dist.gather(t, ref, dst=1)
                    ringcoll.gather(t, parts, dst=1)
                    wrong.append(rank == 1 and not all(map(torch.equal, parts, ref)))
                else:
                    if parts is not None:
                        for k, part in enumerate(parts):
                            part.copy_(_data(k, r, n, offset=5))
                    ref = torch.empty_like(t)
                    dist.scatter(ref, parts, src=1)
                    ringcoll.scatter(t, parts, src=1)
                    wrong.append(not torch.equal(t, ref))
        elif kind == "all_to_all_single":
            inp, out = torch.empty(world * n, dtype=torch.int64), torch.empty(world * n, dtype=torch.int64)
            for r in range(ROUNDS):
                inp.copy_(_data(rank, r, world * n))
                ref = torch.empty_like(out)
                dist.all_to_all_single(ref, inp)
                ringcoll.all_to_all_single(out, inp)
                wrong.append(not torch.equal(out, ref))
        elif kind == "all_to_all":
            ins = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
            outs = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
            for r in range(ROUNDS):
                for k, t in enumerate(ins):
                    t.copy_(_data(rank, r, n, offset=k))
                refs = [torch.empty_like(t) for t in outs]
                dist.all_to_all(refs, ins)
                ringcoll.all_to_all(outs, ins)
                wrong.append(not all(map(torch.equal, outs, refs)))
        else:
            for _ in range(ROUNDS):
                wrong.append(ringcoll.barrier() is not None)
    return counted.count, wrong


def reuse_every_kind():
    return {kind: _one_kind(kind) for kind in KINDS}


def test_a_repeated_call_reuses_its_plan_and_reads_each_calls_data(clusters):
    # world 3: not a power of two; a call's later instances build nothing, and still read
    # (and write) the tensors' current contents, as the built-in does
    for rank, by_kind in enumerate(clusters(3).run(reuse_every_kind)):
        for kind, (prepares, wrong) in by_kind.items():
            assert wrong == [False] * ROUNDS, (rank, kind, wrong)
            assert prepares == 1, (rank, kind, prepares)


def not_reused_when_the_plan_holds_a_copy():
    """A strided tensor (flat() copies it while building) and an all_to_all_single whose
    input is its output (the input is cloned while building): each call prepares anew."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    with _Counting() as counted:
        grid = torch.empty(4, 3, dtype=torch.int64)
        column = grid[:, 1]
        for r in range(ROUNDS):
            column.copy_(_data(rank, r, 4))
            ref = column.clone()
            ringcoll.broadcast(column, src=0)
            dist.broadcast(ref, src=0)
            out.append(torch.equal(column, ref))
        strided = counted.count
        both = torch.empty(world * 2, dtype=torch.int64)
        for r in range(ROUNDS):
            both.copy_(_data(rank, r, world * 2))
            ref = torch.empty_like(both)
            dist.all_to_all_single(ref, both.clone())
            ringcoll.all_to_all_single(both, both)
            out.append(torch.equal(both, ref))
    return strided, counted.count - strided, out


def test_a_plan_that_copied_the_callers_data_while_building_is_not_reused(clusters):
    for rank, (strided, aliased, right) in enumerate(clusters(3).run(not_reused_when_the_plan_holds_a_copy)):
        assert right == [True] * (2 * ROUNDS), (rank, right)
        assert (strided, aliased) == (ROUNDS, ROUNDS), rank


def changes_build_a_new_plan():
    rank = dist.get_rank()
    executor = common.group_executor(None)
    results = {}
    with _Counting() as counted:
        t = torch.ones(6, dtype=torch.int64)
        ringcoll.all_reduce(t)
        ringcoll.all_reduce(t)
        results["same"] = counted.count
        first = next(reversed(persistent_plans(executor).values())).plan.algorithm.name
        os.environ["RINGCOLL_ALGO"] = "all_reduce=ring"
        try:
            ringcoll.all_reduce(t)
            chosen = next(reversed(persistent_plans(executor).values())).plan.algorithm.name
        finally:
            del os.environ["RINGCOLL_ALGO"]
        ringcoll.all_reduce(t)                  # the first plan again: kept
        results["environment"] = (counted.count, first, chosen)
        ringcoll.all_reduce(t, op=dist.ReduceOp.MAX)
        ringcoll.broadcast(t, src=0)
        ringcoll.broadcast(t, src=1)
        results["arguments"] = counted.count
        t.data = torch.full((6,), 2, dtype=torch.int64)           # the same object, other memory
        ringcoll.all_reduce(t)
        results["memory"] = (counted.count, t.tolist())
        view = t.view(2, 3)                                       # another shape of that memory
        ringcoll.all_reduce(view)
        ringcoll.all_reduce(view)
        results["shape"] = counted.count
        big = torch.ones(common.PERSISTENT_MAX_BYTES // 8 + 1, dtype=torch.int64)
        ringcoll.all_reduce(big)
        ringcoll.all_reduce(big)
        results["large"] = counted.count
        kept = len(persistent_plans(executor))
        many = [torch.full((3,), rank, dtype=torch.int64) for _ in range(common.PERSISTENT_PLANS + 4)]
        for tensor in many:
            ringcoll.all_reduce(tensor)
        results["bounded"] = (kept, len(persistent_plans(executor)), [m.tolist() for m in many[-2:]])
    return results


def test_another_argument_memory_shape_or_environment_builds_a_new_plan(clusters):
    world = 3
    for result in clusters(world).run(changes_build_a_new_plan):
        assert result["same"] == 1
        prepares, first, chosen = result["environment"]
        assert prepares == 2 and first != "ring" and chosen == "ring"
        assert result["arguments"] == 5            # op MAX, then one per root
        assert result["memory"] == (6, [2 * world] * 6)
        assert result["shape"] == 7
        assert result["large"] == 9                # more than PERSISTENT_MAX_BYTES: none kept
        kept, bounded, last = result["bounded"]
        assert bounded == common.PERSISTENT_PLANS and kept <= common.PERSISTENT_PLANS
        assert last == [[sum(range(world))] * 3] * 2


def tags_and_failure_of_a_reused_call():
    """A reused call takes a new number, so a new tag; on a failed group it raises at once."""
    group = dist.new_group(list(range(dist.get_world_size())))
    tags, original = [], P2PExecutor._post

    def post(executor, prepared, index, tag):
        tags.append(tag)
        return original(executor, prepared, index, tag)

    P2PExecutor._post = post
    try:
        t = torch.ones(4)
        for _ in range(3):
            ringcoll.broadcast(t, src=0, group=group)
    finally:
        P2PExecutor._post = original
    executor = common.group_executor(group)
    prepared = next(iter(persistent_plans(executor).values()))
    expected = [call_tag(seq, fingerprint(prepared.plan)) for seq in (1, 2, 3)]
    executor.failure = PeerError("injected", rank=0, peer=1, step=0)
    try:
        ringcoll.broadcast(t, src=0, group=group)
        raised = None
    except GroupFailedError as error:
        raised = str(error)
    dist.destroy_process_group(group)
    # (not the group's placement exchange, on its reserved tag at the group's first call)
    return sorted(set(tags) - {PLACEMENT_TAG}) == expected, raised


def test_a_reused_call_has_its_own_tag_and_a_failed_group_refuses_it(clusters):
    for distinct, raised in clusters(3).run(tags_and_failure_of_a_reused_call):
        assert distinct
        assert raised is not None and "injected" in raised


def grad_leaf():
    t = torch.ones(4, requires_grad=True)
    for _ in range(2):
        ringcoll.all_reduce(t)
        ringcoll.broadcast(t, src=0)
    return t.detach().tolist()


def test_a_reused_plan_on_a_tensor_that_requires_grad(clusters):
    # the reused path runs the schedule on detached views, without torch.no_grad
    world = 3
    assert clusters(world).run(grad_leaf) == [[float(world ** 2)] * 4] * world


@pytest.mark.parametrize("value", [dist.ReduceOp.SUM, [1, 2], (torch.ones(2), 3)])
def test_the_key_of_a_call(value):
    tensors: list = []
    key = common._signature((value,), tensors)
    hash(key)
    assert len(tensors) == (1 if isinstance(value, tuple) else 0)
    with pytest.raises(common._NotKeyed):
        common._signature((torch.ones(2).to_sparse(),), [])


def unkeyed_and_disabled():
    """A call whose key cannot be made (a sparse tensor) gets its checks' own error; with
    PERSISTENT_PLANS = 0 every call builds its plan."""
    try:
        ringcoll.broadcast(torch.ones(4).to_sparse(), src=0)
        error = None
    except TypeError as raised:
        error = str(raised)
    t = torch.ones(4)
    kept = common.PERSISTENT_PLANS
    common.PERSISTENT_PLANS = 0
    try:
        with _Counting() as counted:
            for _ in range(ROUNDS):
                ringcoll.all_reduce(t)
    finally:
        common.PERSISTENT_PLANS = kept
    return error, counted.count, t.tolist()


def test_a_call_without_a_key_is_checked_and_no_plans_can_be_kept(clusters):
    world = 3
    for error, prepares, values in clusters(world).run(unkeyed_and_disabled):
        assert error is not None and "tensor" in error and "strided" in error, error
        assert prepares == ROUNDS and values == [float(world ** ROUNDS)] * 4


def moved_memory_is_never_reused():
    """A storage resized in place (FSDP frees and re-allocates parameters so) moves the
    memory under a kept plan, and its old address may go to another tensor. Here the plan is
    filed under the moved tensor's new key, as such a coincidence would: it must not run."""
    world = dist.get_world_size()
    executor = common.group_executor(None)
    t = torch.full((8,), 1.0)
    ringcoll.all_reduce(t)
    (key, prepared), = [(k, p) for k, p in persistent_plans(executor).items()
                        if p.plan.buffers["data"].untyped_storage().data_ptr() == t.untyped_storage().data_ptr()]
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)
    storage.resize_(nbytes)                  # new memory under the same tensor and plan
    t.fill_(2.0)
    moved = prepared.moved()
    build, names, arguments, *environment = key
    new_key = (build, names, common._signature((t,), []) + arguments[1:], *environment)
    persistent_plans(executor)[new_key] = prepared
    with _Counting() as counted:
        ringcoll.all_reduce(t)
    return moved, counted.count, t.tolist(), world


def test_a_plan_whose_memory_moved_is_never_run_again(clusters):
    for moved, prepares, values, world in clusters(3).run(moved_memory_is_never_reused):
        assert moved and prepares == 1 and values == [2.0 * world] * 8
