"""The reduce_scatter_single (and its deprecated name reduce_scatter_tensor) and
reduce_scatter drop-ins.

The caller's inputs are never written (the schedules reduce into scratch and the output);
PREMUL_SUM premultiplies a copy. An output that overlaps the input (NCCL's in-place
reduce-scatter: the output is this rank's block of the input) is reduced into a fresh
buffer and copied over at the end.
"""
from __future__ import annotations

__all__ = ["reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor"]

import torch
from typing_extensions import deprecated

from .. import kernels
from ..ops import ReduceOp, resolve
from ..schedules.vocabulary import Layout
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import flat, real_tensor
from ._plans import describe, new_plan
from ._lists import (checked_per_rank, checked_world_times, check_tensor_list, copy_in, overlaps, stage_list,
                     stage_through)


def _plan(ctx: Context, chosen, why, spec, output: torch.Tensor, input_flat: torch.Tensor, staged_in,
          result, name: str):
    """The plan around the caller's flat input (``staged_in``: the hook that fills it, if it
    is a staging copy) and output tensor (complex ones as their real view)."""
    output_flat, write_back = flat(output)
    before, after = [], []
    if staged_in is not None:
        before.append(staged_in)
    if spec.premul is not None:
        if staged_in is None:               # never scale the caller's input: scale a copy
            source = input_flat
            input_flat = torch.empty_like(source)
            before.append(lambda: input_flat.copy_(source))
        before.append(lambda: kernels.scale_(input_flat, spec.premul))
    target = output_flat
    if overlaps(output_flat, input_flat):   # the schedules read the input to the end
        target = torch.empty_like(output_flat)
        after.append(lambda: output_flat.copy_(target))
    if spec.average:
        after.insert(0, lambda: kernels.divide_(target, ctx.world))
    if write_back is not None:
        after.append(write_back)
    plan = new_plan("reduce_scatter", chosen, why, ctx, Layout(input_flat.numel()),
                    {"output": target, "input": input_flat}, op=spec.local, result=result,
                    describe_as=describe(name, chosen.name, output, spec.name))
    plan.before.extend(before)
    plan.after.extend(after)
    if spec.premul is not None and staged_in is None:
        plan.own.add("input")          # the copy it scales, made anew each run
    return plan


@builder("reduce_scatter_tensor")
@builder("reduce_scatter_single")
def build_reduce_scatter_single(ctx: Context, output, input, op=ReduceOp.SUM, *, algorithm="auto"):
    real_output = real_tensor("output", output, op, "reduce_scatter_single")
    real_input = real_tensor("input", input)
    spec = resolve(op, real_output)
    checked = checked_world_times("reduce_scatter", ctx, algorithm, "input", input, "output", output, real_output)
    if checked is None:
        return None
    chosen, why = checked
    input_flat, _ = flat(real_input)
    return _plan(ctx, chosen, why, spec, real_output, input_flat, None, [output], "reduce_scatter_single")


@c10d_doc('reduce_scatter')
def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm="auto"):
    """Reduces, then scatters a tensor to all ranks in a group.

    ``output`` ends as block ``rank`` (of ``output.numel()`` elements, in row-major order) of
    the element-wise reduction of every rank's ``input``. ``input`` is not modified (unless
    ``output`` is this rank's block of it, NCCL's in-place form); it may have any shape with
    world size x ``output.numel()`` elements (the concatenation or the stack of the outputs).

    Args:
        output (Tensor): Output tensor. It should have the same size across all ranks.
        input (Tensor): Input tensor to be reduced and scattered. Its size should be output
            tensor size times the world size.
        {op, group, async_op, algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is ``[output]`` (as
        NCCL's; gloo's raises). None, if not async_op or if not part of the group.

    Examples:
        >>> # All tensors below are of torch.int64 dtype.
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor_out = torch.zeros(2, dtype=torch.int64)
        >>> tensor_in = torch.arange(4, dtype=torch.int64)
        >>> tensor_in
        tensor([0, 1, 2, 3]) # Rank 0
        tensor([0, 1, 2, 3]) # Rank 1
        >>> ringcoll.reduce_scatter_single(tensor_out, tensor_in, algorithm="pairwise")
        >>> tensor_out
        tensor([0, 2]) # Rank 0
        tensor([4, 6]) # Rank 1
    """
    return run_call(build_reduce_scatter_single, group, async_op, output, input, op, algorithm=algorithm)


# torch 2.13 deprecates the old name with a FutureWarning and forwards it; so does ringcoll
@deprecated("`ringcoll.reduce_scatter_tensor` is deprecated, as torch 2.13's. "
            "Please use `ringcoll.reduce_scatter_single` instead.", category=FutureWarning)
def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm="auto"):
    """Reduces, then scatters a tensor to all ranks in a group.

    .. warning::
        ``reduce_scatter_tensor`` is deprecated (a FutureWarning, as torch 2.13's). Users
        should use :func:`reduce_scatter_single`, which it calls.
    """
    return reduce_scatter_single(output, input, op, group, async_op, algorithm=algorithm)


@builder("reduce_scatter")
def build_reduce_scatter(ctx: Context, output, input_list, op=ReduceOp.SUM, *, algorithm="auto"):
    real_output = real_tensor("output", output, op, "reduce_scatter")
    real_inputs = check_tensor_list("input_list", input_list)
    checked = checked_per_rank("reduce_scatter", ctx, algorithm, "input_list", input_list, real_inputs, "output",
                               output, real_output)
    spec = resolve(op, real_output)
    if checked is None:
        return None
    chosen, why = checked
    input_flat, staged = stage_list(real_inputs, real_output, ctx)
    if staged and spec.premul is not None:      # the premul scales the staging copy in place
        return _plan(ctx, chosen, why, spec, real_output, input_flat, copy_in(input_flat, real_inputs),
                     [output], "reduce_scatter")
    plan = _plan(ctx, chosen, why, spec, real_output, input_flat, None, [output], "reduce_scatter")
    if staged:
        stage_through(plan, "input", real_inputs, into=True)
    return plan


@c10d_doc('reduce_scatter')
def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, *, algorithm="auto"):
    """Reduces, then scatters a list of tensors to all processes in a group.

    ``output`` ends as the element-wise reduction of every rank's ``input_list[rank]``; the
    inputs are not modified. When the inputs are the consecutive chunks of one contiguous
    buffer they are read in place, otherwise through one staging copy.

    Args:
        output (Tensor): Output tensor.
        input_list (list[Tensor]): List of tensors to reduce and scatter, one per rank, each
            with ``output.numel()`` elements.
        {op, group, async_op, algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is ``[output]``.
        None, if not async_op or if not part of the group.

    Examples:
        >>> # All tensors below are of torch.int64 dtype.
        >>> # We have 2 process groups, 2 ranks.
        >>> output = torch.zeros(2, dtype=torch.int64)
        >>> input_list = [torch.tensor([1, 2]) + rank, torch.tensor([3, 4]) + rank]
        >>> input_list
        [tensor([1, 2]), tensor([3, 4])] # Rank 0
        [tensor([2, 3]), tensor([4, 5])] # Rank 1
        >>> ringcoll.reduce_scatter(output, input_list, algorithm="ring")
        >>> output
        tensor([3, 5]) # Rank 0
        tensor([7, 9]) # Rank 1
    """
    return run_call(build_reduce_scatter, group, async_op, output, input_list, op, algorithm=algorithm)
