"""ruff over the checkout (its rules and the reasons for the few ignored are in pyproject.toml's
[tool.ruff]): a `# noqa` is kept only where a rule is wrong for that line, and RUF100 fails
any stale one."""
from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ruff_passes():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
