"""``ringcoll.simulate``: run a collective on every rank of a world in one process."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch

from .registry import Algorithm, Cost
from .collectives import BUILDERS
from .collectives._common import Context
from .schedule import Step
from .simulator import Machine, SimStats, run_plans
from .topology import even_nodes


@dataclass
class Simulation:
    collective: str
    algorithm: Algorithm
    world: int
    outputs: List[Any]            # each rank's result: what its Work.result() would give
    stats: SimStats
    cost: Cost                    # the algorithm's α-β-γ model at this size
    schedules: List[List[Step]]   # each rank's steps, for pictures and study


def rank_data(rank: int, numel: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Exact, never-zero test data that differs across ranks and elements."""
    values = torch.arange(numel, dtype=torch.int64) % 5 + 1 + rank
    if dtype == torch.bool:
        return (values % 3) != 0
    return values.to(dtype)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def simulate(collective: str, algorithm: str = "auto", world: int = 4,
             inputs: Optional[Sequence[Any]] = None, *, numel: Optional[int] = None,
             dtype: torch.dtype = torch.int64, call: Optional[Callable[[int], tuple]] = None,
             machine: Machine = Machine(), local_size=None, **kwargs) -> Simulation:
    """Run ``collective`` with ``algorithm`` on all ``world`` ranks in this process.

    Each rank's call is the drop-in's arguments after the group: ``inputs[rank]`` (a tensor,
    or a tuple of positional arguments), or rank-valued data of ``numel`` elements of
    ``dtype``, or ``call(rank) -> (args, kwargs)``; ``kwargs`` go to every rank (``op=``,
    ``src=`` ...). Inputs are copied, never modified. Returns every rank's result, the
    statistics (steps, messages, bytes sent and reduced, α-β-γ time on ``machine``), the
    algorithm's cost model and every rank's schedule. ``local_size`` puts the ranks on nodes for
    the node-aware algorithms (ringcoll.topology): an int for nodes of that many consecutive
    ranks, or a tuple giving each rank's node.

    >>> sim = ringcoll.simulate("all_reduce", "ring", world=5, numel=1000)
    >>> sim.outputs[0][0]           # rank 0's reduced tensor
    """
    if collective not in BUILDERS:
        raise ValueError(f"collective must be one of {sorted(BUILDERS)}, got {collective!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    build = BUILDERS[collective]
    nodes = local_size if local_size is None or isinstance(local_size, tuple) else even_nodes(world, local_size)
    if nodes is not None and len(nodes) != world:
        raise ValueError(f"local_size as a tuple must give the node of each of the {world} ranks, got {len(nodes)}")
    plans = []
    for rank in range(world):
        if call is not None:
            args, extra = call(rank)
            extra = {**kwargs, **extra}
        elif inputs is not None:
            if len(inputs) != world:
                raise ValueError(f"inputs must hold one entry per rank ({world}), got {len(inputs)}")
            args = inputs[rank] if isinstance(inputs[rank], tuple) else (inputs[rank],)
            extra = kwargs
        elif numel is not None:
            args, extra = (rank_data(rank, numel, dtype),), kwargs
        else:
            raise ValueError("simulate needs inputs=, numel= or call=")
        extra = {"algorithm": algorithm, **extra}      # a call may give each rank its own
        plan = build(Context(rank, world, nodes=nodes), *_clone(args), **extra)
        plans.append(plan)
    with torch.no_grad():
        stats = run_plans(plans, machine)
    nbytes = plans[0].layout.numel * torch.empty((), dtype=plans[0].dtype).element_size()
    return Simulation(collective, plans[0].algorithm, world, [p.result for p in plans], stats,
                      plans[0].algorithm.cost(world, nbytes), [p.steps() for p in plans])
