"""Local operations of a step, shared by the P2P executor and the simulator."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .. import kernels
from ..schedules.vocabulary import Copy, Reduce


def resolve_local(buffers: Dict[str, torch.Tensor], local) -> Tuple[tuple, ...]:
    """A step's local operations on the views of ``buffers`` they name: (dst, src, None,
    bytes) for a copy, (dst, sources, out, bytes reduced) for a reduction (sources a tensor,
    or a list of several). A prepared plan resolves them once (its buffers stay put)."""
    resolved = []
    for item in local:
        dst = buffers[item.dst.name][item.dst.start:item.dst.stop]
        if isinstance(item, Reduce):
            srcs = [buffers[s.name][s.start:s.stop] for s in item.srcs]
            out = None if item.out is None else buffers[item.out.name][item.out.start:item.out.stop]
            resolved.append((dst, srcs[0] if len(srcs) == 1 else srcs, out,
                             dst.numel() * dst.element_size() * len(srcs)))
        elif isinstance(item, Copy):
            resolved.append((dst, buffers[item.src.name][item.src.start:item.src.stop], None, None))
        else:
            raise TypeError(f"unknown local operation {item!r}")
    return tuple(resolved)


def run_resolved(op_name: Optional[str], resolved) -> int:
    """Run operations :func:`resolve_local` resolved; returns the bytes reduced."""
    reduced = 0
    for dst, src, out, nbytes in resolved:
        if nbytes is None:
            dst.copy_(src)
            continue
        if op_name is None:
            raise RuntimeError("a Reduce step needs a reduction operator, and this collective has none")
        kernels.reduce_into(dst, src, op_name, out=out)
        reduced += nbytes
    return reduced


def run_local(op_name: Optional[str], buffers: Dict[str, torch.Tensor], local) -> int:
    """Run one step's local operations; returns the bytes reduced."""
    return run_resolved(op_name, resolve_local(buffers, local))
