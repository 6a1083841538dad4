"""An ``async_op=True`` call never waits on a peer on the caller's thread, not even at its group's
first collective call (where the group agrees its placement): the pattern below completes
on gloo in milliseconds, and must on ringcoll, through the drop-in and through ``dist.*`` on a
``"ringcoll"`` group, for every all_reduce algorithm (``hierarchical`` on a two-placement,
``auto`` weighing a machine from RINGCOLL_MACHINE)::

    rank 0: w = all_reduce(x, group=A, async_op=True); send(y, 1, group=B); w.wait()
    rank 1: recv(y, 0, group=B); all_reduce(x, group=A)
    rank 2: all_reduce(x, group=A)

Before, the async call on rank 0 agreed A's layout on the caller's thread, waiting for rank 1,
which waited in ``recv`` for rank 0's send: a deadlock until B's timeout.
"""
from __future__ import annotations

import pytest
from _util import environment

from ringcoll.schedules import registry

#: every registered all_reduce, and auto (which weighs the machine of RINGCOLL_MACHINE)
ALGORITHMS = tuple(registry.algorithms("all_reduce")) + ("auto",)

#: a machine where a message costs much and a byte little (auto then weighs latency)
MACHINE = '{"alpha": 0.001, "beta": 1e-10, "gamma": 1e-11}'


def deadlock_pattern(entry: str, algorithms, machine_json: str) -> dict:
    """Runs the module's pattern on fresh groups A and B once per algorithm; per algorithm:
    (x right, y received, seconds). ``entry``: "dropin" (ringcoll.all_reduce on a gloo A),
    "dist" (dist.all_reduce on a "ringcoll" A) or "gloo" (dist.all_reduce on a gloo A: the
    reference)."""
    import datetime
    import os
    import tempfile
    import time

    import torch
    import torch.distributed as dist

    import ringcoll

    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(tempfile.mkdtemp(), "machine.json")
    with open(path, "w") as file:
        file.write(machine_json)
    results = {}
    with environment({"RINGCOLL_LOCAL_SIZE": "2" if world > 2 else "1", "RINGCOLL_MACHINE": path}):
        for algorithm in algorithms:
            ranks = list(range(world))
            if entry == "dist":
                group_a = dist.new_group(ranks, backend="ringcoll", timeout=datetime.timedelta(seconds=30),
                                         pg_options=ringcoll.Options(all_reduce=algorithm))
            else:
                group_a = dist.new_group(ranks, backend="gloo", timeout=datetime.timedelta(seconds=30))
            group_b = dist.new_group(ranks, backend="gloo", timeout=datetime.timedelta(seconds=8))
            x = torch.arange(5, dtype=torch.int64) + 1 + 10 * rank
            y = torch.full((3,), 7 + rank, dtype=torch.int64)

            def reduce(async_op: bool):
                if entry == "dropin":
                    return ringcoll.all_reduce(x, group=group_a, async_op=async_op, algorithm=algorithm)
                return dist.all_reduce(x, group=group_a, async_op=async_op)

            start = time.monotonic()
            try:
                if rank == 0:
                    work = reduce(True)
                    dist.send(y, 1, group=group_b)
                    work.wait()
                elif rank == 1:
                    dist.recv(y, 0, group=group_b)
                    reduce(False)
                else:
                    reduce(False)
                want = (torch.arange(5, dtype=torch.int64) + 1) * world + 10 * sum(ranks)
                results[algorithm] = (x.tolist() == want.tolist(), y.tolist(), round(time.monotonic() - start, 1))
            except Exception as error:  # noqa: BLE001 - reported per algorithm
                results[algorithm] = (False, f"{type(error).__name__}: {str(error)[:200]}",
                                      round(time.monotonic() - start, 1))
            dist.destroy_process_group(group_a)
            dist.destroy_process_group(group_b)
    return results


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("entry", ["dropin", "dist"])
def test_async_first_call_never_waits_on_the_caller_thread(clusters, world, entry):
    """The pattern completes on ringcoll for every algorithm, with gloo's results (y, rank 0's
    value, received by rank 1; x the exact sum), as it does on gloo in the same run."""
    cluster = clusters(world)
    reference = cluster.run(deadlock_pattern, "gloo", ["builtin"], MACHINE, timeout=120)
    for rank, results in enumerate(reference):
        assert results["builtin"][:2] == (True, [7] * 3 if rank < 2 else [7 + rank] * 3), (rank, results)
    answers = cluster.run(deadlock_pattern, entry, ALGORITHMS, MACHINE, timeout=600)
    for rank, results in enumerate(answers):
        for algorithm, (right, received, seconds) in results.items():
            assert (right, received) == reference[rank]["builtin"][:2], \
                f"rank {rank} {algorithm} ({entry}): right={right}, y={received}, after {seconds} s"


def late_peer_first_call(entry: str) -> tuple:
    """Rank 0's async all_reduce is its fresh group's first call; rank 1 joins 3 s later.
    ``Work.wait(timeout=0.5 s)`` on rank 0 must raise in time (the call is not complete), and
    a later wait() returns the right sum. Returns (seconds to the call's return, the first
    wait's error type, seconds it took, the result right)."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    import ringcoll

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = "ringcoll" if entry == "dist" else "gloo"
    group = dist.new_group(list(range(world)), backend=backend, timeout=datetime.timedelta(seconds=30))
    x = torch.arange(4, dtype=torch.int64) + 1 + rank
    outcome: tuple = ()
    if rank == 0:
        start = time.monotonic()
        work = dist.all_reduce(x, group=group, async_op=True) if entry == "dist" else \
            ringcoll.all_reduce(x, group=group, async_op=True, algorithm="hierarchical")
        returned = time.monotonic() - start
        start = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
            error = None
        except Exception as caught:  # noqa: BLE001 - its type is the answer
            error = type(caught).__name__
        waited = time.monotonic() - start
        work.wait()
        outcome = (returned, error, waited)
    else:
        time.sleep(3)
        if entry == "dist":
            dist.all_reduce(x, group=group)
        else:
            ringcoll.all_reduce(x, group=group, algorithm="hierarchical")
    want = (torch.arange(4, dtype=torch.int64) + 1) * world + sum(range(world))
    dist.destroy_process_group(group)
    return outcome + (x.tolist() == want.tolist(),)


@pytest.mark.parametrize("entry", ["dropin", "dist"])
def test_wait_timeout_is_honoured_on_a_first_call(clusters, entry):
    """On a group's first call (its layout still to agree, a peer 3 s late) the async call
    returns at once and ``wait(timeout=0.5 s)`` raises within a second; then the call completes."""
    answers = clusters(2).run(late_peer_first_call, entry, timeout=120)
    returned, error, waited, right = answers[0]
    assert returned < 1.0, f"the async call took {returned:.2f} s to return"
    assert error is not None and waited < 1.5, f"wait(0.5 s) raised {error} after {waited:.2f} s"
    assert right and answers[1] == (True,), answers


def rooted_first_calls_streamed() -> dict:
    """An async gather and an async scatter, each the first call of a fresh group on the
    stream-ordered transport (emulated on CPU): the root's list is staged through a buffer
    allocated on ringcoll's stream at the call's entry, which made the transport (and its
    private group, whose gloo set-up waits for every peer) on the caller's thread, while the
    peers waited in the placement exchange for the root: every injection of the fault-points
    campaign on them hung (#36.6). What each rank got, exactly."""
    import torch
    import torch.distributed as dist

    import ringcoll

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    with environment({"RINGCOLL_TRANSPORT": "streamed"}):
        group = dist.new_group(list(range(world)))
        gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
        ringcoll.gather(torch.full((3,), 1 + rank, dtype=torch.int64), gathered, dst=0, group=group,
                        async_op=True).wait()
        out["gather"] = [t.tolist() for t in gathered] if gathered else None
        dist.destroy_process_group(group)
        group = dist.new_group(list(range(world)))
        pieces = [torch.full((3,), 11 + r, dtype=torch.int64) for r in range(world)] if rank == 0 else None
        mine = torch.zeros(3, dtype=torch.int64)
        ringcoll.scatter(mine, pieces, src=0, group=group, async_op=True).wait()
        out["scatter"] = mine.tolist()
        dist.destroy_process_group(group)
    return out


def test_async_rooted_first_calls_on_the_stream_path_complete(clusters):
    world = 3
    for rank, out in enumerate(clusters(world).run(rooted_first_calls_streamed, timeout=120)):
        want = [[1 + r] * 3 for r in range(world)] if rank == 0 else None
        assert out["gather"] == want, f"rank {rank} gather: {out['gather']}"
        assert out["scatter"] == [11 + rank] * 3, f"rank {rank} scatter: {out['scatter']}"
