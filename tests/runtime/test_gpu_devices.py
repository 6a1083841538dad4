"""NCCL's one-GPU-per-rank rule, checked up front: launch() in the parent before it spawns, each
torchrun rank before it initialises NCCL; and the benchmark keeps the whole error.

torch.cuda.device_count is monkeypatched (this machine has no GPU); a check that let a run
through would reach the TCPStore / init_process_group, which are replaced by tripwires.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll import cluster as cluster_module


class Tripwire(Exception):
    """Raised where the code goes once the check has let it through."""


def trip(*args, **kwargs):
    raise Tripwire("reached past the device check")


@pytest.fixture
def gpus(monkeypatch):
    """Set how many GPUs torch sees; spawning (TCPStore) and NCCL init are tripwires."""
    monkeypatch.setattr(dist, "TCPStore", trip)
    monkeypatch.setattr(dist, "init_process_group", trip)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    devices = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)

    def set_count(count):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        return devices

    return set_count


def test_launch_two_nccl_ranks_on_one_gpu_is_refused_before_spawning(gpus):
    gpus(1)
    with pytest.raises(RuntimeError) as info:
        ringcoll.launch(2, "nccl")
    text = str(info.value)
    assert "one GPU per rank" in text and "2 ranks" in text and "1 CUDA device" in text
    assert "Duplicate GPU detected" in text and "--backend gloo" in text
    assert "at most 1 rank" in text


def test_launch_nccl_without_gpus_names_the_fix_not_a_zero_division(gpus):
    gpus(0)
    with pytest.raises(RuntimeError, match="torch sees none.*backend='gloo'"):
        ringcoll.launch(1, "nccl")


def test_launch_nccl_with_a_gpu_per_rank_passes_the_check(gpus):
    gpus(3)
    with pytest.raises(Tripwire):
        ringcoll.launch(3, "nccl")
    gpus(0)
    with pytest.raises(Tripwire):  # gloo does not need a GPU
        ringcoll.launch(2, "gloo")


def _torchrun(monkeypatch, local_rank, local_world=None):
    env = {"RANK": str(local_rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500", "LOCAL_RANK": str(local_rank)}
    if local_world is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_world)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_torchrun_every_rank_of_an_overfull_host_fails_alike(gpus, monkeypatch, local_rank):
    """Two ranks on a one-GPU host: rank 0 must fail too (before, rank 1 died with "invalid
    device ordinal" while rank 0 hung in NCCL's set-up), and neither touches a device."""
    devices = gpus(1)
    _torchrun(monkeypatch, local_rank, local_world=2)
    with pytest.raises(RuntimeError, match="2 ranks on this host, 1 CUDA device"):
        ringcoll.launch(None, "nccl")
    assert devices == []


def test_torchrun_local_rank_beyond_the_devices(gpus, monkeypatch):
    devices = gpus(2)
    _torchrun(monkeypatch, 3)
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=3 has no GPU.*\(0\.\.1\)"):
        ringcoll.launch(None, "nccl")
    assert devices == []


def test_torchrun_rank_with_its_gpu_sets_it_then_initialises(gpus, monkeypatch):
    devices = gpus(2)
    _torchrun(monkeypatch, 1, local_world=2)
    with pytest.raises(Tripwire):
        ringcoll.launch(None, "nccl")
    assert devices == [1]


def test_spawned_nccl_rank_uses_its_own_gpu(gpus, monkeypatch):
    """The rank process body: rank r sets GPU r (no modulo that put two ranks on GPU 0)."""
    devices = gpus(4)
    monkeypatch.setattr(cluster_module, "_die_with_parent", lambda: None)
    sent = []

    class Conn:
        def send(self, message):
            sent.append(message)

    cluster_module._rank_main(3, 4, "nccl", 0, Conn(), torch.get_num_threads(), 5.0)
    assert devices == [3]
    assert sent and sent[0][0] == "error" and "Tripwire" in sent[0][1][1]


def test_bench_rows_keep_every_line_of_the_error():
    from ringcoll.bench.harness import Job, failed_rows
    error = RuntimeError("send to peer 1 failed\nncclInvalidUsage: Duplicate GPU detected : "
                         "rank 1 and rank 0 both on CUDA device 0")
    rows = failed_rows(Job("all_reduce", 1024, algorithms=("ring",)), 2, error)
    assert rows and all("Duplicate GPU detected" in row.error for row in rows)
    assert all(row.error.startswith("RuntimeError: send to peer 1 failed | ") for row in rows)
