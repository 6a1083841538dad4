"""c10d APIs beyond the collectives behave on a ``"ringcoll"`` group as on a gloo group (issue
#40 finding 8): the group's sequence number, ``eager_connect_single_device``, the group's
store, and a zero ``monitored_barrier`` timeout. Each rank function runs the same script on a
new gloo group and a new ringcoll group of the kept-alive cluster and reports what it saw;
the test compares the two.
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import ringcoll

CPU = torch.device("cpu")
#: groups a rank function made, kept alive for the process's lifetime (a group left with
#: transfers posted, as by a monitored barrier that expired, is never destroyed under them)
_kept: list = []


def _group(backend: str):
    group = dist.new_group(list(range(dist.get_world_size())), backend=backend)
    _kept.append(group)
    return group


def _outcome(call):
    try:
        return ("returned", call())
    except Exception as error:  # noqa: BLE001 - what the test compares
        return (type(error).__name__, str(error).splitlines()[0][:80])


# -- _get_sequence_number_for_group -----------------------------------------------------------
def sequence_numbers() -> dict:
    """The group's sequence number after each operation of one script, read from the group and
    from its CPU backend, per backend."""
    rank = dist.get_rank()
    out = {}
    for backend in ("gloo", "ringcoll"):
        group = _group(backend)
        seen = []

        def note(what):
            seen.append((what, _outcome(group._get_sequence_number_for_group),
                         _outcome(group._get_backend(CPU)._get_sequence_number_for_group)))

        note("made")
        seen.append(("set", _outcome(group._get_backend(CPU)._set_sequence_number_for_group)))
        note("set")
        tensor = torch.full((3,), 4 + rank, dtype=torch.int64)
        dist.all_reduce(tensor, group=group)
        note("all_reduce")
        dist.broadcast(tensor, src=1, group=group)
        note("broadcast")
        dist.barrier(group=group)
        note("barrier")
        if rank == 0:
            dist.send(torch.full((2,), 6, dtype=torch.int64), dst=1, group=group)
        else:
            dist.recv(torch.empty(2, dtype=torch.int64), src=0, group=group)
        note("send/recv")
        objects = [None] * dist.get_world_size()
        dist.all_gather_object(objects, ("rank", rank), group=group)
        note("all_gather_object")
        out[backend] = seen
        out[f"{backend}_data"] = (tensor.tolist(), objects)
    return out


def test_sequence_numbers_count_as_gloos(clusters):
    for rank, out in enumerate(clusters(2).run(sequence_numbers)):
        assert out["ringcoll"] == out["gloo"], f"rank {rank}: ringcoll {out['ringcoll']} vs gloo {out['gloo']}"
        assert out["gloo"][-1][1] == ("returned", 6), (rank, out["gloo"])   # gloo itself, as read
        assert out["ringcoll_data"] == out["gloo_data"] == ([9, 9, 9], [("rank", 0), ("rank", 1)]), (rank, out)


def test_sequence_numbers_count_drop_ins_too(clusters):
    """One numbering: a drop-in call on a ringcoll group counts as the group's own call does."""
    for rank, numbers in enumerate(clusters(2).run(drop_in_numbers)):
        assert numbers == [0, 1, 2, 3], f"rank {rank}: {numbers}"


def drop_in_numbers() -> list:
    group = _group("ringcoll")
    numbers = [group._get_sequence_number_for_group()]
    for call in (lambda t: ringcoll.all_reduce(t, group=group), lambda t: dist.all_reduce(t, group=group),
                 lambda t: ringcoll.broadcast(t, src=0, group=group)):
        call(torch.full((2,), 3, dtype=torch.int64))
        numbers.append(group._get_sequence_number_for_group())
    return numbers


# -- eager_connect_single_device -----------------------------------------------------------------
def eager_connect() -> dict:
    rank = dist.get_rank()
    out = {}
    for backend in ("gloo", "ringcoll"):
        group = _group(backend)
        connect = getattr(group._get_backend(CPU), "eager_connect_single_device", None)
        if connect is None:
            out[backend] = ("no eager_connect_single_device",)
            continue
        seen = [_outcome(lambda: connect(CPU)), _outcome(lambda: connect(torch.device("cpu", 0)))]
        if not dist.is_nccl_available():   # CUDA staged over gloo: nothing to connect, as gloo
            seen.append(_outcome(lambda: connect(torch.device("cuda"))))
        refused = _outcome(lambda: connect("cpu"))
        seen.append(refused[0])                       # TypeError on both; their words differ
        tensor = torch.full((3,), 2 + rank, dtype=torch.int64)
        dist.all_reduce(tensor, group=group)          # the group works after it
        seen.append(tensor.tolist())
        out[backend] = seen
    return out


def test_eager_connect_single_device_as_gloos(clusters):
    for rank, out in enumerate(clusters(2).run(eager_connect)):
        assert out["ringcoll"] == out["gloo"], f"rank {rank}: ringcoll {out['ringcoll']} vs gloo {out['gloo']}"
        returned = [("returned", None)] * (2 if dist.is_nccl_available() else 3)
        assert out["gloo"] == returned + ["TypeError", [5, 5, 5]], (rank, out)


# -- get_group_store ----------------------------------------------------------------------------
def group_store() -> dict:
    """Each rank writes a key through ``group.get_group_store()``; every rank reads every
    rank's key through torch's registry of the group's store."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for backend in ("gloo", "ringcoll"):
        group = _group(backend)
        store = group.get_group_store()
        if store is None:
            out[backend] = ("get_group_store returned None",)
            continue
        store.set(f"c10d-apis/{rank}", str(rank + 7))
        registered = dist.distributed_c10d._get_process_group_store(group)
        out[backend] = (type(store).__name__,
                        [registered.get(f"c10d-apis/{peer}").decode() for peer in range(world)])
    return out


def test_get_group_store_as_gloos(clusters):
    for rank, out in enumerate(clusters(2).run(group_store)):
        assert out["ringcoll"] == out["gloo"], f"rank {rank}: ringcoll {out['ringcoll']} vs gloo {out['gloo']}"
        assert out["gloo"] == ("PrefixStore", ["7", "8"]), (rank, out)


# -- monitored_barrier with a zero timeout -------------------------------------------------------
def zero_monitored_barrier() -> dict:
    """torch's ``test_monitored_barrier_gloo_rank_0_timeout``: rank 0 alone calls
    ``group.monitored_barrier(timedelta(0))``, which must raise at once, as expired."""
    rank = dist.get_rank()
    out = {}
    for backend in ("gloo", "ringcoll"):
        group = _group(backend)
        dist.barrier()                    # the groups made on every rank before rank 0 goes on
        if rank != 0:
            continue
        start = time.monotonic()
        try:
            group.monitored_barrier(datetime.timedelta(0))
            out[backend] = ("returned",)
        except Exception as error:  # noqa: BLE001 - what the test compares
            text = str(error)
            out[backend] = (isinstance(error, RuntimeError), "Rank 0 timed out in monitoredBarrier" in text,
                            "1 failed to pass monitoredBarrier in 0 ms" in text.replace("rank 1 (global rank 1)", "1"),
                            time.monotonic() - start < 1.0)
    out["negative"] = _outcome(lambda: _group("ringcoll").monitored_barrier(datetime.timedelta(seconds=-1)))
    return out


def test_zero_monitored_barrier_timeout_is_expired_as_on_gloo(clusters):
    results = clusters(2).run(zero_monitored_barrier)
    zero = results[0]
    assert zero["ringcoll"] == zero["gloo"], f"ringcoll {zero['ringcoll']} vs gloo {zero['gloo']}"
    assert zero["gloo"] == (True, True, True, True), zero
    # gloo's negative timeout breaks its pairs; ringcoll refuses it, naming the parameter
    for rank, out in enumerate(results):
        assert out["negative"][0] == "ValueError" and "timeout must be zero" in out["negative"][1], (rank, out)
