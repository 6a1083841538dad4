"""Every RINGCOLL_* setting is validated in one place (ringcoll.config) and refused early.

- Each bad value of each variable is a ValueError naming the variable, the value and what it
  accepts, at the first drop-in call (in real ranks, which then still agree on every later
  call) and at ``init_process_group("ringcoll")`` (through ``ringcoll.launch``, whose
  ClusterError used to say only "rank 0 died (exit code 1) during start").
- Booleans: false/off/no mean off (RINGCOLL_CHECK=false used to switch check mode on).
- RINGCOLL_DEBUG=1 means INFO (it used to crash with "Unknown level: '1'"); each line names
  its rank and RINGCOLL_DEBUG_RANKS keeps the named ranks' lines only.
- Settings follow os.environ between calls, and a persistent plan is not reused under
  changed settings.
- RINGCOLL_SEGMENT below its floor (4 KiB, RINGCOLL_SEGMENT_FLOOR) is refused: 1-byte
  segments used to be accepted (a 1 MiB ring all_reduce then took 37 s).
"""
from __future__ import annotations

import io
import logging
import os

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.api.common import persistent_plans
from ringcoll import config
from ringcoll.selection import checked_settings, forced_algorithms

#: (variable, bad value, words of what it accepts); each was accepted, or refused without
#: the variable's name, or refused only when first used deep inside a call, before
BAD = [
    ("RINGCOLL_DEBUG", "loud", "a level, DEBUG, INFO"),
    ("RINGCOLL_DEBUG", "7", "a level"),
    ("RINGCOLL_DEBUG_RANKS", "zero", "global ranks, comma-separated"),
    ("RINGCOLL_DEBUG_RANKS", "3-1", "global ranks"),
    ("RINGCOLL_CHECK", "maybe", "a boolean: 1, true, yes, on or 0, false, no, off"),
    ("RINGCOLL_CHECK", "2", "a boolean"),
    ("RINGCOLL_TIMEOUT", "abc", "a positive number of seconds"),
    ("RINGCOLL_TIMEOUT", "0", "a positive number of seconds"),
    ("RINGCOLL_TIMEOUT", "-1", "a positive number of seconds"),
    ("RINGCOLL_TIMEOUT", "inf", "a positive number of seconds"),
    ("RINGCOLL_WINDOW", "abc", "a positive integer"),
    ("RINGCOLL_WINDOW", "0", "a positive integer"),
    ("RINGCOLL_SEGMENT", "abc", "a positive integer"),
    ("RINGCOLL_SEGMENT", "0", "a positive integer"),
    ("RINGCOLL_SEGMENT", "1.5", "a positive integer"),
    ("RINGCOLL_SEGMENT", "1", "is below the floor of 4096 bytes"),
    ("RINGCOLL_SEGMENT", "4095", "is below the floor of 4096 bytes"),
    ("RINGCOLL_SEGMENT_FLOOR", "0", "a positive integer"),
    ("RINGCOLL_PERSISTENT_PLANS", "-1", "an integer >= 0"),
    ("RINGCOLL_PERSISTENT_PLANS", "many", "an integer >= 0"),
    ("RINGCOLL_LOCAL_SIZE", "two", "accepts a positive integer"),
    ("RINGCOLL_LOCAL_SIZE", "0", "accepts a positive integer"),
    ("RINGCOLL_MACHINE", "/nonexistent/machine.json", "cannot be read"),
    ("RINGCOLL_TUNING", "/nonexistent/table.csv", "cannot be read"),
    ("RINGCOLL_TRANSPORT", "fast", "one of auto, host, batched"),
    ("RINGCOLL_CUDA_TRANSPORT", "mpi", "one of nccl, gloo"),
    ("RINGCOLL_KERNELS", "fastest", "one of auto, cupy, numba, torch"),
    ("RINGCOLL_ALGO", "rign", "which no collective has"),
]


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*config.NAMES, *config.OTHER_NAMES):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    for name in (*config.NAMES, *config.OTHER_NAMES):
        monkeypatch.delenv(name, raising=False)
    config.settings()          # the logger back as RINGCOLL_DEBUG unset leaves it


def _message(error: BaseException) -> str:
    return str(error)


# -- unit: the parser ------------------------------------------------------------------------
@pytest.mark.parametrize("name,value,accepts", BAD)
def test_bad_value_names_variable_value_and_what_is_accepted(clean_env, name, value, accepts):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        checked_settings()          # what the group's creation and every call read
    text = str(caught.value)
    assert name in text and repr(value) in text or f"{name}={value}" in text, text
    assert accepts in text, text


def test_bad_files_are_read_when_set(clean_env, tmp_path):
    machine = tmp_path / "machine.json"
    machine.write_text("{alpha: 1}")
    clean_env.setenv("RINGCOLL_MACHINE", str(machine))
    with pytest.raises(ValueError, match=f"RINGCOLL_MACHINE={machine}: not a ringcoll.Machine JSON"):
        config.settings()
    clean_env.delenv("RINGCOLL_MACHINE")
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,3,0,10,rign\n")
    clean_env.setenv("RINGCOLL_TUNING", str(table))
    with pytest.raises(ValueError, match="RINGCOLL_TUNING=.*table.csv:2: all_reduce has no algorithm 'rign'"):
        checked_settings()
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,3,0,10,ring\n")
    assert checked_settings().tuning == str(table)          # the fixed file, seen by its new mtime
    clean_env.setenv("RINGCOLL_KERNEL_CACHE", str(table))
    with pytest.raises(ValueError, match="RINGCOLL_KERNEL_CACHE=.* accepts the path of a directory"):
        config.settings()


@pytest.mark.parametrize("word,on", [("false", False), ("off", False), ("no", False), ("0", False),
                                     ("", False), ("FALSE", False), ("1", True), ("true", True),
                                     ("On", True), ("yes", True)])
def test_check_booleans(clean_env, word, on):
    clean_env.setenv("RINGCOLL_CHECK", word)
    assert config.settings().check is on
    from ringcoll.runtime.identity import check_enabled as _check_enabled
    assert _check_enabled() is on


def test_torch_detail_still_switches_check_on(clean_env):
    clean_env.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    clean_env.setenv("RINGCOLL_CHECK", "off")
    assert config.settings().check is True
    clean_env.setenv("TORCH_DISTRIBUTED_DEBUG", "INFO")
    assert config.settings().check is False


@pytest.mark.parametrize("word,level", [("1", logging.INFO), ("on", logging.INFO), ("info", logging.INFO),
                                        ("DEBUG", logging.DEBUG), ("warning", logging.WARNING),
                                        ("0", None), ("off", None), ("", None)])
def test_debug_levels(clean_env, word, level):
    clean_env.setenv("RINGCOLL_DEBUG", word)
    assert config.settings().debug == level
    logger = logging.getLogger("ringcoll")
    assert logger.level == (level if level is not None else logging.NOTSET)


def test_values_parsed_and_followed_between_calls(clean_env):
    clean_env.setenv("RINGCOLL_SEGMENT", "4096")
    clean_env.setenv("RINGCOLL_WINDOW", "3")
    clean_env.setenv("RINGCOLL_TIMEOUT", "2.5")
    clean_env.setenv("RINGCOLL_DEBUG_RANKS", "0, 2-3")
    clean_env.setenv("RINGCOLL_ALGO", "all_reduce=rabenseifner, ring")
    first = config.settings()
    assert (first.segment, first.window, first.timeout) == (4096, 3, 2.5)
    assert first.debug_ranks == frozenset({0, 2, 3})
    forced = forced_algorithms(first)
    assert forced["all_reduce"] == "rabenseifner" and forced["all_gather"] == "ring"
    assert "broadcast" not in forced                # broadcast has no ring
    assert config.settings() is first               # same raw values: the same object, no parse
    assert ringcoll.get_timeout() == 2.5
    ringcoll.set_timeout(7)
    try:
        assert ringcoll.get_timeout() == 7          # set_timeout wins over RINGCOLL_TIMEOUT
    finally:
        ringcoll.set_timeout(None)
    clean_env.setenv("RINGCOLL_SEGMENT", "8192")
    second = config.settings()
    assert second is not first and second.segment == 8192
    from ringcoll.selection import segment_bytes
    assert segment_bytes("all_reduce", "ring") == 8192
    clean_env.setenv("LOCAL_WORLD_SIZE", "2")      # one node's count: never read as every node's
    assert config.settings().local_size is None
    clean_env.setenv("RINGCOLL_LOCAL_SIZE", "3")
    clean_env.setenv("GROUP_RANK", "1")
    assert (config.settings().local_size, config.settings().group_rank) == (3, "1")
    clean_env.setenv("GROUP_RANK", "node1")
    with pytest.raises(ValueError, match="GROUP_RANK='node1'.*integer >= 0"):
        config.settings()


def test_segment_below_the_floor_is_refused_naming_the_floor(clean_env):
    clean_env.setenv("RINGCOLL_SEGMENT", "4095")
    with pytest.raises(ValueError, match=r"RINGCOLL_SEGMENT='4095' is below the floor of 4096 bytes: "
                                         r"RINGCOLL_SEGMENT accepts an integer >= 4096 \(bytes per segment; "
                                         r".*RINGCOLL_SEGMENT_FLOOR lowers the floor"):
        config.settings()
    clean_env.setenv("RINGCOLL_SEGMENT", "4096")
    assert (config.settings().segment, config.settings().segment_floor) == (4096, config.SEGMENT_FLOOR)
    clean_env.setenv("RINGCOLL_SEGMENT_FLOOR", "8")              # tests of the pipelines on small data
    clean_env.setenv("RINGCOLL_SEGMENT", "8")
    assert config.settings().segment == 8
    clean_env.setenv("RINGCOLL_SEGMENT", "7")
    with pytest.raises(ValueError, match="RINGCOLL_SEGMENT='7' is below the floor of 8 bytes"):
        config.settings()


def test_import_never_fails_on_a_bad_value(clean_env):
    import subprocess
    import sys

    env = dict(os.environ, RINGCOLL_DEBUG="loud", RINGCOLL_TIMEOUT="abc", RINGCOLL_PERSISTENT_PLANS="x")
    done = subprocess.run([sys.executable, "-c", "import ringcoll"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# -- real ranks: the first drop-in call refuses, the group stays usable -------------------------
def refused_in_ranks(bad: list) -> list:
    """Each bad setting in turn, then a correct all_reduce: the messages, the sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    messages = []
    floor = os.environ.pop("RINGCOLL_SEGMENT_FLOOR", None)    # lowered for the schedule tests' session
    for name, value, _ in bad:
        os.environ[name] = value
        try:
            ringcoll.all_reduce(torch.full((5,), rank + 1, dtype=torch.int64))
            messages.append(None)
        except ValueError as error:
            messages.append(str(error))
        finally:
            del os.environ[name]
    if floor is not None:
        os.environ["RINGCOLL_SEGMENT_FLOOR"] = floor
    tensor = torch.arange(7, dtype=torch.int64) + rank
    ringcoll.all_reduce(tensor)
    expected = torch.arange(7, dtype=torch.int64) * world + world * (world - 1) // 2
    return messages, torch.equal(tensor, expected)


def test_first_drop_in_call_refuses_each_bad_value(clusters):
    for messages, right in clusters(3).run(refused_in_ranks, BAD):
        assert right
        for (name, value, accepts), message in zip(BAD, messages):
            assert message is not None, f"{name}={value} was accepted"
            assert name in message and value in message and accepts in message, message


def debug_lines(ranks: str) -> str:
    """One all_reduce with RINGCOLL_DEBUG=1 and RINGCOLL_DEBUG_RANKS=ranks; this rank's log."""
    os.environ["RINGCOLL_DEBUG"], os.environ["RINGCOLL_DEBUG_RANKS"] = "1", ranks
    try:
        config.settings()
        stream = io.StringIO()
        config._handler.setStream(stream)
        ringcoll.all_reduce(torch.ones(3, dtype=torch.int64) * 2, algorithm="ring")
        return stream.getvalue()
    finally:
        del os.environ["RINGCOLL_DEBUG"], os.environ["RINGCOLL_DEBUG_RANKS"]
        config.settings()


def test_debug_one_logs_at_info_with_the_rank_and_the_rank_filter(clusters):
    logs = clusters(3).run(debug_lines, "0,2")
    for rank, text in enumerate(logs):
        if rank == 1:
            assert text == ""
        else:
            assert text.startswith(f"ringcoll [rank {rank}] INFO: all_reduce/ring 3xint64 SUM: world 3, "
                                   f"rank {rank} -> ring"), text
    logs = clusters(3).run(debug_lines, "all")
    assert all(f"[rank {rank}] INFO" in text for rank, text in enumerate(logs)), logs


def plans_under_changed_settings() -> tuple:
    from ringcoll.api.common import group_executor

    tensor = torch.ones(4, dtype=torch.int64)
    executor = group_executor(None)
    persistent_plans(executor).clear()
    ringcoll.broadcast(tensor, src=0)
    ringcoll.broadcast(tensor, src=0)
    kept = len(persistent_plans(executor))
    os.environ["RINGCOLL_SEGMENT"] = "65536"
    try:
        ringcoll.broadcast(tensor, src=0)
        changed = len(persistent_plans(executor))
    finally:
        del os.environ["RINGCOLL_SEGMENT"]
    ringcoll.broadcast(tensor, src=0)
    return kept, changed, len(persistent_plans(executor)), tensor.tolist()


def test_changed_settings_build_a_new_plan(clusters):
    for kept, changed, back, values in clusters(3).run(plans_under_changed_settings):
        assert (kept, changed, back) == (1, 2, 2) and values == [1, 1, 1, 1]


# -- init_process_group("ringcoll") and the launcher -------------------------------------------
@pytest.mark.parametrize("name,value,accepts", [("RINGCOLL_TIMEOUT", "abc", "a positive number of seconds"),
                                                ("RINGCOLL_WINDOW", "0", "a positive integer")])
def test_init_process_group_refuses_and_launch_shows_the_rank_error(name, value, accepts):
    with pytest.raises(ValueError) as caught:
        with ringcoll.launch(2, "ringcoll", threads=1, timeout=60, start_timeout=120, env={name: value}):
            pass
    text = str(caught.value)
    assert name in text and value in text and accepts in text, text
    assert "rank 0" in str(caught.value.__cause__) and "create" in str(caught.value.__cause__)


def settings_reads_per_call():
    """How many times one drop-in call of each kind reads the checked settings (auto and a
    named algorithm, a fresh plan each: persistent plans off), once auto's model has priced
    its candidates (a cold decision builds their plans: the pricer's own reads)."""
    from ringcoll import selection
    from ringcoll.api import common

    counts, original = [], selection.checked_settings

    def counting():
        counts[-1] += 1
        return original()

    os.environ["RINGCOLL_PERSISTENT_PLANS"] = "0"
    ringcoll.all_gather_single(torch.empty(15, dtype=torch.int64), torch.arange(5))      # auto's model, warm
    common.checked_settings, selection.checked_settings = counting, counting
    try:
        for algorithm in ("auto", "ring"):
            counts.append(0)
            ringcoll.all_reduce(torch.arange(5) + dist.get_rank(), algorithm=algorithm)
            counts.append(0)
            ringcoll.all_gather_single(torch.empty(15, dtype=torch.int64), torch.arange(5), algorithm=algorithm)
    finally:
        common.checked_settings = selection.checked_settings = original
        del os.environ["RINGCOLL_PERSISTENT_PLANS"]
    return counts


def test_a_drop_in_call_reads_its_settings_once(clusters):
    """The settings a call checks at its entry are the ones its algorithm is chosen by (the
    old path read them again in choose)."""
    for counts in clusters(3).run(settings_reads_per_call):
        assert counts == [1, 1, 1, 1], counts
