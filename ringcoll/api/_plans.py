"""Choosing an algorithm for a call and making its plan: :func:`pick` (the algorithm, by the
table of the call's device), :func:`new_plan` (the layout's segment and nodes, the plan)."""
from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

import torch

from ..schedules import registry
from ..runtime.plan import Plan
from ..schedules.vocabulary import GRID, NODES, ROOT, SEGMENT, Layout
from ..selection import choose, group_nodes, segment_elements
from ..selection.model import machine as model_machine
from ..runtime.nodes import context_placement, describe_placement

from .common import Context
from ._checks import check_device, flat

log = logging.getLogger("ringcoll")


def describe(collective: str, name: str, tensor: torch.Tensor, extra: str = "") -> str:
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"{collective}/{name} {tensor.numel()}x{dtype}{' ' + extra if extra else ''}"


def table_device(ctx: Context, tensor: Optional[torch.Tensor]) -> Optional[str]:
    """The device whose table (ringcoll.selection.TABLES) decides a call on ``tensor``: its
    device type on a process group; None in the simulator, whose CPU tensors stand for any
    device (the table of the model being priced, else gloo's), and without a tensor."""
    if tensor is None or ctx.executor is None:
        return None
    return tensor.device.type


def pick(collective: str, algorithm, nbytes: int, ctx: Context,
         tensor: Optional[torch.Tensor] = None) -> Tuple[registry.Algorithm, str]:
    """Check ``algorithm`` and choose it (by the table of ``tensor``'s device); valid outside
    the group too (world unknown there)."""
    if ctx.world is None:
        if algorithm != "auto":
            choose(collective, algorithm, nbytes, 1, current=ctx.settings)
        return None, ""
    # a group's call reads the placement its entry resolved; a barrier's has none (its model then
    # weighs the machine's own nodes: it has no node-aware algorithm)
    nodes = None if ctx.executor is not None and ctx.nodes is None else (lambda: group_nodes(ctx))
    name, why = choose(collective, algorithm, nbytes, ctx.world, machine=ctx.machine,
                       nodes=nodes, device=table_device(ctx, tensor), current=ctx.settings)
    return registry.get(collective, name), why


def pick_per_block(collective: str, algorithm, block: torch.Tensor, ctx: Context) -> Tuple[registry.Algorithm, str]:
    """:func:`pick` for a call whose ``block`` is one rank's share: the collective moves the
    world's blocks (n = world × the block's bytes, as the cost models count it)."""
    return pick(collective, algorithm, block.numel() * block.element_size() * (ctx.world or 1), ctx, tensor=block)


def machine_grid(machine, world: Optional[int]) -> Optional[Tuple[int, ...]]:
    """The dimensions of ``machine``'s torus or mesh when it has one host per rank of the
    world and rank r on host r (``layout[GRID]`` of the schedules that read it), else None."""
    net = getattr(machine, "network", None)
    return None if net is None or world is None else net.grid(world)


def new_plan(collective: str, algorithm: registry.Algorithm, why: str, ctx: Context,
             layout: Layout, buffers: Dict[str, torch.Tensor], *, op: Optional[str] = None,
             result=None, describe_as: str = "") -> Plan:
    algorithm.check_world(ctx.world)            # a fixed-world algorithm (a loaded MSCCL program)
    if SEGMENT not in layout.params:       # the pipelined algorithms' segment, from its one table
        first = next(iter(buffers.values()))
        layout = Layout(layout.numel, {**layout.params, SEGMENT: segment_elements(
            collective, algorithm.name, first.element_size(), table_device(ctx, first))})
    if getattr(algorithm.schedule, "needs_nodes", False) and NODES not in layout.params:
        # the placement the call's entry put in its context (on a group: agreed at the group's
        # first collective call), named in the log; read, never asked for
        nodes, source = context_placement(ctx)
        layout = Layout(layout.numel, {**layout.params, NODES: nodes})
        why = f"{why}; {describe_placement(nodes)} from {source}"
    if getattr(algorithm.schedule, "needs_grid", False) and GRID not in layout.params:
        # the torus of the group's machine (Options(machine=), else RINGCOLL_MACHINE's), or
        # of the machine the simulator runs on
        grid = machine_grid(model_machine(ctx.machine)[0], ctx.world)
        if grid is not None:
            layout = Layout(layout.numel, {**layout.params, GRID: grid})
            why = f"{why}; on the {'x'.join(map(str, grid))} grid of the machine"
    plan = Plan(collective, algorithm, ctx.rank, ctx.world, layout, buffers, op=op,
                result=result, describe=describe_as, seq=ctx.seq, why=why)
    if not getattr(ctx, "provisional", False):   # a stand-in's plan is built again: that one is logged
        log.info("%s: world %d, rank %d -> %s (%s)", describe_as, ctx.world, ctx.rank, algorithm.name, why)
    return plan


def rooted_plan(collective: str, ctx: Context, tensor, real: torch.Tensor, root: int, algorithm, *,
                spec=None) -> Optional[Tuple[Plan, torch.Tensor]]:
    """The plan of a rooted call on one tensor (broadcast; reduce, with its op's ``spec``) and
    the flat data it moves, once the tensor and the root are checked: the algorithm, then on a
    member of the group the device. A non-contiguous tensor is written back after the
    caller's own after-steps (it inserts them before). None outside the group."""
    chosen, why = pick(collective, algorithm, real.numel() * real.element_size(), ctx, tensor=real)
    if ctx.rank is None:
        return None
    check_device("tensor", tensor, ctx)
    data, write_back = flat(real)
    note = f"root {root}" if spec is None else f"{spec.name} root {root}"
    plan = new_plan(collective, chosen, why, ctx, Layout(data.numel(), {ROOT: root}), {"data": data},
                    op=None if spec is None else spec.local, result=[tensor],
                    describe_as=describe(collective, chosen.name, tensor, note))
    if write_back is not None:
        plan.after.append(write_back)
    return plan, data
