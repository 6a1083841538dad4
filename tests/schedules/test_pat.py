"""PAT (NCCL 2.23's parallel aggregated trees), all_gather and reduce_scatter: its aggregation
bounded by the segment, exact, with the messages and the time its closed form gives (the
general clock test, tests/sim/test_study.py, runs at the default segment only)."""
from __future__ import annotations

import pytest

from _util import COST_MACHINE, assert_equal_per_rank, cost_only, exact_results, one_thread  # noqa: F401
from ringcoll.schedules import registry


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("segment_bytes", [8, 24, 100000])
def test_pat_bounds_its_aggregation(monkeypatch, collective, segment_bytes):
    """Blocks of 8 bytes (int64), segments of 1, 3 or many blocks: exact, and the messages
    and the time are what the closed form says."""
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(segment_bytes))
    per_message = max(1, segment_bytes // 8)
    for world in (2, 5, 8, 13, 16):
        got, want = exact_results(collective, "pat", world, 1)
        assert_equal_per_rank(got, want, f"{collective}/pat segment {segment_bytes} B world {world}")
        sim = cost_only(collective, "pat", world, world * 2)        # float32 blocks of 2: 8 bytes
        cost = registry.model(registry.get(collective, "pat"), world, world * 8, segment=segment_bytes)
        assert sim.stats.time == pytest.approx(cost.time(*COST_MACHINE.values()), rel=1e-9), f"world {world}"
        messages = sim.stats.ranks[0].messages
        assert messages == cost.alpha, f"world {world}"
        if per_message == 1:
            assert messages == world - 1, f"world {world}"
        elif per_message > world:
            assert messages == (world - 1).bit_length(), f"world {world}"
