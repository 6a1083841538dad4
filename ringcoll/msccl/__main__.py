"""``python -m ringcoll.msccl check FILE.xml [--machine m.json] [--bytes N]``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..cost.machine import Machine
from .check import DEFAULT_BYTES, format_report, report
from .ir import MscclError


def main(argv: Optional[List[str]] = None) -> int:
    from ..config import parse_size

    p = argparse.ArgumentParser(prog="python -m ringcoll.msccl", description="MSCCL-IR algorithms in ringcoll")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse, simulate and cost an MSCCL-IR XML")
    c.add_argument("file", help="MSCCL-IR XML (.xml or .xml.gz)")
    c.add_argument("--machine", help="ringcoll.Machine JSON (Machine.save writes one; default: Machine())")
    c.add_argument("--bytes", type=parse_size, default=DEFAULT_BYTES, help="simulated size (default 1M)")
    args = p.parse_args(argv)
    machine = Machine.load(args.machine) if args.machine else None
    try:
        info = report(args.file, machine, args.bytes)
    except (MscclError, FileNotFoundError) as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    print(format_report(info))
    return 1 if info["first_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
