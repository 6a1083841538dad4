"""What a run leaves behind: nccl-tests-style tables, JSON, CSV and one PNG per collective."""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import socket
from dataclasses import asdict
from typing import Dict, Iterable, List, Optional, Sequence

from .harness import BUILTIN, NOISY, Row
from .specs import P2P_FLOOR


_KEY = ("size(B)", "count", "type", "redop", "root", "algorithm")
_KEY_W = (12, 12, 8, 6, 5, 22)
_VAL = ("time(us)", "p10-p90(us)", "algbw", "busbw", "#wrong", "vs built-in", "%floor")
_VAL_UNIT = ("median", "of rounds", "(GB/s)", "(GB/s)", "", "(time ratio)", "")
_VAL_W = (11, 15, 8, 8, 7, 12, 7)
#: the mark of a noisy row in the table, and its legend
NOISY_MARK = "!"
LEGEND = (f"# {NOISY_MARK} after vs built-in: this row's or the built-in's p90/p10 exceeds {NOISY:g}x, "
          f"the ratio is noise-prone; %floor = busbw / the p2p-floor row's, timed in the same rounds "
          f"(all_reduce, all_gather, reduce_scatter: sendrecv of the same bytes, the wire's ceiling; "
          f"all_to_all, scatter, gather: their own blocks by bare P2P)")


def oversubscribed(world: int, cores: Optional[int]) -> List[str]:
    """The header's warning when the ranks on this host outnumber its cores: then a rank waits
    for a core in a share of the rounds, so small sizes' medians, and the ratios between them,
    flip from run to run (bench/slow_rounds.py measures that share by world size)."""
    if not cores or world <= cores:
        return []
    return [f"# {world} ranks share {cores} cores: in a share of the rounds a rank waits for a core, "
            f"so at small sizes a median and its ratio can flip from run to run (the '{NOISY_MARK}' rows); "
            f"python -m experiments.slow_rounds measures that share by world size"]


def variants_of(rows: Sequence[Row]) -> List[str]:
    seen: List[str] = []
    for row in rows:
        if row.variant not in seen:
            seen.append(row.variant)
    return seen


def _num(value: Optional[float], digits: int) -> str:
    return "--" if value is None else f"{value:.{digits}f}"


def _wrong(row: Row) -> str:
    if row.error:
        return "err"
    return "N/A" if row.wrong is None else str(row.wrong)


def table_header(collective: str, variants: Sequence[str], context: str = "") -> List[str]:
    """The nccl-tests-style header of one collective's table."""
    key_width = sum(_KEY_W) + len(_KEY_W) - 1
    group_width = sum(_VAL_W) + len(_VAL_W)
    lines = [f"# {collective}{'  ' + context if context else ''}",
             "#" + " " * (key_width - 1) + "".join(f"{v:>{group_width}}" for v in variants)]
    keys = " ".join(f"{k:>{w}}" if k != "algorithm" else f"{k:<{w}}" for k, w in zip(_KEY, _KEY_W))
    vals = "".join(" " + " ".join(f"{v:>{w}}" for v, w in zip(_VAL, _VAL_W)) for _ in variants)
    units = " " * key_width + "".join(" " + " ".join(f"{u:>{w}}" for u, w in zip(_VAL_UNIT, _VAL_W))
                                      for _ in variants)
    lines.append("#" + keys[1:] + vals)
    lines.append("#" + units[1:])
    return lines


def table_lines(rows: Sequence[Row], variants: Sequence[str]) -> List[str]:
    """One line per size and contestant (built-in first), a column group per variant."""
    grouped: Dict[tuple, Dict[str, Row]] = {}
    for row in rows:
        grouped.setdefault((row.size, row.algorithm), {})[row.variant] = row
    order: List[str] = []
    for row in rows:
        if row.algorithm not in order:
            order.append(row.algorithm)
    order.sort(key=lambda name: name != BUILTIN)
    lines = []
    for size in sorted({row.size for row in rows}):
        for name in order:
            cells = grouped.get((size, name))
            if not cells:
                continue
            first = next(iter(cells.values()))
            key = (str(first.size), str(first.count), first.type, first.redop, str(first.root), name)
            text = " ".join(f"{k:>{w}}" if i != 5 else f"{k:<{w}}"
                            for i, (k, w) in enumerate(zip(key, _KEY_W)))
            for variant in variants:
                row = cells.get(variant)
                if row is None:
                    values = ("",) * len(_VAL)
                else:
                    ratio = "1.00" if name == BUILTIN and row.time_us else _num(row.vs_builtin, 2)
                    values = (_num(row.time_us, 1), _spread(row), _num(row.algbw, 3), _num(row.busbw, 3),
                              _wrong(row), ratio + (NOISY_MARK if row.noisy else ""),
                              _num(row.floor_pct, 1) if row.floor_pct is not None else "")
                text += " " + " ".join(f"{v:>{w}}" for v, w in zip(values, _VAL_W))
            lines.append(text)
    return lines


def _spread(row: Row) -> str:
    if row.p10_us is None or row.p90_us is None:
        return "--"
    digits = 1 if row.p90_us < 1000 else 0
    return f"{row.p10_us:.{digits}f}-{row.p90_us:.{digits}f}"


def geomean(values: Iterable[float]) -> Optional[float]:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary_lines(rows: Sequence[Row]) -> List[str]:
    """Per contestant and variant: average busbw and the geometric-mean time ratio."""
    lines = []
    keys: List[tuple] = []
    for row in rows:
        if (row.algorithm, row.variant) not in keys:
            keys.append((row.algorithm, row.variant))
    for name, variant in sorted(keys, key=lambda k: (k[0] != BUILTIN, k)):
        mine = [r for r in rows if r.algorithm == name and r.variant == variant]
        bus = [r.busbw for r in mine if r.busbw is not None]
        ratio = geomean(r.vs_builtin for r in mine)
        wrong = sum(r.wrong or 0 for r in mine)
        errors = sorted({r.error for r in mine if r.error})
        text = (f"#  {name:<22} {variant:<13} avg busbw {(sum(bus) / len(bus)) if bus else 0:8.3f} GB/s"
                f"   time vs built-in (geomean) {_num(ratio, 2):>6}   #wrong {wrong}")
        if wrong:                   # its times are no result: say so where it is read
            text += "   WRONG RESULTS"
        if errors:
            text += f"   error: {errors[0]}"
        lines.append(text)
    return lines


def avg_bus_bandwidth(rows: Sequence[Row]) -> List[str]:
    """nccl-tests' footer: the average busbw over every size and variant, per contestant."""
    names: List[str] = []
    for row in rows:
        if row.algorithm not in names and row.busbw is not None:
            names.append(row.algorithm)
    names.sort(key=lambda n: n != BUILTIN)
    cells = []
    for name in names:
        bus = [r.busbw for r in rows if r.algorithm == name and r.busbw is not None]
        wrong = sum(r.wrong or 0 for r in rows if r.algorithm == name)
        cells.append(f"{name} {sum(bus) / len(bus):.3f}" + (f" (WRONG: {wrong} elements)" if wrong else ""))
    return [f"# Avg bus bandwidth    : {', '.join(cells)} (GB/s)"] if cells else []


# --------------------------------------------------------------------------------------
# files


def machine_info() -> dict:
    import torch

    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]     # others' work skews timings
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as meminfo:
            info["memory_kib"] = int(meminfo.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return info


_CSV_META = ("date", "world_size", "backend", "device", "torch", "hostname")
_CSV_ROW = ("collective", "variant", "algorithm", "size", "count", "type", "redop", "root", "time_us",
            "algbw", "busbw", "wrong", "vs_builtin", "min_us", "max_us", "p10_us", "p90_us", "noisy",
            "floor_pct", "iters", "error")


def write_json(path: str, meta: dict, rows: Sequence[Row]) -> None:
    with open(path, "w") as handle:
        json.dump({"meta": meta, "rows": [asdict(row) for row in rows]}, handle, indent=1)


def write_csv(path: str, meta: dict, rows: Sequence[Row]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(_CSV_META + _CSV_ROW)
        head = [meta.get(k, meta.get("machine", {}).get(k)) for k in _CSV_META]
        for row in rows:
            data = asdict(row)
            writer.writerow(head + [data[k] for k in _CSV_ROW])


def _size_label(nbytes: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def plot(path: str, collective: str, rows: Sequence[Row], title: str) -> bool:
    """busbw against size (log x) and the time ratio to the built-in, one line per
    contestant (in-place dashed); False when there is nothing to plot (barrier)."""
    rows = [r for r in rows if r.busbw is not None and r.size > 0]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    names: List[str] = []
    for row in rows:
        if row.algorithm not in names:
            names.append(row.algorithm)
    names.sort(key=lambda n: n != BUILTIN)
    variants = variants_of(rows)
    fig, (bw_ax, ratio_ax) = plt.subplots(2, 1, figsize=(8, 8), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    # the built-in black, the floor grey, every algorithm a colour of its own (tab20 past ten)
    algorithms = [n for n in names if n not in (BUILTIN, P2P_FLOOR)]
    palette = plt.get_cmap("tab10" if len(algorithms) <= 10 else "tab20").colors
    colors = {BUILTIN: "black", P2P_FLOOR: "grey",
              **{name: palette[i % len(palette)] for i, name in enumerate(algorithms)}}
    for name in names:
        color = colors[name]
        for variant in variants:
            line = sorted((r for r in rows if r.algorithm == name and r.variant == variant),
                          key=lambda r: r.size)
            if not line:
                continue
            style = "--" if variant == "in-place" and len(variants) > 1 else "-"
            label = name if len(variants) == 1 else f"{name} ({variant})"
            sizes = [r.size for r in line]
            bw_ax.plot(sizes, [r.busbw for r in line], style, marker="o", ms=3, color=color,
                       lw=2.2 if name == BUILTIN else 1.4, label=label)
            # the spread of the rounds as a band: busbw at the p90 (slow) and p10 (fast) times
            if all(r.p10_us and r.p90_us for r in line):
                bw_ax.fill_between(sizes, [r.busbw * r.time_us / r.p90_us for r in line],
                                   [r.busbw * r.time_us / r.p10_us for r in line], color=color, alpha=0.12, lw=0)
            if name != BUILTIN:
                ratio_ax.plot(sizes, [r.vs_builtin for r in line], style, marker="o", ms=3,
                              color=color, label=label)
                noisy = [r for r in line if r.noisy and r.vs_builtin]      # the table's "!": rings
                ratio_ax.scatter([r.size for r in noisy], [r.vs_builtin for r in noisy], s=60,
                                 facecolors="none", edgecolors=color, lw=1)
    bw_ax.set_xscale("log", base=2)
    if any(r.busbw > 0 for r in rows):
        bw_ax.set_yscale("log")
    bw_ax.set_ylabel("busbw (GB/s); bands: p10-p90 of the rounds")
    bw_ax.set_title(title)
    bw_ax.grid(True, which="both", alpha=0.3)
    bw_ax.legend(fontsize=8)
    ratio_ax.axhline(1.0, color="black", lw=1)
    ratio_ax.set_xscale("log", base=2)
    if any(r.vs_builtin for r in rows if r.algorithm != BUILTIN):
        ratio_ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ratio_ax.yaxis.set_major_formatter(plain)
        ratio_ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    ratio_ax.set_ylabel("time / built-in's time\n(below 1: faster; ringed: noisy)")
    ratio_ax.set_xlabel("size (bytes)")
    ratio_ax.grid(True, which="both", alpha=0.3)
    ticks = sorted({r.size for r in rows})
    ratio_ax.set_xticks(ticks)
    ratio_ax.set_xticklabels([_size_label(t) for t in ticks], rotation=45, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


