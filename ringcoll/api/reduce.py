"""The reduce drop-in."""
from __future__ import annotations

__all__ = ["reduce"]

from .. import kernels
from ..ops import ReduceOp, resolve
from ..schedules.vocabulary import Layout
from ._common import builder, Context, run_call
from ._checks import check_device, flat, group_root, real_tensor
from ._plans import describe, new_plan, pick


@builder("reduce")
def build_reduce(ctx: Context, tensor, dst=None, op=ReduceOp.SUM, *, group_dst=None, algorithm="auto"):
    real = real_tensor("tensor", tensor, op, "reduce")
    spec = resolve(op, real)
    root = group_root(ctx, "dst", dst, "group_dst", group_dst)
    chosen, why = pick("reduce", algorithm, real.numel() * real.element_size(), ctx, tensor=real)
    if ctx.rank is None:
        return None
    check_device("tensor", tensor, ctx)
    data, write_back = flat(real)
    layout = Layout(data.numel(), {"root": root})
    plan = new_plan("reduce", chosen, why, ctx, layout, {"data": data}, op=spec.local, result=[tensor],
                    describe_as=describe("reduce", chosen.name, tensor, f"{spec.name} root {root}"))
    if spec.premul is not None:
        plan.before.append(lambda: kernels.scale_(data, spec.premul))
    if spec.average and ctx.rank == root:
        plan.after.append(lambda: kernels.divide_(data, ctx.world))
    if write_back is not None:
        plan.after.append(write_back)
    return plan


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None, *,
           algorithm="auto"):
    """Reduces the tensor data across all machines.

    Only the process with rank ``dst`` is going to receive the final result. The other
    processes' ``tensor`` is used as working memory and holds partial reductions afterwards
    (torch's gloo leaves them so too): do not rely on it. A non-contiguous tensor is reduced
    through a contiguous copy and written back.

    Args:
        tensor (Tensor): Input and output of the collective. The function operates in-place.
        dst (int): Destination rank on global process group (regardless of ``group`` argument).
        op (optional): One of the values from ``torch.distributed.ReduceOp`` enum, or a
            ``torch.distributed._make_nccl_premul_sum(factor)``. Specifies an operation used
            for element-wise reductions. ``AVG`` divides once, on ``dst`` only.
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used.
        async_op (bool, optional): Whether this op should be an async op.
        group_dst (int): Destination rank on ``group``. Must specify one of ``group_dst`` and
            ``dst`` but not both.
        algorithm (str, keyword-only): ``"auto"`` (the selection table, or ``RINGCOLL_ALGO``)
            or one of ``ringcoll.algorithms("reduce")``: ``binomial``, ``rabenseifner``,
            ``ring``, ``double_binary_tree``, ``bine``, ``bine_near``, ``hierarchical``,
            ``rabenseifner_far``.

    Returns:
        Async work handle, if async_op is set to True. None, if not async_op or if not part
        of the group.

    Examples:
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
        >>> tensor
        tensor([1, 2]) # Rank 0
        tensor([3, 4]) # Rank 1
        >>> ringcoll.reduce(tensor, dst=0, op=ReduceOp.SUM, algorithm="binomial")
        >>> tensor
        tensor([4, 6]) # Rank 0
        tensor([3, 4]) # Rank 1 (unspecified)
    """
    return run_call(build_reduce, group, async_op, tensor, dst, op, group_dst=group_dst, algorithm=algorithm)
