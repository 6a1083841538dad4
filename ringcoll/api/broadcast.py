"""The broadcast drop-in."""
from __future__ import annotations

__all__ = ["broadcast"]


from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import group_root, real_tensor
from ._plans import rooted_plan


@builder("broadcast")
def build_broadcast(ctx: Context, tensor, src=None, *, group_src=None, algorithm="auto"):
    real = real_tensor("tensor", tensor)
    root = group_root(ctx, "src", src, "group_src", group_src)
    planned = rooted_plan("broadcast", ctx, tensor, real, root, algorithm)
    return None if planned is None else planned[0]


@c10d_doc('broadcast')
def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, algorithm="auto"):
    """Broadcasts the tensor to the whole group.

    ``tensor`` must have the same number of elements in all processes participating in the
    collective. After the call ``tensor`` is bitwise identical to the source's in all
    processes of the group. A non-contiguous tensor is received through a contiguous copy and
    written back.

    Args:
        tensor (Tensor): Data to be sent if ``src`` is the rank of current process, and
            tensor to be used to save received data otherwise.
        src (int): Source rank on global process group (regardless of ``group`` argument).
        {group, async_op, group_src, algorithm}

    {returns}

    Examples:
        >>> # 3 ranks; rank 2 is the source.
        >>> tensor = torch.tensor([10 * rank, 10 * rank + 1])
        >>> ringcoll.broadcast(tensor, src=2, algorithm="binomial")
        >>> tensor
        tensor([20, 21]) # Rank 0, 1 and 2
    """
    return run_call(build_broadcast, group, async_op, tensor, src, group_src=group_src, algorithm=algorithm)
