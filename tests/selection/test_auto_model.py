"""``auto`` on a group that has a machine: the least simulated time on that machine, with
the group's placement, so what the study says wins is what ``auto`` picks (issue #24).

The two-level machine below has nodes of 2 ranks, fast inside and slow between; on 6
ranks as three nodes the simulator times ``hierarchical`` fastest at 8 MiB (2651 µs, the
ring next at 3346) and the
latency-bound butterflies fastest at a few bytes, so a right ``auto`` changes its pick with
the size and a model at the slowest link (or the measured rules, which knew nothing of the
machine) does not.
"""
from __future__ import annotations

import os

import pytest
import torch

import ringcoll
from _util import ringcoll_log
from ringcoll.schedules import registry
from ringcoll import selection
from ringcoll.schedules.registry import BUILDER_OF

#: nodes of 2: 1 µs and 200 GB/s inside a node, 20 µs and 5 GB/s between nodes
TWO_LEVEL = ringcoll.Machine.hierarchical(2, intra=(1e-6, 1 / 200e9), inter=(20e-6, 1 / 5e9))
#: the int32 element counts of the real-group test: 1, below the world, not divisible, 8 MiB
#: (int32: auto sees bytes, and its model counts them in 4-byte elements)
NUMELS = (1, 3, 1001, (1 << 21) + 3)


def simulated_times(collective, world, numel, machine, local_size, dtype=torch.int32):
    """Every candidate's time as the study measures it: a cost-only run on ``machine`` (the
    candidates: the algorithms auto may pick, not those registered with ``auto=False``, such as
    NCCL's nccl_ring and nccl_tree)."""
    names = [n for n in ringcoll.algorithms(collective)
             if registry.get(collective, n).auto and not (n == "direct" and world > 8)]
    return {name: ringcoll.simulate(BUILDER_OF.get(collective, collective), name, world, numel=numel,
                                    dtype=dtype, machine=machine, local_size=local_size, data=False,
                                    record=False).stats.time for name in names}


# -- a real gloo group ------------------------------------------------------------------------
def two_level_all_reduce(machine, numels):
    """On this rank: a ringcoll group whose Options carry ``machine``, its ranks on nodes of
    2 (RINGCOLL_LOCAL_SIZE), one all_reduce per size; returns per size the log line of the
    choice and whether the result equals the built-in's (gloo, the default group)."""
    import torch.distributed as dist

    os.environ["RINGCOLL_LOCAL_SIZE"] = "2"
    rank = dist.get_rank()
    found = []
    try:
        with ringcoll_log() as records:
            group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(machine=machine))
            for numel in numels:
                values = (torch.arange(numel, dtype=torch.int32) * 7 + rank * 13) % 61 + 1
                got, want = values.clone(), values.clone()
                records.clear()
                dist.all_reduce(got, group=group)
                dist.all_reduce(want)
                line = next((r for r in records if " -> " in r), repr(records))
                found.append((line, torch.equal(got, want)))
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
    return found


def test_a_two_level_group_takes_what_the_simulator_says_wins(clusters, plain_env):
    """6 gloo ranks as three emulated nodes of 2, Options(machine=TWO_LEVEL): at each size
    auto's pick is the fastest the simulator times on that machine with those nodes (a tie
    taken either way), hierarchical at 8 MiB and something else at a few bytes, and every
    result equals the built-in's."""
    answers = clusters(6).run(two_level_all_reduce, TWO_LEVEL, NUMELS)
    picks = {}
    for numel, per_rank in zip(NUMELS, zip(*answers)):
        times = simulated_times("all_reduce", 6, numel, TWO_LEVEL, 2)
        for rank, (line, equal) in enumerate(per_rank):
            assert equal, f"rank {rank}, numel {numel}: differs from the built-in ({line})"
            assert "(auto: model (given machine): simulated on nodes of 2" in line, line
            assert ", next " in line, line
            name = line.split(" -> ")[1].split(" (")[0]
            assert times[name] == pytest.approx(min(times.values()), rel=1e-9), (numel, name, times)
            picks.setdefault(numel, set()).add(name)
    assert all(len(names) == 1 for names in picks.values()), picks      # every rank alike
    assert picks[NUMELS[-1]] == {"hierarchical"}
    ranked = sorted((t, n) for n, t in simulated_times("all_reduce", 6, NUMELS[-1], TWO_LEVEL, 2).items())
    assert ranked[0][1] == "hierarchical" and ranked[0][0] < 0.9 * ranked[1][0], ranked[:2]
    assert "hierarchical" not in picks[1] | picks[3]


# -- simulate(..., machine=M, algorithm="auto") ---------------------------------------------------
@pytest.mark.parametrize("collective,world,local_size", [
    ("all_reduce", 8, 4), ("all_reduce", 6, 2), ("broadcast", 8, 4), ("reduce", 6, 3),
    ("all_gather_into_tensor", 8, 4), ("reduce_scatter_tensor", 6, 2), ("all_to_all_single", 5, None),
    ("gather", 6, None)])
def test_simulate_auto_picks_the_simulated_winner(plain_env, collective, world, local_size):
    """On a two-level machine whose nodes are the simulated ones, ``simulate(..., "auto",
    machine=M)`` runs an algorithm whose simulated time on M is the least of all, at sizes
    from nothing to 16 MiB; on 8 ranks as nodes of 4 the all_reduce at 16 MiB takes one that
    keeps its large messages inside the nodes: hierarchical, or Rabenseifner in MPICH's order
    (its halves of n/2 and n/4 go to ranks 1 and 2 away, on the node), which the closed form
    at the slowest link prices as if every message crossed nodes."""
    registry_name = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
                     "all_to_all_single": "all_to_all"}.get(collective, collective)
    per_node = local_size or 2
    machine = ringcoll.Machine.hierarchical(per_node, intra=(1e-6, 1 / 200e9), inter=(10e-6, 1 / 10e9))
    for numel in (0, 1, world - 1, 4099, 1 << 22):
        sim = ringcoll.simulate(collective, "auto", world, numel=numel, dtype=torch.float32, machine=machine,
                                local_size=local_size, data=numel < 1 << 16, record=False)
        times = simulated_times(registry_name, world, numel, machine, local_size, torch.float32)
        assert times[sim.algorithm.name] == pytest.approx(min(times.values()), rel=1e-9), \
            (numel, sim.algorithm.name, sorted(times.items(), key=lambda kv: kv[1])[:3])
    if (collective, world) == ("all_reduce", 8):
        assert sim.algorithm.name in ("hierarchical", "rabenseifner")
        slowest = ringcoll.schedules.registry.model(sim.algorithm, world, 4 << 22).on(machine)
        assert times[sim.algorithm.name] < slowest


def test_without_a_machine_the_measured_rules_still_decide(plain_env, tmp_path):
    """The rules describe this 2-core host: they decide on a group without a machine, and a
    machine (Options, simulate's, RINGCOLL_MACHINE) hands the decision to the model."""
    name, why = selection.choose("all_reduce", "auto", 1 << 23, 4)
    assert (name, why.split(":")[1].strip()) == ("rabenseifner", "rule measured up to p=4")
    name, why = selection.choose("all_reduce", "auto", 1 << 23, 4, machine=TWO_LEVEL, nodes=(0, 0, 1, 1))
    # on 2 nodes of 2, MPICH's Rabenseifner (halves to the node neighbour first) is hierarchical's
    # schedule in effect: they tie, and the tie goes to the classic algorithm
    assert name in ("hierarchical", "rabenseifner") and why.startswith("auto: model (given machine): simulated"), why
    path = tmp_path / "machine.json"
    TWO_LEVEL.save(str(path))
    plain_env.setenv("RINGCOLL_MACHINE", str(path))
    name, why = selection.choose("all_reduce", "auto", 1 << 23, 4)           # the machine's own nodes
    assert name in ("hierarchical", "rabenseifner"), why          # they tie on 2 nodes of 2 (above)
    assert why.startswith(f"auto: model ({path}): simulated on nodes of 2"), why


def test_the_groups_layout_not_the_machines_decides_the_schedule(plain_env):
    """The model simulates the node-aware candidates with the layout they will run with:
    the same machine on one node (the layout a group on one host has) makes hierarchical the
    ring, which then never wins over it, while 3 nodes of 2 make it the winner (on 2 nodes
    of 2 MPICH's Rabenseifner ties with it)."""
    big = 1 << 23
    one_node = selection.choose("all_reduce", "auto", big, 6, machine=TWO_LEVEL, nodes=(0,) * 6)[0]
    assert one_node != "hierarchical"
    assert selection.choose("all_reduce", "auto", big, 6, machine=TWO_LEVEL, nodes=lambda: (0, 0, 1, 1, 2, 2))[0] \
        == "hierarchical"
    with pytest.raises(ValueError, match="nodes must give the node of each of the 4 ranks, got 3"):
        selection.choose("all_reduce", "auto", big, 4, machine=TWO_LEVEL, nodes=(0, 0, 1))


def test_a_decision_is_simulated_once_per_band_and_machine(plain_env, monkeypatch):
    """Cached per (collective, world, size band, machine, layout): a repeated call and any
    size of the same quarter-octave band simulate nothing; another band, machine or layout
    simulates again."""
    runs, real = [], selection.model._simulated_time
    monkeypatch.setattr(selection.model, "_simulated_time", lambda *args: runs.append(args) or real(*args))
    nodes = (0, 0, 1, 1)
    selection.choose("all_reduce", "auto", 1 << 20, 4, machine=TWO_LEVEL, nodes=nodes)
    cold = len(runs)
    assert cold == len([n for n in ringcoll.algorithms("all_reduce") if registry.get("all_reduce", n).auto])
    for nbytes in (1 << 20, (1 << 20) + 1000, (1 << 20) + (1 << 18) - 1):
        selection.choose("all_reduce", "auto", nbytes, 4, machine=TWO_LEVEL, nodes=nodes)
    assert len(runs) == cold
    assert selection.size_band((1 << 20) + (1 << 18)) == (1 << 20) + (1 << 18)
    selection.choose("all_reduce", "auto", (1 << 20) + (1 << 18), 4, machine=TWO_LEVEL, nodes=nodes)
    selection.choose("all_reduce", "auto", 1 << 20, 4, machine=ringcoll.Machine(), nodes=nodes)
    selection.choose("all_reduce", "auto", 1 << 20, 4, machine=TWO_LEVEL, nodes=(0, 1, 0, 1))
    assert len(runs) == 4 * cold
    assert [selection.size_band(n) for n in (0, 1, 7, 8, 9, 1000, 1 << 30)] == [0, 1, 7, 8, 8, 896, 1 << 30]


def test_beyond_the_simulated_worlds_the_closed_forms_serve(plain_env, monkeypatch):
    monkeypatch.setattr(selection.model, "SIMULATE_UP_TO", 8)
    monkeypatch.setattr(selection.model, "_simulated_time", lambda *args: pytest.fail("simulated beyond the limit"))
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 16, machine=TWO_LEVEL)
    assert "closed form on nodes of 2" in why
    best = min((registry.model(registry.get("all_reduce", n), 16, 1 << 20, local_size=2).on(TWO_LEVEL), n)
               for n in ringcoll.algorithms("all_reduce") if n != "direct" and registry.get("all_reduce", n).auto)
    assert registry.model(registry.get("all_reduce", name), 16, 1 << 20, local_size=2).on(TWO_LEVEL) == \
        pytest.approx(best[0])


def test_machine_describe_names_both_link_classes():
    assert TWO_LEVEL.describe() == ("nodes of 2 (blocks): 1 us, 200 GB/s inside, 20 us, 5 GB/s between, "
                                    "20 GB/s reduced, 1 port, 1 NIC port")
    assert ringcoll.Machine().describe() == "flat: 5 us, 10 GB/s, 20 GB/s reduced, 1 port"
    assert TWO_LEVEL.nodes(5) == (0, 0, 1, 1, 2) and ringcoll.Machine().nodes(5) is None


# -- RINGCOLL_ALGO where it names nothing for the collective --------------------------------------
def test_an_override_that_misses_a_collective_says_so_in_the_log(plain_env, caplog):
    """RINGCOLL_ALGO=ring leaves broadcast (which has no ring) at auto, and the INFO line of
    that call says so before naming what decided; all_reduce runs the ring as asked."""
    plain_env.setenv("RINGCOLL_ALGO", "ring")
    with caplog.at_level("INFO", logger="ringcoll"):
        ringcoll.simulate("broadcast", "auto", 4, numel=1000)
        ringcoll.simulate("all_reduce", "auto", 4, numel=1000)
    lines = [r.getMessage() for r in caplog.records if "rank 0 ->" in r.getMessage()]
    assert "-> linear (RINGCOLL_ALGO=ring names no algorithm of broadcast; auto: rule measured" in lines[0], lines
    assert lines[1].endswith("-> ring (RINGCOLL_ALGO)"), lines
    # an override this call cannot run (bruck on unequal all_to_all blocks) says that instead
    plain_env.setenv("RINGCOLL_ALGO", "all_to_all=bruck")
    name, why = selection.choose("all_to_all", "auto", 4096, 4, exclude=("bruck",))
    assert name != "bruck" and why.startswith("RINGCOLL_ALGO=all_to_all=bruck names bruck, which this call "
                                              "cannot run; auto: "), why
    plain_env.delenv("RINGCOLL_ALGO")
    assert not selection.choose("broadcast", "auto", 4096, 4)[1].startswith("RINGCOLL_ALGO")
