"""Point-to-point: torch.distributed's own, plus ``sendrecv``.

``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv`` and ``P2POp`` are
torch.distributed's functions and class themselves, re-exported unchanged (same objects, same
contract, same tag-0 matching), so a program can take all its communication from ringcoll.
Remember that under gloo a send completes only once its receive is posted: a ring of
blocking ``send`` then ``recv`` deadlocks at every size. ``sendrecv`` posts the two halves
of an exchange together and cannot deadlock that way.

ringcoll's collectives use their own tag, so their messages never match these.
"""
from __future__ import annotations

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send", "sendrecv"]

import numbers
import threading
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch.distributed import P2POp, batch_isend_irecv, irecv, isend, recv, send

from ..runtime.work import Work
from ._docs import c10d_doc
from .common import check_async


class _SendRecvWork(Work):
    """A sendrecv in flight: ``wait()`` waits on both halves, then writes a received
    non-contiguous tensor back; it re-raises either half's error."""

    def __init__(self, works: List[dist.Work], finish: Optional[Callable[[], None]], result):
        super().__init__(result)
        self._works, self._finish_fn, self._lock = works, finish, threading.Lock()

    def wait(self, timeout=None) -> bool:
        with self._lock:
            if not self._future.done():
                try:
                    for work in self._works:
                        work.wait() if timeout is None else work.wait(timeout)
                    if self._finish_fn is not None:
                        self._finish_fn()
                except BaseException as error:  # noqa: BLE001 - kept for every waiter
                    self._finish(error)
                else:
                    self._finish()
        return super().wait()

    def is_completed(self) -> bool:
        if not self._future.done() and all(work.is_completed() for work in self._works):
            try:
                self.wait()
            except BaseException:  # noqa: BLE001 - completed, with an error wait() re-raises
                pass
        return self._future.done()


def _check_tensor(param: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{param} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(f"{param} must be a dense (strided) tensor, got layout {tensor.layout}")


def _check_rank(param: str, rank, ranks: List[int]) -> None:
    if not isinstance(rank, numbers.Integral) or isinstance(rank, bool):
        raise TypeError(f"{param} must be an int (a global rank), got {type(rank).__name__} {rank!r}")
    if rank not in ranks:
        raise ValueError(f"{param} must be a global rank of the group {ranks}, got {rank}")


@c10d_doc()
def sendrecv(send_tensor, dst, recv_tensor, src, group=None, async_op=False):
    """Sends ``send_tensor`` to ``dst`` and receives ``recv_tensor`` from ``src`` at once.

    Both halves are posted together (as one ``batch_isend_irecv``), so a ring of
    ``sendrecv(x, right, y, left)`` on every rank cannot deadlock, unlike blocking ``send``
    then ``recv`` under gloo. The messages are ordinary tag-0 point-to-point messages: the
    peers may post theirs with ``send``/``recv``/``isend``/``irecv`` instead. With ``dst`` and
    ``src`` both this rank, ``recv_tensor`` gets a copy of ``send_tensor`` (torch's
    ``send`` refuses this rank). Non-contiguous tensors go through a contiguous copy.

    Args:
        send_tensor (Tensor): Tensor to send.
        dst (int): Destination rank on global process group (regardless of ``group``).
        recv_tensor (Tensor): Tensor to fill with received data; it must have as many
            elements and the same dtype as what ``src`` sends.
        src (int): Source rank on global process group (regardless of ``group``).
        {group, async_op}

    Returns:
        Async work handle (``wait()`` completes both halves and re-raises their error;
        ``result()`` is ``[recv_tensor]``), if async_op is set to True. None, if not
        async_op or if not part of the group.

    Examples:
        >>> # We have 3 ranks; each passes its rank to the right.
        >>> send = torch.tensor([rank])
        >>> recv = torch.empty(1, dtype=torch.int64)
        >>> ringcoll.sendrecv(send, (rank + 1) % 3, recv, (rank - 1) % 3)
        >>> recv
        tensor([2])  # Rank 0
        tensor([0])  # Rank 1
        tensor([1])  # Rank 2
    """
    _check_tensor("send_tensor", send_tensor)
    _check_tensor("recv_tensor", recv_tensor)
    async_op = check_async(async_op)
    if group is not None and not isinstance(group, dist.ProcessGroup) \
            and group is not dist.GroupMember.NON_GROUP_MEMBER:
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    if group is dist.GroupMember.NON_GROUP_MEMBER or (group is not None and dist.distributed_c10d._rank_not_in_group(group)):
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    ranks = dist.get_process_group_ranks(pg)
    _check_rank("dst", dst, ranks)
    _check_rank("src", src, ranks)
    me = dist.get_rank()
    if (dst == me) != (src == me):
        raise ValueError(f"dst and src must both be this rank {me} (a local copy) or both other ranks, "
                         f"got dst={dst}, src={src}")
    if dst == me:
        if recv_tensor.dtype != send_tensor.dtype or recv_tensor.numel() != send_tensor.numel():
            raise ValueError(f"recv_tensor must match send_tensor to copy it to this rank: got "
                             f"{recv_tensor.numel()}x{recv_tensor.dtype}, sending {send_tensor.numel()}x{send_tensor.dtype}")
        with torch.no_grad():
            recv_tensor.view(-1).copy_(send_tensor.reshape(-1)) if recv_tensor.is_contiguous() \
                else recv_tensor.copy_(send_tensor.reshape(recv_tensor.shape))
        if not async_op:
            return None
        work = _SendRecvWork([], None, [recv_tensor])
        work.wait()
        return work

    staged = str(dist.get_backend(pg)).lower() != "nccl"      # gloo moves host memory only
    wire_out = send_tensor.detach().contiguous()
    if staged and wire_out.device.type != "cpu":
        wire_out = wire_out.cpu()
    wire_in, finish = recv_tensor.detach(), None
    if not wire_in.is_contiguous() or (staged and wire_in.device.type != "cpu"):
        wire_in = torch.empty(recv_tensor.shape, dtype=recv_tensor.dtype,
                              device="cpu" if staged else recv_tensor.device)

        def finish():
            with torch.no_grad():
                recv_tensor.copy_(wire_in)
    works = batch_isend_irecv([P2POp(isend, wire_out, dst, group), P2POp(irecv, wire_in, src, group)])
    work = _SendRecvWork(list(works), finish, [recv_tensor])
    if async_op:
        return work
    work.wait()
    return None
