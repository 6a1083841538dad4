"""One group, one executor: a drop-in call on a ``"ringcoll"`` group (``ringcoll.all_reduce(t,
group=pg)``) runs on the group's own executor for its tensors' device, the one its
``dist.*`` calls use, so both entry points share the call numbering, the failure state, the
group's timeout and its transport (issue #40 findings 1 and 5, issue #37 item 2).

Each rank function builds its ringcoll groups beside the kept-alive gloo cluster's default
group; groups a test leaves failed are kept referenced (``_kept``) so that no group with
transfers still posted is destroyed while the process lives.
"""
from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

import ringcoll

#: groups a rank function made, kept alive for the process's lifetime (see the docstring)
_kept: list = []


def _ringcoll_group(check: bool = False, timeout: float = 60.0):
    """A new ringcoll group over every rank, in check mode when ``check`` (its executors read
    RINGCOLL_CHECK when they are made), with ``timeout`` seconds as its own timeout."""
    saved = os.environ.get("RINGCOLL_CHECK")
    os.environ["RINGCOLL_CHECK"] = "1" if check else "0"
    try:
        group = dist.new_group(list(range(dist.get_world_size())), backend="ringcoll",
                               timeout=datetime.timedelta(seconds=timeout))
    finally:
        if saved is None:
            os.environ.pop("RINGCOLL_CHECK")
        else:
            os.environ["RINGCOLL_CHECK"] = saved
    _kept.append(group)
    return group


def _outcome(call) -> str:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - what the test inspects
        return f"{type(error).__name__}: {error}"
    return "returned"


# -- call numbering and failure state ---------------------------------------------------------
def interleaved_and_failed() -> dict:
    """In check mode: drop-in and ``dist.*`` calls interleaved on one ringcoll group, then a
    mismatch raised through one entry point and the next call through the other."""
    rank = dist.get_rank()
    from ringcoll.api.common import group_executor

    out = {}
    group = _ringcoll_group(check=True)
    cpu = torch.device("cpu")
    out["same_executor"] = group_executor(group) is group.executor(cpu) \
        and group_executor(group, cpu) is group.executor(cpu)
    a = torch.arange(1, 5, dtype=torch.int64) * (rank + 1)
    ringcoll.all_reduce(a, group=group)
    b = torch.arange(1, 5, dtype=torch.int64) + 10 * rank
    dist.all_reduce(b, group=group)
    c = torch.full((3,), 7 + rank, dtype=torch.int64)
    ringcoll.broadcast(c, src=1, group=group)
    d = torch.full((3,), 20 + rank, dtype=torch.int64)
    dist.broadcast(d, src=0, group=group)
    out["results"] = [a.tolist(), b.tolist(), c.tolist(), d.tolist()]
    out["numbers"] = group.executor(cpu)._seq       # one numbering: both entry points' calls

    # a mismatch raised through a drop-in fails the group for dist.* too
    failed_by_drop_in = _ringcoll_group(check=True)
    x = torch.full((4,), 3, dtype=torch.int64)
    if rank == 0:
        out["drop_in_mismatch"] = _outcome(lambda: ringcoll.all_reduce(x, group=failed_by_drop_in))
    else:
        out["drop_in_mismatch"] = _outcome(lambda: ringcoll.broadcast(x, src=0, group=failed_by_drop_in))
    out["dist_after"] = _outcome(lambda: dist.all_reduce(torch.full((4,), 5, dtype=torch.int64),
                                                         group=failed_by_drop_in))

    # and one raised through dist.* fails it for the drop-ins
    failed_by_dist = _ringcoll_group(check=True)
    if rank == 0:
        out["dist_mismatch"] = _outcome(lambda: dist.all_reduce(x, group=failed_by_dist))
    else:
        out["dist_mismatch"] = _outcome(lambda: dist.broadcast(x, src=0, group=failed_by_dist))
    out["drop_in_after"] = _outcome(lambda: ringcoll.all_reduce(torch.full((4,), 5, dtype=torch.int64),
                                                                group=failed_by_dist))
    return out


def test_drop_ins_and_dist_calls_share_numbering_and_failure_state(clusters):
    results = clusters(3).run(interleaved_and_failed, timeout=120)
    for rank, out in enumerate(results):
        assert out["same_executor"], f"rank {rank}: the drop-in's executor is not the group's own"
        want = [[6 * i for i in range(1, 5)],          # i * (1 + 2 + 3)
                [3 * i + 30 for i in range(1, 5)],     # the sum over ranks r of i + 10 r
                [8, 8, 8], [20, 20, 20]]
        assert out["results"] == want, f"rank {rank}: got {out['results']}, want {want}"
        assert out["numbers"] == 4, f"rank {rank}: the group's executor numbered {out['numbers']} calls, want 4"
        assert out["drop_in_mismatch"].startswith("MismatchError"), (rank, out["drop_in_mismatch"])
        assert out["dist_after"].startswith("GroupFailedError"), \
            f"rank {rank}: dist.all_reduce after a drop-in's MismatchError: {out['dist_after']}"
        assert out["dist_mismatch"].startswith("MismatchError"), (rank, out["dist_mismatch"])
        assert out["drop_in_after"].startswith("GroupFailedError"), \
            f"rank {rank}: ringcoll.all_reduce after a dist.* MismatchError: {out['drop_in_after']}"


# -- the group's timeout ---------------------------------------------------------------------
def stopped_peer(timeout: float) -> dict:
    """On two groups made with ``timeout`` seconds (RINGCOLL_TIMEOUT unset meanwhile): one call
    by every rank on each, then rank 1 stops calling and rank 0 calls again, through a drop-in
    on one group and ``dist.all_reduce`` on the other."""
    rank = dist.get_rank()
    saved = os.environ.pop("RINGCOLL_TIMEOUT", None)     # the cluster's; the group's must apply
    override = ringcoll.runtime.failures._timeout_override     # an earlier test's may linger
    ringcoll.runtime.failures._timeout_override = None
    out = {}
    try:
        # every rank at once on the cluster's gloo group first: a ringcoll group's inner gloo
        # group connects every pair within the group's (short) timeout
        dist.barrier()
        groups = {"drop_in": _ringcoll_group(timeout=timeout), "dist": _ringcoll_group(timeout=timeout)}
        calls = {"drop_in": lambda tensor: ringcoll.all_reduce(tensor, group=groups["drop_in"]),
                 "dist": lambda tensor: dist.all_reduce(tensor, group=groups["dist"])}
        # every rank's first calls, each within the timeout of the other's (a rank waiting
        # longer on a gloo group than its timeout closes the connection)
        for entry, call in calls.items():
            first = torch.full((4,), 2 + rank, dtype=torch.int64)
            call(first)
            out[f"{entry}_first"] = first.tolist()
        out["group_timeout"] = ringcoll.runtime.failures.group_timeout(groups["drop_in"])
        if rank == 0:
            for entry, call in calls.items():
                start = time.monotonic()
                out[entry] = _outcome(lambda: call(torch.full((4,), 9, dtype=torch.int64)))
                out[f"{entry}_waited"] = time.monotonic() - start
    finally:
        ringcoll.runtime.failures._timeout_override = override
        if saved is not None:
            os.environ["RINGCOLL_TIMEOUT"] = saved
    return out


def test_a_stopped_peer_fails_both_entry_points_within_the_groups_timeout(clusters):
    timeout = 3.0
    results = clusters(2).run(stopped_peer, timeout, timeout=60)
    for rank, out in enumerate(results):
        assert out["drop_in_first"] == [5] * 4 and out["dist_first"] == [5] * 4, (rank, out)
        assert out["group_timeout"] == timeout, f"rank {rank}: group_timeout read {out['group_timeout']}, want {timeout}"
    zero = results[0]
    for entry in ("drop_in", "dist"):
        assert zero[entry].startswith("PeerError") and "peer 1" in zero[entry], (entry, zero[entry])
        assert timeout - 0.1 <= zero[f"{entry}_waited"] < timeout + 4.0, \
            f"{entry}: PeerError after {zero[f'{entry}_waited']:.1f} s, want within {timeout} s + 4 s"


# -- CUDA tensors take the group's own CUDA executor -------------------------------------------
def executors_by_device() -> dict:
    """Which executor a drop-in on a ringcoll group, and one on a gloo group, would use for
    CUDA tensors (no tensor is made: the CUDA executor is only looked up)."""
    from ringcoll.api.common import group_executor

    group = _ringcoll_group()
    gloo = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    _kept.append(gloo)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    executor = group_executor(group, cuda)
    return {"ringcoll_cuda_is_backends": executor is group.executor(cuda),
            "ringcoll_cuda_not_cpu": executor is not group.executor(cpu),
            # NCCL where torch has it (the stream-ordered path), else gloo staged through host memory
            "ringcoll_cuda_backend": executor.backend,
            "want_backend": "nccl" if dist.is_nccl_available() else "gloo",
            "gloo_one_executor": group_executor(gloo, cuda) is group_executor(gloo, cpu) is group_executor(gloo)}


def test_a_cuda_drop_in_on_a_ringcoll_group_uses_the_groups_cuda_executor(clusters):
    for rank, out in enumerate(clusters(2).run(executors_by_device)):
        assert out["ringcoll_cuda_is_backends"] and out["ringcoll_cuda_not_cpu"], (rank, out)
        assert out["ringcoll_cuda_backend"] == out["want_backend"], (rank, out)
        assert out["gloo_one_executor"], (rank, out)


def test_the_call_device_is_the_first_tensors():
    from ringcoll.api.common import _call_device

    meta = torch.empty(2, device="meta")
    assert _call_device((meta, 3)) == torch.device("meta")
    assert _call_device(([meta, torch.ones(1)], torch.ones(1))) == torch.device("meta")
    assert _call_device((None, datetime.timedelta(seconds=1), "auto")) is None
    assert _call_device(([], torch.ones(1))) == torch.device("cpu")


# -- a destroyed group --------------------------------------------------------------------------
def after_destroy() -> dict:
    """A drop-in on a ringcoll group that destroy_process_group shut down: once while the group
    was the last one called, once after a call on another group."""
    rank = dist.get_rank()
    group = dist.new_group(list(range(dist.get_world_size())), backend="ringcoll")
    tensor = torch.full((2,), 1 + rank, dtype=torch.int64)
    ringcoll.all_reduce(tensor, group=group)
    out = {"before": tensor.tolist()}
    dist.destroy_process_group(group)
    out["last"] = _outcome(lambda: ringcoll.all_reduce(torch.ones(2), group=group))
    ringcoll.all_reduce(torch.ones(2))                   # the cluster's gloo group
    out["not_last"] = _outcome(lambda: ringcoll.all_reduce(torch.ones(2), group=group))
    return out


def test_a_drop_in_on_a_destroyed_ringcoll_group_says_so(clusters):
    for rank, out in enumerate(clusters(2).run(after_destroy)):
        assert out["before"] == [3, 3], (rank, out)
        for when in ("last", "not_last"):
            assert out[when].startswith("RuntimeError") and "shut down" in out[when], (rank, when, out[when])
