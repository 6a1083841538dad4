"""The all_gather and all_gather_into_tensor drop-ins.

The private helpers here (list checks, one flat buffer over a list of tensors, memory
overlap) serve the whole gather/scatter family: reduce_scatter and gather_scatter import them.
"""
from __future__ import annotations

__all__ = ["all_gather", "all_gather_into_tensor"]

from typing import Callable, Optional, Sequence, Tuple

import torch

from ..schedule import Layout
from ._common import Context, builder, check_async, check_device, check_tensor, describe, flat, group_context, new_plan, pick


# -- helpers for the family ---------------------------------------------------------------
def check_tensor_list(param: str, tensors) -> None:
    """TypeError unless ``tensors`` is a list of tensors of supported dtypes (torch refuses
    tuples too)."""
    if not isinstance(tensors, list):
        raise TypeError(f"{param} must be a list of torch.Tensor, got {type(tensors).__name__}")
    for index, tensor in enumerate(tensors):
        check_tensor(f"{param}[{index}]", tensor)


def check_same(param: str, tensor: torch.Tensor, like: torch.Tensor, like_param: str) -> None:
    """ValueError (as torch's ``Invalid usage of tensors with different dtypes``) unless
    ``tensor`` has the dtype and device of ``like``."""
    if tensor.dtype != like.dtype:
        raise ValueError(f"{param} must have the dtype of {like_param}, {like.dtype}, got {tensor.dtype}")
    if tensor.device != like.device:
        raise ValueError(f"{param} must be on the device of {like_param}, {like.device}, got {tensor.device}")


def check_numels(param: str, tensors: Sequence[torch.Tensor], numel: int, what: str) -> None:
    for index, tensor in enumerate(tensors):
        if tensor.numel() != numel:
            raise ValueError(f"{param}[{index}] must have {numel} elements ({what}), got {tensor.numel()} "
                             f"(shape {tuple(tensor.shape)}); tensors of different sizes are not supported")


def check_length(param: str, tensors: Sequence[torch.Tensor], world: int) -> None:
    if len(tensors) != world:
        raise ValueError(f"{param} must hold one tensor per rank of the group ({world}), got {len(tensors)}")


def back_to_back(tensors: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """One flat view over ``tensors`` when they lie back to back in one storage, in order (the
    chunks of one contiguous tensor, say), so a list needs no staging copy; else None."""
    if not tensors:
        return None
    first = tensors[0]
    numel, size = first.numel(), first.element_size()
    if numel == 0:
        return None
    base = first.untyped_storage().data_ptr()
    for index, tensor in enumerate(tensors):
        if (not tensor.is_contiguous() or tensor.untyped_storage().data_ptr() != base
                or tensor.data_ptr() != first.data_ptr() + index * numel * size):
            return None
    return first.as_strided((len(tensors) * numel,), (1,))


def stage_list(tensors: Sequence[torch.Tensor], like: torch.Tensor, ctx: Context) -> Tuple[torch.Tensor, bool]:
    """A flat buffer for a list of equal-sized tensors: a view when they lie back to back,
    else a staging buffer (True: the caller copies in or out). On a process group the
    executor lends a staging buffer it keeps across calls, as its scratch: a fresh 64 MiB
    buffer costs its page faults on every call (scatter at 64 MiB spent 3/4 of its time
    copying into one); the simulator gives each rank a buffer of its own."""
    view = back_to_back(tensors)
    if view is not None:
        return view, False
    numel = len(tensors) * like.numel()
    if ctx.executor is not None:
        return ctx.executor.staging(numel, like.dtype, like.device), True
    return torch.empty(numel, dtype=like.dtype, device=like.device), True


def copy_in(staging: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
    def run():
        numel = staging.numel() // max(len(tensors), 1)
        for index, tensor in enumerate(tensors):
            staging[index * numel:(index + 1) * numel].view(tensor.shape).copy_(tensor)
    return run


def copy_out(staging: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
    def run():
        numel = staging.numel() // max(len(tensors), 1)
        for index, tensor in enumerate(tensors):
            tensor.copy_(staging[index * numel:(index + 1) * numel].view(tensor.shape))
    return run


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two flat contiguous tensors share any memory."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def is_block(inner: torch.Tensor, outer: torch.Tensor, index: int) -> bool:
    """Whether flat ``inner`` is exactly block ``index`` of flat ``outer`` (in place)."""
    numel = inner.numel()
    return (numel > 0 and inner.device == outer.device
            and inner.data_ptr() == outer.data_ptr() + index * numel * outer.element_size())


def separate_input(input_flat: torch.Tensor, output_flat: torch.Tensor, exact: bool, plan) -> torch.Tensor:
    """The input as the schedule may name it: itself, unless it overlaps the output other than
    as exactly this rank's block (``exact``); then a copy made when the plan runs. Executors
    order steps by buffer names, so two names must never share memory."""
    if exact or not overlaps(input_flat, output_flat):
        return input_flat
    copy = torch.empty_like(input_flat)
    plan.before.insert(0, lambda: copy.copy_(input_flat))
    plan.buffers["input"] = copy
    return copy


# -- all_gather_into_tensor ---------------------------------------------------------------
def _gather_plan(ctx: Context, chosen, why, output_flat: torch.Tensor, input_flat: torch.Tensor,
                 tensor: torch.Tensor, result, name: str):
    in_place = is_block(input_flat, output_flat, ctx.rank)
    layout = Layout(output_flat.numel(), {"in_place": in_place})
    plan = new_plan("all_gather", chosen, why, ctx, layout, {"output": output_flat, "input": input_flat},
                    result=result, describe_as=describe(name, chosen.name, tensor,
                                                        "in-place" if in_place else ""))
    separate_input(input_flat, output_flat, in_place, plan)
    return plan


@builder("all_gather_into_tensor")
def build_all_gather_into_tensor(ctx: Context, output_tensor, input_tensor, *, algorithm="auto"):
    check_tensor("output_tensor", output_tensor)
    check_tensor("input_tensor", input_tensor)
    check_same("output_tensor", output_tensor, input_tensor, "input_tensor")
    nbytes = input_tensor.numel() * input_tensor.element_size() * (ctx.world or 1)
    chosen, why = pick("all_gather", algorithm, nbytes, ctx)
    if ctx.rank is None:
        return None
    if output_tensor.numel() != ctx.world * input_tensor.numel():
        raise ValueError(f"output_tensor must have world size x input_tensor's elements "
                         f"({ctx.world} x {input_tensor.numel()} = {ctx.world * input_tensor.numel()}), "
                         f"got {output_tensor.numel()} (shape {tuple(output_tensor.shape)})")
    check_device("output_tensor", output_tensor, ctx)
    check_device("input_tensor", input_tensor, ctx)
    output_flat, write_back = flat(output_tensor)
    input_flat, _ = flat(input_tensor)
    numel = input_flat.numel()
    # as gloo's Work.result(): the output, one view per rank in the input's shape
    result = [output_flat[r * numel:(r + 1) * numel].view(input_tensor.shape) for r in range(ctx.world)] \
        if write_back is None else [output_tensor]
    plan = _gather_plan(ctx, chosen, why, output_flat, input_flat, input_tensor, result,
                        "all_gather_into_tensor")
    if write_back is not None:
        plan.after.append(write_back)
    return plan


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *, algorithm="auto"):
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
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, keyword-only): ``"auto"`` (the selection table, or ``RINGCOLL_ALGO``)
            or one of ``ringcoll.algorithms("all_gather")``: ``ring``, ``recursive_doubling``,
            ``bruck``.

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is, as gloo's, the
        list of the world size blocks of the output, as views in the input's shape. None, if
        not async_op or if not part of the group.

    Examples:
        >>> # All tensors below are of torch.int64 dtype.
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor_in = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
        >>> tensor_in
        tensor([1, 2]) # Rank 0
        tensor([3, 4]) # Rank 1
        >>> tensor_out = torch.zeros(4, dtype=torch.int64)
        >>> ringcoll.all_gather_into_tensor(tensor_out, tensor_in, algorithm="bruck")
        >>> tensor_out
        tensor([1, 2, 3, 4]) # Rank 0
        tensor([1, 2, 3, 4]) # Rank 1
    """
    check_async(async_op)
    ctx = group_context(group)
    return ctx.submit(build_all_gather_into_tensor(ctx, output_tensor, input_tensor, algorithm=algorithm),
                      async_op)


# -- all_gather ---------------------------------------------------------------------------
@builder("all_gather")
def build_all_gather(ctx: Context, tensor_list, tensor, *, algorithm="auto"):
    check_tensor_list("tensor_list", tensor_list)
    check_tensor("tensor", tensor)
    for index, out in enumerate(tensor_list):
        check_same(f"tensor_list[{index}]", out, tensor, "tensor")
    nbytes = tensor.numel() * tensor.element_size() * (ctx.world or 1)
    chosen, why = pick("all_gather", algorithm, nbytes, ctx)
    if ctx.rank is None:
        return None
    check_length("tensor_list", tensor_list, ctx.world)
    check_numels("tensor_list", tensor_list, tensor.numel(), "those of tensor")
    check_device("tensor", tensor, ctx)
    for index, out in enumerate(tensor_list):
        check_device(f"tensor_list[{index}]", out, ctx)
    output_flat, staged = stage_list(tensor_list, tensor, ctx)
    input_flat, _ = flat(tensor)
    plan = _gather_plan(ctx, chosen, why, output_flat, input_flat, tensor, tensor_list, "all_gather")
    if staged:
        plan.after.append(copy_out(output_flat, tensor_list))
    return plan


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
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, keyword-only): ``"auto"`` or one of ``ringcoll.algorithms("all_gather")``.

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
    check_async(async_op)
    ctx = group_context(group)
    return ctx.submit(build_all_gather(ctx, tensor_list, tensor, algorithm=algorithm), async_op)
