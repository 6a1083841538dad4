"""tools/compat.py without running it: its plan names tests that exist, it reads pytest's
JUnit report into counts, and a failure's line says the exception and where it was raised."""
from __future__ import annotations

import re
from pathlib import Path

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
