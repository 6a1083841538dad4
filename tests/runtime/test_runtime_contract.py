"""The runtime's side of torch's contract (issue #24): compiled DDP on the backend, futures
complete once ``wait()`` returns, what check mode catches of a skipped call, which peer a
timeout names and what it suggests, clear errors for devices the backend cannot serve, and
``monitored_barrier``.

Rank functions run on the shared gloo clusters (tests/conftest.py); each builds the groups
it needs inside, so the clusters' default groups stay healthy.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ringcoll
from _util import CountingPlans


# -- torch.compile(DDP(model)) ----------------------------------------------------------------
def compiled_ddp_parameters(steps: int) -> dict:
    """Parameters after ``steps`` steps of ``torch.compile(DDP(model))`` (inductor) on gloo
    and on a ringcoll group; models start different on each rank (DDP's broadcast, the call
    Dynamo used to trace into, must make them equal); and the ringcoll plans that ran."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    out: dict = {}
    for name in ("gloo", "ringcoll"):
        group = None if name == "gloo" else dist.new_group(backend="ringcoll")
        torch.manual_seed(rank)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
        torch._dynamo.reset()
        compiled = torch.compile(DDP(model, process_group=group))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        start = time.monotonic()
        with CountingPlans() as counting:
            for step in range(steps):
                gen = torch.Generator().manual_seed(31 * step + rank)
                x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 5, generator=gen)
                loss = nn.functional.mse_loss(compiled(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        out[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
        out[name + "_seconds"] = time.monotonic() - start
        out[name + "_runs"] = {collective: counting.of(collective) for collective in ("broadcast", "all_reduce")}
    return out


def test_compiled_ddp_trains_on_ringcoll_as_on_gloo(clusters):
    steps = 3
    per_rank = clusters(3).run(compiled_ddp_parameters, steps)
    first = per_rank[0]
    for rank, result in enumerate(per_rank):
        assert torch.equal(result["ringcoll"], first["ringcoll"]), f"rank {rank}'s parameters differ from rank 0's"
        # 3 ranks: ringcoll's all_reduce adds in another order than gloo's, so float32 rounds apart
        torch.testing.assert_close(result["ringcoll"], result["gloo"], rtol=1e-5, atol=1e-6)
    runs = first["ringcoll_runs"]
    assert runs.get("broadcast", 0) >= 1 and runs.get("all_reduce", 0) >= steps, runs


# -- futures complete before wait() returns ---------------------------------------------------
def async_futures(calls: int) -> dict:
    """``calls`` async all_reduces through ``dist.*`` on a ringcoll group and as many through
    the drop-in, each waited on: how many futures were not done after ``wait()``, how many
    ``value()`` calls raised, and how many results were wrong."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="ringcoll")
    out = {}
    for path in ("dist", "drop_in"):
        not_done = raised = wrong = 0
        for i in range(calls):
            numel = 1 + i % 7                     # sizes 1 .. 7: below and above the world
            tensor = torch.arange(numel, dtype=torch.int64) + 1 + rank * 100 + i
            expected = (torch.arange(numel, dtype=torch.int64) + 1 + i) * world + 100 * sum(range(world))
            if path == "dist":
                work = dist.all_reduce(tensor, group=group, async_op=True)
            else:
                work = ringcoll.all_reduce(tensor, async_op=True)
            work.wait()
            future = work.get_future()
            not_done += not future.done()
            try:
                value = future.value()
                wrong += not torch.equal(value[0], expected)
            except RuntimeError:
                raised += 1
            wrong += not torch.equal(tensor, expected)
        out[path] = (not_done, raised, wrong)
    return out


def test_future_is_done_when_wait_returns(clusters):
    for out in clusters(3).run(async_futures, 1000):
        assert out == {"dist": (0, 0, 0), "drop_in": (0, 0, 0)}, out


def test_work_future_completes_before_wait_can_return():
    """The order inside ``_finish``, without processes: a waiter released by the event must
    find the future done, so the event is set last."""
    work = ringcoll.Work([torch.ones(1)])
    seen = []
    original = work._done.set

    def set_event():
        seen.append(work.get_future().done())
        original()

    work._done.set = set_event
    work._finish()
    assert seen == [True] and work.wait() and work.get_future().value()[0].item() == 1.0


# -- meta tensors -------------------------------------------------------------------------------
def meta_tensor_calls() -> list:
    """Collectives given a meta tensor on a ringcoll group, then a real call on it."""
    group = dist.new_group(backend="ringcoll")
    out = []
    for call in (lambda: dist.all_reduce(torch.ones(4, device="meta"), group=group),
                 lambda: dist.broadcast(torch.ones(3, device="meta"), src=0, group=group),
                 lambda: dist.all_gather_into_tensor(torch.ones(6, device="meta"), torch.ones(2, device="meta"),
                                                     group=group)):
        try:
            call()
            out.append("returned")
        except (TypeError, ValueError, RuntimeError) as error:
            out.append(f"{type(error).__name__}: {error}")
    x = torch.full((5,), 1 + dist.get_rank(), dtype=torch.int64)
    dist.all_reduce(x, group=group)             # nothing was touched: the group goes on
    out.append(x.tolist())
    return out


def test_a_meta_tensor_is_refused_naming_its_device_and_what_is_served(clusters):
    world = 3
    for out in clusters(world).run(meta_tensor_calls):
        for message in out[:3]:
            assert message.startswith("ValueError: tensors of a ringcoll group must be on a CPU device"), out
            assert "got a tensor on device meta" in message and "CUDA" in message, out
            assert "'gloo'" not in message, out      # not the inner groups' device table
        assert out[3] == [6] * 5


# -- monitored_barrier --------------------------------------------------------------------------
def monitored(late: tuple, wait_all_ranks: bool, timeout: float = 1.5) -> dict:
    """``group.monitored_barrier`` on a fresh ringcoll group with the ranks in ``late``
    arriving twice the timeout late; then one more call on the group."""
    from datetime import timedelta

    rank = dist.get_rank()
    group = dist.new_group(backend="ringcoll")
    dist.barrier(group=group)                   # connected: the timeout measures arrival only
    out = {}
    if rank in late:
        time.sleep(2 * timeout)
    start = time.monotonic()
    try:
        group.monitored_barrier(timedelta(seconds=timeout), wait_all_ranks=wait_all_ranks)
        out["barrier"] = ("returned", "", None)
    except RuntimeError as error:
        out["barrier"] = (type(error).__name__, str(error), getattr(error, "peers", None))
    out["seconds"] = time.monotonic() - start
    if late:
        time.sleep(2 * timeout)                 # every rank is done with the barrier
    try:
        dist.all_reduce(torch.ones(2), group=group)
        out["later"] = "returned"
    except RuntimeError as error:
        out["later"] = type(error).__name__
    try:
        dist.monitored_barrier(group, timedelta(seconds=timeout))
        out["dist"] = "returned"
    except ValueError as error:
        out["dist"] = str(error)
    return out


def test_monitored_barrier_passes_when_every_rank_arrives(clusters):
    for out in clusters(3).run(monitored, (), False):
        assert out["barrier"][0] == "returned" and out["later"] == "returned", out
        assert out["dist"] == "monitored_barrier is only implemented for GLOO backend."   # torch's own check


@pytest.mark.parametrize("wait_all_ranks", [False, True])
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(clusters, wait_all_ranks):
    timeout = 1.5
    zero, one, two, three = clusters(4).run(monitored, (1, 3), wait_all_ranks, timeout)
    outcome, message, peers = zero["barrier"]
    assert outcome == "PeerError" and "failed to pass monitoredBarrier in 1500 ms" in message, zero
    if wait_all_ranks:
        assert peers == (1, 3) and "ranks 1 (global rank 1), 3 (global rank 3)" in message, zero
    else:
        assert peers == (1,) and "rank 1 (global rank 1)" in message and "wait_all_ranks=True" in message, zero
    assert timeout - 0.1 <= zero["seconds"] < timeout + 1.0, zero
    # the rank that arrived is not released: it names rank 0, which it waited on
    assert two["barrier"][0] == "PeerError" and two["barrier"][2] == (0,), two
    assert "receive the release from rank 0" in two["barrier"][1], two
    for out in (zero, one, two, three):
        assert out["later"] == "GroupFailedError", out


# -- which peer a timeout names ---------------------------------------------------------------
def stalled_ring(victim: int, timeout: float) -> dict:
    """A ring all_reduce in which global rank ``victim`` stalls before its first step, past
    the step timeout: on a gloo group of every rank through the drop-in, then on a ringcoll
    group of ranks 1..world-1 through ``dist.*``. Each rank's error and its peers. Rank 0
    waits ``timeout``, the others twice that: rank 0's wait on both neighbours ends first, so
    neither neighbour's own failure (which gloo reports to rank 0 as "a remote worker
    crashing") can reach it before its timeout names them (a race when all waited alike)."""
    from ringcoll.runtime import executor as executor_module

    rank, world = dist.get_rank(), dist.get_world_size()
    previous = ringcoll.get_timeout()
    groups = {"gloo": dist.new_group(list(range(world))),
              "ringcoll": dist.new_group(list(range(1, world)), backend="ringcoll",
                                         pg_options=ringcoll.Options(all_reduce="ring"))}
    original = executor_module.P2PExecutor._post

    def stall(self, prepared, index, *rest):
        if rank == victim and index == 0 and prepared.plan.collective == "all_reduce":
            time.sleep(3 * timeout)            # past every rank's wait (2 x timeout at most)
        return original(self, prepared, index, *rest)

    out = {}
    try:
        for name, group in groups.items():
            if name == "ringcoll" and rank == 0:
                dist.barrier()                    # the others' barrier below
                continue
            call = ((lambda x: ringcoll.all_reduce(x, group=group, algorithm="ring")) if name == "gloo"
                    else (lambda x: dist.all_reduce(x, group=group)))
            call(torch.ones(4 * world))          # connected (and the placement agreed) before the stall
            ringcoll.set_timeout(timeout if rank == 0 else 2 * timeout)
            executor_module.P2PExecutor._post = stall
            try:
                call(torch.arange(4 * world, dtype=torch.float32) + rank)
                out[name] = ("returned", None, ())
            except RuntimeError as error:
                out[name] = (str(error), error.peer, tuple(error.peers))
            finally:
                executor_module.P2PExecutor._post = original
                ringcoll.set_timeout(previous)
            dist.barrier()                        # on the default group: the victim is done too
    finally:
        ringcoll.set_timeout(previous)
    return out


def test_a_timeout_names_the_peers_this_rank_was_waiting_on(clusters):
    zero, one, two, three = clusters(4).run(stalled_ring, 2, 1.5)
    # the ring 0 -> 1 -> 2 -> 3 -> 0: 1 sends to the victim, 3 receives from it
    assert one["gloo"][1:] == (2, (2,)) and "send to peer 2 (global rank 2)" in one["gloo"][0], one
    assert three["gloo"][1:] == (2, (2,)) and "receive from peer 2 (global rank 2)" in three["gloo"][0], three
    # rank 0's next step needs both neighbours, each blocked on the victim: it names both
    assert set(zero["gloo"][2]) == {1, 3} and "still incomplete too" in zero["gloo"][0], zero
    # the ringcoll group of global ranks 1, 2, 3: group ranks, named with their global ranks
    assert one["ringcoll"][1:] == (1, (1,)) and "send to peer 1 (global rank 2)" in one["ringcoll"][0], one
    assert three["ringcoll"][1:] == (1, (1,)) and "receive from peer 1 (global rank 2)" in three["ringcoll"][0]
    assert "timed out after 1.5s" in zero["gloo"][0], zero
    for out in (one["gloo"], three["gloo"], one["ringcoll"], three["ringcoll"]):
        assert "timed out after 3s" in out[0], out
    for out in (zero["gloo"], one["gloo"], three["gloo"], one["ringcoll"], three["ringcoll"]):
        assert "the peer named is the one this rank was waiting on" in out[0], out


def mismatch_without_check(timeout: float) -> list:
    """Rank 0 calls broadcast where the others call all_reduce, without check mode."""
    rank = dist.get_rank()
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(timeout)
    os.environ.pop("RINGCOLL_CHECK", None)
    group = dist.new_group(list(range(dist.get_world_size())))
    try:
        if rank == 0:
            ringcoll.broadcast(torch.ones(5), src=0, group=group)
        else:
            ringcoll.all_reduce(torch.ones(5), group=group)
        return ["returned"]
    except ringcoll.PeerError as error:
        return [str(error)]
    finally:
        ringcoll.set_timeout(previous)


def test_a_timeout_suggests_check_mode_for_a_mismatched_call(clusters):
    """Every rank gets a PeerError; a rank whose peer timed out first and aborted may see the
    connection closed instead of its own timeout (a race on 2 cores), but at least one rank
    times out, and every timeout carries the hint."""
    messages = [message for (message,) in clusters(3).run(mismatch_without_check, 1.0)]
    assert all(message.startswith("ringcoll call #1 ") for message in messages), messages
    timed_out = [message for message in messages if "timed out after 1s" in message]
    assert timed_out, messages
    for message in timed_out:
        assert "a mismatched call (ranks calling different collectives, or a rank skipping a call) looks " \
               "exactly like this: run with RINGCOLL_CHECK=1 to diagnose it" in message, message


# -- a rank that skips a call ----------------------------------------------------------------
def skipped_call(same_size: bool, check: bool) -> list:
    """Three ranks; rank 1 skips the first of two back-to-back all_reduces (of different
    sizes, or of the same size); then every rank makes one more call. What each call did."""
    rank = dist.get_rank()
    previous = ringcoll.get_timeout()
    ringcoll.set_timeout(2.0)
    if check:
        os.environ["RINGCOLL_CHECK"] = "1"
    try:
        group = dist.new_group([0, 1, 2])      # its executor reads RINGCOLL_CHECK now
        first = torch.full((4,), 1 + rank, dtype=torch.int64)
        second = torch.full((4 if same_size else 6,), 10 * (1 + rank), dtype=torch.int64)
        calls = [second] if rank == 1 else [first, second]
        out = []
        for tensor in calls + [torch.ones(2, dtype=torch.int64)]:
            start = time.monotonic()
            try:
                ringcoll.all_reduce(tensor, group=group)
                out.append(("returned", tensor.tolist()))
            except RuntimeError as error:
                out.append((type(error).__name__, round(time.monotonic() - start, 1)))
        return out
    finally:
        ringcoll.set_timeout(previous)
        os.environ.pop("RINGCOLL_CHECK", None)


def test_check_mode_fails_a_skipped_call_at_the_first_call_that_differs_on_every_rank(clusters):
    zero, one, two = clusters(3).run(skipped_call, False, True)
    for out in (zero, one, two):            # caught at once, at the skipped call, everywhere
        assert out[0][0] == "MismatchError" and out[0][1] < 1.0, out
        # and the group is failed: the next call raises at once instead of pairing up
        assert [o[0] for o in out[1:]] == ["GroupFailedError"] * (len(out) - 1), out
        assert all(o[1] < 1.0 for o in out[1:]), out


def test_a_skipped_call_identical_to_the_next_is_caught_one_call_later(clusters):
    """What no check can catch (as in NCCL): rank 1's call runs with the others' skipped one,
    which has the same fingerprint; the next call differs, and check mode fails it on every
    rank at once; without check mode every rank times out there (tags differ)."""
    for check in (True, False):
        zero, one, two = clusters(3).run(skipped_call, True, check)
        # call #1: rank 1's second tensor summed with the others' first (20 + 1 + 3)
        for out in (zero, one, two):
            assert out[0] == ("returned", [24] * 4), (check, out)
        failure = "MismatchError" if check else "PeerError"
        limit = 1.0 if check else 4.0
        assert zero[1][0] == two[1][0] == one[1][0] == failure, (check, zero, one, two)
        assert max(zero[1][1], one[1][1], two[1][1]) < limit, (check, zero, one, two)
        assert zero[2][0] == two[2][0] == "GroupFailedError", (check, zero, two)


def test_import_ringcoll_leaves_dynamo_unimported():
    """Marking the backend's methods for Dynamo (torch.compiler.disable) imports Dynamo, about
    a second: it happens at the first ringcoll group, never at ``import ringcoll`` (each
    launched rank and every drop-in user would pay it)."""
    import subprocess
    import sys

    code = ("import sys, ringcoll; assert 'torch._dynamo' not in sys.modules, 'imported'; "
            "import torch.distributed as dist; "
            "from ringcoll.backend import ProcessGroupRingcoll, create; "
            "assert not ProcessGroupRingcoll.__dict__.get('_eager')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
