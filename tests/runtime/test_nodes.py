"""Placements (the node of each rank) agreed by every rank of a group (ringcoll.runtime.nodes), uneven nodes included.

The bug this guards against: each rank grouped the world by its own torchrun
LOCAL_WORLD_SIZE, so with ``--nproc-per-node 3`` on one node and ``1`` on another ranks 0-2 saw
nodes (0, 0, 0, 1) and rank 3 (0, 1, 2, 3), and every hierarchical call hung or tore the job
down. Now the ranks exchange their facts once per group and derive one layout.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import group_timeouts, ringcoll_log
from ringcoll.api.common import Context
from ringcoll.runtime.nodes import Facts, agreed, agreed_placement, describe_placement

HERE = os.path.dirname(os.path.abspath(__file__))


# -- the derivation from gathered facts (pure) -------------------------------------------------
def facts(hosts, local_sizes=None, group_ranks=None, global_ranks=None):
    world = len(hosts)
    return [Facts(global_ranks[r] if global_ranks else r, (local_sizes or [""] * world)[r],
                  (group_ranks or [""] * world)[r], hosts[r]) for r in range(world)]


def test_precedence_local_size_then_group_rank_then_hostnames():
    hosts = ["a", "a", "a", "b", "c"]
    assert agreed_placement(facts(hosts)) == ((0, 0, 0, 1, 2), "hostnames")
    by_node_rank = facts(hosts, group_ranks=["1", "1", "0", "0", "2"])
    assert agreed_placement(by_node_rank) == ((0, 0, 1, 1, 2), "torchrun's GROUP_RANK")
    both = facts(hosts, local_sizes=["2"] * 5, group_ranks=["1", "1", "0", "0", "2"])
    assert agreed_placement(both) == ((0, 0, 1, 1, 2), "RINGCOLL_LOCAL_SIZE=2")
    # a sub-group's nodes come from its members' global ranks: 1 // 2, 2 // 2, 3 // 2
    assert agreed_placement(facts(["a"] * 3, ["2"] * 3, global_ranks=[1, 2, 3])) == ((0, 1, 1), "RINGCOLL_LOCAL_SIZE=2")


@pytest.mark.parametrize("local_sizes,shown", [
    (["2", "2", "3", "3"], "'2' on ranks [0, 1], '3' on ranks [2, 3]"),
    (["2", "2", "2", ""], "'2' on ranks [0, 1, 2], unset on rank [3]"),
])
def test_disagreeing_local_size_is_refused(local_sizes, shown):
    with pytest.raises(ValueError, match=r"RINGCOLL_LOCAL_SIZE must be the same on every rank of the group "
                                         r".*got " + shown.replace("[", r"\[").replace("]", r"\]")):
        agreed_placement(facts(["a"] * 4, local_sizes))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="RINGCOLL_LOCAL_SIZE='two' is not valid: RINGCOLL_LOCAL_SIZE accepts a positive integer \\(ranks per node\\)"):
        agreed_placement(facts(["a"] * 3, ["two"] * 3))
    with pytest.raises(ValueError, match="RINGCOLL_LOCAL_SIZE='0' is not valid: RINGCOLL_LOCAL_SIZE accepts a positive integer \\(ranks per node\\)"):
        agreed_placement(facts(["a"] * 3, ["0"] * 3))
    with pytest.raises(ValueError, match=r"GROUP_RANK .* must be set on every rank of the group or on none, "
                                         r"got '0' on ranks \[0, 1\], unset on rank \[2\]"):
        agreed_placement(facts(["a"] * 3, group_ranks=["0", "0", ""]))


def test_describe_layout():
    assert describe_placement((0, 0, 0, 1)) == "2 nodes of 3+1 ranks (0, 0, 0, 1)"
    assert describe_placement((0, 1, 0, 1)) == "2 nodes of 2 ranks (0, 1, 0, 1)"
    assert describe_placement((0,)) == "1 node of 1 rank (0,)"
    assert describe_placement(tuple(r // 8 for r in range(64))) == "8 nodes of 8 ranks"


def test_simulator_log_names_layout_and_source(monkeypatch, caplog):
    monkeypatch.delenv("RINGCOLL_LOCAL_SIZE", raising=False)
    with caplog.at_level("INFO", logger="ringcoll"):
        ringcoll.simulate("all_reduce", "hierarchical", 5, numel=7, local_size=(0, 0, 0, 1, 2))
        monkeypatch.setenv("RINGCOLL_LOCAL_SIZE", "2")
        ringcoll.simulate("broadcast", "hierarchical", 3, numel=7)
    lines = [r.getMessage() for r in caplog.records if "rank 0 -> hierarchical" in r.getMessage()]
    assert "3 nodes of 3+1+1 ranks (0, 0, 0, 1, 2) from simulate's local_size" in lines[0]
    assert "2 nodes of 2+1 ranks (0, 0, 1) from RINGCOLL_LOCAL_SIZE=2" in lines[1]


class _Echo:
    """Rank 0 of two on a raw group whose peer echoes what rank 0 sends (its facts too)."""

    class _Done:
        def __init__(self, then=None):
            self._then = then

        def wait(self, *args):
            if self._then is not None:
                self._then()
            return True

        def is_completed(self):
            return True

    def __init__(self):
        self.sent: list = []

    def send(self, tensors, peer, tag):
        self.sent.append(tensors[0].clone())
        return self._Done()

    def recv(self, tensors, peer, tag):
        return self._Done(lambda: tensors[0].copy_(self.sent.pop(0)))


def test_plan_building_reads_the_layout_its_entry_resolved_and_never_exchanges(monkeypatch):
    """The layout is agreed at the call's entry (executor_context: one exchange, at the group's
    first collective call) and carried in the context; building a node-aware plan, and auto's
    model deciding, only read it. Before, the builder asked group_placement, which exchanged at
    the group's first node-aware call."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import executor_context
    from ringcoll.runtime import nodes
    from ringcoll.runtime.executor import P2PExecutor

    for name in ("RINGCOLL_LOCAL_SIZE", "GROUP_RANK", "RINGCOLL_TRANSPORT", "RINGCOLL_CHECK", "RINGCOLL_ALGO"):
        monkeypatch.delenv(name, raising=False)
    exchanges = []
    original = nodes._all_gather_records
    monkeypatch.setattr(nodes, "_all_gather_records", lambda *args: exchanges.append(1) or original(*args))
    executor = P2PExecutor(_Echo(), rank=0, world=2, backend="gloo")
    ctx = executor_context(executor)
    assert exchanges == [1] and (ctx.nodes, ctx.nodes_from) == ((0, 0), "hostnames")
    assert executor_context(executor).nodes == (0, 0) and exchanges == [1]     # once per group

    def refuse(*args, **kwargs):
        raise AssertionError("plan building asked for the group's placement")

    monkeypatch.setattr(nodes, "group_placement", refuse)
    monkeypatch.setattr(nodes, "_all_gather_records", refuse)
    plan = BUILDERS["all_reduce"](ctx, torch.arange(1, 8, dtype=torch.int64), algorithm="hierarchical")
    assert plan.layout.params["nodes"] == (0, 0) and "from hostnames" in plan.why
    machine = ringcoll.Machine(ranks_per_node=1, inter_alpha=1e-4, inter_beta=1e-8)    # the model decides
    ctx.machine = machine
    assert BUILDERS["all_reduce"](ctx, torch.ones(1 << 16), algorithm="auto") is not None
    # a context on a group that skipped its entry has no layout: refused, never exchanged
    with pytest.raises(RuntimeError, match="builds its plan with the placement its entry resolved"):
        BUILDERS["all_reduce"](Context(0, 2, executor, 5), torch.ones(4), algorithm="hierarchical")


# -- real gloo ranks ----------------------------------------------------------------------------
def _hierarchical_sum(group=None) -> list:
    rank = dist.get_rank()
    tensor = torch.arange(5, dtype=torch.int64) * 3 + rank + 1
    want = tensor.clone()
    ringcoll.all_reduce(tensor, group=group, algorithm="hierarchical")
    dist.all_reduce(want, group=group)
    return tensor.tolist() if torch.equal(tensor, want) else ["differs", tensor.tolist(), want.tolist()]


def disagreeing_local_size():
    """RINGCOLL_LOCAL_SIZE 2 on ranks 0-1, 3 on ranks 2-3: the error each rank raises; then,
    with the setting removed everywhere, a hierarchical call on the same group."""
    from ringcoll.api.common import group_executor
    from ringcoll.runtime.nodes import group_placement

    rank = dist.get_rank()
    os.environ["RINGCOLL_LOCAL_SIZE"] = "2" if rank < 2 else "3"
    try:
        ringcoll.all_reduce(torch.ones(6, dtype=torch.int64), algorithm="hierarchical")
        error = None
    except ValueError as refused:
        error = str(refused)
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE")
    return error, _hierarchical_sum(), group_placement(group_executor(None))


def test_disagreeing_local_size_is_refused_on_every_rank(clusters):
    answers = clusters(4).run(disagreeing_local_size)
    errors = [error for error, _, _ in answers]
    assert errors[0] is not None and errors == [errors[0]] * 4, errors
    assert "RINGCOLL_LOCAL_SIZE must be the same on every rank of the group" in errors[0]
    assert "'2' on ranks [0, 1], '3' on ranks [2, 3]" in errors[0]
    for rank, (_, total, layout) in enumerate(answers):       # the group goes on, agreed again
        assert total == [10 + 12 * i for i in range(5)], rank
        assert layout == ((0, 0, 0, 0), "hostnames"), rank


def layout_sources():
    """Each source of a group's placement on the default group (group_placement, as every rank
    calls it at one point), and LOCAL_WORLD_SIZE alone, which must not count."""
    from ringcoll.api.common import group_executor
    from ringcoll.runtime.nodes import group_placement

    rank, executor = dist.get_rank(), group_executor(None)
    found = {"hostnames": group_placement(executor)}
    os.environ["LOCAL_WORLD_SIZE"] = "3" if rank < 3 else "1"        # torchrun's 3 + 1
    found["LOCAL_WORLD_SIZE alone"] = group_placement(executor)
    os.environ["GROUP_RANK"] = "0" if rank < 3 else "1"
    found["GROUP_RANK"] = group_placement(executor)
    found["sum on GROUP_RANK"] = _hierarchical_sum()
    os.environ["RINGCOLL_LOCAL_SIZE"] = "2"
    found["RINGCOLL_LOCAL_SIZE"] = group_placement(executor)
    found["sum on RINGCOLL_LOCAL_SIZE"] = _hierarchical_sum()
    for name in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "RINGCOLL_LOCAL_SIZE"):
        os.environ.pop(name)
    return found


def test_layout_sources_on_a_group(clusters):
    total = [10 + 12 * i for i in range(5)]
    for rank, found in enumerate(clusters(4).run(layout_sources)):
        assert found == {"hostnames": ((0, 0, 0, 0), "hostnames"),
                         "LOCAL_WORLD_SIZE alone": ((0, 0, 0, 0), "hostnames"),
                         "GROUP_RANK": ((0, 0, 0, 1), "torchrun's GROUP_RANK"), "sum on GROUP_RANK": total,
                         "RINGCOLL_LOCAL_SIZE": ((0, 0, 1, 1), "RINGCOLL_LOCAL_SIZE=2"),
                         "sum on RINGCOLL_LOCAL_SIZE": total}, rank


def raw_backend_layouts():
    """A ringcoll-backend sub-group of global ranks 1, 2, 3: its executor runs on a raw gloo
    group that torch.distributed does not know. Its layout from GROUP_RANK (node rank
    r // 2) and from RINGCOLL_LOCAL_SIZE=2 (global rank // 2), after hierarchical calls
    through torch's own all_reduce on the group, and the logged lines."""
    from ringcoll.runtime.nodes import group_placement

    rank = dist.get_rank()
    group = dist.new_group([1, 2, 3], backend="ringcoll", pg_options=ringcoll.Options(all_reduce="hierarchical"))
    records: list = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("ringcoll")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    found = {}
    try:
        for name, value in (("GROUP_RANK", str(rank // 2)), ("RINGCOLL_LOCAL_SIZE", "2")):
            os.environ[name] = value
            if rank != 0:
                tensor = torch.arange(4, dtype=torch.int64) + 10 * rank
                dist.all_reduce(tensor, group=group)
                assert tensor.tolist() == [60 + 3 * i for i in range(4)], tensor
                found[name] = group_placement(group.executor(torch.device("cpu")))
    finally:
        os.environ.pop("GROUP_RANK", None)
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
        logger.removeHandler(handler)
        logger.setLevel(level)
        dist.destroy_process_group(group)
    return found, [line for line in records if "-> hierarchical" in line]


def test_raw_backend_group_gets_the_agreed_layout(clusters):
    answers = clusters(4).run(raw_backend_layouts)
    assert answers[0] == ({}, [])
    for rank, (found, lines) in enumerate(answers[1:], 1):
        assert found == {"GROUP_RANK": ((0, 1, 1), "torchrun's GROUP_RANK"),
                         "RINGCOLL_LOCAL_SIZE": ((0, 1, 1), "RINGCOLL_LOCAL_SIZE=2")}, rank
        assert "2 nodes of 1+2 ranks (0, 1, 1) from torchrun's GROUP_RANK" in lines[0], lines
        assert "2 nodes of 1+2 ranks (0, 1, 1) from RINGCOLL_LOCAL_SIZE=2" in lines[1], lines


def one_exchange_per_group_at_its_first_collective_call():
    """RINGCOLL_LOCAL_SIZE=2 on every rank. A "ringcoll"-backend group: point-to-point calls
    (not every rank makes them) and barriers (which need no layout) exchange nothing; its first
    other collective call (torch's
    all_reduce, the backend path, node-aware by Options) agrees the layout with one exchange;
    the drop-in path's hierarchical all_reduce on the same group reads the same layout with
    none; a plain gloo group's first drop-in call, a binomial broadcast, makes its one
    exchange, its hierarchical and auto calls none. The exchanges counted, each one's seconds,
    the sums, the layouts kept and the hierarchical calls' log lines."""
    from ringcoll.runtime import nodes

    rank = dist.get_rank()
    counted: list = []
    original = nodes._all_gather_records

    def counting(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            counted.append(time.perf_counter() - start)

    nodes._all_gather_records = counting
    os.environ["RINGCOLL_LOCAL_SIZE"] = "2"
    out = {}
    group = gloo = None
    try:
        group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(all_reduce="hierarchical"))
        gloo = dist.new_group(backend="gloo")
        with ringcoll_log() as records:
            token = torch.tensor([rank + 1])
            if rank == 0:
                dist.send(token, 1, group=group)
            elif rank == 1:
                dist.recv(token, 0, group=group)
            out["p2p"] = (len(counted), token.tolist())
            dist.barrier(group=group)                   # a barrier needs no layout: none either
            ringcoll.barrier(group=gloo)
            out["barriers"] = len(counted)
            backend = torch.arange(5, dtype=torch.int64) * 3 + rank
            dist.all_reduce(backend, group=group)
            out["backend"] = len(counted)
            drop_in = torch.arange(5, dtype=torch.int64) * 3 + rank
            ringcoll.all_reduce(drop_in, group=group, algorithm="hierarchical")
            out["drop_in"] = len(counted)
            out["sums"] = (backend.tolist(), drop_in.tolist())
            out["kept"] = (agreed(group.executor(torch.device("cpu"))), agreed(group_executor_of(group)))
            ringcoll.broadcast(torch.ones(3), src=0, group=gloo, algorithm="binomial")
            out["gloo_first"] = len(counted)
            ringcoll.all_reduce(torch.ones(9), group=gloo, algorithm="hierarchical")
            ringcoll.all_reduce(torch.ones(1 << 12), group=gloo)
            out["gloo_later"] = len(counted)
    finally:
        nodes._all_gather_records = original
        os.environ.pop("RINGCOLL_LOCAL_SIZE")
        for made in (group, gloo):
            if made is not None:
                dist.destroy_process_group(made)
    out["seconds"] = counted
    out["lines"] = [line for line in records if "-> hierarchical" in line]
    return out


def test_one_exchange_per_group_at_its_first_collective_call_and_one_layout_for_both_paths(clusters):
    layout = ((0, 0, 1, 1), "RINGCOLL_LOCAL_SIZE=2")
    total = [6 + 12 * i for i in range(5)]
    for rank, out in enumerate(clusters(4).run(one_exchange_per_group_at_its_first_collective_call)):
        assert out["p2p"] == (0, [1 if rank < 2 else rank + 1]) and out["barriers"] == 0, (rank, out)
        assert (out["backend"], out["drop_in"], out["gloo_first"], out["gloo_later"]) == (1, 1, 2, 2), (rank, out)
        assert out["sums"] == (total, total) and out["kept"] == (layout, layout), (rank, out)
        assert len(out["lines"]) >= 3, out["lines"]          # the backend, the drop-in, gloo (auto may add one)
        for line in out["lines"]:
            assert "2 nodes of 2 ranks (0, 0, 1, 1) from RINGCOLL_LOCAL_SIZE=2" in line, line
        print(f"rank {rank}: placement exchanges took {[round(s * 1e3, 2) for s in out['seconds']]} ms")


# -- real torchrun launches on localhost, one per node ------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("per_node,rendezvous,layouts", [
    ((3, 1), "static", [[0, 0, 0, 1]]),
    ((2, 1, 1), "static", [[0, 0, 1, 2]]),
    # c10d numbers the nodes in the order they join: the 3-rank node first or second
    ((3, 1), "c10d", [[0, 0, 0, 1], [0, 1, 1, 1]]),
])
def test_uneven_nodes_under_torchrun(tmp_path, per_node, rendezvous, layouts):
    """One torchrun launch per emulated node, each with its own ``--nproc-per-node`` (a
    static rendezvous, where ``--node-rank`` is the node's GROUP_RANK, or c10d's); every rank
    checks every node-aware algorithm and auto against the built-ins (tests/runtime/nodes_rank.py)
    and reports its layout, the same on every rank."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RINGCOLL_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "RINGCOLL_ALGO")}
    env.update(RINGCOLL_TIMEOUT="15", OMP_NUM_THREADS="1")
    port = _free_port()

    def where(node: int) -> list:
        if rendezvous == "static":
            return ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tmp_path.name]

    launches = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(per_node)), *where(node),
         "--nproc-per-node", str(count), os.path.join(HERE, "nodes_rank.py"), str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node, count in enumerate(per_node)]
    deadline = time.monotonic() + 90
    try:
        logs = [launch.communicate(timeout=max(deadline - time.monotonic(), 1))[0] for launch in launches]
    finally:
        for launch in launches:
            if launch.poll() is None:
                launch.kill()
                launch.wait()
    world = sum(per_node)
    reports = [tmp_path / f"rank{rank}.json" for rank in range(world)]
    assert all(r.exists() for r in reports), "\n".join(log[-3000:] for log in logs)
    found = [json.loads(report.read_text()) for report in reports]
    for rank, mine in enumerate(found):
        assert mine["problems"] == [], f"rank {rank}: {mine['problems'][:4]}"
        assert mine["layout"] in layouts and mine["source"] == "torchrun's GROUP_RANK", (rank, mine)
        assert mine["layout"] == found[0]["layout"], f"rank {rank} disagrees with rank 0: {mine['layout']}"
    assert all(launch.returncode == 0 for launch in launches), "\n".join(log[-3000:] for log in logs)


def exchange_behind_queued_calls():
    """The placement exchange of a fresh group's first collective call runs in call order, after
    an async call still queued on the default group; a ringcoll-backend group's first call
    is a sparse all_reduce (its entry resolves the layout; it builds its all_gather plans on
    the queue's worker thread, reading it). Each rank's results and layouts."""
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["GROUP_RANK"] = str(rank // 2)
    group = dist.new_group(list(range(world)))
    sparse_group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(all_gather="hierarchical"))
    try:
        first = torch.full((3000,), rank + 1, dtype=torch.int64)
        second = torch.arange(7, dtype=torch.int64) + rank
        pending = ringcoll.all_reduce(first, algorithm="ring", async_op=True)
        last = ringcoll.all_reduce(second, group=group, algorithm="hierarchical", async_op=True)
        pending.wait()
        last.wait()
        sparse = torch.sparse_coo_tensor([[rank, world]], [rank + 1, 10], (world + 1,))
        dist.all_reduce(sparse, group=sparse_group)
        # what the calls themselves agreed on, kept for each group
        found = (first[:2].tolist(), second.tolist(), sparse.to_dense().tolist(),
                 agreed(group_executor_of(group)),
                 agreed(sparse_group.executor(torch.device("cpu"))))
    finally:
        os.environ.pop("GROUP_RANK")
        dist.destroy_process_group(sparse_group)
        dist.destroy_process_group(group)
    return found


def group_executor_of(group):
    from ringcoll.api.common import group_executor

    return group_executor(group)


def test_exchange_runs_in_call_order(clusters):
    nodes = ((0, 0, 1), "torchrun's GROUP_RANK")
    for rank, found in enumerate(clusters(3).run(exchange_behind_queued_calls)):
        assert found == ([6, 6], [3 * i + 3 for i in range(7)], [1, 2, 3, 30], nodes, nodes), rank


def layout_through_the_store(absent: int) -> tuple:
    """A fresh group's placement agreed through its store: no transport is made for it (no
    communicator on any device) and no message moves; then a group whose rank ``absent``
    never makes a collective call: the others' exchange fails within the timeout, naming it."""
    import datetime
    import time

    import torch.distributed as dist

    from ringcoll.api.common import executor_context, group_executor
    from ringcoll.runtime.failures import PeerError

    rank, world = dist.get_rank(), dist.get_world_size()
    with group_timeouts():     # the group's own timeout applies
        group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=2))
        executor = group_executor(group)
        ctx = executor_context(executor)
        made = dict(executor._transports)
        lonely = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=2))
        outcome = None
        if rank != absent:
            start = time.monotonic()
            try:
                executor_context(group_executor(lonely))
            except PeerError as error:
                outcome = (round(time.monotonic() - start, 1), error.peers, str(error))
    dist.barrier()
    for each in (group, lonely):
        dist.destroy_process_group(each)
    return ctx.nodes, made, outcome


def test_the_layout_is_agreed_through_the_store(clusters):
    """#37: the exchange needs no device and no communicator (the records are a few hundred
    bytes; the group's store serves), and a rank that never comes is named within the timeout."""
    for rank, (nodes, made, outcome) in enumerate(clusters(3).run(layout_through_the_store, 2)):
        assert nodes == (0, 0, 0) and made == {}, (rank, nodes, made)
        if rank == 2:
            assert outcome is None
            continue
        seconds, peers, text = outcome
        assert seconds < 4 and peers == (2,) and "rank 2 did not reach" in text, (rank, outcome)
