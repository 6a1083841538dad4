"""``ringcoll-bench``: every algorithm against the torch built-in, side by side, nccl-tests style.

    ringcoll-bench                                   # all_reduce, 4 ranks, 1 KiB - 64 MiB
    ringcoll-bench --collective all --np 2 -b 1K -e 16M -n 10 -w 2
    ringcoll-bench --collective broadcast,reduce -r 1 --algorithms binomial,auto
    ringcoll-bench --import mymodule.py --algorithms mine,ring   # algorithms a user module registers
    torchrun --nproc-per-node 8 -m ringcoll.bench.cli --backend nccl -b 8 -e 1G -f 2

Without torchrun it spawns a local cluster of ``--np`` ranks (gloo by default); under
torchrun every rank runs this program and rank 0 prints and writes. Each (collective, size)
is one ``cluster.run`` of :func:`ringcoll.bench.harness.measure` on every rank.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
from typing import List, Optional, Sequence

from ..config import parse_size
from .harness import (BUILTIN, DTYPES, OPS, OURS, Job, Row, failed_rows, import_module, job_numel, measure,
                      summarize)
from .report import (LEGEND, avg_bus_bandwidth, machine_info, oversubscribed, plot, summary_lines, table_header,
                     table_lines, write_csv, write_json)
from .specs import IN_PLACE, OUT_OF_PLACE, P2P_FLOOR, SPECS, available, family_of
from .tune import tuning_rows, write_tuning

class OptionError(ValueError):
    """A flag's value that cannot be run (reported without a traceback)."""


#: in the project checkout its results tree, one folder per kind; anywhere else a folder of the
#: current directory
DEFAULT_OUT = os.path.join("bench", "results")
OUTSIDE_OUT = "ringcoll-bench-results"


def default_out(cwd: Optional[str] = None, kind: str = "runs") -> str:
    """``bench/results/<kind>`` (``runs``, or ``workloads`` for ``--workload``) when run from the
    root of the project checkout (an editable install: this file is the checkout's
    ``bench/cli.py``), else ``./ringcoll-bench-results``: a plain install has no bench/results to
    fill."""
    here = os.path.abspath(cwd or os.getcwd())
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    inside = here == checkout and os.path.isdir(os.path.join(here, DEFAULT_OUT))
    return os.path.join(DEFAULT_OUT, kind) if inside else OUTSIDE_OUT


def optional(module: str):
    """The module, or None when it is not installed: the progress bar (tqdm) and the plots
    (matplotlib) are the ``[bench]`` extra, and a plain install still writes tables, JSON and
    CSV without them."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class _NoBar:
    """What the loop needs of a tqdm bar, without tqdm: lines are printed, nothing is drawn."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_description(self, text):
        pass

    def update(self, n=1):
        pass

    @staticmethod
    def write(line, file=None):
        print(line, file=file or sys.stdout)
def size_range(minbytes: int, maxbytes: int, factor: float = 2, step: int = 0) -> List[int]:
    """nccl-tests' sweep: from minbytes to maxbytes, times ``factor`` (or plus ``step``)."""
    if minbytes < 0 or maxbytes < minbytes:
        raise OptionError(f"sizes must satisfy 0 <= minbytes <= maxbytes, got {minbytes}, {maxbytes}")
    if step <= 0 and (factor <= 1 or minbytes == 0):
        raise OptionError(f"a sweep needs a step factor > 1 from a size > 0, or a step in bytes; got "
                         f"factor {factor}, step {step}, minbytes {minbytes}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(int(size))
        size = size + step if step > 0 else size * factor
    return sizes


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == 0:
            return action.help
        return super()._get_help_string(action)


def _presets() -> List[str]:
    from ..cost.gpu import presets
    return presets()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringcoll-bench", description=__doc__.split("\n\n")[0].replace("``", ""),
        formatter_class=_Help)
    p.add_argument("-b", "--minbytes", type=parse_size, default="1K", help="smallest size")
    p.add_argument("-e", "--maxbytes", type=parse_size, default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0, help="size increment (overrides -f)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed rounds per size")
    p.add_argument("-w", "--warmup_iters", type=int, default=2, help="warm-up rounds per size")
    p.add_argument("--max-seconds", type=float, default=8.0,
                   help="stop timing a size after this many seconds of rounds (at least 3 rounds; 0: "
                        "always -n)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="count wrong elements")
    p.add_argument("-o", "--op", choices=OPS, default="sum", help="reduction op")
    p.add_argument("-d", "--datatype", choices=sorted(DTYPES), default="float", metavar="TYPE",
                   help=f"element type: {', '.join(sorted(DTYPES))}")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of rooted collectives (default: 0)")
    p.add_argument("--collective", action="append",
                   help="collective(s): a torch.distributed function name, comma-separated or "
                        "repeated, or 'all' (every one ringcoll has; the list variants, the deprecated "
                        "names and sendrecv by name); default: all_reduce",
                   default=None, metavar="NAMES")
    p.add_argument("--algorithms", metavar="NAMES",
                   help="comma-separated subset of ringcoll's algorithms, 'auto' allowed "
                        "(default: every registered one and auto; the built-in always runs)")
    p.add_argument("--import", action="append", dest="imports", default=[], metavar="MODULE",
                   help="import MODULE (a module name, or a path to a .py file) first, here and in "
                        "every rank, so the algorithms it registers with ringcoll.register are "
                        "benchmarked like ringcoll's own; repeatable")
    p.add_argument("--msccl", action="append", default=[], metavar="FILE.xml",
                   help="load an MSCCL-IR algorithm (ringcoll.msccl.load), here and in every rank, and run it as "
                        "a contestant (its collective is the default --collective; the world must be its ngpus)")
    p.add_argument("--variant", choices=("both", OUT_OF_PLACE, IN_PLACE), default="both",
                   help="which variants of collectives that have both")
    p.add_argument("--np", type=int, metavar="N", help="ranks to spawn (default: 4; under torchrun: its world)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="torch.distributed backend")
    p.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda with nccl, else cpu)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one size may take; a collective that exceeds it (or crashes a "
                        "rank) is reported as failed and the sweep goes on with the next one")
    p.add_argument("--out", help="results directory (in the project checkout bench/results/runs, or "
                                 "bench/results/workloads with --workload; else ./ringcoll-bench-results)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--tune", nargs="?", const=True, default=None, metavar="CSV",
                   help="also write a tuning table (RINGCOLL_TUNING=CSV makes auto follow it): per "
                        "collective and size band the fastest algorithm measured (default file: "
                        "<stem>_tuning.csv in the results directory)")
    p.add_argument("--list", action="store_true", help="list the benchmarkable collectives and exit")
    p.add_argument("--simulate", metavar="MACHINE", choices=_presets(),
                   help=f"no ranks: every algorithm on the simulator's clock on this GPU cluster against "
                        f"NCCL's model (ringcoll.bench.simulated), one of {', '.join(_presets())}")
    p.add_argument("--nodes", type=int, default=1, help="--simulate: nodes of the machine")
    p.add_argument("--workload", choices=("ddp", "fsdp"),
                   help="time a training step (DDP or FSDP2) on backend 'ringcoll' vs 'gloo' instead")
    p.add_argument("--width", type=int, default=1024, help="--workload: the MLP's width")
    p.add_argument("--batch", type=int, default=32, help="--workload: samples per rank and step")
    return p


def import_user_modules(names: Sequence[str]) -> tuple:
    """Import each ``--import`` module; the names the ranks import them by (files as absolute
    paths). The current directory is searched first, as ``python -m`` does, so ``--import
    mymodule`` finds ./mymodule.py; spawned ranks inherit this path."""
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    resolved = []
    for name in names:
        target = os.path.abspath(name) if name.endswith(".py") else name
        try:
            import_module(target)
        except Exception as error:
            raise OptionError(f"--import {name}: cannot import it: {type(error).__name__}: {error}") from error
        resolved.append(target)
    return tuple(resolved)


def load_msccl(options) -> tuple:
    """Load each ``--msccl`` XML (ranks load them as ``--import``s); its collective becomes the
    default ``--collective`` and its name joins ``--algorithms`` when that is given."""
    files = tuple(os.path.abspath(path) for path in getattr(options, "msccl", ()))
    if not files:
        return ()
    from ringcoll import msccl
    collectives, names = [], []
    for path in files:
        try:
            name = msccl.load(path)
        except Exception as error:
            raise OptionError(f"--msccl {path}: {type(error).__name__}: {error}") from error
        collective = next(k[0] for k in msccl.loaded() if k[1] == name)
        collectives.append({"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single",
                            "all_to_all": "all_to_all_single"}.get(collective, collective))
        names.append(name)
    if not options.collective:
        options.collective = list(dict.fromkeys(collectives))
    if options.algorithms:
        options.algorithms = ",".join([options.algorithms, *names])
    options.msccl = files
    return files


def benchmarkable() -> dict:
    """collective -> ringcoll's algorithm names, for every spec whose function exists."""
    import ringcoll

    registered = ringcoll.algorithms()
    return {name: [OURS] if SPECS[name].family is None else list(registered[family_of(SPECS[name], registered)])
            for name in available(registered, ringcoll)}


def choose_collectives(requested: Optional[Sequence[str]], catalogue: dict) -> List[str]:
    names = [n.strip() for entry in (requested or ["all_reduce"]) for n in entry.split(",") if n.strip()]
    chosen: List[str] = []
    for name in names:
        if name == "all":
            chosen += [n for n in catalogue if SPECS[n].primary]
        elif name not in SPECS:
            raise OptionError(f"collective must be 'all' or one of {sorted(SPECS)}, got {name!r}")
        elif name not in catalogue:
            raise OptionError(f"collective {name!r} has no ringcoll implementation yet; "
                             f"benchmarkable: {sorted(catalogue)}")
        else:
            chosen.append(name)
    return list(dict.fromkeys(chosen))


def choose_algorithms(requested: Optional[str], registered: Sequence[str]) -> List[str]:
    if not requested:       # every algorithm, and what algorithm="auto" picks at each size
        return list(registered) + ["auto"]
    wanted = [a.strip() for a in requested.split(",") if a.strip() and a.strip() != BUILTIN]
    return [a for a in wanted if a == "auto" or a in registered]


def make_jobs(options, catalogue: dict, world: int, imports: tuple = ()) -> List[Job]:
    sizes = size_range(options.minbytes, options.maxbytes, options.stepfactor, options.stepbytes)
    jobs: List[Job] = []
    device = options.device or ("cuda" if options.backend == "nccl" else "cpu")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise OptionError("--device cuda (or --backend nccl) needs a GPU, and torch sees none")
    dtype = DTYPES[options.datatype]
    floating = dtype.startswith(("float", "bfloat"))
    chosen = choose_collectives(options.collective, catalogue)
    if options.algorithms:
        known = {a for name in chosen for a in catalogue[name]} | {"auto", BUILTIN, P2P_FLOOR}
        unknown = [a.strip() for a in options.algorithms.split(",") if a.strip() and a.strip() not in known]
        if unknown:
            raise OptionError(f"--algorithms names {unknown}, which none of {chosen} has; they have "
                              f"{ {name: catalogue[name] for name in chosen} }")
    for name in chosen:
        spec = SPECS[name]
        if spec.reduces and options.op == "avg" and not floating:
            raise OptionError(f"-o avg needs a floating-point -d, got {options.datatype}")
        if spec.reduces and options.op in ("band", "bor", "bxor") and floating:
            raise OptionError(f"-o {options.op} needs an integer or bool -d, got {options.datatype}")
        if spec.family is None:         # sendrecv: ringcoll's one function against torch's
            algorithms, variants = (OURS,), spec.variants
        else:
            algorithms = tuple(choose_algorithms(options.algorithms, catalogue[name]))
            if spec.has_floor and world > 1:
                algorithms += (P2P_FLOOR,)      # bare P2P in the same rounds (see specs.P2P_FLOOR)
            variants = spec.variants if options.variant == "both" else \
                tuple(v for v in spec.variants if v == options.variant)
        if not variants:
            continue
        if spec.rooted and not 0 <= options.root < world:
            raise OptionError(f"root must be in [0, {world}), got {options.root}")
        seen = set()
        for size in (sizes if spec.sized else [0]):
            job = Job(name, size, dtype, options.op, options.root, algorithms,
                      variants, options.iters, options.warmup_iters, bool(options.check), device,
                      options.max_seconds, imports)
            numel = job_numel(job, world)
            if spec.sized and (numel == 0 or numel in seen):
                continue            # too small to split among the ranks, or a repeat
            seen.add(numel)
            jobs.append(job)
    return jobs


def run(options, cluster=None):
    """Benchmark as ``options`` say, on ``cluster`` (else a new one); (meta, rows, files)."""
    import ringcoll

    tqdm_module = optional("tqdm")
    skipped = [] if tqdm_module else ["the progress bar (no tqdm)"]
    if not options.no_plot and optional("matplotlib") is None:
        skipped.append("the PNG plots (no matplotlib)")
        options.no_plot = True
    imports = import_user_modules(getattr(options, "imports", ()))
    imports += load_msccl(options)
    catalogue = benchmarkable()
    world = _world(options, cluster)
    jobs = make_jobs(options, catalogue, world, imports)      # bad options fail before any spawn
    if not jobs:
        raise OptionError("nothing to run: no size fits, or no variant selected")
    own = cluster is None
    if own and ringcoll.cluster.under_torchrun() and jobs[0].device == "cuda":
        import torch

        # one GPU per local rank, before the group exists (NCCL refuses two ranks on one GPU)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())

    def start():
        if ringcoll.cluster.under_torchrun():
            return ringcoll.launch(options.np, options.backend)
        # a transfer stuck in one rank fails there (RINGCOLL_TIMEOUT) before the cluster gives up
        return ringcoll.launch(world, options.backend, timeout=options.timeout,
                               env={"RINGCOLL_TIMEOUT": str(max(10.0, options.timeout / 3))})

    if own:
        cluster = start()
    main_rank = True
    if cluster.external:
        import torch.distributed as dist

        main_rank = dist.get_rank() == 0
    say = print if main_rank else (lambda *a, **k: None)
    try:
        date = datetime.datetime.now(datetime.timezone.utc)
        meta = _meta(options, world, jobs, imports, date)
        context = f"{world} ranks, {options.backend}, {meta['device']}"
        printed = _header(options, meta, context, world, cluster, skipped)
        for line in printed:
            say(line)
        bar_type = tqdm_module.tqdm if tqdm_module else _NoBar
        rows, cluster = _run_jobs(jobs, cluster, start, own, world, context, main_rank, bar_type, printed,
                                  options.timeout)
        meta["loadavg_end"] = machine_info().get("loadavg")
        files = _write(options, meta, rows, world, date, printed) if main_rank else []
        if options.tune and main_rank:
            files.append(write_tuning(options.tune if options.tune is not True else
                                      files[0][:-len(".json")] + "_tuning.csv", tuning_rows(rows, world),
                                      meta["device"]))
        for path in files:
            say(f"# wrote {path}")
        return meta, rows, files
    finally:
        if own:
            cluster.close()


def _world(options, cluster) -> int:
    """The benchmark's world size: the cluster's, torchrun's, else --np (4); --msccl programs
    must run at it."""
    import ringcoll

    if cluster is not None:
        world = cluster.world_size
    elif ringcoll.cluster.under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
    else:
        world = 4 if options.np is None else options.np
        if world < 1:
            raise OptionError(f"--np must be >= 1, got {world}")
    for path in getattr(options, "msccl", ()):
        from ringcoll import msccl

        program = next(info.program for info in msccl.loaded().values() if info.name == msccl.load(path))
        if program.ngpus != world:
            raise OptionError(f"--msccl {path}: the algorithm runs at {program.ngpus} ranks, the benchmark at "
                              f"{world} (--np {program.ngpus})")
    return world


def _meta(options, world: int, jobs, imports, date) -> dict:
    """What the run's JSON says of itself: when, where, what and how it was timed."""
    import ringcoll

    machine = machine_info()
    return {
        "date": date.isoformat(timespec="seconds"), "world_size": world,
        "backend": options.backend, "device": jobs[0].device, "torch": _torch_version(),
        "ringcoll": ringcoll.__version__, "hostname": machine["hostname"],
        "machine": machine, "command": " ".join(["ringcoll-bench"] + list(options.argv)),
        "iters": options.iters, "warmup": options.warmup_iters, "max_seconds": options.max_seconds,
        "check": bool(options.check), "imports": list(imports),
        "dtype": DTYPES[options.datatype], "op": options.op, "root": options.root,
        "collectives": {name: list(job.algorithms) for name, job in
                        {job.collective: job for job in jobs}.items()},
        "timing": "per round: barrier, then each contestant once in rotated order; per call "
                  "the maximum over ranks; the median over rounds after warm-up",
    }


def _header(options, meta: dict, context: str, world: int, cluster, skipped: List[str]) -> List[str]:
    """The table's opening lines: the run, the machine's load, the legend, what was skipped."""
    limit = f" (at most {options.max_seconds:g} s a size)" if options.max_seconds else ""
    load = meta["machine"].get("loadavg")
    printed = [f"# ringcoll-bench  {meta['date']}  torch {meta['torch']}  ringcoll {meta['ringcoll']}  "
               f"{meta['machine']['cpu_count']} cores, load average {load[0] if load else '?'}",
               f"# {context}; {options.iters} rounds{limit} after {options.warmup_iters} warm-up; "
               f"check {'on' if options.check else 'off'}; vs built-in = time / torch.distributed's time",
               LEGEND]
    if not cluster.external:            # every rank on this host
        printed += oversubscribed(world, meta["machine"]["cpu_count"])
    if skipped:
        printed.append(f"# skipped {' and '.join(skipped)}: pip install 'ringcoll[bench]' for them")
    return printed


def _run_jobs(jobs, cluster, start, own: bool, world: int, context: str, main_rank: bool, bar_type,
              printed: List[str], timeout: float):
    """Measure every job (size) in turn, printing each collective's table (``context``: its
    header's ranks, backend and device) as it fills; a collective that fails is reported in its
    rows and skipped after (a dead cluster restarted). Returns (rows, the cluster now)."""
    rows: List[Row] = []
    current = None
    # a bar only on a terminal: in a log its redraws bury the table
    with bar_type(total=len(jobs), disable=not (main_rank and sys.stderr.isatty()), unit="size", file=sys.stderr,
                  dynamic_ncols=True) as bar:
        broken = set()
        for index, job in enumerate(jobs):
            bar.set_description(f"{job.collective} {job.size} B")
            new: List[Row] = []
            try:
                if job.collective not in broken:
                    new = summarize(job, cluster.run(measure, job, timeout=timeout))
            except Exception as error:
                if not own or cluster.external:
                    raise
                new = failed_rows(job, world, error)
                broken.add(job.collective)
                if not cluster.alive:
                    cluster.close()
                    cluster = start()
            rows += new
            if main_rank:
                variants = [v for v in job.spec.variants if v in (job.variants or job.spec.variants)]
                lines = []
                if job.collective != current:
                    current = job.collective
                    lines += [""] + table_header(job.collective, variants, context)
                lines += table_lines(new, variants)
                if index + 1 == len(jobs) or jobs[index + 1].collective != job.collective:
                    mine = [r for r in rows if r.collective == job.collective]
                    lines += ["#"] + summary_lines(mine) + avg_bus_bandwidth(mine)
                for line in lines:
                    bar.write(line, file=sys.stdout)
                printed += lines
            bar.update(1)
    return rows, cluster


def _torch_version() -> str:
    import torch

    return torch.__version__


def _write(options, meta: dict, rows: List[Row], world: int, date, printed: List[str]) -> List[str]:
    os.makedirs(options.out, exist_ok=True)
    stem = os.path.join(options.out, f"{date:%Y%m%dT%H%M%SZ}_np{world}_{options.backend}")
    files = [stem + ".json", stem + ".csv", stem + ".txt"]
    write_json(files[0], meta, rows)
    write_csv(files[1], meta, rows)
    with open(files[2], "w") as handle:             # the tables as printed
        handle.write("\n".join(printed) + "\n")
    if not options.no_plot:
        for name in meta["collectives"]:
            path = f"{stem}_{name}.png"
            title = f"{name}: ringcoll vs torch.distributed ({world} ranks, {options.backend}, " \
                    f"{meta['device']}, {meta['dtype']})"
            if plot(path, name, [r for r in rows if r.collective == name], title):
                files.append(path)
    return files


def main(argv: Optional[Sequence[str]] = None, cluster=None) -> int:
    """The console script. ``cluster``: an existing ringcoll cluster to run on (tests).
    Exit status 1 when a ringcoll algorithm gives a wrong element or fails."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parser().parse_args(argv)
    if options.out is None:
        options.out = default_out(kind="workloads" if options.workload else "runs")
    options.argv = argv
    try:
        import_user_modules(options.imports)
    except OptionError as error:
        raise SystemExit(f"ringcoll-bench: {error}") from None
    if options.list:
        for name, algos in benchmarkable().items():
            print(f"{name:<24} {', '.join(algos)}{'' if SPECS[name].primary else '   (by name only, not in all)'}")
        return 0
    for flag, value in (("-n/--iters", options.iters), ("-w/--warmup_iters", options.warmup_iters)):
        if value < 0:
            raise SystemExit(f"ringcoll-bench: {flag} must be >= 0, got {value}")
    if options.iters == 0:
        raise SystemExit("ringcoll-bench: -n/--iters must be >= 1")
    if options.simulate:
        from .simulated import MODELLED, run as run_simulated

        try:
            chosen = choose_collectives(options.collective, {name: () for name in MODELLED})
        except OptionError as error:
            raise SystemExit(f"ringcoll-bench: --simulate prices {sorted(MODELLED)} (NCCL's model): {error}") from None
        if options.nodes < 1:
            raise SystemExit(f"ringcoll-bench: --nodes must be >= 1, got {options.nodes}")
        return run_simulated(options, chosen, size_range(options.minbytes, options.maxbytes, options.stepfactor,
                                                         options.stepbytes))
    if options.workload:
        from .workloads import run as run_workload

        return run_workload(options)
    try:
        _, rows, _ = run(options, cluster)
    except OptionError as error:
        raise SystemExit(f"ringcoll-bench: {error}") from None
    bad = [r for r in rows if r.algorithm != BUILTIN and (r.error or r.wrong)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
