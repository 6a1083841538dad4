"""Fault injection, a seeded sample of the committed campaign.

The campaign (``python -m tools.faults --injections 60 --seed 1 --timeout 3``, result
in bench/results/faults/faults_seed1.json) kills or stalls one rank at a random step of a random
collective and algorithm, each in a fresh gloo world. Here: a few of its draws, and the
cluster's own report of a rank that dies in the middle of a collective.
"""
from __future__ import annotations

import os

import pytest
import torch

import ringcoll
from tools import faults
from ringcoll.cluster import ClusterError

#: the sample CI runs: (seed, index) of draws covering kill and stall, before and while in flight
SAMPLE = [(7, index) for index in range(4)]


def test_the_sample_covers_both_faults_and_both_hooks():
    drawn = [faults.draw(seed, index, 2.0) for seed, index in SAMPLE]
    assert {inj.mode for inj in drawn} == {"kill", "stall"}
    assert {inj.hook for inj in drawn} == {"post", "in_flight"}


@pytest.mark.parametrize("seed,index", SAMPLE, ids=[f"{s}:{i}" for s, i in SAMPLE])
def test_every_survivor_raises_naming_a_peer_in_time_or_completes_exactly(seed, index):
    inj = faults.draw(seed, index, timeout=2.0)
    verdict = faults.run_injection(inj, margin=3.0)
    assert verdict["ok"], (inj, verdict["problems"], verdict["outcomes"])
    assert verdict["victim_step"] is not None
    if inj.mode == "kill":
        assert verdict["victim_exit_code"] == faults.KILL_CODE
    # whoever completed holds the exact result (judge checks it); whoever did not raised in time
    for out in verdict["outcomes"]:
        if out is not None and out.get("raised"):
            assert "peer" in out["error"] and out["elapsed"] <= inj.timeout + 3.0


def test_the_judge_fails_wrong_data_late_errors_and_silent_survivors():
    inj = faults.Injection(id="t", mode="kill", collective="all_reduce", algorithm="ring", world=3,
                           victim=2, hook="post", step_fraction=0.5, numel=7, timeout=2.0, stall=4.0)
    wrong = {0: {"raised": False, "correct": False, "elapsed": 0.1},
             1: {"raised": True, "error": "PeerError: rank 1 step 2/4: receive from peer 2 failed",
                 "elapsed": 9.0}}
    verdict = faults.judge(inj, wrong, faults.KILL_CODE, margin=2.0)
    assert not verdict["ok"]
    assert any("WRONG" in p for p in verdict["problems"])
    assert any("after 9.0 s" in p for p in verdict["problems"])
    assert not faults.judge(inj, {0: wrong[0]}, faults.KILL_CODE, 2.0)["ok"]         # rank 1 silent
    assert not faults.judge(inj, {}, 0, 2.0)["ok"]                                   # victim lived


def _die_in_all_reduce(victim: int):
    import torch.distributed as dist

    ringcoll.set_timeout(3)
    x = torch.arange(1, 10, dtype=torch.int64) + dist.get_rank()
    if dist.get_rank() == victim:
        os._exit(9)
    ringcoll.all_reduce(x)
    return x.tolist()


def test_the_cluster_reports_the_rank_that_died():
    with ringcoll.launch(3, threads=1, timeout=60) as cluster:
        with pytest.raises(ClusterError, match=r"rank 1 died \(exit code 9\) during _die_in_all_reduce"):
            cluster.run(_die_in_all_reduce, 1)
        assert not cluster.alive
        with pytest.raises(ClusterError, match="lost a rank"):
            cluster.run(_die_in_all_reduce, 1)
