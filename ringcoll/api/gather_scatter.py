"""The gather and scatter drop-ins.

As torch: the root is ``dst``/``src`` (a global rank) or ``group_dst``/``group_src`` (a rank of
``group``), never both, global rank 0 when neither is given; the list is given on the root
only (None or empty elsewhere) and holds one tensor per rank of the group.
"""
from __future__ import annotations

__all__ = ["gather", "scatter"]

from ..schedules.vocabulary import ROOT, Layout
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import check_device, flat, group_root, real_tensor
from ._plans import describe, new_plan, pick_per_block
from ._lists import (check_all_same, check_list_fits, check_tensor_list, is_block, separate_input,
                     stage_list, stage_through)


def _optional_list(param: str, tensors) -> tuple:
    """The root's list and the list the collective works on (complex tensors as their real
    view), or [] for None or an empty list (torch's ``if gather_list:``)."""
    if tensors is None or (isinstance(tensors, (list, tuple)) and len(tensors) == 0):
        return [], []
    return tensors, check_tensor_list(param, tensors)


def _check_root_list(param: str, tensors: list, tensor, ctx: Context, root: int, role: str) -> None:
    if ctx.rank == root:
        if not tensors:
            raise ValueError(f"{param} must be given on the {role} rank (group rank {root}), got none")
        check_list_fits(param, tensors, tensor, "tensor", ctx)
    elif tensors:
        raise ValueError(f"{param} must be None on ranks other than the {role} (group rank {root}), "
                         f"got a list of {len(tensors)} on group rank {ctx.rank}")


def _rooted_call(collective: str, ctx: Context, tensor, param: str, tensors, root_args: tuple, role: str,
                 algorithm):
    """The checks gather and scatter share, in order: ``tensor`` and the root's list ``param``
    (same dtype and device), the root (``dst``/``group_dst`` or ``src``/``group_src``, as
    ``root_args`` names them), the algorithm; then, on a member of the group, the list given
    on the root only and fitting ``tensor``, and the device. None outside the group, else
    (real tensor, the list as given, its real tensors, root, algorithm, why)."""
    real = real_tensor("tensor", tensor)
    given, real_list = _optional_list(param, tensors)
    check_all_same(param, given, tensor, "tensor")
    root = group_root(ctx, *root_args, default=0)
    chosen, why = pick_per_block(collective, algorithm, real, ctx)
    if ctx.rank is None:
        return None
    _check_root_list(param, real_list, real, ctx, root, role)
    check_device("tensor", tensor, ctx)
    return real, given, real_list, root, chosen, why


def _rooted_list_plan(collective: str, ctx: Context, tensor, param: str, tensors, root_args: tuple,
                      role: str, algorithm):
    """gather's and scatter's plan: every rank's ``tensor`` is block ``rank`` of the root's list
    ``param`` (gather: the list receives the blocks, the root's own copied in; scatter: it sends
    them), the list staged through one buffer where it is not back to back."""
    checked = _rooted_call(collective, ctx, tensor, param, tensors, root_args, role, algorithm)
    if checked is None:
        return None
    real, given, real_list, root, chosen, why = checked
    gathering = collective == "gather"
    mine, theirs = ("input", "output") if gathering else ("output", "input")
    own, write_back = flat(real)
    buffers = {mine: own}
    staged = False
    if ctx.rank == root:
        buffers[theirs], staged = stage_list(real_list, real, ctx)
    result = (given if ctx.rank == root else []) if gathering else [tensor]
    plan = new_plan(collective, chosen, why, ctx, Layout(ctx.world * own.numel(), {ROOT: root}), buffers,
                    result=result, describe_as=describe(collective, chosen.name, tensor, f"root {root}"))
    if gathering and ctx.rank == root:
        separate_input(own, buffers["output"], is_block(own, buffers["output"], root), plan)
    if staged:
        stage_through(plan, theirs, real_list, into=not gathering)
    if write_back is not None and not gathering:        # gather only reads its tensor
        plan.after.append(write_back)
    return plan


# -- the builders -------------------------------------------------------------------------
@builder("gather")
def build_gather(ctx: Context, tensor, gather_list=None, dst=None, group_dst=None, *, algorithm="auto"):
    return _rooted_list_plan("gather", ctx, tensor, "gather_list", gather_list, ("dst", dst, "group_dst", group_dst),
                             "destination", algorithm)


@builder("scatter")
def build_scatter(ctx: Context, tensor, scatter_list=None, src=None, group_src=None, *, algorithm="auto"):
    return _rooted_list_plan("scatter", ctx, tensor, "scatter_list", scatter_list, ("src", src, "group_src", group_src),
                             "source", algorithm)


@c10d_doc('gather')
def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, *,
           algorithm="auto"):
    """Gathers a list of tensors in a single process.

    On the destination, ``gather_list[r]`` ends as rank r's ``tensor``. This function
    requires all tensors to be the same size on each process.

    Args:
        tensor (Tensor): Input tensor.
        gather_list (list[Tensor], optional): List of appropriately, same-sized tensors to
            use for gathered data (default is None, must be specified on the destination rank
            and only there).
        dst (int, optional): Destination rank on global process group (regardless of
            ``group`` argument). (If both ``dst`` and ``group_dst`` are None, default is
            global rank 0.)
        {group, async_op}
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.
        {algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is ``gather_list`` on
        the destination and ``[]`` elsewhere (as gloo's). None, if not async_op or if not
        part of the group.

    Examples:
        >>> # We have 2 process groups, 2 ranks.
        >>> tensor = torch.ones(2) + rank
        >>> gather_list = [torch.zeros(2) for _ in range(2)] if rank == 0 else None
        >>> ringcoll.gather(tensor, gather_list, dst=0, algorithm="binomial")
        >>> # Rank 0 gets gathered data.
        >>> gather_list
        [tensor([1., 1.]), tensor([2., 2.])] # Rank 0
        None                                 # Rank 1
    """
    return run_call(build_gather, group, async_op, tensor, gather_list, dst, group_dst, algorithm=algorithm)


@c10d_doc('scatter')
def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, *,
            algorithm="auto"):
    """Scatters a list of tensors to all processes in a group.

    Each process will receive exactly one tensor and store its data in the ``tensor``
    argument: rank r gets ``scatter_list[r]`` of the source.

    Args:
        tensor (Tensor): Output tensor.
        scatter_list (list[Tensor]): List of tensors to scatter (default is None, must be
            specified on the source rank and only there), one per rank, each the size of
            ``tensor``.
        src (int): Source rank on global process group (regardless of ``group`` argument).
            (If both ``src`` and ``group_src`` are None, default is global rank 0.)
        {group, async_op}
        group_src (int, optional): Source rank on ``group``. Invalid to specify both ``src``
            and ``group_src``.
        {algorithm}

    Returns:
        Async work handle, if async_op is set to True; its ``result()`` is ``[tensor]``. None,
        if not async_op or if not part of the group.

    Examples:
        >>> # We have 2 process groups, 2 ranks.
        >>> output_tensor = torch.zeros(2)
        >>> scatter_list = [torch.ones(2), torch.ones(2) * 5] if rank == 0 else None
        >>> ringcoll.scatter(output_tensor, scatter_list, src=0, algorithm="binomial")
        >>> # Rank i gets scatter_list[i].
        >>> output_tensor
        tensor([1., 1.]) # Rank 0
        tensor([5., 5.]) # Rank 1
    """
    return run_call(build_scatter, group, async_op, tensor, scatter_list, src, group_src, algorithm=algorithm)
