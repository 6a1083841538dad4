"""The broadcast drop-in."""
from __future__ import annotations

__all__ = ["broadcast"]


from ..schedules.vocabulary import Layout
from ._docs import c10d_doc
from ._common import builder, Context, run_call
from ._checks import check_device, flat, group_root, real_tensor
from ._plans import describe, new_plan, pick


@builder("broadcast")
def build_broadcast(ctx: Context, tensor, src=None, *, group_src=None, algorithm="auto"):
    real = real_tensor("tensor", tensor)
    root = group_root(ctx, "src", src, "group_src", group_src)
    chosen, why = pick("broadcast", algorithm, real.numel() * real.element_size(), ctx, tensor=real)
    if ctx.rank is None:
        return None
    check_device("tensor", tensor, ctx)
    data, write_back = flat(real)
    layout = Layout(data.numel(), {"root": root})
    plan = new_plan("broadcast", chosen, why, ctx, layout, {"data": data}, result=[tensor],
                    describe_as=describe("broadcast", chosen.name, tensor, f"root {root}"))
    if write_back is not None:
        plan.after.append(write_back)
    return plan


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
        {group}
        {async_op}
        group_src (int): Source rank on ``group``. Must specify one of ``group_src`` and
            ``src`` but not both.
        {algorithm}

    Returns:
        {returns}

    Examples:
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
        >>> tensor
        tensor([1, 2]) # Rank 0
        tensor([3, 4]) # Rank 1
        >>> ringcoll.broadcast(tensor, src=1, algorithm="binomial")
        >>> tensor
        tensor([3, 4]) # Rank 0
        tensor([3, 4]) # Rank 1
    """
    return run_call(build_broadcast, group, async_op, tensor, src, group_src=group_src, algorithm=algorithm)
