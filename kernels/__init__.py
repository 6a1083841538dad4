"""Local reductions: the one dispatch every reduce step of every algorithm goes through.

Words: ``op`` is a *local* operator name, one of ``LOCAL_OPS``; the collective-level
ReduceOps map onto them in ``ringcoll.ops`` (AVG = SUM then ``divide_``; PREMUL_SUM =
``scale_`` then SUM).
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

LOCAL_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor")

_TORCH_INPLACE = {
    "sum": lambda dst, src: dst.add_(src) if dst.dtype != torch.bool else dst.logical_or_(src),
    "product": lambda dst, src: dst.mul_(src) if dst.dtype != torch.bool else dst.logical_and_(src),
    "min": lambda dst, src: torch.minimum(dst, src, out=dst),
    "max": lambda dst, src: torch.maximum(dst, src, out=dst),
    "band": lambda dst, src: dst.bitwise_and_(src),
    "bor": lambda dst, src: dst.bitwise_or_(src),
    "bxor": lambda dst, src: dst.bitwise_xor_(src),
}


def reduce_into(dst: torch.Tensor, src: Union[torch.Tensor, Sequence[torch.Tensor]], op: str,
                *, out: torch.Tensor | None = None) -> None:
    """dst = dst (op) src[0] (op) src[1] ... in that order; with ``out``, the result is also
    written into ``out`` (the fused reduce-and-copy of a ring step)."""
    apply = _TORCH_INPLACE[op]
    for one in ([src] if isinstance(src, torch.Tensor) else src):
        apply(dst, one)
    if out is not None:
        out.copy_(dst)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """tensor *= factor (PREMUL_SUM's pre-multiplication, done once per rank)."""
    tensor.mul_(factor)


def divide_(tensor: torch.Tensor, divisor: int) -> None:
    """tensor /= divisor (AVG's final division, done once, identically on every rank)."""
    if tensor.is_floating_point():
        tensor.div_(divisor)
    else:
        tensor.div_(divisor, rounding_mode="trunc")
