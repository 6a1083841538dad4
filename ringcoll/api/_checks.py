"""The drop-ins' argument checks: each names the parameter, what was expected and what was
given, before anything is touched (TypeError/ValueError as torch's)."""
from __future__ import annotations

import numbers
from typing import Callable, Optional, Tuple

import torch

from ..ops import SUPPORTED_DTYPES, op_type

from .common import Context


def check_tensor(param: str, tensor, *, like: Optional[torch.Tensor] = None) -> None:
    """TypeError/ValueError naming ``param`` unless ``tensor`` is a dense tensor of a supported
    dtype (and, with ``like``, of the same dtype and device)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{param} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(f"{param} must be a dense (strided) tensor, got layout {tensor.layout}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{param} must have one of the dtypes "
                        f"{[str(d).replace('torch.', '') for d in SUPPORTED_DTYPES]}, got {tensor.dtype}")
    if like is not None:
        if tensor.dtype != like.dtype:
            raise TypeError(f"{param} must have dtype {like.dtype} like the other tensors, got {tensor.dtype}")
        if tensor.device != like.device:
            raise ValueError(f"{param} must be on device {like.device} like the other tensors, got {tensor.device}")


#: the ops torch refuses on complex tensors (distributed_c10d.supports_complex's deny list):
#: applied to the real view they would mix real and imaginary parts
_COMPLEX_REFUSED = ("MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR")


def as_real(tensor, op=None, collective: str = ""):
    """A complex tensor as the real tensor the collective moves and reduces (its
    ``torch.view_as_real``: a trailing dim of 2, the same memory), as torch does; anything
    else unchanged. With ``op``: ValueError, as torch's, for the ops torch refuses on complex
    tensors."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_complex():
        return tensor
    if op is not None:
        kind = op_type(op)                  # TypeError naming op for what is not a ReduceOp
        if kind.name in _COMPLEX_REFUSED:
            raise ValueError(f"{collective} does not support op=ReduceOp.{kind.name} on complex tensors "
                             f"(as torch: only SUM, AVG and PREMUL_SUM are defined there), got dtype "
                             f"{tensor.dtype}")
    return torch.view_as_real(tensor)


def real_tensor(param: str, tensor, op=None, collective: str = "") -> torch.Tensor:
    """:func:`check_tensor` of what the collective works on: ``tensor``, or its real view
    when it is complex (:func:`as_real`, which also checks ``op``)."""
    real = as_real(tensor, op, collective)
    check_tensor(param, real)
    return real


def check_device(param: str, tensor: torch.Tensor, ctx: Context) -> None:
    """ValueError unless the group has a backend for ``tensor``'s device type."""
    if ctx.executor is not None and tensor.device.type not in ctx.executor.device_backends:
        if ctx.executor.backend == "nccl":
            raise ValueError(f"{param} must be a CUDA tensor on an NCCL group, got device {tensor.device}")
        raise ValueError(f"{param} must be on a device the group's backends serve "
                         f"({ctx.executor.device_backends}), got device {tensor.device}")


def flat(tensor: torch.Tensor) -> Tuple[torch.Tensor, Optional[Callable[[], None]]]:
    """A flat contiguous view of ``tensor`` and, when it is not contiguous (ringcoll works on a
    contiguous copy), the step that writes the result back."""
    if tensor.is_contiguous():
        return tensor.view(-1), None
    work = tensor.contiguous().view(-1)
    # an expanded tensor (a stride 0 along a dimension of size > 1) names each of its memory
    # locations several times: the result is written back through one index of each such
    # dimension (every index of it holds the same value, as gloo's result), never through
    # the overlapping view, which torch refuses to write
    index = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                  for size, stride in zip(tensor.shape, tensor.stride()))
    target = tensor[index] if any(part != slice(None) for part in index) else tensor
    return work, lambda: target.copy_(work.view(tensor.shape)[index])


def group_root(ctx: Context, name: str, global_root, group_name: str, group_root,
               default: Optional[int] = None) -> Optional[int]:
    """The root's rank in the group, from exactly one of a global rank (``name``, as torch's
    ``src``/``dst``) and a group rank (``group_name``, as torch's ``group_src``/``group_dst``).
    TypeError/ValueError naming the parameter unless it is an int that names a member of the
    group. With neither given, the global rank ``default`` (gather and scatter: 0, as torch),
    else an error. Outside the group (``ctx.rank`` None) only the type is checked, and None
    returned. Shared by every rooted collective."""
    if global_root is not None and group_root is not None:
        raise ValueError(f"give exactly one of {name} and {group_name}, got {name}={global_root!r} "
                         f"and {group_name}={group_root!r}")
    if global_root is None and group_root is None and default is not None:
        global_root = default
    if global_root is None and group_root is None:
        raise ValueError(f"{name} (a global rank) or {group_name} (a rank in the group) must be given")
    param, value = (name, global_root) if global_root is not None else (group_name, group_root)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{param} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if ctx.world is None:
        if value < 0:
            raise ValueError(f"{param} must be a non-negative rank, got {value}")
        return None
    if param == group_name:
        if not 0 <= value < ctx.world:
            raise ValueError(f"{group_name} must be a rank of the group, in [0, {ctx.world}), got {value}")
        return value
    members = ctx.executor.global_ranks if ctx.executor is not None else list(range(ctx.world))
    if value not in members:
        if members == list(range(len(members))):
            raise ValueError(f"{name} must be a rank in [0, {len(members)}), got {value}")
        raise ValueError(f"{name} must be the global rank of a member of the group, one of "
                         f"{members}, got {value}")
    return members.index(value)
