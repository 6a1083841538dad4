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
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
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
    options = parser.parse_args(argv)
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
    results = []
    for path, args in targets(options.only).items():
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
