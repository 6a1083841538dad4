"""A DDP communication hook for programs that keep gloo or NCCL as their backend.

    model = DistributedDataParallel(model)                  # any backend
    model.register_comm_hook(None, ringcoll.ddp_comm_hook("ring"))

Each gradient bucket is all-reduced by ringcoll's drop-in on DDP's own group, as torch's
``allreduce_hook`` does it with the built-in: divided by the group size, then summed.
"""
from typing import Callable

import torch
import torch.distributed as dist

from ..api.all_reduce import all_reduce
from ..ops import ReduceOp
from ..selection import choose


def ddp_comm_hook(algorithm: str = "auto") -> Callable:
    """A DDP communication hook that all-reduces gradient buckets with ringcoll.

    Register it with ``model.register_comm_hook(state, hook)``, where ``state`` is the process
    group to reduce over (None: the default group, as torch's ``allreduce_hook``). The bucket
    is divided by the group size and then summed with ``algorithm``, asynchronously: DDP
    overlaps the reduction with the rest of the backward pass.

    Args:
        algorithm (str): ``"auto"`` (the selection table, or ``RINGCOLL_ALGO``) or one of
            ``ringcoll.algorithms("all_reduce")``: ``ring``, ``recursive_doubling``,
            ``rabenseifner``, ``double_binary_tree``, ``swing_latency``, ``swing_bandwidth``,
            ``swing_torus_bandwidth``, ``swing_torus_latency``, ``bine``, ``direct``,
            ``hierarchical``, ``torus2d``, ``bucket_torus``, ``rabenseifner_far``, ``nccl_ring``,
            ``nccl_tree``.

    Returns:
        ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]``, which resolves to the
        reduced bucket (its error, if the collective fails, raises in ``backward()``).

    Examples:
        >>> # We have 2 ranks on a gloo group.
        >>> model = DistributedDataParallel(torch.nn.Linear(4, 4))
        >>> model.register_comm_hook(None, ringcoll.ddp_comm_hook("rabenseifner"))
        >>> model(torch.randn(8, 4)).sum().backward()   # buckets reduced by ringcoll
    """
    choose("all_reduce", algorithm, 0, 1)       # TypeError/ValueError naming the choices, now

    # real annotations, not strings: DDP checks them against dist.GradBucket and Future[Tensor]
    def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = state if isinstance(state, dist.ProcessGroup) else None
        size = dist.get_world_size(group)
        tensor = bucket.buffer()
        tensor.div_(size)
        work = all_reduce(tensor, op=ReduceOp.SUM, group=group, async_op=True, algorithm=algorithm)
        return work.get_future().then(lambda future: future.value()[0])

    hook.__name__ = hook.__qualname__ = f"ringcoll_allreduce_hook_{algorithm}"
    return hook
