"""Which node each rank of a group runs on, for the node-aware (hierarchical) algorithms.

The layout reaches a schedule as the Layout parameter ``"nodes"``: a tuple giving the node
index of every group rank (nodes numbered in order of their lowest rank; a node's ranks need
not be consecutive and nodes may differ in size). The builders (``collectives._common.new_plan``)
add it, for schedules marked with :func:`needs_nodes` only, from the first of:

1. the simulator's ``simulate(..., local_size=L)`` (the context's ``nodes``);
2. ``RINGCOLL_LOCAL_SIZE=L``: nodes of L consecutive global ranks (the last one may be
   smaller), which emulates nodes on one machine;
3. torchrun's ``LOCAL_WORLD_SIZE=L``: the same grouping, torchrun numbering ranks node by node;
4. the hostnames of the group's ranks, exchanged once per group at its first node-aware
   call (every rank of the group makes that call, so the exchange cannot hang), on a
   group registered with torch.distributed;
5. otherwise one node.
"""
from __future__ import annotations

import collections
import socket
from typing import Callable, Optional, Sequence, Tuple

from .config import settings

Nodes = Tuple[int, ...]


def needs_nodes(schedule: Callable) -> Callable:
    """Mark a schedule as reading ``layout["nodes"]`` (the builders then add it)."""
    schedule.needs_nodes = True
    return schedule


def grouped(keys: Sequence) -> Nodes:
    """Node index per rank from any per-rank key (a hostname, global rank // L ...), nodes
    numbered in order of first appearance."""
    index: dict = {}
    return tuple(index.setdefault(key, len(index)) for key in keys)


def even_nodes(world: int, local_size: int, global_ranks: Optional[Sequence[int]] = None) -> Nodes:
    """Nodes of ``local_size`` consecutive global ranks."""
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
        raise ValueError(f"local_size must be a positive int, got {local_size!r}")
    ranks = range(world) if global_ranks is None else global_ranks
    return grouped([rank // local_size for rank in ranks])


def model_local_size(nodes: Optional[Nodes]) -> Optional[int]:
    """The L (ranks per node) the node-aware cost models take for ranks on ``nodes``: the
    ranks every node holds, the node of the last rank allowed fewer (nodes of L consecutive
    ranks, as :func:`even_nodes` and ``RINGCOLL_LOCAL_SIZE=L`` give them: the models count
    ⌈p/L⌉ nodes); None without nodes or for other uneven ones (the models then read the
    environment)."""
    if nodes is None:
        return None
    counts = collections.Counter(nodes)
    last = counts.pop(nodes[-1])
    sizes = set(counts.values())
    if not sizes:
        return last
    size = sizes.pop()
    return size if not sizes and last <= size else None


def local_size_from_env() -> Optional[int]:
    """Ranks per node from RINGCOLL_LOCAL_SIZE, else torchrun's LOCAL_WORLD_SIZE, else None."""
    return settings().local_size


def node_layout(ctx) -> Nodes:
    """The node of every rank of ``ctx``'s group (module docstring for the sources)."""
    if getattr(ctx, "nodes", None) is not None:
        return tuple(ctx.nodes)
    executor = ctx.executor
    global_ranks = executor.global_ranks if executor is not None else None
    size = local_size_from_env()
    if size is not None:
        return even_nodes(ctx.world, size, global_ranks)
    if executor is not None and ctx.world > 1:
        nodes = getattr(executor, "nodes_by_host", None)
        if nodes is None:
            nodes = executor.nodes_by_host = _by_hostname(executor)
        return nodes
    return (0,) * ctx.world


def _by_hostname(executor) -> Nodes:
    """Group the ranks by hostname: one exchange of the names over the executor's group."""
    import torch.distributed as dist

    if executor.group not in dist.distributed_c10d._world.pg_group_ranks \
            and executor.group is not dist.GroupMember.WORLD:
        return (0,) * executor.world        # a raw backend group: no object collectives on it
    names = [None] * executor.world
    dist.all_gather_object(names, socket.gethostname(), group=executor.group)
    return grouped(names)
