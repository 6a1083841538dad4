"""A call of every collective with ``numel`` elements, built without a process group: the
arguments each rank would pass (:func:`numel_call`), and the model's price of one algorithm on
a machine (:func:`simulated_time`: rank 0's plan on the simulator's clock, the run
``auto``'s model weighs its candidates by). :func:`ringcoll.simulate` builds its calls here too."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from ..sim.engine import run_plans
from ..cost.machine import Machine
from ..schedules.registry import builder_of
from ..selection import set_pricer
from .common import BUILDERS, Context

def rank_data(rank: int, numel: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Exact, never-zero test data that differs across ranks and elements."""
    values = torch.arange(numel, dtype=torch.int64) % 5 + 1 + rank
    if dtype == torch.bool:
        return (values % 3) != 0
    return values.to(dtype)


def numel_call(collective: str, rank: int, world: int, numel: int, dtype: torch.dtype,
               kwargs: Dict[str, Any], fill: bool = True):
    """Rank ``rank``'s arguments for ``collective`` of ``numel`` elements: the n of its cost
    model, i.e. the vector (all_reduce, broadcast, reduce) or the total over all ranks'
    blocks (all_gather, reduce_scatter, gather, scatter, all_to_all: one block is
    ⌈numel / world⌉). Inputs hold :func:`rank_data` (with ``fill=False`` they are left
    uninitialised: torch.empty touches no memory)."""
    block = -(-numel // world)

    def data(n, salt=0):
        return rank_data(rank + salt, n, dtype) if fill else torch.empty(n, dtype=dtype)

    def empty(n):
        return torch.empty(n, dtype=dtype)

    if collective in ("all_reduce",):
        return (data(numel),), kwargs
    if collective == "broadcast":
        return (data(numel),), {"src": 0, **kwargs} if "group_src" not in kwargs else kwargs
    if collective == "reduce":
        return (data(numel),), {"dst": 0, **kwargs} if "group_dst" not in kwargs else kwargs
    if collective in ("all_gather_into_tensor", "all_gather_single"):
        return (empty(world * block), data(block)), kwargs
    if collective == "all_gather":
        return ([empty(block) for _ in range(world)], data(block)), kwargs
    if collective in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return (empty(block), data(world * block)), kwargs
    if collective == "reduce_scatter":
        return (empty(block), [data(block, salt=world * i) for i in range(world)]), kwargs
    if collective == "all_to_all_single":
        return (empty(world * block), data(world * block)), kwargs
    if collective == "all_to_all":
        return ([empty(block) for _ in range(world)], [data(block, salt=world * i) for i in range(world)]), kwargs
    if collective in ("gather", "scatter"):
        key, group_key = ("dst", "group_dst") if collective == "gather" else ("src", "group_src")
        root = kwargs.get(group_key, kwargs.get(key, 0))
        extra = kwargs if (key in kwargs or group_key in kwargs) else {key: 0, **kwargs}
        if collective == "gather":
            return (data(block), [empty(block) for _ in range(world)] if rank == root else None), extra
        return (empty(block), [data(block, salt=world * i) for i in range(world)] if rank == root else None), extra
    if collective == "barrier":
        return (), kwargs
    raise ValueError(f"simulate(numel=) knows no arguments for {collective!r}")


def uniform_plans(builder: str, world: int, numel: int, dtype: torch.dtype, kwargs: Dict[str, Any],
                  ctx: Context) -> list:
    """Every rank's plan of a cost-only ``numel`` call (no data): rank 0's, built once on
    uninitialised tensors, stands for each rank's (uniform arguments; a root is a layout
    parameter), the others shallow copies with their own rank: a million ranks in seconds.
    ``ctx``: rank 0's context (its world, nodes, machine)."""
    args, extra = numel_call(builder, 0, world, numel, dtype, kwargs, fill=False)
    first = BUILDERS[builder](ctx, *args, **extra)
    fields = vars(first)
    plans = [first]
    for rank in range(1, world):
        plan = object.__new__(type(first))        # a shallow copy, without copy.copy's overhead
        plan.__dict__.update(fields)
        plan.rank = rank
        plans.append(plan)
    return plans


def simulated_time(collective: str, name: str, world: int, nbytes: int, on: Machine,
                   nodes: Optional[tuple]) -> float:
    """Seconds of ``collective``/``name`` on ``on``: the simulator's cost-only run of
    ``nbytes`` from root 0, in 4-byte elements where ``nbytes`` allows (float32, the study's
    unit; one byte otherwise), with ``nodes`` as the node-aware schedules' layout. Rank 0's plan
    stands for every rank's (uniform arguments: a root is a layout parameter), as in
    :func:`ringcoll.simulate` without data."""
    dtype = torch.float32 if nbytes % 4 == 0 else torch.uint8
    plans = uniform_plans(builder_of(collective), world, nbytes // dtype.itemsize, dtype,
                          {"algorithm": name}, Context(0, world, nodes=nodes, machine=on))
    with torch.no_grad():
        return run_plans(plans, on, data=False).time


set_pricer(simulated_time)
