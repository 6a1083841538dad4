"""Lists read or written in place: :class:`Blocks` (a list of tensors seen as one flat buffer
where every chunk a schedule names lies within one of them), and the overlap tests the
executor's window of steps in flight uses."""
from __future__ import annotations

from typing import Optional

import torch

from ..schedules.vocabulary import Recv, Reduce, Send

class Blocks:
    """A list argument's equal-sized tensors as the one flat buffer a schedule names: chunk
    [start, stop) is a view of the tensor it lies in. The P2P executor uses it instead of the
    plan's staging copy (Plan.lists) when every chunk the schedule names lies within one
    tensor (linear scatter and gather, ring all_gather, ring, pairwise, direct and pat
    reduce_scatter: one block per message), so the list is sent from and received into
    directly, as gloo's own collectives do."""

    __slots__ = ("flats", "size")

    def __init__(self, flats, size: int):
        self.flats, self.size = flats, size

    def __getitem__(self, span: slice) -> torch.Tensor:
        if span.stop <= span.start:
            return self.flats[0][:0]
        index = span.start // self.size
        base = index * self.size
        return self.flats[index][span.start - base:span.stop - base]

    @classmethod
    def of(cls, name: str, tensors, writes: bool, steps, buffers) -> Optional["Blocks"]:
        """The blocks of ``tensors`` for the staging buffer ``name``, or None (stage) unless:
        each is contiguous with the staging buffer's share of elements; none overlaps another
        or any other buffer of the plan (the executor orders steps by buffer names, and the
        staging copy is what kept aliases apart); every chunk of ``name`` the steps name lies
        within one block; and, for a list the caller gave as input (``not writes``), no step
        writes it."""
        staging = buffers[name]
        size = staging.numel() // len(tensors) if tensors else 0
        if size == 0 or any(not t.is_contiguous() or t.numel() != size or t.device != staging.device
                            for t in tensors):
            return None
        flats = tuple(t.detach().view(-1) for t in tensors)
        nbytes = size * staging.element_size()
        spans = sorted((flat.data_ptr(), flat.data_ptr() + nbytes) for flat in flats)
        if any(later[0] < first[1] for first, later in zip(spans, spans[1:])):
            return None
        others = [tensor for other, buffer in buffers.items() if other != name for tensor in tensors_of(buffer)]
        for tensor in others:
            if tensor.numel() == 0 or tensor.device != staging.device:
                continue
            start = tensor.data_ptr()
            stop = start + tensor.numel() * tensor.element_size()
            if any(low < stop and start < high for low, high in spans):
                return None
        for st in steps:
            sends, recvs, reads, written = _touches(st)
            for buf in (*sends, *recvs, *reads, *written):
                if buf.name == name and buf.stop > buf.start and buf.start // size != (buf.stop - 1) // size:
                    return None
            if not writes and any(buf.name == name for buf in (*recvs, *written)):
                return None
        return cls(flats, size)


def tensors_in(buffers) -> list:
    """Every tensor a prepared plan's buffers are made of."""
    return [tensor for buffer in buffers.values() for tensor in tensors_of(buffer)]


def tensors_of(buffer) -> tuple:
    """The tensors a prepared plan's buffer is made of: a Blocks' flats, else itself."""
    return buffer.flats if isinstance(buffer, Blocks) else (buffer,)


def _overlap(a, b) -> bool:
    return a.name == b.name and a.start < b.stop and b.start < a.stop


def _touches(step) -> tuple:
    """What a step's transfers read and write, and what its local operations read and write."""
    sends = [c.buf for c in step.comms if isinstance(c, Send)]
    recvs = [c.buf for c in step.comms if isinstance(c, Recv)]
    local_reads, local_writes = [], []
    for op in step.local:
        if isinstance(op, Reduce):
            local_reads += [op.dst, *op.srcs]
            local_writes += [op.dst] + ([op.out] if op.out is not None else [])
        else:
            local_reads.append(op.src)
            local_writes.append(op.dst)
    return sends, recvs, local_reads, local_writes


def independent(steps, later: int, first: int) -> bool:
    """Whether step ``later``'s transfers may start while steps ``first .. later-1`` are still
    transferring or have local work to do: no overlap of what one writes with what the
    other reads or writes."""
    sends, recvs, _, _ = _touches(steps[later])
    for index in range(first, later):
        e_sends, e_recvs, e_reads, e_writes = _touches(steps[index])
        for buf in sends:
            if any(_overlap(buf, other) for other in e_recvs + e_writes):
                return False
        for buf in recvs:
            if any(_overlap(buf, other) for other in e_sends + e_recvs + e_reads + e_writes):
                return False
    return True


def posts_early(steps, later: int, first: int, window: int) -> bool:
    """The window's rule: whether step ``later`` is posted while steps ``first .. later-1``
    are in flight (posted, not finished), with up to ``window`` steps in flight: fewer are,
    and it is :func:`independent` of them. The executor (Prepared.reach) and the
    simulator's clock (ringcoll.sim.clock.Clock.ahead) both post by it."""
    return later - first < window and independent(steps, later, first)
