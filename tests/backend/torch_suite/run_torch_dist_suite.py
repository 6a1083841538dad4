"""Torch's own distributed test suite (``torch/testing/_internal/distributed/distributed_test.py``,
shipped in the wheel) against ``BACKEND=ringcoll``.

    # one batch, as torch's runner would (each test spawns WORLD_SIZE fresh processes, ~8 s)
    IMPERSONATE=gloo WORLD_SIZE=3 python tests/backend/torch_suite/run_torch_dist_suite.py -v -k test_all_reduce_sum
    # the representative slice below, in batches, with a summary file
    python tests/backend/torch_suite/run_torch_dist_suite.py --slice --summary bench/results/compat/torch_suite.txt

The suite's decorators are evaluated when distributed_test is imported and spawned children
re-import ``__main__``, so everything that makes torch accept the backend happens at module
level, before that import: registering it (``import ringcoll``), adding it to the
"plugin"/"ddp"/"subgroup" features, and, with ``IMPERSONATE=gloo``, letting the
``requires backend one of {'gloo'}`` decorators see "gloo" while every
``init_process_group`` still gets "ringcoll" (the suite reads its module-level ``BACKEND``).
"""
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("BACKEND", "ringcoll")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("INIT_METHOD", "env://")
# With CI set (any value), torch's run_tests writes JUnit XML through xmlrunner, which is not a
# dependency of ringcoll; our runner reports for itself, so the suite runs as it does off CI.
os.environ.pop("CI", None)

import ringcoll  # noqa: E402,F401 - registers the backend in this process and in every child
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

REAL = os.environ["BACKEND"]
for _feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[_feature].add(REAL)
_IMPERSONATE = os.environ.get("IMPERSONATE")
if _IMPERSONATE:
    os.environ["BACKEND"] = _IMPERSONATE
import torch.testing._internal.distributed.distributed_test as dt  # noqa: E402
if _IMPERSONATE:
    dt.BACKEND = REAL
    os.environ["BACKEND"] = REAL
from torch.testing._internal.common_utils import run_tests  # noqa: E402


class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


#: the representative slice: each family the backend serves, batched ~6 to a run
SLICE = {
    "all_reduce": ["test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max",
                   "test_all_reduce_full_group_sum", "test_all_reduce_sum_complex",
                   "test_all_reduce_complex_unsupported_ops", "test_all_reduce_coalesced_sum",
                   "test_all_reduce_coalesced_max", "test_sparse_all_reduce_sum"],
    "broadcast": ["test_broadcast", "test_broadcast_full_group"],
    "reduce": ["test_reduce_sum", "test_reduce_product", "test_reduce_max", "test_reduce_full_group_sum"],
    "all_gather": ["test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
                   "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty"],
    "gather/scatter": ["test_gather", "test_gather_checks", "test_scatter", "test_scatter_checks",
                       "test_scatter_complex"],
    "barrier": ["test_barrier", "test_barrier_full_group", "test_barrier_timeout_full_group"],
    "send/recv": ["test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend",
                  "test_irecv"],
    "DDP (CPU)": ["test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
                  "test_ddp_logging_data_cpu"],
    "objects": ["test_all_gather_object_default_pg", "test_gather_object", "test_broadcast_object_list",
                "test_scatter_object_list"],
    "misc": ["test_get_backend", "test_get_rank"],
}

_STATUS = re.compile(r"(?m)(?:^|\.\.\. )(ok|skipped .*|FAIL|ERROR|expected failure)\s*$")


def _outcome(test, text):
    """(status, reason) of ``test`` in unittest -v output, whose status lines the spawned
    ranks' log lines interleave."""
    failed = re.search(rf"(?m)^(FAIL|ERROR): {test} \(", text)
    if failed:
        block = text[failed.end():]
        block = re.split(r"(?m)^(?:={20,}|-{20,})$", block, maxsplit=2)
        body = block[1] if len(block) > 1 else block[0]
        errors = [ln.strip() for ln in body.splitlines()
                  if re.match(r"^[A-Za-z_.]*(Error|Exception|Failure)\b", ln.strip())]
        return failed.group(1), (errors[-1] if errors else "")[:300]
    start = text.find(f"{test} (__main__")
    if start < 0:
        return "missing", ""
    status = _STATUS.search(text, start)
    if not status:
        return "missing", ""
    word = status.group(1)
    return ("skipped", word[len("skipped "):].strip("'")[:200]) if word.startswith("skipped") else (word, "")


def _run_batch(tests, env):
    """One invocation of this file on ``tests``: {test: (status, detail)}, and its seconds."""
    command = [sys.executable, os.path.abspath(__file__), "-v"]
    for test in tests:
        command += ["-k", f"*.{test}"]     # exact: a bare -k matches substrings
    began = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    text = proc.stdout + "\n" + proc.stderr
    return {test: _outcome(test, text) for test in tests}, time.monotonic() - began


def main_slice(summary_path, batch=6):
    import torch

    env = dict(os.environ)
    env.setdefault("IMPERSONATE", "gloo")
    lines = [f"# torch's distributed_test.py against BACKEND=ringcoll ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             f"# torch {torch.__version__}, WORLD_SIZE={env['WORLD_SIZE']}, INIT_METHOD={env['INIT_METHOD']}, "
             f"IMPERSONATE={env.get('IMPERSONATE')}, load average {os.getloadavg()[0]:.1f}",
             f"# command: python tests/backend/torch_suite/run_torch_dist_suite.py --slice (batches of {batch})", ""]
    counts = {}
    for family, tests in SLICE.items():
        for start in range(0, len(tests), batch):
            chunk = tests[start:start + batch]
            found, seconds = _run_batch(chunk, env)
            for test in chunk:
                word, detail = found[test]
                counts[word] = counts.get(word, 0) + 1
                line = f"{family:<14} {test:<48} {word}"
                if word != "ok" and detail:
                    line += f"  ({detail})"
                lines.append(line)
                print(line, flush=True)
            print(f"#   batch of {len(chunk)}: {seconds:.0f} s", flush=True)
            _write(summary_path, lines + ["", "# (partial: still running)"])
    lines += ["", f"# load average at the end {os.getloadavg()[0]:.1f}",
              "# " + ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))]
    print(lines[-1])
    _write(summary_path, lines)
    return 0 if set(counts) <= {"ok", "skipped"} else 1


def _write(path, lines):
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if "--slice" in sys.argv:
        out = sys.argv[sys.argv.index("--summary") + 1] if "--summary" in sys.argv else None
        sys.exit(main_slice(out))
    run_tests()
