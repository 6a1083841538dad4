"""The LogGP machine (Machine.o, g, L) and the clock's window of steps in flight (Machine.window):
exact times of hand-made schedules, the segmented ring's latency paid once, not per segment."""
import os
import re
from dataclasses import replace

import pytest
import torch

import ringcoll
from ringcoll.cost.machine import Machine
from ringcoll.schedules.vocabulary import Buf, Recv, Send, Step
from ringcoll.sim.clock import run_schedules
from tests._util import environment

# seconds as small integers, every sum exact: o = 1, g = 2, L = 8, β = 1 per byte; a 4-byte
# message holds its ports g + 4β = 6, and ends 2o + 6 + L = 16 after it starts
LOGGP = Machine(alpha=0.0, beta=1.0, gamma=0.0, o=1.0, g=2.0, L=8.0)


def three_messages(receive_into):
    """Rank 0 sends three 4-byte messages to rank 1, one step each, from disjoint slices;
    rank 1 receives them into the slices ``receive_into`` gives."""
    sends = [Step((Send(1, Buf("data", 4 * k, 4 * k + 4)),)) for k in range(3)]
    recvs = [Step((Recv(0, Buf("data", start, start + 4)),)) for start in receive_into]
    return [sends, recvs]


@pytest.mark.parametrize("window, expected", [(1, 48.0), (2, 32.0), (3, 28.0), (8, 28.0)])
def test_window_posts_independent_steps_early(window, expected):
    # window 1: each message alone, 3 x 16. Window 2: the second goes on the ports as the
    # first leaves them (6), the third once the first step ends (16): 16 + 16. Window 3: all
    # three back to back on the ports, their latencies and overheads overlapped: 3 x 6 + 2o + L
    stats = run_schedules(three_messages([0, 4, 8]), replace(LOGGP, window=window), record=True)
    assert stats.time == expected
    starts = [row[3] for row in stats.timeline.messages]
    assert starts == {1: [0.0, 16.0, 32.0], 2: [0.0, 6.0, 16.0], 3: [0.0, 6.0, 12.0], 8: [0.0, 6.0, 12.0]}[window]


def test_window_holds_back_a_step_that_touches_one_in_flight():
    # the receiver's steps all write data[0:4]: none may be posted while another is in flight
    # (the executor's rule), so any window runs them as window 1 does
    for window in (1, 2, 3):
        assert run_schedules(three_messages([0, 0, 0]), replace(LOGGP, window=window)).time == 48.0
    # only the third overlaps the second: window 3 posts the second early, not the third
    assert run_schedules(three_messages([0, 4, 4]), replace(LOGGP, window=3)).time == 6.0 + 16.0 + 16.0


def test_loggp_overhead_is_serialised_on_the_rank():
    # with no gap and no bandwidth cost, two messages from one rank still start o apart: its
    # CPU sends one at a time (2 ports, so the ports do not serialise them)
    machine = Machine(alpha=0.0, beta=0.0, gamma=0.0, ports=2, o=1.0, L=8.0, window=2)
    steps = [[Step((Send(1, Buf("data", 0, 4)),)), Step((Send(2, Buf("data", 4, 8)),))],
             [Step((Recv(0, Buf("data", 0, 4)),))], [Step((Recv(0, Buf("data", 0, 4)),))]]
    stats = run_schedules(steps, machine, record=True)
    assert [row[3] for row in stats.timeline.messages] == [0.0, 1.0]
    assert stats.time == 1.0 + 2 * 1.0 + 8.0


P, GIB = 8, 1 << 30


def ring(machine, nbytes=GIB):
    """The ring all_reduce of ``nbytes`` float32 at p = 8, segmented by the segment table."""
    sim = ringcoll.simulate("all_reduce", "ring", P, numel=nbytes // 4, dtype=torch.float32, machine=machine,
                            data=False)
    return sim.stats.time, sim.stats.messages // P


def test_segmented_ring_pays_the_wire_latency_once_not_per_segment():
    L, o, g = 5e-6, 1e-6, 0.5e-6
    loggp = Machine.loggp(L=L, o=o, g=g, beta=1 / 10e9, gamma=1 / 20e9, window=2)
    wire = 2 * (P - 1) / P * GIB * loggp.beta         # 2(p-1)/p nβ
    reduce = (P - 1) / P * GIB * loggp.gamma            # (p-1)/p nγ
    # the flat machine's α holds the ports: one per segment, 2(p-1)k = 112, window or not
    time, k_total = ring(Machine(alpha=L))
    assert k_total == 112 and time == pytest.approx(wire + reduce + k_total * L, rel=1e-12)
    assert ring(Machine(alpha=L, window=2))[0] == pytest.approx(wire + k_total * L, rel=1e-12)
    # LogGP one step at a time: every segment waits out its own latency and overheads
    assert ring(replace(loggp, window=1))[0] == pytest.approx(wire + reduce + k_total * (L + 2 * o + g), rel=1e-12)
    # window 2: the ports never idle, each segment pays its gap; the latency, the overheads and
    # the reductions overlap the next segment's transfer: L and 2o once, on the last message
    time = ring(loggp)[0]
    assert time == pytest.approx(wire + k_total * g + L + 2 * o, rel=1e-12)
    assert time - wire - k_total * g <= 2 * (P - 1) * L       # ≤ 14 L, where α pays 112
    # unsegmented (64 KiB: one segment per chunk), each step forwards what the last one
    # received: the chain of 2(p-1) steps pays L + 2o + g each, window or not
    small = 64 << 10
    expected = 2 * (P - 1) / P * small * loggp.beta + (P - 1) / P * small * loggp.gamma \
        + 2 * (P - 1) * (L + 2 * o + g)
    assert ring(loggp, small)[0] == pytest.approx(expected, rel=1e-12)


def test_the_docs_worked_example_is_the_clocks():
    # docs/simulator.md, "The LogGP machine": each row of its table, and the 64 KiB case, timed now
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "simulator.md")
    with open(path) as f:
        text = f.read().split("## The LogGP machine", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (flat|LogGP)[^|]* \| (\d) \| ([\d.]+) ms \|", text, re.M)
    assert len(rows) == 4
    machines = {"flat": Machine(alpha=5e-6), "LogGP": Machine.loggp(L=5e-6, o=1e-6, g=0.5e-6, window=1)}
    for kind, window, shown in rows:
        assert f"{ring(replace(machines[kind], window=int(window)))[0] * 1e3:.3f}" == shown
    shown = re.search(r"([\d.]+) µs = wire \+ reductions", text).group(1)
    assert f"{ring(replace(machines['LogGP'], window=2), 64 << 10)[0] * 1e6:.3f}" == shown


def test_window_and_loggp_keep_every_result_right():
    # data runs check every rank's result against the collective's definition; small
    # segments make the pipelined schedules post many steps ahead
    machine = Machine.loggp(L=3e-6, o=1e-6, g=0.5e-6, window=4)
    with environment({"RINGCOLL_SEGMENT_FLOOR": "64", "RINGCOLL_SEGMENT": "256"}):
        for collective, algorithm in [("all_reduce", "ring"), ("all_reduce", "double_binary_tree"),
                                      ("broadcast", "pipelined_chain"), ("all_gather", "ring"),
                                      ("reduce_scatter", "ring")]:
            for world in (3, 4, 5):
                sim = ringcoll.simulate(collective, algorithm, world, numel=1000, machine=machine)
                cost_only = ringcoll.simulate(collective, algorithm, world, numel=1000, machine=machine,
                                              data=False)
                assert sim.stats.time == cost_only.stats.time > 0
                assert sim.stats.steps == cost_only.stats.steps


def test_loggp_fields_are_saved_described_and_checked(tmp_path):
    machine = Machine.loggp(L=5e-6, o=1e-6, g=0.5e-6, beta=1 / 25e9, window=3)
    assert (machine.alpha, machine.o, machine.g, machine.L, machine.window) == (0.0, 1e-6, 0.5e-6, 5e-6, 3)
    data = machine.to_dict()
    assert (data["o"], data["g"], data["L"], data["window"]) == (1e-6, 0.5e-6, 5e-6, 3)
    assert Machine.from_dict(data) == machine
    machine.save(str(tmp_path / "m.json"))
    assert Machine.load(str(tmp_path / "m.json")) == machine
    assert machine.describe() == "flat: 0 us, 25 GB/s, 20 GB/s reduced, 1 port, LogGP o 1 us, g 0.5 us, " \
                                 "L 5 us, window 3"
    # a machine without them saves as before (no new keys) and describes as before
    assert "o" not in Machine().to_dict() and "window" not in Machine().to_dict()
    assert Machine().describe() == "flat: 5 us, 10 GB/s, 20 GB/s reduced, 1 port"
    with pytest.raises(ValueError, match="o must be a non-negative number of seconds, got -1"):
        Machine(o=-1)
    with pytest.raises(ValueError, match="L must be a non-negative number of seconds, got 'x'"):
        Machine(L="x")
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        Machine(window=0)


def test_loggp_window_defaults_to_the_executors(monkeypatch):
    from ringcoll.config import VARIABLES
    from ringcoll.cost.machine import EXECUTOR_WINDOW
    from ringcoll.runtime import executor
    assert executor.EXECUTOR_WINDOW is EXECUTOR_WINDOW       # the executor's default is this one number
    assert Machine.loggp(L=1e-6, o=0.0, g=0.0).window == EXECUTOR_WINDOW == 2
    assert {v.name: v.default for v in VARIABLES}["RINGCOLL_WINDOW"] == "2"
    # a machine is a model: the runtime's setting does not change it; window= does
    monkeypatch.setenv("RINGCOLL_WINDOW", "5")
    assert Machine.loggp(L=1e-6, o=0.0, g=0.0).window == EXECUTOR_WINDOW
    assert Machine.loggp(L=1e-6, o=0.0, g=0.0, window=5).window == 5
