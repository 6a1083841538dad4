"""Settings every rank of a group must share are compared once per group (issue #40, finding 3).

The bug this guards against: ``RINGCOLL_SEGMENT`` set differently on two ranks (one host's
environment differs) killed a rank with SIGABRT inside gloo within 2 s, even with
``RINGCOLL_CHECK=1``; check mode on some ranks only, or mixed transports, showed only as a plain
timeout. Now each rank's record in the group's placement exchange (ringcoll.runtime.nodes) carries
the settings that change which messages go where, and ``agreed_placement`` raises the same
ValueError on every rank, naming each such setting and every rank's value.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll.runtime.nodes import (RECORD, SHARED_SETTINGS, Facts, agreed_placement, file_setting, own_facts,
                                    pack_facts, shared_setting, unpack_facts)

#: every shared setting unset: what a rank with a plain environment contributes
PLAIN = {"RINGCOLL_SEGMENT": "", "RINGCOLL_TRANSPORT": "auto", "RINGCOLL_CHECK": "off", "RINGCOLL_ALGO": "",
         "RINGCOLL_TUNING": None, "RINGCOLL_MACHINE": None, "RINGCOLL_CUDA_TRANSPORT": "nccl"}


def shared(**changed):
    """A rank's shared settings: PLAIN with ``changed`` (names without the RINGCOLL_ prefix;
    files as (path, content))."""
    values = dict(PLAIN, **{f"RINGCOLL_{name.upper()}": value for name, value in changed.items()})
    out = []
    for name in SHARED_SETTINGS:
        value = values[name]
        if name in ("RINGCOLL_TUNING", "RINGCOLL_MACHINE"):
            out.append(file_setting(*(value or (None, None))))
        else:
            out.append(shared_setting(value))
    return tuple(out)


def ranks(*settings, host="a"):
    """Facts of one rank per entry of ``settings`` (each a dict for :func:`shared`)."""
    return [Facts(rank, "", "", host, shared(**one)) for rank, one in enumerate(settings)]


def refusal(facts) -> str:
    with pytest.raises(ValueError) as caught:
        agreed_placement(facts)
    text = str(caught.value)
    assert text.startswith("settings that change which messages go where must be the same on every rank "
                           "of the group, got "), text
    return text


# -- the comparison (pure) ------------------------------------------------------------------------
def test_equal_settings_agree_and_the_placement_is_derived_as_before():
    facts = ranks({"segment": "65536", "check": "on"}, {"segment": "65536", "check": "on"},
                  {"segment": "65536", "check": "on"})
    assert agreed_placement(facts) == ((0, 0, 0), "hostnames")


def test_a_differing_segment_names_the_setting_and_each_ranks_value():
    text = refusal(ranks({"segment": "65536"}, {"segment": "65536"}, {"segment": "131072"}, {}))
    assert "RINGCOLL_SEGMENT: '65536' on ranks [0, 1], '131072' on rank [2], unset on rank [3] (group ranks)" in text
    assert not any(name in text for name in SHARED_SETTINGS if name != "RINGCOLL_SEGMENT"), text


def test_every_differing_setting_is_named_in_one_error():
    text = refusal(ranks({"transport": "host", "check": "on"}, {"transport": "streamed", "check": "off"},
                         {"transport": "host", "check": "on", "algo": "ring", "cuda_transport": "gloo"}))
    assert ("RINGCOLL_TRANSPORT: 'host' on ranks [0, 2], 'streamed' on rank [1]; "
            "RINGCOLL_CHECK: 'on' on ranks [0, 2], 'off' on rank [1]; "
            "RINGCOLL_ALGO: unset on ranks [0, 1], 'ring' on rank [2]; "
            "RINGCOLL_CUDA_TRANSPORT: 'nccl' on ranks [0, 1], 'gloo' on rank [2] (group ranks)") in text, text
    assert "RINGCOLL_SEGMENT" not in text


def test_files_compare_by_content_not_path():
    same = ranks({"tuning": ("/a/t.csv", b"collective,nranks\n")}, {"tuning": ("/b/t.csv", b"collective,nranks\n")})
    assert agreed_placement(same) == ((0, 0), "hostnames")
    text = refusal(ranks({"machine": ("/x/m.json", b'{"alpha": 1}')}, {"machine": ("/x/m.json", b'{"alpha": 2}')}))
    assert "RINGCOLL_MACHINE: 'm.json (content " in text and text.count("m.json (content ") == 2, text
    text = refusal(ranks({"tuning": ("/a/t.csv", b"rows\n")}, {}))
    assert "RINGCOLL_TUNING: 't.csv (content " in text and "unset on rank [1]" in text, text


def test_long_values_that_differ_past_the_cut_still_look_different():
    head = "all_reduce=ring," * 4
    text = refusal(ranks({"algo": head + "broadcast=binomial"}, {"algo": head + "broadcast=pipelined_chain"}))
    shown = text.split("RINGCOLL_ALGO: ")[1]
    first, second = shown.split(" on rank [0], ")
    assert first != second.split(" on rank [1]")[0], text


def test_the_record_carries_the_shared_settings():
    facts = Facts(5, "2", "1", "node-7", shared(segment="65536", check="on", tuning=("/t.csv", b"x")))
    assert len(pack_facts(facts)) == RECORD.size
    assert unpack_facts(pack_facts(facts)) == facts
    # facts made by hand, without shared settings, travel too and are not compared
    assert len(unpack_facts(pack_facts(Facts(0, "", "", "a"))).shared) == len(SHARED_SETTINGS)


class _Executor:
    """What own_facts reads of an executor: its ranks and the transport and check mode it was made with."""
    global_ranks, rank = [4, 9], 1
    transport_mode, check = "batched", True


def test_own_facts_reads_the_executors_transport_and_check_and_the_environment(monkeypatch, tmp_path):
    for name in SHARED_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RINGCOLL_SEGMENT", "65536")
    monkeypatch.setenv("RINGCOLL_ALGO", "all_reduce=ring")
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,2,0,10,ring\n")
    monkeypatch.setenv("RINGCOLL_TUNING", str(table))
    facts = own_facts(_Executor())
    values = dict(zip(SHARED_SETTINGS, (one.shown for one in facts.shared)))
    assert facts.global_rank == 9
    assert values["RINGCOLL_SEGMENT"] == "65536" and values["RINGCOLL_ALGO"] == "all_reduce=ring"
    assert (values["RINGCOLL_TRANSPORT"], values["RINGCOLL_CHECK"]) == ("batched", "on")   # the executor's
    assert values["RINGCOLL_TUNING"].startswith("table.csv (content ")
    before = facts.shared[SHARED_SETTINGS.index("RINGCOLL_TUNING")].key
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,2,0,10,rabenseifner\n")
    os.utime(table, ns=(1, 1))                    # another mtime, whatever the clock's resolution
    after = own_facts(_Executor()).shared[SHARED_SETTINGS.index("RINGCOLL_TUNING")].key
    assert after != before                        # the file's content, read again when it changed


# -- real gloo ranks ------------------------------------------------------------------------------
def _differing(name: str, values: dict, backend: str):
    """``name`` set to ``values[rank]`` (None: unset) in this rank, a fresh group of ``backend``
    made under it, and an all_reduce on it (the drop-in on a gloo group, dist.* on a "ringcoll"
    group): the error it raised (type, message); then, with the setting back as it was on every
    rank, a fresh group's all_reduce, whose result is returned."""
    rank, _world = dist.get_rank(), dist.get_world_size()
    saved = os.environ.get(name)
    value = values.get(rank)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        group = dist.new_group(backend=backend)
        # 512 KiB: ring segments of 64 and 128 KiB differ (the schedules too, before: SIGABRT)
        tensor = torch.arange(1 << 16, dtype=torch.int64) + rank + 1
        try:
            if backend == "ringcoll":
                dist.all_reduce(tensor, group=group)
            else:
                ringcoll.all_reduce(tensor, group=group, algorithm="ring")
            error = None
        except Exception as raised:  # noqa: BLE001 - reported to the test
            error = (type(raised).__name__, str(raised))
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
    group = dist.new_group(backend=backend)
    tensor = torch.arange(4, dtype=torch.int64) + rank + 1
    if backend == "ringcoll":
        dist.all_reduce(tensor, group=group)
    else:
        ringcoll.all_reduce(tensor, group=group)
    return error, tensor.tolist()


def _check_refused(answers, *shown):
    world = len(answers)
    errors = [error for error, _ in answers]
    assert errors[0] is not None and errors == [errors[0]] * world, errors       # the same on every rank
    kind, message = errors[0]
    assert kind == "ValueError", errors[0]
    assert "must be the same on every rank of the group" in message, message
    for words in shown:
        assert words in message, message
    want = [world * (i + 1) + world * (world - 1) // 2 for i in range(4)]
    for rank, (_, total) in enumerate(answers):        # the job goes on once the setting agrees
        assert total == want, rank


@pytest.mark.parametrize("backend", ["gloo", "ringcoll"])
def test_a_segment_set_differently_per_rank_is_a_value_error_on_every_rank(clusters, backend):
    """Before: SIGABRT inside gloo within 2 s (the ranks' schedules differ)."""
    answers = clusters(2).run(_differing, "RINGCOLL_SEGMENT", {0: "65536", 1: "131072"}, backend)
    _check_refused(answers, "RINGCOLL_SEGMENT: '65536' on rank [0], '131072' on rank [1]")


def test_check_mode_on_some_ranks_only_is_a_value_error_on_every_rank(clusters):
    """Before: a plain timeout (the checking ranks wait for a fingerprint exchange)."""
    answers = clusters(2).run(_differing, "RINGCOLL_CHECK", {0: "1"}, "gloo")
    _check_refused(answers, "RINGCOLL_CHECK: 'on' on rank [0], 'off' on rank [1]")


def test_mixed_transports_are_a_value_error_on_every_rank(clusters):
    """Before: host on one rank and streamed on another hung past 200 s with a 15 s timeout. The
    records meet in the group's store, whatever the transports."""
    answers = clusters(2).run(_differing, "RINGCOLL_TRANSPORT", {0: "host", 1: "streamed"}, "gloo")
    _check_refused(answers, "RINGCOLL_TRANSPORT: 'host' on rank [0], 'streamed' on rank [1]")
