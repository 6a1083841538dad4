#!/usr/bin/env python
"""Compatibility run: ringcoll's version-sensitive tests under another torch.

    python -m tools.compat --python /work/venvs/torch211/bin/python [--out bench/results/compat]
                           [--only tests/backend/test_backend.py ...] [--timeout 1200]

Runs, under ``--python`` (a venv with that torch, numpy, numba, pytest, pytest-timeout and
expecttest, and this checkout installed with ``pip install --no-deps -e .`` so that torch finds
the backend's entry point; ringcoll's code is this checkout's, first on PYTHONPATH), the
tests where ringcoll meets torch's own API: the backend (ProcessGroup subclass, options objects,
DDP, FSDP2), the batched transport and its NCCL shim, the stream path and its emulator, the
kernels, gpu_check, the torch-version tests, and a CI slice of the catalogue (each collective
against gloo's built-in at world 3, PREMUL_SUM through reduce). Each test file runs in its own
pytest process, one after the other, so a crash or hang loses one file, not the run.

Writes ``torch-<version>.txt`` and ``.json`` under ``--out`` (version without its local part:
2.11.0+cu130 -> torch-2.11.0): per test file its passed/failed/errors/skipped counts, seconds,
the command, and for every failure its test id and the traceback line that raised; with the
torch version, python, date and the whole command line. Exit status 1 if any test failed or
errored (or a file's run died), 0 otherwise.

CI's part of it (README's test command ends with it):

    python -m tools.compat --ci        # = --install 2.11.0 --sample HEAD --share 0.45

``--install VERSION`` makes (or reuses) the venv ``.compat/torch-VERSION`` of this checkout:
PyPI's torch of that version (for 2.11 the CUDA build, 4.9 GB with its NVIDIA libraries; it
imports and runs on a CPU) and this checkout with its test extra, editable, so torch finds the
backend by its entry point. ``--sample SEED`` runs, in one pytest process, a seeded subset of
the plan's tests instead of all of them: every test whose subject is a torch version difference
(the whole of tests/api/test_torch_versions.py, and every test naming PREMUL_SUM or FSDP), at
least one test of every file of the plan, and then tests drawn by the seed while their
estimated seconds (each file's seconds per test in the committed run of that torch, or else
2.13's) stay within ``--budget`` seconds, or within ``--share`` of the whole plan's estimate
(a share does not depend on how loaded the machine of the committed run was). The seed
``HEAD`` is the checkout's commit, so each commit draws its own sample
and any sample can be rerun (the command is printed). Where the venv is not there yet and PyPI
cannot be reached, ``--ci`` says so and runs nothing (exit 0): a machine without a network
cannot test another torch; every other failure, of the install or of a test, fails the run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]

#: whole test files: where ringcoll meets torch's API (backend, transport, streams, kernels,
#: gpu_check) and the version tests themselves
FILES = (
    "tests/api/test_torch_versions.py",
    "tests/backend/test_backend.py",
    "tests/backend/test_backend_entry.py",
    "tests/runtime/test_transport.py",
    "tests/runtime/test_streams.py",
    "tests/kernels/test_kernels.py",
    "tests/kernels/test_gpu_emulation.py",
    "tests/tools/test_gpu_check.py",
)

#: the catalogue's CI slice: every collective against gloo's built-in on real processes at
#: world 3 (and auto at 4), the float ops with PREMUL_SUM through reduce, async Work
CATALOGUE_SLICE = (
    "tests/schedules/test_all_reduce.py::test_matches_builtin_every_op_and_dtype[ring-3]",
    "tests/schedules/test_all_reduce.py::test_matches_builtin_every_op_and_dtype[auto-4]",
    "tests/schedules/test_all_reduce.py::test_async_op_returns_work_in_call_order",
    "tests/schedules/test_reduce_scatter.py::test_matches_builtin_every_op_and_dtype[3]",
    "tests/schedules/test_broadcast_reduce.py::test_matches_builtins_every_dtype_op_and_algorithm[3]",
    "tests/schedules/test_broadcast_reduce.py::test_reduce_float_ops_avg_and_premul[3-ring]",
    "tests/schedules/test_all_gather.py::test_matches_builtin_every_dtype_bitwise_on_every_rank[3]",
    "tests/schedules/test_all_to_all.py::test_matches_builtin[3]",
    "tests/schedules/test_gather_scatter.py::test_matches_builtin_every_dtype_and_root[3]",
)

#: in every sample: the tests whose subject is a difference between torch versions
VERSION_FILES = ("tests/api/test_torch_versions.py",)
VERSION_WORDS = ("premul", "fsdp")
#: the torch the GPU machines run (../shared/GPU-NOTES.md), which CI's sample runs under
CI_TORCH = "2.11.0"
#: CI's sample: this share of the whole plan's estimated seconds (the committed run's, one
#: process per file; the sample, in one process, runs in less: 124 tests in 68 s here)
CI_SHARE = 0.45
#: --budget's default, in estimated seconds
BUDGET = 200.0


@dataclass
class FileResult:
    """One test file's run: counts from pytest's JUnit XML, and what failed."""

    file: str
    command: str
    seconds: float
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    returncode: Optional[int] = None
    failures: List[Dict[str, str]] = field(default_factory=list)   # {"test", "line"}
    note: str = ""                                                  # a run that gave no report

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0 and not self.note


def targets(only: Sequence[str] = ()) -> Dict[str, List[str]]:
    """The pytest arguments per test file, in run order: whole files, then the slice's node
    ids grouped by file; ``only`` keeps the files named."""
    plan: Dict[str, List[str]] = {path: [path] for path in FILES}
    for node in CATALOGUE_SLICE:
        plan.setdefault(node.split("::")[0], []).append(node)
    if only:
        unknown = sorted(set(only) - set(plan))
        if unknown:
            raise SystemExit(f"--only: {unknown} not in the compat run; choose from {sorted(plan)}")
        plan = {path: args for path, args in plan.items() if path in only}
    return plan


def torch_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def entry_point(python: str) -> str:
    """The ``torch.backends`` entry point by which torch finds ringcoll in that venv, or ""
    (tests/backend/test_backend_entry.py needs it: ``pip install --no-deps -e .`` there)."""
    code = ("from importlib.metadata import entry_points as e; "
            "print(' '.join(x.value for x in e(group='torch.backends') if x.name == 'ringcoll'))")
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def raising_line(text: str) -> str:
    """What went wrong and where: the exception pytest shows (the first line of its last
    ``E`` block), at the deepest frame of this checkout in the traceback (a rank's remote
    traceback included), with that frame's source line; else pytest's ``path.py:N:`` line."""
    lines = text.splitlines()
    last, block = [], []
    for line in lines:
        if line.startswith("E "):
            block.append(line[1:].strip())
        elif block:
            last, block = block, []
    last = block or last
    said = last[0] if last else next((line.strip() for line in reversed(lines) if line.strip()), "")
    # an assertion that quotes a subprocess's traceback: its exception too
    inner = [line for line in last[1:] if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*:", line)]
    if inner and inner[-1] != said:
        said = f"{said} ... {inner[-1]}"
    frames = []
    for index, line in enumerate(lines):
        match = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', line)
        if match and match.group(1).startswith(str(ROOT) + os.sep):
            source = lines[index + 1].strip() if index + 1 < len(lines) else ""
            frames.append(f"{os.path.relpath(match.group(1), ROOT)}:{match.group(2)} in {match.group(3)}: {source}")
    if not frames:
        frames = [line.strip() for line in lines if re.match(r"^\S+\.py:\d+: ", line)]
    return f"{said}  [at {frames[-1]}]" if frames else said


def read_junit(path: Path, result: FileResult) -> None:
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        kind = "failed"
        if bad is None:
            bad, kind = case.find("error"), "errors"
        if bad is not None:
            setattr(result, kind, getattr(result, kind) + 1)
            text = bad.text or bad.get("message", "")
            result.failures.append({"test": name, "kind": kind[:-1] if kind == "errors" else kind,
                                    "line": raising_line(text)})
        elif case.find("skipped") is not None:
            result.skipped += 1
        else:
            result.passed += 1


def run_file(python: str, path: str, args: List[str], timeout: float) -> FileResult:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                   *args]
        shown = " ".join(shlex.quote(part) for part in command)
        start = time.perf_counter()
        result = FileResult(path, shown, 0.0)
        # its own session, so that a file killed on timeout takes its clusters' ranks with it
        proc = subprocess.Popen([*command, f"--junitxml={xml}"], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            result.returncode = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            result.note = f"killed after {timeout:.0f} s"
        result.seconds = round(time.perf_counter() - start, 1)
        if xml.exists():
            read_junit(xml, result)
        elif not result.note:
            tail = output.strip().splitlines()[-3:]
            result.note = f"no report (exit {result.returncode}): " + " | ".join(tail)
        if result.returncode not in (None, 0, 1) and not result.note and result.failed + result.errors == 0:
            result.note = f"pytest exited {result.returncode}"
    return result


def collect(python: str, plan: Dict[str, List[str]]) -> List[str]:
    """The plan's test ids, as pytest under ``python`` collects them, in plan order."""
    args = [arg for file_args in plan.values() for arg in file_args]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode != 0 or not ids:
        raise RuntimeError(f"pytest could not collect the plan under {python} (exit {out.returncode}): "
                           + " | ".join(out.stdout.strip().splitlines()[-5:] + out.stderr.strip().splitlines()[-5:]))
    return list(dict.fromkeys(ids))


def seconds_per_test(version: str) -> Dict[str, float]:
    """Per test file, the seconds one of its tests took in the committed run of ``version``
    (else of torch 2.13): a file's seconds over its tests; the estimate a sample is drawn by."""
    for name in (f"torch-{public(version)}.json", "torch-2.13.0.json"):
        path = ROOT / "bench" / "results" / "compat" / name
        if path.exists():
            files = json.loads(path.read_text())["files"]
            return {f["file"]: f["seconds"] / max(1, f["passed"] + f["failed"] + f["errors"] + f["skipped"])
                    for f in files}
    return {}


#: the seconds of a test of a file the committed run does not have
UNKNOWN_SECONDS = 5.0


def _file_of(test: str) -> str:
    return test.split("::")[0]


def estimate(test: str, cost: Dict[str, float]) -> float:
    """A test's estimated seconds: its file's per-test seconds in ``cost``
    (:func:`seconds_per_test`)."""
    return cost.get(_file_of(test), UNKNOWN_SECONDS)


def sample(ids: Sequence[str], seed: int, budget: float, cost: Dict[str, float]) -> List[str]:
    """A seeded subset of ``ids`` (see the module's docstring): the version tests, one of every
    file, then drawn ids while the estimated seconds stay within ``budget``; in ``ids``' order."""
    def about_versions(test: str) -> bool:
        return _file_of(test) in VERSION_FILES or any(word in test.lower() for word in VERSION_WORDS)

    chosen = {test for test in ids if about_versions(test)}
    rest = [test for test in ids if test not in chosen]
    random.Random(seed).shuffle(rest)
    files = {_file_of(test) for test in chosen}
    for test in rest:
        if _file_of(test) not in files:
            chosen.add(test)
            files.add(_file_of(test))
    total = sum(estimate(test, cost) for test in ids if test in chosen)     # in a fixed order, not the set's
    for test in rest:
        if test not in chosen and total + estimate(test, cost) <= budget:
            chosen.add(test)
            total += estimate(test, cost)
    return [test for test in ids if test in chosen]


def head_seed() -> int:
    """The seed ``HEAD``: the checkout's commit as a number (0 outside a git checkout)."""
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return int(out.stdout.strip()[:8], 16) if out.returncode == 0 and out.stdout.strip() else 0


def pypi_reachable(timeout: float = 10.0) -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def install(version: str) -> str:
    """The python of ``.compat/torch-<version>``, made first where it is missing or holds
    another torch: PyPI's torch of that version, then this checkout with its test extra."""
    venv = ROOT / ".compat" / f"torch-{version}"
    python = venv / "bin" / "python"
    if python.exists():
        try:
            if public(torch_version(str(python))) == version and entry_point(str(python)):
                return str(python)
        except subprocess.CalledProcessError:
            pass
    print(f"installing torch {version} into {venv.relative_to(ROOT)} (PyPI's build: for 2.11 the CUDA "
          f"one, about 4.9 GB)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in ([f"torch=={version}"], ["-e", f"{ROOT}[test]"]):
        # pip's output only where it failed: its warnings about this machine's local indexes are noise
        done = subprocess.run([*pip, *args], capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise SystemExit(f"pip install {' '.join(args)} failed (exit {done.returncode}):\n{tail}")
    return str(python)


def public(version: str) -> str:
    return version.split("+")[0]


def write(out: Path, header: Dict, results: List[FileResult]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"torch-{public(header['torch'])}"     # not with_suffix: it would eat ".0"
    rows = [dict(asdict(r), ok=r.ok) for r in results]
    totals = {key: sum(getattr(r, key) for r in results) for key in ("passed", "failed", "errors", "skipped")}
    Path(f"{stem}.json").write_text(json.dumps(dict(header, totals=totals, files=rows), indent=1) + "\n")
    lines = [f"ringcoll compat run: torch {header['torch']}, python {header['python']}",
             f"date: {header['date']}",
             f"ringcoll's torch.backends entry point in that venv: {header['ringcoll_entry_point']}",
             f"command: {header['command']}",
             f"totals: {totals['passed']} passed, {totals['failed']} failed, {totals['errors']} errors, "
             f"{totals['skipped']} skipped in {sum(r.seconds for r in results):.0f} s",
             "",
             f"{'file':<44} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7} {'s':>6}"]
    for r in results:
        lines.append(f"{r.file:<44} {r.passed:>6} {r.failed:>6} {r.errors:>6} {r.skipped:>7} {r.seconds:>6.0f}"
                     + (f"  {r.note}" if r.note else ""))
    for r in results:
        lines += ["", f"{r.file}: {r.command}"]
        lines += [f"  {f['kind'].upper()} {f['test']}\n    {f['line']}" for f in r.failures]
    Path(f"{stem}.txt").write_text("\n".join(lines) + "\n")
    return stem


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the venv whose torch to test (default: this one)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "compat"),
                        help="folder for torch-<version>.txt and .json")
    parser.add_argument("--only", nargs="*", default=(), metavar="FILE",
                        help="run only these test files of the plan")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per test file before it is killed")
    parser.add_argument("--install", metavar="VERSION",
                        help="make or reuse .compat/torch-VERSION from PyPI and run under it (instead of --python)")
    parser.add_argument("--sample", metavar="SEED",
                        help="run a seeded subset in one pytest process: an int, or HEAD (this commit)")
    parser.add_argument("--budget", type=float, default=BUDGET,
                        help="estimated seconds of the sample's tests (default %(default)s)")
    parser.add_argument("--share", type=float, default=None,
                        help="instead of --budget: this share (0-1] of the whole plan's estimated seconds")
    parser.add_argument("--ci", action="store_true",
                        help=f"CI's run: --install {CI_TORCH} --sample HEAD --share {CI_SHARE}, results under .compat/")
    options = parser.parse_args(argv)
    if options.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {options.budget}")
    if options.share is not None and not 0 < options.share <= 1:
        parser.error(f"--share must be a number in (0, 1], got {options.share}")
    if options.ci:
        options.install = options.install or CI_TORCH
        options.sample = options.sample or "HEAD"
        options.share = CI_SHARE if options.share is None else options.share
        if options.out == parser.get_default("out"):
            options.out = str(ROOT / ".compat")
    seed = None
    if options.sample is not None:
        try:
            seed = head_seed() if options.sample == "HEAD" else int(options.sample)
        except ValueError:
            parser.error(f"--sample must be an int or HEAD, got {options.sample!r}")
    if options.install:
        ready = (ROOT / ".compat" / f"torch-{options.install}" / "bin" / "python").exists()
        if options.ci and not ready and not pypi_reachable():
            print(f"compat run under torch {options.install}: NOT RUN: pypi.org cannot be reached from this "
                  f"machine, so torch {options.install} cannot be installed here", flush=True)
            return 0
        options.python = install(options.install)
    return run(options, seed, argv)


def run(options, seed: Optional[int], argv) -> int:
    version = torch_version(options.python)
    header = {
        "torch": version,
        "python": subprocess.run([options.python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ringcoll_entry_point": entry_point(options.python) or "missing",
        "command": " ".join(shlex.quote(a) for a in ["python", "-m", "tools.compat", *(argv or sys.argv[1:])]),
    }
    print(f"compat run under torch {version} ({options.python})", flush=True)
    if header["ringcoll_entry_point"] == "missing":
        print(f"  warning: ringcoll is not installed in that venv, so torch cannot find the backend by "
              f"name (test_backend_entry fails): {options.python} -m pip install --no-deps -e {ROOT}",
              flush=True)
    plan = targets(options.only)
    if seed is not None:
        ids, cost = collect(options.python, plan), seconds_per_test(version)
        budget = options.budget
        if options.share is not None:
            budget = options.share * sum(estimate(test, cost) for test in ids)
        tests = sample(ids, seed, budget, cost)
        print(f"  a sample of {len(tests)} of {len(ids)} tests, seed {seed}, {budget:.0f} estimated s (rerun it: "
              f"python -m tools.compat --python {options.python} --sample {seed} --budget {budget:.1f})", flush=True)
        plan = {f"sample (seed {seed})": tests}
    results = []
    for path, args in plan.items():
        result = run_file(options.python, path, args, options.timeout)
        results.append(result)
        print(f"  {path}: {result.passed} passed, {result.failed} failed, {result.errors} errors, "
              f"{result.skipped} skipped in {result.seconds:.0f} s {result.note}", flush=True)
        for failure in result.failures:
            print(f"    {failure['kind'].upper()} {failure['test']}: {failure['line']}", flush=True)
    stem = write(Path(options.out), header, results)
    print(f"wrote {stem}.txt and .json", flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
