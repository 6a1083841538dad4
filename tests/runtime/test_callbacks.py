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

    works = [q.submit(lambda: None, True, [i]) for i in (1, 2, 3)]
    chains = [works[0].get_future().then(slow)]
    chains += [w.get_future().then(lambda fut: started.append(fut.value()[0])) for w in works[1:]]
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
    q, running, overlaps = _Queue(), [0], []
    lock = threading.Lock()

    def task():
        with lock:
            running[0] += 1
            if running[0] > 1:
                overlaps.append(running[0])
        time.sleep(0.001)
        with lock:
            running[0] -= 1

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
    assert overlaps == []


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
