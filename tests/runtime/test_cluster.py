"""ringcoll.launch: the local cluster every test, benchmark and notebook uses."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
import weakref

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.cluster import ClusterError


def whoami(offset):
    return dist.get_rank() + offset, dist.get_world_size()


def fails_on(rank):
    if dist.get_rank() == rank:
        raise KeyError(f"bad key on {rank}")
    return "fine"


def hangs_on(rank):
    if dist.get_rank() == rank:
        time.sleep(60)
    return "fine"


def test_run_returns_each_ranks_result(clusters):
    assert clusters(3).run(whoami, 10) == [(10, 3), (11, 3), (12, 3)]


def test_a_ranks_exception_is_reraised_with_its_rank_and_traceback(clusters):
    cluster = clusters(3)
    with pytest.raises(KeyError, match="bad key on 2") as info:
        cluster.run(fails_on, 2)
    assert "rank 2" in str(info.value.__cause__) and "fails_on" in str(info.value.__cause__)
    assert any("raised on rank 2" in note for note in getattr(info.value, "__notes__", []))
    assert cluster.run(whoami, 0)[2] == (2, 3)          # the cluster survives a rank's exception


def test_a_hanging_rank_brings_the_cluster_down_within_the_timeout():
    cluster = ringcoll.launch(2, threads=1)
    pids = [p.pid for p in cluster._procs]
    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"ranks \[1\] did not finish hangs_on within 3 s"):
        cluster.run(hangs_on, 1, timeout=3)
    assert time.monotonic() - start < 20
    assert not cluster.alive
    for pid in pids:                                     # no process left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        ringcoll.launch(0)
    with pytest.raises(ValueError, match="backend must be one of"):
        ringcoll.launch(2, backend="mpi")


def destroyed_group_is_freed():
    group = dist.new_group([0, 1])
    values = torch.full((5,), float(dist.get_rank() + 3))
    ringcoll.all_reduce(values, group=group)       # the drop-in now has an executor for it
    freed = weakref.ref(group)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    return freed() is None, values.tolist()


def test_a_destroyed_group_is_freed_not_kept_alive_by_its_executor(clusters):
    # The executor cache held its group through the executor (a WeakKeyDictionary whose value
    # refers to its key), so destroy_process_group left gloo's group and threads alive until
    # the interpreter's teardown, which aborted the process now and then: "terminate called
    # without an active exception", SIGABRT (4 of 30 torchrun runs of the job below, loaded).
    assert clusters(2).run(destroyed_group_is_freed) == [(True, [7.0] * 5)] * 2


def test_under_torchrun_the_existing_group_is_used(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, ringcoll
        with ringcoll.launch(backend="gloo") as cluster:
            def value():
                t = torch.ones(5) * (cluster.world_size + 1)
                ringcoll.all_reduce(t, algorithm="ring")
                return t[0].item()
            results = cluster.run(value)
            sys.stdout.write(f"RESULTS {results}\\n")   # one write: the ranks share the pipe
            sys.stdout.flush()
    """))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--standalone", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("RESULTS [6.0, 6.0]") == 2
