"""The CUDA table of ``algorithm="auto"`` and of the segment sizes, beside gloo's: a decision
for CUDA tensors goes by CUDA's (no measured rule, the model on CUDA_MACHINE, CUDA's
segments), every other by gloo's as before; a tuning table's rows marked ``cuda`` override
only CUDA's decisions. No GPU is needed: the device is a key of the decision."""
from __future__ import annotations

import types

import pytest
import torch

from ringcoll import selection
from ringcoll.api import common, _plans

MiB = 1 << 20


def test_a_cuda_decision_uses_the_cuda_table(plain_env):
    """At p = 4 gloo's measured rules decide (64 MiB: rabenseifner, 4 KiB: recursive
    doubling); for CUDA tensors no gloo rule speaks, the model does, on the CUDA machine."""
    names = [n for n in selection.registry.algorithms("all_reduce")
             if selection.registry.get("all_reduce", n).auto]
    for nbytes in (4096, 64 * MiB):
        cpu = selection.choose("all_reduce", "auto", nbytes, 4)
        assert "rule measured up to p=4" in cpu[1]
        assert selection.choose("all_reduce", "auto", nbytes, 4, device="cpu") == cpu
        for device in ("cuda", torch.device("cuda", 1), "cuda:0"):
            name, why = selection.choose("all_reduce", "auto", nbytes, 4, device=device)
            assert why.startswith("auto: model (CUDA machine): simulated on nodes of 8"), why
            assert "450 GB/s inside" in why and "50 GB/s between" in why
            expected = selection.modelled_times("all_reduce", nbytes, 4, names,
                                                selection.CUDA_MACHINE, device="cuda")[0][1]
            assert name == expected
    # a machine the call names (Options(machine=)) still decides on every device
    given = selection.Machine()
    assert "given machine" in selection.choose("all_reduce", "auto", 4096, 4, machine=given,
                                               device="cuda")[1]


def test_segments_per_device(plain_env):
    assert selection.segment_bytes("all_reduce", "ring") == 16 * MiB             # gloo's, measured
    assert selection.segment_bytes("all_reduce", "ring", "cuda") == 64 * MiB
    assert selection.segment_bytes("broadcast", "pipelined_chain", "cpu") == 1 * MiB
    assert selection.segment_bytes("broadcast", "pipelined_chain", "cuda") == 4 * MiB
    assert selection.segment_elements("all_reduce", "ring", 2, torch.device("cuda", 0)) == 32 * MiB
    plain_env.setenv("RINGCOLL_SEGMENT", "65536")                               # forced: both
    assert selection.segment_bytes("all_reduce", "ring", "cuda") == 65536
    assert selection.segment_bytes("all_reduce", "ring", "cpu") == 65536


def test_the_cuda_model_prices_cuda_segments(plain_env, monkeypatch):
    """The simulations behind a CUDA decision take CUDA's segments (the thread's priced table),
    gloo's decisions gloo's; outside the model the simulator's default is gloo's."""
    seen = []

    def fake_time(collective, name, world, n, on, nodes):
        seen.append((on is selection.CUDA_MACHINE, selection.segment_bytes("all_reduce", "ring")))
        return 1.0

    monkeypatch.setattr(selection.model, "_simulated_time", fake_time)
    monkeypatch.setattr(selection.model, "_simulated", {})
    selection.modelled_times("all_reduce", 12345, 5, ["ring"], device="cuda")
    selection.modelled_times("all_reduce", 12345, 5, ["ring"], device="cpu")
    assert seen == [(True, 64 * MiB), (False, 16 * MiB)]
    assert selection.table() is selection.TABLES["cpu"]


def _tuning(tmp_path, plain_env, rows: str):
    path = tmp_path / "table.csv"
    path.write_text("collective,nranks,min_bytes,max_bytes,algorithm,device\n" + rows)
    plain_env.setenv("RINGCOLL_TUNING", str(path))
    return path


def test_a_tune_file_marked_cuda_overrides_only_the_cuda_table(plain_env, tmp_path):
    path = _tuning(tmp_path, plain_env, "all_reduce,4,0,1099511627776,ring,cuda\n")
    assert selection.choose("all_reduce", "auto", 64 * MiB, 4, device="cuda") == \
        ("ring", f"auto: tuning table {path}:2")
    name, why = selection.choose("all_reduce", "auto", 64 * MiB, 4, device="cpu")
    assert (name, "rule measured up to p=4" in why) == ("rabenseifner", True)
    # a row marked cpu only gloo's; a row without a device (an older table) both
    path = _tuning(tmp_path, plain_env, "all_reduce,4,0,100,bine,cpu\nall_reduce,4,0,100,direct,\n"
                                        "all_reduce,4,0,100,ring\n")
    assert selection.choose("all_reduce", "auto", 64, 4) == ("bine", f"auto: tuning table {path}:2")
    assert selection.choose("all_reduce", "auto", 64, 4, device="cuda")[0] == "direct"


def test_a_bad_device_in_a_tune_file_names_file_and_line(plain_env, tmp_path):
    _tuning(tmp_path, plain_env, "all_reduce,4,0,100,ring,gpu\n")
    with pytest.raises(ValueError, match=r"table.csv:2: device must be one of \('cpu', 'cuda'\)"):
        selection.choose("all_reduce", "auto", 64, 4, device="cuda")


def test_a_call_on_cuda_tensors_picks_by_the_cuda_table(plain_env, monkeypatch):
    """The drop-ins' pick passes the tensor's device on a process group; the simulator's CPU
    tensors (no executor) stand for any device."""
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    group = common.Context(0, 4, executor=object(), nodes=(0, 0, 0, 0))   # the layout its entry resolved
    assert _plans.table_device(group, on_gpu) == "cuda"
    assert _plans.table_device(group, torch.ones(1)) == "cpu"
    assert _plans.table_device(common.Context(0, 4), on_gpu) is None
    algorithm, why = _plans.pick("all_reduce", "auto", 64 * MiB, group, tensor=on_gpu)
    assert "model (CUDA machine)" in why
    algorithm, why = _plans.pick("all_reduce", "auto", 64 * MiB, group, tensor=torch.ones(1))
    assert algorithm.name == "rabenseifner" and "rule measured" in why
