"""The P2P executor: runs one rank's plan on a real torch.distributed process group.

Each step's sends and receives are posted together and waited on together (a blocking send
before a receive deadlocks under gloo at every size), then the step's local operations run.
One code path serves gloo (CPU tensors; CUDA tensors are staged through host memory) and
NCCL (CUDA tensors; a step's transfers form one NCCL group via batch_isend_irecv).

A transfer that fails or does not complete within the timeout raises an error that names
this rank, the peer, the step and the call.
"""
from __future__ import annotations

import os
import time
from collections import deque
from datetime import timedelta
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from .local import run_local
from .plan import Plan
from .schedule import Recv, Reduce, Send, extents

#: ringcoll's own tag, so its messages never match a caller's own send/recv (tag 0).
TAG = 0x52430

#: steps whose transfers may be in flight at once (see P2PExecutor.run); RINGCOLL_WINDOW overrides
DEFAULT_WINDOW = 2

_timeout_s = float(os.environ.get("RINGCOLL_TIMEOUT", "300"))


def set_timeout(seconds: float) -> None:
    """How long one step may wait for its peers before failing (default 300 s, or the
    ``RINGCOLL_TIMEOUT`` environment variable)."""
    global _timeout_s
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    _timeout_s = float(seconds)


def get_timeout() -> float:
    return _timeout_s


class PeerError(RuntimeError):
    """A transfer with a peer failed or timed out."""

    def __init__(self, message: str, *, rank: int, peer: int, step: int):
        super().__init__(message)
        self.rank, self.peer, self.step = rank, peer, step


class P2PExecutor:
    """Runs plans for one process group; keeps scratch buffers across calls."""

    def __init__(self, group: dist.ProcessGroup, *, rank: Optional[int] = None,
                 world: Optional[int] = None, backend: Optional[str] = None):
        """``group`` is a process group; or, with ``rank``, ``world`` and ``backend`` given,
        any object with ProcessGroup's ``send``/``recv`` (a transport for measurements)."""
        self.group = group
        if rank is None:
            rank, world, backend = dist.get_rank(group), dist.get_world_size(group), dist.get_backend(group)
            self.global_ranks = [dist.get_global_rank(group, r) for r in range(world)] \
                if group is not dist.GroupMember.WORLD else list(range(world))
        else:
            self.global_ranks = list(range(world))
        self.rank, self.world = rank, world
        self.backend = str(backend).lower()
        self.host_transport = self.backend != "nccl"
        self.window = int(os.environ.get("RINGCOLL_WINDOW", DEFAULT_WINDOW))
        self._scratch: Dict[Tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    # -- buffers -----------------------------------------------------------------------
    def _buffers(self, plan: Plan, steps) -> Dict[str, torch.Tensor]:
        buffers = dict(plan.buffers)
        for name, need in extents(steps).items():
            if name in buffers:
                continue
            key = (name, plan.dtype, plan.device)
            scratch = self._scratch.get(key)
            if scratch is None or scratch.numel() < need:
                scratch = torch.empty(need, dtype=plan.dtype, device=plan.device)
                self._scratch[key] = scratch
            buffers[name] = scratch
        return buffers

    def staging(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of ``numel`` elements that a builder stages a tensor list through, kept
        across calls like the scratch buffers (plans run one at a time, and each copies in and
        out within its own run)."""
        key = ("staging", dtype, device)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._scratch[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel]

    # -- running -----------------------------------------------------------------------
    def run(self, plan: Plan) -> None:
        """Run the plan's steps in order, keeping up to ``window`` steps' transfers in flight:
        step j is posted early, while earlier steps are still moving or reducing, when none
        of its transfers touches what those steps still read or write. A step's local
        operations run as soon as its own transfers are done, so the reduction of one
        segment overlaps the transfer of the next."""
        steps = plan.steps()
        buffers = self._buffers(plan, steps)
        for before in plan.before:
            before()
        total = len(steps)
        posted: deque = deque()          # (index, transfers) of posted, unfinished steps
        next_post = 0
        for index, st in enumerate(steps):
            while next_post < total and (next_post == index or (
                    next_post - index < self.window and _independent(steps, next_post, index))):
                posted.append((next_post, self._post(plan, next_post, total, buffers)))
                next_post += 1
            done, transfers = posted.popleft()
            self._wait(plan, done, total, transfers)
            if st.local:
                run_local(plan.op, buffers, st.local)
        for after in plan.after:
            after()

    def _fail(self, plan: Plan, index: int, total: int, item, error: BaseException) -> PeerError:
        kind = "send to" if isinstance(item, Send) else "receive from"
        message = (f"ringcoll {plan.describe}: rank {self.rank} step {index + 1}/{total}: "
                   f"{kind} peer {item.peer} (global rank {self.global_ranks[item.peer]}) of "
                   f"{item.buf!r} failed: {error}")
        return PeerError(message, rank=self.rank, peer=item.peer, step=index)

    def _post(self, plan: Plan, index: int, total: int, buffers) -> list:
        comms = plan.steps()[index].comms
        for item in comms:
            if not 0 <= item.peer < self.world or item.peer == self.rank:
                raise ValueError(f"ringcoll {plan.describe}: step {index + 1} names peer {item.peer}, "
                                 f"which is not another rank of a world of {self.world}")
        if not comms:
            return []
        if self.backend == "nccl":
            ops = []
            for item in comms:
                tensor = buffers[item.buf.name][item.buf.start:item.buf.stop]
                fn = dist.isend if isinstance(item, Send) else dist.irecv
                ops.append(dist.P2POp(fn, tensor, self.global_ranks[item.peer], self.group, TAG))
            try:
                works = dist.batch_isend_irecv(ops)
            except Exception as error:  # noqa: BLE001 - re-raised with its peer and step
                raise self._fail(plan, index, total, comms[0], error) from error
            return [(item, work, None, None) for item, work in zip(comms, works)]
        staged = self.host_transport and plan.device.type != "cpu"
        transfers = []
        for item in comms:
            tensor = buffers[item.buf.name][item.buf.start:item.buf.stop]
            wire = tensor
            if staged:
                wire = tensor.to("cpu") if isinstance(item, Send) else torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu")
            try:
                if isinstance(item, Send):
                    work = self.group.send([wire], item.peer, TAG)
                else:
                    work = self.group.recv([wire], item.peer, TAG)
            except Exception as error:  # noqa: BLE001
                raise self._fail(plan, index, total, item, error) from error
            transfers.append((item, work, tensor, wire))
        return transfers

    def _wait(self, plan: Plan, index: int, total: int, transfers) -> None:
        if self.backend == "nccl":
            for item, work, _, _ in transfers:
                work.wait()
            return
        deadline = time.monotonic() + (plan.timeout or _timeout_s)
        for item, work, tensor, wire in transfers:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                work.wait(timedelta(seconds=remaining))
            except Exception as error:  # noqa: BLE001
                raise self._fail(plan, index, total, item, error) from error
            if wire is not tensor and isinstance(item, Recv):
                tensor.copy_(wire)


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


def _independent(steps, later: int, first: int) -> bool:
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
