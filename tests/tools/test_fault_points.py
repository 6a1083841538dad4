"""Fault injection at every point of a call, a seeded sample of the committed campaign.

The campaign (``python -m tools.fault_points``, results in bench/results/faults/faults_points.json and
.txt) raises an exception in one rank at one point of one call (before the first post, at a
step's post, in a local operation, in a before/after hook, at enqueue, in the watchdog) for
every algorithm of every collective at 3 and 4 ranks. Here: a seeded sample on the host,
batched and streamed transports, and the judge's own checks.
"""
from __future__ import annotations

import time

import pytest

from tools import fault_points as fp

#: the sample CI runs: host, batched and streamed, 3 and 4 ranks
SAMPLE, SEED = 18, 1
TRANSPORTS = ["host", "batched", "streamed"]


def test_a_seeded_sample_raises_or_returns_right_on_every_rank():
    start = time.monotonic()
    runner = fp.Runner(timeout=2.0, margin=3.0, grace=6.0, relaunch_every=100)
    try:
        plan = fp.draw_sample(runner, SAMPLE, SEED, [3, 4], TRANSPORTS)
        assert len(plan) == SAMPLE, [inj.id for inj in plan]
        verdicts = fp.run_plan(runner, plan, progress=SAMPLE, start=start)
    finally:
        runner.close()
    for verdict in verdicts:
        # no rank returns a wrong value, none hangs, a fresh group works, and the injection
        # fired where it was aimed
        for bad in ("wrong", "hang", "fresh", "unfired"):
            assert bad not in verdict["verdicts"], (verdict["id"], verdict["problems"], verdict["ranks"])
        # a later call on the failed group that returns (the campaign's "later": on gloo, a rank
        # that receives only from ranks unaware of the failure, bench/results/faults/faults_points.txt)
        # returns the right value
        for report in verdict.get("reports") or []:
            later = (report or {}).get("later") or {}
            assert later.get("correct", True), (verdict["id"], verdict["ranks"])
    assert time.monotonic() - start < 180


def _report(kind="raised", elapsed=2.0, later="raised", fresh=True, fired=None, correct=True):
    report = {"call": {"kind": kind, "elapsed": elapsed, "error": "PeerError: x", "correct": correct},
              "later": {"kind": later, "elapsed": 0.0, "error": "GroupFailedError: x"},
              "fresh": {"kind": "returned", "elapsed": 0.1, "correct": fresh}}
    if fired is not None:
        report["fired"] = fired
    return report


def test_the_judge_names_every_kind_of_failure_and_the_rank():
    inj = fp.Injection("all_reduce", "ring", 3, "host", "local", 1, victim=1)

    def verdict(*reports):
        return fp.judge(inj, list(reports), timeout=2.0, margin=3.0)

    good = [_report(), _report(elapsed=0.01, fired="local:1"), _report(kind="returned", elapsed=0.1)]
    assert verdict(*good)["verdicts"] == ["ok"]
    wrong = verdict(good[0], good[1], _report(kind="returned", correct=False))
    assert wrong["verdicts"] == ["wrong"] and "rank 2" in wrong["problems"][0]
    assert verdict(_report(elapsed=5.5), good[1], good[2])["verdicts"] == ["slow"]
    assert verdict(good[0], good[1], {"call": {"kind": "hung", "elapsed": 8}})["verdicts"] == ["hang"]
    assert verdict(good[0], good[1], None)["verdicts"] == ["hang"]                   # the cluster lost it
    assert verdict(good[0], good[1], _report(later="returned"))["verdicts"] == ["later"]
    assert verdict(good[0], good[1], _report(fresh=False))["verdicts"] == ["fresh"]
    assert verdict(good[0], _report(), good[2])["verdicts"] == ["unfired"]
    # a reduce's non-root only sends: its next call returning is noted, not failed
    rooted = fp.Injection("reduce", "ring", 3, "host", "post", 0, victim=0)
    noted = fp.judge(rooted, [_report(fired="post:0"), _report(later="returned"), _report()], 2.0, 3.0)
    assert noted["verdicts"] == ["ok"] and "rank 1" in noted["notes"][0]
    root = fp.Injection("broadcast", "binomial", 3, "host", "after", 0, victim=2)
    noted = fp.judge(root, [_report(later="returned"), _report(later="returned"), _report(fired="after:0")], 2.0, 3.0)
    assert noted["verdicts"] == ["later"] and noted["problems"] == [
        "rank 1: the next call on the failed group returned (it must raise)"]


def test_the_plan_has_every_point_and_the_victims_that_have_it():
    counts = {"ready": 1, "start": 1, "post": 4, "local": 2, "enqueue": 2}
    leaf = {"ready": 1, "start": 1, "post": 1}
    census = {"broadcast/binomial": [{"counts": counts, "correct": True}, {"counts": leaf, "correct": True},
                                     {"counts": leaf, "correct": True}]}
    host = fp.plan_injections(census, 3, "host")
    assert sorted({(inj.point, inj.k) for inj in host}) == [
        ("after", 0), ("before", 0), ("local", 0), ("local", 1), ("post", 0), ("post", 2), ("post", 3),
        ("ready", 0), ("start", 0)]
    assert all(inj.victim == 0 for inj in host if inj.point in ("local",) or inj.k > 0)
    streamed = {(inj.point, inj.k) for inj in fp.plan_injections(census, 3, "streamed")}
    assert {("enqueue", 0), ("enqueue", 1), ("watchdog_query", 0), ("watchdog_failed", 0)} <= streamed
    broken = {"broadcast/binomial": [{"error": "ValueError: x"}, {"counts": leaf, "correct": True}]}
    assert fp.plan_injections(broken, 2, "host") == [] and "ValueError" in fp.skipped(broken)["broadcast/binomial"]


@pytest.mark.parametrize("text", ["all_reduce/ring@4/host:local:2:r1", "gather/linear@3/streamed:watchdog_query:r0"])
def test_an_id_replays_its_injection(text):
    assert fp._parse_replay(text).id == text
