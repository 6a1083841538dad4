"""``ringcoll-study``: algorithm sweeps on a simulated machine, and predictions against a run.

    ringcoll-study sweep --collective all_reduce --worlds 4,8,16,32,64 -b 1K -e 64M
    ringcoll-study sweep --hierarchical 8 --intra 2,100 --inter 10,10     # µs, GB/s
    ringcoll-study sweep --machine bench/results/runs/RUN.json                  # fitted to a run
    ringcoll-study sweep --torus 8x8 --host 2,50 --placement random:1      # a network machine
    ringcoll-study sweep --import mine.py --algorithms mine,ring --ports 2 # a user's algorithms
    ringcoll-study validate bench/results/runs/RUN.json [--machine m.json]
    ringcoll-study fit RUN.json [RUN.json ...] [--hold-out RUN.json] [--out machine.json]

``sweep`` writes a table (CSV, each cell's source: simulated or closed form), the crossover
sizes and ties (text) and a best-algorithm map (PNG: ``*`` closed form, ``=`` tie) per
collective into ``--out``. ``validate`` prints predicted and measured times side by side on
the machine fitted to the run itself, or on the given one, labelled as given (not fitted),
with the error bands of that machine's predictions. ``fit`` prints the same for the machine
fitted to its runs (each row marked in-sample or held out, the rms and worst error of each)
and saves that machine for ``--machine``. Each takes ``--json FILE``: every cell or row with
its fields, the machine (``Machine.to_dict``) and the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from decimal import Decimal, InvalidOperation
from typing import List, Optional

from ..cost.machine import Machine


def _sizes(lo: int, hi: int, factor: int) -> List[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def _dims(text: str):
    parts = text.lower().split("x")
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected DIMS as positive ints joined by x (8x8, 4x4x4), got {text!r}")
    return tuple(int(p) for p in parts)


def _fat_tree(text: str):
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 3:
            raise ValueError
        radix, levels = int(parts[0]), int(parts[1]) if len(parts) > 1 else 2
        oversubscription = float(parts[2]) if len(parts) > 2 else 1.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RADIX[:LEVELS[:OVERSUBSCRIPTION]] (8, 8:3, 8:2:4), "
                                         f"got {text!r}") from None
    return radix, levels, oversubscription


def _dragonfly(text: str):
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected GROUPS,ROUTERS,HOSTS,GLOBAL_LINKS as positive ints "
                                         f"(5,4,2,1), got {text!r}")
    return tuple(int(p) for p in parts)


def _seconds(microseconds: str) -> float:
    """µs text to seconds, rounded once (0.1 µs is exactly the float 1e-7)."""
    try:
        value = float(Decimal(microseconds.strip()) / 1000000)
    except (InvalidOperation, ValueError):
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a latency >= 0 in µs (0.1), got {microseconds!r}")
    return value


def _link(text: str):
    parts = text.split(",")
    try:
        latency, gbps = _seconds(parts[0]), float(parts[1])
        if len(parts) != 2 or not 0 < gbps < float("inf"):
            raise ValueError
    except (argparse.ArgumentTypeError, ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected LATENCY_US,GBPS (a latency >= 0 in µs, a bandwidth > 0 "
                                         f"in GB/s: 2,50), got {text!r}") from None
    return latency, 1 / (gbps * 1e9)


def _at_least(least: int, example: str):
    """The argparse type of an int option >= ``least`` (argparse names the option in front of
    the message)."""
    def parse(text) -> int:
        word = str(text).strip()
        if not word.lstrip("-").isdigit() or int(word) < least:
            raise argparse.ArgumentTypeError(f"expected an int >= {least} ({example}), got {text!r}")
        return int(word)
    return parse


def _worlds(text: str) -> List[int]:
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected world sizes >= 1 joined by commas (4,8,16), got {text!r}")
    return [int(p) for p in parts]


def _nbytes(text: str) -> int:
    """A message size > 0 in nccl-tests' syntax (1K, 64M)."""
    from ..config import parse_size

    try:
        value = parse_size(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a size > 0 in bytes with an optional K/M/G/T suffix "
                                         f"(1K, 64M), got {text!r}")
    return value


def _gbps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a bandwidth > 0 in GB/s (50), got {text!r}")
    return value


def _link_text(link) -> str:
    """(latency s, β s/B) as --intra/--inter/--host write it: µs,GB/s."""
    latency, beta = link
    return f"{latency * 1e6:g},{1 / beta / 1e9:g}"


def _placement(text: str):
    if text == "linear":
        return "linear"
    kind, _, seed = text.partition(":")
    if kind != "random" or not seed.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected linear or random:SEED (random:1), got {text!r}")
    return ("random", int(seed))


_NETWORKS = ("torus", "mesh", "fat_tree", "dragonfly")


def _network_machine(args, ports: int) -> Optional[Machine]:
    """The machine of --torus/--mesh/--fat-tree/--dragonfly (None if none is given); a
    ValueError names the option."""
    given = [kind for kind in _NETWORKS if getattr(args, kind, None) is not None]
    if not given:
        for option in ("placement", "global_link"):
            if getattr(args, option, None) is not None:
                raise ValueError(f"--{option.replace('_', '-')} needs a network machine "
                                 f"(--torus, --mesh, --fat-tree or --dragonfly)")
        return None
    flags = [f"--{kind.replace('_', '-')}" for kind in given]
    if len(given) > 1 or args.hierarchical or args.machine:
        others = flags + ["--hierarchical"] * bool(args.hierarchical) + ["--machine"] * bool(args.machine)
        raise ValueError(f"give one machine, got {' and '.join(others)}")
    kind, flag = given[0], flags[0]
    if args.global_link is not None and kind != "dragonfly":
        raise ValueError("--global-link prices a dragonfly's global links: it needs --dragonfly")
    alpha, beta = args.host
    common = dict(alpha=alpha, beta=beta, gamma=1 / (args.gamma_gbps * 1e9), ports=ports,
                  latency=args.link_latency, hop_latency=args.hop_latency,
                  placement=args.placement)
    value = getattr(args, kind)
    try:
        if kind in ("torus", "mesh"):
            return getattr(Machine, kind)(value, **common)
        if kind == "fat_tree":
            radix, levels, oversubscription = value
            return Machine.fat_tree(radix, levels=levels, oversubscription=oversubscription, **common)
        extra = {}
        if args.global_link is not None:
            extra = dict(global_latency=args.global_link[0], global_beta=args.global_link[1])
        return Machine.dragonfly(*value, **common, **extra)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{flag}: {error}") from None


def _machine(args) -> Machine:
    ports = getattr(args, "ports", None)
    network = _network_machine(args, ports or 1)
    if network is not None:
        return network
    if args.hierarchical:
        return Machine.hierarchical(args.hierarchical, intra=args.intra, inter=args.inter,
                                    gamma=1 / (args.gamma_gbps * 1e9),
                                    nic_ports=args.nic_ports, ports=ports or 1)
    if args.machine:
        with open(args.machine) as f:
            doc = json.load(f)
        if "rows" in doc:                                   # a ringcoll-bench run: fit it
            from .fit import fit
            machine = fit([args.machine])
        else:
            machine = Machine.from_dict(doc)
    else:
        machine = Machine()
    return replace(machine, ports=ports) if ports else machine


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringcoll-study", description=__doc__.split("\n\n")[0].replace("``", ""))
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sweep", help="every algorithm over world sizes and message sizes")
    s.add_argument("--collective", default="all_reduce", help="comma-separated registry collectives")
    s.add_argument("--algorithms", help="comma-separated names (default: all)")
    s.add_argument("--worlds", type=_worlds, default="4,8,16,32,64", help="comma-separated world sizes")
    s.add_argument("--msccl", action="append", default=[], metavar="FILE.xml",
                   help="load an MSCCL-IR algorithm first (ringcoll.msccl.load); it joins the sweep at "
                        "its own world size; repeatable")
    s.add_argument("-b", "--minbytes", type=_nbytes, default="1K", help="smallest message (bytes, 1K, 64M)")
    s.add_argument("-e", "--maxbytes", type=_nbytes, default="64M", help="largest message, >= --minbytes")
    s.add_argument("-f", "--stepfactor", type=_at_least(2, "4"), default=4, help="size factor between steps")
    s.add_argument("--simulate-up-to", type=_at_least(1, "256"), default=256,
                   help="closed forms above this many ranks")
    s.add_argument("--import", action="append", dest="imports", default=[], metavar="MODULE",
                   help="import MODULE (a module name, or a path to a .py file) first, so the algorithms it "
                        "registers with ringcoll.register join the sweep; repeatable")
    s.add_argument("--ports", type=_at_least(1, "2"), default=None,
                   help="send and receive ports per rank (default: the machine's, 1 unless it says)")
    s.add_argument("--out", default=None,
                   help="directory of the tables and maps (default: a fresh study-<UTC time> under the "
                        "current directory, so a run never overwrites committed results)")
    for q in (s, sub.add_parser("validate", help="predicted vs measured times of a ringcoll-bench run")):
        q.add_argument("--machine", help="Machine JSON, or a ringcoll-bench JSON to fit")
        q.add_argument("--hierarchical", type=_at_least(1, "8"), metavar="RANKS_PER_NODE")
        q.add_argument("--intra", type=_link, default="2,100", metavar="ALPHA_US,GBPS",
                       help="intra-node α (µs), bandwidth (GB/s)")
        q.add_argument("--inter", type=_link, default="10,10", metavar="ALPHA_US,GBPS",
                       help="inter-node α (µs), bandwidth (GB/s)")
        q.add_argument("--gamma-gbps", type=_gbps, default=50.0, help="reduction speed (GB/s)")
        q.add_argument("--nic-ports", type=_at_least(1, "1"), default=1)
        q.add_argument("--torus", type=_dims, metavar="DIMS", help="a torus of one host per point: 8x8, 4x4x4")
        q.add_argument("--mesh", type=_dims, metavar="DIMS", help="a mesh (no wrap-around): 4x4")
        q.add_argument("--fat-tree", dest="fat_tree", type=_fat_tree, metavar="RADIX[:LEVELS[:OVERSUB]]",
                       help="a fat-tree of RADIX-port switches, 2 or 3 levels (default 2), links above "
                            "the leaves 1/OVERSUB as fast (default 1): 8:2:4")
        q.add_argument("--dragonfly", type=_dragonfly, metavar="G,R,H,GLOBAL",
                       help="a dragonfly: G groups of R routers, H hosts per router, GLOBAL global links "
                            "per router: 5,4,2,1")
        q.add_argument("--host", type=_link, default=_link("5,10"), metavar="ALPHA_US,GBPS",
                       help="on a network: each message's latency at the ends (µs) and the hosts' and "
                            "links' bandwidth (GB/s); default 5,10")
        q.add_argument("--link-latency", type=_seconds, default="0", metavar="US",
                       help="on a network: latency of every link (µs), default 0")
        q.add_argument("--hop-latency", type=_seconds, default="0.1", metavar="US",
                       help="on a network: latency per hop (µs), default 0.1")
        q.add_argument("--global-link", type=_link, default=None, metavar="LATENCY_US,GBPS",
                       help="on a dragonfly: latency and bandwidth of the global links (default: --host's "
                            "bandwidth, no latency)")
        q.add_argument("--placement", type=_placement, default=None, metavar="linear|random:SEED",
                       help="on a network: rank r on host r (linear, the default) or a seeded shuffle")
    v = sub.choices["validate"]
    v.add_argument("run", help="ringcoll-bench JSON")
    f = sub.add_parser("fit", help="a flat machine fitted to ringcoll-bench runs, with its errors")
    f.add_argument("runs", nargs="+", metavar="RUN.json", help="ringcoll-bench JSON files to fit")
    f.add_argument("--hold-out", action="append", default=[], metavar="RUN.json",
                   help="a ringcoll-bench JSON predicted but not fitted (out of sample); repeatable")
    f.add_argument("--out", default=None, metavar="MACHINE.json",
                   help="write the fitted machine (ringcoll.Machine.load, --machine read it)")
    for q in (s, v, f):
        q.add_argument("--json", default=None, metavar="FILE",
                       help="also write the results as JSON: every cell or row with its fields, the "
                            "machine (Machine.to_dict) and the command line")
    return p


def _command_line(argv: Optional[List[str]]) -> List[str]:
    """The command as run: ``ringcoll-study`` and its arguments."""
    return ["ringcoll-study", *(sys.argv[1:] if argv is None else argv)]


def _write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


def _print_fit(result, json_path: Optional[str], argv: Optional[List[str]]) -> None:
    """Every row measured and predicted (fitted: in-sample, held out, or given: against a
    given machine), the report, and with ``--json`` all of it as JSON."""
    print(f"{'collective':<16}{'algorithm':<20}{'p':>4}{'bytes':>11}{'measured us':>13}{'predicted us':>14}"
          f"{'ratio':>7}  row")
    for row in result.rows():
        kind = "in-sample" if row["in_sample"] else "given" if result.label != "fitted" else "held out"
        print(f"{row['collective']:<16}{row['algorithm']:<20}{row['world']:>4}{row['nbytes']:>11}"
              f"{row['measured_s'] * 1e6:>13.1f}{row['predicted_s'] * 1e6:>14.1f}"
              f"{row['predicted_s'] / row['measured_s']:>7.2f}  {kind}")
    print(result.report())
    if json_path:
        _write_json(json_path, {"command": _command_line(argv), **result.to_dict()})


def main(argv: Optional[List[str]] = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.command == "validate":
        from .fit import fit_report
        try:
            result = fit_report([args.run])
        except (OSError, ValueError, KeyError) as error:
            cli.error(f"validate: cannot fit {args.run}: {type(error).__name__}: {error}")
        try:
            machine = _machine(args)
        except ValueError as error:
            cli.error(str(error))
        if machine.network is not None:
            result = result.on(machine, label=machine.describe())
        elif args.machine or args.hierarchical:
            given = args.machine or (f"--hierarchical {args.hierarchical} --intra {_link_text(args.intra)} "
                                     f"--inter {_link_text(args.inter)}")
            result = result.on(machine, label=given)
        _print_fit(result, args.json, argv)
        return 0
    if args.command == "fit":
        from .fit import fit_report
        try:
            result = fit_report(args.runs, held_out=args.hold_out)
        except (OSError, ValueError, KeyError) as error:
            cli.error(f"fit: cannot fit {' '.join(args.runs + args.hold_out)}: {type(error).__name__}: {error}")
        _print_fit(result, args.json, argv)
        if args.out:
            result.machine.save(args.out)
            print(f"wrote {args.out} (ringcoll-study sweep --machine {args.out})")
        return 0
    from ..schedules import registry
    from .sweep import check_algorithms, crossover_lines, plot_map, refusals, sweep, write_table
    if args.maxbytes < args.minbytes:
        cli.error(f"argument -e/--maxbytes: expected a size >= -b/--minbytes ({args.minbytes} B), "
                  f"got {args.maxbytes} B")
    if args.imports:
        from .trust import import_module
        for name in args.imports:
            try:
                import_module(os.path.abspath(name) if name.endswith(".py") else name)
            except Exception as error:  # noqa: BLE001 - any failure of the user's module is an option error
                cli.error(f"--import {name}: cannot import it: {type(error).__name__}: {error}")
    try:
        machine = _machine(args)
    except ValueError as error:
        cli.error(str(error))
    worlds = args.worlds
    if machine.network is not None:
        too_big = [w for w in worlds if w > machine.network.hosts]
        if too_big:
            cli.error(f"--worlds: {too_big} do not fit on {machine.network.describe()} "
                      f"({machine.network.hosts} hosts, one rank per host)")
    sizes = _sizes(args.minbytes, args.maxbytes, args.stepfactor)
    algorithms = args.algorithms.split(",") if args.algorithms else None
    if args.msccl:
        from .. import msccl
        loaded = [msccl.load(path) for path in args.msccl]
        if algorithms is not None:
            algorithms += loaded
    collectives = args.collective.split(",")
    try:
        check_algorithms(collectives, algorithms)
    except ValueError as error:
        cli.error(f"--algorithms: {error}")
    # cells whose closed form is not the clock's, for every collective, before anything is written
    chosen_of = {collective: None if algorithms is None else
                 [a for a in algorithms if a in registry.algorithms(collective)] for collective in collectives}
    refused = [why for collective, chosen in chosen_of.items() if chosen != []
               for why in refusals([collective], worlds, sizes, machine, chosen, args.simulate_up_to)]
    if refused:
        shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
        cli.error(f"--simulate-up-to {args.simulate_up_to}: {len(refused)} cell(s) above it have no closed "
                  f"form equal to the clock (raise --simulate-up-to to simulate them): {shown}")
    if args.out is None:
        args.out = time.strftime("study-%Y%m%dT%H%M%SZ", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    every_cell = []
    for collective, chosen in chosen_of.items():
        if chosen == []:
            print(f"{collective}: none of --algorithms is registered for it, skipped")
            continue
        cells = sweep([collective], worlds, sizes, machine, chosen, args.simulate_up_to)
        if not cells:
            print(f"{collective}: no cell to run (an algorithm fixed to another world size?), skipped")
            continue
        every_cell += cells
        table = write_table(cells, os.path.join(args.out, f"study_{collective}.csv"))
        picture = plot_map(cells, collective, os.path.join(args.out, f"study_map_{collective}.png"))
        lines = crossover_lines(cells)
        closed = sum(c.source != "simulated" for c in cells)
        if closed:
            lines.append(f"{collective}: {closed} of {len(cells)} cells are closed forms (above "
                         f"--simulate-up-to {args.simulate_up_to} ranks), {len(cells) - closed} simulated")
        text = os.path.join(args.out, f"study_crossovers_{collective}.txt")
        with open(text, "w") as f:
            f.write(f"machine: {json.dumps(machine.to_dict())}\n" + "\n".join(lines) + "\n")
        print("\n".join(lines))
        print(f"wrote {table}, {picture}, {text}")
    if args.json:
        _write_json(args.json, {"command": _command_line(argv), "machine": machine.to_dict(),
                                "simulate_up_to": args.simulate_up_to, "cells": [asdict(c) for c in every_cell]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
