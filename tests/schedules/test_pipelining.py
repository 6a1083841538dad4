"""Pipelining on real processes: rings cut into small segments, 1-3 steps in flight,
against the built-ins."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import ringcoll
from test_all_reduce import R, builtin_reference, data

def pipelined(segment_bytes):
    from ringcoll.api.common import group_context

    executor = group_context(None).executor
    rank, out = dist.get_rank(), []
    os.environ["RINGCOLL_SEGMENT"] = str(segment_bytes)
    try:
        for window in (1, 2, 3):
            executor.window = window
            for numel in (1, 37, 1000, 4099):
                tensor = data(rank, numel, torch.int64)
                want = builtin_reference(tensor, R.SUM)
                ringcoll.all_reduce(tensor, algorithm="ring")
                out.append((window, numel, torch.equal(tensor, want)))
    finally:
        os.environ.pop("RINGCOLL_SEGMENT")
        executor.window = ringcoll.cost.machine.EXECUTOR_WINDOW
    return out


@pytest.mark.parametrize("world", [3, 4])
def test_pipelined_ring_with_segments_in_flight(clusters, world):
    """Small segments and 1-3 steps in flight: transfers overlap reductions, results exact."""
    for rank, cases in enumerate(clusters(world).run(pipelined, 8 * 13)):
        for window, numel, ok in cases:
            assert ok, f"rank {rank} window {window} numel {numel}"


def pipelined_rings_of_other_collectives(segment_bytes):
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["RINGCOLL_SEGMENT"] = str(segment_bytes)
    out = []
    try:
        for block in (1, world + 1, 333):
            mine = data(rank, block, torch.int64)
            gathered, want = torch.empty(world * block, dtype=torch.int64), torch.empty(world * block, dtype=torch.int64)
            ringcoll.all_gather_into_tensor(gathered, mine, algorithm="ring")
            dist.all_gather_into_tensor(want, mine)
            out.append(("all_gather", block, torch.equal(gathered, want)))
            full = data(rank, world * block, torch.int64)
            scattered, want = torch.empty(block, dtype=torch.int64), torch.empty(block, dtype=torch.int64)
            ringcoll.reduce_scatter_tensor(scattered, full, algorithm="ring")
            dist.reduce_scatter_tensor(want, full)
            out.append(("reduce_scatter", block, torch.equal(scattered, want)))
    finally:
        os.environ.pop("RINGCOLL_SEGMENT")
    return out


def test_pipelined_all_gather_and_reduce_scatter_rings(clusters):
    for rank, cases in enumerate(clusters(3).run(pipelined_rings_of_other_collectives, 8 * 7)):
        for name, block, ok in cases:
            assert ok, f"rank {rank} {name} block {block}"
