"""The drop-ins' shared docstring entries (ringcoll.api._docs): filled in, and the algorithm
list the one the registry has."""
from __future__ import annotations

import re

import pytest

import ringcoll
from ringcoll.api import BUILDERS
from ringcoll.api._docs import c10d_doc
from ringcoll.schedules import registry

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
    assert all(registry.collective_of(registry.builder_of(c)) == c for c in collectives)


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
