"""ringcoll-bench: the harness's pieces, the specs against the built-ins, and a smoke run."""
from __future__ import annotations

import csv
import json
import os
import statistics

import pytest
import torch

import ringcoll
from ringcoll.bench import cli, harness, report, specs, summary, tune
from ringcoll.bench.harness import BUILTIN, Job, Row
from ringcoll.bench.specs import IN_PLACE, OUT_OF_PLACE, SPECS, Case, Pattern


# -- sizes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, nbytes", [("8", 8), ("1K", 1024), ("64M", 64 << 20), ("1G", 1 << 30),
                                          ("4k", 4096), ("2KiB", 2048), ("16MB", 16 << 20), ("0.5K", 512)])
def test_parse_size(text, nbytes):
    assert cli.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "1X", "-4", "1.3"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="size"):
        cli.parse_size(text)


def test_size_range():
    assert cli.size_range(1024, 64 << 20, 4) == [1024 << (2 * k) for k in range(9)]
    assert cli.size_range(8, 40, step=16) == [8, 24, 40]
    assert cli.size_range(1024, 1024, 2) == [1024]
    with pytest.raises(ValueError, match="factor"):
        cli.size_range(1024, 4096, 1)
    with pytest.raises(ValueError, match="maxbytes"):
        cli.size_range(4096, 1024, 2)


def test_flags_parse_like_nccl_tests():
    options = cli.parser().parse_args(["-b", "8", "-e", "128M", "-f", "2", "-n", "5", "-w", "1", "-c", "0",
                                       "-o", "max", "-d", "half", "-r", "1", "--np", "3"])
    assert (options.minbytes, options.maxbytes, options.stepfactor) == (8, 128 << 20, 2)
    assert (options.iters, options.warmup_iters, options.check) == (5, 1, 0)
    assert (options.op, harness.DTYPES[options.datatype], options.root, options.np) == ("max", "float16", 1, 3)


# -- facts per collective --------------------------------------------------------------------

def test_bus_factors_are_nccl_tests():
    for world in (2, 3, 4, 8):
        ring = (world - 1) / world
        assert SPECS["all_reduce"].bus_factor(world) == pytest.approx(2 * ring)
        for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "all_gather", "reduce_scatter_tensor", "reduce_scatter",
                     "all_to_all_single", "all_to_all", "gather", "scatter"):
            assert SPECS[name].bus_factor(world) == pytest.approx(ring), name
        for name in ("broadcast", "reduce"):
            assert SPECS[name].bus_factor(world) == 1.0, name


def test_bandwidths():
    algbw, busbw = harness.bus_bandwidth(SPECS["all_reduce"], 4_000_000, 0.002, 4)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(3.0)
    assert harness.bus_bandwidth(SPECS["barrier"], 0, 0.001, 4) == (0.0, 0.0)


def test_numel_rounds_to_whole_chunks():
    assert SPECS["all_reduce"].numel(1000, 4, 3) == 250
    assert SPECS["all_gather_single"].numel(1000, 4, 3) == 249
    assert SPECS["reduce_scatter_tensor"].numel(8, 4, 3) == 0
    assert SPECS["barrier"].numel(1 << 20, 4, 3) == 0


def test_variants():
    assert SPECS["all_reduce"].variants == (IN_PLACE,)
    assert SPECS["all_gather_single"].variants == (OUT_OF_PLACE, IN_PLACE)
    assert SPECS["reduce_scatter_tensor"].variants == (OUT_OF_PLACE, IN_PLACE)


# -- data and #wrong ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.bool])
def test_pattern_is_exact_and_never_zero(dtype):
    pat = Pattern(1000, specs.levels_for("sum"), dtype, torch.device("cpu"))
    a, b = pat.values(0), pat.values(1)
    assert a.dtype == dtype and a.numel() == 1000
    assert not torch.equal(a, b)                             # ranks differ
    assert torch.equal(pat.values(1, 100, 300), b[100:300])  # a slice is the same elements
    if dtype != torch.bool:
        assert int((a == 0).sum()) == 0
        assert set(a.unique().tolist()) <= {1, 2, 3, 4}
        assert len(set(a[:64].tolist())) > 1               # not constant


def test_reduced_is_the_exact_reduction():
    pat = Pattern(500, specs.levels_for("sum"), torch.float16, torch.device("cpu"))
    world = 5
    wide = sum(pat.values(r).double() for r in range(world))
    assert torch.equal(specs.reduced(pat, world, "sum").double(), wide)
    assert torch.equal(specs.reduced(pat, world, "avg").double(), (wide / world).half().double())
    big = Pattern(500, specs.levels_for("max"), torch.int32, torch.device("cpu"))
    assert torch.equal(specs.reduced(big, 3, "max"), torch.stack([big.values(r) for r in range(3)]).amax(0))
    two = Pattern(500, specs.levels_for("prod"), torch.float32, torch.device("cpu"))
    assert set(two.values(0).unique().tolist()) == {1.0, 2.0}


def test_count_wrong_and_spoil():
    expected = torch.arange(1, 11, dtype=torch.float32)
    actual = expected.clone()
    assert specs.count_wrong(actual, expected) == 0
    actual[3] += 1
    actual[7] = float("nan")
    assert specs.count_wrong(actual, expected) == 2
    for dtype in (torch.float32, torch.int8, torch.uint8, torch.bool):
        want = Pattern(64, 100, dtype, torch.device("cpu")).values(2)
        out = torch.empty_like(want)
        specs.spoil(out, want)
        assert specs.count_wrong(out, want) == 64, dtype
    assert specs.count_wrong(torch.ones(3), torch.ones(4)) == 4


def _case(name, rank=0, world=2, numel=12, variant=None, op="sum", dtype=torch.int32):
    spec = SPECS[name]
    return Case(rank, world, numel, dtype, torch.device("cpu"), op if spec.reduces else None, 0,
                variant or spec.variants[0])


@pytest.mark.parametrize("name, variant", [(n, v) for n in SPECS if n != "barrier" for v in SPECS[n].variants])
def test_check_counts_an_untouched_output_wrong(name, variant):
    """A collective that does nothing leaves every checked element wrong (world 2, root 0;
    checked at the root, except broadcast, whose root holds the answer already)."""
    instance = SPECS[name].setup(_case(name, rank=1 if name == "broadcast" else 0, variant=variant))
    checked = sum(want.numel() for _, want in instance.expected())
    assert checked > 0
    if SPECS[name].family == "all_gather" and variant == IN_PLACE and name != "all_gather":
        checked -= 12 // 2          # its own chunk is its input, in place: right already
    assert instance.check(lambda *args: None, None) == checked


def test_check_counts_zero_for_the_identity_at_world_1():
    """At world 1 every collective is the identity on its data: doing nothing (in place) or
    copying input to output is right."""
    instance = SPECS["all_reduce"].setup(_case("all_reduce", world=1, numel=10))
    assert instance.check(lambda *args: None, "sum") == 0
    instance = SPECS["all_gather_single"].setup(_case("all_gather_single", world=1, numel=10))
    assert instance.check(lambda out, inp: out.copy_(inp), None) == 0


# -- summarising and the table ---------------------------------------------------------------

def _raw(times_by_rank, wrong=0, error=None, variant=IN_PLACE, name=BUILTIN):
    return [{"numel": 256, "variants": {variant: {name: {"times": times, "wrong": wrong, "error": error}}}}
            for times in times_by_rank]


def test_summarize_takes_max_over_ranks_then_median():
    job = Job("all_reduce", 1024, algorithms=("ring",), iters=3)
    per_rank = [{"numel": 256, "variants": {IN_PLACE: {
        BUILTIN: {"times": [1e-3, 5e-3, 3e-3], "wrong": 0, "error": None},
        "ring": {"times": [4e-3, 4e-3, 8e-3], "wrong": 1, "error": None}}}},
        {"numel": 256, "variants": {IN_PLACE: {
            BUILTIN: {"times": [2e-3, 1e-3, 4e-3], "wrong": 0, "error": None},
            "ring": {"times": [2e-3, 6e-3, 2e-3], "wrong": 2, "error": None}}}}]
    rows = {r.algorithm: r for r in harness.summarize(job, per_rank)}
    assert rows[BUILTIN].time_us == pytest.approx(4000)          # max per round [2, 5, 4] ms
    assert rows["ring"].time_us == pytest.approx(6000)           # [4, 6, 8] ms
    assert rows["ring"].vs_builtin == pytest.approx(1.5)
    assert rows["ring"].wrong == 3 and rows[BUILTIN].wrong == 0
    assert rows["ring"].size == 1024 and rows["ring"].count == 256 and rows["ring"].root == -1
    assert rows["ring"].busbw == pytest.approx(1024 / 6e-3 / 1e9 * 2 * (1 / 2))


def test_summarize_reports_errors():
    job = Job("all_reduce", 1024)
    per_rank = [{"numel": 256, "variants": {IN_PLACE: {BUILTIN: {"times": [], "wrong": None,
                                                                 "error": "failed on another rank"}}}},
                {"numel": 256, "variants": {IN_PLACE: {BUILTIN: {"times": [], "wrong": None,
                                                                 "error": "ValueError: no"}}}}]
    (row,) = harness.summarize(job, per_rank)
    assert row.error == "ValueError: no" and row.time_us is None and row.wrong is None


def _row(name, variant, size, time_us, wrong=0, error=None, ratio=None):
    algbw = size / time_us / 1e3 if time_us else None
    return Row("reduce_scatter_tensor", variant, name, size, size // 4, "float32", "sum", -1, time_us,
               algbw, algbw * 0.75 if algbw else None, wrong, ratio, error=error)


def test_table_format():
    rows = [_row(BUILTIN, OUT_OF_PLACE, 1024, 100.0), _row(BUILTIN, IN_PLACE, 1024, 90.0),
            _row("ring", OUT_OF_PLACE, 1024, 50.0, ratio=0.5), _row("ring", IN_PLACE, 1024, 45.0, ratio=0.5),
            _row("pairwise", OUT_OF_PLACE, 1024, 200.0, wrong=7, ratio=2.0),
            _row("pairwise", IN_PLACE, 1024, None, wrong=None, error="RuntimeError: x"),
            _row(BUILTIN, OUT_OF_PLACE, 4096, 120.0)]
    variants = report.variants_of(rows)
    header = report.table_header("reduce_scatter_tensor", variants, "4 ranks")
    lines = report.table_lines(rows, variants)
    assert header[0].startswith("# reduce_scatter_tensor")
    assert "out-of-place" in header[1] and "in-place" in header[1]
    assert header[2].count("time(us)") == 2 and header[2].count("vs built-in") == 2
    assert "size(B)" in header[2] and "#wrong" in header[2] and "algorithm" in header[2]
    assert len({len(line) for line in header[2:] + lines}) == 1          # the columns line up
    assert [line.split()[5] for line in lines] == [BUILTIN, "ring", "pairwise", BUILTIN]
    first = lines[0].split()
    assert first[:5] == ["1024", "256", "float32", "sum", "-1"]
    assert first[6:12] == ["100.0", "--", "0.010", "0.008", "0", "1.00"]     # no rounds: no spread
    assert lines[1].split()[11] == "0.50"
    assert lines[2].split()[10] == "7" and lines[2].split()[11] == "2.00"
    assert lines[2].split()[-6:] == ["--", "--", "--", "--", "err", "--"]
    assert len(lines[3].split()) == 6 + 6             # no in-place row at 4096: blank cells
    summary = report.summary_lines(rows)
    assert any("ring" in line and "0.50" in line for line in summary)
    assert any("pairwise" in line and "RuntimeError" in line for line in summary)
    # an algorithm that handed back wrong elements is marked where its numbers are read (#40)
    marked = [line for line in summary if "WRONG RESULTS" in line]
    assert len(marked) == 1 and "pairwise" in marked[0] and "#wrong 7" in marked[0], summary
    footer = report.avg_bus_bandwidth(rows)[0]
    assert footer.count("WRONG") == 1 and "pairwise 0.004 (WRONG: 7 elements)" in footer, footer


def test_choose_collectives():
    catalogue = {"all_reduce": ["ring"], "all_gather_single": ["ring"], "all_gather": ["ring"]}
    assert cli.choose_collectives(None, catalogue) == ["all_reduce"]
    assert cli.choose_collectives(["all"], catalogue) == ["all_reduce", "all_gather_single"]
    assert cli.choose_collectives(["all_gather,all_reduce", "all_reduce"], catalogue) == ["all_gather", "all_reduce"]
    with pytest.raises(cli.OptionError, match="collective"):
        cli.choose_collectives(["allreduce"], catalogue)
    with pytest.raises(cli.OptionError, match="no ringcoll implementation"):
        cli.choose_collectives(["broadcast"], catalogue)
    assert cli.choose_algorithms("ring,auto,nope,built-in", ["ring", "tree"]) == ["ring", "auto"]


def _options(*argv):
    options = cli.parser().parse_args(list(argv))
    options.argv = list(argv)
    return options


def test_make_jobs():
    catalogue = {"all_reduce": ["ring", "tree"], "all_gather_single": ["ring"], "barrier": ["x"]}
    jobs = cli.make_jobs(_options("--collective", "all", "-b", "4", "-e", "64", "-f", "2",
                                  "--algorithms", "tree,ring"), catalogue, 3)
    reduce_jobs = [j for j in jobs if j.collective == "all_reduce"]
    assert [j.size for j in reduce_jobs] == [4, 8, 16, 32, 64]
    assert reduce_jobs[0].algorithms == ("tree", "ring", specs.P2P_FLOOR)     # its floor always
    # all_gather needs whole chunks: 4 and 8 bytes are under one float32 per rank
    assert [j.size for j in jobs if j.collective == "all_gather_single"] == [16, 32, 64]
    assert [j.size for j in jobs if j.collective == "barrier"] == [0]
    with pytest.raises(cli.OptionError, match="avg"):
        cli.make_jobs(_options("-o", "avg", "-d", "int32"), catalogue, 2)
    with pytest.raises(cli.OptionError, match="bxor"):
        cli.make_jobs(_options("-o", "bxor", "-d", "float"), catalogue, 2)
    with pytest.raises(cli.OptionError, match="none of"):
        cli.make_jobs(_options("--algorithms", "ring,nope"), catalogue, 2)
    with pytest.raises(SystemExit):
        cli.main(["--collective", "no_such_collective"])


def test_catalogue_lists_what_ringcoll_has():
    catalogue = cli.benchmarkable()
    assert catalogue["all_reduce"] == ringcoll.algorithms("all_reduce")
    for name in catalogue:
        assert hasattr(ringcoll, name)


# -- in the simulator: every spec, every algorithm, worlds that are not powers of two ------------

def _simulated_wrong(name: str, algorithm: str, world: int, numel: int, dtype, op: str, variant: str) -> int:
    """#wrong of ``algorithm`` run by the simulator on the buffers the spec sets up on every rank
    (the very tensors: in-place aliasing kept), counted by the spec's own check."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import Context
    from ringcoll.sim.engine import run_plans

    spec = SPECS[name]
    instances, plans = [], []
    for rank in range(world):
        case = Case(rank, world, spec.numel(numel * dtype.itemsize, dtype.itemsize, world), dtype,
                    torch.device("cpu"), op if spec.reduces else None, world - 1, variant)
        instance = spec.setup(case)
        expected = instance.expected()
        instance.reset()
        for out, want in expected:
            specs.spoil(out, want)
        instance.reset()
        captured = []
        instance.call(lambda *args: captured.append(args))
        plans.append(BUILDERS[name](Context(rank, world), *captured[0], algorithm=algorithm))
        instances.append((instance, expected))
    with torch.no_grad():
        run_plans(plans)                    # with each plan's before/after steps, as the executor
    return sum(specs.count_wrong(out, want, op) for instance, expected in instances for out, want in expected)


def test_specs_with_every_algorithm_in_the_simulator():
    """The specs' data and checks at worlds 3 and 5 (the real-group tests run at 2), root
    world - 1, non-whole chunks, with every registered algorithm of every collective."""
    catalogue = cli.benchmarkable()
    bad = []
    for name, algorithms in catalogue.items():
        if not SPECS[name].sized or SPECS[name].family is None:     # sendrecv: no plan, torch's p2p
            continue
        for algorithm in algorithms:
            for world, numel, dtype, op in ((3, 301, torch.int32, "sum"), (5, 1003, torch.float32, "max")):
                for variant in SPECS[name].variants:
                    wrong = _simulated_wrong(name, algorithm, world, numel, dtype, op, variant)
                    if wrong:
                        bad.append((name, algorithm, variant, world, wrong))
    assert not bad


# -- on a real group ---------------------------------------------------------------------------

def test_specs_agree_with_the_builtins(clusters):
    """Every spec's expected data is what torch.distributed's own collective produces: sizes
    that are not whole chunks, root 1, several dtypes and ops. (World 2: the one world this
    file spawns; the expected data's rank arithmetic is world-generic, checked in-process.)"""
    cases = []
    for name, spec in SPECS.items():
        for dtype, op in (("float32", "sum"), ("int8", "sum"), ("bfloat16", "prod"), ("uint8", "bxor"),
                          ("bool", "max"), ("float64", "min")):
            if op != "sum" and not spec.reduces:
                continue
            for size in ((40, 1002) if op == "sum" else (1002,)):
                cases.append(Job(name, size, dtype, op, root=1, iters=1, warmup=0))
    results = clusters(2).run(harness.measure_all, cases)
    bad = []
    for i, job in enumerate(cases):
        for row in harness.summarize(job, [r[i] for r in results]):
            if row.wrong != 0 or row.error:
                bad.append((job.collective, row.variant, job.dtype, job.op, job.size, row.wrong, row.error))
    assert not bad


def test_a_failing_contestant_is_reported_not_fatal(clusters):
    job = Job("all_reduce", 64, algorithms=("no_such_algorithm",), iters=1, warmup=0)
    rows = {r.algorithm: r for r in harness.summarize(job, clusters(2).run(harness.measure, job))}
    assert rows[BUILTIN].wrong == 0 and rows[BUILTIN].error is None and rows[BUILTIN].iters == 1
    assert "no_such_algorithm" in rows["no_such_algorithm"].error and rows["no_such_algorithm"].iters == 0
    assert "Traceback" in rows["no_such_algorithm"].traceback


def test_cli_smoke(clusters, tmp_path, capsys):
    """Every benchmarkable collective, every algorithm, tiny sizes: files written, nothing
    wrong; a time limit already passed stops every rank after the same round."""
    out = tmp_path / "results"
    status = cli.main(["--collective", "all", "--np", "2", "-b", "1K", "-e", "4K", "-n", "4", "-w", "1",
                       "--max-seconds", "1e-9", "--out", str(out), "--tune"], cluster=clusters(2))
    printed = capsys.readouterr().out
    assert status == 0, printed
    files = sorted(os.listdir(out))
    (json_name,) = [f for f in files if f.endswith(".json")]
    (csv_name,) = [f for f in files if f.endswith(".csv") and not f.endswith("_tuning.csv")]
    assert "_np2_" in json_name
    data = json.loads((out / json_name).read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["torch"] == torch.__version__
    rows = data["rows"]
    catalogue = cli.benchmarkable()
    expected = [n for n in catalogue if SPECS[n].primary]
    assert sorted({r["collective"] for r in rows}) == sorted(expected)    # the floors are rows of theirs
    for name in expected:
        names = {r["algorithm"] for r in rows if r["collective"] == name}
        floor = {specs.P2P_FLOOR} if SPECS[name].has_floor else set()
        assert names == {BUILTIN, "auto", *catalogue[name], *floor}, name
        if SPECS[name].sized:
            assert f"{json_name[:-5]}_{name}.png" in files
    assert all(r["wrong"] == 0 and r["error"] is None for r in rows), [r for r in rows if r["wrong"] or r["error"]]
    assert all(r["time_us"] > 0 and r["iters"] == harness.MIN_ROUNDS for r in rows)   # the time limit
    with open(out / csv_name, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows) and table[0]["world_size"] == "2"
    assert "vs built-in" in printed and "# all_reduce" in printed and "# Avg bus bandwidth" in printed
    for r in rows:      # % of floor on the collectives with a floor only, the spread on every row
        spec = SPECS[r["collective"]]
        assert (r["floor_pct"] is not None) == spec.has_floor, r
        assert r["p10_us"] <= r["time_us"] <= r["p90_us"]
    (tuning,) = [f for f in files if f.endswith("_tuning.csv")]
    with open(out / tuning, newline="") as handle:
        bands = list(csv.reader(handle))
    assert bands[0] == ["collective", "nranks", "min_bytes", "max_bytes", "algorithm", "device"]
    assert {b[0] for b in bands[1:]} == {SPECS[n].family for n in expected if SPECS[n].sized}
    assert {b[5] for b in bands[1:]} == {"cpu"}         # gloo's rows: CUDA's table keeps its own
    assert (out / f"{json_name[:-5]}.txt").read_text().strip() in printed     # the tables, as printed
    table = summary.markdown([str(out / json_name)])
    assert "| all_reduce | ring |" in table and "| all_reduce | built-in |" in table


# -- a plain install: no tqdm, no matplotlib ---------------------------------------------------

_HIDE = '''
import sys


class _Hide:
    """Makes tqdm and matplotlib look absent, as in a plain ``pip install ringcoll``."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tqdm", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, _Hide())
'''


def test_console_script_without_the_bench_extra(tmp_path):
    """``ringcoll-bench --np 2 -b 1K -e 4K -n 2`` outside the checkout with tqdm and matplotlib
    hidden (a sitecustomize on PYTHONPATH, so the spawned ranks see the same): it runs, writes
    the tables, JSON and CSV to ./ringcoll-bench-results, and says in one line what it skipped."""
    import subprocess
    import sys

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(_HIDE)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))}
    probe = subprocess.run([sys.executable, "-c", "import tqdm"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "hidden by the test" in probe.stderr      # the blocker works
    script = os.path.join(os.path.dirname(sys.executable), "ringcoll-bench")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "ringcoll.bench.cli"]
    done = subprocess.run(command + ["--np", "2", "-b", "1K", "-e", "4K", "-n", "2"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and "tqdm" in skipped[0] and "matplotlib" in skipped[0], done.stdout
    out = work / cli.OUTSIDE_OUT
    files = sorted(os.listdir(out))
    assert [f.rsplit(".", 1)[1] for f in files] == ["csv", "json", "txt"], files
    rows = json.loads((out / files[1]).read_text())["rows"]
    assert rows and all(r["wrong"] == 0 and r["error"] is None for r in rows)
    assert "# all_reduce" in (out / files[2]).read_text()


def test_default_out_is_the_checkouts_results_only_inside_it(tmp_path):
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    assert cli.default_out(checkout) == os.path.join("bench", "results", "runs")
    assert cli.default_out(checkout, kind="workloads") == os.path.join("bench", "results", "workloads")
    assert cli.default_out(str(tmp_path)) == "ringcoll-bench-results"


# -- spread, noise flag, per-rank count, the floor, the footer ------------------------------------

def test_percentile_and_spread():
    assert harness.percentile([5.0], 0.1) == 5.0
    assert harness.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert harness.percentile([10.0, 0.0], 0.9) == pytest.approx(9.0)      # sorted, interpolated
    assert harness.percentile(list(range(11)), 0.1) == pytest.approx(1.0)


def test_summarize_spread_flags_noisy_rows_and_their_contestants():
    """A built-in whose p90/p10 exceeds 2 flags every row of its size (the ratios are
    noise-prone); a steady built-in flags only the noisy contestant."""
    def run(builtin_times, ring_times):
        per_rank = [{"numel": 256, "variants": {IN_PLACE: {
            BUILTIN: {"times": builtin_times, "wrong": 0, "error": None},
            "ring": {"times": ring_times, "wrong": 0, "error": None}}}}]
        return {r.algorithm: r for r in harness.summarize(Job("all_reduce", 1024, algorithms=("ring",)), per_rank)}

    steady = [1e-3] * 9 + [1.1e-3]
    bimodal = [0.26e-3] * 5 + [3.4e-3] * 5          # the 0.26 ms / 3.4 ms built-in
    rows = run(bimodal, steady)
    assert rows[BUILTIN].noisy and rows["ring"].noisy
    assert rows[BUILTIN].p10_us == pytest.approx(260) and rows[BUILTIN].p90_us == pytest.approx(3400)
    rows = run(steady, bimodal)
    assert not rows[BUILTIN].noisy and rows["ring"].noisy
    rows = run(steady, steady)
    assert not rows[BUILTIN].noisy and not rows["ring"].noisy
    assert rows["ring"].p10_us == pytest.approx(1000) and rows["ring"].p90_us == pytest.approx(1010)
    lines = report.table_lines(list(run(steady, bimodal).values()), [IN_PLACE])
    assert lines[0].split()[11] == "1.00" and lines[1].split()[11].endswith(report.NOISY_MARK)
    assert lines[0].split()[7] == "1000-1010"


def test_count_is_per_rank_for_all_gather_and_reduce_scatter():
    per_rank = [{"numel": 256, "variants": {OUT_OF_PLACE: {BUILTIN: {"times": [1e-3], "wrong": 0, "error": None}}}}] * 4
    for name, count in (("all_gather_single", 64), ("reduce_scatter_single", 64), ("all_gather", 64),
                        ("reduce_scatter", 64), ("all_to_all_single", 256), ("gather", 256)):
        (row,) = harness.summarize(Job(name, 1024, variants=(OUT_OF_PLACE,)), per_rank)
        assert (row.size, row.count) == (1024, count), name


def _per_rank(times: dict, numel: int = 1024, variant: str = OUT_OF_PLACE) -> list:
    """Four ranks' measure() results of one variant: each contestant's one round."""
    return [{"numel": numel, "variants": {variant: {name: {"times": [t], "wrong": 0, "error": None}
                                                    for name, t in times.items()}}}] * 4


def test_a_ring_bound_floor_is_sendrecv_of_the_same_bytes_in_the_same_rounds():
    """all_reduce's p2p-floor row is a sendrecv of the size's bytes: its busbw takes
    sendrecv's bus factor (1), not all_reduce's (2(p-1)/p), and every row's %floor is its
    busbw / the floor's; a collective without a floor has no %floor."""
    job = Job("all_reduce", 4096, algorithms=("ring", specs.P2P_FLOOR), variants=(IN_PLACE,))
    rows = {r.algorithm: r for r in harness.summarize(job, _per_rank(
        {BUILTIN: 2e-3, "ring": 3e-3, specs.P2P_FLOOR: 1e-3}, variant=IN_PLACE))}
    floor = rows[specs.P2P_FLOOR]
    assert floor.busbw == pytest.approx(floor.algbw) == pytest.approx(4096 / 1e-3 / 1e9)
    assert rows["ring"].busbw == pytest.approx(4096 / 3e-3 / 1e9 * 1.5)
    assert rows["ring"].floor_pct == pytest.approx(50.0) and rows[BUILTIN].floor_pct == pytest.approx(75.0)
    assert floor.floor_pct == 100.0 and floor.vs_builtin == 0.5
    assert report.table_lines([rows["ring"]], [IN_PLACE])[0].split()[-1] == "50.0"
    assert tune.fastest(list(rows.values())) == {4096: "ring"}           # never a tuning candidate
    def row(name, busbw):
        return Row("all_reduce", IN_PLACE, name, 1024, 256, "float32", "sum", -1, 1.0, busbw, busbw, 0)

    assert report.avg_bus_bandwidth([row(BUILTIN, 2.0), row("ring", 2.0), row(specs.P2P_FLOOR, 4.0)]) == \
        ["# Avg bus bandwidth    : built-in 2.000, ring 2.000, p2p-floor 4.000 (GB/s)"]
    job = Job("broadcast", 4096, algorithms=("binomial",))
    assert all(r.floor_pct is None for r in harness.summarize(job, _per_rank(
        {BUILTIN: 2e-3, "binomial": 3e-3}, variant=IN_PLACE)))
    for name, spec in SPECS.items():
        assert (spec.floor_spec == specs.SENDRECV) == (spec.family in ("all_reduce", "all_gather", "reduce_scatter")), name


def test_an_own_floor_is_every_rows_percentage_and_never_a_tuning_candidate():
    """all_to_all_single's p2p-floor row: %floor = its time / the row's (100 on itself); the
    tuning table never picks it, even where it is fastest."""
    job = Job("all_to_all_single", 4096, algorithms=("linear", specs.P2P_FLOOR), variants=(OUT_OF_PLACE,))
    rows = {r.algorithm: r for r in harness.summarize(job, _per_rank({BUILTIN: 2e-3, "linear": 4e-3,
                                                                      specs.P2P_FLOOR: 1e-3}))}
    assert rows[specs.P2P_FLOOR].floor_pct == 100.0 and rows["linear"].floor_pct == 25.0
    assert rows[BUILTIN].floor_pct == 50.0 and rows[specs.P2P_FLOOR].vs_builtin == 0.5
    assert rows["linear"].busbw == pytest.approx(4096 / 4e-3 / 1e9 * 0.75)     # its own bus factor
    assert tune.fastest(list(rows.values())) == {4096: "linear"}


def test_the_own_floors_move_the_right_blocks(clusters):
    """Each p2p-floor contestant is checked like any other: at 3 ranks (where the left and
    right peers differ), a root that is not 0, a size that is not a whole number of chunks,
    its every element is what the built-in produces; made to send blocks to the wrong peers,
    it is counted wrong."""
    jobs = [Job(name, size, root=1, algorithms=(specs.P2P_FLOOR,), iters=1, warmup=0)
            for name in ("all_to_all_single", "all_to_all", "scatter", "gather") for size in (4, 1003 * 4)]
    results = clusters(3).run(harness.measure_all, jobs)
    for i, job in enumerate(jobs):
        rows = {r.algorithm: r for r in harness.summarize(job, [r[i] for r in results])}
        assert rows[specs.P2P_FLOOR].wrong == 0 and rows[specs.P2P_FLOOR].error is None, job
        assert rows[BUILTIN].wrong == 0, job
    swapped = clusters(3).run(_swapped_floor_wrong)
    assert all(wrong > 0 for wrong in swapped), swapped


def _swapped_floor_wrong() -> int:
    """all_to_all's floor with each send's block and peer mismatched (the blocks sent in
    reverse order): the wrong elements this rank counts."""
    original = specs._exchange

    def mismatched(sends, recvs, group=None):
        original([(tensor, peer) for (tensor, _), (_, peer) in zip(sends, reversed(sends))], recvs, group)

    specs._exchange = mismatched
    try:
        (result,) = harness.measure_all([Job("all_to_all", 1002 * 4, algorithms=(specs.P2P_FLOOR,),
                                             iters=1, warmup=0)])
    finally:
        specs._exchange = original
    return result["variants"][OUT_OF_PLACE][specs.P2P_FLOOR]["wrong"]


def test_the_floor_runs_in_the_rounds_of_the_collectives_that_have_one():
    """Every size of a collective with a floor gets the p2p-floor contestant (no separate
    sendrecv sweep); one without, or a world of one rank (no wire), gets none; sendrecv's
    own table still runs when asked for."""
    catalogue = {"all_reduce": ["ring"], "broadcast": ["binomial"], "scatter": ["linear"],
                 specs.SENDRECV: [harness.OURS]}
    jobs = cli.make_jobs(_options("--collective", "broadcast,all_reduce,scatter", "-b", "1K", "-e", "4K",
                                  "-f", "2"), catalogue, 2)
    assert [j.collective for j in jobs] == ["broadcast"] * 3 + ["all_reduce"] * 3 + ["scatter"] * 3
    assert [specs.P2P_FLOOR in j.algorithms for j in jobs] == [False] * 3 + [True] * 6
    assert not [j for j in cli.make_jobs(_options("--collective", "all_reduce"), catalogue, 1)
                if specs.P2P_FLOOR in j.algorithms]
    (job,) = cli.make_jobs(_options("--collective", "sendrecv", "-b", "1K", "-e", "1K"), catalogue, 2)
    assert job.collective == specs.SENDRECV and job.algorithms == (harness.OURS,)


def test_the_ring_bound_floors_move_their_own_bytes(clusters):
    """At 3 ranks, each ring-bound collective's floor runs sendrecv on buffers of its own (its
    check: every element from the left neighbour) beside the collective's contestants, whose
    checks are untouched by it; a size not a whole number of chunks included."""
    jobs = [Job(name, size, algorithms=("ring", specs.P2P_FLOOR), iters=2, warmup=0)
            for name in ("all_reduce", "all_gather_single", "reduce_scatter", "all_gather")
            for size in (12, 1003 * 4)]
    results = clusters(3).run(harness.measure_all, jobs)
    for i, job in enumerate(jobs):
        rows = harness.summarize(job, [r[i] for r in results])
        assert rows and all(r.wrong == 0 and r.error is None and r.iters == 2 for r in rows), (job, rows)
        floor = [r for r in rows if r.algorithm == specs.P2P_FLOOR]
        assert floor and all(r.busbw == r.algbw and r.floor_pct == 100.0 for r in floor), job


def test_sendrecv_spec_in_process():
    """The spec's data and check at world 3 with ringcoll.sendrecv's semantics played out by
    hand (each rank's send lands in its right neighbour's receive buffer)."""
    instances = [SPECS[specs.SENDRECV].setup(_case(specs.SENDRECV, rank=r, world=3, numel=10)) for r in range(3)]
    sent = {}
    for rank, instance in enumerate(instances):
        instance.call(lambda data, dst, received, src, rank=rank: sent.__setitem__(dst, data.clone()))
    wrong = [instance.check(lambda data, dst, received, src, rank=rank: received.copy_(sent[rank]), None)
             for rank, instance in enumerate(instances)]
    assert wrong == [0, 0, 0]


# -- the tuning table ------------------------------------------------------------------------------

def test_tuning_table_is_the_argmin_merged_into_bands(tmp_path):
    from ringcoll.bench import tune

    def row(collective, name, size, time_us, variant=OUT_OF_PLACE, wrong=0, error=None):
        return Row(collective, variant, name, size, size // 4, "float32", "sum", -1, time_us, 1.0, 1.0, wrong,
                   error=error)

    times = {   # size -> {algorithm: median}; auto and the built-in are faster still, never chosen
        1024: {"ring": 9, "recursive_doubling": 3, "rabenseifner": 5},
        4096: {"ring": 9, "recursive_doubling": 4, "rabenseifner": 5},
        16384: {"ring": 6, "recursive_doubling": 7, "rabenseifner": 5},
        65536: {"ring": 2, "recursive_doubling": 7, "rabenseifner": 5},
    }
    rows = [row("all_reduce", name, size, t, IN_PLACE) for size, by in times.items() for name, t in by.items()]
    rows += [row("all_reduce", name, size, 1, IN_PLACE) for size in times for name in (BUILTIN, "auto")]
    rows.append(row("all_reduce", "ring", 1024, 0.5, IN_PLACE, wrong=3))        # wrong: not a candidate
    rows += [row("all_to_all_single", "pairwise", 4096, 2), row("all_to_all_single", "linear", 4096, 3),
             row("all_to_all_single", "linear", 16384, 1), row("all_to_all_single", "bruck", 16384, 4, error="x")]
    rows += [row("all_gather", "ring", 4096, 1), row("all_gather_single", "bruck", 4096, 1),       # first wins
             row("all_gather_single", "bruck", 4096, 0.1, IN_PLACE)]
    rows += [row(specs.SENDRECV, harness.OURS, 4096, 0.1), row("barrier", "dissemination", 0, 1)]
    bands = tune.tuning_rows(rows, 4)
    assert [tuple(b.__dict__.values()) for b in bands] == [
        ("all_reduce", 4, 0, 16383, "recursive_doubling"),
        ("all_reduce", 4, 16384, 65535, "rabenseifner"),
        ("all_reduce", 4, 65536, 65536, "ring"),
        ("all_to_all", 4, 0, 4095, "pairwise"),          # by the largest block: size / world
        ("all_to_all", 4, 4096, 4096, "linear"),
        ("all_gather", 4, 0, 4096, "ring"),
    ]
    # each band's algorithm is the argmin of the medians at every measured size inside it
    for size, by in times.items():
        (band,) = [b for b in bands if b.collective == "all_reduce" and b.min_bytes <= size <= b.max_bytes]
        assert band.algorithm == min(by, key=by.get)
    path = tune.write_tuning(str(tmp_path / "t.csv"), bands)
    with open(path, newline="") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["collective", "nranks", "min_bytes", "max_bytes", "algorithm"]
    assert table[1] == ["all_reduce", "4", "0", "16383", "recursive_doubling"] and len(table) == 7


# -- --import: a user module's algorithms -------------------------------------------------------

CUSTOM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "custom_algo.py")


@pytest.fixture
def registry_restored():
    """The registry and sys.modules as they were: a user module's algorithm stays in this test."""
    import sys

    from ringcoll.schedules import registry

    saved = {collective: dict(table) for collective, table in registry._REGISTRY.items()}
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    sys.modules.pop("custom_algo", None)


def test_import_benchmarks_a_user_modules_algorithm(registry_restored, tmp_path, capsys):
    """``--import tests/tools/custom_algo.py``: the parent lists its all_reduce algorithm and the
    ranks the bench spawns import it too, so its row is measured and checked like ring's."""
    out = tmp_path / "results"
    status = cli.main(["--import", CUSTOM, "--np", "2", "--algorithms", "ring_reversed,ring", "-b", "1K",
                       "-e", "4K", "-n", "2", "-w", "0", "--no-plot", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    (json_name,) = [f for f in os.listdir(out) if f.endswith(".json")]
    data = json.loads((out / json_name).read_text())
    assert data["meta"]["imports"] == [CUSTOM]
    rows = [r for r in data["rows"] if r["collective"] == "all_reduce"]
    mine = [r for r in rows if r["algorithm"] == "ring_reversed"]
    assert sorted(r["size"] for r in mine) == [1024, 4096], rows        # -f 4: every size
    assert all(r["wrong"] == 0 and r["error"] is None and r["time_us"] > 0 for r in mine), mine
    assert "ring_reversed" in printed


@pytest.mark.parametrize("name", ["no_such_module_for_ringcoll", "missing/algo.py"])
def test_import_names_the_module_it_cannot_import(name, capsys):
    with pytest.raises(SystemExit, match=f"--import {name}: cannot import it"):
        cli.main(["--import", name, "--list"])


def test_import_of_a_broken_module_names_its_error(tmp_path, registry_restored):
    broken = tmp_path / "broken_algo.py"
    broken.write_text("raise RuntimeError('the user module fails')\n")
    with pytest.raises(SystemExit, match="--import .*broken_algo.py: cannot import it: RuntimeError: the user"):
        cli.main(["--import", str(broken), "--list"])


def test_the_header_warns_when_the_ranks_outnumber_the_cores():
    assert report.oversubscribed(4, 8) == [] and report.oversubscribed(2, 2) == []
    assert report.oversubscribed(3, None) == []             # cores unknown: no claim
    (line,) = report.oversubscribed(4, 2)
    assert line.startswith("# 4 ranks share 2 cores") and "slow_rounds" in line


def test_slow_rounds_script(tmp_path):
    """``python -m experiments.slow_rounds``: every way at the world asked for, each with its
    rounds, the share of slow ones and the calling thread's CPU; the JSON and the plot written;
    a world under 2, a world that is no number and no rounds refused before anything is
    spawned."""
    from experiments import slow_rounds

    slow_rounds.main(["--worlds", "2", "--rounds", "4", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "slow_rounds.json").read_text())
    (ways,) = data["results"].values()
    assert list(data["results"]) == ["2"] and list(ways) == list(slow_rounds.WAYS)
    for row in ways.values():
        assert len(row["rounds_us"]) == 4 and 0 <= row["slow_share"] <= 1 and row["cpu_us"] > 0
        assert row["median_us"] == pytest.approx(statistics.median(row["rounds_us"]))
    assert (tmp_path / "slow_rounds.png").stat().st_size > 0
    for bad in (["--worlds", "1"], ["--worlds", "two"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            slow_rounds.main([*bad, "--out", str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()
