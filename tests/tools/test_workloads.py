"""ringcoll-bench --workload: the paired ratios, the contestants, and the p2p-floor hook."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ringcoll.bench import workloads
from ringcoll.bench.workloads import BUILTIN, P2P_FLOOR


def test_summarize_pairs_each_round_with_the_builtins_round():
    """Each round's time is the slowest rank's; the ratio is taken round by round against the
    built-in's same round, then its median and spread: a round slow for every contestant (load
    that came and went) moves the times, not the ratio."""
    per_rank = [{"times": {BUILTIN: [1.0, 10.0, 2.0], "auto": [0.9, 9.0, 2.4]}},
                {"times": {BUILTIN: [2.0, 4.0, 1.0], "auto": [1.0, 8.0, 2.2]}}]
    rows = {r["contestant"]: r for r in workloads.summarize(per_rank)}
    # per round (max over ranks): built-in [2, 10, 2], auto [1, 9, 2.4]; ratios [0.5, 0.9, 1.2]
    assert rows["auto"]["time_us"] == pytest.approx(2.4e6)
    assert rows["auto"]["vs_builtin"] == pytest.approx(0.9)
    assert (rows["auto"]["vs_builtin_min"], rows["auto"]["vs_builtin_max"]) == (pytest.approx(0.5), pytest.approx(1.2))
    assert rows[BUILTIN]["vs_builtin"] == 1.0 and rows[BUILTIN]["min_us"] == pytest.approx(2e6)
    line = workloads.table("ddp", 2, list(rows.values()), 8 << 20, "1.0 -> 2.0")[-1]
    assert "0.90" in line and "[0.50 - 1.20]" in line


def test_contestants_are_narrowed_by_name_and_the_floor_needs_a_power_of_two():
    names = [label for label, _ in workloads._contestants("ddp", 4, "auto,ring,p2p-floor")]
    assert names == [BUILTIN, "auto", "ring", P2P_FLOOR]
    assert P2P_FLOOR in [label for label, _ in workloads._contestants("ddp", 4)]
    assert P2P_FLOOR not in [label for label, _ in workloads._contestants("ddp", 3)]
    assert P2P_FLOOR not in [label for label, _ in workloads._contestants("fsdp", 4)]
    with pytest.raises(ValueError, match=r"\['nope'\] are not algorithms of all_reduce"):
        workloads._contestants("ddp", 4, "auto,nope")
    with pytest.raises(ValueError, match="p2p-floor"):
        workloads._contestants("ddp", 3, P2P_FLOOR)


class _Bucket:
    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor


def _hook_against_all_reduce(numel: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    values = (torch.arange(numel, dtype=torch.float32) * (rank + 3) + rank) % 1021
    expected = values.clone()
    dist.all_reduce(expected)
    got = workloads.p2p_floor_hook(workloads.FloorThread(), _Bucket(values.clone())).wait()
    return torch.equal(got, expected / world)


@pytest.mark.parametrize("world", [2, 4])
def test_the_p2p_floor_hook_gives_ddps_mean(clusters, world):
    """The floor is a real all_reduce: exact integer data, divided by a power of two, equal to
    the built-in's mean at even and odd lengths (uneven halves) and below one element a rank."""
    for numel in (1, 3, 1001, 4096):
        assert all(clusters(world).run(_hook_against_all_reduce, numel)), numel
