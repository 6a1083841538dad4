"""barrier (dissemination) and point-to-point (torch's own, re-exported, plus sendrecv): the
schedule checked for reach in the simulator, then real synchronisation and exchanges on gloo."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import SIM_WORLDS
from conftest import GLOO_WORLDS
from ringcoll.schedules import registry
from ringcoll.api.common import Context
from ringcoll.api.barrier import build_barrier
from ringcoll.schedules.vocabulary import Layout, Recv, Send
from ringcoll.schedules.barrier import token_numel

#: the simulator's worlds and one of 100 ranks (7 rounds, the last one partial)
DISSEMINATION_WORLDS = (*SIM_WORLDS, 100)


# -- simulator: the dissemination schedule ---------------------------------------------------
@pytest.mark.parametrize("world", DISSEMINATION_WORLDS)
def test_dissemination_every_rank_hears_from_every_rank(world):
    """Follow who has heard from whom: the token a rank sends at step k carries what it knew
    after step k - 1. After ⌈lg p⌉ steps every rank must have heard from all p ranks, and
    each step k + 1 must send what step k received (the data dependency that keeps any
    executor from starting step k + 1's send early)."""
    schedule = registry.get("barrier", "dissemination").schedule
    steps = [list(schedule(rank, world, Layout(token_numel(world)))) for rank in range(world)]
    lg = (world - 1).bit_length()
    assert [len(s) for s in steps] == [lg] * world, "steps per rank"
    heard = [{rank} for rank in range(world)]
    for k in range(lg):
        sends = {(rank, c.peer) for rank in range(world) for c in steps[rank][k].comms if isinstance(c, Send)}
        incoming = []
        for rank in range(world):
            (recv,) = [c for c in steps[rank][k].comms if isinstance(c, Recv)]
            assert (recv.peer, rank) in sends, f"step {k}: rank {rank} receives from {recv.peer}, who does not send"
            incoming.append(heard[recv.peer])
            if k + 1 < lg:
                (next_send,) = [c for c in steps[rank][k + 1].comms if isinstance(c, Send)]
                assert next_send.buf == recv.buf
        heard = [heard[rank] | incoming[rank] for rank in range(world)]
    assert all(h == set(range(world)) for h in heard), [sorted(set(range(world)) - h) for h in heard]


@pytest.mark.parametrize("world", (1, 2, 3, 7, 8, 13, 64))
def test_barrier_runs_in_the_simulator_with_lg_p_messages_per_rank(world):
    sim = ringcoll.simulate("barrier", "auto", world, call=lambda rank: ((), {}))
    lg = (world - 1).bit_length()
    assert sim.algorithm.name == "dissemination"
    assert sim.stats.steps == lg and sim.stats.messages == world * lg
    assert sim.cost.alpha == lg and sim.outputs == [[]] * world


def test_barrier_bad_input():
    ctx = Context(0, 4)
    with pytest.raises(TypeError, match="device_ids"):
        build_barrier(ctx, 0)
    with pytest.raises(TypeError, match=r"device_ids\[0\]"):
        build_barrier(ctx, ["cuda:0"])
    with pytest.raises(ValueError, match="algorithm"):
        build_barrier(ctx, algorithm="tree")
    with pytest.raises(TypeError, match="async_op"):
        ringcoll.barrier(async_op="yes")
    assert build_barrier(Context(None, None)) is None
    plan = build_barrier(ctx, [0])          # accepted; a CPU token outside NCCL
    assert plan.buffers["token"].device.type == "cpu" and plan.buffers["token"].numel() == 3


def test_p2p_functions_are_torch_s_own():
    for name in ("send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp"):
        assert getattr(ringcoll, name) is getattr(dist, name), name
    assert "sendrecv" in ringcoll.__all__


def test_sendrecv_bad_input_needs_no_group():
    with pytest.raises(TypeError, match="send_tensor"):
        ringcoll.sendrecv([1], 1, torch.empty(1), 1)
    with pytest.raises(TypeError, match="recv_tensor"):
        ringcoll.sendrecv(torch.ones(1), 1, None, 1)
    with pytest.raises(TypeError, match="async_op"):
        ringcoll.sendrecv(torch.ones(1), 1, torch.empty(1), 1, async_op="no")


# -- real gloo ----------------------------------------------------------------------------------
SLEEP_S = 0.3


def barrier_synchronises():
    """The last rank (then rank 0, asynchronously) arrives SLEEP_S late; everyone's barrier
    must return after it arrived: a causal order (time.time() is one clock on one machine),
    so no timing margin is needed.
    Also a barrier of a sub-group, and device_ids on gloo (ignored, as torch)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rounds = []
    for late, async_op in ((world - 1, False), (0, True)):
        dist.barrier()                        # everyone starts the round together
        start = time.time()
        if rank == late:
            time.sleep(SLEEP_S)
        entered = time.time()
        work = ringcoll.barrier(async_op=async_op, device_ids=[0])
        if async_op:
            work.wait()
        left = time.time()
        rounds.append((late, start, entered, left, work is None))
    members = list(range(1, world, 2)) or [0]
    group = dist.new_group(members)
    in_group = ringcoll.barrier(group) is None        # members wait for members; others return at once
    return rounds, in_group


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_barrier_synchronises_on_gloo(clusters, world):
    answers = clusters(world).run(barrier_synchronises)
    for round_index, is_async in enumerate((False, True)):
        late = answers[0][0][round_index][0]
        arrived = answers[late][0][round_index][2]
        for rank, (rounds, in_group) in enumerate(answers):
            _, _, _, left, returned_none = rounds[round_index]
            # a no-op barrier fails this unless the rank itself was SLEEP_S late
            assert left >= arrived, f"rank {rank} left the barrier before rank {late} entered it"
            assert returned_none != is_async
            assert in_group


def point_to_point():
    """sendrecv in a ring (would deadlock with blocking send first), asynchronous and
    non-contiguous; interoperating with plain recv/send; in a sub-group; torch's own
    functions through ringcoll; bad input refused before anything is posted."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    out = {}
    rings = []
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        send = (torch.arange(1000) % 7 + 10 * rank + 1).to(dtype)
        recv = torch.zeros(1000, dtype=dtype)
        result = ringcoll.sendrecv(send, right, recv, left)
        rings.append(result is None and torch.equal(recv, (torch.arange(1000) % 7 + 10 * left + 1).to(dtype)))
    out["ring"] = rings
    # asynchronous, into a non-contiguous tensor (written back on wait)
    recv = torch.zeros(4, 6).t()
    work = ringcoll.sendrecv(torch.full((6, 4), float(rank + 1)), right, recv, left, async_op=True)
    work.wait()
    out["async"] = (isinstance(work, dist.Work), work.is_completed(), work.result()[0] is recv,
                    bool((recv == left + 1).all()))
    # a peer may take its half with plain recv/send: sendrecv posts ordinary tag-0 messages
    if world >= 2 and rank in (0, 1):
        got = torch.zeros(3, dtype=torch.int64)
        if rank == 0:
            ringcoll.sendrecv(torch.tensor([7, 8, 9]), 1, got, 1)
        else:
            ringcoll.recv(got, 0)
            ringcoll.send(torch.tensor([4, 5, 6]), 0)
        out["interop"] = got.tolist()
    # a sub-group of the odd ranks (created on every rank), peers named by global rank
    odd = list(range(1, world, 2))
    group = dist.new_group(odd) if odd else None
    if rank in odd:
        i = odd.index(rank)
        got = torch.zeros(2)
        ringcoll.sendrecv(torch.full((2,), float(rank)), odd[(i + 1) % len(odd)], got,
                          odd[(i - 1) % len(odd)], group=group)
        out["group"] = got.tolist()
    elif group is not None:
        out["group"] = ringcoll.sendrecv(torch.ones(2), 1, torch.zeros(2), 1, group=group)
    # torch's functions through ringcoll: a batch ring, then isend/irecv
    recv = torch.zeros(2, dtype=torch.int32)
    if world >= 2:
        for work in ringcoll.batch_isend_irecv([
                ringcoll.P2POp(ringcoll.isend, torch.full((2,), rank, dtype=torch.int32), right),
                ringcoll.P2POp(ringcoll.irecv, recv, left)]):
            work.wait()
        out["batch"] = recv.tolist()
        works = [ringcoll.isend(torch.full((2,), 2 * rank, dtype=torch.int32), right), ringcoll.irecv(recv, left)]
        for work in works:
            work.wait()
        out["isend"] = recv.tolist()
    # bad input: nothing posted, so the ring after it still lines up
    recv = torch.full((3,), -1.0)
    errors = []
    others = [r for r in range(world) if r != rank]
    for bad in (lambda: ringcoll.sendrecv(torch.ones(3), world, recv, left),
                lambda: ringcoll.sendrecv(torch.ones(3), right, recv, 1.0),
                lambda: ringcoll.sendrecv(torch.ones(3), rank, recv, others[0] if others else world),
                lambda: ringcoll.sendrecv(torch.ones(2), rank, recv, rank)):
        try:
            bad()
        except (TypeError, ValueError) as error:
            errors.append(type(error).__name__)
    untouched = bool((recv == -1).all())
    ringcoll.sendrecv(torch.full((3,), float(rank)), right, recv, left)
    out["bad"] = (errors, untouched, recv.tolist())
    return out


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_point_to_point_on_gloo(clusters, world):
    answers = clusters(world).run(point_to_point)
    odd = list(range(1, world, 2))
    for rank, out in enumerate(answers):
        left = (rank - 1) % world
        assert out["ring"] == [True] * 5, f"rank {rank}: {out['ring']}"
        assert out["async"] == (True, True, True, True), f"rank {rank}: {out['async']}"
        if world >= 2 and rank in (0, 1):
            assert out["interop"] == ([4, 5, 6] if rank == 0 else [7, 8, 9])
        if rank in odd:
            i = odd.index(rank)
            assert out["group"] == [float(odd[(i - 1) % len(odd)])] * 2
        elif odd:
            assert out["group"] is None
        if world >= 2:
            assert out["batch"] == [left] * 2 and out["isend"] == [2 * left] * 2
        errors, untouched, after = out["bad"]
        assert errors == ["ValueError", "TypeError", "ValueError", "ValueError"], f"rank {rank}: {errors}"
        assert untouched and after == [float(left)] * 3


def barrier_with_timeout():
    import datetime

    if dist.get_rank() == 1:
        time.sleep(3)
        return "late"
    start = time.monotonic()
    try:
        ringcoll.barrier(timeout=datetime.timedelta(seconds=1))
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "no error", 0.0


def test_barrier_timeout_names_the_missing_peer():
    with ringcoll.launch(2, threads=1) as cluster:
        message, waited = cluster.run(barrier_with_timeout)[0]
    assert "barrier/dissemination: rank 0 step 1/1" in message and "peer 1" in message, message
    assert waited < 3


def test_barrier_timeout_must_be_a_timedelta():
    from ringcoll.api.common import Context
    from ringcoll.api import BUILDERS

    with pytest.raises(TypeError, match="timeout must be a datetime.timedelta or None, got int"):
        BUILDERS["barrier"](Context(0, 2), None, 5)
