"""The drop-ins' shared docstring entries (ringcoll.api._docs): filled in, and the algorithm
list the one the registry has."""
from __future__ import annotations

import re

import pytest

import ringcoll
from ringcoll.api._docs import c10d_doc

DROP_INS = {"all_gather_single": "all_gather", "all_gather": "all_gather", "all_reduce": "all_reduce",
            "all_to_all_single": "all_to_all", "all_to_all": "all_to_all", "barrier": "barrier",
            "broadcast": "broadcast", "gather": "gather", "scatter": "scatter", "reduce": "reduce",
            "reduce_scatter_single": "reduce_scatter", "reduce_scatter": "reduce_scatter"}


@pytest.mark.parametrize("name, collective", sorted(DROP_INS.items()))
def test_every_drop_in_documents_group_async_op_and_each_built_in_algorithm(name, collective):
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
