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
