"""``ringcoll-study``'s options and outputs: bad numbers are argparse errors naming the option,
the expected and the given value before anything runs; ``fit`` prints and saves the fitted
machine; ``sweep`` and ``validate`` write JSON of every cell or row beside their tables."""
from __future__ import annotations

import pytest

from ringcoll.sim.cli import main
from _util import one_thread  # noqa: F401 - the simulator runs on one thread


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
