"""The all_gather_single (and its deprecated name all_gather_into_tensor) and all_gather
drop-ins (tensor-list helpers: ``_lists``)."""
from __future__ import annotations

__all__ = ["all_gather", "all_gather_into_tensor", "all_gather_single"]

import torch
from typing_extensions import deprecated

from ..schedules.vocabulary import IN_PLACE, Layout
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import flat, real_tensor
from ._plans import describe, new_plan
from ._lists import (checked_per_rank, checked_world_times, check_tensor_list, is_block, separate_input,
                     stage_list, stage_through)


# -- all_gather_single --------------------------------------------------------------------
def _gather_plan(ctx: Context, chosen, why, output_flat: torch.Tensor, input_flat: torch.Tensor,
                 tensor: torch.Tensor, result, name: str):
    in_place = is_block(input_flat, output_flat, ctx.rank)
    layout = Layout(output_flat.numel(), {IN_PLACE: in_place})
    plan = new_plan("all_gather", chosen, why, ctx, layout, {"output": output_flat, "input": input_flat},
                    result=result, describe_as=describe(name, chosen.name, tensor,
                                                        "in-place" if in_place else ""))
    separate_input(input_flat, output_flat, in_place, plan)
    return plan


@builder("all_gather_into_tensor")
@builder("all_gather_single")
def build_all_gather_single(ctx: Context, output_tensor, input_tensor, *, algorithm="auto"):
    real_output = real_tensor("output_tensor", output_tensor)
    real_input = real_tensor("input_tensor", input_tensor)
    checked = checked_world_times("all_gather", ctx, algorithm, "output_tensor", output_tensor, "input_tensor",
                                  input_tensor, real_input)
    if checked is None:
        return None
    chosen, why = checked
    output_flat, write_back = flat(real_output)
    input_flat, _ = flat(real_input)
    # as gloo's Work.result(): the output, one view per rank in the input's shape
    result = list(output_tensor.view(-1).view(ctx.world, *input_tensor.shape).unbind(0)) \
        if write_back is None else [output_tensor]
    plan = _gather_plan(ctx, chosen, why, output_flat, input_flat, input_tensor, result, "all_gather_single")
    if write_back is not None:
        plan.after.append(write_back)
    return plan


@c10d_doc('all_gather')
def all_gather_single(output_tensor, input_tensor, group=None, async_op=False, *, algorithm="auto"):
    """Gather tensors from all ranks and put them in a single output tensor.

    Block r of ``output_tensor`` (its elements in row-major order) ends as rank r's
    ``input_tensor``, bitwise identical in all processes. ``output_tensor`` may have any shape
    with world size x ``input_tensor.numel()`` elements: the concatenation of the inputs along
    dim 0, or their stack, or flat. ``input_tensor`` may be this rank's block of
    ``output_tensor`` (in place, no copy). Non-contiguous tensors work through a contiguous
    copy.

    Args:
        output_tensor (Tensor): Output tensor, world size x ``input_tensor.numel()`` elements.
        input_tensor (Tensor): Tensor to be gathered from current rank; the same size on
            every rank.
        {group, async_op, algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is, as gloo's, the
        list of the world size blocks of the output, as views in the input's shape. None, if
        not async_op or if not part of the group.

    Examples:
        >>> # 2 ranks; the output stacked (any shape of world size x input elements works).
        >>> tensor_in = torch.tensor([1, 2]) + 2 * rank
        >>> tensor_out = torch.empty(2, 2, dtype=torch.int64)
        >>> ringcoll.all_gather_single(tensor_out, tensor_in, algorithm="bruck")
        >>> tensor_out
        tensor([[1, 2],
                [3, 4]]) # Rank 0 and 1
    """
    return run_call(build_all_gather_single, group, async_op, output_tensor, input_tensor, algorithm=algorithm)


# torch 2.13 deprecates the old name with a FutureWarning and forwards it; so does ringcoll
@deprecated("`ringcoll.all_gather_into_tensor` is deprecated, as torch 2.13's. "
            "Please use `ringcoll.all_gather_single` instead.", category=FutureWarning)
def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *, algorithm="auto"):
    """Gather tensors from all ranks and put them in a single output tensor.

    .. warning::
        ``all_gather_into_tensor`` is deprecated (a FutureWarning, as torch 2.13's). Users
        should use :func:`all_gather_single`, which it calls.
    """
    return all_gather_single(output_tensor, input_tensor, group, async_op, algorithm=algorithm)


# -- all_gather ---------------------------------------------------------------------------
@builder("all_gather")
def build_all_gather(ctx: Context, tensor_list, tensor, *, algorithm="auto"):
    real_list = check_tensor_list("tensor_list", tensor_list)
    real = real_tensor("tensor", tensor)
    checked = checked_per_rank("all_gather", ctx, algorithm, "tensor_list", tensor_list, real_list, "tensor",
                               tensor, real)
    if checked is None:
        return None
    chosen, why = checked
    output_flat, staged = stage_list(real_list, real, ctx)
    input_flat, _ = flat(real)
    plan = _gather_plan(ctx, chosen, why, output_flat, input_flat, tensor, tensor_list, "all_gather")
    if staged:
        stage_through(plan, "output", real_list, into=False)
    return plan


@c10d_doc('all_gather')
def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm="auto"):
    """Gathers tensors from the whole group in a list.

    ``tensor_list[r]`` ends as rank r's ``tensor``, bitwise identical in all processes. The
    tensors of the list need the same number of elements as ``tensor`` (uneven sizes are not
    supported, as with gloo); when they are the consecutive chunks of one contiguous buffer
    the collective writes straight into it, otherwise it gathers into one buffer and copies
    out.

    Args:
        tensor_list (list[Tensor]): Output list. It should contain correctly-sized tensors,
            one per rank, to be used for output of the collective.
        tensor (Tensor): Tensor to be broadcast from current process.
        {group, async_op, algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is ``tensor_list``.
        None, if not async_op or if not part of the group.

    Examples:
        >>> # All tensors below are of torch.int64 dtype.
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor_list = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        >>> tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
        >>> tensor
        tensor([1, 2]) # Rank 0
        tensor([3, 4]) # Rank 1
        >>> ringcoll.all_gather(tensor_list, tensor, algorithm="ring")
        >>> tensor_list
        [tensor([1, 2]), tensor([3, 4])] # Rank 0
        [tensor([1, 2]), tensor([3, 4])] # Rank 1
    """
    return run_call(build_all_gather, group, async_op, tensor_list, tensor, algorithm=algorithm)
