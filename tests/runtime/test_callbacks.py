"""Collectives made from inside a Work's future callbacks (issue #40, finding 2).

The bug this guards against: a Work's future was completed on ringcoll's single worker
thread, so its ``then()`` callbacks ran there, and a collective a callback made and waited for
queued behind the callback itself: torch's PowerSGD DDP hook (an all_reduce inside its
``then()`` chain) hung forever. Now completion threads complete the calls and the worker is free
to run the nested ones (ringcoll.runtime.work, module docstring).
"""
from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.runtime.work import _Queue

#: seconds a rank waits for a callback chain before it reports a hang (today's bug hangs forever)
PATIENCE = 30.0


# -- the queue alone (no group: tasks are plain functions) -------------------------------------
def test_nested_calls_from_callbacks_complete_in_order():
    """Synchronous and async+wait calls made inside then() callbacks, two levels deep, run and
    complete; every call runs after the ones submitted before it."""
    q, ran = _Queue(), []

    def call(name, async_op, result=None):
        return q.submit(lambda: ran.append(name), async_op, result)

    def inner(fut):
        call("inner sync", False)
        return ("inner", fut.value())

    def outer(fut):
        call("nested sync", False)
        nested = call("nested async", True, ["n"])
        nested.wait()
        chained = call("nested chained", True, ["c"]).get_future().then(inner)
        return fut.value(), nested.get_future().wait(), chained.wait()

    first = call("first", True, ["a"])
    done = first.get_future().then(outer)
    value = _waited(done)
    assert value == (["a"], ["n"], ("inner", ["c"]))
    assert ran == ["first", "nested sync", "nested async", "nested chained", "inner sync"]
    assert first.is_completed() and first.get_future().done()


def test_callbacks_start_in_completion_order_and_a_blocked_one_holds_nothing_back():
    """Three async calls; the first one's callback waits for a nested call: the second and the
    third still complete, and every callback started in the order its call completed."""
    q, started = _Queue(), []
    release = threading.Event()

    def slow(fut):
        started.append(1)
        nested = q.submit(release.wait, True)    # the worker blocks until the test releases it
        nested.wait()
        return "slow"

    gate = threading.Event()            # the calls complete only once every callback is attached
    works = [q.submit(gate.wait, True, [1])] + [q.submit(lambda: None, True, [i]) for i in (2, 3)]
    chains = [works[0].get_future().then(slow)]
    chains += [w.get_future().then(lambda fut: started.append(fut.value()[0])) for w in works[1:]]
    gate.set()
    deadline = time.monotonic() + PATIENCE
    while not (works[1].is_completed() and works[2].is_completed()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert works[1].is_completed() and works[2].is_completed(), "later completions held back"
    release.set()
    assert _waited(chains[0]) == "slow"
    assert started == [1, 2, 3]


def test_an_inline_call_from_a_callback_never_overlaps_the_workers_call():
    """A synchronous call runs on its caller's thread only while nothing is pending, and holds
    the worker's turn: calls from callbacks, the caller and the worker never overlap."""
    q, overlaps = _Queue(), _Overlaps()

    def task():
        overlaps.run(0.001)

    def callback(fut):
        for _ in range(5):
            q.submit(task, False)
        return True

    chains = []

    def caller():
        for _ in range(20):
            chains.append(q.submit(task, True).get_future().then(callback))
            q.submit(task, False)

    thread = threading.Thread(target=caller, daemon=True)     # a hang fails the test, bounded
    thread.start()
    thread.join(PATIENCE)
    assert not thread.is_alive(), "a synchronous call hung"
    assert all(_waited(chain) for chain in chains)
    assert overlaps.seen == []


def test_the_worker_completes_a_call_itself_and_a_blocking_callback_hands_its_role_on():
    """With no earlier completion under way the worker completes the call itself (one thread
    hop to its waiter, as gloo's); a callback there that blocks on ringcoll hands the worker's
    role to a new worker thread, which runs the nested call, and the old one ends after."""
    q, seen = _Queue(), {}

    def callback(fut):
        seen["completed on"] = threading.current_thread()
        nested = q.submit(lambda: seen.setdefault("nested ran on", threading.current_thread()), True)
        nested.wait()
        return True

    gate = threading.Event()            # the call completes only once the callback is attached

    def first():
        seen["ran on"] = threading.current_thread()
        gate.wait(PATIENCE)

    work = q.submit(first, True)
    chain = work.get_future().then(callback)
    gate.set()
    assert _waited(chain)
    assert seen["completed on"] is seen["ran on"]                        # the worker, no hop
    assert seen["nested ran on"] is not seen["ran on"] and q._thread is seen["nested ran on"]
    seen["ran on"].join(PATIENCE)
    assert not seen["ran on"].is_alive()                                 # the replaced worker ended
    later = q.submit(lambda: seen.setdefault("later ran on", threading.current_thread()), True)
    later.wait()
    assert seen["later ran on"] is q._thread


def test_wait_finds_the_future_done():
    q = _Queue()
    for i in range(50):
        work = q.submit(lambda: None, True, [i])
        work.wait()
        assert work.get_future().done() and work.get_future().value() == [i]


def _waited(future, patience: float = PATIENCE):
    deadline = time.monotonic() + patience
    while not future.done():
        if time.monotonic() > deadline:
            raise AssertionError("the callback chain hung")
        time.sleep(0.005)
    return future.wait()


# -- real gloo ranks: the drop-ins and dist.* on a "ringcoll" group ------------------------------
_groups: dict = {}


def _ringcoll_group():
    """One "ringcoll" group over every rank, per process (every rank builds it at the same call)."""
    if "ringcoll" not in _groups:
        _groups["ringcoll"] = dist.new_group(backend="ringcoll")
    return _groups["ringcoll"]


def nested_calls(entry: str):
    """An async all_reduce whose then() callback makes a synchronous all_reduce, an async one
    it waits for with Work.wait, and one it waits for through get_future().wait(); a second
    callback chained on the first makes one more. Integer data: rank r holds values + r + 1.
    Returns the results (or "hung" after PATIENCE seconds)."""
    rank = dist.get_rank()
    if entry == "drop-in":
        def all_reduce(tensor, async_op=False):
            return ringcoll.all_reduce(tensor, async_op=async_op)
    else:
        group = _ringcoll_group()

        def all_reduce(tensor, async_op=False):
            return dist.all_reduce(tensor, group=group, async_op=async_op)

    def data(start: int, numel: int) -> torch.Tensor:
        return torch.arange(start, start + numel, dtype=torch.int64) + rank + 1

    def first(fut):
        sync, waited, chained = data(10, 3), data(20, 4), data(30, 5)
        all_reduce(sync)
        all_reduce(waited, async_op=True).wait()
        got = all_reduce(chained, async_op=True).get_future().wait()[0]
        return [fut.value()[0].tolist(), sync.tolist(), waited.tolist(), got.tolist()]

    def second(fut):
        more = data(40, 2)
        all_reduce(more, async_op=True).wait()
        return fut.value() + [more.tolist()]

    outer = data(1, 6)
    chain = all_reduce(outer, async_op=True).get_future().then(first).then(second)
    deadline = time.monotonic() + PATIENCE
    while not chain.done():
        if time.monotonic() > deadline:
            return "hung"
        time.sleep(0.01)
    # the group goes on: a plain call after the chain
    after = data(50, 3)
    all_reduce(after)
    return chain.wait() + [after.tolist()]


@pytest.mark.parametrize("entry", ["drop-in", "dist on a ringcoll group"])
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_inside_then_callbacks(clusters, world, entry):
    ranks = world * (world + 1) // 2               # the sum of rank + 1 over the ranks

    def total(start: int, numel: int) -> list:
        return [world * value + ranks for value in range(start, start + numel)]

    want = [total(1, 6), total(10, 3), total(20, 4), total(30, 5), total(40, 2), total(50, 3)]
    for rank, got in enumerate(clusters(world).run(nested_calls, entry)):
        assert got == want, f"rank {rank}: {got}"


# -- torch's PowerSGD DDP hook: all_reduces inside its then() chain -----------------------------
#: steps trained; PowerSGD compresses from step START on (plain all_reduce before)
STEPS, START = 6, 2
#: the largest relative difference allowed between a step's loss on "ringcoll" and on gloo: the
#: two all_reduce in different orders (float32 rounding, ~1e-7), which PowerSGD's
#: orthogonalisation and error feedback carry on over a few steps
LOSS_RTOL = 1e-4


def powersgd_losses() -> dict:
    """The same small DDP job, PowerSGD hook (rank 1, compressing from step START), on gloo and
    on "ringcoll": per backend the losses of every step, whether the compressed path ran, and
    the final parameters (flattened)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, found = dist.get_rank(), {}
    for backend in ("gloo", "ringcoll"):
        if backend not in _groups:
            _groups[backend] = dist.new_group(backend=backend)
        group = _groups[backend]
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                    torch.nn.ReLU(), torch.nn.Linear(32, 4))
        ddp = DDP(model, process_group=group)
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                       start_powerSGD_iter=START, random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses = []
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(7919 * step + rank)
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        compressed = state.iter > START and len(state.p_memory_dict) > 0     # warm start keeps Ps
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        found[backend] = (losses, compressed, params)
    return found


@pytest.mark.parametrize("world", [2, 4])
def test_powersgd_hook_trains_ddp_on_ringcoll_as_on_gloo(clusters, world):
    per_rank = clusters(world).run(powersgd_losses)
    for rank, found in enumerate(per_rank):
        gloo_losses, gloo_compressed, _ = found["gloo"]
        losses, compressed, params = found["ringcoll"]
        assert gloo_compressed and compressed, f"rank {rank}: the compressed path did not run"
        for step, (got, want) in enumerate(zip(losses, gloo_losses)):
            assert got == pytest.approx(want, rel=LOSS_RTOL), f"rank {rank} step {step}: {got} vs gloo {want}"
        # every rank holds the same model: ringcoll's all_reduce results are bitwise identical
        assert torch.equal(params, per_rank[0]["ringcoll"][2]), f"rank {rank}: parameters differ from rank 0's"


def test_a_synchronous_call_made_inside_a_running_call_runs_inline():
    """A call made from inside a call (on the worker or inline on its caller's thread) runs in
    that call's turn, as before there was a turn, instead of queueing behind it."""
    q, ran = _Queue(), []

    def outer():
        q.submit(lambda: ran.append("inner"), False)
        ran.append("outer")

    thread = threading.Thread(target=lambda: (q.submit(outer, False), q.submit(outer, True).wait()), daemon=True)
    thread.start()
    thread.join(PATIENCE)
    assert not thread.is_alive(), "a call made inside a call hung"
    assert ran == ["inner", "outer"] * 2


def test_two_threads_enqueueing_stream_calls_never_interleave():
    """#37: calls enqueued on the stream-ordered path from two threads at once (nothing queued,
    so each enqueues on its own thread) take the queue's turn: one call's enqueueing never
    overlaps another's (NCCL would match their batches by order)."""
    from ringcoll.runtime import stream_runtime
    from ringcoll.runtime.work import submit_stream

    runtime, device, overlaps = stream_runtime.emulated(), torch.device("cpu"), _Overlaps()

    def enqueue(caller):
        overlaps.run(0.002)
        return _Enqueued()

    def caller():
        for _ in range(30):
            submit_stream(enqueue, True, None, runtime, device)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    assert not any(thread.is_alive() for thread in threads), "an enqueueing thread hung"
    assert overlaps.seen == []


class _Enqueued:
    """What an enqueueing task returns (an InFlight): settled at once."""

    finished, failure = True, None

    def when_settled(self, fn):
        fn(self)


class _Overlaps:
    """Counts tasks running at once: ``run(seconds)`` is one task; ``seen`` every count above one."""

    def __init__(self):
        self.running, self.seen, self._lock = 0, [], threading.Lock()

    def run(self, seconds: float) -> None:
        with self._lock:
            self.running += 1
            if self.running > 1:
                self.seen.append(self.running)
        time.sleep(seconds)
        with self._lock:
            self.running -= 1
