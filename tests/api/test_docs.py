"""The drop-ins' shared docstring entries (ringcoll.api._docs): filled in, and the algorithm
list the one the registry has; the builder -> collective table covers every builder; the
tables README.md and docs/ show are the code's, byte for byte (tools/docs_tables.py)."""
from __future__ import annotations

import re

import pytest

import ringcoll
from ringcoll.api import BUILDERS
from ringcoll.api._docs import c10d_doc
from ringcoll import config
from ringcoll.schedules import registry
from tools import docs_tables

#: the public drop-ins (torch's older names, all_gather_into_tensor and reduce_scatter_tensor,
#: point to their ``*_single`` forms' documentation)
DROP_INS = ("all_gather_single", "all_gather", "all_reduce", "all_to_all_single", "all_to_all", "barrier",
            "broadcast", "gather", "scatter", "reduce", "reduce_scatter_single", "reduce_scatter")


def test_every_builder_runs_a_registered_collective():
    """The one builder -> collective table (registry.COLLECTIVE_OF) covers every builder: a
    new drop-in whose name is not a collective's fails here until the table names it."""
    collectives = registry.algorithms()
    unknown = {name: registry.collective_of(name) for name in BUILDERS
               if registry.collective_of(name) not in collectives}
    assert unknown == {}, f"builders whose collective is not registered: {unknown}"
    round_trip = {c: registry.collective_of(registry.builder_of(c)) for c in collectives}
    assert round_trip == {c: c for c in collectives}, "collective -> builder -> collective"


@pytest.mark.parametrize("name", sorted(DROP_INS))
def test_every_drop_in_documents_group_async_op_and_each_built_in_algorithm(name):
    collective = registry.collective_of(name)
    doc = getattr(ringcoll, name).__doc__
    assert not re.search(r"^\s*\{\w+\}\s*$", doc, re.M), "a placeholder was left unfilled"
    flat = " ".join(doc.split())
    assert "group (ProcessGroup, optional): The process group to work on." in flat
    assert "async_op (bool, optional): Whether this op should be an async op." in flat
    listed = re.search(r"built in: (.*?)\.(\s|$)", flat).group(1)
    assert re.findall(r"``(\w+)``", listed) == ringcoll.algorithms(collective)


def test_an_unknown_entry_is_an_error_not_a_silent_hole():
    def fn():
        """Summary.

        Args:
            {grop}
        """
    with pytest.raises(KeyError):
        c10d_doc("all_reduce")(fn)


@pytest.mark.parametrize("table", docs_tables.TABLES, ids=lambda t: t.name)
def test_each_generated_table_is_the_codes_byte_for_byte(table):
    shown, want = docs_tables.shown(table).split("\n"), table.render().split("\n")
    for i, (got, line) in enumerate(zip(shown, want)):
        assert got == line, (f"{table.page} {table.name} line {i + 1}: shows {got!r}, the code gives {line!r} "
                             f"(python -m tools.docs_tables rewrites it)")
    assert len(shown) == len(want), f"{table.page} {table.name}: {len(shown)} lines shown, the code gives {len(want)}"


def test_a_changed_setting_or_docstring_leaves_its_table_stale(monkeypatch):
    """The check can fail: a setting whose meaning changed, and a schedule whose docstring's
    cost changed, each make their page's table stale until it is regenerated."""
    assert docs_tables.stale() == []
    first = config.VARIABLES[0]
    monkeypatch.setattr(config, "VARIABLES", (first._replace(meaning=first.meaning + " (changed)"),
                                              *config.VARIABLES[1:]))
    assert docs_tables.stale() == ["README.md: settings"]
    monkeypatch.undo()
    ring = registry.get("all_reduce", "ring").schedule
    monkeypatch.setattr(ring, "__doc__", ring.__doc__.replace("Cost: 2(p-1)k", "Cost: 2(p-1)"))
    assert docs_tables.stale() == ["docs/algorithms-and-auto.md: algorithms"]


def test_a_docstring_without_a_cost_is_refused(monkeypatch):
    ring = registry.get("all_reduce", "ring")
    monkeypatch.setattr(ring.schedule, "__doc__", "Ring all-reduce: around the ring.")
    with pytest.raises(ValueError, match="all_reduce/ring: its docstring needs a first sentence and a paragraph "
                                         "starting with 'Cost'"):
        docs_tables.describe(ring)


def test_algorithm_docs_list_every_registered_algorithm():
    """Every public call's ``algorithm`` argument names exactly the algorithms its collective
    registers (``ringcoll.algorithms(collective)``), so a new one cannot leave it stale."""
    import inspect

    documented = {}
    for name in ringcoll.__all__:
        fn = getattr(ringcoll, name)
        if not callable(fn) or inspect.isclass(fn):
            continue
        doc = inspect.getdoc(fn) or ""
        paragraph = re.search(r"^ *algorithm \(str[^)]*\):(.*?)(?=^ *\w+ \(|^\S|\Z)", doc, re.S | re.M)
        if paragraph is None:
            continue
        collective = re.search(r'ringcoll\.algorithms\("(\w+)"\)', paragraph.group(1))
        assert collective, f"{name}: the algorithm argument should say ringcoll.algorithms(collective)"
        assert collective.group(1) == ("all_reduce" if name == "ddp_comm_hook" else registry.collective_of(name)), name
        listed = set(re.findall(r"``([a-z_0-9]+)``", paragraph.group(1))) - {"auto"}
        assert listed == set(ringcoll.algorithms(collective.group(1))), \
            f"{name}: documents {sorted(listed)}, registered {ringcoll.algorithms(collective.group(1))}"
        documented[name] = collective.group(1)
    assert {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "reduce_scatter",
            "reduce_scatter_single", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
            "ddp_comm_hook"} <= set(documented), sorted(documented)
