"""Fault isolation between calls on real gloo processes.

The scenario of the issue: one rank's call fails its own argument checks (a root-only list
one tensor short, a sparse tensor on the root, a short list on rank 0) while its peers post
theirs; then every rank calls all_reduce. No rank may return or keep another call's data,
every rank must get an error within the timeout, and later calls on the failed group must
raise at once naming the failed call. Each scenario runs on a fresh sub-group made inside the
rank function, so the shared clusters' default groups stay healthy.
"""
from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.api import BUILDERS
from ringcoll.api.common import Context
from ringcoll.runtime.identity import CHECK_TAG, TAG_BASE, call_tag, fingerprint

#: the step timeout of the scenarios: no healthy transfer is needed in them, only failures
SCENARIO_TIMEOUT = 1.0

KINDS = ("scatter", "gather", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")


def _bad_call(kind: str, rank: int, world: int, group):
    """Rank 0 (the root) makes its mistake, the others call correctly with async_op=True.
    Returns (work or None, the tensors this rank's call may write). Every value here is
    below 100, all_reduce's data are 100 and above."""
    bad = rank == 0
    short = world - 1 if bad else world
    n = 4
    if kind == "scatter":
        out = torch.full((n,), -1.0)
        inputs = [torch.full((n,), 10.0 + r) for r in range(short)] if bad else None
        return ringcoll.scatter(out, inputs, src=0, group=group, async_op=True), [out]
    if kind == "gather":
        outs = [torch.full((n,), -1.0) for _ in range(short)] if bad else None
        return ringcoll.gather(torch.full((n,), 10.0 + rank), outs, dst=0, group=group, async_op=True), []
    if kind == "broadcast":
        tensor = torch.full((n,), 7.0 if bad else -1.0)
        return ringcoll.broadcast(tensor.to_sparse() if bad else tensor, src=0, group=group,
                                  async_op=True), [tensor]
    if kind == "reduce":
        tensor = torch.full((n,), 5.0)
        return ringcoll.reduce(tensor.to_sparse() if bad else tensor, dst=0, group=group,
                               async_op=True), [tensor]
    if kind == "all_gather":
        outs = [torch.full((n,), -1.0) for _ in range(short)]
        return ringcoll.all_gather(outs, torch.full((n,), 10.0 + rank), group=group, async_op=True), outs
    if kind == "reduce_scatter":
        out = torch.full((n,), -1.0)
        inputs = [torch.full((n,), 10.0 + rank) for _ in range(short)]
        return ringcoll.reduce_scatter(out, inputs, group=group, async_op=True), [out]
    if kind == "all_to_all":
        outs = [torch.full((n,), -1.0) for _ in range(world)]
        inputs = [torch.full((n,), 10.0 + rank) for _ in range(short)]
        return ringcoll.all_to_all(outs, inputs, group=group, async_op=True), outs
    raise AssertionError(kind)


def scenarios(kinds):
    """Every kind in turn, each on a fresh sub-group of the whole world; what each rank saw."""
    rank, world = dist.get_rank(), dist.get_world_size()
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(SCENARIO_TIMEOUT)
    reports = {}
    # Under the batched transport (pytest --transport batched) tags are ignored, as NCCL's:
    # there check mode is what keeps a skipped call from matching the next (see docs/semantics.md)
    batched = os.environ.get("RINGCOLL_TRANSPORT") == "batched"
    if batched:
        os.environ["RINGCOLL_CHECK"] = "1"
    try:
        for kind in kinds:
            group = dist.new_group(list(range(world)))
            report = reports[kind] = {}
            try:
                work, written = _bad_call(kind, rank, world, group)
                report["bad"] = None
            except (TypeError, ValueError) as error:
                work, written, report["bad"] = None, [], type(error).__name__
            x = torch.full((3,), 100.0 + rank)
            start = time.monotonic()
            try:
                ringcoll.all_reduce(x, group=group)
                report["all_reduce"] = ("returned", 0.0, "")
            except RuntimeError as error:
                report["all_reduce"] = (type(error).__name__, time.monotonic() - start, str(error))
            if work is not None:
                try:
                    work.wait()
                    report["wait"] = "returned"
                except RuntimeError as error:
                    report["wait"] = type(error).__name__
            report["x"] = x.tolist()
            report["written"] = [t.tolist() for t in written]
            start = time.monotonic()
            try:
                ringcoll.all_reduce(torch.ones(2), group=group)
                report["later"] = ("returned", 0.0, "")
            except RuntimeError as error:
                report["later"] = (type(error).__name__, time.monotonic() - start, str(error))
    finally:
        ringcoll.set_timeout(previous)
        if batched:
            os.environ.pop("RINGCOLL_CHECK")
    return reports


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_rank_failing_its_own_checks_never_hands_anyone_another_calls_data(clusters, world):
    results = clusters(world).run(scenarios, KINDS)
    for kind in KINDS:      # some rank's call waited on the root and failed
        assert any(reports[kind].get("wait") in ("PeerError", "MismatchError") for reports in results[1:]), kind
    for rank, reports in enumerate(results):
        for kind, report in reports.items():
            where = f"{kind}, rank {rank} of {world}: {report}"
            assert (report["bad"] is not None) == (rank == 0), where
            # nobody's all_reduce completes: the ranks never agree on a call
            outcome, waited, message = report["all_reduce"]
            assert outcome in ("PeerError", "GroupFailedError", "MismatchError"), where
            assert waited < SCENARIO_TIMEOUT + 6, where
            assert report["x"] == [100.0 + rank] * 3, where
            if rank != 0:       # (a rank that never talks to the root in this call may finish it)
                assert report["wait"] in ("PeerError", "MismatchError", "returned"), where
            if report.get("wait") in ("PeerError", "MismatchError"):
                assert outcome == "GroupFailedError" and kind in message, where
            # no tensor of the failed call holds another call's data (all_reduce's are >= 100)
            assert all(value < 100 for tensor in report["written"] for value in tensor), where
            outcome, waited, message = report["later"]
            assert outcome == "GroupFailedError", where
            assert waited < 0.5, where
            assert "call #" in message and f"rank {rank}" in message, where
            assert "step" in message or "disagree" in message, where     # a PeerError's or check mode's


def test_call_tags_are_disjoint_from_user_tags_and_name_the_call():
    def plan_of(collective, *args, **kwargs):
        return BUILDERS[collective](Context(0, 3), *args, **kwargs)

    reduce_sum = plan_of("all_reduce", torch.ones(10), algorithm="ring")
    reduce_max = plan_of("all_reduce", torch.ones(10), dist.ReduceOp.MAX, algorithm="ring")
    reduce_11 = plan_of("all_reduce", torch.ones(11), algorithm="ring")
    reduce_int = plan_of("all_reduce", torch.ones(10, dtype=torch.int32), algorithm="ring")
    rd = plan_of("all_reduce", torch.ones(10), algorithm="recursive_doubling")
    bcast0 = plan_of("broadcast", torch.ones(10), src=0, algorithm="binomial")
    bcast1 = plan_of("broadcast", torch.ones(10), src=1, algorithm="binomial")
    prints = [fingerprint(p) for p in (reduce_sum, reduce_max, reduce_11, reduce_int, rd, bcast0, bcast1)]
    assert len(set(prints)) == len(prints)
    tags = {call_tag(seq, p) for seq in range(1, 200) for p in prints}
    assert len(tags) == 199 * len(prints)                       # no two calls share a tag
    assert all(TAG_BASE <= tag < 2 * TAG_BASE for tag in tags)  # gloo's int32, away from user tags
    assert CHECK_TAG not in tags
    assert call_tag(5, prints[0]) != call_tag(5 + 1, prints[0]) != call_tag(5 + 4096 + 1, prints[1])


def composite():
    """An object collective is two drop-in calls (the sizes, then the bytes) with a check of its
    own on the root: pickling. The root's first broadcast_object_list fails to pickle, then the
    root calls again with other objects; the peers' one call must not take that second call's
    data (it did while objects.py took its inner calls' numbers only when it made them)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(SCENARIO_TIMEOUT)
    batched = os.environ.get("RINGCOLL_TRANSPORT") == "batched"
    if batched:                             # tags are ignored there: check mode (see scenarios)
        os.environ["RINGCOLL_CHECK"] = "1"
    group = dist.new_group(list(range(world)))
    values = [7.0, 7.0, 7.0] if rank == 0 else [-1.0, -1.0, -1.0]
    try:
        if rank == 0:                       # fails its check (a lambda cannot be pickled), then calls again
            try:
                ringcoll.broadcast_object_list([7.0, lambda: 7.0, 7.0], src=0, group=group)
            except (pickle.PicklingError, AttributeError, TypeError):
                pass
            values = [8.0, 8.0, 8.0]
        ringcoll.broadcast_object_list(values, src=0, group=group)
        return "returned", values
    except RuntimeError as error:
        return type(error).__name__, values
    finally:
        ringcoll.set_timeout(previous)
        if batched:
            os.environ.pop("RINGCOLL_CHECK")


def test_a_composite_call_failing_its_own_check_on_the_root_cannot_match_the_next_one(clusters):
    results = clusters(3).run(composite)
    failed = ("PeerError", "MismatchError")   # (the second under the batched transport)
    assert results[0][0] in failed, results
    for outcome, values in results[1:]:     # never the root's second call's data (8.0)
        assert outcome in failed and values == [-1.0] * 3, results


# -- timeouts -------------------------------------------------------------------------------
def stalls():
    """On a cluster whose groups were made with timeout=3 s and no RINGCOLL_TIMEOUT."""
    rank = dist.get_rank()
    out = {"override": ringcoll.get_timeout(), "group": ringcoll.runtime.failures.group_timeout(dist.group.WORLD)}
    short = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    out["new_group"] = ringcoll.runtime.failures.group_timeout(short)
    # a peer slow for less than the timeout: no error
    if rank == 1:
        time.sleep(2)
    x = torch.full((5,), 1.0 + rank)
    start = time.monotonic()
    ringcoll.all_reduce(x)
    out["slow"] = (x.tolist(), time.monotonic() - start)
    # Work.wait(timeout) honours its argument; the call itself goes on and completes
    if rank == 1:
        time.sleep(2.5)
    y = torch.full((5,), 1.0 + rank)
    work = ringcoll.all_reduce(y, async_op=True)
    start = time.monotonic()
    try:
        work.wait(timedelta(seconds=1))
        out["wait"] = ("returned", time.monotonic() - start)
    except ringcoll.WaitTimeout:
        out["wait"] = ("WaitTimeout", time.monotonic() - start)
    work.wait(timedelta(0))                   # C++'s "no timeout"
    out["after_wait"] = y.tolist()
    # a peer that stalls past the group's timeout: an error within it
    if rank == 1:
        time.sleep(6)
    start = time.monotonic()
    try:
        ringcoll.all_reduce(torch.ones(5))
        out["stalled"] = ("returned", time.monotonic() - start, "")
    except RuntimeError as error:
        out["stalled"] = (type(error).__name__, time.monotonic() - start, str(error))
    return out


def test_the_groups_timeout_applies_and_wait_honours_its_own():
    with ringcoll.launch(2, timeout=3, threads=1, env={"RINGCOLL_TIMEOUT": ""}) as cluster:
        results = cluster.run(stalls, timeout=90)
    zero, one = results
    assert zero["override"] is None and zero["group"] == 3.0 and zero["new_group"] == 2.0
    assert zero["slow"][0] == [3.0] * 5 and one["slow"][0] == [3.0] * 5
    assert zero["wait"][0] == "WaitTimeout" and 0.9 <= zero["wait"][1] < 2.0, zero
    assert zero["after_wait"] == [3.0] * 5
    outcome, waited, message = zero["stalled"]
    assert outcome == "PeerError" and 2.9 <= waited < 5.5 and "peer 1" in message, zero
    assert one["stalled"][0] in ("PeerError", "GroupFailedError"), one


def test_wait_takes_no_timeout_and_zero_as_no_limit():
    work = ringcoll.Work([torch.ones(1)], "test")
    start = time.monotonic()
    with pytest.raises(ringcoll.WaitTimeout, match="test: Work.wait timed out after 0.2 s"):
        work.wait(timedelta(seconds=0.2))
    assert time.monotonic() - start >= 0.19
    work._finish()
    assert work.wait(timedelta(0)) and work.wait() and work.result()[0].item() == 1.0


# -- Work errors reach C++ holders -----------------------------------------------------------
def test_work_errors_are_real_future_errors_and_the_future_holds_the_result():
    failed = ringcoll.Work([torch.ones(1)])
    failed._finish(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        failed.wait()
    with pytest.raises(RuntimeError, match="boom"):
        failed.get_future().wait()
    # what a C++ holder sees: torch's FutureWrappingWork around the future raises (around a
    # future given the error by set_exception, it would report success)
    held = torch._C._distributed_c10d._create_work_from_future(failed.get_future())
    assert not held.is_success() and "boom" in str(held.exception())
    plain = torch.futures.Future()
    plain.set_exception(ValueError("boom"))
    assert torch._C._distributed_c10d._create_work_from_future(plain).is_success()   # the trap avoided
    assert failed.is_completed() and not failed.is_success()
    done = ringcoll.Work([torch.full((2,), 3.0)])
    done._finish()
    assert done.get_future().wait()[0].tolist() == [3.0, 3.0]
    assert done.get_future().value()[0].tolist() == [3.0, 3.0]


# -- check mode -----------------------------------------------------------------------------
def mismatched(check_env: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ[check_env.split("=")[0]] = check_env.split("=")[1]
    try:
        group = dist.new_group(list(range(world)))     # its executor reads the setting
        out = {}
        try:        # the same point, a different dtype on the last rank
            dtype = torch.float64 if rank == world - 1 else torch.float32
            ringcoll.all_reduce(torch.ones(6, dtype=dtype), group=group)
            out["dtype"] = "returned"
        except ringcoll.MismatchError as error:
            out["dtype"] = str(error)
        try:                                         # a mismatch leaves the group failed
            ringcoll.all_reduce(torch.ones(2), group=group)
            out["after_mismatch"] = "returned"
        except RuntimeError as error:
            out["after_mismatch"] = type(error).__name__
        group = dist.new_group(list(range(world)))
        x = torch.full((4,), 1.0 + rank)             # a new group goes on
        ringcoll.all_reduce(x, group=group)
        out["next"] = x.tolist()
        try:        # rank 0's scatter fails its own checks; the others post theirs
            if rank == 0:
                try:
                    ringcoll.scatter(torch.zeros(2), [torch.zeros(2)] * (world - 1), src=0, group=group)
                except ValueError:
                    pass
                ringcoll.all_reduce(torch.ones(2), group=group)
            else:
                ringcoll.scatter(torch.zeros(2), None, src=0, group=group)
            out["skipped"] = "returned"
        except ringcoll.MismatchError as error:
            out["skipped"] = str(error)
        try:
            ringcoll.all_reduce(torch.ones(2), group=group)
            out["later"] = "returned"
        except RuntimeError as error:
            out["later"] = type(error).__name__
        return out
    finally:
        os.environ.pop(check_env.split("=")[0])


@pytest.mark.parametrize("setting", ["RINGCOLL_CHECK=1", "TORCH_DISTRIBUTED_DEBUG=DETAIL"])
def test_check_mode_raises_on_every_rank_naming_ranks_and_what_differs(clusters, setting):
    world = 3
    results = clusters(world).run(mismatched, setting)
    for rank, out in enumerate(results):
        assert "dtype: 'float32' on ranks [0, 1] vs 'float64' on ranks [2]" in out["dtype"], out
        assert "Every rank raises this error" in out["dtype"] and f"rank {rank}" in out["dtype"]
        assert out["after_mismatch"] == "GroupFailedError" and out["next"] == [6.0] * 4
        assert "call number" in out["skipped"] and "collective: " in out["skipped"], out
        assert "'scatter' on ranks [1, 2]" in out["skipped"] and "'all_reduce' on ranks [0]" in out["skipped"]
        assert out["later"] == "GroupFailedError"
