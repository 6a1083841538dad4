"""tools/compat.py without running it: its plan names tests that exist, it reads pytest's
JUnit report into counts, a failure's line says the exception and where it was raised, and
CI's seeded sample keeps the version tests, every file and its budget, and is its seed's."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import compat


def test_the_plan_names_existing_files_and_tests():
    plan = compat.targets()
    for path, args in plan.items():
        source = (compat.ROOT / path).read_text()
        for arg in args:
            assert arg.split("::")[0] == path, f"{arg} is filed under {path}"
            if "::" in arg:
                function = re.sub(r"\[.*\]$", "", arg.split("::")[1])
                assert f"def {function}(" in source, f"{path} has no {function}"
    wanted = ("tests/backend/test_backend.py", "tests/runtime/test_transport.py", "tests/runtime/test_streams.py",
              "tests/kernels/test_kernels.py", "tests/tools/test_gpu_check.py", "tests/api/test_torch_versions.py")
    for path in wanted:
        assert plan.get(path) == [path], f"{path} must run whole, got {plan.get(path)}"


def test_only_keeps_the_named_files():
    assert list(compat.targets(["tests/runtime/test_streams.py"])) == ["tests/runtime/test_streams.py"]


def test_read_junit_counts(tmp_path: Path):
    xml = tmp_path / "junit.xml"
    xml.write_text("""<testsuites><testsuite>
<testcase classname="tests.a" name="test_ok"/>
<testcase classname="tests.a" name="test_skip"><skipped message="no"/></testcase>
<testcase classname="tests.a" name="test_bad"><failure message="m">E   ValueError: bad value
tests/a.py:3: ValueError</failure></testcase>
<testcase classname="tests.a" name="test_setup"><error message="e">E   OSError: no file
tests/a.py:9: OSError</error></testcase>
</testsuite></testsuites>""")
    result = compat.FileResult("tests/a.py", "cmd", 0.0)
    compat.read_junit(xml, result)
    assert (result.passed, result.failed, result.errors, result.skipped) == (1, 1, 1, 1), result
    assert result.failures == [
        {"test": "tests.a::test_bad", "kind": "failed", "line": "ValueError: bad value  [at tests/a.py:3: ValueError]"},
        {"test": "tests.a::test_setup", "kind": "error", "line": "OSError: no file  [at tests/a.py:9: OSError]"}]
    assert not result.ok


def test_raising_line_names_a_ranks_frame_in_this_checkout():
    text = f"""--- rank 0 ---
Traceback (most recent call last):
  File "{compat.ROOT}/ringcoll/cluster.py", line 123, in _rank_main
    result = fn(*args, **kwargs)
  File "{compat.ROOT}/tests/backend/test_backend.py", line 372, in compare_data_movement
    dist.all_to_all(ref, [wire(t) for t in inputs])
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 4955, in all_to_all
    work = group.alltoall(output_tensor_list, input_tensor_list, opts)
RuntimeError: Backend gloo does not support alltoall

>           raise _unpack(first, errors[first])
E           RuntimeError: Backend gloo does not support alltoall
E           (raised on rank 0 of the ringcoll cluster)
ringcoll/cluster.py:335: RuntimeError"""
    assert compat.raising_line(text) == (
        "RuntimeError: Backend gloo does not support alltoall  [at tests/backend/test_backend.py:372 in "
        "compare_data_movement: dist.all_to_all(ref, [wire(t) for t in inputs])]")


def test_raising_line_adds_a_quoted_subprocess_exception():
    text = """E       AssertionError: rank 0 exited 1:
E         Traceback (most recent call last):
E           File "<string>", line 10, in <module>
E         RuntimeError: Could not find the default backend type 0
E       assert 1 == 0

tests/backend/test_backend_entry.py:84: AssertionError"""
    assert compat.raising_line(text) == ("AssertionError: rank 0 exited 1: ... RuntimeError: Could not find the "
                                         "default backend type 0  [at tests/backend/test_backend_entry.py:84: "
                                         "AssertionError]")


IDS = [f"tests/api/test_torch_versions.py::test_v{i}" for i in range(3)] + \
      ["tests/backend/test_backend.py::test_fsdp2_loss[2]", "tests/backend/test_backend.py::test_reduce_premul[3]"] + \
      [f"tests/backend/test_backend.py::test_b{i}" for i in range(10)] + \
      [f"tests/kernels/test_kernels.py::test_k{i}" for i in range(40)]
COST = {"tests/api/test_torch_versions.py": 0.5, "tests/backend/test_backend.py": 10.0,
        "tests/kernels/test_kernels.py": 1.0}


def test_a_sample_keeps_the_version_tests_one_of_every_file_and_the_budget():
    chosen = compat.sample(IDS, seed=7, budget=40.0, cost=COST)
    assert IDS[:5] == chosen[:5], "every version test (the file, FSDP, PREMUL) is in every sample"
    files = {test.split("::")[0] for test in chosen}
    assert files == set(COST), files
    drawn = [test for test in chosen if test not in IDS[:5]]
    # the version tests cost 21.5 s; the rest is drawn within the 40 s estimate
    assert sum(COST[t.split("::")[0]] for t in chosen) <= 40.0 + 10.0, chosen
    assert len(drawn) >= 3, drawn
    assert chosen == sorted(chosen, key=IDS.index), "run in the collected order"


def test_a_sample_is_its_seed_s():
    assert compat.sample(IDS, 7, 40.0, COST) == compat.sample(IDS, 7, 40.0, COST)
    assert compat.sample(IDS, 7, 40.0, COST) != compat.sample(IDS, 8, 40.0, COST)
    assert compat.head_seed() > 0 and compat.head_seed() == compat.head_seed()


def test_the_committed_runs_give_each_file_an_estimate():
    cost = compat.seconds_per_test("2.11.0")
    assert set(compat.targets()) <= set(cost), sorted(set(compat.targets()) - set(cost))
    assert all(seconds > 0 for seconds in cost.values()), cost


@pytest.mark.parametrize("args, said", [
    (["--budget", "0"], "--budget must be a positive number of seconds, got 0"),
    (["--sample", "abc"], "--sample must be an int or HEAD, got 'abc'"),
    (["--share", "0"], "--share must be a number in (0, 1], got 0.0"),
    (["--share", "1.5"], "--share must be a number in (0, 1], got 1.5")])
def test_bad_options_are_refused(args, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        compat.main(args)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_ci_without_a_network_says_it_ran_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(compat, "ROOT", tmp_path)
    monkeypatch.setattr(compat, "pypi_reachable", lambda timeout=10.0: False)
    monkeypatch.setattr(compat, "install", lambda version: pytest.fail("must not install"))
    assert compat.main(["--ci"]) == 0
    assert "NOT RUN: pypi.org cannot be reached" in capsys.readouterr().out
