"""Key ratios of saved runs as a Markdown table: ``python -m ringcoll.bench.summary FILE.json ...``

For each run and collective, one line per contestant (first variant of the collective:
out-of-place where there are two): the geometric mean of ``time / built-in's time`` over the
small sizes (≤ 64 KiB) and the large ones (≥ 1 MiB), the ratio and busbw at the largest
size, and the #wrong total over every size and variant.
"""
from __future__ import annotations

import json
import sys
from typing import List, Sequence

from .harness import BUILTIN
from .report import geomean
from .specs import SPECS

SMALL, LARGE = 64 << 10, 1 << 20


def _fmt(value, digits=2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(paths: Sequence[str]) -> str:
    lines: List[str] = []
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        meta, rows = data["meta"], data["rows"]
        lines += [f"### {meta['world_size']} ranks, {meta['backend']}, {meta['device']}, {meta['dtype']} "
                  f"({meta['date']}, `{path.rsplit('/', 1)[-1]}`)", "",
                  "| collective | algorithm | variant | vs built-in ≤64K | vs built-in ≥1M | "
                  "vs built-in at largest | busbw at largest (GB/s) | #wrong |",
                  "|---|---|---|---|---|---|---|---|"]
        for collective in dict.fromkeys(r["collective"] for r in rows):
            mine = [r for r in rows if r["collective"] == collective]
            spec = SPECS.get(collective)
            variant = spec.variants[0] if spec else mine[0]["variant"]
            names = list(dict.fromkeys(r["algorithm"] for r in mine))
            names.sort(key=lambda n: n != BUILTIN)
            for name in names:
                line = sorted((r for r in mine if r["algorithm"] == name and r["variant"] == variant),
                              key=lambda r: r["size"])
                if not line:
                    continue
                largest = line[-1]
                wrong = sum(r["wrong"] or 0 for r in mine if r["algorithm"] == name)
                errors = any(r["error"] for r in mine if r["algorithm"] == name)
                small = geomean(r["vs_builtin"] for r in line if r["size"] <= SMALL)
                large = geomean(r["vs_builtin"] for r in line if r["size"] >= LARGE)
                sized = spec is None or spec.sized
                lines.append(
                    f"| {collective} | {name} | {variant} | {_fmt(small)} | {_fmt(large) if sized else '–'} | "
                    f"{_fmt(largest['vs_builtin'])} @ {_size(largest['size'])} | "
                    f"{_fmt(largest['busbw'], 3) if sized else '–'} | {wrong}{' WRONG RESULTS' if wrong else ''}"
                    f"{' (errors)' if errors else ''} |")
        lines.append("")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes}B"


def main(argv: Sequence[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print(__doc__.splitlines()[0])
        return 2
    print(markdown(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
