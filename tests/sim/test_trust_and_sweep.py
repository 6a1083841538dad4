"""What the study trusts: a user's algorithm stays out of ``auto`` unless it opts in, and its
declared cost is checked against the simulator's clock at registration; the study CLI's
labels, errors and marks; the lower bound per link level; the fit's warnings; symmetric runs
of Swing and Bine at scale."""
from __future__ import annotations

import re
import subprocess
import sys
import warnings

import pytest
import torch

import ringcoll
from ringcoll.schedules import registry
from ringcoll import selection
from _util import MANY, bench_json as _bench, one_thread  # noqa: F401 - the simulator runs on one thread

RING = registry.get("all_reduce", "ring")


def ring_copy(rank, world, layout):
    """The ring all-reduce, registered under another name by a 'user' (this module)."""
    yield from RING.schedule(rank, world, layout)


@pytest.fixture
def cleanup():
    names = []
    yield names
    for collective, name in names:
        registry._REGISTRY[collective].pop(name, None)
    registry.version += 1


def test_a_user_algorithm_stays_out_of_auto_and_a_wrong_cost_warns(cleanup):
    def optimistic(world, nbytes, segment=None):
        return ringcoll.Cost(*(x / 100 for x in RING.cost(world, nbytes, segment)))

    cleanup.append(("all_reduce", "test_optimistic"))
    with pytest.warns(UserWarning, match=r"all_reduce/test_optimistic at world 8, 1024 B: declared cost "
                                         r"[0-9.]+ us, the simulator's clock [0-9.]+ us \(0\.01x\)"):
        ringcoll.register("all_reduce", "test_optimistic", cost=optimistic)(ring_copy)
    assert registry.get("all_reduce", "test_optimistic").auto is False
    machine = ringcoll.Machine()
    for nbytes, world in ((1024, 8), (1 << 20, 3)):
        assert selection.choose("all_reduce", "auto", nbytes, world, machine=machine)[0] != "test_optimistic"
    # an honest cost registers silently; auto=True opts in
    cleanup.append(("all_reduce", "test_honest"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ringcoll.register("all_reduce", "test_honest", cost=RING.cost, auto=True)(ring_copy)
    assert registry.get("all_reduce", "test_honest").auto is True


def test_the_check_follows_who_registers_not_where_the_schedule_is_defined(cleanup):
    """ringcoll's own ring, registered again by a user module under a new name with a wrong
    cost, is checked (its defining module, ringcoll.schedules.all_reduce, is no pass); the same
    registration made from a module named ringcoll.* is not, and check= decides either way."""
    def wrong(world, nbytes, segment=None):
        return ringcoll.Cost(1, 0, 0)

    assert registry.is_builtin(RING.schedule)
    cleanup.append(("all_reduce", "test_own_ring_by_a_user"))
    with pytest.warns(UserWarning, match=r"all_reduce/test_own_ring_by_a_user at world 3, 1024 B: declared cost"):
        ringcoll.register("all_reduce", "test_own_ring_by_a_user", cost=wrong)(RING.schedule)
    source = "import ringcoll\nringcoll.register('all_reduce', NAME, cost=WRONG)(RING.schedule)\n"
    for module, check, warns in (("ringcoll.test_plugin", None, False), ("ringcoll", None, False),
                                 ("ringcollection", None, True), ("ringcoll.test_plugin", True, True),
                                 ("__main__", False, False)):
        name = f"test_by_{module.replace('.', '_')}_{check}"
        cleanup.append(("all_reduce", name))
        code = source.replace("cost=WRONG", "cost=WRONG" + ("" if check is None else f", check={check}"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(code, f"<{module}>", "exec"), {"__name__": module, "NAME": name, "WRONG": wrong,
                                                        "RING": RING})
        assert any(name in str(w.message) for w in caught) == warns, (module, check)


def test_importing_ringcoll_runs_no_cost_check():
    """The catalogue registers itself from ringcoll.schedules: importing ringcoll simulates nothing."""
    code = ("import sys, torch\ncalls = []\n"
            "sys.setprofile(lambda frame, event, arg: calls.append(1) if event == 'call' and "
            "frame.f_code.co_name == 'cost_mismatches' else None)\n"
            "import ringcoll\nsys.setprofile(None)\n"
            "assert sum(map(len, ringcoll.algorithms().values())) > 40\nprint(len(calls))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_a_schedule_that_cannot_run_at_a_checked_world_is_named(cleanup):
    def only_pof2(rank, world, layout):
        if world & (world - 1):
            raise ValueError(f"needs a power of two, got {world}")
        yield from RING.schedule(rank, world, layout)

    cleanup.append(("all_reduce", "test_pof2"))
    with pytest.warns(UserWarning, match=r"test_pof2 at world 3, 1024 B: could not be simulated \(ValueError: "
                                         r"needs a power of two, got 3\)"):
        ringcoll.register("all_reduce", "test_pof2", cost=RING.cost)(only_pof2)


def test_builtins_keep_their_place_in_auto():
    kept_out = {("broadcast", "bine_near"), ("reduce", "bine_near"), ("all_reduce", "rabenseifner_far"),
                ("reduce", "rabenseifner_far")}
    nccl = set()
    for collective, names in ringcoll.algorithms().items():
        for name in names:
            algorithm = registry.get(collective, name)
            if registry.is_builtin(algorithm.schedule) and not name.startswith("msccl:"):
                # NCCL's own schedules (nccl_ring, nccl_tree, nccl_pat) are there to compare with, not to pick
                out = (collective, name) in kept_out or name.startswith("nccl_")
                nccl |= {(collective, name)} if name.startswith("nccl_") else set()
                assert algorithm.auto == (not out), (collective, name)
    assert {("all_reduce", "nccl_ring"), ("all_reduce", "nccl_tree"), ("all_gather", "nccl_pat")} <= nccl


def test_validate_labels_a_given_machine_and_its_own_error_bands(tmp_path, capsys):
    from ringcoll.sim.cli import main

    truth = ringcoll.Machine(alpha=20e-6, beta=1 / 5e9, gamma=1 / 12e9)
    run = _bench(tmp_path / "run.json", truth, 4, MANY)
    other = ringcoll.Machine(alpha=2e-6, beta=1 / 50e9, gamma=1 / 100e9)
    other.save(str(tmp_path / "other.json"))
    assert main(["validate", run]) == 0
    fitted = capsys.readouterr().out
    assert re.search(r"fitted α = 2\d(\.\d+)? µs", fitted) and "given machine" not in fitted
    assert main(["validate", run, "--machine", str(tmp_path / "other.json")]) == 0
    given = capsys.readouterr().out
    report = given[given.index("given machine"):]
    assert f"given machine ({tmp_path / 'other.json'}), not fitted: α = 2 µs" in report and "fitted α" not in given
    # the bands are the given machine's errors (about 90 % too fast), not the fit's (≤ 1 %)
    medians = [float(line.split("median |error|")[1].split("%")[0]) for line in report.splitlines()
               if "median |error|" in line]
    assert medians and min(medians) > 50


def test_a_fit_with_too_few_rows_warns_it_is_exact_by_construction(tmp_path):
    from ringcoll.sim.fit import fit_report

    truth = ringcoll.Machine(alpha=20e-6, beta=1 / 5e9, gamma=1 / 12e9)
    few = _bench(tmp_path / "few.json", truth, 4, [("all_reduce", "ring", 65536), ("broadcast", "binomial", 4096),
                                                   ("all_gather", "ring", 1 << 20)])
    with pytest.warns(UserWarning, match="under-determined: 3 rows for 3 parameters"):
        result = fit_report(few)
    assert "warning: under-determined" in result.report()
    # many rows but one algorithm at one size: rank 1
    same = _bench(tmp_path / "same.json", truth, 4, [("broadcast", "binomial", 4096)] * 5)
    with pytest.warns(UserWarning, match="independent equations"):
        fit_report(same)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not fit_report(_bench(tmp_path / "many.json", truth, 4, MANY)).warnings


def test_sweep_refuses_unknown_algorithms_naming_them(tmp_path, capsys):
    from ringcoll.sim.cli import main
    from ringcoll.sim.sweep import sweep

    with pytest.raises(ValueError, match=r"unknown nope; known: bine, .*ring"):
        sweep(["all_reduce"], [4], [1024], ringcoll.Machine(), algorithms=["ring", "nope"])
    for names in ("nope,zap", "ring,nope"):
        with pytest.raises(SystemExit):
            main(["sweep", "--algorithms", names, "--worlds", "4", "--out", str(tmp_path / "x")])
        assert "unknown nope" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_sweep_imports_a_users_module_and_takes_ports(tmp_path, capsys):
    from ringcoll.sim.cli import main

    mine = tmp_path / "sweep_user_algo.py"
    mine.write_text("import ringcoll\nfrom ringcoll.schedules.registry import get\n"
                    "RING = get('all_reduce', 'ring')\n"
                    "@ringcoll.register('all_reduce', 'test_sweep_mine', cost=RING.cost)\n"
                    "def mine(rank, world, layout):\n    yield from RING.schedule(rank, world, layout)\n")
    try:
        assert main(["sweep", "--import", str(mine), "--algorithms", "test_sweep_mine,recursive_doubling",
                     "--worlds", "4", "-b", "1K", "-e", "4K", "--ports", "2", "--out", str(tmp_path / "o")]) == 0
        table = (tmp_path / "o" / "study_all_reduce.csv").read_text()
        assert "test_sweep_mine" in table and ",simulated" in table
        assert '"ports": 2' in (tmp_path / "o" / "study_crossovers_all_reduce.txt").read_text()
    finally:
        registry._REGISTRY["all_reduce"].pop("test_sweep_mine", None)
        registry.version += 1
    with pytest.raises(SystemExit):
        main(["sweep", "--import", str(tmp_path / "missing.py"), "--out", str(tmp_path / "o2")])
    assert "--import" in capsys.readouterr().err


def test_sweep_marks_closed_form_cells_and_ties(tmp_path):
    from ringcoll.sim.sweep import Cell, crossover_lines, sweep, ties

    cells = sweep(["all_reduce"], [4, 32], [1024, 1 << 20], ringcoll.Machine(),
                  algorithms=["rabenseifner", "rabenseifner_far", "ring"], simulate_up_to=8)
    assert {c.source for c in cells if c.world == 32} == {"closed form"} and \
        {c.source for c in cells if c.world == 4} == {"simulated"}
    tied = ties(cells)            # the two Rabenseifner orders cost the same on a flat machine
    assert any(set(names) >= {"rabenseifner", "rabenseifner_far"} for names in tied.values())
    lines = crossover_lines(cells)
    assert any("tie (simulated): rabenseifner = rabenseifner_far" in line for line in lines)
    assert any("tie (closed form)" in line for line in lines)
    made = [Cell("all_reduce", "a", 4, 1, 1.0, 1.0, "simulated"), Cell("all_reduce", "b", 4, 2, 2.0, 1.0, "simulated"),
            Cell("all_reduce", "a", 4, 2, 3.0, 1.0, "simulated"), Cell("all_reduce", "a", 4, 4, 4.0, 1.0, "closed form"),
            Cell("all_reduce", "b", 4, 4, 5.0, 1.0, "closed form")]
    assert crossover_lines(made) == ["all_reduce: p=4: from 2 B a -> b", "all_reduce: p=4: from 4 B b -> a (closed form)"]


def test_the_lower_bound_takes_the_inter_node_link_on_two_levels():
    from ringcoll.sim.bounds import node_bounds
    from ringcoll.sim.sweep import bound_time

    two = ringcoll.Machine.hierarchical(4, intra=(1e-6, 1 / 200e9), inter=(20e-6, 1 / 5e9), gamma=1 / 50e9)
    n, p = 1 << 24, 16
    across = node_bounds("all_reduce", p, n, [two.node_of(r) for r in range(p)])
    assert across.steps == 2 and across.bytes_moved == pytest.approx(2 * 3 / 4 * n)
    assert bound_time("all_reduce", p, n, two) == pytest.approx(2 * 20e-6 + 1.5 * n / 5e9)
    # one node: the fastest link's bound, as before
    assert node_bounds("all_reduce", 4, n, [0] * 4).bytes_moved == 0
    # a valid bound: every algorithm's simulated time is at least it
    for name in ("ring", "hierarchical", "rabenseifner", "recursive_doubling"):
        sim = ringcoll.simulate("all_reduce", name, p, numel=n // 4, dtype=torch.float32, data=False,
                                machine=two, local_size=4)
        assert sim.stats.time >= bound_time("all_reduce", p, n, two), name
    for collective in ("all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all"):
        assert node_bounds(collective, p, n, [r // 4 for r in range(p)]).bytes_moved > 0, collective


def test_simulate_says_its_dtype():
    sim = ringcoll.simulate("all_reduce", "ring", 3, numel=10)
    assert sim.dtype == torch.int64 and "dtype=torch.int64" in repr(sim) and sim.nbytes == 80
    assert ringcoll.simulate("all_reduce", "ring", 3, numel=10, dtype=torch.float32).dtype == torch.float32
    assert "int64" in ringcoll.simulate.__doc__


@pytest.mark.parametrize("keyword,value", [("auto", "no"), ("auto", 1), ("check", "yes"), ("check", 0)])
def test_register_refuses_a_non_bool_auto_or_check(keyword, value):
    """``auto="no"`` would have joined auto (bool("no") is True): refused, naming the keyword,
    before anything is registered."""
    before = ringcoll.algorithms("all_reduce")
    with pytest.raises(TypeError, match=f"{keyword} must be None or a bool, got"):
        ringcoll.register("all_reduce", "not_registered", cost=lambda p, n: ringcoll.Cost(1, 0, 0),
                          **{keyword: value})
    assert ringcoll.algorithms("all_reduce") == before
