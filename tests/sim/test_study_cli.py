"""``ringcoll-study``'s options and outputs: bad numbers are argparse errors naming the option,
the expected and the given value before anything runs; ``fit`` prints and saves the fitted
machine; ``sweep`` and ``validate`` write JSON of every cell or row beside their tables."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest
import torch

import ringcoll
from ringcoll.sim.cli import main
from _util import MANY, bench_json, one_thread  # noqa: F401 - the simulator runs on one thread


@pytest.mark.parametrize("options, message", [
    (["-b", "0"], "argument -b/--minbytes: expected a size > 0 in bytes"),
    (["-b", "1.5"], "argument -b/--minbytes: expected a size > 0 in bytes"),
    (["-b", "4K", "-e", "1K"], "argument -e/--maxbytes: expected a size >= -b/--minbytes (4096 B), got 1024 B"),
    (["-f", "1"], "argument -f/--stepfactor: expected an int >= 2 (4), got '1'"),
    (["-f", "0"], "argument -f/--stepfactor: expected an int >= 2 (4), got '0'"),
    (["--worlds", "0"], "argument --worlds: expected world sizes >= 1 joined by commas (4,8,16), got '0'"),
    (["--worlds=-4"], "argument --worlds: expected world sizes >= 1 joined by commas (4,8,16), got '-4'"),
    (["--worlds="], "argument --worlds: expected world sizes >= 1 joined by commas (4,8,16), got ''"),
    (["--worlds", "4,,8"], "argument --worlds: expected world sizes >= 1"),
    (["--simulate-up-to", "0"], "argument --simulate-up-to: expected an int >= 1 (256), got '0'"),
    (["--ports", "0"], "argument --ports: expected an int >= 1 (2), got '0'"),
    (["--ports", "two"], "argument --ports: expected an int >= 1 (2), got 'two'"),
])
def test_bad_sweep_numbers_are_argparse_errors_naming_the_option(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--algorithms", "ring", "--out", str(tmp_path / "x"), *options])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("options, message", [
    (["--hierarchical", "0"], "argument --hierarchical: expected an int >= 1 (8), got '0'"),
    (["--nic-ports", "0"], "argument --nic-ports: expected an int >= 1 (1), got '0'"),
    (["--gamma-gbps", "0"], "argument --gamma-gbps: expected a bandwidth > 0 in GB/s (50), got '0'"),
    (["--gamma-gbps", "nan"], "argument --gamma-gbps: expected a bandwidth > 0 in GB/s (50), got 'nan'"),
    (["--intra", "2"], "argument --intra: expected LATENCY_US,GBPS"),
    (["--inter", "1,0"], "argument --inter: expected LATENCY_US,GBPS"),
    (["--inter=-1,10"], "argument --inter: expected LATENCY_US,GBPS"),
])
@pytest.mark.parametrize("command", ["sweep", "validate"])
def test_bad_machine_numbers_are_argparse_errors_in_sweep_and_validate(tmp_path, capsys, command, options,
                                                                       message):
    args = [command, *options] + (["run.json"] if command == "validate" else ["--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_fit_prints_its_errors_names_its_rows_and_saves_a_machine_sweep_reads(tmp_path, capsys):
    truth = ringcoll.Machine(alpha=20e-6, beta=1 / 5e9, gamma=1 / 12e9)
    run = bench_json(tmp_path / "run.json", truth, 4, MANY)
    # held out: the same machine 30 % slower on one row, so its error is known
    held = bench_json(tmp_path / "held.json", replace(truth, alpha=truth.alpha * 1.3, beta=truth.beta * 1.3,
                                                      gamma=truth.gamma * 1.3), 4, [("all_gather", "ring", 65536)])
    assert main(["fit", run, "--hold-out", held, "--out", str(tmp_path / "m.json"),
                 "--json", str(tmp_path / "fit.json")]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "fit.json").read_text())
    assert doc["command"][:2] == ["ringcoll-study", "fit"]
    machine = ringcoll.Machine.load(str(tmp_path / "m.json"))
    assert machine == ringcoll.Machine.from_dict(doc["machine"])
    assert machine.alpha == pytest.approx(truth.alpha, rel=0.05)
    rows = doc["rows"]
    assert [r["in_sample"] for r in rows] == [True] * len(MANY) + [False]
    assert rows[-1]["row"] == "all_gather/ring p=4 n=65536"
    # the errors stated are the rows' own: rms and worst over the fitted rows, the held-out row apart
    errors = [r["predicted_s"] / r["measured_s"] - 1 for r in rows]
    inside = errors[:-1]
    assert doc["in_sample"]["rms"] == pytest.approx(math.sqrt(sum(e * e for e in inside) / len(inside)))
    assert doc["in_sample"]["worst"] == pytest.approx(max(map(abs, inside)))
    assert 0.004 < doc["in_sample"]["worst"] < 0.02         # the +1 % rows, never an exact 0
    assert doc["held_out"]["rows"] == 1 and doc["held_out"]["worst"] == pytest.approx(abs(errors[-1]))
    assert abs(errors[-1]) == pytest.approx(1 - 1 / 1.3, rel=0.05)
    assert f"in-sample (fitted): {len(MANY)} rows, rms |error| {doc['in_sample']['rms'] * 100:.1f} %" in out
    assert "held out (not fitted): 1 rows" in out and "all_gather/ring p=4 n=65536" in out
    assert out.count("  in-sample\n") == len(MANY) and out.count("  held out\n") == 1
    # the saved machine is what --machine reads
    assert main(["sweep", "--machine", str(tmp_path / "m.json"), "--algorithms", "ring", "--worlds", "4",
                 "-b", "1K", "-e", "1K", "--out", str(tmp_path / "o"), "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["machine"] == doc["machine"]


@pytest.mark.parametrize("command", [["fit"], ["validate"]])
def test_fit_and_validate_refuse_a_run_they_cannot_read(tmp_path, capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([*command, str(tmp_path / "missing.json")])
    assert exit_.value.code == 2 and "missing.json" in capsys.readouterr().err


def test_sweep_writes_every_cell_the_machine_and_the_command_as_json(tmp_path):
    argv = ["sweep", "--collective", "all_reduce,broadcast", "--algorithms", "ring,binomial", "--worlds", "4,8",
            "-b", "1K", "-e", "4K", "--hierarchical", "2", "--simulate-up-to", "8", "--out", str(tmp_path / "o"),
            "--json", str(tmp_path / "s.json")]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["command"] == ["ringcoll-study", *argv]
    machine = ringcoll.Machine.from_dict(doc["machine"])
    assert machine.ranks_per_node == 2
    cells = {(c["collective"], c["algorithm"], c["world"], c["nbytes"]): c for c in doc["cells"]}
    assert set(cells) == {("all_reduce", "ring", w, n) for w in (4, 8) for n in (1024, 4096)} | \
        {("broadcast", "binomial", w, n) for w in (4, 8) for n in (1024, 4096)}
    with open(tmp_path / "o" / "study_all_reduce.csv") as f:
        for row in csv.DictReader(f):
            cell = cells[("all_reduce", row["algorithm"], int(row["world"]), int(row["nbytes"]))]
            assert cell["seconds"] == float(row["seconds"]) and cell["source"] == row["source"]
            assert cell["bound_ratio"] == float(row["bound_ratio"])
    # on a 2-level machine no closed form is the clock's across nodes: every cell simulated
    assert {cell["source"] for cell in cells.values()} == {"simulated"}


def test_validate_writes_every_row_and_the_given_machine_as_json(tmp_path):
    truth = ringcoll.Machine(alpha=20e-6, beta=1 / 5e9, gamma=1 / 12e9)
    run = bench_json(tmp_path / "run.json", truth, 4, MANY)
    other = ringcoll.Machine(alpha=2e-6, beta=1 / 50e9, gamma=1 / 100e9)
    other.save(str(tmp_path / "other.json"))
    assert main(["validate", run, "--machine", str(tmp_path / "other.json"), "--json", str(tmp_path / "v.json")]) == 0
    doc = json.loads((tmp_path / "v.json").read_text())
    assert ringcoll.Machine.from_dict(doc["machine"]) == other
    assert doc["label"] == str(tmp_path / "other.json") and "in_sample" not in doc
    assert len(doc["rows"]) == len(MANY) and not any(r["in_sample"] for r in doc["rows"])
    first = doc["rows"][0]
    want = ringcoll.simulate("all_reduce", "ring", 4, numel=1024 // 4, dtype=torch.float32, data=False,
                             machine=other).stats.time
    assert first["row"] == "all_reduce/ring p=4 n=1024" and first["predicted_s"] == pytest.approx(want, rel=1e-9)
    assert doc["against"]["worst"] == pytest.approx(max(abs(r["error"]) for r in doc["rows"]))


def test_a_sweep_whose_closed_forms_are_refused_is_an_argparse_error_before_anything_is_written(tmp_path, capsys):
    """Above --simulate-up-to on a 2-level machine no closed form is the clock's: the sweep
    refuses, naming the option and the cells, and writes nothing (it was a traceback)."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--hierarchical", "8", "--worlds", "8,16", "--simulate-up-to", "8", "-b", "64K", "-e", "64K",
              "--collective", "all_gather,all_reduce", "--algorithms", "ring", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--simulate-up-to 8: 2 cell(s) above it have no closed form equal to the clock" in err
    assert "all_gather/ring at 16 ranks" in err and "all_reduce/ring at 16 ranks" in err
    assert not out.exists()
