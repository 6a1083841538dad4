"""The reduce drop-in."""
from __future__ import annotations

__all__ = ["reduce"]

from .. import kernels
from ..ops import ReduceOp, resolve
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import group_root, real_tensor
from ._plans import rooted_plan


@builder("reduce")
def build_reduce(ctx: Context, tensor, dst=None, op=ReduceOp.SUM, *, group_dst=None, algorithm="auto"):
    real = real_tensor("tensor", tensor, op, "reduce")
    spec = resolve(op, real)
    root = group_root(ctx, "dst", dst, "group_dst", group_dst)
    planned = rooted_plan("reduce", ctx, tensor, real, root, algorithm, spec=spec)
    if planned is None:
        return None
    plan, data = planned
    if spec.premul is not None:
        plan.before.append(lambda: kernels.scale_(data, spec.premul))
    if spec.average and ctx.rank == root:
        plan.after.insert(0, lambda: kernels.divide_(data, ctx.world))     # before any write-back
    return plan


@c10d_doc('reduce')
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
        {group, async_op, group_dst, algorithm}

    {returns}

    Examples:
        >>> # 3 ranks; each position's largest element lands on rank 1.
        >>> tensor = torch.tensor([rank, 5 - rank])
        >>> ringcoll.reduce(tensor, dst=1, op=ReduceOp.MAX, algorithm="binomial")
        >>> tensor
        tensor([2, 5]) # Rank 1 (on rank 0 and 2: unspecified)
    """
    return run_call(build_reduce, group, async_op, tensor, dst, op, group_dst=group_dst, algorithm=algorithm)
