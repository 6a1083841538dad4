"""The all_reduce drop-in."""
from __future__ import annotations

__all__ = ["all_reduce"]

from .. import kernels
from ..ops import ReduceOp, resolve
from ..schedules.vocabulary import Layout
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import check_device, flat, real_tensor
from ._plans import describe, new_plan, pick


@builder("all_reduce")
def build_all_reduce(ctx: Context, tensor, op=ReduceOp.SUM, *, algorithm="auto"):
    real = real_tensor("tensor", tensor, op, "all_reduce")
    spec = resolve(op, real)
    chosen, why = pick("all_reduce", algorithm, real.numel() * real.element_size(), ctx,
                       tensor=real)
    if ctx.rank is None:
        return None
    check_device("tensor", tensor, ctx)
    data, write_back = flat(real)
    layout = Layout(data.numel())
    plan = new_plan("all_reduce", chosen, why, ctx, layout, {"data": data},
                    op=spec.local, result=[tensor],
                    describe_as=describe("all_reduce", chosen.name, tensor, spec.name))
    if spec.premul is not None:
        plan.before.append(lambda: kernels.scale_(data, spec.premul))
    if spec.average:
        plan.after.append(lambda: kernels.divide_(data, ctx.world))
    if write_back is not None:
        plan.after.append(write_back)
    return plan


@c10d_doc('all_reduce')
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, algorithm="auto"):
    """Reduces the tensor data across all machines in a way that all get the final result.

    After the call ``tensor`` is going to be bitwise identical in all processes. Works on CPU
    tensors over gloo and on CUDA tensors over NCCL (or over gloo, staged through host memory).
    A non-contiguous tensor is reduced through a contiguous copy and written back.

    Args:
        tensor (Tensor): Input and output of the collective. The function operates in-place.
        {op, group, async_op, algorithm}

    {returns}

    Examples:
        >>> # All tensors below are of torch.int64 type.
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
        >>> tensor
        tensor([1, 2]) # Rank 0
        tensor([3, 4]) # Rank 1
        >>> ringcoll.all_reduce(tensor, op=ReduceOp.SUM, algorithm="ring")
        >>> tensor
        tensor([4, 6]) # Rank 0
        tensor([4, 6]) # Rank 1
    """
    return run_call(build_all_reduce, group, async_op, tensor, op, algorithm=algorithm)
