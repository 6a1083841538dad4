"""ReduceOp handling: which ops a dtype allows, and what each means locally.

Every collective ReduceOp reduces to one *local* operator that the kernels apply pairwise
(``ringcoll.kernels.LOCAL_OPS``) plus at most one pre-step and one post-step, each done once
per rank on identical bits, so replicated results stay bitwise identical:

- AVG = SUM, then one division by the world size at the end;
- PREMUL_SUM(factor) = multiply the input by ``factor`` once, then SUM.

The dtype rules are torch's (gloo's on CPU, NCCL's on CUDA): bitwise ops need an integral or
bool tensor; AVG and PREMUL_SUM need a floating-point tensor (NCCL also averages integers on
CUDA, by truncating division).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp
RedOpType = ReduceOp.RedOpType

_LOCAL = {
    RedOpType.SUM: "sum",
    RedOpType.AVG: "sum",
    RedOpType.PREMUL_SUM: "sum",
    RedOpType.PRODUCT: "product",
    RedOpType.MIN: "min",
    RedOpType.MAX: "max",
    RedOpType.BAND: "band",
    RedOpType.BOR: "bor",
    RedOpType.BXOR: "bxor",
}

SUPPORTED_DTYPES = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
)


@dataclass(frozen=True)
class ReduceSpec:
    """What a ReduceOp means for one call: the local operator and its pre/post steps."""

    name: str                       # "SUM", "PREMUL_SUM" ... as torch prints it
    local: str                      # kernels' local operator
    premul: Optional[float] = None  # PREMUL_SUM's factor
    average: bool = False           # AVG: divide by the world size at the end


def op_type(op) -> RedOpType:
    """The RedOpType of ``op`` (a ReduceOp, a RedOpType or a premul-sum ReduceOp)."""
    kind = getattr(op, "op", op)
    if isinstance(kind, RedOpType):
        return kind
    if isinstance(op, RedOpType):
        return op
    raise TypeError(f"op must be a torch.distributed.ReduceOp, got {type(op).__name__} {op!r}")


def premul_factor(op):
    """PREMUL_SUM's factor as ``op`` carries it (a number or a 0-d tensor); None for any other
    op, a bare RedOpType, or a PREMUL_SUM op without one.

    The one place ringcoll reads the factor, because torch versions disagree on where it is:
    torch 2.13 has ``op.factor`` (RuntimeError on every op but PREMUL_SUM); torch 2.11's
    ReduceOp has no ``factor`` attribute, and the factor is only in its pickled state,
    ``op.__getstate__() == (RedOpType.PREMUL_SUM, factor)`` (in both versions, also after a
    round trip through AllreduceOptions/ReduceScatterOptions).
    """
    if isinstance(op, RedOpType) or getattr(op, "op", None) != RedOpType.PREMUL_SUM:
        return None
    try:
        return op.factor
    except AttributeError:
        pass
    state = op.__getstate__()
    if not (isinstance(state, tuple) and len(state) == 2 and state[0] == RedOpType.PREMUL_SUM):
        raise TypeError(f"cannot read PREMUL_SUM's factor from {type(op).__name__} {op!r}: no "
                        f"'factor' attribute, and __getstate__() gave {state!r}, not "
                        f"(RedOpType.PREMUL_SUM, factor)")
    return state[1]


_resolved: dict = {}


def resolve(op, tensor: torch.Tensor, param: str = "op") -> ReduceSpec:
    """Check that ``op`` is allowed for ``tensor`` and say what it means; TypeError or
    ValueError naming ``param``, the expected and the given value otherwise."""
    kind = op_type(op)
    factor = premul_factor(op)
    if isinstance(factor, torch.Tensor):    # its value is not a key: read it every call
        return _resolve(op, kind, tensor, param)
    key = (int(kind), tensor.dtype, tensor.is_cuda, param, factor)
    spec = _resolved.get(key)
    if spec is None:
        spec = _resolve(op, kind, tensor, param)
        if len(_resolved) < 4096:
            _resolved[key] = spec
    return spec


def _resolve(op, kind: RedOpType, tensor: torch.Tensor, param: str) -> ReduceSpec:
    name = kind.name
    if kind not in _LOCAL:
        raise ValueError(f"{param} must be one of {sorted(k.name for k in _LOCAL)}, got {name}")
    dtype = tensor.dtype
    floating = dtype.is_floating_point
    if kind in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR) and floating:
        raise ValueError(f"{param}=ReduceOp.{name} needs an integral or bool tensor, got dtype {dtype}")
    premul = None
    if kind == RedOpType.PREMUL_SUM:
        if not floating:
            raise ValueError(f"{param}=ReduceOp.PREMUL_SUM needs a floating-point tensor, got dtype {dtype}")
        factor = premul_factor(op)
        if factor is None:
            raise ValueError(f"{param}=ReduceOp.PREMUL_SUM needs a factor: build it with "
                             f"torch.distributed._make_nccl_premul_sum(factor)")
        premul = float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    if kind == RedOpType.AVG and not floating and not tensor.is_cuda:
        raise ValueError(f"{param}=ReduceOp.AVG needs a floating-point tensor on CPU (as torch's gloo), "
                         f"got dtype {dtype}")
    if kind == RedOpType.AVG and dtype == torch.bool:
        raise ValueError(f"{param}=ReduceOp.AVG is undefined for dtype torch.bool")
    return ReduceSpec(name, _LOCAL[kind], premul, kind == RedOpType.AVG)
