"""Tensor lists and aliasing, shared by the list-taking collectives (all_gather, gather,
scatter, reduce_scatter): argument checks, one flat buffer over a list (a view when the list
lies back to back, else a staging buffer lent by the executor), and input/output overlap."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from .common import Context
from ._checks import check_device, real_tensor
from ._plans import pick_per_block


def checked_world_times(collective: str, ctx: Context, algorithm, param: str, whole, block_param: str, block,
                        real_block) -> Optional[tuple]:
    """The checks of a call on one tensor ``param`` of world size x the elements of another,
    ``block_param`` (all_gather_single's output, reduce_scatter_single's input), in order: the
    same dtype, the algorithm (priced per block); then, on a member of the group, the element
    count and both devices. None outside the group, else (algorithm, why)."""
    check_same(param, whole, block, block_param)
    chosen, why = pick_per_block(collective, algorithm, real_block, ctx)
    if ctx.rank is None:
        return None
    if whole.numel() != ctx.world * block.numel():
        raise ValueError(f"{param} must have world size x {block_param}'s elements ({ctx.world} x "
                         f"{block.numel()} = {ctx.world * block.numel()}), got {whole.numel()} "
                         f"(shape {tuple(whole.shape)})")
    check_device(param, whole, ctx)
    check_device(block_param, block, ctx)
    return chosen, why


def checked_per_rank(collective: str, ctx: Context, algorithm, param: str, tensors, real_list, block_param: str,
                     block, real_block) -> Optional[tuple]:
    """The checks of a call on a list ``param`` of one tensor per rank, each like ``block_param``
    (all_gather's output list, reduce_scatter's input list), in order: every tensor of the list
    like the block, the algorithm; then, on a member of the group, the list's length and sizes
    and the devices. None outside the group, else (algorithm, why)."""
    check_all_same(param, tensors, block, block_param)
    chosen, why = pick_per_block(collective, algorithm, real_block, ctx)
    if ctx.rank is None:
        return None
    check_list_fits(param, real_list, real_block, block_param, ctx)
    check_device(block_param, block, ctx)
    return chosen, why


def check_tensor_list(param: str, tensors) -> list:
    """TypeError unless ``tensors`` is a list of tensors of supported dtypes (torch refuses
    tuples too); the list of what the collective works on (complex tensors as their real
    view, :func:`~ringcoll.api.common.as_real`)."""
    if not isinstance(tensors, list):
        raise TypeError(f"{param} must be a list of torch.Tensor, got {type(tensors).__name__}")
    return [real_tensor(f"{param}[{index}]", tensor) for index, tensor in enumerate(tensors)]


def check_same(param: str, tensor: torch.Tensor, like: torch.Tensor, like_param: str) -> None:
    """ValueError (as torch's ``Invalid usage of tensors with different dtypes``) unless
    ``tensor`` has the dtype and device of ``like``."""
    if tensor.dtype != like.dtype:
        raise ValueError(f"{param} must have the dtype of {like_param}, {like.dtype}, got {tensor.dtype}")
    if tensor.device != like.device:
        raise ValueError(f"{param} must be on the device of {like_param}, {like.device}, got {tensor.device}")


def check_all_same(param: str, tensors: Sequence[torch.Tensor], like: torch.Tensor, like_param: str) -> None:
    """:func:`check_same` for every tensor of the list ``param``."""
    for index, tensor in enumerate(tensors):
        check_same(f"{param}[{index}]", tensor, like, like_param)


def check_list_fits(param: str, tensors: Sequence[torch.Tensor], like: torch.Tensor, like_param: str,
                    ctx: Context) -> None:
    """Once the group is known: one tensor per rank, each of ``like``'s size, on a device the
    group's backend can move."""
    check_length(param, tensors, ctx.world)
    check_numels(param, tensors, like.numel(), f"those of {like_param}")
    for index, tensor in enumerate(tensors):
        check_device(f"{param}[{index}]", tensor, ctx)


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


def stage_through(plan, name: str, tensors: Sequence[torch.Tensor], *, into: bool) -> None:
    """Stage the list ``tensors`` through the plan's buffer ``name`` (from :func:`stage_list`):
    copied in before the schedule (``into``) or out after it. The P2P executor skips the copy
    when the schedule names each tensor's block on its own (executor.Blocks); the simulator
    always stages."""
    staging = plan.buffers[name]
    hook = copy_in(staging, tensors) if into else copy_out(staging, tensors)
    (plan.before if into else plan.after).append(hook)
    plan.lists[name] = (tuple(tensors), hook, not into)


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
    plan.own.add("input")
    return copy
