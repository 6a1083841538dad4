"""``ringcoll-study sweep`` on network machines: --torus, --mesh, --fat-tree, --dragonfly with
--host/--link-latency/--hop-latency/--global-link/--placement build the machine the library's
constructors build, the sweep's cells are that machine's clock, and bad values are argparse
errors naming the option and the accepted form."""
from __future__ import annotations

import csv
import json

import pytest
import torch

import ringcoll
from ringcoll.sim.cli import main
from ringcoll.cost.machine import Machine
from _util import one_thread  # noqa: F401 - the simulator runs on one thread


def _run(tmp_path, *options):
    out = tmp_path / "out"
    assert main(["sweep", "--algorithms", "ring,recursive_doubling", "-b", "1K", "-e", "4K",
                 "--out", str(out), *options]) == 0
    with open(out / "study_all_reduce.csv") as f:
        rows = {(r["algorithm"], int(r["world"]), int(r["nbytes"])): r for r in csv.DictReader(f)}
    with open(out / "study_crossovers_all_reduce.txt") as f:
        machine = Machine.from_dict(json.loads(f.readline()[len("machine: "):]))
    return machine, rows


def _clock(machine, algorithm, world, nbytes):
    return ringcoll.simulate("all_reduce", algorithm, world, numel=nbytes // 4, dtype=torch.float32,
                             data=False, machine=machine).stats.time


def test_sweep_on_a_2x2_torus_builds_the_torus_and_times_its_cells(tmp_path):
    machine, rows = _run(tmp_path, "--torus", "2x2", "--worlds", "3,4", "--host", "2,50",
                         "--hop-latency", "0.5", "--link-latency", "1", "--gamma-gbps", "40")
    want = Machine.torus((2, 2), alpha=2e-6, beta=1 / 50e9, gamma=1 / 40e9, latency=1e-6, hop_latency=5e-7)
    assert machine == want
    assert {(a, w) for a, w, _ in rows} == {(a, w) for a in ("ring", "recursive_doubling") for w in (3, 4)}
    cell = rows[("ring", 3, 4096)]
    assert cell["source"] == "simulated"
    assert float(cell["seconds"]) == pytest.approx(_clock(want, "ring", 3, 4096), rel=1e-12)


def test_sweep_on_an_oversubscribed_fat_tree_with_a_random_placement(tmp_path):
    machine, rows = _run(tmp_path, "--fat-tree", "4:2:4", "--worlds", "5", "--placement", "random:7")
    want = Machine.fat_tree(4, levels=2, oversubscription=4.0, gamma=1 / 50e9, placement=("random", 7))
    assert machine == want and machine.network.hosts == 8
    seconds = float(rows[("ring", 5, 4096)]["seconds"])
    assert seconds == pytest.approx(_clock(want, "ring", 5, 4096), rel=1e-12)
    # the network's tapered links cost time: the same cell on the flat machine of the same α, β is faster
    assert seconds > _clock(Machine(gamma=1 / 50e9), "ring", 5, 4096)


def test_sweep_on_a_dragonfly_and_a_mesh(tmp_path):
    machine, _ = _run(tmp_path, "--dragonfly", "3,2,1,1", "--worlds", "6", "--global-link", "1,5")
    assert machine == Machine.dragonfly(3, 2, 1, 1, gamma=1 / 50e9, global_latency=1e-6,
                                       global_beta=1 / 5e9)
    machine, _ = _run(tmp_path, "--mesh", "3x2", "--worlds", "6")
    assert machine == Machine.mesh((3, 2), gamma=1 / 50e9)


@pytest.mark.parametrize("options, message", [
    (["--torus", "8y8"], "argument --torus: expected DIMS as positive ints joined by x"),
    (["--mesh", "0x4"], "argument --mesh: expected DIMS"),
    (["--fat-tree", "8:two"], "argument --fat-tree: expected RADIX[:LEVELS[:OVERSUBSCRIPTION]]"),
    (["--fat-tree", "5"], "--fat-tree: radix must be an even int"),
    (["--dragonfly", "5,4,2"], "argument --dragonfly: expected GROUPS,ROUTERS,HOSTS,GLOBAL_LINKS"),
    (["--dragonfly", "4,2,1,1"], "--dragonfly: a dragonfly's routers * global_links"),
    (["--torus", "2x2", "--host", "2"], "argument --host: expected LATENCY_US,GBPS"),
    (["--torus", "2x2", "--hop-latency", "-1"], "argument --hop-latency: expected a latency >= 0 in µs"),
    (["--torus", "2x2", "--placement", "shuffle"], "argument --placement: expected linear or random:SEED"),
    (["--placement", "random:1"], "--placement needs a network machine"),
    (["--torus", "2x2", "--global-link", "1,1"], "--global-link prices a dragonfly's global links"),
    (["--torus", "2x2", "--fat-tree", "4"], "give one machine, got --torus and --fat-tree"),
    (["--torus", "2x2", "--hierarchical", "2"], "give one machine, got --torus and --hierarchical"),
    (["--torus", "2x2", "--worlds", "4,5"], "--worlds: [5] do not fit on 2x2 torus"),
])
def test_bad_network_options_are_errors_naming_the_option(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--algorithms", "ring", "--worlds", "4", "--out", str(tmp_path / "x"), *options])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
