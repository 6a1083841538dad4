"""The barrier drop-in: a dissemination schedule on one-byte tokens."""
from __future__ import annotations

__all__ = ["barrier"]

import datetime
import numbers

import torch

from ..schedules.vocabulary import Layout
from ..schedules.barrier import token_numel
from ._docs import c10d_doc
from .common import builder, Context, run_call
from ._plans import new_plan, pick


def _token_device(ctx: Context, device_ids) -> torch.device:
    """CPU for gloo (torch's gloo ignores device_ids); for NCCL the first of ``device_ids``,
    else the current CUDA device, as torch's barrier chooses."""
    if ctx.executor is None or ctx.executor.backend != "nccl":
        return torch.device("cpu")
    if device_ids:
        return torch.device("cuda", device_ids[0])
    return torch.device("cuda", torch.cuda.current_device())


@builder("barrier")
def build_barrier(ctx: Context, device_ids=None, timeout=None, *, algorithm="auto"):
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta or None, got {type(timeout).__name__}")
    if timeout is not None and timeout.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if device_ids is not None:
        if not isinstance(device_ids, list):
            raise TypeError(f"device_ids must be a list of ints or None, got {type(device_ids).__name__}")
        for i, device in enumerate(device_ids):
            if not isinstance(device, numbers.Integral) or isinstance(device, bool) or device < 0:
                raise TypeError(f"device_ids[{i}] must be a non-negative int, got {device!r}")
    chosen, why = pick("barrier", algorithm, 0, ctx)
    if ctx.rank is None:
        return None
    numel = token_numel(ctx.world)
    token = torch.ones(numel, dtype=torch.uint8, device=_token_device(ctx, device_ids))
    plan = new_plan("barrier", chosen, why, ctx, Layout(numel), {"token": token}, result=[],
                    describe_as=f"barrier/{chosen.name}")
    plan.timeout = None if timeout is None else timeout.total_seconds()
    plan.own.add("token")
    return plan


@c10d_doc('barrier')
def barrier(group=None, async_op=False, device_ids=None, timeout=None, *, algorithm="auto"):
    """Synchronize all processes.

    This collective blocks processes until the whole group enters this function, if
    async_op is False, or if async work handle is called on wait(). No data moves: ranks
    exchange one-byte tokens (on CPU over gloo; on the CUDA device over NCCL).

    ``timeout`` bounds each step's wait for this call (else ``ringcoll.set_timeout``'s, else
    the group's own): a peer that never arrives is an error naming it. On NCCL the host
    blocks until the peers arrive, as on gloo (NCCL's own ``wait()`` would not block it).

    Args:
        {group, async_op}
        device_ids ([int], optional): List of device/GPU ids. Only one id is expected: on an
            NCCL group the token lives on ``cuda:device_ids[0]`` (else the current device);
            ignored on gloo.
        timeout (datetime.timedelta, optional): how long to wait for the peers.
        {algorithm}

    {returns}

    Examples:
        >>> # We have 2 ranks; rank 1 arrives 2 s late.
        >>> if rank == 1:
        ...     time.sleep(2)
        >>> ringcoll.barrier()
        >>> time.time()
        1764680402.1  # Rank 0: returns only once rank 1 has arrived
        1764680402.1  # Rank 1
    """
    return run_call(build_barrier, group, async_op, device_ids, timeout, algorithm=algorithm)
