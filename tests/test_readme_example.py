"""README's custom-algorithm example runs as it stands there: the python block (star.py:
registered, simulated with its results checked, run on 2 real ranks) and the bash line that
runs it and benchmarks it through ``ringcoll-bench --import``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import ringcoll

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def block(marker: str) -> str:
    """The fenced code block right after ``<!-- example: MARKER -->`` in README.md."""
    with open(README) as f:
        text = f.read()
    match = re.search(rf"<!-- example: {re.escape(marker)} -->\n```\w+\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no code block after <!-- example: {marker} -->"
    return match.group(1)


def test_the_example_is_at_most_15_lines():
    code = [line for line in block("custom-algorithm").splitlines() if line.strip()]
    assert len(code) <= 15, "\n".join(code)


def test_custom_algorithm_example_runs_in_simulator_ranks_and_bench(tmp_path):
    (tmp_path / "star.py").write_text(block("custom-algorithm") + "\n")
    command = block("custom-algorithm-bench")
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    machine, world, nbytes = ringcoll.Machine(), 8, 4099 * 8       # the default machine; int64 data
    cost = 2 * (world - 1) * (machine.alpha + nbytes * machine.beta) + (world - 1) * nbytes * machine.gamma
    assert float(lines[0]) == pytest.approx(cost, rel=1e-12)        # the clock gives the registered cost
    assert lines[1] == "[tensor([0., 2., 4., 6.]), tensor([0., 2., 4., 6.])]"     # 2 real ranks' sums
    out = tmp_path / "ringcoll-bench-results"
    (run,) = [f for f in os.listdir(out) if f.endswith(".json")]
    rows = [r for r in json.loads((out / run).read_text())["rows"] if r["algorithm"] == "star"]
    assert len(rows) >= 4 and all(r["wrong"] == 0 and r["error"] is None for r in rows), rows
