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
from ringcoll.executor import P2PExecutor


class CountingPlans:
    """Counts the plans ringcoll's executor runs in this process, by collective."""

    def __enter__(self):
        self.runs: dict = {}
        self._run = P2PExecutor.run
        outer = self

        def run(executor, plan):
            outer.runs[plan.collective] = outer.runs.get(plan.collective, 0) + 1
            return outer._run(executor, plan)

        P2PExecutor.run = run
        return self

    def __exit__(self, *exc):
        P2PExecutor.run = self._run


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
        out[name + "_runs"] = counting.runs
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
