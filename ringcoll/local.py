"""Local operations of a step, shared by the P2P executor and the simulator."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from . import kernels
from .schedule import Copy, Reduce


def run_local(op_name: Optional[str], buffers: Dict[str, torch.Tensor], local) -> int:
    """Run one step's local operations; returns the bytes reduced."""
    reduced = 0
    for item in local:
        dst = buffers[item.dst.name][item.dst.start:item.dst.stop]
        if isinstance(item, Reduce):
            srcs = [buffers[s.name][s.start:s.stop] for s in item.srcs]
            out = None if item.out is None else buffers[item.out.name][item.out.start:item.out.stop]
            if op_name is None:
                raise RuntimeError("a Reduce step needs a reduction operator, and this collective has none")
            kernels.reduce_into(dst, srcs[0] if len(srcs) == 1 else srcs, op_name, out=out)
            reduced += dst.numel() * dst.element_size() * len(srcs)
        elif isinstance(item, Copy):
            dst.copy_(buffers[item.src.name][item.src.start:item.src.stop])
        else:
            raise TypeError(f"unknown local operation {item!r}")
    return reduced
