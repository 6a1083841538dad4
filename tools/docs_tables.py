"""The tables README.md and docs/ show that the code already holds, generated from it:

- README.md's settings table, from :data:`ringcoll.config.VARIABLES` (:func:`ringcoll.config.table`);
- docs/algorithms-and-auto.md's catalogue, from the registry: each algorithm's schedule in words
  (its docstring's first sentence) and its cost (its docstring's ``Cost`` paragraph), so the
  page says what the docstring says (:func:`algorithm_table`).

Each table sits between ``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``;
tests/api/test_docs.py checks it byte for byte. After changing a docstring or a setting::

    python -m tools.docs_tables           # rewrite the tables
    python -m tools.docs_tables --check   # exit 1 naming each stale table
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from typing import Callable, List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Table(NamedTuple):
    page: str                   # path from the repository root
    name: str                   # the markers' name
    render: Callable[[], str]   # the table's Markdown, without the markers


def begin(name: str) -> str:
    return f"<!-- generated: {name} (python -m tools.docs_tables; change the code, not this table) -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


#: a sentence ends at a full stop before a capital, unless the stop ends one of these
_NOT_AN_END = ("al.", "e.g.", "i.e.", "cf.", "vs.")


def first_sentence(paragraph: str) -> str:
    for match in re.finditer(r"\.\s+(?=\(?[A-Z])", paragraph):
        head = paragraph[:match.start() + 1]
        if not head.endswith(_NOT_AN_END):
            return head
    return paragraph


def markdown(text: str) -> str:
    """A docstring's reStructuredText as one Markdown table cell."""
    text = re.sub(r":\w+:`\.?([^`]+)`", r"`\1`", text)       # :func:`x` -> `x`
    text = text.replace("``", "`")
    return " ".join(text.split()).replace("|", "\\|")


def describe(algorithm) -> tuple:
    """(schedule in words, cost) of a registered algorithm, from its docstring: the first
    sentence and the paragraph that starts with "Cost"."""
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(algorithm.schedule.__doc__ or "").split("\n\n")]
    costs = [p for p in paragraphs if p.startswith("Cost")]
    if not paragraphs[0] or not costs:
        raise ValueError(f"{algorithm.collective}/{algorithm.name}: its docstring needs a first sentence "
                         f"and a paragraph starting with 'Cost'")
    cost = re.sub(r"^Cost( \(([^)]*)\))?:\s*", lambda m: f"{m.group(2)}: " if m.group(2) else "", costs[0])
    return markdown(first_sentence(paragraphs[0])), markdown(cost)


def algorithm_table() -> str:
    """Every built-in algorithm, by collective (alphabetical) in the registry's order."""
    from ringcoll.schedules import registry

    lines = ["| collective | algorithm | `auto` | schedule (its docstring's first sentence) | cost |",
             "|---|---|---|---|---|"]
    for collective in sorted(registry.algorithms()):
        for name in registry.algorithms(collective):
            algorithm = registry.get(collective, name)
            if not registry.is_builtin(algorithm.schedule):
                continue
            schedule, cost = describe(algorithm)
            lines.append(f"| {collective} | `{name}` | {'yes' if algorithm.auto else 'by name only'} "
                         f"| {schedule} | {cost} |")
    return "\n".join(lines)


def settings_table() -> str:
    from ringcoll import config

    return config.table()


TABLES = (Table("README.md", "settings", settings_table),
          Table("docs/algorithms-and-auto.md", "algorithms", algorithm_table))


def _span(text: str, table: Table) -> tuple:
    """(start, stop) of the table's text between its markers in ``text``."""
    first, last = begin(table.name), end(table.name)
    if text.count(first) != 1 or text.count(last) != 1:
        raise ValueError(f"{table.page} must hold {first!r} and {last!r} once each")
    start = text.index(first) + len(first) + 1
    return start, text.index(last) - 1


def shown(table: Table, root: str = ROOT) -> str:
    """The table as the page shows it now."""
    with open(os.path.join(root, table.page)) as f:
        text = f.read()
    start, stop = _span(text, table)
    return text[start:stop]


def write(table: Table, root: str = ROOT) -> bool:
    """Rewrite the table on its page; whether it changed."""
    path = os.path.join(root, table.page)
    with open(path) as f:
        text = f.read()
    start, stop = _span(text, table)
    new = text[:start] + table.render() + text[stop:]
    if new != text:
        with open(path, "w") as f:
            f.write(new)
    return new != text


def stale(root: str = ROOT) -> List[str]:
    """The tables whose page differs from the code, as 'page: name'."""
    return [f"{t.page}: {t.name}" for t in TABLES if shown(t, root) != t.render()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming the stale tables, write nothing")
    options = parser.parse_args(argv)
    if options.check:
        old = stale()
        for line in old:
            print(f"stale: {line} (python -m tools.docs_tables rewrites it)")
        return 1 if old else 0
    for table in TABLES:
        print(f"{table.page}: {table.name} {'rewritten' if write(table) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
