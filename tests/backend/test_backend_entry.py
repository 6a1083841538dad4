"""An unmodified script selects the backend by name alone: ``import torch`` registers
"ringcoll" through the package's ``torch.backends`` entry point, with no ``import ringcoll``.

Two plain Python processes (not the test clusters, which import ringcoll) run SCRIPT.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

import torch.distributed as dist

SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist

rank, world, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
report = {"imported_before": "ringcoll" in sys.modules,
          "registered": "RINGCOLL" in dist.Backend._plugins}
# env:// (a TCPStore), as torchrun sets it up
dist.init_process_group("ringcoll", init_method="env://", rank=rank, world_size=world)
report["type"] = type(dist.group.WORLD).__name__
report["backend"] = dist.get_backend()
t = torch.arange(6, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
report["all_reduce"] = t.tolist()
objects = [None] * world
dist.all_gather_object(objects, ("rank", rank))
report["objects"] = objects

# DeviceMesh, DTensor and functional collectives on the default ringcoll group
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
import torch.distributed._functional_collectives as funcol
mesh = init_device_mesh("cpu", (world,))
full = torch.arange(4 * world, dtype=torch.float32).view(world * 2, 2)
shard = distribute_tensor(full, mesh, [Shard(0)])
report["dtensor_local"] = shard.to_local().tolist()
report["dtensor_full"] = shard.full_tensor().tolist() == full.tolist()
report["funcol_all_reduce"] = funcol.all_reduce(torch.ones(3) * rank, "sum", mesh).tolist()
report["funcol_all_gather"] = funcol.all_gather_tensor(torch.tensor([rank]), 0, mesh).tolist()
dist.destroy_process_group()

# a device-mapped string hands ringcoll the CPU tensors too (torch 2.13 collapses it)
dist.init_process_group("cuda:ringcoll,cpu:ringcoll", init_method=f"file://{path}", rank=rank, world_size=world)
t = torch.tensor([rank + 1])
dist.all_reduce(t)
report["mapped"] = [type(dist.group.WORLD).__name__, int(t.item())]
dist.destroy_process_group()
report["imported_after"] = "ringcoll" in sys.modules
print("REPORT " + json.dumps(report), flush=True)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_process_group_by_name_without_importing_ringcoll():
    world = 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGCOLL_", "TORCH_DEVICE_BACKEND"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RINGCOLL_DEBUG="INFO",
               RINGCOLL_ALGO="all_reduce=ring", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(rank), str(world), path],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for rank in range(world)]
        outputs = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=120)
            finally:
                proc.kill()
            outputs.append((proc.returncode, out, err))
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-3000:]}"
        report = json.loads(next(line for line in out.splitlines() if line.startswith("REPORT "))[7:])
        assert report["registered"] and not report["imported_before"], report
        assert report["imported_after"], report          # the creator imported ringcoll, lazily
        assert report["type"] == "ProcessGroupRingcoll" and report["backend"] == "ringcoll", report
        assert report["all_reduce"] == [3.0 * i for i in range(6)], report
        assert report["objects"] == [["rank", 0], ["rank", 1]], report
        assert report["dtensor_local"] == [[4.0 * rank, 4.0 * rank + 1], [4.0 * rank + 2, 4.0 * rank + 3]]
        assert report["dtensor_full"], report
        assert report["funcol_all_reduce"] == [1.0, 1.0, 1.0], report
        assert report["funcol_all_gather"] == [0, 1], report
        assert report["mapped"] == ["ProcessGroupRingcoll", 3], report
        # RINGCOLL_DEBUG=INFO: one line per collective naming it and the algorithm that ran,
        # as the drop-ins log it; RINGCOLL_ALGO chose the all_reduce
        lines = [line for line in err.splitlines() if line.startswith(f"ringcoll [rank {rank}] INFO: ")]
        assert any(line.startswith(f"ringcoll [rank {rank}] INFO: all_reduce/ring 6xfloat32 SUM: world 2, rank {rank} -> ring")
                   for line in lines), lines
        assert any("all_gather" in line for line in lines) and any("scatter/" in line for line in lines), lines


def test_registered_on_import():
    import ringcoll  # noqa: F401 - registers, idempotently

    assert "RINGCOLL" in dist.Backend._plugins
    assert dist.Backend.backend_capability["ringcoll"] == ["cpu", "cuda"]
    assert dist.Backend._plugins["RINGCOLL"].extended_api


def test_torch_suite_slice_runs_on_ringcoll():
    """One test of torch's own distributed suite through the runner (the whole slice is a
    script: its committed result is bench/results/compat/torch_suite.txt)."""
    runner = os.path.join(os.path.dirname(__file__), "torch_suite", "run_torch_dist_suite.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOLL_")}
    env.update(WORLD_SIZE="2", IMPERSONATE="gloo", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, runner, "-v", "-k", "*.test_all_reduce_sum"], env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Ran 1 test" in text and "OK" in text, text[-3000:]
