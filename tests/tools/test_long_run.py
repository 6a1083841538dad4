"""Long runs, a sample of the committed run.

``python -m tools.long_run --calls 10000`` (result: bench/results/long_run/long_run.json and
long_run.png) makes 10^4 consecutive mixed calls on one group, checking each exactly and
sampling every rank's RSS, descriptors and threads. Here: 1 500 of the same calls on the
shared 3-rank cluster, with its leaks asserted (descriptors and threads exactly flat, memory
within a bound far below what a leak of one buffer per call would reach).
"""
from __future__ import annotations

from tools import long_run


def test_mixed_calls_return_exact_results_and_leak_nothing(clusters):
    per_rank = clusters(3).run(long_run.rank_main, 1500, 3, 500, 250)
    for result in per_rank:
        assert result["wrong"] == [], result["wrong"][:10]
        grown = long_run.growth(result["samples"])
        assert grown["fds"] == 0 and grown["threads"] == 0, (result["rank"], grown, result["samples"])
        # 1 000 calls after warm-up, each moving up to 512 KiB: one leaked buffer per call would
        # be hundreds of MiB; allocator noise and caches settling are a few
        assert grown["rss_mib"] < 24, (result["rank"], grown, result["samples"])


def test_the_sampler_reads_this_process():
    now = long_run.sample()
    assert now["rss_mib"] > 10 and now["fds"] >= 3 and now["threads"] >= 1
    assert long_run.growth([{"rss_mib": 100.0, "fds": 9, "threads": 4},
                            {"rss_mib": 130.0, "fds": 9, "threads": 4},
                            {"rss_mib": 112.5, "fds": 10, "threads": 5}]) == \
        {"rss_mib": 12.5, "fds": 1, "threads": 1, "rss_mib_max_over_first": 30.0}
