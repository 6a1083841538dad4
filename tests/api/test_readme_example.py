"""README's custom-algorithm example runs as it stands there: the python block (star.py:
registered, simulated with its results checked, run on 2 real ranks) and the bash line that
runs it and benchmarks it through ``ringcoll-bench --import``. README stays a landing page
(at most 250 lines), and no relative link in README or docs/ leads nowhere."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import ringcoll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
#: the pages whose relative links are checked: the landing page, docs/, and the two READMEs of bench/
PAGES = ["README.md", "bench/README.md", "bench/results/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))


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


def test_readme_is_a_landing_page_of_at_most_250_lines():
    with open(README) as f:
        lines = f.read().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def prose(text: str) -> str:
    """Markdown without its fenced code blocks, where brackets and parentheses are code."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(text: str) -> set:
    """The heading anchors GitHub makes for a Markdown page: lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered -1, -2 ..."""
    seen, found = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(text: str) -> list:
    """Every link target of a page that is not a URL: ``path``, ``path#anchor`` or ``#anchor``."""
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(text))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(page: str) -> list:
    """The relative links of ``page`` (a path from the repository root) whose file does not
    exist, or whose anchor names no heading of a Markdown file."""
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    broken = []
    for target in relative_links(text):
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(file):
            broken.append(f"{target}: no file {os.path.relpath(file, ROOT)}")
        elif anchor and file.endswith(".md"):
            with open(file) as f:
                if anchor not in anchors(f.read()):
                    broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(file, ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_points_at_a_file_that_exists(page):
    assert broken_links(page) == [], page


def test_every_docs_anchor_the_code_names_is_a_heading():
    """A docstring or comment that points at a rule stated once in docs/ (``docs/<page>.md#<anchor>``,
    such as docs/semantics.md#a-calls-number) points at a page and a heading that exist."""
    broken = []
    for folder in ("ringcoll", "tests", "tools"):
        for path in sorted(pathlib.Path(ROOT, folder).rglob("*.py")):
            for page, anchor in re.findall(r"docs/([\w-]+\.md)#([\w-]+)", path.read_text()):
                file = pathlib.Path(ROOT, "docs", page)
                if not file.exists() or anchor not in anchors(file.read_text()):
                    broken.append(f"{path.relative_to(ROOT)}: docs/{page}#{anchor}")
    assert broken == []


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path, monkeypatch):
    """The link check itself can fail: a page with a dead file link and a dead anchor."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## How `auto` decides\n\n"
                                             "[ok](a.md#how-auto-decides) [self](#a-page) "
                                             "[gone](missing.md) [bad](a.md#no-such-heading) "
                                             "[web](https://example.com/x.md)\n```\n[code](not-a-link.md)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert broken_links("docs/a.md") == ["missing.md: no file docs/missing.md",
                                         "a.md#no-such-heading: no heading #no-such-heading in docs/a.md"]


def test_the_msccl_example_runs_as_printed_in_readme_and_docs(tmp_path):
    """README's MSCCL block, saved as a script and run (its ranks re-import the script), and
    docs/msccl.md shows the same block. It reads the XML from tests/data (linked into the run's
    folder) and writes ring8.xml there."""
    code = block("msccl")
    with open(os.path.join(ROOT, "docs", "msccl.md")) as f:
        assert f"```python\n{code}\n```" in f.read(), "docs/msccl.md's MSCCL block differs from README's"
    (tmp_path / "tests").symlink_to(os.path.join(ROOT, "tests"))
    (tmp_path / "msccl_example.py").write_text(code + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "msccl_example.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[4000.0, 4000.0, 4000.0, 4000.0]" in done.stdout.splitlines(), done.stdout
    assert (tmp_path / "ring8.xml").read_text().startswith("<algo ")
