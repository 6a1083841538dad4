"""tools/gpu_check.py, the script to run first when a GPU is lent: its dry run on this CPU-only
machine (plan first, every section, JSON + text), and the independence of its backends (one
backend's error is recorded and the others still run)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--dry-run",
                           "--budget", "90", "--worlds", "2", "--backends", "torch",
                           "--timeout-per-check", "20", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    return proc, out


def test_dry_run_states_its_plan_then_runs_every_section(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = proc.stdout.splitlines()
    plan = next(i for i, line in enumerate(lines) if line.startswith("plan ("))
    assert plan < lines.index("== environment") < lines.index("== runtime")
    assert lines[plan + 2].startswith("  1b. runtime (at most 180 s, 20 s per check)")
    assert [line.split(" ", 3)[3].split(" (")[0] for line in lines[plan + 3:plan + 7]] == \
        ["correctness", "streams", "bandwidth", "collectives"]
    (json_path,) = out.glob("gpu_check_*.json")
    assert json_path.with_suffix(".txt").read_text().splitlines()[0] == lines[0]
    data = json.loads(json_path.read_text())
    assert data["dry_run"] and data["plan"][0].startswith("plan (90 s")
    sections = data["sections"]
    assert list(sections) == ["environment", "runtime", "correctness", "streams", "bandwidth",
                              "collectives"]
    assert {name: s["status"] for name, s in sections.items()} == {
        "environment": "ok", "runtime": "skipped", "correctness": "ok", "streams": "skipped",
        "bandwidth": "ok", "collectives": "ok"}
    # every runtime check is named, skipped, with the reason
    from tools.gpu_runtime import CHECKS
    runtime = sections["runtime"]
    assert list(runtime["checks"]) == list(CHECKS) and len(CHECKS) == 9
    for name, check in runtime["checks"].items():
        assert check["status"] == "skip" and check["reason"] == "needs one GPU: --dry-run", name
        assert f"  {name}: SKIP - needs one GPU: --dry-run" in lines
    assert sections["correctness"]["checks"] > 100
    assert sections["bandwidth"]["rows"] and sections["bandwidth"]["target"]["backends"] == ["cupy"]
    (run,) = sections["collectives"]["runs"]
    assert run["world"] == 2 and run["checks"] > 0 and run["wrong"] == 0


@pytest.fixture
def gpu_check():
    from tools import gpu_check
    return gpu_check


class Quiet:
    """A Report that keeps its lines in memory."""

    def __init__(self):
        self.lines = []

    def say(self, line=""):
        self.lines.append(line)


def _broken(real, backend):
    def reduce_into(dst, src, op, *, out=None, backend=None):
        if backend == broken_name:
            raise RuntimeError(f"{broken_name} kernels were requested but NVRTC is missing")
        return real(dst, src, op, out=out, backend=backend)
    broken_name = backend
    return reduce_into


def test_a_failing_backend_does_not_stop_the_others(gpu_check, monkeypatch):
    """numba raises at its first call: its error is recorded once, torch runs every check."""
    monkeypatch.setattr(gpu_check.kernels, "reduce_into",
                        _broken(gpu_check.kernels.reduce_into, "numba"))
    cases = [(3, 37, True, 1, "exact"), (2, 9, False, "mixed", "subnormal")]
    monkeypatch.setattr(gpu_check, "correctness_cases", lambda small: cases)
    ctx = {"device": "cpu", "small": True, "backends": ["numba", "torch"],
           "deadline": time.monotonic() + 120}
    report = Quiet()
    result = gpu_check.section_correctness(report, ctx)
    per = result["per_backend"]
    assert "NVRTC is missing" in per["numba"]["error"] and per["torch"]["error"] is None
    assert per["torch"]["wrong"] == 0
    assert result["checks"] == len(gpu_check.PAIRS) + 4 * len(gpu_check.FLOATS)
    assert result["failures"][0].startswith("numba: numel 0")
    assert sum("ERROR numba" in line for line in report.lines) == 1

    ctx["deadline"] = time.monotonic() + 60
    result = gpu_check.section_bandwidth(report, ctx)
    assert all("torch" in row and "numba" not in row for row in result["rows"])
    assert len(result["rows"]) == len(gpu_check.bandwidth_plan(True))
    assert [f.split(":")[0] for f in result["failures"]] == ["numba"]


def test_runtime_checks_without_cuda_skip_without_starting_anything(gpu_check, monkeypatch):
    from tools import gpu_runtime
    monkeypatch.setattr(gpu_runtime, "run_one", lambda *a: pytest.fail("started a check"))
    said = []
    results = gpu_runtime.run_all(False, 30, 200, say=said.append, why_not="no CUDA device")
    assert list(results) == list(gpu_runtime.CHECKS)
    assert all(r == {"status": "skip", "reason": "needs one GPU: no CUDA device"}
               for r in results.values())
    assert len(said) == len(gpu_runtime.CHECKS)


def test_a_hanging_check_is_a_failure_and_the_budget_holds(monkeypatch):
    """A check whose process outlives --timeout-per-check is killed and recorded as failed;
    once the runtime budget is spent the remaining checks are skipped, saying so; a check's
    JSON line is its result."""
    from tools import gpu_runtime
    calls = []

    class FakePopen:
        def __init__(self, args, **kwargs):
            self.args, self.returncode, self.killed = args, None, False
            calls.append(self)

        def communicate(self, timeout=None):
            if self.args[3] == "nccl_self_batch" and not self.killed:
                self.timeout = timeout
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = -9 if self.killed else 0
            if self.killed:
                return "", "NCCL waiting"
            self.timeout = timeout
            return 'noise\n{"status": "pass", "reason": "fine"}\n', ""

        def kill(self):
            self.killed = True

    monkeypatch.setattr(gpu_runtime.subprocess, "Popen", FakePopen)
    clock = iter(range(0, 1000, 20))
    monkeypatch.setattr(gpu_runtime.time, "monotonic", lambda: next(clock))
    results = gpu_runtime.run_all(True, 30, 200, say=lambda line: None)
    assert results["kernels_prepare"]["status"] == "pass"
    hung = results["nccl_self_batch"]
    assert hung["status"] == "fail" and hung["reason"].startswith("timed out after 30 s")
    assert "NCCL waiting" in hung["reason"]
    skipped = [name for name, r in results.items() if r["status"] == "skip"]
    assert skipped and all("budget (200 s) was spent" in results[n]["reason"] for n in skipped)
    assert all(call.timeout <= 30 for call in calls) and calls[1].killed
    assert not gpu_runtime.RUNNING                       # every process it started is done


_REHEARSAL = """
import json, sys, torch
from tools import gpu_runtime
gpu_runtime._cuda = lambda: (torch, torch.device("cpu"))
torch.cuda.synchronize = lambda *args, **kwargs: None
print(json.dumps(gpu_runtime.check_backend_world1()))
"""


def test_the_world1_backend_check_rehearsed_on_cpu_tensors():
    """backend_world1's calls (dist.* on a ringcoll group, ringcoll.all_reduce, an async
    call's get_future()) on CPU tensors, the gloo inner group standing in for NCCL: the check
    itself is right about the public API it drives, so a failure on a GPU is the GPU path's."""
    proc = subprocess.run([sys.executable, "-c", _REHEARSAL], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "pass", result
    assert len(result["outcomes"]) == 8 and set(result["outcomes"].values()) == {"ok"}


def test_the_multi_rank_checks_rehearsed_on_the_stream_emulator():
    """loopback_ranks, allocator_safety and ring_step_time on CPU tensors through the stream
    emulator (tools/loopback.py's ranks driving ringcoll's real executor, transport, watchdog
    and window): what a GPU run will check is right before it runs there."""
    from tools import gpu_runtime

    ranks = gpu_runtime.check_loopback_ranks("cpu")
    assert ranks["status"] == "pass", ranks
    assert set(ranks["worlds"]) == {2, 3, 4} and all(w["steps"] > 0 and w["window"] >= 2 for w in ranks["worlds"].values())
    safety = gpu_runtime.check_allocator_safety("cpu")
    assert safety["status"] == "pass", safety
    timing = gpu_runtime.check_ring_step_time("cpu")
    assert timing["status"] == "pass", timing
    assert [row["steps"] for row in timing["rows"]] == [6] * 4            # 2 (world - 1) steps
    assert all(row["us_per_step"] > 0 and row["host_us_per_call"] > 0 for row in timing["rows"])


def test_the_allocator_check_fails_when_a_call_keeps_nothing(monkeypatch):
    """A transport that drops the tensors a call uses at enqueue (as if nothing kept them until
    the call ended): the dropped input's memory is reused while the call runs and the check
    says so."""
    from ringcoll.runtime.transport.stream_ordered import StreamTransport
    from tools import gpu_runtime

    close = StreamTransport.close

    def forgetting(self, keep=()):
        call = close(self, keep)
        call.keep = []
        return call

    monkeypatch.setattr(StreamTransport, "close", forgetting)
    result = gpu_runtime.check_allocator_safety("cpu")
    assert result["status"] == "fail" and "handed the dropped input's memory out" in result["reason"], result


def test_a_short_time_limit_cuts_the_sections_and_writes_only_under_out(tmp_path):
    """--time-limit 25: the sections share what the limit leaves, the run ends within it, and
    its two files are the only ones, under --out."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--dry-run", "--time-limit", "25",
                           "--worlds", "2", "--backends", "torch", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode in (0, 3), (proc.stdout + proc.stderr)[-3000:]
    assert time.monotonic() - start < 25 + 15          # the interpreter's own start and exit on top
    (json_path,) = tmp_path.glob("gpu_check_*.json")
    data = json.loads(json_path.read_text())
    assert "stops at 25 s" in data["plan"][-1]
    assert sorted(path.name for path in tmp_path.rglob("*")) == sorted([json_path.name, json_path.with_suffix(".txt").name])


def test_at_the_time_limit_the_report_is_written_and_children_end(gpu_check, monkeypatch, tmp_path):
    """Whatever is running at the limit: the report says so and is written, a running check's
    process is killed, and the process exits with status 3."""
    from tools import gpu_runtime

    exited, killed = [], []

    class Running:
        def kill(self):
            killed.append(self)

    monkeypatch.setattr(gpu_check.os, "_exit", exited.append)
    monkeypatch.setattr(gpu_runtime, "RUNNING", {Running()})
    # this process's own children are the test clusters' ranks, shared with later tests: the
    # stop must kill a stand-in (it killed the kept-alive clusters' ranks: a later test's rank
    # then "died (exit code -9)")
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "active_children", lambda: [Running()])
    report = gpu_check.Report(tmp_path, "test", dry_run=True)
    gpu_check.stop_at_the_limit(report, gpu_check.Budget(0.2))
    deadline = time.monotonic() + 10
    while not exited and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exited == [3] and len(killed) == 2
    assert json.loads(report.json_path.read_text())["time_limit_reached"] is True
    assert "TIME LIMIT: stopped" in report.text_path.read_text()


def test_docs_name_every_runtime_check_and_the_first_command():
    """docs/gpu.md's table of runtime checks has one row per check, in CHECKS' order, and the
    command for the first GPU run writes under $OUT within a timeout longer than the run's limit."""
    import re
    from tools import gpu_runtime
    from tools.gpu_check import main  # noqa: F401 - the documented module exists

    text = (ROOT / "docs" / "gpu.md").read_text()
    section = text[text.index("## gpu_check: the first command on a GPU"):]
    rows = re.findall(r"^\| `(\w+)` \|", section.split("The kernel sections")[0], re.M)
    assert rows == list(gpu_runtime.CHECKS)
    command = 'timeout 480 python -m tools.gpu_check --out "$OUT"'
    assert command in text[:text.index("## What runs on CUDA tensors")] and command in section


def test_shares_of_the_budget_add_up(gpu_check):
    assert abs(sum(share for _, _, share in gpu_check.SHARES) - 1.0) < 1e-9
    assert [name for name, _, _ in gpu_check.SHARES] == ["correctness", "streams", "bandwidth",
                                                         "collectives"]


def test_cuda_run_tries_every_installed_backend(gpu_check, monkeypatch):
    """On CUDA the check tries cupy and numba even when the probe rejects them, so their
    errors are shown rather than silently skipped."""
    monkeypatch.setattr(gpu_check.kernels, "_installed", lambda name: True)
    assert gpu_check.default_backends("cuda") == ["cupy", "numba", "torch"]
    assert gpu_check.default_backends("cpu")[0] == "torch"
