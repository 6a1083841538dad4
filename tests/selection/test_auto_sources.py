"""What decides ``algorithm="auto"``, source by source (ringcoll.selection's docstring): the
measured rules only where they were measured, a machine (RINGCOLL_MACHINE, a fitted one,
``Options(machine=)``, simulate's ``machine=``) and its model, the tuning table, and the log
line naming the source."""
from __future__ import annotations

import pathlib

import pytest
import torch

import ringcoll
from _util import ringcoll_log
from ringcoll import selection
from ringcoll.runtime.nodes import even_nodes
from ringcoll.schedules import registry

def test_measured_rules_decide_only_where_they_were_measured(plain_env):
    name, why = selection.choose("all_reduce", "auto", 4096, 4)
    assert name == "recursive_doubling" and "rule measured up to p=4" in why
    for world in (5, 16, 64):               # beyond the measurements: the model
        name, why = selection.choose("all_reduce", "auto", 4096, world)
        assert "auto: model (default machine)" in why
        best = min(ringcoll.algorithms("all_reduce"),
                   key=lambda n: float("inf") if n == "direct" and world > 8 else
                   registry.get("all_reduce", n).cost(world, 4096).time(5e-6, 1e-10, 5e-11))
        want = registry.get("all_reduce", best).cost(world, 4096).time(5e-6, 1e-10, 5e-11)
        got = registry.get("all_reduce", name).cost(world, 4096).time(5e-6, 1e-10, 5e-11)
        assert got == pytest.approx(want)
    # an unmeasured literature rule that would decide hands over to the model
    assert "model" in selection.choose("all_gather", "auto", 1024, 3)[1]
    for rule in selection.RULES:
        assert rule.measured_upto is None or rule.measured_upto >= 2, rule


def test_model_follows_the_machine(plain_env, tmp_path):
    """A machine where messages cost nothing and bytes everything takes the fewest bytes; one
    where a message costs a second takes the fewest messages."""
    latency, bandwidth = tmp_path / "latency.json", tmp_path / "bandwidth.json"
    latency.write_text('{"alpha": 1.0, "beta": 1e-12, "gamma": 0}')
    bandwidth.write_text('{"alpha": 0, "beta": 1e-9, "gamma": 1e-9}')
    plain_env.setenv("RINGCOLL_MACHINE", str(latency))
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 16)
    assert str(latency) in why and registry.get("all_reduce", name).cost(16, 1 << 20).alpha == 4
    assert selection.choose("all_gather", "auto", 1 << 20, 12)[0] in ("bruck", "pat")
    plain_env.setenv("RINGCOLL_MACHINE", str(bandwidth))
    name, _ = selection.choose("all_reduce", "auto", 1 << 20, 16)
    assert registry.get("all_reduce", name).cost(16, 1 << 20).beta == pytest.approx(2 * 15 / 16 * (1 << 20))
    assert selection.choose("all_reduce", "auto", 64, 5)[0] != "direct"


#: p = 16, 1 MiB: a machine where a message costs 1 ms and one where a byte costs 1 ns
HIGH_ALPHA = ringcoll.Machine(alpha=1e-3, beta=1 / 100e9, gamma=1 / 200e9)
HIGH_BETA = ringcoll.Machine(alpha=1e-7, beta=1e-9, gamma=1 / 200e9)


def formula_best(collective, nbytes, world, machine):
    """The least closed-form time on ``machine``, as the formulas give it (direct only at p <= 8)."""
    names = [n for n in ringcoll.algorithms(collective) if not (n == "direct" and world > 8)]
    return min(registry.get(collective, n).cost(world, nbytes).on(machine) for n in names)


def test_saved_machines_change_the_choice_as_the_formulas_predict(plain_env, tmp_path):
    """Machine.save / Machine.load is the one path: at p = 16 and 1 MiB the high-α machine
    takes lg p = 4 whole-vector messages (recursive doubling: 4α + 4nβ beats Rabenseifner's
    8α + 2(p-1)/p·nβ by 4 ms - 0.04 ms), the high-β machine the bandwidth-optimal form
    (2(p-1)/p·n = 1.97 MB on the wire instead of 4 MiB)."""
    n, world = 1 << 20, 16
    chosen = {}
    for label, machine in (("alpha", HIGH_ALPHA), ("beta", HIGH_BETA)):
        path = tmp_path / f"{label}.json"
        machine.save(str(path))
        plain_env.setenv("RINGCOLL_MACHINE", str(path))
        name, why = selection.choose("all_reduce", "auto", n, world)
        assert why.startswith(f"auto: model ({path})"), why
        cost = registry.get("all_reduce", name).cost(world, n)
        assert cost.on(machine) == pytest.approx(formula_best("all_reduce", n, world, machine))
        chosen[label] = (name, cost)
    (_, alpha_cost), (_, beta_cost) = chosen["alpha"], chosen["beta"]
    assert chosen["alpha"][0] != chosen["beta"][0]
    assert alpha_cost.alpha == 4 and alpha_cost.beta == 4 * n
    assert beta_cost.beta == pytest.approx(2 * 15 / 16 * n) and beta_cost.alpha > 4


def test_fitted_machine_file_is_the_model(plain_env, tmp_path):
    """``ringcoll.fit(...).save(path)`` with RINGCOLL_MACHINE=path: auto takes the least
    closed-form time on the fitted machine, and names the file."""
    run = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results" / "runs" / "20261202T144510Z_np4_gloo.json"
    fitted = ringcoll.fit([str(run)])
    path = tmp_path / "fitted.json"
    fitted.save(str(path))
    assert ringcoll.Machine.load(str(path)) == fitted
    plain_env.setenv("RINGCOLL_MACHINE", str(path))
    for world, n in ((16, 4096), (64, 1 << 24)):
        name, why = selection.choose("all_reduce", "auto", n, world)
        assert str(path) in why
        assert registry.get("all_reduce", name).cost(world, n).on(fitted) == \
            pytest.approx(formula_best("all_reduce", n, world, fitted))


def test_options_machine_wins_over_the_file(plain_env, tmp_path):
    path = tmp_path / "beta.json"
    HIGH_BETA.save(str(path))
    plain_env.setenv("RINGCOLL_MACHINE", str(path))
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 16, machine=HIGH_ALPHA)
    assert why.startswith("auto: model (given machine)")
    assert registry.get("all_reduce", name).cost(16, 1 << 20).alpha == 4
    assert ringcoll.Options(machine=HIGH_ALPHA).machine is HIGH_ALPHA
    with pytest.raises(TypeError, match="machine must be a ringcoll.Machine, got dict"):
        ringcoll.Options(machine={"alpha": 1.0})


def test_simulate_auto_weighs_the_simulated_machine(plain_env, caplog):
    """``simulate(..., "auto", machine=M)``: auto's model is M, the machine the ranks run on.
    At p = 16 and 1 MiB the high-α machine and the high-β one choose differently, each the
    least closed-form time on it, and ``sim.algorithm`` is the algorithm chosen."""
    n, world = 1 << 20, 16
    chosen = {}
    for label, machine in (("alpha", HIGH_ALPHA), ("beta", HIGH_BETA)):
        caplog.clear()
        with caplog.at_level("INFO", logger="ringcoll"):
            sim = ringcoll.simulate("all_reduce", "auto", world, numel=n // 4, dtype=torch.float32,
                                    machine=machine, data=False, record=False)
        want, _ = selection.choose("all_reduce", "auto", n, world, machine=machine)
        assert sim.algorithm.name == want
        assert sim.cost.on(machine) == pytest.approx(formula_best("all_reduce", n, world, machine))
        line = next(r.getMessage() for r in caplog.records if "rank 0 ->" in r.getMessage())
        assert f"-> {sim.algorithm.name} (auto: model (given machine)" in line, line
        chosen[label] = sim.algorithm.name
    assert chosen["alpha"] != chosen["beta"]


def test_simulate_auto_prices_node_aware_candidates_on_the_simulated_nodes(plain_env, monkeypatch):
    """Inside ``simulate(..., "auto", local_size=4)`` the model simulates the hierarchical
    candidates on the simulated nodes of 4, not on RINGCOLL_LOCAL_SIZE's 2."""
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "2")
    seen, real = [], selection.model._simulated_time

    def spy(collective, name, world, n, on, nodes):
        if name == "hierarchical":
            seen.append(nodes)
        return real(collective, name, world, n, on, nodes)

    monkeypatch.setattr(selection.model, "_simulated_time", spy)
    monkeypatch.setattr(selection.model, "_simulated", {})
    for collective in ("all_reduce", "broadcast", "reduce", "all_gather"):
        seen.clear()
        ringcoll.simulate(collective, "auto", 24, numel=24 * 4096, local_size=4, data=False, record=False)
        assert seen and set(seen) == {even_nodes(24, 4)}, (collective, seen)


@pytest.mark.parametrize("text,message", [
    ('{"alpha": "fast"}', "alpha must be a non-negative number"),
    ("{alpha: 1}", "not a ringcoll.Machine JSON"),
    ('{"alpha": 1e-6, "latency": 2}', "unknown"),
])
def test_bad_machine_file_names_the_variable_and_path(plain_env, tmp_path, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    plain_env.setenv("RINGCOLL_MACHINE", str(bad))
    with pytest.raises(ValueError, match=message) as caught:
        selection.choose("all_reduce", "auto", 64, 16)
    assert f"RINGCOLL_MACHINE={bad}" in str(caught.value)
    plain_env.setenv("RINGCOLL_MACHINE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="RINGCOLL_MACHINE names .*missing.json.*cannot be read"):
        selection.choose("all_reduce", "auto", 64, 16)


def options_machine_log(machine):
    """The log line of one all_gather on a ringcoll group whose Options carry ``machine``."""
    import torch.distributed as dist

    with ringcoll_log() as records:
        group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(machine=machine))
        out = torch.empty(3 * 4096)
        dist.all_gather_into_tensor(out, torch.full((4096,), float(dist.get_rank() + 1)), group=group)
    return records, out[::4096].tolist()


def test_options_machine_reaches_auto_on_a_group(clusters):
    """p = 3, 48 KiB gathered: no measured rule covers it, so the group's machine decides."""
    for records, firsts in clusters(3).run(options_machine_log, HIGH_ALPHA):
        assert firsts == [1.0, 2.0, 3.0]
        line = next((r for r in records if " -> " in r), records)
        assert "(auto: model (given machine)" in line, line
        want = selection.choose("all_gather", "auto", 3 * 4096 * 4, 3, machine=HIGH_ALPHA)[0]
        assert f"-> {want} (" in line, line


def test_direct_only_for_small_worlds(plain_env):
    """The model weighs direct only at p <= 8 (under one port per rank its p - 1 messages
    serialise, so it ties at best: the classic algorithm then wins)."""
    names = ringcoll.algorithms("all_gather")
    assert "direct" in [n for _, n in selection.modelled_times("all_gather", 64, 8, names)]
    assert "direct" not in [n for _, n in selection.modelled_times("all_gather", 64, 9, names)]
    ranked = selection.modelled_times("all_gather", 64, 3, names)
    assert dict((n, t) for t, n in ranked)["direct"] == ranked[0][0]         # a tie at p = 3 ...
    assert selection.choose("all_gather", "auto", 64, 3)[0] != "direct"     # ... the lower preference wins


def test_tuning_table_is_followed(plain_env, tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\n"
                     "all_reduce,4,0,65535,ring\n"
                     "all_reduce,4,65536,1048576,swing_bandwidth\n"
                     "all_gather_into_tensor,3,0,100,pat\n")
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    assert selection.choose("all_reduce", "auto", 4096, 4) == ("ring", f"auto: tuning table {table}:2")
    assert selection.choose("all_reduce", "auto", 65536, 4)[0] == "swing_bandwidth"
    assert selection.choose("all_gather", "auto", 100, 3)[1].endswith(":4")
    assert "rule" in selection.choose("all_reduce", "auto", 2 << 20, 4)[1]        # no row: the rules
    assert "model" in selection.choose("all_reduce", "auto", 4096, 16)[1]         # no row for p = 16
    plain_env.setenv("RINGCOLL_ALGO", "all_reduce=rabenseifner")                   # the override still wins
    assert selection.choose("all_reduce", "auto", 4096, 4) == ("rabenseifner", "RINGCOLL_ALGO")


@pytest.mark.parametrize("text,message", [
    ("collective,world,min,max,algorithm\n", "line 1 must be the header"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,zero,10,ring\n", r":2: min_bytes must be an integer"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,0,10,rnig\n", r":2: all_reduce has no algorithm 'rnig'"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduse,4,0,10,ring\n", "collective must be one of"),
])
def test_bad_tuning_table_names_file_line_and_field(plain_env, tmp_path, text, message):
    table = tmp_path / "table.csv"
    table.write_text(text)
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    with pytest.raises(ValueError, match=message):
        selection.choose("all_reduce", "auto", 64, 4)


def test_debug_log_names_the_source(plain_env, tmp_path, caplog):
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,0,100,direct\n")
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    with caplog.at_level("INFO", logger="ringcoll"):
        for world, numel in ((4, 10), (4, 1000), (16, 10)):
            ringcoll.simulate("all_reduce", "auto", world, numel=numel)
    sources = [r.getMessage() for r in caplog.records if "rank 0 ->" in r.getMessage()]
    assert "direct (auto: tuning table" in sources[0]
    assert "(auto: rule measured up to p=4" in sources[1]
    assert "(auto: model (default machine)" in sources[2]      # simulate without machine=: none given
