"""The all_to_all and all_to_all_single drop-ins.

Both hand the schedule this rank's blocks as chunks of the caller's own buffers (no packing
copy): ``all_to_all_single`` cuts one flat ``input``/``output`` pair along dim 0 by the split
sizes, ``all_to_all`` names each list entry (``input.3`` is the tensor for rank 3). Inputs
are only read: an input that shares memory with an output is copied first, so the in-place
call ``all_to_all_single(x, x)`` is correct (torch's gloo returns wrong data for it).
"""
from __future__ import annotations

__all__ = ["all_to_all", "all_to_all_single"]

import bisect
import math
import numbers
from typing import Callable, List, Optional, Sequence

import torch

from ..schedules.vocabulary import RECV_BLOCKS, SEND_BLOCKS, Buf, Layout
from ..schedules import registry
from ..selection import choose
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._checks import check_device, flat, real_tensor
from ._plans import new_plan, pick, table_device



# -- argument checks ----------------------------------------------------------------------
def _check(param: str, tensor, like: Optional[torch.Tensor]) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{param} must be a torch.Tensor, got {type(tensor).__name__}")
    if like is not None:
        if tensor.dtype != like.dtype:
            raise TypeError(f"{param} must have dtype {like.dtype} like the other tensors, got {tensor.dtype}")
        if tensor.device != like.device:
            raise ValueError(f"{param} must be on device {like.device} like the other tensors, got {tensor.device}")
    return real_tensor(param, tensor)


def _check_list(param: str, tensors, like: Optional[torch.Tensor]) -> List[torch.Tensor]:
    if not isinstance(tensors, list):
        raise TypeError(f"{param} must be a list of torch.Tensor, got {type(tensors).__name__}")
    checked = []
    for i, tensor in enumerate(tensors):
        checked.append(_check(f"{param}[{i}]", tensor, like))
        like = tensor if like is None else like
    return checked


def _check_splits(param: str, splits) -> Optional[List[int]]:
    """None (or empty, as torch) for equal splits, else a list of non-negative ints."""
    if splits is None:
        return None
    if not isinstance(splits, (list, tuple, torch.Size)):
        raise TypeError(f"{param} must be a list of ints or None, got {type(splits).__name__}")
    for i, size in enumerate(splits):
        if not isinstance(size, numbers.Integral) or isinstance(size, bool):
            raise TypeError(f"{param}[{i}] must be an int, got {type(size).__name__} {size!r}")
        if size < 0:
            raise ValueError(f"{param}[{i}] must be >= 0, got {size}")
    return [int(size) for size in splits] or None


def _split_sizes(param: str, splits: Optional[List[int]], tensor_param: str, tensor: torch.Tensor,
                 world: int) -> List[int]:
    """The dim-0 split sizes of ``tensor`` for a world of ``world``, checked against its size."""
    if tensor.dim() == 0:
        raise ValueError(f"{tensor_param} must have at least one dimension to split along dim 0, got a scalar")
    rows = tensor.size(0)
    if splits is None:
        if rows % world:
            raise ValueError(f"{tensor_param}.size(0) must be divisible by the world size {world} when "
                             f"{param} is None, got {rows}")
        return [rows // world] * world
    if len(splits) != world:
        raise ValueError(f"{param} must hold one size per rank ({world}), got {len(splits)}: {splits}")
    if sum(splits) != rows:
        raise ValueError(f"{param} must sum to {tensor_param}.size(0) = {rows}, got sum {sum(splits)} of {splits}")
    return splits


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of memory ``tensor`` may touch, as [start, stop) addresses (strides >= 0)."""
    extent = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr(), tensor.data_ptr() + (extent + 1) * tensor.element_size()


def _unalias(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """``inputs``, each one that shares memory with an output replaced by a copy: the
    schedules write outputs while inputs are still to be sent."""
    spans = sorted(_span(t) for t in outputs if t.numel() > 0)
    merged: List[List[int]] = []
    for start, stop in spans:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    starts = [start for start, _ in merged]
    result = []
    for tensor in inputs:
        if tensor.numel() > 0 and merged:
            start, stop = _span(tensor)
            at = bisect.bisect_left(starts, stop) - 1
            if at >= 0 and merged[at][1] > start:
                tensor = tensor.clone(memory_format=torch.contiguous_format)
        result.append(tensor)
    return result


# -- choosing -----------------------------------------------------------------------------
def _choose(ctx: Context, algorithm: str, send_counts: List[int], recv_counts: List[int],
            element_size: int, declared_equal: bool,
            device: Optional[str] = None) -> tuple[registry.Algorithm, str]:
    """The table's choice, by the bytes of the largest block.

    Every rank of a call must run bruck or none must, and a rank sees only its own blocks:
    one whose blocks happen to be equal may sit in a call whose other ranks' blocks are not.
    So ``auto`` (and ``RINGCOLL_ALGO``) may pick bruck only when the call itself declares
    equal blocks, that is ``all_to_all_single`` with both split sizes None, which SPMD code
    passes on every rank alike; elsewhere the next matching rule that is not bruck applies.
    Pairwise and linear interoperate, so ranks may pick between them from their own largest
    block."""
    equal = len(set(send_counts) | set(recv_counts)) <= 1
    if algorithm == "bruck" and not equal:
        raise ValueError(f"algorithm='bruck' needs equal blocks on every rank (bruck forwards blocks "
                         f"through other ranks); got send blocks {send_counts} and receive blocks "
                         f"{recv_counts} elements: use 'pairwise' or 'linear'")
    block_bytes = max([*send_counts, *recv_counts], default=0) * element_size
    exclude = () if declared_equal and equal else ("bruck",)
    name, why = choose("all_to_all", algorithm, block_bytes, ctx.world, exclude, machine=ctx.machine,
                       device=device)
    return registry.get("all_to_all", name), why


def _blocks(name: str, counts: List[int]) -> tuple:
    bufs, offset = [], 0
    for count in counts:
        bufs.append(Buf(name, offset, offset + count))
        offset += count
    return tuple(bufs)


def _plan(collective: str, ctx: Context, algorithm: str, inputs: dict, outputs: dict,
          send_blocks: tuple, recv_blocks: tuple, write_backs: List[Callable[[], None]], result,
          dtype: torch.dtype, declared_equal: bool):
    send_counts, recv_counts = [b.numel for b in send_blocks], [b.numel for b in recv_blocks]
    device = table_device(ctx, next(iter({**inputs, **outputs}.values()), None))
    chosen, why = _choose(ctx, algorithm, send_counts, recv_counts,
                          torch.empty((), dtype=dtype).element_size(), declared_equal, device)
    layout = Layout(sum(send_counts), {SEND_BLOCKS: send_blocks, RECV_BLOCKS: recv_blocks})
    label = (f"{collective}/{chosen.name} {sum(send_counts)}x{str(dtype).replace('torch.', '')} "
             f"sent, {sum(recv_counts)} received")
    plan = new_plan("all_to_all", chosen, why, ctx, layout, {**inputs, **outputs}, result=result,
                    describe_as=label)
    plan.after.extend(write_backs)
    return plan


# -- all_to_all_single --------------------------------------------------------------------
@builder("all_to_all_single")
def build_all_to_all_single(ctx: Context, output, input, output_split_sizes=None, input_split_sizes=None,
                            *, algorithm="auto"):
    out = _check("output", output, None)
    inp = _check("input", input, output)
    output_splits = _check_splits("output_split_sizes", output_split_sizes)
    input_splits = _check_splits("input_split_sizes", input_split_sizes)
    if ctx.rank is None:
        pick("all_to_all", algorithm, 0, ctx)
        return None
    world = ctx.world
    declared_equal = input_splits is None and output_splits is None
    input_splits = _split_sizes("input_split_sizes", input_splits, "input", inp, world)
    output_splits = _split_sizes("output_split_sizes", output_splits, "output", out, world)
    check_device("output", out, ctx)
    check_device("input", inp, ctx)
    (inp,) = _unalias([inp], [out])
    in_row, out_row = math.prod(inp.shape[1:]), math.prod(out.shape[1:])    # elements per split unit
    send_data, _ = flat(inp)
    recv_data, write_back = flat(out)
    send_blocks = _blocks("input", [split * in_row for split in input_splits])
    recv_blocks = _blocks("output", [split * out_row for split in output_splits])
    return _plan("all_to_all_single", ctx, algorithm, {"input": send_data}, {"output": recv_data},
                 send_blocks, recv_blocks, [write_back] if write_back else [], [output], inp.dtype,
                 declared_equal)


@c10d_doc('all_to_all')
def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False, *, algorithm="auto"):
    """Split input tensor and then scatter the split list to all processes in a group.

    Later the received tensors are concatenated from all the processes in the group and
    returned as a single output tensor. After the call, split j of ``output`` on rank i holds
    split i of ``input`` on rank j. Splits are along dim 0, so a split of size s holds
    s × prod(shape[1:]) elements. ``input`` is never modified; ``output`` may be ``input``
    itself (the input is then copied first). Complex tensors travel as their real view.

    The receiving side's ``output_split_sizes[j]`` must equal rank j's ``input_split_sizes[i]``
    (counted in elements); a mismatch is the caller's error, which no rank can see alone: the
    simulator reports it as a size mismatch (or as a deadlock when one side's split is 0). On a
    gloo group, as with torch's own gloo all_to_all_single, a split received longer than it
    was sent completes with its tail unwritten, and one received shorter aborts the receiving
    process (gloo: "Received data size doesn't match expected size").

    Args:
        output (Tensor): Gathered concatenated output tensor.
        input (Tensor): Input tensor to scatter.
        output_split_sizes (list[Int], optional): Output split sizes for dim 0. If None or
            empty, dim 0 of ``output`` must divide equally by ``world_size``.
        input_split_sizes (list[Int], optional): Input split sizes for dim 0. If None or
            empty, dim 0 of ``input`` must divide equally by ``world_size``.
        {group, async_op, algorithm}

    {returns}

    Examples:
        >>> # We have 2 ranks; uneven splits.
        >>> input = torch.arange(3) + 10 * rank
        >>> input
        tensor([0, 1, 2])     # Rank 0
        tensor([10, 11, 12])  # Rank 1
        >>> input_splits = [1, 2] if rank == 0 else [2, 1]
        >>> output_splits = [1, 2] if rank == 0 else [2, 1]
        >>> output = torch.empty(3, dtype=torch.int64)
        >>> ringcoll.all_to_all_single(output, input, output_splits, input_splits, algorithm="pairwise")
        >>> output
        tensor([0, 10, 11])   # Rank 0
        tensor([1, 2, 12])    # Rank 1
    """
    return run_call(build_all_to_all_single, group, async_op, output, input, output_split_sizes, input_split_sizes, algorithm=algorithm)


# -- all_to_all (lists) -------------------------------------------------------------------
@builder("all_to_all")
def build_all_to_all(ctx: Context, output_tensor_list, input_tensor_list, *, algorithm="auto"):
    outs = _check_list("output_tensor_list", output_tensor_list, None)
    first = output_tensor_list[0] if outs else None
    ins = _check_list("input_tensor_list", input_tensor_list, first)
    if ctx.rank is None:
        pick("all_to_all", algorithm, 0, ctx)
        return None
    world = ctx.world
    for param, tensors in (("output_tensor_list", outs), ("input_tensor_list", ins)):
        if len(tensors) != world:
            raise ValueError(f"{param} must hold one tensor per rank (world size {world}), got {len(tensors)}")
    for i, tensor in enumerate(outs):
        check_device(f"output_tensor_list[{i}]", tensor, ctx)
    for i, tensor in enumerate(ins):
        check_device(f"input_tensor_list[{i}]", tensor, ctx)
    ins = _unalias(ins, outs)
    inputs, outputs, write_backs = {}, {}, []
    for i, tensor in enumerate(ins):
        inputs[f"input.{i}"], _ = flat(tensor)
    for i, tensor in enumerate(outs):
        outputs[f"output.{i}"], write_back = flat(tensor)
        if write_back is not None:
            write_backs.append(write_back)
    send_blocks = tuple(Buf(f"input.{i}", 0, t.numel()) for i, t in enumerate(ins))
    recv_blocks = tuple(Buf(f"output.{i}", 0, t.numel()) for i, t in enumerate(outs))
    return _plan("all_to_all", ctx, algorithm, inputs, outputs, send_blocks, recv_blocks, write_backs,
                 output_tensor_list, ins[0].dtype, declared_equal=False)


@c10d_doc('all_to_all')
def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, *, algorithm="auto"):
    """Scatters list of input tensors to all processes in a group and return gathered list of
    tensors in output list.

    After the call, ``output_tensor_list[j]`` on rank i holds ``input_tensor_list[i]`` of
    rank j. Entries may differ in size (rank i's ``output_tensor_list[j]`` must have as many
    elements as rank j's ``input_tensor_list[i]``; torch's gloo wants them all of one size),
    be non-contiguous, or share memory with each other; inputs are never modified (an input
    that shares memory with an output is copied first). Complex tensors travel as their real
    view. Mismatched sizes behave as in :func:`all_to_all_single`.

    Args:
        output_tensor_list (list[Tensor]): List of tensors to be gathered one per rank.
        input_tensor_list (list[Tensor]): List of tensors to scatter one per rank.
        {group, async_op, algorithm}

    {returns}

    Examples:
        >>> # We have 2 ranks.
        >>> input = [torch.tensor([10 * rank]), torch.tensor([10 * rank + 1])]
        >>> input
        [tensor([0]), tensor([1])]     # Rank 0
        [tensor([10]), tensor([11])]   # Rank 1
        >>> output = [torch.empty(1, dtype=torch.int64) for _ in range(2)]
        >>> ringcoll.all_to_all(output, input, algorithm="bruck")
        >>> output
        [tensor([0]), tensor([10])]    # Rank 0
        [tensor([1]), tensor([11])]    # Rank 1
    """
    return run_call(build_all_to_all, group, async_op, output_tensor_list, input_tensor_list, algorithm=algorithm)
