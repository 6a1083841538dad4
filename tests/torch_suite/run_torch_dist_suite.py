"""Torch's own distributed test suite (``torch/testing/_internal/distributed/distributed_test.py``,
shipped in the wheel) against ``BACKEND=ringcoll``.

    # one batch, as torch's runner would (each test spawns WORLD_SIZE fresh processes, ~8 s)
    IMPERSONATE=gloo WORLD_SIZE=3 python tests/torch_suite/run_torch_dist_suite.py -v -k test_all_reduce_sum
    # the representative slice below, in batches, with a summary file
    python tests/torch_suite/run_torch_dist_suite.py --slice --summary bench/results/torch_suite.txt

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
    "all_reduce": ["test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_product",
                   "test_all_reduce_min", "test_all_reduce_max", "test_all_reduce_full_group_sum",
                   "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
                   "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max",
                   "test_sparse_all_reduce_sum"],
    "broadcast": ["test_broadcast", "test_broadcast_full_group"],
    "reduce": ["test_reduce_sum", "test_reduce_product", "test_reduce_min", "test_reduce_max",
               "test_reduce_full_group_sum", "test_reduce_sum_twice"],
    "all_gather": ["test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
                   "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
                   "test_all_gather_coalesced_with_empty"],
    "gather/scatter": ["test_gather", "test_gather_checks", "test_gather_full_group", "test_scatter",
                       "test_scatter_checks", "test_scatter_complex", "test_scatter_full_group"],
    "barrier": ["test_barrier", "test_barrier_full_group", "test_barrier_timeout_full_group"],
    "send/recv": ["test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend",
                  "test_irecv"],
    "DDP (CPU)": ["test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
                  "test_ddp_logging_data_cpu"],
    "objects": ["test_all_gather_object_default_pg", "test_gather_object", "test_broadcast_object_list",
                "test_scatter_object_list"],
    "misc": ["test_get_backend", "test_get_rank"],
}

_RESULT = re.compile(r"^(test_\w+) \(.*?\)(?: \.\.\.)?\s*(.*)$")


def _run_batch(tests, env):
    """One invocation of this file on ``tests``; {test: (status, detail)} from unittest -v."""
    command = [sys.executable, os.path.abspath(__file__), "-v"]
    for test in tests:
        command += ["-k", f"*.{test}"]     # exact: a bare -k matches substrings
    began = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    text = proc.stdout + proc.stderr
    found = {}
    for line in text.splitlines():
        match = _RESULT.match(line.strip())
        if match and match.group(1) in tests:
            status = match.group(2).strip()
            word = "ok" if status.startswith("ok") else "skipped" if status.startswith("skipped") else \
                "FAIL" if "FAIL" in status else "ERROR" if "ERROR" in status else status or "?"
            found[match.group(1)] = (word, status)
    for test in tests:
        if test not in found or found[test][0] not in ("ok", "skipped"):
            # the reason: the first error line the test printed
            block = text.split(f"{test} (")
            reason = ""
            if len(block) > 2 or found.get(test, ("",))[0] in ("FAIL", "ERROR"):
                tail = text[text.rfind(f": {test} ("):] if f": {test} (" in text else text[-4000:]
                errors = [ln.strip() for ln in tail.splitlines()
                          if re.match(r"^\s*(\w+Error|\w+Exception|AssertionError|RuntimeError)\b", ln.strip())]
                reason = errors[0][:300] if errors else ""
            found[test] = (found.get(test, ("missing", ""))[0], reason)
    return found, time.monotonic() - began


def main_slice(summary_path, batch=6):
    import torch

    env = dict(os.environ)
    env.setdefault("IMPERSONATE", "gloo")
    lines = [f"# torch's distributed_test.py against BACKEND=ringcoll ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             f"# torch {torch.__version__}, WORLD_SIZE={env['WORLD_SIZE']}, INIT_METHOD={env['INIT_METHOD']}, "
             f"IMPERSONATE={env.get('IMPERSONATE')}, load average {os.getloadavg()[0]:.1f}",
             f"# command: python tests/torch_suite/run_torch_dist_suite.py --slice (batches of {batch})", ""]
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
    lines += ["", "# " + ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))]
    print(lines[-1])
    if summary_path:
        os.makedirs(os.path.dirname(summary_path) or ".", exist_ok=True)
        with open(summary_path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0 if set(counts) <= {"ok", "skipped"} else 1


if __name__ == "__main__":
    if "--slice" in sys.argv:
        out = sys.argv[sys.argv.index("--summary") + 1] if "--summary" in sys.argv else None
        sys.exit(main_slice(out))
    run_tests()
