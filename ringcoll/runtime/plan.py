"""A plan: one rank's collective call, ready for an executor.

The public API turns a call into a :class:`Plan` (the caller's flat buffers, the schedule,
the local operator, and what runs before and after the schedule); the P2P executor runs it
on a process group and the simulator runs every rank's plan in one process. Both therefore
run exactly the same code around the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import functools
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..schedules.registry import Algorithm
from ..schedules.vocabulary import ONE_PORT, Layout, Step


@dataclass
class Plan:
    collective: str
    algorithm: Algorithm
    rank: int
    world: int
    layout: Layout
    buffers: Dict[str, torch.Tensor]                 # the caller's buffers, flat and contiguous
    op: Optional[str] = None                         # local operator of the Reduce steps
    before: List[Callable[[], None]] = field(default_factory=list)
    after: List[Callable[[], None]] = field(default_factory=list)
    result: object = None                            # what Work.result() returns
    describe: str = ""                               # for logs and errors
    timeout: Optional[float] = None                  # seconds a step may wait; None: the group's
    seq: Optional[int] = None                        # its number in its group, from the call's entry
    why: str = ""                                    # what chose the algorithm (RINGCOLL_DEBUG=INFO)
    #: buffers the plan made itself that hold none of the caller's data from when it was
    #: built (its ``before`` steps fill them on every run, or a token whose bytes never
    #: matter); with the buffers that are the caller's memory (or the executor's), they make
    #: a plan safe to run again (ringcoll.api.common.run_call)
    own: set = field(default_factory=set)
    #: buffers that stage a list argument: name -> (the list's tensors, the ``before`` or
    #: ``after`` hook that copies them in or out, whether the schedule may write the list);
    #: the P2P executor names the tensors themselves instead when it can (executor.Blocks)
    lists: Dict[str, tuple] = field(default_factory=dict)
    #: what the call's run does first, when its group's placement is still to be agreed (an
    #: asynchronous call at its group's first collective call): agree it and return the plan
    #: to run, this one or one built again on the agreed placement (ringcoll.api.common.Context.late);
    #: the executor calls it on the worker thread, in call order
    late: Optional[Callable[[], "Plan"]] = None

    def steps(self, one_port: bool = True) -> Tuple[Step, ...]:
        """The schedule's steps for an executor that carries one message in and one out at a
        time (``one_port``, the simulator's clock), or that posts a step's transfers together
        (the P2P executor: the layout's ``ONE_PORT`` False, which only the double trees read)."""
        layout = self.layout if one_port else self.layout.replace(**{ONE_PORT: False})
        return schedule_steps(self.algorithm.schedule, self.rank, self.world, layout)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.buffers.values())).dtype

    @property
    def device(self) -> torch.device:
        return next(iter(self.buffers.values())).device


@functools.lru_cache(maxsize=16384)
def schedule_steps(schedule, rank: int, world: int, layout: Layout) -> Tuple[Step, ...]:
    """A schedule's steps; schedules are pure functions, so repeated calls reuse them. The
    cache holds every rank of a simulated world of up to thousands of ranks (a process
    group's executor needs one entry per call shape); runs without data stream instead."""
    return tuple(schedule(rank, world, layout))


def view(buffers: Dict[str, torch.Tensor], buf) -> torch.Tensor:
    """The tensor view of chunk ``buf``."""
    return buffers[buf.name][buf.start:buf.stop]
